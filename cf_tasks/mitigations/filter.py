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
The checks before any work, the model's content id, the one-writer lock and the way the outputs
land together are in ``filter_guard``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import CFTasksError
from ..files import OutputLock, atomic_open, atomic_write, clean_stages, publish, stage_dir, tmp_name
from . import filter_guard as guard

LOSS_VERSION = 2  # bump when a change moves the losses: old scoring logs are then not reused
BY = ("loss", "gap")
FORMATS = ("auto", "alpaca", "messages")
DTYPES = ("auto", "bfloat16", "float16", "float32")
DEFAULT_BATCH_SIZE = 8
REPORT_EXAMPLES = 5
SNIPPET = 240

# The Alpaca prompt (Taori et al., 2023), used for models without a chat template.
ALPACA_WITH = ("Below is an instruction that describes a task, paired with an input that provides further "
               "context. Write a response that appropriately completes the request.\n\n"
               "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_WITHOUT = ("Below is an instruction that describes a task. Write a response that appropriately "
                  "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")

KEPT, DROPPED, SCORES, REPORT, HISTOGRAM = "kept", "dropped", "scores.parquet", "report.md", "gap_histogram.png"
STAGE = "filter-data"  # the temp folder a run's outputs are written to before they land together


class FilterError(CFTasksError):
    """Bad input, printed as one line with exit code 2."""

    exit_code = 2


class FilterRunError(CFTasksError):
    """A failure during the run (the model does not load, the disk fills): one line, exit code 1."""

    exit_code = 1


@dataclass
class Example:
    line: int  # 1-based line (JSONL) or row number
    id: str
    target: str
    has_context: bool
    context: str = ""
    turns_with: list = field(default_factory=list)  # chat turns up to the target
    turns_without: list = field(default_factory=list)
    plain_with: str = ""  # the prompt for a model without a chat template
    plain_without: str = ""


# --------------------------------------------------------------------------- reading


@dataclass
class Source:
    """The input: a JSONL file, or a ``datasets`` folder or Hub id (``kind`` 'jsonl' or 'datasets')."""

    name: str
    kind: str
    path: Path | None = None
    dataset: object = None

    def records(self) -> Iterator[tuple[int, bytes | None, dict]]:
        """(line number, the line's bytes or None, the parsed object) for each example."""
        if self.kind == "datasets":
            for i, row in enumerate(self.dataset):
                yield i + 1, None, row
            return
        with open(self.path, "rb") as fh:
            for number, raw in enumerate(fh, 1):
                text = raw.strip()
                if not text:
                    continue
                try:
                    obj = json.loads(text)
                except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
                    reason = err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8" if isinstance(
                        err, UnicodeDecodeError) else "nested too deeply to read"
                    raise FilterError(f"{self.name} line {number}: not valid JSON ({reason}); fix or remove "
                                      "the line") from None
                if not isinstance(obj, dict):
                    raise FilterError(f"{self.name} line {number}: a JSON {type(obj).__name__}, not an object; "
                                      "each line must be one example object")
                yield number, raw.rstrip(b"\r\n"), obj

    def fingerprint(self) -> str:
        if self.kind == "datasets":
            return str(getattr(self.dataset, "_fingerprint", self.name))
        digest = hashlib.sha256()
        with open(self.path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()


def open_source(data: str, split: str = "train") -> Source:
    """A JSONL file, a folder saved by ``datasets`` (``save_to_disk``), a folder of data files or a
    Hub dataset id (read from the local cache when offline)."""
    path = Path(data)
    if path.is_file():
        if path.stat().st_size == 0:
            raise FilterError(f"{data} is empty; pass a JSONL file with one example per line")
        return Source(data, "jsonl", path=path)
    import datasets

    try:
        if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise FilterError(f"{data} has no split {split!r} (it has {', '.join(loaded)}); pass --split")
                loaded = loaded[split]
        elif path.is_dir() or (not path.exists() and path.suffix not in (".json", ".jsonl")
                               and not data.startswith((".", "/"))):  # a Hub id
            loaded = datasets.load_dataset(data, split=split)
        else:
            raise FilterError(f"{data} does not exist; pass a JSONL file, a datasets folder or a Hub dataset id")
    except FilterError:
        raise
    except Exception as err:  # datasets raises many kinds: one line for all of them
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FilterError(f"cannot load {data} with datasets ({first}); check the path, id or --split") from None
    if len(loaded) == 0:
        raise FilterError(f"{data} is empty; pass a dataset with at least one example")
    return Source(data, "datasets", dataset=loaded)


def detect_format(obj: dict, where: str) -> str:
    if "messages" in obj:
        return "messages"
    if "instruction" in obj and "output" in obj:
        return "alpaca"
    raise FilterError(f"{where}: neither a 'messages' list nor 'instruction' and 'output' fields; pass Alpaca-style "
                      "or chat messages examples")


def _text(value, where: str, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FilterError(f"{where}: field {name!r} is a {type(value).__name__}, not text; fix the example")
    return value


def parse_example(obj: dict, line: int, fmt: str, context_field: str | None, where: str) -> Example:
    """One example of format ``fmt``. ``where`` names it in errors ("data.jsonl line 7")."""
    ident = str(obj["id"]) if obj.get("id") is not None else str(line)
    if fmt == "alpaca":
        field_name = context_field or "input"
        for name in ("instruction", "output"):
            if name not in obj:
                raise FilterError(f"{where}: no {name!r} field; every Alpaca-style example needs instruction and "
                                  "output")
        instruction = _text(obj["instruction"], where, "instruction")
        context = _text(obj.get(field_name), where, field_name)
        target = _text(obj["output"], where, "output")
        user_with = f"{instruction}\n\n{context}" if context.strip() else instruction
        return Example(
            line, ident, target, bool(context.strip()), context,
            turns_with=[{"role": "user", "content": user_with}],
            turns_without=[{"role": "user", "content": instruction}],
            plain_with=ALPACA_WITH.format(instruction=instruction, input=context) if context.strip()
            else ALPACA_WITHOUT.format(instruction=instruction),
            plain_without=ALPACA_WITHOUT.format(instruction=instruction),
        )
    messages = obj.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise FilterError(f"{where}: 'messages' must be a list of {{role, content}} turns")
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    user = max((i for i, m in enumerate(messages[: last or 0]) if m["role"] == "user"), default=None)
    if last is None or user is None:
        raise FilterError(f"{where}: no user turn followed by an assistant turn; the last assistant turn is the target")
    turns = [{"role": m["role"], "content": _text(m.get("content"), where, "content")} for m in messages[:last]]
    target = _text(messages[last].get("content"), where, "content")
    content = turns[user]["content"]
    if context_field:
        context = _text(obj.get(context_field), where, context_field)
        if context.strip() and context not in content:
            raise FilterError(f"{where}: the {context_field!r} text is not in the user turn; the context must be "
                              "quoted in the user turn")
        before, _, after = content.partition(context) if context.strip() else (content, "", "")
        question = "\n\n".join(part for part in (before.strip(), after.strip()) if part)
    else:  # the material before the user turn's last paragraph is the context
        head, sep, tail = content.strip().rpartition("\n\n")
        context, question = (head, tail) if sep and head.strip() and tail.strip() else ("", content)
    without = [dict(t) for t in turns]
    without[user]["content"] = question
    plain = lambda ts: "".join(f"{t['role']}: {t['content']}\n" for t in ts) + "assistant: "  # noqa: E731
    return Example(line, ident, target, bool(context.strip()), context, turns_with=turns, turns_without=without,
                   plain_with=plain(turns), plain_without=plain(without))


def examples(source: Source, fmt: str, context_field: str | None) -> Iterator[tuple[Example, bytes | None]]:
    for line, raw, obj in source.records():
        where = f"{source.name} line {line}" if source.kind == "jsonl" else f"{source.name} row {line}"
        yield parse_example(obj, line, fmt, context_field, where), raw


# --------------------------------------------------------------------------- tokenising and scoring


def render(tokenizer, example: Example, with_context: bool) -> tuple[list[int], int]:
    """Token ids of prompt + target and the prompt's length: the chat template when the tokenizer
    has one, else the Alpaca prompt."""
    if getattr(tokenizer, "chat_template", None):
        turns = example.turns_with if with_context else example.turns_without
        text = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        prompt = tokenizer(example.plain_with if with_context else example.plain_without)["input_ids"]
    target = tokenizer(example.target, add_special_tokens=False)["input_ids"]
    return list(prompt) + list(target), len(prompt)


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


# --------------------------------------------------------------------------- the command


@dataclass
class Scan:
    fmt: str
    total: int = 0
    with_context: int = 0


def scan(source: Source, fmt: str, context_field: str | None, tokenizer, window: int | None) -> Scan:
    """Read the whole input once: its format, bad lines, duplicate ids, missing context, long examples."""
    result = Scan(fmt)
    seen: dict[str, int] = {}
    field_seen = False
    for line, raw, obj in source.records():
        where = f"{source.name} line {line}" if source.kind == "jsonl" else f"{source.name} row {line}"
        if result.fmt == "auto":
            result.fmt = detect_format(obj, where)
        example = parse_example(obj, line, result.fmt, context_field, where)
        if example.id in seen:
            raise FilterError(f"{where}: id {example.id!r} is also on {seen[example.id]}; ids must be unique")
        seen[example.id] = line
        field_seen = field_seen or (context_field or "input") in obj or result.fmt == "messages" and not context_field
        result.total += 1
        if not example.has_context:
            continue
        if not example.target.strip():
            raise FilterError(f"{where}: the target (output) is empty; a target loss needs at least one token")
        result.with_context += 1
        if window:
            ids, _ = render(tokenizer, example, True)
            if len(ids) > window:
                raise FilterError(f"{where}: the example is {len(ids)} tokens with its context, longer than the "
                                  f"model's window of {window}; shorten or remove it")
    if result.total == 0:
        raise FilterError(f"{source.name} has no examples (only blank lines); pass a file with one example per line")
    if not field_seen:
        name = context_field or "input"
        raise FilterError(f"{source.name}: no example has a {name!r} field; name the context field with "
                          "--context_field")
    if result.with_context == 0:
        how = (f"a non-empty {context_field or 'input'!r} field" if result.fmt == "alpaca" or context_field else
               "material before the last paragraph of the user turn")
        raise FilterError(f"{source.name}: no example carries a context ({how}); name the context field with "
                          "--context_field")
    return result


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
