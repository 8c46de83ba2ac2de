"""One error family: every error a user can see is a ``CFTasksError``, and ``cf-tasks`` turns one into
one line on stderr and the class's exit code, in one place (``cf_tasks.cli.main``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import cf_tasks
from cf_tasks import cli
from cf_tasks.errors import CFTasksError, RunError, UsageError

# Exceptions that steer the code and are caught inside it: no message for the user, so outside the family.
INTERNAL = {
    "cf_tasks.sweep.rescore.NotReplayable": "caught by the sweep, which then evaluates the checkpoint again",
}

# Each error's exit code: 2 for the user's input, 1 for a failure during the run (as before the family).
EXIT_CODES = {
    "cf_tasks.errors.UsageError": 2,
    "cf_tasks.errors.RunError": 1,
    "cf_tasks.hub.repo.PublishError": 2,
    "cf_tasks.sweep.config.SweepError": 2,
    "cf_tasks.experiments.study_folder.StudyError": 2,
    "cf_tasks.experiments.inject.GateFailed": 1,
    "cf_tasks.attention.AttentionError": 2,
    "cf_tasks.default_model.DefaultModelError": 2,
    "cf_tasks.mitigations.filter_guard.GuardError": 2,
    "cf_tasks.mitigations.qk.QKError": 2,
    "cf_tasks.mitigations.filter_input.FilterError": 2,
    "cf_tasks.mitigations.filter_scoring.FilterRunError": 1,
    "cf_tasks.trackers.backends.TrackerError": 2,
    "cf_tasks.checkpoints.CheckpointError": 1,
    "cf_tasks.sweep.locks.Busy": 1,
}


def exception_classes() -> dict[str, type]:
    """Every exception class defined in a module of ``cf_tasks``, by its dotted name."""
    found = {}
    for info in pkgutil.walk_packages(cf_tasks.__path__, "cf_tasks."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_user_facing_exception_is_in_the_family():
    classes = exception_classes()
    assert set(INTERNAL) <= set(classes), "an internal exception moved: update INTERNAL"
    outside = sorted(name for name, cls in classes.items() if name not in INTERNAL and not issubclass(cls, CFTasksError))
    assert not outside, f"subclass cf_tasks.errors.CFTasksError (and set exit_code), or list in INTERNAL why not: {outside}"
    for name in INTERNAL:
        assert not issubclass(classes[name], CFTasksError), f"{name} joined the family: drop it from INTERNAL"


def test_each_error_keeps_its_exit_code():
    classes = exception_classes()
    family = {name for name, cls in classes.items() if issubclass(cls, CFTasksError) and name != "cf_tasks.errors.CFTasksError"}
    assert family == set(EXIT_CODES), "a new error in the family: give it its exit code here"
    assert {name: classes[name].exit_code for name in family} == EXIT_CODES


def test_built_in_bases_are_kept_for_their_callers():
    from cf_tasks.default_model import DefaultModelError
    from cf_tasks.mitigations.qk import QKError
    from cf_tasks.trackers.backends import TrackerError

    assert issubclass(TrackerError, ValueError) and issubclass(QKError, ValueError)
    assert issubclass(DefaultModelError, RuntimeError)


class Refused(CFTasksError):
    exit_code = 2


class Broke(CFTasksError):
    exit_code = 1


def _command(error: BaseException) -> types.SimpleNamespace:
    """A command module whose ``cf-tasks boom`` raises ``error``."""

    def run(args):
        raise error

    def add_parser(sub):
        sub.add_parser("boom").set_defaults(func=run)

    return types.SimpleNamespace(add_parser=add_parser)


@pytest.mark.parametrize(("error", "code"), [
    (Refused("--thing 3: not a thing; pass --thing 2"), 2),
    (Broke("the disk is gone; free space and run again"), 1),
    (UsageError("--flag x: bad; pass y"), 2),
    (RunError("the run failed; run again"), 1),
    (CFTasksError("something failed; run again"), 1),
])
def test_the_dispatcher_prints_one_line_and_the_exit_code(monkeypatch, capsys, error, code):
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, _command(error)))
    assert cli.main(["boom"]) == code
    out, err = capsys.readouterr()
    assert out == "" and err == f"cf-tasks: error: {error}\n"


def test_a_module_error_is_printed_without_its_command_converting_it(tmp_path, capsys):
    """A SweepError from ``cf-tasks report`` reaches the dispatcher as it is."""
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cf-tasks: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_any_other_exception_keeps_its_traceback(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, _command(KeyError("a bug"))))
    with pytest.raises(KeyError):
        cli.main(["boom"])


def test_views_held_past_the_wait_are_one_line_that_says_what_to_run(tmp_path, monkeypatch):
    from unittest import mock

    from cf_tasks.sweep import locks

    with mock.patch.object(locks, "try_lock", autospec=True, return_value=False) as held:
        monkeypatch.setattr(locks, "VIEWS_LOCK_TIMEOUT", 0.01)
        with pytest.raises(locks.Busy) as err:
            with locks.views_lock(tmp_path, wait=0.01):
                pass
        assert held.call_count >= 1
    message = str(err.value)
    assert "\n" not in message and "views.lock" in message
    assert message.endswith(f"run `cf-tasks report {tmp_path}` once it has finished")
    assert isinstance(err.value, RunError) and err.value.exit_code == 1
