"""The one family of errors a user sees, raised from any layer and printed by the command line.

Every error meant for the user is a ``CFTasksError``. ``cf-tasks`` (``cf_tasks.cli.main``, in one
place) prints it as one line, ``cf-tasks: error: <what>; <fix>``, with no traceback, and exits
with the class's ``exit_code``: 2 for a problem with the user's input (``UsageError`` and most
modules' own errors), 1 for a failure during the run (``RunError``, a gate that failed, ...). Its
text names the thing and the fix.

A module with errors of its own (``SweepError``, ``PublishError``, ...) subclasses ``CFTasksError``
and sets ``exit_code``; where a caller catches it as a built-in exception (``except ValueError``),
the class keeps that base too (``class TrackerError(CFTasksError, ValueError)``). A command raises
these as they are: there is no converting them by hand.

Outside the family, on purpose: exceptions that steer the code and are caught inside it
(``sweep.rescore.NotReplayable``), and the dataset builders' own errors
(``dataset_builders``), which ``cf-tasks build`` turns into a ``UsageError`` with the fix added.
``tests/test_errors.py`` checks that every other exception class of ``cf_tasks`` is in the family.
"""

from __future__ import annotations


class CFTasksError(Exception):
    """An error for the user: printed as one line without a traceback, exit ``exit_code``."""

    exit_code = 1


class UsageError(CFTasksError):
    """A problem with the user's input (an argument, a file, a folder): exit 2."""

    exit_code = 2


class RunError(CFTasksError):
    """A failure during the run, not the user's arguments (a disk that filled): exit 1."""

    exit_code = 1
