"""Scoring the examples of ``cf-tasks filter-data`` and choosing which to drop: each context-bearing
example's mean target cross-entropy with and without its context, in padded batches on the loaded
model; the scoring log those losses are appended to, one batch a line, and read back by a rerun;
and the share of examples dropped by ``--by loss`` (the paper's rule) or ``--by gap``. A model that
does not load is a ``FilterRunError``: one line, exit 1."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..errors import CFTasksError
from .filter_input import Example, FilterError, examples, render

LOSS_VERSION = 2  # bump when a change moves the losses: old scoring logs are then not reused


class FilterRunError(CFTasksError):
    """A failure during the run (the model does not load, the disk fills): one line, exit code 1."""

    exit_code = 1


def score_batch(model, sequences: list[tuple[list[int], int]], pad_id: int) -> list[float]:
    """The mean token cross-entropy of each sequence's tokens after its prompt, in one forward pass.

    Right padding, so each real token has the position and attention of a single-example pass. Only
    the positions that predict a target token are projected onto the vocabulary (``logits_to_keep``,
    where the model takes it): the logits of the prompt positions are never made."""
    import torch

    device = next(model.parameters()).device
    width = max(len(ids) for ids, _ in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    rows, cols, targets = [], [], []
    for row, (ids, prompt_len) in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        for k in range(prompt_len - 1, len(ids) - 1):  # position k predicts token k + 1
            rows.append(row)
            cols.append(k)
            targets.append(ids[k + 1])
    kwargs = {}
    if _takes_logits_to_keep(model):
        kept = sorted(set(cols))
        kwargs["logits_to_keep"] = torch.tensor(kept, device=device)
        column = {k: j for j, k in enumerate(kept)}
        cols = [column[k] for k in cols]
    with torch.no_grad():
        logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs).logits
    rows_t = torch.tensor(rows, device=device)
    picked = logits[rows_t, torch.tensor(cols, device=device)].float()
    losses = torch.nn.functional.cross_entropy(picked, torch.tensor(targets, device=device), reduction="none")
    sums = torch.zeros(len(sequences), device=device).index_add_(0, rows_t, losses)
    counts = torch.zeros(len(sequences), device=device).index_add_(0, rows_t, torch.ones_like(losses))
    return (sums / counts).tolist()


def _takes_logits_to_keep(model) -> bool:
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


def read_log(path: Path, identity: dict) -> tuple[dict[str, tuple[float, float]], int]:
    """The scores of a scoring log and its number of complete batches; a torn last line is ignored."""
    scores: dict[str, tuple[float, float]] = {}
    batches = 0
    if not path.is_file():
        return scores, batches
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    for number, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError:
            break  # a line torn by a kill: its batch is scored again
        if number == 0:
            if entry.get("identity") != identity:
                raise FilterError(f"{path} was written with other settings; delete it or choose another --output_path")
            continue
        for ident, with_loss, without_loss in entry["rows"]:
            scores[ident] = (with_loss, without_loss)
        batches += 1
    return scores, batches


def select(rows: list[tuple[str, int, float, float]], drop: float, by: str) -> set[str]:
    """The ids to drop: the ``drop`` share of scored examples with the lowest loss without the context
    (``by='loss'``, the paper's rule) or the lowest gap; ties go by id, then line."""
    count = math.floor(drop * len(rows) + 0.5)
    key = (lambda r: (r[3], r[0], r[1])) if by == "loss" else (lambda r: (r[3] - r[2], r[0], r[1]))
    return {r[0] for r in sorted(rows, key=key)[:count]}


def resolve_dtype(name: str, device: str):
    import torch

    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, name)


def load_tokenizer(model: str):
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FilterError(f"cannot load model {model} ({first}); pass a transformers model folder or Hub id") from None
    window = next((getattr(config, n) for n in ("max_position_embeddings", "n_positions", "max_sequence_length")
                   if isinstance(getattr(config, n, None), int)), None)
    return tokenizer, window


def score_all(source, info, args, model_name, tokenizer, device, log, scores, batches, tqdm) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    if args.quiet:
        hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_name, dtype=resolve_dtype(args.dtype, device))
        model.to(device).eval()
    except Exception as err:  # transformers and torch raise many types for a model that cannot load
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise FilterRunError(f"--model {model_name}: the model does not load on {device} ({type(err).__name__}: "
                             f"{reason}); check that it loads with transformers, or pass another --device") from None
    pad_id = next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None)
    bar = tqdm(total=info.with_context, initial=len(scores), desc="scoring", unit="example", disable=args.quiet)
    pending: list[Example] = []

    def flush(batch_no: int) -> None:
        sequences = []
        for example in pending:
            sequences += [render(tokenizer, example, True), render(tokenizer, example, False)]
        losses = score_batch(model, sequences, pad_id)
        rows = [[e.id, losses[2 * i], losses[2 * i + 1]] for i, e in enumerate(pending)]
        try:
            with open(log, "ab") as fh:  # one line a batch: a kill tears at most this line
                fh.write((json.dumps({"batch": batch_no, "rows": rows}) + "\n").encode())
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as err:  # a full disk: the one-line error names the log's folder
            if err.filename is None:
                err.filename = str(log)
            raise
        for ident, with_loss, without_loss in rows:
            scores[ident] = (with_loss, without_loss)
        bar.update(len(pending))
        pending.clear()

    batch_no = batches
    for example, _ in examples(source, info.fmt, args.context_field):
        if not example.has_context or example.id in scores:
            continue
        pending.append(example)
        if len(pending) == args.batch_size:
            flush(batch_no)
            batch_no += 1
    if pending:
        flush(batch_no)
    bar.close()
