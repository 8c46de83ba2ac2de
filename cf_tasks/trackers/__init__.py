"""Experiment trackers (``--report_to``): each scored checkpoint's metrics at its training step, in
TensorBoard, Weights & Biases, MLflow or Trackio, beside the trainer's own curves.

``--report_to`` names the trackers as transformers' ``TrainingArguments.report_to`` does
(comma-separated; ``none`` by default); ``--report_args`` passes each one's run: ``key=value`` pairs,
a key either plain (``project``, ``run_name``: every tracker) or ``<tracker>.<key>`` (one tracker).
Both are checked before any model loads (one line, exit 2): a tracker that is not installed names
the extra that installs it.

``backends``: one adapter per tracker (open, log at a step, summary, close). ``reporter``: the
``Reporter`` the sweep and ``cf-tasks eval`` call, with its ledger (what was logged where, in the
output folder's ``logged/``), so that a rerun or a second shard never logs a checkpoint twice.
"""

from __future__ import annotations

import importlib.util

from .backends import ADAPTERS, TrackerError

# What each tracker needs installed: the module it imports, and the extra of cf-tasks that installs it.
TRACKERS = {
    "tensorboard": {"module": "tensorboard", "extra": "tensorboard"},
    "wandb": {"module": "wandb", "extra": "wandb"},
    "mlflow": {"module": "mlflow", "extra": "mlflow"},
    "trackio": {"module": "trackio", "extra": "trackio"},
}
# The --report_args keys each tracker reads; "project" and "run_name" apply to every tracker.
COMMON_KEYS = ("project", "run_name")
TRACKER_KEYS = {
    "tensorboard": ("log_dir",),
    "wandb": ("project", "run_name", "entity", "id", "mode", "dir", "group"),
    "mlflow": ("project", "run_name", "tracking_uri", "experiment_name", "run_id"),  # project: the experiment
    "trackio": ("project", "run_name"),
}
EVAL_KEYS = ("step",)  # cf-tasks eval only: the step its results are logged at (default 0)
# The metrics logged per task (where the task has them), named as in sweep.csv.
LOGGED_METRICS = (
    "counterfactual_acc", "parametric_acc", "known_rate", "known_counterfactual_acc", "known_parametric_acc",
    "unknown_counterfactual_acc", "agree_acc", "context_attention",
    "context_prob", "acc", "exact_match",  # multiple-choice tasks' and standard benchmarks' curves
)
# The summary's columns logged at the end, per series.
SUMMARY_FIELDS = ("verdict", "inversion", "peak_step", "peak", "final", "rise", "drop", "p_inversion", "p_holm")
REPORT_TO_HELP = ("experiment trackers to log each checkpoint's metrics to, at its training step, comma-separated: "
                  "tensorboard, wandb, mlflow, trackio, all, or none")
REPORT_ARGS_HELP = ("the trackers' run, as key=value pairs: project, run_name (every tracker), or "
                    "<tracker>.<key>: tensorboard.log_dir, wandb.{entity,id,mode,dir,group} (id joins that run), "
                    "mlflow.{tracking_uri,experiment_name,run_id} (run_id joins that run)")


def parse_report_to(text: str | None) -> list[str]:
    """``--report_to``: the tracker names, in a fixed order; ``none`` (or nothing) is no tracker."""
    names = [t.strip().lower() for t in (text or "none").split(",") if t.strip()]
    if names == ["none"] or not names:
        return []
    if "all" in names:
        return list(TRACKERS)
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or "none" in names:
        bad = ", ".join(unknown) or "none together with a tracker"
        raise TrackerError(f"--report_to {text}: {bad} is not a tracker; choose from {', '.join(TRACKERS)}, all or none")
    return [n for n in TRACKERS if n in names]


def missing_extra(name: str) -> str | None:
    """The install line for a tracker whose package is missing; None when it is installed."""
    if importlib.util.find_spec(TRACKERS[name]["module"]) is None:
        return f"pip install 'cf-tasks[{TRACKERS[name]['extra']}]'"
    return None


def parse_report_args(text: str | None, trackers: list[str], eval_keys: bool = False) -> dict[str, dict[str, str]]:
    """``--report_args``: {tracker: {key: value}} for the trackers of ``--report_to``."""
    pairs: dict[str, dict[str, str]] = {name: {} for name in trackers}
    if not text:
        return pairs
    if not trackers:
        raise TrackerError("--report_args without --report_to; name the trackers with --report_to, e.g. "
                           "--report_to tensorboard")
    common = COMMON_KEYS + (EVAL_KEYS if eval_keys else ())
    seen: set[str] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise TrackerError(f"--report_args: {part!r} is not key=value; pass e.g. project=my-run,wandb.mode=offline")
        if key in seen:  # one of the values would be dropped without a word
            raise TrackerError(f"--report_args: {key} is given twice; pass each key once")
        seen.add(key)
        tracker, dot, name = key.rpartition(".")
        if not dot:
            if key not in common:
                raise TrackerError(f"--report_args: {key} is not a key for every tracker ({', '.join(common)}); "
                                   "prefix it with its tracker, e.g. mlflow.run_id=...")
            for t in trackers:
                if key in TRACKER_KEYS[t] or key in EVAL_KEYS:
                    pairs[t].setdefault(key, value)
            continue
        if tracker not in TRACKERS:
            raise TrackerError(f"--report_args: {key}: {tracker} is not a tracker; prefix a key with one of "
                               f"{', '.join(TRACKERS)}")
        if tracker not in trackers:
            raise TrackerError(f"--report_args: {key} is for {tracker}, which --report_to does not name; add it to "
                               "--report_to or drop the key")
        if name not in TRACKER_KEYS[tracker]:
            raise TrackerError(f"--report_args: {key} is not a {tracker} key; {tracker} reads "
                               f"{', '.join(TRACKER_KEYS[tracker])}")
        pairs[tracker][name] = value  # a tracker's own key wins over a plain one
    if eval_keys:
        for t in trackers:
            if "step" in pairs[t] and not pairs[t]["step"].isdigit():
                raise TrackerError(f"--report_args step={pairs[t]['step']}: must be a whole number of steps")
    return pairs


def check(report_to: str | None, report_args: str | None, eval_keys: bool = False,
          out=None) -> dict[str, dict[str, str]]:
    """``--report_to`` and ``--report_args`` checked before any model loads: {tracker: its arguments}.
    ``out``: the output folder, where a tracker keeps its run by default."""
    trackers = parse_report_to(report_to)
    for name in trackers:
        line = missing_extra(name)
        if line:
            raise TrackerError(f"--report_to {name}: the {TRACKERS[name]['module']} package is not installed; {line}")
    pairs = parse_report_args(report_args, trackers, eval_keys)
    for name, args in pairs.items():
        ADAPTERS[name]({k: v for k, v in args.items() if k not in EVAL_KEYS}, out).check()
    return pairs


def add_arguments(parser) -> None:
    """``--report_to`` and ``--report_args`` on a command's parser."""
    parser.add_argument("--report_to", default="none", help=REPORT_TO_HELP)
    parser.add_argument("--report_args", default=None, help=REPORT_ARGS_HELP)
