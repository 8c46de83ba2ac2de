"""``cf-tasks tasks-path``: the task YAML folder (for ``lm_eval --include_path``), or whether lm-eval finds it."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("tasks-path", help="print the task YAML folder (for lm_eval --include_path)")
    p.add_argument("--status", action="store_true",
                   help="instead, say whether plain `lm_eval --tasks cf_bio` finds the tasks here, and why (exit 1 if not)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..registry import task_yamls_path

    if args.status:
        try:
            import cf_tasks_autoload
        except ImportError:
            print("off: cf_tasks_autoload is not installed; reinstall cf-tasks, or pass "
                  '--include_path "$(cf-tasks tasks-path)" to lm_eval')
            return 1
        line = cf_tasks_autoload.status()
        print(line)
        return 0 if line.startswith(("on:", "off: this lm-eval")) else 1
    print(task_yamls_path())
    return 0
