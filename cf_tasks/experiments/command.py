"""``cf-tasks experiment inversion``: its arguments, checked before any model loads, and its two designs.

``--design inject`` (the default, ``inject.py``): knowledge injection, then full fine-tuning, with a
gate that checks the theory's preconditions first. ``--design known_lora`` (``known_lora.py``): LoRA
on the facts the base model already knows, the first design.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..errors import UsageError
from ..files import OutputLock, ascii_float, ascii_int, writable_dir

DESIGNS = ("inject", "known_lora")
INJECT_ONLY = ("t_facts", "n_facts", "inject_lr", "t_epochs", "gate_recall", "gate_mc", "gate_n_shift", "sweep_every")


def _ints(flag: str, text: str) -> tuple[int, ...]:
    parts = [s.strip() for s in text.split(",")]
    if not parts or any(not p.isascii() or not p.isdigit() for p in parts):
        raise UsageError(f"--{flag} {text}: pass comma-separated non-negative integers, e.g. --{flag} 0,1")
    return tuple(int(p) for p in parts)


def _names(flag: str, text: str, allowed) -> tuple[str, ...]:
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in names if a not in allowed]
    if unknown or not names:
        raise UsageError(f"--{flag} {text}: unknown {flag[:-1]} {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(allowed)}")
    return names


def _model(path: str | None) -> str | None:
    if path is not None and not (Path(path) / "config.json").is_file():
        raise UsageError(f"--model {path}: not a transformers model folder (no config.json); "
                         "pass a local model folder or leave --model out for the default model")
    return path


def _common(args: argparse.Namespace, cfg, arms, tasks) -> None:
    """The settings both designs share, checked in the same words."""
    if args.arms is not None:
        cfg.arms = _names("arms", args.arms, arms)
    if args.seeds is not None:
        cfg.seeds = _ints("seeds", args.seeds)
    if args.tasks is not None:
        cfg.tasks = _names("tasks", args.tasks, tasks)
    for key in ("steps", "save_every", "limit"):
        value = getattr(args, key)
        if value is not None:
            if value < 1:
                raise UsageError(f"--{key} {value}: must be a positive integer")
            setattr(cfg, key, value)
    if args.lr is not None:
        if not (math.isfinite(args.lr) and 0 < args.lr < 1):
            raise UsageError(f"--lr {args.lr}: a learning rate is a finite number between 0 and 1, e.g. 1e-5")
        cfg.lr = args.lr
    cfg.model = _model(args.model)
    cfg.report_path = Path(args.report_path) if args.report_path else None
    if cfg.steps < cfg.save_every:
        raise UsageError(f"--steps {cfg.steps} is below the checkpoint interval --save_every {cfg.save_every}; "
                         "train at least one interval")


def inject_config(args: argparse.Namespace):
    from . import inject

    cfg = inject.InjectConfig(output_path=Path(args.output_path))
    if args.quick:
        for key, value in inject.QUICK.items():
            setattr(cfg, key, value)
    _common(args, cfg, inject.ARMS, inject.FAMILIES)
    for key in INJECT_ONLY:
        value = getattr(args, key)
        if value is not None:
            setattr(cfg, key, value)
    cfg.finish = args.finish
    inject.check_config(cfg)  # a StudyError: exit 2
    return cfg


def lora_config(args: argparse.Namespace):
    from . import known_lora

    given = [k for k in INJECT_ONLY if getattr(args, k) is not None] + (["finish"] if args.finish else [])
    if given:
        raise UsageError(f"--{given[0]} applies to --design inject only; drop it or use --design inject")
    cfg = known_lora.StudyConfig(output_path=Path(args.output_path))
    if args.quick:
        for key, value in known_lora.QUICK.items():
            setattr(cfg, key, value)
    _common(args, cfg, known_lora.ARMS, known_lora.TASKS)
    return cfg


def run(args: argparse.Namespace) -> int:
    if not args.output_path:
        raise UsageError("--output_path is empty; pass a study folder")
    from .study_folder import folder_design  # not at import: every cf-tasks command builds this parser

    found = folder_design(args.output_path)
    if args.design is None:  # a study folder says which design it holds; a new one gets the default
        args.design = found if found in DESIGNS else DESIGNS[0]
    cfg = inject_config(args) if args.design == "inject" else lora_config(args)
    if found is not None or not args.report_only:  # a study's folder, not a report folder rendered again
        check_report_path(args.output_path, args.report_path)
    if args.report_only:
        return report_only(args, cfg)
    if args.finish and found is None:
        raise UsageError(f"--finish: {args.output_path} holds no study to close; run the study first (without "
                         "--finish), or pass the --output_path of a study")
    writable_dir(args.output_path)
    with OutputLock(args.output_path, "experiment inversion", on_folder=True):  # one run per study folder
        if args.design == "inject":
            return _run_inject(cfg)
        from . import known_lora

        return _failed(known_lora.run_study(cfg))


def check_report_path(out: str, report_path: str | None) -> None:
    """``--report_path`` outside the study folder (its own ``report/`` aside): the report's files
    (``measure.csv``, ``sweep.csv``, ...) would replace a run's or the sweep's own."""
    if not report_path:
        return
    study, dest = Path(out).expanduser().resolve(), Path(report_path).expanduser().resolve()
    default = study / "report"
    if (dest == study or study in dest.parents) and not (dest == default or default in dest.parents):
        raise UsageError(f"--report_path {report_path} is inside the study folder {out}, whose files the report "
                         f"would replace; pass a folder outside it, or leave it out for {Path(out) / 'report'}")


def _run_inject(cfg) -> int:
    from . import inject
    from .inject_report import build_report

    failed = inject.run_study(cfg)  # a failed gate (GateFailed) is exit 1, a StudyError exit 2
    build_report(cfg)
    return _failed(failed)


def _failed(failed: int) -> int:
    if failed:
        print(f"cf-tasks: {failed} checkpoint(s) failed in the sweeps; see the errors above", file=sys.stderr)
        return 1
    return 0


def report_only(args: argparse.Namespace, cfg) -> int:
    out = Path(args.output_path)
    if args.design == "inject":
        from .inject_report import build_report, has_study

        if not has_study(out):
            raise UsageError(f"--report_only: {out} holds no study of --design inject (no config.json and runs/); "
                             "pass the --output_path of a study, or run the study first")
        in_place = not (out / "config.json").is_file() and cfg.report_path is None  # a report folder, itself
        writable_dir(str(out if in_place else cfg.report_dir), "--report_path")
        build_report(cfg)
        return 0
    from .known_lora_report import build_report as build_lora_report

    if not (out / "runs").is_dir() and not (out / "sweeps").is_dir():
        raise UsageError(f"--report_only: {out} holds no study (no runs/ or sweeps/); "
                         "pass the --output_path of a study, or run the study first")
    writable_dir(str(cfg.report_dir), "--report_path")
    build_lora_report(cfg)
    return 0


def add_parser(experiments) -> None:
    p = experiments.add_parser(
        "inversion", help="fine-tune the default model and sweep its checkpoints for context-parametric inversion: "
                          "knowledge injection then C+S-heavy full fine-tuning (the default), or LoRA on known facts")
    p.add_argument("--output_path", required=True, help="study folder (resumable; it keeps its settings)")
    p.add_argument("--design", choices=DESIGNS, default=None,
                   help="inject: teach facts first, check the gate, then fine-tune (default for a new folder); "
                        "known_lora: LoRA on the facts the base model knows (default: the folder's own design)")
    p.add_argument("--quick", action="store_true",
                   help="a few steps on a few items (with --model, e.g. a tiny test model)")
    p.add_argument("--arms", default=None,
                   help="comma-separated arms; inject: cs_heavy, c_only, augmented (default cs_heavy,c_only); "
                        "known_lora: cs_heavy, c_only, qk_only, filtered, augmented (default all)")
    p.add_argument("--seeds", default=None, help="training seeds (inject default 0; known_lora default 0,1 for cs_heavy)")
    p.add_argument("--model", default=None, help="base model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--steps", type=ascii_int, default=None, help="fine-tuning steps per run (inject 160, known_lora 24)")
    p.add_argument("--save_every", type=ascii_int, default=None, help="steps between checkpoints (inject 16, known_lora 8)")
    p.add_argument("--lr", type=ascii_float, default=None, help="fine-tuning learning rate (inject 1e-5, known_lora 3e-4)")
    p.add_argument("--tasks", default=None,
                   help="comma-separated tasks the sweeps score on their held-out items "
                        "(inject: cf_capitals,cf_world_facts; known_lora: cf_capitals)")
    p.add_argument("--limit", type=ascii_int, default=None,
                   help="held-out items per task in the sweeps (inject 40, cf_capitals always in full; known_lora 40)")
    p.add_argument("--t_facts", type=ascii_int, default=None, help="inject: training facts taught, then C+S points (150)")
    p.add_argument("--n_facts", type=ascii_int, default=None, help="inject: held-out facts never taught, the control (40)")
    p.add_argument("--t_epochs", type=ascii_int, default=None,
                   help="inject: teach T only in the last N epochs of phase A (default all), a weaker memory of T")
    p.add_argument("--inject_lr", type=ascii_float, default=None, help="inject: learning rate of phase A (5e-5)")
    p.add_argument("--sweep_every", type=ascii_int, default=None,
                   help="inject: steps between the checkpoints the sweep scores (48; a multiple of --save_every)")
    p.add_argument("--gate_recall", type=ascii_float, default=None,
                   help="inject: closed-book recall phase A must reach on the taught facts (0.95)")
    p.add_argument("--gate_mc", type=ascii_float, default=None,
                   help="inject: highest mean M_C on the probe facts after phase A (0.35)")
    p.add_argument("--gate_n_shift", type=ascii_float, default=None,
                   help="inject: largest change of the control facts' M_C and recall in phase A (0.10)")
    p.add_argument("--finish", action="store_true",
                   help="inject: close each run at its last checkpoint instead of training further (stop its "
                        "training process first), then sweep and report what was reached")
    p.add_argument("--report_path", default=None, help="where the report goes (default OUTPUT_PATH/report)")
    p.add_argument("--report_only", action="store_true",
                   help="only rebuild the report (tables, plots, CSVs) from a study's files")
    p.set_defaults(func=run)
