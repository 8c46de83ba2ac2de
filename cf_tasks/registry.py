"""Where the task YAMLs live, for ``--include_path`` and for ``TaskManager``.

A wheel install also places the same YAML tree in ``lm_eval/tasks/cf_tasks/`` so that plain
``lm_eval --tasks cf_bio`` finds the tasks (lm-eval 0.4.13 has no discovery hook for external
tasks); ``cf-tasks tasks-path`` prints the folder for ``--include_path`` everywhere else.
"""

from __future__ import annotations

from pathlib import Path

TASK_NAMES_ROOT = "cf_suite"


def task_yamls_path() -> Path:
    """The ``task_yamls`` folder of this installation (the ``lm_eval.tasks`` entry point)."""
    import task_yamls

    return Path(next(iter(task_yamls.__path__))).resolve()


def installed_in_lm_eval() -> bool:
    """True when lm-eval's own task folder carries our YAMLs (a wheel install)."""
    import lm_eval.tasks

    return (Path(lm_eval.tasks.__file__).parent / "cf_tasks" / "cf_suite.yaml").is_file()


def task_manager(include_defaults: bool = False, metadata: dict | None = None):
    """A TaskManager that knows our tasks; built-in tasks are indexed only when asked for (~7 s)."""
    from lm_eval.tasks import TaskManager

    include = None if (include_defaults and installed_in_lm_eval()) else str(task_yamls_path())
    return TaskManager(include_path=include, include_defaults=include_defaults, metadata=metadata)
