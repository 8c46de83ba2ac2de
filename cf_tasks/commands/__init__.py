"""The ``cf-tasks`` commands, one module each, as lm-eval's CLI has them.

Each module has ``add_parser(sub)``, which registers its subcommand (its flags, defaults and help
texts) on the top-level subparsers and sets ``func`` to the function that runs it, and that
function, which takes the parsed ``argparse.Namespace`` and returns the exit code. A command checks
its own input before any work and raises a ``cf_tasks.errors.CFTasksError`` (usually a
``UsageError``) for what the user can fix; ``cf_tasks.cli.main`` prints it as one line and exits
with the error's code. Checks that several commands share (``--metadata``, ``--alpha``, the
trackers) are in ``common``. Modules import what they need inside the functions that run, so that
building the parser stays fast.

The dispatcher, ``cf_tasks.cli``, lists the modules in the order ``cf-tasks --help`` shows them.
A study's arguments may live beside the study (``cf_tasks.experiments.command`` for ``cf-tasks
experiment inversion``), registered by the command module of its group (``experiment``).
"""
