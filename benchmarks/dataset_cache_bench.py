"""What the dataset cache saves each process that loads the tasks: the datasets of `cf_suite` and
their agreeing twins built in a new Python process with the cache off, then read from a warm cache
in another, side by side (the best of ``--repeats`` each, taking turns).

    python benchmarks/dataset_cache_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

DATASETS = ("cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes",
            "cf_bio_agree", "cf_world_facts_agree", "cf_capitals_agree", "cf_quotes_agree")
CHILD = ("import sys, time\n"
         "from cf_tasks.tasks import built_dataset\n"
         "start = time.perf_counter()\n"
         "for name in sys.argv[1:]:\n"
         "    built_dataset(name, 1234)\n"
         "print(time.perf_counter() - start)\n")


def seconds(cache: str) -> float:
    env = {**os.environ, "CF_TASKS_DATASET_CACHE": cache}
    done = subprocess.run([sys.executable, "-c", CHILD, *DATASETS], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        seconds(folder)  # fill the cache
        off, warm = [], []
        for _ in range(args.repeats):
            off.append(seconds("off"))
            warm.append(seconds(folder))
    print(f"{len(DATASETS)} datasets in a new process: built and validated {min(off):.2f} s, "
          f"from the cache {min(warm):.2f} s, {min(off) / min(warm):.1f}x")


if __name__ == "__main__":
    main()
