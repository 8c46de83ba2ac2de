"""Context-critical filtering of instruction data: ``cf-tasks filter-data``.

Goyal et al., "Context-Parametric Inversion: Why Instruction Finetuning May Not Actually Improve
Context Reliance" (ICLR 2025), section 4.3: among the instruction examples that carry an input
context, those whose target the model already predicts without the context are not
context-critical; fine-tuning on them is what drives context reliance down. The paper removed the
25% of context-bearing Alpaca examples with the lowest target loss *without* the context and saw
no drop in context reliance. ``--by loss`` is that rule; ``--by gap`` drops instead the examples
whose context lowers the target loss least (loss without minus loss with).

For every context-bearing example the target's mean token cross-entropy is computed twice, with
and without the context, in one padded batch (right padding: the real tokens' positions and
attention are those of a single-example pass). The scores are appended, one batch a line, to a
scoring log in the output folder named by a hash of everything that moves a score (model, data,
format, dtype, device, batch size); a rerun continues it, and other settings get another log.
Examples without a context pass through (``--context_only`` drops them). Each pass over the input
(scan, score, select, write) reads it as a stream, so only the ids and scores are held in memory.
This module is the command's run: its checks, the scoring log's identity, the outputs and the
report. The input (reading, parsing, the scan) is in ``filter_input``, the losses, the scoring log
and the choice of the examples to drop in ``filter_scoring``; the checks before any work, the
model's content id, the one-writer lock and the way the outputs land together are in ``filter_guard``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
from pathlib import Path

from ..files import OutputLock, atomic_open, atomic_write, clean_stages, publish, stage_dir, tmp_name
from . import filter_guard as guard
from .filter_input import FilterError, examples, open_source, scan
from .filter_scoring import LOSS_VERSION, load_tokenizer, read_log, score_all, select

BY = ("loss", "gap")
FORMATS = ("auto", "alpaca", "messages")
DTYPES = ("auto", "bfloat16", "float16", "float32")
DEFAULT_BATCH_SIZE = 8
REPORT_EXAMPLES = 5
SNIPPET = 240

KEPT, DROPPED, SCORES, REPORT, HISTOGRAM = "kept", "dropped", "scores.parquet", "report.md", "gap_histogram.png"
STAGE = "filter-data"  # the temp folder a run's outputs are written to before they land together


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.drop < 1:
        raise FilterError(f"--drop {args.drop} is not a share in [0, 1); pass e.g. --drop 0.25")
    if args.batch_size < 1:
        raise FilterError(f"--batch_size {args.batch_size} must be at least 1")
    out = Path(args.output_path)
    names = guard.output_names(KEPT, DROPPED, (SCORES, REPORT, HISTOGRAM))
    try:
        guard.check_input_not_output(args.data, out, names)
        guard.check_output_outside_model(args.model, out)
        guard.check_device(args.device)
        if args.model is not None:
            guard.check_model_folder(args.model)
    except guard.GuardError as err:
        raise FilterError(str(err)) from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / ".cf-tasks-write-test", b"")
        (out / ".cf-tasks-write-test").unlink()
    except OSError as err:
        raise FilterError(f"cannot write to output folder {out}: {err.strerror or type(err).__name__}; choose a "
                          "writable --output_path") from None
    with OutputLock(out, "filter-data"):
        clean_stages(out, STAGE)
        return _run_locked(args, out, names)


def _run_locked(args: argparse.Namespace, out: Path, names: set[str]) -> int:
    from tqdm import tqdm

    model_name = args.model
    if model_name is None:
        from ..default_model import DefaultModelError, default_model_path

        try:
            model_name = str(default_model_path())
        except DefaultModelError as err:
            raise FilterError(str(err)) from None
    source = open_source(args.data, args.split)
    tokenizer, window = load_tokenizer(model_name)
    info = scan(source, args.format, args.context_field, tokenizer, window)
    device = args.device or ("cuda" if _cuda() else "cpu")
    identity = {
        "scorer_version": LOSS_VERSION, "model": model_name, "model_files": guard.model_content_id(model_name),
        "data": source.fingerprint(), "format": info.fmt, "context_field": args.context_field,
        "template": "chat" if getattr(tokenizer, "chat_template", None) else "alpaca",
        "dtype": args.dtype, "device": device.split(":")[0], "batch_size": args.batch_size,
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    log = out / f"scoring-{key}.jsonl"
    scores, batches = read_log(log, identity)
    if not log.is_file() or batches == 0 and not scores:
        atomic_write(log, (json.dumps({"identity": identity}, sort_keys=True) + "\n").encode())
    elif log.read_bytes()[-1:] != b"\n":  # cut a torn last line before appending
        data = log.read_bytes()
        atomic_write(log, data[: data.rfind(b"\n") + 1])
    if len(scores) < info.with_context:
        score_all(source, info, args, model_name, tokenizer, device, log, scores, batches, tqdm)
    rows = []
    for example, _ in examples(source, info.fmt, args.context_field):
        if example.has_context:
            with_loss, without_loss = scores[example.id]
            rows.append((example.id, example.line, with_loss, without_loss))
    dropped = select(rows, args.drop, args.by)
    stage = stage_dir(out, STAGE)
    try:
        write_outputs(source, info, args, rows, dropped, stage, model_name)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    record = {"settings": {"drop": args.drop, "by": args.by, "context_only": args.context_only,
                           "split": args.split, "data": args.data}, "identity": identity, "scoring_log": log.name}
    publish(stage, out, guard.RECORD, record, names - {guard.LOCK})
    if not args.quiet:
        no_context = info.total - info.with_context
        also = f" and the {no_context} without a context" if args.context_only else ""
        kept = info.total - len(dropped) - (no_context if args.context_only else 0)
        print(f"{info.with_context} of {info.total} examples carry a context; dropped {len(dropped)} of them by "
              f"{args.by}{also}; kept {kept} -> {out}")
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def write_outputs(source, info, args, rows, dropped: set[str], out: Path, model_name: str) -> None:
    import pandas as pd

    frame = pd.DataFrame(
        [(i, line, w, wo, wo - w, i not in dropped) for i, line, w, wo in rows],
        columns=["id", "line", "loss_with", "loss_without", "gap", "kept"],
    )
    atomic_write(out / SCORES, frame.to_parquet(index=False))
    reasons: dict[str, str] = {}
    if source.kind == "jsonl":
        with atomic_open(out / f"{KEPT}.jsonl") as kept_fh, atomic_open(out / f"{DROPPED}.jsonl") as dropped_fh:
            for example, raw in examples(source, info.fmt, args.context_field):
                gone = example.id in dropped or (args.context_only and not example.has_context)
                (dropped_fh if gone else kept_fh).write(raw + b"\n")
    else:
        keep_rows, drop_rows = [], []
        for number, (example, _) in enumerate(examples(source, info.fmt, args.context_field)):
            gone = example.id in dropped or (args.context_only and not example.has_context)
            (drop_rows if gone else keep_rows).append(number)
        for name, indices in ((KEPT, keep_rows), (DROPPED, drop_rows)):
            _save_dataset(source.dataset.select(indices), out / name)
    write_report(frame, info, args, dropped, out, model_name, source, reasons)


def _save_dataset(dataset, folder: Path) -> None:
    tmp = folder.with_name(tmp_name(folder.name))
    try:
        dataset.save_to_disk(str(tmp))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET else text[: SNIPPET - 1] + "…"


def write_report(frame, info, args, dropped, out, model_name, source, reasons) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    gaps_kept, gaps_dropped = frame.loc[frame.kept, "gap"], frame.loc[~frame.kept, "gap"]
    bins = 40 if len(frame) > 1 else 1
    ax.hist([gaps_kept, gaps_dropped], bins=bins, stacked=True, label=["kept", "dropped"],
            color=["#4c72b0", "#dd8452"])
    ax.set_xlabel("gap: loss without context - loss with context (nats/token)")
    ax.set_ylabel("examples")
    ax.set_title(f"context-bearing examples, dropped by {args.by}")
    ax.legend(loc="upper right")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100, metadata={"Software": None})  # no version stamp: same bytes each run
    plt.close(fig)
    atomic_write(out / HISTOGRAM, png.getvalue())

    order = frame[~frame.kept].copy()
    order["score"] = order.loss_without if args.by == "loss" else order.gap
    order = order.sort_values(["score", "id", "line"]).head(REPORT_EXAMPLES)
    threshold = (frame[~frame.kept].loss_without.max() if args.by == "loss" else frame[~frame.kept].gap.max()) \
        if (~frame.kept).any() else None
    texts = {}
    wanted = set(order.id)
    for example, _ in examples(source, info.fmt, args.context_field):
        if example.id in wanted:
            texts[example.id] = example
    rule = ("the lowest target loss without the context (the paper's rule, section 4.3)" if args.by == "loss"
            else "the lowest gap (loss without the context minus loss with it: the context helps least)")
    no_ctx = info.total - info.with_context
    lines = [
        "# filter-data report", "",
        f"- data: `{args.data}` ({info.fmt} format), model: `{model_name}`",
        f"- {info.total} examples: {info.with_context} with a context, {no_ctx} without "
        f"({'dropped: --context_only' if args.context_only else 'passed through unchanged'})",
        f"- dropped {len(dropped)} of the {info.with_context} context-bearing examples ({args.drop:.0%} asked) "
        f"with {rule}",
    ]
    if threshold is not None:
        lines.append(f"- threshold: {'loss without context' if args.by == 'loss' else 'gap'} <= {threshold:.4f} "
                     "nats/token (ties broken by id)")
    lines += [
        f"- mean loss with context {frame.loss_with.mean():.4f}, without {frame.loss_without.mean():.4f}; "
        f"mean gap kept {frame.loc[frame.kept, 'gap'].mean():.4f}, dropped "
        f"{frame.loc[~frame.kept, 'gap'].mean() if (~frame.kept).any() else float('nan'):.4f}",
        "", f"![gap histogram]({HISTOGRAM})", "", f"## The {len(order)} surest drops", "",
    ]
    for row in order.itertuples():
        example = texts[row.id]
        why = (f"the model predicts the target without the context at {row.loss_without:.3f} nats/token "
               f"(with it: {row.loss_with:.3f})" if args.by == "loss" else
               f"the context lowers the target loss by only {row.gap:.3f} nats/token "
               f"({row.loss_without:.3f} without, {row.loss_with:.3f} with)")
        question = example.turns_without[-1]["content"] if example.turns_without else ""
        lines += [f"### id {row.id} (line {row.line})", "", f"- why: {why}",
                  f"- question: {_snippet(question)}", f"- context: {_snippet(example.context)}",
                  f"- target: {_snippet(example.target)}", ""]
    atomic_write(out / REPORT, "\n".join(lines).encode())
