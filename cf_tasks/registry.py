"""Where the task YAMLs live, and a ``TaskManager`` that indexes each of them once.

cf-tasks never writes into lm-eval's folder. lm-eval finds the tasks in one of two ways:

- ``--include_path "$(cf-tasks tasks-path)"``: every lm-eval version, regular or editable install;
- the ``lm_eval.tasks`` entry point ``cf_tasks = "task_yamls"`` (pyproject.toml): lm-eval versions
  with entry-point discovery of task packages (upstream PR #4015, open; 0.4.13 has none) scan the
  folder of the package the value names, with no flag.

``task_manager`` first asks lm-eval what it finds on its own and adds ``include_path`` only when
that is not our folder, so a task is never indexed from both.
"""

from __future__ import annotations

from pathlib import Path

TASK_NAMES_ROOT = "cf_suite"
ENTRY_POINT_GROUP = "lm_eval.tasks"
ENTRY_POINT_NAME = "cf_tasks"


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
    # in 0.4.13 (an instant, empty index), our folder where it reads the entry point.
    found = TaskManager(include_defaults=False, metadata=metadata)
    if indexes_our_tasks(found):
        return TaskManager(include_defaults=True, metadata=metadata) if include_defaults else found
    return TaskManager(include_path=str(task_yamls_path()), include_defaults=include_defaults, metadata=metadata)
