"""The ``cf-tasks`` command line: build datasets (and, in later commands, evaluate and publish).

Errors a user can fix are printed as one line, ``cf-tasks: error: <what> ; <fix>``, with exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


ALPHA_HELP = ("significance level of the summary's paired tests: an inversion needs a significant rise and a "
              "significant fall (default 0.05)")
NO_KNOWLEDGE_HELP = ("skip the knowledge probe: by default each knowledge-conflict task's items are also asked "
                     "closed-book in the same pass, adding known_rate, known_counterfactual_acc, "
                     "known_parametric_acc and unknown_counterfactual_acc")
ATTENTION_HELP = ("also measure context_attention: the attention of the position that predicts the first answer "
                  "token on the context passage, per knowledge-conflict item (hf models only)")


class UsageError(Exception):
    """A problem with the user's input; printed as one line without a traceback."""


def _writable_dir(path: str) -> Path:
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".cf-tasks-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise UsageError(f"cannot write to output folder {out}: {reason}; choose a writable --out") from None
    return out


def cmd_build(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import dataset_builders
    from dataset_builders.serialize import sha256, write_dataset
    from dataset_builders.validate import ValidationError, build_validated

    from .files import atomic_write

    names = list(dataset_builders.DATASETS) if args.dataset == "all" else [args.dataset]
    for name in names:
        try:
            dataset_builders.builder(name)
        except dataset_builders.UnknownDataset as err:
            raise UsageError(str(err)) from None
    out = _writable_dir(args.out)
    manifest = {"seed": args.seed, "format": args.format, "datasets": {}}
    start = time.perf_counter()
    for name in tqdm(names, desc="building", unit="dataset", disable=args.quiet):
        try:
            items = build_validated(name, args.seed)
        except ValidationError as err:
            raise UsageError(f"{err}\nfix the fact table or builder named above and rebuild") from None
        path, data = write_dataset(items, out, name, args.format)
        manifest["datasets"][name] = {
            "file": path.name,
            "count": len(items),
            "version": dataset_builders.version(name),
            "sha256": sha256(data),
        }
    atomic_write(out / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    elapsed = time.perf_counter() - start
    if not args.quiet:
        for name, entry in manifest["datasets"].items():
            print(f"{name:16s} {entry['count']:6d} items  v{entry['version']}  {out / entry['file']}")
        print(f"built {len(names)} dataset(s) with seed {args.seed} in {elapsed:.2f} s -> {out / 'manifest.json'}")
    return 0


def cmd_tasks_path(args: argparse.Namespace) -> int:
    from .registry import task_yamls_path

    print(task_yamls_path())
    return 0


def _parse_metadata(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"--metadata is not valid JSON ({err.msg}); pass e.g. '{{\"seed\": 7}}'") from None
    if not isinstance(value, dict):
        raise UsageError("--metadata must be a JSON object, e.g. '{\"seed\": 7}'")
    return value


def cmd_eval(args: argparse.Namespace) -> int:
    from lm_eval.utils import make_table, simple_parse_args_string

    from .default_model import DEFAULT_MODEL_BATCH_SIZE, DefaultModelError, default_model_path
    from .evaluate import default_device, knowledge_probe, needs_builtin_tasks, run_lm_eval
    from .registry import task_manager

    tasks = [t for t in args.tasks.split(",") if t]
    metadata = _parse_metadata(args.metadata)
    if args.attention:
        from .attention import HF_MODELS, UNAVAILABLE

        if args.model not in HF_MODELS:
            raise UsageError(UNAVAILABLE.format(where=f"--model {args.model}", fix="--model hf"))
    model_args = args.model_args
    device, batch_size = args.device, args.batch_size
    if not model_args:
        if args.model != "hf":
            raise UsageError(f"--model {args.model} needs --model_args (the default model is for --model hf)")
        try:
            path = default_model_path()
        except DefaultModelError as err:
            raise UsageError(str(err)) from None
        model_args = f"pretrained={path},dtype=float32"
        if batch_size is None:
            # Greedy answers equal to batch 1's; benchmarks/eval_bench.py measures both side by side.
            batch_size = DEFAULT_MODEL_BATCH_SIZE
        if args.apply_chat_template is None:
            args.apply_chat_template = True  # an instruct model: raw prompts mostly get <|im_end|>
        print(f"cf-tasks: evaluating the default model {path}", file=sys.stderr)
    if device is None and args.model == "hf" and "device" not in simple_parse_args_string(model_args):
        # lm-eval's HFLM takes "cuda" as given and fails on a CPU-only machine.
        device = default_device()
    # Built once: lm-eval's own index (~7 s) only when a task is not ours.
    tm = task_manager(include_defaults=needs_builtin_tasks(tasks), metadata=metadata)
    probe = None if args.no_knowledge else knowledge_probe(tasks, tm)
    from .attention import AttentionError

    try:
        results = run_lm_eval(
            args.model, tasks, model_args=model_args, limit=args.limit, batch_size=batch_size or 1, device=device,
            metadata=metadata, apply_chat_template=bool(args.apply_chat_template),
            log_samples=bool(args.output_path), task_manager=tm, knowledge=probe, attention=args.attention,
        )
    except AttentionError as err:
        raise UsageError(str(err)) from None
    if results is None:
        return 0
    if args.output_path:
        from .results import save_results

        path = save_results(results, Path(args.output_path))
        print(f"cf-tasks: results written to {path}", file=sys.stderr)
    print(make_table(results))
    if "groups" in results:
        print(make_table(results, "groups"))
    return 0


def _parse_shard(text: str) -> tuple[int, int]:
    if text == "auto":
        from .sweep import SweepError, shard_from_env

        try:
            return shard_from_env()
        except (SweepError, ValueError) as err:
            raise UsageError(str(err) if isinstance(err, SweepError) else
                             f"--shard auto: the Slurm array or RANK/WORLD_SIZE variables are not numbers ({err})") from None
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r} is not I/N; pass e.g. --shard 0/2 for the first of two shards") from None
    if not 0 <= index < count:
        raise UsageError(f"--shard {text}: I must be in 0..N-1; pass e.g. --shard 0/{max(count, 2)}")
    return index, count


def _parse_alpha(text: str):
    from .sweep import SweepError, check_alpha

    try:
        return check_alpha(text)
    except SweepError as err:
        raise UsageError(str(err)) from None


def cmd_sweep(args: argparse.Namespace) -> int:
    from .sweep import SweepConfig, SweepError, run_sweep, vllm_available

    alpha = _parse_alpha(args.alpha)
    backend = args.backend or ("vllm" if vllm_available() else "hf")
    cfg = SweepConfig(
        run_dir=Path(args.run_dir), tasks=[t.strip() for t in args.tasks.split(",") if t.strip()],
        output_path=Path(args.output_path),
        backend=backend, base=args.base, limit=args.limit, batch_size=args.batch_size,
        include_base=args.include_base, shard=_parse_shard(args.shard), watch=args.watch,
        poll_interval=args.poll_interval, settle_seconds=args.settle_seconds, max_polls=args.max_polls,
        device=args.device, tensor_parallel_size=args.tensor_parallel_size, model_args=args.model_args,
        apply_chat_template=args.apply_chat_template, metadata=_parse_metadata(args.metadata),
        lora_group=args.lora_group, lock_timeout=args.lock_timeout, alpha=alpha,
        knowledge=not args.no_knowledge, agree=not args.no_agree, attention=args.attention,
    )
    try:
        failed = run_sweep(cfg)
    except SweepError as err:
        raise UsageError(str(err)) from None
    if failed:
        print(f"cf-tasks: {failed} checkpoint(s) failed; see the errors above and {cfg.output_path / 'sweep.json'}",
              file=sys.stderr)
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .sweep import SweepError, report

    outs = [Path(p) for p in args.outputs]
    alpha = _parse_alpha(args.alpha)
    try:
        report(outs, Path(args.output_path) if args.output_path else outs[0], alpha=alpha, items=args.items)
    except SweepError as err:
        raise UsageError(str(err)) from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dataset_builders import DEFAULT_SEED
    from dataset_builders.serialize import FORMATS

    parser = argparse.ArgumentParser(prog="cf-tasks", description="Knowledge-conflict tasks for lm-eval.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="build the counterfactual datasets to files")
    p.add_argument("--dataset", default="all", help="dataset name or 'all' (default)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"builder seed (default {DEFAULT_SEED})")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--format", choices=FORMATS, default="jsonl")
    p.add_argument("--quiet", action="store_true", help="no progress or summary output")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("tasks-path", help="print the task YAML folder (for lm_eval --include_path)")
    p.set_defaults(func=cmd_tasks_path)

    p = sub.add_parser("eval", help="evaluate a model (default: the embedded SmolLM2) with lm-eval")
    p.add_argument("--model", default="hf", help="lm-eval model type (hf, vllm, ...)")
    p.add_argument("--model_args", default=None, help="lm-eval model_args; omit for the default model")
    p.add_argument("--tasks", default="cf_suite", help="comma-separated tasks or groups (default cf_suite)")
    p.add_argument("--limit", type=float, default=None, help="items per task (lm-eval --limit)")
    p.add_argument("--batch_size", default=None,
                   help="lm-eval batch size (default: 1; for the default model, one that is fast and gives the same answers)")
    p.add_argument("--device", default=None, help="lm-eval device (default: cuda if available, else cpu)")
    p.add_argument("--output_path", default=None, help="folder for results JSON and samples")
    p.add_argument("--metadata", default=None, help="JSON passed to the tasks, e.g. '{\"seed\": 7}'")
    p.add_argument("--apply_chat_template", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap prompts in the model's chat template (default: on for the default model only)")
    p.add_argument("--no_knowledge", action="store_true", help=NO_KNOWLEDGE_HELP)
    p.add_argument("--attention", action="store_true", help=ATTENTION_HELP)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("sweep", help="score every checkpoint of a fine-tuning run (full or LoRA)")
    p.add_argument("run_dir", help="folder holding checkpoint-N / step_N / global_stepN / epoch_N sub-folders")
    p.add_argument("--tasks", default="cf_suite", help="comma-separated lm-eval tasks (default cf_suite)")
    p.add_argument("--output_path", required=True, help="sweep output folder (resumable)")
    p.add_argument("--backend", choices=("vllm", "hf"), default=None, help="default: vllm where installed, else hf")
    p.add_argument("--base", default=None, help="base model for LoRA adapters (default: from adapter_config.json)")
    p.add_argument("--limit", type=float, default=None, help="items per task (lm-eval --limit)")
    p.add_argument("--batch_size", default=1, help="lm-eval batch size (hf backend)")
    p.add_argument("--include_base", action="store_true", help="also score the base model as step 0")
    p.add_argument("--shard", default="0/1",
                   help="I/N: score every N-th checkpoint starting at I (0-based); 'auto': I/N from "
                        "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT or RANK/WORLD_SIZE")
    p.add_argument("--watch", action="store_true", help="keep polling RUN_DIR for new checkpoints")
    p.add_argument("--poll_interval", type=float, default=30.0, help="seconds between polls with --watch")
    p.add_argument("--settle_seconds", type=float, default=10.0,
                   help="with --watch, a checkpoint is complete once no file changed for this long")
    p.add_argument("--max_polls", type=int, default=None, help="with --watch, stop after this many polls")
    p.add_argument("--model_args", default=None,
                   help="lm-eval model_args for every checkpoint, on top of its pretrained/adapter, e.g. "
                        "dtype=bfloat16,gpu_memory_utilization=0.9 (default dtype=auto: the checkpoint's own)")
    p.add_argument("--device", default=None, help="hf backend device (default cuda if available, else cpu)")
    p.add_argument("--tensor_parallel_size", type=int, default=None,
                   help="vllm backend tensor parallelism (default 1; or --model_args tensor_parallel_size=N)")
    p.add_argument("--lora_group", type=int, default=4,
                   help="LoRA adapters of one base generated together in one batch (1: one at a time)")
    p.add_argument("--apply_chat_template", action="store_true", help="wrap prompts in the chat template")
    p.add_argument("--metadata", default=None, help="JSON passed to the tasks, e.g. '{\"seed\": 7}'")
    p.add_argument("--lock_timeout", type=float, default=6 * 3600.0,
                   help="seconds after which another host's claim on a checkpoint is taken over (a claim of a "
                        "dead process on this host is taken over at once)")
    p.add_argument("--alpha", default="0.05",
                   help=ALPHA_HELP)
    p.add_argument("--no_knowledge", action="store_true", help=NO_KNOWLEDGE_HELP)
    p.add_argument("--no_agree", action="store_true",
                   help="do not run each knowledge-conflict task's agreeing twin (<dataset>_agree, where installed)")
    p.add_argument("--attention", action="store_true", help=ATTENTION_HELP + " (hf backend)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="merge sweep outputs (e.g. shards), redraw the plot, rewrite summary.csv")
    p.add_argument("outputs", nargs="+", help="sweep output folders")
    p.add_argument("--output_path", default=None, help="where to write the merged outputs (default: the first)")
    p.add_argument("--alpha", default="0.05",
                   help=ALPHA_HELP)
    p.add_argument("--items", action="store_true",
                   help="also write items.csv: one row per checkpoint x task x item with its outcome")
    p.set_defaults(func=cmd_report)

    from .hub import add_publish_parser

    add_publish_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as err:
        print(f"cf-tasks: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cf-tasks: interrupted; finished files were kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
