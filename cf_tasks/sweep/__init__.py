"""The checkpoint-sweep scorer: every checkpoint of a fine-tuning run, in one command.

This is the paper's main instrument (Figures 2-5): counterfactual and parametric accuracy over
training steps. One process loads the task index and the datasets once and keeps one model
engine: LoRA adapters are served in turn on the base model (each with its own LoRA id on vLLM);
full checkpoints swap their weights into the loaded transformers model when the architecture and
tokenizer match and reload otherwise (vLLM restarts its engine for them).

Every argument, task name and dataset is checked before a model loads (one line, exit 2). Results
go into the store of the output folder: one result per checkpoint content, task and evaluation
settings, written once; any number of processes may share the folder. ``sweep.csv`` /
``sweep.json`` (one row per checkpoint x task x metric x settings), ``checkpoints/<name>/``,
``inversion.png`` and ``manifest.json`` are views rebuilt from the store.

One module per job: ``plan`` (the run's loop), ``checks`` (the checks before any model loads, some
shared with ``cf-tasks eval`` and ``report``), ``settings`` (each task's settings), ``selection`` (the
shard, the places of the checkpoints), ``store`` (results, temp files), ``locks`` (claims, the views
lock), ``views`` (tables, plot, summary, ``report``), ``stats`` (paired tests across checkpoints, items.csv),
``rescore`` (results rescored from their stored samples after a scorer change, no model loaded),
``hf`` and ``vllm`` (the backends), ``model_args`` (``--model_args``: checks, defaults, the checkpoint's
dtype), ``groups`` (LoRA adapters generated together), ``timings`` (``--timings``: seconds per phase),
``config`` (``SweepConfig``, ``SweepError``).
"""

from .config import LOCK_TIMEOUT, SweepConfig, SweepError
from .hf import HFBackend
from .model_args import CPU_KV_CACHE_BYTES, checkpoint_dtype, parse_model_args, sweep_model_args
from .checks import REQUIRED_PACKAGES, vllm_available
from .plan import SweepRun, make_backend, run_sweep
from .selection import shard_from_env
from .settings import task_settings
from .stats import ALPHA, check_alpha, item_rows
from .store import split_results
from .views import MANIFEST, SWEEP_COLUMNS, format_summary, plot, rebuild_views, report, summarize, sweep_rows, write_outputs

__all__ = [
    "CPU_KV_CACHE_BYTES", "HFBackend", "LOCK_TIMEOUT", "MANIFEST", "REQUIRED_PACKAGES", "SWEEP_COLUMNS",
    "SweepConfig", "SweepError", "SweepRun", "VLLMBackend", "checkpoint_dtype", "format_summary",
    "import_lm_eval_vllm", "make_backend", "parse_model_args", "plot", "rebuild_views", "report", "run_sweep",
    "shard_from_env", "split_results", "summarize", "sweep_model_args", "sweep_rows", "task_settings", "vllm_available",
    "write_outputs",
    "ALPHA", "check_alpha", "item_rows",
]


VLLM_NAMES = ("VLLMBackend", "import_lm_eval_vllm")


def __getattr__(name: str):
    """The vLLM backend's names, imported on first use only."""
    if name in VLLM_NAMES:
        from . import vllm

        return getattr(vllm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
