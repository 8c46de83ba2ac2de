"""The ``cf-tasks`` command line: the top-level parser, the dispatch to each command, and its errors.

Each command is a module of ``cf_tasks.commands`` (its flags, its checks, the function that runs
it); this module only puts them together. Errors are turned into output in one place, ``main``:
a ``CFTasksError`` (``cf_tasks.errors``) is one line, ``cf-tasks: error: <what>; <fix>``, and the
error's exit code (2: the input; 1: a failure during the run); a disk that filled or a folder
that turned read-only is one line and exit 1; Ctrl-C is exit 130.
"""

from __future__ import annotations

import argparse
import os
import sys

from .commands import build, eval as eval_command, experiment, filter_data, publish, report, sweep, tasks_path
from .errors import CFTasksError
from .files import check_not_empty

# The commands in the order ``cf-tasks --help`` lists them.
COMMANDS = (build, tasks_path, eval_command, sweep, report, experiment, publish, filter_data)

# Hyphenated spellings of earlier versions: still accepted, not shown (every flag is lm-eval's
# underscore style).
HIDDEN_ALIASES = frozenset({"--repo-id", "--dry-run", "--no-apply_chat_template", "--for-training"})


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, plus each option's default where it has one, minus the hidden aliases."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) \
                and "default" not in text and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text

    def _format_action_invocation(self, action):
        shown = [s for s in action.option_strings if s not in HIDDEN_ALIASES]
        if len(shown) == len(action.option_strings):
            return super()._format_action_invocation(action)
        return super()._format_action_invocation(argparse.Action(shown, action.dest, nargs=action.nargs,
                                                                 metavar=action.metavar))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cf-tasks", description="Knowledge-conflict tasks for lm-eval.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    for p in (parser, *sub.choices.values()):
        p.formatter_class = HelpFormatter
    return parser


# A progress bar that finishes within this many seconds is never drawn (lm-eval's prompt building,
# a tiny model's weight loading): tqdm reads TQDM_DELAY when it is first imported. Yours wins.
PROGRESS_DELAY_S = "2"


def main(argv: list[str] | None = None) -> int:
    if "tqdm" not in sys.modules:
        os.environ.setdefault("TQDM_DELAY", PROGRESS_DELAY_S)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_not_empty(args)
        return args.func(args)
    except CFTasksError as err:
        print(f"cf-tasks: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("cf-tasks: interrupted; finished files were kept", file=sys.stderr)
        return 130
    except OSError as err:  # a full disk or a read-only folder in any command: one line, exit 1
        return _write_failed(err)


def _write_failed(err: OSError) -> int:
    """A disk that filled or a folder that turned read-only mid-run: one line, exit 1 (finished
    results stay); any other OSError is a fault of cf-tasks and keeps its traceback."""
    from .files import write_failure

    line = write_failure(err)
    if line is None:
        raise err
    print(f"cf-tasks: error: {line}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
