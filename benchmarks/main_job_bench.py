"""The README's main job, timed: `cf-tasks eval --limit 50` on the default model (cf_suite with the
knowledge probe), run whole as a user runs it (a new process each time: start-up, task loading,
model loading, generation, writing) at several batch sizes, one after the other, and whether every
item's scores are equal across them (the samples files compared item by item).

    python benchmarks/main_job_bench.py [--batch_sizes 8,32] [--limit 50] [--repeats 1] [--no_knowledge]

Run it on an idle machine: the target is the wall time of the README's command there. With
``--repeats 2`` the batch sizes take turns (8, 32, 8, 32), so a machine that slows down slows them
alike; the best time of each is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METRICS = ("counterfactual_acc", "parametric_acc", "known_rate", "known_counterfactual_acc", "known_parametric_acc")


def scores(folder: Path) -> dict[tuple[str, int], tuple]:
    """(task, doc_id) -> the item's answers and metrics, from the samples files of one run."""
    found = {}
    for path in sorted(folder.glob("samples_*.jsonl")):
        task = path.name[len("samples_"):-len(".jsonl")]
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            found[(task, row["doc_id"])] = (json.dumps(row["filtered_resps"]), *(row.get(m) for m in METRICS))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_sizes", default="8,32")
    parser.add_argument("--limit", default="50")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no_knowledge", action="store_true")
    args = parser.parse_args()
    sizes = [s for s in args.batch_sizes.split(",") if s]
    cli = str(Path(sys.executable).with_name("cf-tasks"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    best: dict[str, float] = {}
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for size in sizes:
                out = Path(tmp) / f"b{size}_{repeat}"
                command = [cli, "eval", "--limit", args.limit, "--batch_size", size, "--output_path", str(out),
                           *(["--no_knowledge"] if args.no_knowledge else [])]
                start = time.perf_counter()
                subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                seconds = time.perf_counter() - start
                print(f"batch {size:>4s}, run {repeat + 1}: {seconds:7.1f} s", flush=True)
                best[size] = min(best.get(size, seconds), seconds)
                runs.setdefault(size, scores(out))
    first = sizes[0]
    print(f"\n{'batch size':>10s}{'best wall s':>13s}{'minutes':>9s}{'vs first':>10s}{'items equal':>14s}")
    for size in sizes:
        ref, got = runs[first], runs[size]
        equal = sum(got.get(k) == v for k, v in ref.items())
        print(f"{size:>10s}{best[size]:13.1f}{best[size] / 60:9.2f}{best[first] / best[size]:9.2f}x"
              f"{f'{equal}/{len(ref)}':>14s}")


if __name__ == "__main__":
    main()
