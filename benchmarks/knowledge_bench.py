"""The cost of the knowledge probe: `cf-tasks sweep` over LoRA checkpoints of the bundled SmolLM2
with the probe (the default) and with `--no_knowledge`, side by side in one run.

The probe adds each knowledge-conflict task's closed-book prompt (the question without its passage)
on the same items, in the same lm-eval pass: one more short generation per item. Both sweeps run
with `--no_agree`, so that the ratio is the probe's alone. The two are run in turn, `--repeats`
times each (ABBA order), and the ratio is of the median wall times.

    python benchmarks/knowledge_bench.py [--backend hf|vllm] [--limit 10] [--tasks cf_suite] [--adapters 2]
                                         [--repeats 1] [--apply_chat_template]

Target: the probe costs at most 1.6x the sweep without it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
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


def sweep(run: Path, out: Path, args, knowledge: bool, env: dict) -> tuple[float, float, dict]:
    """One sweep into a fresh folder: wall seconds, seconds inside lm-eval, and its rows."""
    command = [str(Path(sys.executable).parent / "cf-tasks"), "sweep", str(run), "--tasks", args.tasks,
               "--output_path", str(out), "--limit", str(args.limit), "--backend", args.backend,
               "--batch_size", "8", "--no_agree", *([] if knowledge else ["--no_knowledge"]),
               *(["--apply_chat_template"] if args.apply_chat_template else [])]
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    manifest = json.loads((out / "manifest.json").read_text())
    rows = {(r["checkpoint"], r["task"], r["metric"]): r["value"] for r in json.loads((out / "sweep.json").read_text())["rows"]}
    return wall, sum(e.get("seconds", 0.0) for e in manifest["checkpoints"].values()), rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--tasks", default="cf_suite")
    parser.add_argument("--adapters", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each kind (ABBA order)")
    parser.add_argument("--apply_chat_template", action="store_true",
                        help="prompts in the chat template (the closed-book answers run longer in it)")
    args = parser.parse_args()

    from cf_tasks.default_model import default_model_path

    bench = load_sweep_bench()
    bench.N_ADAPTERS = args.adapters
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    walls: dict[bool, list[float]] = {True: [], False: []}
    evals: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bench.make_adapters(default_model_path(), tmp / "run")
        order = [True, False, False, True] * ((args.repeats + 1) // 2)
        order = order[: 2 * args.repeats]
        rows = {}
        for i, knowledge in enumerate(order):
            wall, inside, rows[knowledge] = sweep(tmp / "run", tmp / f"out{i}", args, knowledge, env)
            walls[knowledge].append(wall)
            evals[knowledge].append(inside)
    with_probe, without = statistics.median(walls[True]), statistics.median(walls[False])
    shared = [k for k in rows[False] if k in rows[True]]
    differing = [k for k in shared if rows[False][k] != rows[True][k]]
    added = sorted({k[2] for k in rows[True]} - {k[2] for k in rows[False]})
    print(f"backend {args.backend}, tasks {args.tasks}, limit {args.limit}, {args.adapters} LoRA checkpoints of "
          f"SmolLM2-135M, {args.repeats} run(s) each, chat template {'on' if args.apply_chat_template else 'off'}")
    print(f"sweep with the knowledge probe:  {with_probe:8.1f} s wall ({statistics.median(evals[True]):.1f} s in lm-eval)")
    print(f"sweep with --no_knowledge:       {without:8.1f} s wall ({statistics.median(evals[False]):.1f} s in lm-eval)")
    print(f"cost ratio with/without:         {with_probe / without:8.2f}x wall, "
          f"{statistics.median(evals[True]) / statistics.median(evals[False]):.2f}x in lm-eval")
    print(f"metrics added: {', '.join(added)}; shared metrics that differ: {len(differing)} of {len(shared)}")


if __name__ == "__main__":
    main()
