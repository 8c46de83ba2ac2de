"""The input of ``cf-tasks filter-data``: a JSONL file, a ``datasets`` folder or a Hub dataset id,
read as a stream; each example parsed (Alpaca-style or chat ``messages``) into its target and its
prompt with and without the context, rendered into token ids (the chat template, else the Alpaca
prompt), and the whole input checked once by ``scan`` before any model loads (format, bad lines,
duplicate ids, missing context, examples longer than the model's window). Bad input is a
``FilterError``: one line, exit 2."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import CFTasksError

# The Alpaca prompt (Taori et al., 2023), used for models without a chat template.
ALPACA_WITH = ("Below is an instruction that describes a task, paired with an input that provides further "
               "context. Write a response that appropriately completes the request.\n\n"
               "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_WITHOUT = ("Below is an instruction that describes a task. Write a response that appropriately "
                  "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


class FilterError(CFTasksError):
    """Bad input, printed as one line with exit code 2."""

    exit_code = 2


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
