"""``cf-tasks filter-data``: drop the instruction examples that do not need their context (the paper's
section 4.3). The work, and its checks, are in ``cf_tasks.mitigations.filter`` (the run),
``filter_input`` (the input) and ``filter_scoring`` (the losses): ``FilterError`` (exit 2) for bad
input, ``FilterRunError`` (exit 1) for a failure during the run."""

from __future__ import annotations

import argparse

from ..files import ascii_float, ascii_int


def add_parser(sub) -> None:
    from ..mitigations.filter import BY, DEFAULT_BATCH_SIZE, DTYPES, FORMATS

    p = sub.add_parser(
        "filter-data", help="drop the instruction examples that do not need their context (the paper's section 4.3)",
        description="Score each context-bearing example's target loss with and without its context, drop the "
                    "--drop share the model predicts best without it, and write kept/dropped examples, "
                    "scores.parquet and a report to --output_path.")
    p.add_argument("data", help="Alpaca-style JSONL (instruction, input, output), chat 'messages' JSONL, a datasets "
                                "folder or a Hub dataset id")
    p.add_argument("--model", default=None, help="transformers model folder or Hub id (default: the embedded SmolLM2)")
    p.add_argument("--output_path", required=True, help="output folder (resumable: a rerun continues the scoring)")
    p.add_argument("--drop", type=ascii_float, default=0.25, help="share of the context-bearing examples to drop "
                                                             "(default 0.25, as the paper)")
    p.add_argument("--by", choices=BY, default="loss",
                   help="loss: drop the lowest target loss without the context (the paper's rule, default); "
                        "gap: drop the lowest loss-without minus loss-with (the context helps least)")
    p.add_argument("--format", choices=FORMATS, default="auto", help="input format (default: from the first example)")
    p.add_argument("--context_field", default=None,
                   help="the context's field: for Alpaca-style data its name (default 'input'); for chat messages "
                        "a field holding the context text quoted in the user turn (default: the user turn's "
                        "material before its last blank-line-separated paragraph is the context)")
    p.add_argument("--context_only", action="store_true",
                   help="drop the examples without a context too (the paper's context-only Alpaca)")
    p.add_argument("--split", default="train", help="split of a datasets folder or Hub id (default train)")
    p.add_argument("--batch_size", type=ascii_int, default=DEFAULT_BATCH_SIZE,
                   help=f"examples per forward pass, each scored with and without its context (default "
                        f"{DEFAULT_BATCH_SIZE})")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="model dtype (default: bfloat16 on cuda, else float32)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..mitigations.filter import run as filter_data

    return filter_data(args)
