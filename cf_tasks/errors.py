"""The error a user can fix, raised from any layer and printed by the command line as one line.

``cf-tasks`` prints a ``UsageError`` as ``cf-tasks: error: <what>; <fix>`` and exits 2, with no
traceback. Its text is one line that names the thing and the fix. Modules with errors of their own
(``SweepError``, ``PublishError``, ...) keep them, and the command that calls them turns them into a
``UsageError``.
"""

from __future__ import annotations


class UsageError(Exception):
    """A problem with the user's input; printed as one line without a traceback."""
