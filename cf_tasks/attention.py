"""Attention on the context (``--attention``; the paper's Figure 3(c)): how much of its attention the
model gives the context passage when it starts to answer.

For each item of a knowledge-conflict generation task, one forward pass over the exact prompt string
lm-eval built (taken from its logged sample, so the chat template is applied exactly where and as
lm-eval applied it) with ``output_attentions=True``. The position that predicts the first answer
token is the last prompt token; its attention weights on the tokens of the doc's ``context``
(located with the tokenizer's character offsets) are summed per head, averaged over heads, kept per
layer, and averaged over layers: the item's ``context_attention``, a mass in [0, 1].

The probe runs after lm-eval has generated the answers, one unpadded prompt per pass, with the
model switched to eager attention for that pass only (sdpa and flash attention return no weights)
and switched back afterwards, so generation is untouched. Each layer's weights are reduced to one
number as soon as the pass returns; no attention tensor outlives it. transformers backends only:
vLLM does not expose attention weights.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from .errors import CFTasksError
from .registry import KC_TASKS
from .results import group_members

ATTENTION_VERSION = 1  # bump when the probe's definition changes: it is part of the sweep's settings
METRIC = "context_attention"
HF_MODELS = ("hf", "hf-auto", "huggingface")  # lm-eval's names of its transformers model (HFLM)
UNAVAILABLE = ("--attention is unavailable with {where}: it needs the attention weights of a transformers model; "
               "use {fix}")


class AttentionError(CFTasksError):
    """The probe cannot run on this model (one line, exit 2)."""

    exit_code = 2


def measured(task: str) -> bool:
    """Whether ``context_attention`` is measured on lm-eval task ``task``: the knowledge-conflict
    generation tasks (default prompt and its _alpaca, _tulu, _adhere variants), and their
    ``_known`` forms, whose samples carry the same prompt."""
    return task in KC_TASKS or (task.endswith("_known") and task[: -len("_known")] in KC_TASKS)


def setting(task_names) -> dict | None:
    """The sweep setting that ``--attention`` adds to a task whose (sub)tasks include a measured
    one; None for the others, whose results are the same with and without it."""
    if any(measured(t) for t in task_names):
        return {"metric": METRIC, "version": ATTENTION_VERSION}
    return None


def context_span(prompt: str, context: str) -> tuple[int, int] | None:
    """The character span of the context passage in the prompt (its first occurrence)."""
    if not context:
        return None
    start = prompt.find(context)
    return None if start < 0 else (start, start + len(context))


def encode(lm: Any, prompt: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The prompt's token ids as lm-eval's HFLM encodes it for generation (``tok_batch_encode``:
    no BOS when the string starts with one, else the model's ``add_bos_token``), with each token's
    character offsets."""
    from lm_eval.models.utils import has_bos_prefix

    tok = lm.tokenizer
    if not getattr(tok, "is_fast", False):
        raise AttentionError(f"--attention needs a fast tokenizer (character offsets); {type(tok).__name__} has none: "
                             "save the model with its tokenizer.json")
    kwargs = {}
    if has_bos_prefix(prompt, getattr(tok, "bos_token", None)):
        kwargs = {"add_special_tokens": False}
    elif getattr(lm, "add_bos_token", None) is not None:
        kwargs = {"add_special_tokens": lm.add_bos_token}
    enc = tok(prompt, return_offsets_mapping=True, **kwargs)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def span_mask(offsets: list[tuple[int, int]], span: tuple[int, int]) -> list[bool]:
    """Which tokens overlap the character span (special tokens, with empty offsets, never do)."""
    start, end = span
    return [a < b and a < end and b > start for a, b in offsets]


@contextlib.contextmanager
def eager_attention(model):
    """The model with eager attention for the probe's pass, its own implementation restored after."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model's transformers model
    old = getattr(base.config, "_attn_implementation", None)
    switch = old != "eager"
    if switch:
        base.set_attn_implementation("eager")
        if base.config._attn_implementation != "eager":
            raise AttentionError(f"{type(base).__name__} cannot switch to eager attention for the probe; load it with "
                                 "attn_implementation=eager in --model_args")
    try:
        yield model
    finally:
        if switch and old is not None:
            base.set_attn_implementation(old)


def probe(model, ids: list[int], mask: list[bool], device) -> list[float]:
    """One forward pass; per layer, the attention mass of the last position on the masked tokens,
    summed over those tokens and averaged over heads."""
    import inspect

    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(base.forward).parameters else {}
    keys = torch.tensor(mask, dtype=torch.bool, device=device)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids], device=device), output_attentions=True, use_cache=False,
                    return_dict=True, **kwargs)
        layers = out.attentions
        if not layers or any(a is None for a in layers):
            raise AttentionError(f"{type(base).__name__} returned no attention weights under eager attention")
        masses = [float(a[0, :, -1, :][:, keys.to(a.device)].float().sum(-1).mean()) for a in layers]
    del out, layers
    return masses


def _prompt_of(sample: dict) -> tuple[str, dict] | None:
    """The generation prompt (and its generation kwargs) of a logged sample that holds the doc's
    context: a ``_known`` sample also carries its closed-book prompt, which does not."""
    context = (sample.get("doc") or {}).get("context")
    for args in sample.get("arguments") or []:
        if isinstance(args, (list, tuple)) and args and isinstance(args[0], str) and context and context in args[0]:
            return args[0], (args[1] if len(args) > 1 and isinstance(args[1], dict) else {})
    return None


def _truncated(lm, ids, offsets, gen_kwargs):
    """lm-eval's left truncation of a long prompt (``max_length - max_gen_toks`` tokens)."""
    keep = lm.max_length - int(gen_kwargs.get("max_gen_toks", lm.max_gen_toks))
    if keep > 0 and len(ids) > keep:
        return ids[-keep:], offsets[-keep:]
    return ids, offsets


def item_attention(lm, model, prompt: str, context: str, gen_kwargs: dict | None = None) -> list[float] | None:
    """Per-layer context attention of one prompt (``model``: ``lm.model`` under ``eager_attention``),
    or None when the context is not in the prompt (or was truncated away)."""
    span = context_span(prompt, context)
    if span is None:
        return None
    ids, offsets = encode(lm, prompt)
    ids, offsets = _truncated(lm, ids, offsets, gen_kwargs or {})
    mask = span_mask(offsets, span)
    if not any(mask):
        return None
    return probe(model, ids, mask, lm.device)


def _stderr(values: list[float]) -> float | None:
    from lm_eval.api.metrics import mean_stderr

    return mean_stderr(values) if len(values) > 1 else None


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def add_context_attention(lm, results: dict) -> dict:
    """Measure every measured task's items in ``results`` (lm-eval's dict, with samples) and add:
    the metric ``context_attention`` (mean over items, with stderr) to ``results["results"]``, per
    task and per group holding such tasks (over all their items); per layer means and counts under
    ``results["attention"][task]``; and each item's value and per layer values to its samples
    (``context_attention``, ``context_attention_per_layer``). Returns ``results``."""
    if getattr(lm, "backend", "causal") != "causal":
        raise AttentionError("--attention needs a decoder-only (causal) model; this one is "
                             f"{getattr(lm, 'backend', '?')}")
    from tqdm import tqdm

    per_task: dict[str, list[float]] = {}
    todo = {t: s for t, s in (results.get("samples") or {}).items() if measured(t)}
    items = sum(len({s.get("doc_id") for s in samples}) for samples in todo.values())
    with eager_attention(lm.model) if todo else contextlib.nullcontext() as model, \
            tqdm(total=items, desc="attention on the context", unit="item", disable=not items) as bar:
        for task, samples in todo.items():
            per_task[task] = _measure_task(lm, model, task, samples, results, bar)
    for group in results.get("group_subtasks") or {}:
        values = [v for t in group_members(results, group) for v in per_task.get(t, [])]
        if values and group in results.get("results", {}):
            results["results"][group].update(
                {f"{METRIC},none": _mean(values), f"{METRIC}_stderr,none": _stderr(values) or "N/A"})
    return results


def _measure_task(lm, model, task: str, samples: list[dict], results: dict, bar=None) -> list[float]:
    """One task's items: values into its samples, its metric and per layer means into ``results``;
    returns the item values."""
    done: dict[Any, list[float] | None] = {}
    for sample in samples:
        key = sample.get("doc_id")
        if key not in done:
            found = _prompt_of(sample)
            done[key] = item_attention(lm, model, found[0], sample["doc"]["context"], found[1]) if found else None
            if bar is not None:
                bar.update(1)
        layers = done[key]
        if layers is not None:
            sample[METRIC] = _mean(layers)
            sample[f"{METRIC}_per_layer"] = layers
    items = [v for v in done.values() if v is not None]
    if not items:
        return []
    values = [_mean(v) for v in items]
    results.setdefault("results", {}).setdefault(task, {}).update(
        {f"{METRIC},none": _mean(values), f"{METRIC}_stderr,none": _stderr(values) or "N/A"})
    results.setdefault("attention", {})[task] = {
        "metric": METRIC, "version": ATTENTION_VERSION, "n": len(items), "skipped": len(done) - len(items),
        "layers": len(items[0]), "per_layer": [_mean([v[i] for v in items]) for i in range(len(items[0]))]}
    return values
