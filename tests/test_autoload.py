"""The start-up hook that lets plain ``lm_eval --tasks cf_bio`` find our tasks (cf_tasks_autoload):
loaded by its .pth at start-up, silent until lm-eval's task index is built, opt-out, standing down
when the folder is passed or lm-eval reads the entry point itself, and never in the way.
The install shapes (regular, editable lm-eval, uninstall) run in .ci/base-install and
.ci/editable-lm-eval."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import cf_tasks_autoload
from cf_tasks.registry import task_yamls_path


def _python(code: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k != cf_tasks_autoload.OPT_OUT}
    environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **env)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


LISTS_CF_BIO = "from lm_eval.tasks import TaskManager; print('cf_bio' in TaskManager(include_defaults=False).all_tasks)"


def test_the_pth_file_is_installed_beside_the_packages():
    pth = Path(sysconfig.get_paths()["purelib"]) / "cf_tasks_autoload.pth"
    assert pth.is_file()
    assert "import cf_tasks_autoload" in pth.read_text()


def test_a_python_that_never_imports_lm_eval_imports_no_cf_tasks_package():
    loaded = _python("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
                     "('cf_tasks', 'cf_tasks_autoload', 'task_yamls', 'dataset_builders', 'lm_eval')))")
    assert loaded == "['cf_tasks_autoload']"  # the hook alone, which imports nothing else


def test_plain_task_manager_finds_our_tasks_and_the_opt_out_turns_it_off():
    assert _python(LISTS_CF_BIO) == "True"
    assert _python(LISTS_CF_BIO, CF_TASKS_NO_AUTOLOAD="1") == "False"
    assert _python(LISTS_CF_BIO, CF_TASKS_NO_AUTOLOAD="0") == "True"


def test_the_status_line_says_what_the_hook_does():
    code = "import cf_tasks_autoload as a; print(a.status())"
    assert _python(code).startswith("on: ")
    assert _python(code, CF_TASKS_NO_AUTOLOAD="1").startswith("off: CF_TASKS_NO_AUTOLOAD is set")


@pytest.fixture
def built_paths(monkeypatch):
    """The path lists lm-eval's TaskIndex is asked to scan, in this process."""
    import lm_eval.tasks.manager as manager

    real_build, calls = manager.TaskIndex.build, []

    def build(paths, **kwargs):
        calls.append([Path(p).resolve() for p in paths])
        return real_build(paths, **kwargs)

    monkeypatch.delenv(cf_tasks_autoload.OPT_OUT, raising=False)
    monkeypatch.setitem(cf_tasks_autoload._state, "native", None)
    monkeypatch.setattr(manager.TaskIndex, "build", staticmethod(build))
    return calls


def test_our_folder_comes_before_the_users_paths(built_paths, tmp_path):
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(tmp_path), include_defaults=False)
    assert "cf_bio" in tm.all_tasks and tm.include_path == [str(task_yamls_path()), str(tmp_path)]
    assert built_paths[-1] == [task_yamls_path(), tmp_path.resolve()]


def test_passing_our_folder_indexes_it_once_with_no_warning(built_paths, caplog):
    from lm_eval.tasks import TaskManager

    with caplog.at_level("WARNING"):
        tm = TaskManager(include_path=str(task_yamls_path()), include_defaults=False)
    assert "cf_bio" in tm.all_tasks
    assert built_paths[-1] == [task_yamls_path()]
    assert "overrides existing task" not in caplog.text


def test_stands_down_when_lm_eval_reads_the_entry_point(built_paths, monkeypatch, caplog):
    import lm_eval.tasks.manager as manager
    from lm_eval.tasks import TaskManager

    counting_build = manager.TaskIndex.build

    def reads_entry_points(paths, **kwargs):  # lm-eval with entry-point discovery: our folder first
        return counting_build([task_yamls_path(), *paths], **kwargs)

    monkeypatch.setattr(manager.TaskIndex, "build", staticmethod(reads_entry_points))
    with caplog.at_level("WARNING"):
        tm = TaskManager(include_defaults=False)
    assert "cf_bio" in tm.all_tasks and tm.include_path is None
    assert built_paths[-1] == [task_yamls_path()]  # once: the hook added nothing
    assert "overrides existing task" not in caplog.text
    assert cf_tasks_autoload._state["native"] is True


def test_an_error_in_the_hook_leaves_lm_eval_as_it_is(built_paths, monkeypatch):
    from lm_eval.tasks import TaskManager

    def broken():
        raise RuntimeError("metadata unreadable")

    monkeypatch.setattr(cf_tasks_autoload, "task_folder", broken)
    monkeypatch.setitem(cf_tasks_autoload._state, "error", None)
    tm = TaskManager(include_defaults=False)
    assert "cf_bio" not in tm.all_tasks and built_paths[-1] == []
    assert cf_tasks_autoload._state["error"] == "RuntimeError: metadata unreadable"
    assert cf_tasks_autoload.status().startswith("failed (RuntimeError: metadata unreadable)")
