"""Running lm-eval on the cf-tasks (or any lm-eval task) with one loaded model.

``cf-tasks eval`` with no ``--model_args`` evaluates the embedded default model
(``default_model.py``). lm-eval's built-in task index (~7 s) is only built when a requested task
is not one of ours. With a knowledge probe (``known.Probe``), the closed-book tasks run in the same
pass and their answers are merged into the knowledge-conflict tasks' results.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import subprocess
import warnings
from typing import Any

from .known import Probe, add_knowledge, probe_for
from .results import RESULT_KEYS_BY_TASK, add_item_counts

# What lm-eval and transformers print for their own developers, silenced in cf-tasks' commands
# only (a plain `lm_eval` run prints it as before): lm-eval's advice on --metadata, once per task
# (our tasks read --metadata already, see docs/tasks.md); its note that an `_mc` task carries the
# generation settings of the task it includes (unused by log-likelihood requests); and
# transformers' deprecation notice that peft triggers.
NOTICE_LOGGERS = ("lm_eval.api.task", "lm_eval.config.task")
DEVELOPER_NOTICES = ("Custom kwargs can be passed to `--metadata`",
                     "passed `generation_kwargs`, but not using `output_type: generate_until`")
DEVELOPER_WARNINGS = (r".*is_gradient_checkpointing.* is deprecated",)


class _DropNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in DEVELOPER_NOTICES)


def _git_hash_quietly():
    """lm-eval's ``get_git_commit_hash`` without git's "fatal: not a git repository" on stderr
    when the command runs outside a git checkout (the hash is then None, as lm-eval records it)."""
    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
    except (subprocess.CalledProcessError, OSError):
        return None


@contextlib.contextmanager
def quiet_upstream():
    """Inside: lm-eval's and transformers' developer notices are not printed; restored after."""
    import lm_eval.evaluator

    drop = _DropNotices()
    loggers = [logging.getLogger(name) for name in NOTICE_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)
    had_git = hasattr(lm_eval.evaluator, "get_git_commit_hash")
    real_git = getattr(lm_eval.evaluator, "get_git_commit_hash", None)
    if had_git:
        lm_eval.evaluator.get_git_commit_hash = _git_hash_quietly
    try:
        with warnings.catch_warnings():
            for pattern in DEVELOPER_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern, category=FutureWarning)
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)
        if had_git:
            lm_eval.evaluator.get_git_commit_hash = real_git


def default_device() -> str:
    """The device a run uses when none is given: the machine's GPU if it has one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_problem(device: str, label: str, fix_none: str = "") -> str | None:
    """One line when ``device`` is no device, or one this machine does not have (``label`` names
    the argument, e.g. ``--device cuda``); None when it can be used."""
    import torch

    try:
        dev = torch.device(str(device))
    except (RuntimeError, TypeError, ValueError):
        return f"{label}: not a device; pass cpu, cuda, cuda:N or mps"
    if dev.type == "cpu":
        return None
    module = torch.backends.mps if dev.type == "mps" else getattr(torch, dev.type, None)
    available = getattr(module, "is_available", None)
    if not (callable(available) and available()):
        return f"{label}: this machine has no {dev.type} device; pass cpu{fix_none}"
    count = getattr(module, "device_count", None)
    if dev.index is not None and callable(count) and dev.index >= count():
        return f"{label}: this machine has {count()} {dev.type} device(s), numbered from 0; pass {dev.type}:0"
    return None


def our_task_names() -> frozenset[str]:
    """The names of our tasks, groups and tags: indexed once per process (every check and the
    knowledge probe ask for them), per ``registry.task_manager`` (a test may stand another in)."""
    from . import registry

    return _our_task_names(registry.task_manager)


@functools.lru_cache(maxsize=None)
def _our_task_names(make_task_manager) -> frozenset[str]:
    return frozenset(make_task_manager(include_defaults=False).all_tasks)


def needs_builtin_tasks(tasks: list[str]) -> bool:
    ours = our_task_names()
    return any(t not in ours for t in tasks)


def run_lm_eval(
    model: Any,
    tasks: list[str],
    model_args: str | dict | None = None,
    limit: float | None = None,
    batch_size: int | str = 1,
    metadata: dict | None = None,
    apply_chat_template: bool = False,
    log_samples: bool = False,
    task_manager=None,
    device: str | None = None,
    knowledge: Probe | None = None,
    attention: bool = False,
    keep_probe_samples: bool = False,
) -> dict:
    """``lm_eval.simple_evaluate`` with a task manager that indexes built-ins only when needed.

    ``knowledge``: run its extra closed-book tasks in the same pass (same items, same ``limit``)
    and merge the conditioned metrics into its knowledge-conflict tasks (``known.add_knowledge``);
    the extra tasks are then dropped from the results, and the samples too unless ``log_samples``;
    ``keep_probe_samples`` keeps the extra tasks' samples under ``results["probe_samples"]`` (the
    sweep stores them, so that a result can be rescored from its samples).
    ``attention``: also measure ``context_attention`` (``cf_tasks.attention``) with the same model.
    """
    import lm_eval

    from .registry import task_manager as make_task_manager

    if task_manager is None:
        task_manager = make_task_manager(include_defaults=needs_builtin_tasks(tasks), metadata=metadata)
    name = model
    if attention and isinstance(model, str):
        # Built here as simple_evaluate builds it, so that the probe can use the same model.
        from lm_eval.api.registry import get_model

        extra = {"batch_size": batch_size, "max_batch_size": None, "device": device}
        maker = get_model(model)
        model = (maker.create_from_arg_obj(model_args, extra) if isinstance(model_args, dict)
                 else maker.create_from_arg_string(model_args or "", extra))
    with quiet_upstream():
        results = lm_eval.simple_evaluate(
            model=model,
            model_args=model_args,
            tasks=[*tasks, *(knowledge.extra if knowledge else ())],
            limit=limit,
            batch_size=batch_size,
            device=device,
            task_manager=task_manager,
            apply_chat_template=apply_chat_template,
            log_samples=log_samples or knowledge is not None or attention,
            metadata=metadata,
        )
    if results is not None:
        from .scoring import SCORER_VERSION

        results["scorer_version"] = SCORER_VERSION
        if attention:
            from .attention import add_context_attention

            add_context_attention(model, results)
            if isinstance(name, str):
                results["config"]["model"] = name  # as simple_evaluate records a model it built itself
        if knowledge is not None:
            add_knowledge(results, knowledge)
            kept = {t: results["samples"][t] for t in knowledge.extra if t in (results.get("samples") or {})}
            for key in RESULT_KEYS_BY_TASK:
                for probe_task in knowledge.extra:
                    results.get(key, {}).pop(probe_task, None)
            if keep_probe_samples:
                results["probe_samples"] = kept
        add_item_counts(results)
        if not log_samples:
            results.pop("samples", None)
    return results


def knowledge_probe(tasks: list[str], task_manager) -> Probe | None:
    """The probe of an lm-eval pass over ``tasks`` (names of tasks, groups or tags): the
    knowledge-conflict tasks among their leaf tasks (only ours are expanded)."""
    ours = our_task_names()
    members = []
    for name in tasks:
        if name in ours:
            with quiet_upstream():
                members += list(task_manager.load([name])["tasks"])
        else:
            members.append(name)
    return probe_for(members)
