"""Seconds per item of the suite on the bundled SmolLM2-135M-Instruct, per task, at several batch
sizes side by side (one loaded model, chat template on as `cf-tasks eval` uses it), and whether the
greedy answers equal those of the first batch size, item by item. CPU seconds (all threads of this
process) are printed beside the wall seconds: on a machine that other jobs share, they show the work
a batch size costs when the wall time mostly shows the wait for a core. The "model" rows count only
the time inside the model's generate / log-likelihood calls, without building the tasks' datasets.

    python benchmarks/eval_bench.py [--limit 20] [--batch_sizes 1,8] [--tasks cf_bio,cf_quotes] [--device cpu]

The batch sizes take turns task by task, so a machine that slows down during the run slows them
alike.
"""

from __future__ import annotations

import argparse
import time

TASKS = ("cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--batch_sizes", default="1,8")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default: the suite's four)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    args = parser.parse_args()

    from lm_eval.models.huggingface import HFLM

    from cf_tasks.default_model import default_model_path
    from cf_tasks.evaluate import default_device, run_lm_eval
    from cf_tasks.registry import task_manager

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    tasks = [t for t in args.tasks.split(",") if t]
    tm = task_manager()
    lm = HFLM(pretrained=str(default_model_path()), dtype="float32", device=args.device or default_device(),
              batch_size=sizes[0])
    seconds: dict[str, dict[int, float]] = {t: {} for t in tasks}
    cpu: dict[str, dict[int, float]] = {t: {} for t in tasks}
    model: dict[str, dict[int, float]] = {t: {} for t in tasks}
    in_model = [0.0]

    def timed(method):
        def call(*a, **kw):
            start = time.perf_counter()
            try:
                return method(*a, **kw)
            finally:
                in_model[0] += time.perf_counter() - start
        return call

    lm.generate_until, lm.loglikelihood = timed(lm.generate_until), timed(lm.loglikelihood)
    answers: dict[str, dict[int, dict[int, str]]] = {t: {} for t in tasks}
    for task in tasks:
        for size in sizes:
            lm.batch_size_per_gpu = size
            start, start_cpu, in_model[0] = time.perf_counter(), time.process_time(), 0.0
            out = run_lm_eval(lm, [task], limit=args.limit, apply_chat_template=True, task_manager=tm, log_samples=True)
            seconds[task][size] = (time.perf_counter() - start) / args.limit
            cpu[task][size] = (time.process_time() - start_cpu) / args.limit
            model[task][size] = in_model[0] / args.limit
            answers[task][size] = {s["doc_id"]: s["filtered_resps"] for s in out["samples"][task]}  # every answer of the item (a _known task has two)
    first, last = sizes[0], sizes[-1]
    for label, table in (("wall", seconds), ("CPU", cpu), ("model", model)):
        header = "".join(f"{f'batch {s} {label} s/item':>22s}" for s in sizes)
        print(f"{'task':16s}{header}{'ratio':>10s}{'same answers':>16s}")
        same_all = total = 0
        for task in tasks:
            ref = answers[task][first]
            same = min(sum(answers[task][s][i] == a for i, a in ref.items()) for s in sizes)
            same_all, total = same_all + same, total + len(ref)
            cells = "".join(f"{table[task][s]:22.2f}" for s in sizes)
            print(f"{task:16s}{cells}{table[task][first] / table[task][last]:10.2f}x{f'{same}/{len(ref)}':>16s}")
        mean = {s: sum(table[t][s] for t in tasks) / len(tasks) for s in sizes}
        cells = "".join(f"{mean[s]:22.2f}" for s in sizes)
        print(f"{'mean':16s}{cells}{mean[first] / mean[last]:10.2f}x{f'{same_all}/{total}':>16s}\n")

if __name__ == "__main__":
    main()
