"""``cf-tasks sweep``: score every checkpoint of a fine-tuning run (full or LoRA).

The sweep's own checks (``cf_tasks.sweep.checks.check_arguments``) run inside ``run_sweep``; here
only what the command line turns into its settings: ``--shard``, ``--alpha``, ``--peak_step``,
``--metadata``'s JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError
from ..files import ascii_float, ascii_int
from ..trackers import add_arguments as add_tracker_arguments
from .common import (ATTENTION_HELP, METADATA_HELP, NO_KNOWLEDGE_HELP, add_verdict_arguments, parse_alpha,
                     parse_metadata, parse_peak_step, parse_primary, task_list)


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="score every checkpoint of a fine-tuning run (full or LoRA)")
    p.add_argument("run_dir", help="folder holding checkpoint-N / step_N / global_stepN / epoch_N sub-folders")
    p.add_argument("--tasks", default="cf_suite", help="comma-separated lm-eval tasks or groups")
    p.add_argument("--output_path", required=True, help="sweep output folder (resumable)")
    p.add_argument("--backend", choices=("vllm", "hf"), default=None, help="default: vllm where installed, else hf")
    p.add_argument("--base", default=None, help="base model for LoRA adapters (default: from adapter_config.json)")
    p.add_argument("--limit", type=ascii_float, default=None, help="items per task (lm-eval --limit)")
    p.add_argument("--batch_size", default=None,
                   help="lm-eval batch size, a number, auto or auto:N (hf backend; default 8 on a CPU, 1 on a GPU)")
    p.add_argument("--include_base", action="store_true", help="also score the base model as step 0")
    p.add_argument("--shard", default="0/1",
                   help="I/N: score every N-th checkpoint starting at I (0-based); 'auto': I/N from "
                        "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT or RANK/WORLD_SIZE")
    p.add_argument("--watch", action="store_true", help="keep polling RUN_DIR for new checkpoints")
    p.add_argument("--poll_interval", type=ascii_float, default=30.0, help="seconds between polls with --watch")
    p.add_argument("--settle_seconds", type=ascii_float, default=10.0,
                   help="with --watch, a checkpoint is complete once no file changed for this long")
    p.add_argument("--max_polls", type=ascii_int, default=None, help="with --watch, stop after this many polls")
    p.add_argument("--model_args", default=None,
                   help="lm-eval model_args for every checkpoint, on top of its pretrained/adapter, e.g. "
                        "dtype=bfloat16,gpu_memory_utilization=0.9 (default dtype=auto: the checkpoint's own)")
    p.add_argument("--device", default=None, help="hf backend device (default cuda if available, else cpu)")
    p.add_argument("--tensor_parallel_size", type=ascii_int, default=None,
                   help="vllm backend tensor parallelism (default 1; or --model_args tensor_parallel_size=N)")
    p.add_argument("--lora_group", type=ascii_int, default=4,
                   help="LoRA adapters of one base generated together in one batch (1: one at a time)")
    p.add_argument("--apply_chat_template", action="store_true", help="wrap prompts in the chat template")
    p.add_argument("--metadata", default=None, help=METADATA_HELP)
    p.add_argument("--lock_timeout", type=ascii_float, default=6 * 3600.0,
                   help="seconds after which another host's claim on a checkpoint is taken over when it has no "
                        "heartbeat (a claim of a dead process on this host, or one whose heartbeat stopped for 5 "
                        "minutes, is taken over sooner)")
    add_verdict_arguments(p)
    p.add_argument("--quiet", action="store_true",
                   help="print only failures and the closing line (no progress bars, no summary table)")
    p.add_argument("--no_knowledge", action="store_true", help=NO_KNOWLEDGE_HELP)
    p.add_argument("--no_agree", action="store_true",
                   help="do not run each knowledge-conflict task's agreeing twin (<dataset>_agree, where installed)")
    p.add_argument("--attention", action="store_true", help=ATTENTION_HELP)
    p.add_argument("--timings", action="store_true",
                   help="print the seconds of each phase (start-up, task index, datasets, model loads, evaluation, "
                        "writing, views) at the end, and write them to OUTPUT_PATH/timings/")
    add_tracker_arguments(p)
    p.set_defaults(func=run)


def parse_shard(text: str) -> tuple[int, int]:
    """``--shard``: I/N, or ``auto`` from the scheduler's variables."""
    if text == "auto":
        from ..sweep import shard_from_env

        try:
            return shard_from_env()
        except ValueError as err:  # a SweepError says its own line
            raise UsageError(f"--shard auto: the Slurm array or RANK/WORLD_SIZE variables are not numbers ({err})") from None
    try:
        if not text.isascii():  # int() reads other scripts' digits: "١/٢" is not what a scheduler writes
            raise ValueError(text)
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r} is not I/N; pass e.g. --shard 0/2 for the first of two shards") from None
    if not 0 <= index < count:
        raise UsageError(f"--shard {text}: I must be in 0..N-1; pass e.g. --shard 0/{max(count, 2)}")
    return index, count


def run(args: argparse.Namespace) -> int:
    from ..sweep import SweepConfig, run_sweep, vllm_available

    alpha = parse_alpha(args.alpha)
    backend = args.backend or ("vllm" if vllm_available() else "hf")
    cfg = SweepConfig(
        run_dir=Path(args.run_dir), tasks=task_list(args.tasks),
        output_path=Path(args.output_path),
        backend=backend, base=args.base, limit=args.limit, batch_size=args.batch_size,
        include_base=args.include_base, shard=parse_shard(args.shard), watch=args.watch,
        poll_interval=args.poll_interval, settle_seconds=args.settle_seconds, max_polls=args.max_polls,
        device=args.device, tensor_parallel_size=args.tensor_parallel_size, model_args=args.model_args,
        apply_chat_template=args.apply_chat_template,
        metadata=parse_metadata(args.metadata, check_values=False),  # the sweep's checks read its values
        lora_group=args.lora_group, lock_timeout=args.lock_timeout, alpha=alpha,
        peak_step=parse_peak_step(args.peak_step), primary=parse_primary(args.primary),
        knowledge=not args.no_knowledge, agree=not args.no_agree, attention=args.attention, quiet=args.quiet,
        timings=args.timings, report_to=args.report_to, report_args=args.report_args,
    )
    failed = run_sweep(cfg)
    if failed:
        print(f"cf-tasks: {failed} checkpoint(s) failed; see the errors above and {cfg.output_path / 'sweep.json'}",
              file=sys.stderr)
        return 1
    return 0
