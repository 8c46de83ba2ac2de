"""Greedy generation that drops the rows whose answer is already fixed (transformers backend).

lm-eval generates a batch until every row has met a stop sequence (or the token limit); a row that
finished early keeps being computed for the others. In a grouped batch of several LoRA adapters
(4 x 8 rows) the longest of 32 answers sets the length of all of them. Here the batch is generated
with transformers' public ``generate`` in segments that share one KV cache: a segment ends once a
few rows are fixed, those rows leave the batch (``Cache.batch_select_indices``), and the rest go on
from the cache, as in transformers' "continue generation from a cache" pattern.

``generate_batches`` goes one step further for a LoRA group: several lm-eval batches, each
prefilled per adapter on its own, are decoded together from left-padded caches, so that one
decoding step (bound by reading the weights) serves all of them.

A row is fixed when what lm-eval makes of it cannot change any more: it produced an end-of-sequence
id (``generate`` pads it from there, as in one call), or its text, decoded as lm-eval decodes it,
holds one of the stop sequences (lm-eval cuts the text there). Each kept row goes on with the same
prompt, padding, positions and greedy choices as in one uninterrupted call, so the answers lm-eval
reads are the same (tests compare them with ``generate`` in one call and with separate lm-eval runs).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

# Generation arguments the segments handle as one call would; anything else (a minimum length,
# a token budget counted from each call's input, sampling) goes through lm-eval's own single call.
SEGMENTABLE_KWARGS = frozenset({"attention_mask", "do_sample", "temperature", "top_p", "top_k", "adapter_names"})


def can_segment(model, generation_kwargs: dict) -> bool:
    """Whether ``generate_dropping_finished`` gives what one ``generate`` call gives."""
    if generation_kwargs.get("do_sample") or set(generation_kwargs) - SEGMENTABLE_KWARGS:
        return False
    config = getattr(model, "generation_config", None)
    if config is None or getattr(config, "do_sample", False):
        return False
    # Budgets counted from each call's own input would restart with every segment.
    if getattr(config, "max_new_tokens", None) or getattr(config, "min_new_tokens", None) \
            or (getattr(config, "min_length", 0) or 0) > 0:
        return False
    return _cache_argument(model) is not None


def _cache_argument(model) -> str | None:
    """The name ``generate`` takes a cache under: ``cache`` from transformers 5.2x on, before
    that ``past_key_values``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        params = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return None
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def _eos_ids(model) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


class _Fixed:
    """Per-row state: a row is fixed once it produced an end-of-sequence id or its decoded text
    holds a stop sequence. As a stopping criterion it ends the segment (all rows at once, so that
    ``generate`` pads no row) when ``drop_at`` rows are fixed or every row is."""

    def __init__(self, start: int, decode: Callable[[list[int]], str], stop: Sequence[str], eos: set[int],
                 drop_at: int):
        self.start, self.decode, self.eos, self.drop_at = start, decode, eos, drop_at
        self.stop = [s for s in stop if s]
        self.flags: list[bool] = []

    def row_fixed(self, tokens: list[int]) -> bool:
        if self.eos.intersection(tokens):
            return True
        text = self.decode(tokens)
        return any(s in text for s in self.stop)

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        rows = input_ids[:, self.start:].tolist()
        self.flags = [self.row_fixed(r) for r in rows]
        n = sum(self.flags)
        end = n >= self.drop_at or n == len(rows)
        return torch.full((input_ids.shape[0],), end, dtype=torch.bool, device=input_ids.device)


def generate_dropping_finished(model, context, max_length: int, stop: Sequence[str], decode: Callable[[list[int]], str],
                               pad_token_id: int, adapter_names: list[str] | None = None, stats: dict | None = None,
                               cache=None, start: int | None = None, **generation_kwargs):
    """Greedy ``model.generate(input_ids=context, max_length=max_length, ...)`` for lm-eval, with
    fixed rows leaving the batch. Returns the rows as one call would (context, then the generated
    tokens, padded with ``pad_token_id`` on the right); a row's tokens after it was fixed may be
    fewer, which lm-eval's cut at the stop sequence does not see.

    ``cache`` and ``start``: ``context`` already ends with generated tokens from ``start`` on, and
    ``cache`` holds every position but the last (see ``generate_batches``)."""
    import torch
    from transformers import DynamicCache, StoppingCriteriaList

    cache_arg = _cache_argument(model)
    batch = context.shape[0]
    width = context.shape[1] if start is None else start
    mask = generation_kwargs.pop("attention_mask", None)
    if mask is None:
        mask = torch.ones_like(context)
    if cache is None:
        cache = DynamicCache(config=getattr(model, "config", None))
    eos = _eos_ids(model)
    rows = list(range(batch))  # original index of each row still in the batch
    generated: list[list[int] | None] = [None] * batch
    seqs = context
    segments = 0
    if context.shape[1] > width:  # rows already fixed by their first tokens never go on
        first = _Fixed(width, decode, stop, eos, drop_at=1)
        first(context, None)
        seqs, mask, rows = _drop(context, mask, cache, rows, first.flags, width, generated)
    while rows and seqs.shape[1] < max_length:
        criterion = _Fixed(width, decode, stop, eos, drop_at=max(1, len(rows) // 8))
        extra = dict(generation_kwargs)
        if adapter_names is not None:
            extra["adapter_names"] = [adapter_names[i] for i in rows]
        out = model.generate(input_ids=seqs, attention_mask=mask, max_length=max_length,
                             stopping_criteria=StoppingCriteriaList([criterion]), pad_token_id=pad_token_id,
                             use_cache=True, **{cache_arg: cache}, **extra)
        segments += 1
        flags = criterion.flags
        if len(flags) != len(rows) or out.shape[1] >= max_length or all(flags) or not any(flags):
            seqs = out
            break
        seqs, mask, rows = _drop(out, mask, cache, rows, flags, width, generated)
    for i, row in enumerate(rows):
        generated[row] = seqs[i, width:].tolist()
    if stats is not None:
        stats["segments"] = stats.get("segments", 0) + segments
    longest = max(len(g) for g in generated)
    result = torch.full((batch, width + longest), pad_token_id, dtype=context.dtype, device=context.device)
    result[:, :width] = context[:, :width]
    for i, g in enumerate(generated):
        if g:
            result[i, width:width + len(g)] = torch.tensor(g, dtype=context.dtype, device=context.device)
    return result


def _drop(out, mask, cache, rows, flags, width, generated):
    """Keep the rows not fixed: their sequences, masks (grown to ``out``'s width) and cache rows;
    the fixed rows' tokens go into ``generated``."""
    import torch

    keep = [i for i, f in enumerate(flags) if not f]
    for i, f in enumerate(flags):
        if f:
            generated[rows[i]] = out[i, width:].tolist()
    index = torch.tensor(keep, dtype=torch.long, device=out.device)
    if keep:
        cache.batch_select_indices(index)
    grown = torch.ones((mask.shape[0], out.shape[1] - mask.shape[1]), dtype=mask.dtype, device=mask.device)
    mask = torch.cat([mask, grown], dim=1).index_select(0, index)
    return out.index_select(0, index), mask, [rows[i] for i in keep]


def can_merge(model) -> bool:
    """Whether prompts of different lengths can share a decode: every layer of the model's cache
    is a plain full-attention one (a sliding window or a recurrent state cannot be left-padded)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def generate_batches(model, batches: list[dict], names: list[str], decode: Callable[[list[int]], str],
                     pad_token_id: int, stats: dict | None = None) -> list[list]:
    """Several lm-eval batches (each ``{"context", "attention_mask", "max_length", "stop",
    "kwargs"}`` with the same stop sequences, decoding settings and new-token budget), each for
    every adapter in ``names``: returns, per batch, one output per adapter, as
    ``model.generate`` gives for that batch alone with that adapter.

    Each (batch, adapter) is prefilled on its own, exactly as lm-eval's call for that batch
    computes it, and picks its first token. The caches are then left-padded to the longest prompt
    (padding that the attention mask hides) and decoded together, rows leaving as they are
    fixed: decoding a small model is bound by reading the weights once per step, so one step for
    all rows costs little more than one for a single batch."""
    import torch
    import torch.nn.functional as F
    from transformers import DynamicCache

    cache_arg = _cache_argument(model)
    budget = batches[0]["max_length"] - batches[0]["context"].shape[1]
    parts = []  # (batch index, adapter, context, mask, first token, cache)
    for b, spec in enumerate(batches):
        context, mask = spec["context"], spec["attention_mask"]
        if mask is None:
            mask = torch.ones_like(context)
        for name in names:
            cache = DynamicCache(config=model.config)
            out = model.generate(input_ids=context, attention_mask=mask, max_length=context.shape[1] + 1,
                                 pad_token_id=pad_token_id, use_cache=True, adapter_names=[name] * context.shape[0],
                                 **{cache_arg: cache}, **spec["kwargs"])
            parts.append((b, name, context, mask, out[:, -1:], cache))
    longest = max(p[2].shape[1] for p in parts)
    ids, masks, kvs, adapters = [], [], [], []
    for b, name, context, mask, first, cache in parts:
        pad = longest - context.shape[1]
        ids.append(torch.cat([F.pad(context, (pad, 0), value=pad_token_id), first], dim=1))
        masks.append(torch.cat([F.pad(mask, (pad, 0), value=0), torch.ones_like(first, dtype=mask.dtype)], dim=1))
        kvs.append([(F.pad(layer.keys, (0, 0, pad, 0)), F.pad(layer.values, (0, 0, pad, 0))) for layer in cache.layers])
        adapters += [name] * context.shape[0]
    # Per layer, the parts' keys and values one above the other, in the order of ``ids``.
    merged = DynamicCache(ddp_cache_data=[(torch.cat([k for k, _ in layer]), torch.cat([v for _, v in layer]))
                                          for layer in zip(*kvs)], config=model.config)
    spec = batches[0]
    out = generate_dropping_finished(model, torch.cat(ids), longest + budget, spec["stop"], decode, pad_token_id,
                                     adapter_names=adapters, stats=stats, cache=merged, start=longest,
                                     attention_mask=torch.cat(masks), **spec["kwargs"])
    results: list[list] = [[None] * len(names) for _ in batches]
    row = 0
    for b, name, context, _, _, _ in parts:
        n = context.shape[0]
        results[b][names.index(name)] = torch.cat([context, out[row:row + n, longest:]], dim=1)
        row += n
    if stats is not None:
        stats["merged_batches"] = stats.get("merged_batches", 0) + len(batches)
    return results
