"""``cf-tasks experiment``: the paper's experiments, reproduced. ``mechanism`` is here;
``inversion``'s arguments live beside the study (``cf_tasks.experiments.command``)."""

from __future__ import annotations

import argparse
import time

from ..errors import UsageError
from ..files import ascii_int, writable_dir


def add_parser(sub) -> None:
    from ..experiments.command import add_parser as add_inversion_parser

    p = sub.add_parser("experiment", help="the paper's experiments, reproduced")
    experiments = p.add_subparsers(dest="experiment", required=True)
    add_mechanism_parser(experiments)
    add_inversion_parser(experiments)


def add_mechanism_parser(experiments) -> None:
    p = experiments.add_parser(
        "mechanism", help="the paper's one-layer transformer (section 5): attention, losses and "
                          "counterfactual probes per fine-tuning step, four data arms")
    p.add_argument("--output_path", required=True, help="folder for <arm>.csv, summary.csv and <arm>.png")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--steps", type=ascii_int, default=200, help="fine-tuning steps per arm and seed (default 200)")
    p.add_argument("--no_plots", action="store_true", help="write the CSVs only")
    p.set_defaults(func=run_mechanism)


def parse_seeds(text: str) -> list[int]:
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if any(not (p.isascii() and p.isdigit()) for p in parts):  # int() would read "-1" and "٣" too
        raise UsageError(f"--seeds {text!r} is not a comma-separated list of non-negative integers in ASCII digits; "
                         "pass e.g. --seeds 0,1,2")
    seeds = [int(p) for p in parts]
    if not seeds or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds {text!r} needs one or more distinct integers; pass e.g. --seeds 0,1,2")
    return seeds


def run_mechanism(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps} must be at least 1; pass e.g. --steps 200")
    out = writable_dir(args.output_path, "--output_path")
    from dataclasses import replace

    from ..experiments.mechanism import ARMS, MechanismConfig, run_study

    start = time.perf_counter()
    summary = run_study(out, seeds, replace(MechanismConfig(), steps=args.steps), plots=not args.no_plots)
    at = {(r["arm"], r["quantity"], r["step"]): r["mean"] for r in summary}
    for arm in ARMS:
        curve = [(at[arm, "attn_context", step], step) for step in range(args.steps + 1)]
        peak, peak_step = max(curve)
        print(f"{arm:15s} attention on context: {curve[0][0]:.3f} at step 0, peak {peak:.3f} at step {peak_step}, "
              f"{curve[-1][0]:.3f} at the end; counterfactual accuracy {at[arm, 'cf_acc', 0]:.2f} -> "
              f"{max(at[arm, 'cf_acc', s] for s in range(args.steps + 1)):.2f} (peak) -> {at[arm, 'cf_acc', args.steps]:.2f}")
    print(f"{len(ARMS)} arms x {len(seeds)} seeds x {args.steps} steps in {time.perf_counter() - start:.1f} s -> {out}")
    return 0
