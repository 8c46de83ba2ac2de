"""The quick test tier against the full suite, measured side by side in one run.

Runs the whole suite once (without the ``vllm`` tests, which need their own environment) with
``--durations=0``, then sums each test's setup, call and teardown seconds over every test and over
the tests that ``pytest -m "not slow"`` selects. One run, so both sums share the machine's load.
Prints both sums, their ratio (the target: the quick tier at most a third of the full suite's test
time) and the twenty slowest tests of the quick tier.

    python benchmarks/tiers_bench.py [-n 2]   # extra arguments go to pytest (e.g. pytest-xdist's -n)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*)$")


def node_ids(marker: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", marker], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line.strip() for line in out.splitlines() if "::" in line}


def durations(output: str) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for line in output.splitlines():
        m = LINE.match(line.strip())
        if m:
            seconds[m.group(3).strip()] += float(m.group(1))
    return seconds


def main(extra: list[str]) -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not vllm",
                          "--durations=0", "--durations-min=0", *extra], cwd=ROOT, capture_output=True, text=True,
                         env=env)
    tail = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    print(f"full suite: {tail}")
    seconds = durations(run.stdout)
    quick = node_ids("not slow and not vllm")
    full_s = sum(seconds.values())
    quick_s = sum(s for node, s in seconds.items() if node in quick)
    print(f"tests timed: {len(seconds)} (quick tier {len(quick)})")
    print(f"summed test time: full suite {full_s:.0f} s, quick tier {quick_s:.0f} s, "
          f"ratio {quick_s / max(full_s, 1e-9):.2f} (target <= 0.33)")
    print("slowest in the quick tier:")
    for node, s in sorted(((n, s) for n, s in seconds.items() if n in quick), key=lambda x: -x[1])[:20]:
        print(f"  {s:6.1f} s  {node}")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
