"""The settings each task's result is stored under: every setting that can move one task's numbers
(task and group versions, few-shot counts, generation arguments, limit, metadata, chat template,
lm-eval's seeds, backend, model arguments, scorer version, knowledge probe, attention), for the
requested tasks and the agreeing twins the sweep adds to them."""

from __future__ import annotations

import dataclasses

from ..attention import setting as attention_setting
from ..known import agree_twin, probe_for
from ..scoring import SCORER_VERSION
from .checks import check_task_metadata, check_task_names, load_task
from .config import SweepConfig
from .model_args import sweep_model_args

LM_EVAL_SEEDS = (0, 1234, 1234, 1234)  # simple_evaluate's random, numpy, torch and few-shot seeds


def _limit_setting(limit: float | None) -> float | int | None:
    """The limit as lm-eval applies it: a fraction below 1, else a whole number of items."""
    if limit is None:
        return None
    return float(limit) if limit < 1 else int(limit)


def task_settings(cfg: SweepConfig, tm, model_args: dict | None = None) -> dict[str, dict]:
    """Every setting that can move one task's numbers, per task to score: the requested ones and,
    unless ``--no_agree``, the agreeing twin of each knowledge-conflict task among them (where
    installed). Checks that each task exists and that its dataset loads (one line naming the task
    and the dataset otherwise). ``model_args``: the sweep's (``sweep_model_args(cfg)`` when not given)."""
    known = set(tm.task_index)
    check_task_names(cfg.tasks, tm)
    check_task_metadata(cfg.tasks, cfg.metadata, values=False)  # check_arguments read its values
    if model_args is None:
        model_args = sweep_model_args(cfg)  # dtype, device, ...: every one can move a number
    settings = {}
    for name in cfg.tasks:
        loaded = load_task(tm, name)
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
        if any(_scored_by_cf_tasks(task) for task in tasks.values()):
            settings[name]["scorer_version"] = SCORER_VERSION
        probe = probe_for(tasks) if cfg.knowledge else None
        if probe is not None:  # only where the probe runs: a result without it keeps the hash it always had
            settings[name]["knowledge"] = probe.pairs
        if cfg.attention and attention_setting(tasks):  # only where it adds a metric: other results stay shared
            settings[name]["attention"] = attention_setting(tasks)
    if cfg.agree:
        members = {t for s in settings.values() for t in s["num_fewshot"]}
        twins = sorted({agree_twin(t, known) for t in members} - {None} - set(settings) - members)
        if twins:
            settings.update(task_settings(dataclasses.replace(cfg, tasks=twins, agree=False), tm, model_args))
    return settings


def _scored_by_cf_tasks(task) -> bool:
    """Whether cf-tasks' code scores a loaded lm-eval task (its class or its process_results)."""
    hook = getattr(task.config, "process_results", None)
    return any(str(getattr(x, "__module__", "")).startswith("cf_tasks") for x in (type(task), hook))
