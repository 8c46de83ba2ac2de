"""Time `cf-tasks build --dataset all` (build + validation + writing) against the 10 s target.

Prints, side by side from one run: seconds per dataset for building alone, for the full
validated build, and the total against the target, as a ratio.

    python benchmarks/build_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time

TARGET_SECONDS = 10.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import dataset_builders
    from cf_tasks.cli import main as cli_main
    from dataset_builders import tables

    # Load the fact tables once so the first timed dataset does not pay for JSON parsing alone.
    tables.people(), tables.countries(), tables.relations(), tables.quotes()
    print(f"{'dataset':16s} {'items':>6s} {'build s':>8s}")
    for name in dataset_builders.DATASETS:
        start = time.perf_counter()
        items = dataset_builders.build(name)
        print(f"{name:16s} {len(items):6d} {time.perf_counter() - start:8.3f}")

    totals = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            cli_main(["build", "--out", out, "--quiet"])
            totals.append(time.perf_counter() - start)
    best = min(totals)
    print(f"cf-tasks build --dataset all (validated, written): best {best:.2f} s of {args.repeats}, "
          f"target {TARGET_SECONDS:.0f} s, ratio target/actual = {TARGET_SECONDS / best:.1f}x")


if __name__ == "__main__":
    main()
