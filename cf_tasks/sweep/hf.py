"""The transformers backend: one HFLM model object; adapters attached with peft, full checkpoints'
weights swapped in when the config and tokenizer match (otherwise loaded fresh).

A full checkpoint must hold every weight of its model but those tied to another it holds (the
output head of a model with ``tie_word_embeddings``): a missing one would keep the previous
checkpoint's value after a swap, or a random one after a fresh load. Such a checkpoint is refused
(``CheckpointError``), never scored."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..checkpoints import Checkpoint, CheckpointError, same_config, same_tokenizer, tensor_names
from .decode import can_merge, can_segment, generate_batches, generate_dropping_finished
from .groups import AdapterGroups, GroupedGeneration, free_memory, generation_key

if TYPE_CHECKING:
    from .config import SweepConfig

# The most rows (prompts x adapters) that several batches of a LoRA group decode together.
AHEAD_ROWS = 128
# The batch size when --batch_size is not given: 8 on a CPU, 1 (lm-eval's default) elsewhere. On a
# CPU a batch of 1 prefills each prompt alone and leaves the matrix units idle: 4 LoRA adapters of
# SmolLM2-135M on cf_suite at --limit 10 took 68 s at 1, 56 s at 8 and 56 s at 32, with every
# metric equal (benchmarks/sweep_batch_bench.py). On a GPU the memory a batch needs depends on the
# model, so the choice stays the user's (--batch_size N or auto).
CPU_BATCH_SIZE = 8


@functools.cache
def _sweep_hflm_class():
    """lm-eval's HFLM, plus generation of a group of LoRA adapters in one batch.

    lm-eval hands ``_model_generate`` one batch of prompts. When several adapters of the same
    base wait to be scored, the batch is repeated once per adapter and generated in one call with
    peft's mixed-adapter batches (``adapter_names``): decoding on a CPU or a small model is bound by
    reading the weights, so 4 x 8 rows cost far less than four batches of 8. Each row sees the
    same prompt, padding and greedy decoding as in a batch of its own, so the answers are the same
    (the tests compare them with separate ``lm_eval --model_args peft=...`` runs).
    ``_model_generate`` is lm-eval's private hook: ``upstream.check`` tests its shape first.
    """
    from lm_eval.models.huggingface import HFLM

    class SweepHFLM(GroupedGeneration, HFLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._init_groups()
            self.decode_stats: dict = {}
            self._recorded: list | None = None  # lm-eval's batches, while they are being listed
            self._ahead: dict = {}  # the active adapter's rows generated ahead, by batch key
            self._ahead_failed = False

        def _fast_path(self) -> bool:
            """Whether the answers of one call can be had by dropping fixed rows (decode.py)."""
            return (getattr(self, "backend", None) == "causal" and getattr(self, "think_end_token", None) is None
                    and getattr(self, "mixed_precision_dtype", None) is None)

        def _greedy_settings(self, generation_kwargs: dict) -> dict | None:
            """``generation_kwargs`` as decode.py takes them (a zero temperature dropped, as lm-eval's
            own call drops it), or None where only lm-eval's single call gives its answers."""
            settings = dict(generation_kwargs)
            if settings.get("temperature") == 0.0 and not settings.get("do_sample"):
                settings.pop("temperature")
            return settings if self._fast_path() and can_segment(self.model, settings) else None

        def generate_until(self, requests, disable_tqdm: bool = False):
            """With other adapters of the group waiting: first list the batches lm-eval will ask
            for (a pass that generates nothing), generate several of them at once for every
            adapter of the group (``generate_batches``), then let lm-eval's own pass read them."""
            names = [self.active, *[n for n in self.waiting if n != self.active]]
            if (self.active is None or len(names) == 1 or self.group_failed or self._ahead_failed
                    or not self._fast_path() or not can_merge(self.model)):
                return HFLM.generate_until(self, requests, disable_tqdm)
            from lm_eval.api.model import CacheHook

            self._recorded, self._ahead = [], {}
            hook = self.cache_hook
            try:
                self.set_cache_hook(CacheHook(None))  # the listing pass's empty answers are cached nowhere
                try:
                    HFLM.generate_until(self, requests, disable_tqdm=True)
                finally:
                    self.set_cache_hook(hook)
                recorded, self._recorded = self._recorded, None
                self._generate_ahead(recorded, names)
            except Exception as err:  # e.g. out of memory with several batches at once
                reason = " ".join(str(err).split())[:200] or type(err).__name__
                print(f"cf-tasks: generating several batches of the LoRA group at once failed ({type(err).__name__}: "
                      f"{reason}); generating one batch at a time", file=sys.stderr)
                self._ahead_failed = True
                free_memory()
            finally:
                self._recorded = None
            try:
                return HFLM.generate_until(self, requests, disable_tqdm)
            finally:
                self._ahead = {}  # rows of this call only

        def _generate_ahead(self, recorded: list, names: list[str]) -> None:
            runs: list[tuple[tuple, list[dict]]] = []  # (what the batches share, the batches)
            for context, max_length, stop, kwargs in recorded:
                key = generation_key(context, max_length, stop, kwargs)
                if (self.active, key) in self.gen_cache:
                    continue  # generated earlier, with an adapter scored before this one
                settings = self._greedy_settings(kwargs)
                if key in self._ahead or settings is None:
                    continue  # left to the batch-by-batch path
                spec = {"context": context, "attention_mask": settings.pop("attention_mask", None),
                        "max_length": max_length, "stop": list(stop), "kwargs": settings, "key": key}
                same = (tuple(stop), repr(sorted(settings.items())), max_length - context.shape[1])
                rows = sum(s["context"].shape[0] for s in runs[-1][1]) * len(names) if runs else 0
                if runs and runs[-1][0] == same and rows + context.shape[0] * len(names) <= AHEAD_ROWS:
                    runs[-1][1].append(spec)
                else:
                    runs.append((same, [spec]))
            from tqdm import tqdm

            # lm-eval's own bar fills only afterwards (its answers are ready by then): this is where the time goes.
            total = sum(spec["context"].shape[0] for _, run in runs for spec in run) * len(names)
            with tqdm(total=total, desc=f"generating for {len(names)} checkpoints together", unit="answer",
                      disable=not total) as bar:
                for _, run in runs:
                    outputs = generate_batches(self.model, run, names, self.tok_decode, self.tokenizer.pad_token_id,
                                               stats=self.decode_stats)
                    for spec, outs in zip(run, outputs):
                        self._ahead[spec["key"]] = outs[0]
                        for name, out in zip(names[1:], outs[1:]):
                            self.gen_cache[(name, spec["key"])] = out
                        self.stats["group_batches"] = self.stats.get("group_batches", 0) + 1
                        bar.update(spec["context"].shape[0] * len(names))

        def _model_generate(self, context, max_length, stop, **generation_kwargs):
            if self._recorded is not None:  # listing lm-eval's batches: nothing is generated
                self._recorded.append((context, max_length, list(stop), dict(generation_kwargs)))
                return context

            def alone():
                return HFLM._model_generate(self, context, max_length, stop, **generation_kwargs)

            if self.active is None or generation_kwargs.get("do_sample"):
                return alone()  # sampled rows would draw from each other's random streams
            key = generation_key(context, max_length, stop, generation_kwargs)
            if key in self._ahead:
                return self._ahead.pop(key)

            def together(names):
                grouped = dict(generation_kwargs)
                if grouped.get("attention_mask") is not None:
                    grouped["attention_mask"] = grouped["attention_mask"].repeat(len(names), 1)
                rows = context.shape[0]
                adapters = [n for n in names for _ in range(rows)]
                settings = self._greedy_settings(grouped)
                if settings is not None:
                    # Rows whose answer is fixed leave the batch (see decode.py): the longest
                    # of N x batch answers no longer sets the length of all of them.
                    out = generate_dropping_finished(self.model, context.repeat(len(names), 1), max_length, stop,
                                                     self.tok_decode, self.tokenizer.pad_token_id,
                                                     adapter_names=adapters, stats=self.decode_stats, **settings)
                else:
                    out = HFLM._model_generate(self, context.repeat(len(names), 1), max_length, stop,
                                               adapter_names=adapters, **grouped)
                return [chunk.clone() for chunk in out.split(rows)]

            return self._serve(key, alone, together)

    return SweepHFLM



class HFBackend(AdapterGroups):
    """transformers through lm-eval's HFLM; one model object, weights and adapters swapped in.

    LoRA adapters of the same base are loaded ``lora_group`` at a time into one peft model and
    generated together (see ``_sweep_hflm_class``); each is still scored by its own lm-eval run.
    """

    name = "hf"

    def __init__(self, cfg: SweepConfig, model_args: dict):
        self.cfg = cfg
        self.lm = None
        self.loaded_from: str | None = None
        self.model_args = model_args  # the plan's: dtype, device and the rest of --model_args
        self.device = self.model_args["device"]
        self.batch_size = cfg.batch_size if cfg.batch_size is not None else (
            CPU_BATCH_SIZE if str(self.device) == "cpu" else 1)
        # An automatic batch size already fills the device: repeating it per adapter would not fit.
        self.group_size = 1 if str(self.batch_size).startswith("auto") else max(1, int(cfg.lora_group))
        self.pending: list[Checkpoint] = []
        self.adapter_names: dict[Path, str] = {}  # adapters of the loaded group still to score
        self.names_used = 0
        self.swaps = 0  # full checkpoints whose weights went into the loaded model

    def _new_lm(self, pretrained: str):
        self.lm = _sweep_hflm_class()(pretrained=pretrained, batch_size=self.batch_size, **self.model_args)
        self.loaded_from = pretrained
        self.adapter_names = {}

    def model_for(self, ckpt: Checkpoint):
        if ckpt.kind == "lora":
            return self._lora(ckpt)
        return self._full(ckpt)

    def _full(self, ckpt: Checkpoint):
        # The loaded model keeps its tokenizer: swap weights only under the same one.
        if self.lm is not None and same_config(self.loaded_from, ckpt.path) and same_tokenizer(self.loaded_from, ckpt.path):
            self._unwrap_peft()
            state = _load_state_dict(ckpt)
            expected = self.lm.model.state_dict()
            if set(state) - set(expected):  # other names (another layout): transformers maps them on a fresh load
                self._new_lm(str(ckpt.path))
            else:
                _refuse_missing(ckpt, self.lm.model, set(state))  # before any weight changes
                self.lm.model.load_state_dict(state, strict=False)
                self.loaded_from = str(ckpt.path)
                self.swaps += 1
                return self.lm
        else:
            self._new_lm(str(ckpt.path))
        names = _checkpoint_tensor_names(ckpt)
        try:
            _refuse_missing(ckpt, self.lm.model, names)
        except CheckpointError:
            self.loaded_from = None  # its random weights are never swapped over
            raise
        return self.lm

    def _lora(self, ckpt: Checkpoint):
        if self.lm is None or self.loaded_from != ckpt.base:
            self._new_lm(ckpt.base)
        solo = False
        if ckpt.path not in self.adapter_names:
            if self.adapter_names:
                # Members of the loaded group still wait (this one was left out of it, e.g. its
                # load failed then): attach it beside them instead of dropping their answers.
                self._attach(ckpt)
                solo = True
            else:
                self._load_group(ckpt)
        name = self.adapter_names[ckpt.path]
        self.lm.model.set_adapter(name)
        self.lm.active = None if solo else name
        return self.lm

    def _attach(self, ckpt: Checkpoint) -> str:
        """Load one more adapter into the peft model under a fresh name. peft registers the
        config before it loads the weights, so a failed load is deleted again: a later adapter
        must never inherit it."""
        name = f"a{self.names_used}"
        self.names_used += 1
        try:
            self.lm.model.load_adapter(str(ckpt.path), adapter_name=name, is_trainable=False)
        except Exception:
            if name in self.lm.model.peft_config:
                self.lm.model.delete_adapter(name)
            raise
        self.adapter_names[ckpt.path] = name
        return name

    def _load_group(self, ckpt: Checkpoint) -> None:
        """Load ``ckpt`` and up to ``group_size - 1`` adapters due after it (same base) together."""
        from peft import PeftModel

        self._unwrap_peft()
        self.lm.gen_cache = {}
        self.adapter_names, self.names_used = {ckpt.path: "a0"}, 1
        # lm-eval keeps its model in HFLM._model (a hook checked by upstream.py): peft's mixed-adapter
        # batches need the PeftModel itself there.
        self.lm._model = PeftModel.from_pretrained(self.lm.model, str(ckpt.path), adapter_name="a0",
                                                   is_trainable=False)
        for mate in self._mates(ckpt, self.group_size - 1):
            try:
                self._attach(mate)
            except Exception:  # it fails again, with its own error, when its turn comes
                continue
        self.lm.waiting = list(self.adapter_names.values())
        self.lm.model.eval()

    def base_model(self, base: str):
        if self.lm is None or self.loaded_from != base:
            self._new_lm(base)
        self._unwrap_peft()
        return self.lm

    def _unwrap_peft(self) -> None:
        from peft import PeftModel

        if isinstance(self.lm.model, PeftModel):
            self.lm._model = self.lm.model.unload()
        self.adapter_names = {}
        self.lm.active, self.lm.waiting, self.lm.gen_cache = None, [], {}



def _untied_missing(model, names: set[str]) -> list[str]:
    """The weights of ``model`` that a checkpoint holding the tensors ``names`` lacks, but those tied
    to one it holds. A name may also lack the base model's prefix (``model.``), as transformers
    reads it."""
    import re

    # Parameters only (a buffer is rebuilt by the model); tied names share one tensor.
    expected = dict(model.named_parameters(remove_duplicate=False))
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or ()]

    def held(key: str) -> bool:
        return key in names or (prefix != "." and key.startswith(prefix) and key[len(prefix):] in names)

    loaded = {id(t) for k, t in expected.items() if held(k)}
    return sorted(k for k, t in expected.items()
                  if not held(k) and id(t) not in loaded and not any(p.search(k) for p in ignored))


def _refuse_missing(ckpt: Checkpoint, model, names: set[str] | None) -> None:
    missing = _untied_missing(model, names) if names is not None else []
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        tie = getattr(getattr(model, "config", None), "tie_word_embeddings", None)
        why = " (its config.json has tie_word_embeddings false)" if tie is False and any("lm_head" in k for k in missing) else ""
        raise CheckpointError(f"{ckpt.files[0] if ckpt.files else ckpt.path}: lacks {shown}, which the model does not tie "
                              f"to another weight{why}; re-save the checkpoint with all its weights")


def _checkpoint_tensor_names(ckpt: Checkpoint) -> set[str] | None:
    """The tensor names of a full checkpoint (headers only for safetensors); None if unreadable."""
    names = tensor_names(ckpt.path)
    if names is not None or not ckpt.files or ckpt.files[0].suffix == ".safetensors":
        return names
    try:
        return set(_load_state_dict(ckpt))
    except Exception:  # the load of the model itself reported it
        return None


def _load_state_dict(ckpt: Checkpoint) -> dict:
    weights = ckpt.files[0]
    if weights.name == "model.safetensors":
        from safetensors.torch import load_file

        return load_file(str(weights))
    if weights.name.endswith(".index.json"):
        index = json.loads(weights.read_text())
        state: dict = {}
        for shard in sorted(set(index["weight_map"].values())):
            state.update(_load_state_dict(Checkpoint(path=ckpt.path, step=ckpt.step, files=[ckpt.path / shard])))
        return state
    import torch

    return torch.load(str(weights), map_location="cpu", weights_only=True)
