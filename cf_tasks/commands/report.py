"""``cf-tasks report``: merge sweep outputs (e.g. shards), redraw the plot, rewrite summary.csv; or,
with ``--compare``, draw several studies' curves on one plot."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError
from .common import add_verdict_arguments, parse_alpha, parse_peak_step, parse_primary

MIXED_SCORERS_HELP = ("report a task whose rows were scored by different scorer versions instead of refusing: a "
                      "checkpoint scored under several versions shows only its latest version's rows, so an older "
                      "version's numbers of it leave the views")


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="merge sweep outputs (e.g. shards), redraw the plot, rewrite summary.csv")
    p.add_argument("outputs", nargs="+", help="sweep output folders")
    p.add_argument("--output_path", default=None,
                   help="where to write the merged views; needed with two or more folders (naming one of "
                        "them writes into it); with one folder, its own views are rewritten in place")
    add_verdict_arguments(p)
    p.add_argument("--items", action="store_true",
                   help="also write items.csv: one row per checkpoint x task x item with its outcome")
    p.add_argument("--mixed_scorers", action="store_true",
                   help=MIXED_SCORERS_HELP)
    p.add_argument("--compare", action="store_true", help="draw several studies' curves on one plot, OUTPUT_PATH/"
                   "compare.png: sweep output folders, published folders or Hub dataset repos ORG/NAME")
    p.add_argument("--mixed_versions", action="store_true",
                   help="with --compare, draw studies of different dataset or scorer versions instead of refusing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..sweep import report

    if args.compare:
        return run_compare(args)
    outs = [Path(p) for p in args.outputs]
    if args.output_path is None and len(outs) > 1:
        raise UsageError(f"report would write the merged views into {outs[0]}, one of its inputs; pass "
                         f"--output_path NEW_FOLDER (or --output_path {outs[0]} to merge into it)")
    alpha, peak_step, primary = parse_alpha(args.alpha), parse_peak_step(args.peak_step), parse_primary(args.primary)
    if args.output_path:
        from ..sweep.checks import check_output_folder, check_output_outside_inputs

        check_output_folder(Path(args.output_path))
        check_output_outside_inputs(outs, Path(args.output_path))
    report(outs, Path(args.output_path) if args.output_path else outs[0], alpha=alpha, items=args.items,
           mixed_scorers=args.mixed_scorers, peak_step=peak_step, primary=primary)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    """``cf-tasks report --compare``: compare.png and compare.csv of several studies."""
    from ..sweep.compare import PLOT, compare

    if not args.output_path:
        raise UsageError("--compare needs --output_path DIR, the folder for compare.png and compare.csv")
    studies, _ = compare(args.outputs, Path(args.output_path), args.mixed_versions)
    print(f"cf-tasks: {len(studies)} studies ({', '.join(label for label, _ in studies)}) drawn in "
          f"{Path(args.output_path) / PLOT}", file=sys.stderr)
    return 0
