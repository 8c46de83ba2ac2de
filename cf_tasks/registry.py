"""The task families, where the task YAMLs live, and a ``TaskManager`` that indexes each of them once.

The knowledge-conflict (KC) family is named here once: its datasets, the generation prompts each
has a task for, and the rule that names a dataset's (or a task's) agreeing twin. The knowledge
probe (``known.py``), ``--attention`` (``attention.py``), the sweep and the dataset builders read
them from here.

cf-tasks never writes into lm-eval's folder. lm-eval finds the tasks in one of three ways:

- ``--include_path "$(cf-tasks tasks-path)"``: every lm-eval version, regular or editable install;
- the ``lm_eval.tasks`` entry point ``cf_tasks = "task_yamls"`` (pyproject.toml): lm-eval versions
  with entry-point discovery of task packages (upstream PR #4015, open; 0.4.13 has none) scan the
  folder of the package the value names, with no flag;
- until then, the start-up hook ``cf_tasks_autoload`` reads that entry point for lm-eval and adds
  the folder to what each ``TaskManager`` indexes (opt out with ``CF_TASKS_NO_AUTOLOAD=1``).

``task_manager`` first asks lm-eval what it finds on its own and adds ``include_path`` only when
that is not our folder, so a task is never indexed from both.
"""

from __future__ import annotations

from pathlib import Path

TASK_NAMES_ROOT = "cf_suite"

# The knowledge-conflict datasets: a counterfactual context against memorised knowledge.
KC_DATASETS = ("cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes", "cf_world_facts_former", "cf_capitals_former")
# Their generation prompts (``<dataset><variant>``); not _closedbook, _known, _mc or _agree.
KC_VARIANTS = ("", "_alpaca", "_tulu", "_adhere")
# Each KC generation task -> its dataset (``cf_bio_alpaca`` -> ``cf_bio``).
KC_TASKS = {f"{dataset}{variant}": dataset for dataset in KC_DATASETS for variant in KC_VARIANTS}
AGREE_SUFFIX = "_agree"
ENTRY_POINT_GROUP = "lm_eval.tasks"
ENTRY_POINT_NAME = "cf_tasks"


def twin_name(name: str) -> str:
    """The agreeing twin of a dataset or task: the same items with the true answer stated
    (``cf_bio`` -> ``cf_bio_agree``, ``cf_bio_alpaca`` -> ``cf_bio_alpaca_agree``)."""
    return f"{name}{AGREE_SUFFIX}"


def twin_of(name: str) -> str | None:
    """The dataset or task an agreeing twin mirrors (``cf_bio_agree`` -> ``cf_bio``); None for a name
    that is not a twin's."""
    return name[: -len(AGREE_SUFFIX)] if name.endswith(AGREE_SUFFIX) else None


def task_yamls_path() -> Path:
    """The ``task_yamls`` folder of this installation (what ``cf-tasks tasks-path`` prints)."""
    import task_yamls

    return Path(task_yamls.__file__).parent.resolve()


def indexes_our_tasks(tm) -> bool:
    """True when ``tm`` (an lm-eval ``TaskManager``) found our suite in our own folder."""
    entry = tm.task_index.get(TASK_NAMES_ROOT)
    return bool(entry and entry.yaml_path) and Path(entry.yaml_path).resolve().is_relative_to(task_yamls_path())


def task_manager(include_defaults: bool = False, metadata: dict | None = None):
    """A TaskManager that knows our tasks; built-in tasks are indexed only when asked for (~7 s)."""
    from lm_eval.tasks import TaskManager

    # Without built-ins and include_path, lm-eval scans only what it discovers by itself: nothing
    # in 0.4.13 (an instant, empty index), our folder where it reads the entry point or where the
    # start-up hook (cf_tasks_autoload) adds it.
    found = TaskManager(include_defaults=False, metadata=metadata)
    if indexes_our_tasks(found):
        return TaskManager(include_defaults=True, metadata=metadata) if include_defaults else found
    return TaskManager(include_path=str(task_yamls_path()), include_defaults=include_defaults, metadata=metadata)
