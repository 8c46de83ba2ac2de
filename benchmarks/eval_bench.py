"""Seconds per item of the suite on the bundled SmolLM2-135M-Instruct, per task, at two batch
sizes side by side (one loaded model, chat template on as `cf-tasks eval` uses it).

    python benchmarks/eval_bench.py [--limit 20] [--batch_sizes 1,8]
"""

from __future__ import annotations

import argparse
import time

TASKS = ("cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--batch_sizes", default="1,8")
    args = parser.parse_args()

    from lm_eval.models.huggingface import HFLM

    from cf_tasks.default_model import default_model_path
    from cf_tasks.evaluate import run_lm_eval
    from cf_tasks.registry import task_manager

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    tm = task_manager()
    lm = HFLM(pretrained=str(default_model_path()), dtype="float32", device="cpu", batch_size=sizes[0])
    table: dict[str, dict[int, float]] = {t: {} for t in TASKS}
    for size in sizes:
        lm.batch_size_per_gpu = size
        for task in TASKS:
            start = time.perf_counter()
            run_lm_eval(lm, [task], limit=args.limit, apply_chat_template=True, task_manager=tm)
            table[task][size] = (time.perf_counter() - start) / args.limit
    header = "".join(f"{f'batch {s} s/item':>18s}" for s in sizes)
    print(f"{'task':16s}{header}{'ratio':>10s}")
    for task, row in table.items():
        cells = "".join(f"{row[s]:18.2f}" for s in sizes)
        print(f"{task:16s}{cells}{row[sizes[0]] / row[sizes[-1]]:10.2f}x")
    mean = {s: sum(table[t][s] for t in TASKS) / len(TASKS) for s in sizes}
    print(f"{'mean':16s}" + "".join(f"{mean[s]:18.2f}" for s in sizes) + f"{mean[sizes[0]] / mean[sizes[-1]]:10.2f}x")


if __name__ == "__main__":
    main()
