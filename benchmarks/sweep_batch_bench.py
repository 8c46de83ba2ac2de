"""`cf-tasks sweep --backend hf` over 4 LoRA checkpoints of the bundled SmolLM2 at several batch
sizes, side by side in one run: wall time, seconds inside lm-eval's evaluation, the speed ratio to
the first batch size, and whether every metric equals the first's. It is the measurement behind the
hf backend's default batch size on a CPU (8).

    python benchmarks/sweep_batch_bench.py [--batch_sizes 1,8,32] [--limit 10] [--tasks cf_suite]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def load_sweep_bench():
    spec = importlib.util.spec_from_file_location("sweep_bench", Path(__file__).with_name("sweep_bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_sizes", default="1,8,32")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--tasks", default="cf_suite")
    args = parser.parse_args()

    from cf_tasks.default_model import default_model_path

    sizes = [s.strip() for s in args.batch_sizes.split(",") if s.strip()]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    walls, inside, rows = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        load_sweep_bench().make_adapters(default_model_path(), tmp / "run")
        for size in sizes:
            out = tmp / f"out{size}"
            start = time.perf_counter()
            subprocess.run([str(Path(sys.executable).parent / "cf-tasks"), "sweep", str(tmp / "run"), "--tasks",
                            args.tasks, "--output_path", str(out), "--limit", str(args.limit), "--backend", "hf",
                            "--batch_size", size, "--model_args", "dtype=float32", "--no_knowledge", "--no_agree",
                            "--quiet"], check=True, env=env)
            walls[size] = time.perf_counter() - start
            manifest = json.loads((out / "manifest.json").read_text())
            inside[size] = sum(e.get("seconds", 0.0) for e in manifest["checkpoints"].values())
            rows[size] = {(r["checkpoint"], r["task"], r["metric"]): r["value"]
                          for r in json.loads((out / "sweep.json").read_text())["rows"]}
    first = sizes[0]
    print(f"hf, tasks {args.tasks}, limit {args.limit}, 4 LoRA checkpoints of SmolLM2-135M")
    print(f"{'batch':>6s} {'wall s':>8s} {'in lm-eval s':>13s} {'speed vs ' + first:>12s} {'metrics differing':>18s}")
    for size in sizes:
        differ = sum(rows[size].get(k) != v for k, v in rows[first].items())
        print(f"{size:>6s} {walls[size]:8.1f} {inside[size]:13.1f} {walls[first] / walls[size]:11.2f}x "
              f"{differ:>10d} of {len(rows[first])}")


if __name__ == "__main__":
    main()
