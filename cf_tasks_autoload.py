"""Lets plain ``lm_eval --tasks cf_bio`` find the cf-tasks tasks, with no ``--include_path``.

lm-eval 0.4.13 indexes only its own ``lm_eval/tasks/`` folder and ``--include_path``; it has no
extension point for an installed task package. cf-tasks declares one anyway (the ``lm_eval.tasks``
entry point ``cf_tasks = "task_yamls"``, the shape of upstream's proposal) and this module reads it
for lm-eval until lm-eval reads it itself:

- ``cf_tasks_autoload.pth`` (in site-packages) imports this module when Python starts. It only puts
  a finder at the front of ``sys.meta_path`` that compares each imported module's name with
  ``lm_eval.tasks`` and otherwise does nothing; it imports nothing else, so a process that never
  imports lm-eval never imports cf-tasks.
- When ``lm_eval.tasks`` is imported, ``TaskManager.__init__`` is wrapped so that a manager built
  without our folder in ``include_path`` gets it added, before the user's own paths (a user's task
  of the same name wins, as it would over a built-in one). The finder then leaves ``sys.meta_path``.
  Nothing is written anywhere and nothing else of lm-eval changes.
- It stands down (the wrapper passes every call through unchanged) when ``CF_TASKS_NO_AUTOLOAD`` is
  set to anything but ``""`` or ``0``, when the caller already passes our folder, and when lm-eval
  finds our tasks without it (an lm-eval that reads ``lm_eval.tasks`` entry points: checked once
  per process by building an index with no paths, which takes no time on lm-eval 0.4.13).
- It never breaks Python or lm-eval: any error is caught and the call goes on as lm-eval's own;
  ``status()`` (``cf-tasks tasks-path --status``) says whether it is active and why not.
"""

import os
import sys

OPT_OUT = "CF_TASKS_NO_AUTOLOAD"
TARGET = "lm_eval.tasks"
ENTRY_POINT_GROUP = "lm_eval.tasks"
ENTRY_POINT_NAME = "cf_tasks"

_state = {"installed": False, "patched": False, "native": None, "error": None}


def opted_out() -> bool:
    return os.environ.get(OPT_OUT, "").strip() not in ("", "0")


def task_folder():
    """Our task folder, as lm-eval's entry-point discovery would resolve it (None if not found)."""
    import importlib.metadata
    import importlib.util

    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=ENTRY_POINT_NAME):
        spec = importlib.util.find_spec(ep.value.split(":", 1)[0].strip())
        if spec is not None and spec.submodule_search_locations:
            return os.path.realpath(list(spec.submodule_search_locations)[0])
    return None


def _as_list(include_path) -> list:
    if include_path is None:
        return []
    return list(include_path) if isinstance(include_path, (list, tuple)) else [include_path]


def _lm_eval_finds_our_tasks(cls, init, folder) -> bool:
    """True when lm-eval indexes our folder on its own (reads the entry point), checked once."""
    if _state["native"] is None:
        probe = cls.__new__(cls)
        init(probe, include_defaults=False)
        entry = probe.task_index.get("cf_suite")
        path = getattr(entry, "yaml_path", None)
        _state["native"] = bool(path) and os.path.realpath(path).startswith(folder + os.sep)
    return _state["native"]


def patch(task_manager_cls) -> None:
    """Wrap ``task_manager_cls.__init__`` so that it indexes our folder when nothing else does."""
    import functools
    import inspect

    init = task_manager_cls.__init__
    if getattr(init, "__cf_tasks_autoload__", False):
        return
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            if not opted_out():
                bound = signature.bind(self, *args, **kwargs)
                folder = task_folder()
                given = _as_list(bound.arguments.get("include_path"))
                if (
                    folder
                    and folder not in {os.path.realpath(str(p)) for p in given}
                    and not _lm_eval_finds_our_tasks(type(self), init, folder)
                ):
                    bound.arguments["include_path"] = [folder, *given]
                    args, kwargs = bound.args[1:], bound.kwargs
        except Exception as exc:  # never stand between the user and lm-eval
            _state["error"] = f"{type(exc).__name__}: {exc}"
        init(self, *args, **kwargs)

    __init__.__cf_tasks_autoload__ = True
    task_manager_cls.__init__ = __init__
    _state["patched"] = True


class _Loader:
    """Runs the real loader of ``lm_eval.tasks``, then patches its ``TaskManager``."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # The module keeps its own loader (importlib.resources and friends read it).
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            patch(module.TaskManager)
        except Exception as exc:
            _state["error"] = f"{type(exc).__name__}: {exc}"


class _Finder:
    """Waits on ``sys.meta_path`` for ``lm_eval.tasks``; any other import passes through."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(name, path, target) if find else None
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader)
                    return spec
        except Exception as exc:
            _state["error"] = f"{type(exc).__name__}: {exc}"
        return None


def install() -> None:
    """Start waiting for ``lm_eval.tasks`` (or patch it now if it is already imported)."""
    try:
        if opted_out() or _state["installed"]:
            return
        _state["installed"] = True
        module = sys.modules.get(TARGET)
        if module is not None and hasattr(module, "TaskManager"):
            patch(module.TaskManager)
        else:
            sys.meta_path.insert(0, _Finder())
    except Exception as exc:
        _state["error"] = f"{type(exc).__name__}: {exc}"


def status() -> str:
    """One line: does plain ``lm_eval --tasks cf_bio`` find our tasks in this Python, and why."""
    fix = 'pass --include_path "$(cf-tasks tasks-path)" to lm_eval'
    if opted_out():
        return f"off: {OPT_OUT} is set; {fix}"
    if not _state["installed"]:
        return f"off: cf_tasks_autoload.pth did not run at start-up (reinstall cf-tasks); {fix}"
    try:
        from lm_eval.tasks import TaskManager

        found = "cf_suite" in TaskManager(include_defaults=False).task_index
    except Exception as exc:
        return f"lm-eval's TaskManager did not load ({type(exc).__name__}: {exc})"
    if _state["error"]:
        return f"failed ({_state['error']}); {fix}"
    if _state["native"]:
        return "off: this lm-eval reads the lm_eval.tasks entry point itself, nothing to add"
    if found:
        return "on: lm_eval --tasks finds the cf-tasks tasks with no --include_path"
    return f"off: lm-eval does not find the tasks; {fix}"


install()
