"""The cost of `--attention`: the suite on the bundled SmolLM2-135M-Instruct with and without the
context-attention probe, side by side in one run (one loaded model, chat template on as `cf-tasks
eval` uses it), per task: wall and CPU seconds per item, their ratio, and whether the greedy answers
are the same item by item (they must be: the probe runs after generation, under eager attention that
is switched back).

    python benchmarks/attention_bench.py [--limit 20] [--tasks cf_bio,cf_quotes] [--batch_size 8] [--device cpu]

The two runs take turns task by task, and which goes first alternates, so a machine that slows down
during the run slows them alike; an untimed run of one item per task first builds the datasets.
"""

from __future__ import annotations

import argparse
import time

TASKS = ("cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default: the suite's four)")
    parser.add_argument("--batch_size", type=int, default=8, help="default 8, as cf-tasks eval on the default model")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    args = parser.parse_args()

    from lm_eval.models.huggingface import HFLM

    from cf_tasks.default_model import default_model_path
    from cf_tasks.evaluate import default_device, run_lm_eval
    from cf_tasks.registry import task_manager

    tasks = [t for t in args.tasks.split(",") if t]
    tm = task_manager()
    lm = HFLM(pretrained=str(default_model_path()), dtype="float32", device=args.device or default_device(),
              batch_size=args.batch_size)
    wall: dict[str, dict[bool, float]] = {t: {} for t in tasks}
    cpu: dict[str, dict[bool, float]] = {t: {} for t in tasks}
    answers: dict[str, dict[bool, dict]] = {t: {} for t in tasks}
    mass: dict[str, float] = {}
    # Untimed: the first run of a task builds its dataset, and the first probe warms the eager path.
    run_lm_eval(lm, tasks, limit=1, apply_chat_template=True, task_manager=tm, attention=True)
    for i, task in enumerate(tasks):
        for attention in ((False, True) if i % 2 == 0 else (True, False)):
            start, start_cpu = time.perf_counter(), time.process_time()
            out = run_lm_eval(lm, [task], limit=args.limit, apply_chat_template=True, task_manager=tm,
                              log_samples=True, attention=attention)
            wall[task][attention] = (time.perf_counter() - start) / args.limit
            cpu[task][attention] = (time.process_time() - start_cpu) / args.limit
            answers[task][attention] = {s["doc_id"]: s["filtered_resps"][0] for s in out["samples"][task]}
            if attention:
                mass[task] = out["results"][task]["context_attention,none"]
    print(f"SmolLM2-135M-Instruct, --limit {args.limit}, batch {args.batch_size}, device {lm.device}")
    print(f"{'task':16s}{'without s/item':>16s}{'with s/item':>14s}{'wall ratio':>12s}{'CPU ratio':>11s}"
          f"{'same answers':>14s}{'context_attention':>19s}")
    same_all = total = 0
    for task in tasks:
        ref = answers[task][False]
        same = sum(answers[task][True][k] == v for k, v in ref.items())
        same_all, total = same_all + same, total + len(ref)
        print(f"{task:16s}{wall[task][False]:16.3f}{wall[task][True]:14.3f}{wall[task][True] / wall[task][False]:11.2f}x"
              f"{cpu[task][True] / cpu[task][False]:10.2f}x{f'{same}/{len(ref)}':>14s}{mass[task]:19.3f}")
    w = {a: sum(wall[t][a] for t in tasks) for a in (False, True)}
    c = {a: sum(cpu[t][a] for t in tasks) for a in (False, True)}
    print(f"{'all':16s}{w[False] / len(tasks):16.3f}{w[True] / len(tasks):14.3f}{w[True] / w[False]:11.2f}x"
          f"{c[True] / c[False]:10.2f}x{f'{same_all}/{total}':>14s}")


if __name__ == "__main__":
    main()
