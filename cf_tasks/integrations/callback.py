"""``CFTasksCallback``: score each checkpoint a ``Trainer`` saves, while it trains.

At each save the callback runs ``cf-tasks sweep`` on the trainer's ``output_dir`` into a sweep output
folder (by default ``<output_dir>/cf_tasks``): in a separate process by default, so training's memory
and speed are untouched (the callback never waits for it during training; a save while it runs is
picked up by the next one), or in the trainer's process with ``in_process=True`` (training pauses while
the checkpoint is scored; no second Python process). Each finished result is then reported to the
trainer's own ``report_to`` integrations (TensorBoard, W&B, MLflow, Trackio, ...) through their
``on_log`` at the checkpoint's step, as ``eval_<task>/<metric>`` (shown as ``eval/<task>/<metric>``),
so the curves sit beside the loss; the sweep folder's ledger (``logged/``) keeps a result from being
reported twice. At the end of training the callback waits for the last checkpoint's scores.

Usage::

    from cf_tasks.integrations import CFTasksCallback

    CFTasksCallback.attach(trainer, tasks="cf_capitals,cf_world_facts", limit=100)
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

from transformers import TrainerCallback

from ..sweep import SweepConfig, run_sweep, sweep_rows
from ..trackers.backends import Tracker
from ..trackers.reporter import Reporter

METRIC_PREFIX = "eval_"  # transformers' integrations show eval_<name> as eval/<name>


class TrainerIntegrations(Tracker):
    """The trainer's ``report_to`` integrations as one tracker: ``log`` calls their ``on_log`` with
    a copy of the trainer state whose ``global_step`` is the checkpoint's step."""

    name = "trainer"

    def __init__(self, callbacks: list, args, state, control, out: Path):
        super().__init__({}, out)
        self.callbacks, self.train_args, self.state, self.control = callbacks, args, state, control

    @property
    def key(self) -> str:
        return f"trainer:{Path(self.train_args.output_dir).resolve()}:{self.train_args.run_name or ''}"

    def open(self) -> None:
        pass

    def log(self, metrics, step):
        state = copy.copy(self.state)
        state.global_step = step
        logs = {METRIC_PREFIX + k: v for k, v in metrics.items()}
        for cb in self.callbacks:
            cb.on_log(self.train_args, state, self.control, logs=dict(logs))

    def summary(self, values, step):
        pass


class CFTasksCallback(TrainerCallback):
    """Score every checkpoint the trainer saves on cf-tasks tasks; report the scores at its step.

    ``tasks``: comma-separated lm-eval tasks; ``output_path``: the sweep output folder (default
    ``<output_dir>/cf_tasks``); ``limit``: items per task; ``in_process``: score in the trainer's
    process (default: a separate ``cf-tasks sweep`` process); ``sweep_args``: more ``cf-tasks sweep``
    flags for the separate process, e.g. ``["--device", "cuda:1"]``; ``trainer``: the trainer, whose
    ``report_to`` integrations get the scores (without it, new instances of them are made);
    ``report``: set False to only score."""

    def __init__(self, tasks: str = "cf_suite", output_path: str | Path | None = None, limit: float | None = None,
                 in_process: bool = False, sweep_args: list[str] | None = None, trainer=None, report: bool = True,
                 backend: str = "hf"):
        self.tasks, self.limit, self.in_process, self.backend = tasks, limit, in_process, backend
        self.output_path = Path(output_path) if output_path else None
        self.sweep_args, self.trainer, self.report = list(sweep_args or []), trainer, report
        self.proc: subprocess.Popen | None = None
        self.pending = False  # a save came while the separate process was running
        self.integrations: list | None = None

    @classmethod
    def attach(cls, trainer, **kwargs) -> "CFTasksCallback":
        """A callback for ``trainer``, placed before its ``report_to`` integrations, so that at the end of
        training the last scores reach them before they close their runs."""
        callback = cls(trainer=trainer, **kwargs)
        trainer.callback_handler.callbacks.insert(0, callback)
        return callback

    # ------------------------------------------------------------ scoring
    def out(self, args) -> Path:
        return self.output_path or Path(args.output_dir) / "cf_tasks"

    def command(self, args) -> list[str]:
        cmd = [sys.executable, "-m", "cf_tasks.cli", "sweep", str(args.output_dir), "--tasks", self.tasks,
               "--output_path", str(self.out(args)), "--backend", self.backend, "--quiet"]
        if self.limit is not None:
            cmd += ["--limit", str(self.limit)]
        return cmd + self.sweep_args

    def score(self, args) -> None:
        if self.in_process:
            run_sweep(SweepConfig(run_dir=Path(args.output_dir), tasks=[t for t in self.tasks.split(",") if t],
                                  output_path=self.out(args), limit=self.limit, backend=self.backend, quiet=True,
                                  settle_seconds=0.0), log=lambda *a, **k: None)
            return
        if self.proc is not None and self.proc.poll() is None:
            self.pending = True  # the running sweep may start before this checkpoint: score again after it
            return
        self.pending = False
        self.proc = subprocess.Popen(self.command(args), stdin=subprocess.DEVNULL)

    def collect(self, args, state, control, wait: bool = False) -> None:
        """Report what the separate process finished (waiting for it when ``wait``); start it again
        for a save that came while it ran."""
        if self.proc is not None:
            if wait:
                self.proc.wait()
            if self.proc.poll() is None:
                return
            code, self.proc = self.proc.returncode, None
            if code not in (0, 1):  # 1: a checkpoint failed, its error is printed and the rest is stored
                print(f"cf-tasks: warning: scoring the checkpoints of {args.output_dir} ended with exit code {code}; "
                      "training goes on", file=sys.stderr)
            self.report_new(args, state, control)
            if self.pending:
                self.score(args)
                if wait:
                    self.collect(args, state, control, wait=True)

    # ------------------------------------------------------------ reporting
    def trainer_integrations(self, args) -> list:
        if self.integrations is None:
            from transformers.integrations import get_reporting_integration_callbacks

            classes = tuple(get_reporting_integration_callbacks(args.report_to))
            if self.trainer is not None:
                self.integrations = [cb for cb in self.trainer.callback_handler.callbacks if isinstance(cb, classes)]
            else:
                self.integrations = [cls() for cls in classes]
        return self.integrations

    def report_new(self, args, state, control) -> None:
        out = self.out(args)
        if not self.report or not (out / "store").is_dir():
            return
        integrations = self.trainer_integrations(args)
        if not integrations:
            return
        reporter = Reporter({}, out)
        reporter.trackers = [TrainerIntegrations(integrations, args, state, control, out)]
        reporter.log_rows(sweep_rows(out))

    # ------------------------------------------------------------ the trainer's events
    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.collect(args, state, control)
        self.score(args)
        if self.in_process:
            self.report_new(args, state, control)

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.proc is not None:
            self.collect(args, state, control)

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.collect(args, state, control, wait=True)
        if not self.in_process:
            self.score(args)  # a checkpoint saved at the very end: scored before the trainer closes its trackers
            self.collect(args, state, control, wait=True)
