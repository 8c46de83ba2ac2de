"""Generating a group of LoRA adapters of one base together: the bookkeeping both backends share.

lm-eval hands the model wrapper one batch of prompts at a time. When several adapters of the same
base wait to be scored, the batch is generated once for all of them (peft mixed-adapter batches on
hf, one ``generate`` call with a ``LoRARequest`` per prompt on vLLM); each adapter's own lm-eval run
later gets its rows back from ``gen_cache``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from ..checkpoints import Checkpoint, check_weights


def generation_key(context, max_length: int, stop, kwargs: dict) -> tuple:
    """Identifies one lm-eval generation batch: the same key means the same prompts, padding and
    decoding settings, so the answer of another adapter computed earlier can be reused."""
    digest = hashlib.sha256(context.cpu().numpy().tobytes())
    mask = kwargs.get("attention_mask")
    if mask is not None:
        digest.update(mask.cpu().numpy().tobytes())
    rest = sorted((k, repr(v)) for k, v in kwargs.items() if k != "attention_mask")
    return (tuple(context.shape), digest.hexdigest(), max_length, tuple(stop or ()), tuple(rest))


class GroupedGeneration:
    """What the hf and vLLM wrappers share: the adapter being scored (``active``), the group's
    adapters still to score (``waiting``), and the rows generated for them ahead of their turn
    (``gen_cache``, keyed by adapter name and the exact batch)."""

    def _init_groups(self) -> None:
        self.active: str | None = None
        self.waiting: list[str] = []
        self.gen_cache: dict = {}
        self.stats: dict = {}
        self.group_failed = False

    def _serve(self, key, alone, together):
        """The active adapter's rows for batch ``key``: kept from an earlier group call, or
        generated now by ``together(names)`` (one chunk per name, active first) for every
        waiting adapter, or by ``alone()`` when no other adapter waits or grouping failed."""
        cached = self.gen_cache.pop((self.active, key), None)
        if cached is not None:
            self.stats["reused_batches"] = self.stats.get("reused_batches", 0) + 1
            return cached
        names = [self.active, *[n for n in self.waiting if n != self.active]]
        if len(names) == 1 or self.group_failed:
            return alone()
        try:
            chunks = together(names)
        except Exception as err:  # e.g. out of memory at N x batch: each adapter on its own
            reason = " ".join(str(err).split())[:200] or type(err).__name__
            print(f"cf-tasks: generating LoRA adapters together failed ({type(err).__name__}: {reason}); "
                  "generating each adapter on its own (pass --lora_group 1 to skip the attempt)", file=sys.stderr)
            self.group_failed = True
            free_memory()
            return alone()
        for name, chunk in zip(names[1:], chunks[1:]):
            self.gen_cache[(name, key)] = chunk
        self.stats["group_batches"] = self.stats.get("group_batches", 0) + 1
        return chunks[0]



def _groupable(ckpt: Checkpoint) -> bool:
    """Plain LoRA adapters only: peft's mixed-adapter batches do not take DoRA or other methods."""
    try:
        config = json.loads((ckpt.path / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return str(config.get("peft_type", "LORA")).upper() == "LORA" and not config.get("use_dora")


class AdapterGroups:
    """Bookkeeping shared by the backends for generating LoRA adapters in groups: ``pending`` is
    the adapters still to score, in order; ``adapter_names`` maps the loaded group's paths to
    the names the model wrapper (``lm.active`` / ``lm.waiting`` / ``lm.gen_cache``) uses."""

    lm: Any = None
    pending: list[Checkpoint]
    adapter_names: dict[Path, str]

    def plan(self, todo: list[Checkpoint]) -> None:
        """The checkpoints about to be scored, in order: the adapters a group is drawn from."""
        self.pending = [c for c in todo if c.kind == "lora" and not c.error]

    def finished(self, ckpt: Checkpoint) -> None:
        """Forget a scored (or failed) adapter's place in its group and its kept generations. A
        later re-score (a re-saved checkpoint under --watch) loads it afresh."""
        name = self.adapter_names.pop(ckpt.path, None)
        self.pending = [c for c in self.pending if c.path != ckpt.path]
        if self.lm is None or name is None:
            return
        self.lm.waiting = [n for n in self.lm.waiting if n != name]
        self.lm.gen_cache = {k: v for k, v in self.lm.gen_cache.items() if k[0] != name}
        if self.lm.active == name:
            self.lm.active = None

    def _mates(self, ckpt: Checkpoint, limit: int, max_rank: int | None = None) -> list[Checkpoint]:
        """Adapters due after ``ckpt`` that can share its batches: same base, plain LoRA, weights
        that open, and a rank the engine was sized for. Anything else is scored on its own."""
        if limit <= 0 or not _groupable(ckpt):
            return []
        mates = []
        for c in self.pending:
            if len(mates) == limit:
                break
            if c.path == ckpt.path or c.base != ckpt.base or not _groupable(c) or check_weights(c) is not None:
                continue
            if max_rank is not None and (c.lora_rank or 0) > max_rank:
                continue
            mates.append(c)
        return mates



def free_memory() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass
