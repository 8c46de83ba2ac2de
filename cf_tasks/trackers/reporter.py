"""The ``Reporter``: sweep rows (or one ``cf-tasks eval``'s rows) into the trackers, each result once.

The ledger is a folder per tracker run under the output folder's ``logged/``, with one file per
logged result (checkpoint content, task, settings), created with O_EXCL before the result is
logged: of two processes (shards, a rerun) only one logs it. A log that fails removes its file
again, so the next sweep logs it; the tracker is then left out for the rest of the run with one
warning, and no scored result is touched (they live in the store, apart from the ledger)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from . import LOGGED_METRICS, SUMMARY_FIELDS
from .backends import ADAPTERS, TrackerError, write_key_note

LEDGER = "logged"
# How a sweep names another run of each tracker than the output folder's own.
OTHER_RUN = {"tensorboard": "--report_args tensorboard.log_dir=DIR", "wandb": "--report_args wandb.id=NEW_ID",
             "mlflow": "--report_args mlflow.experiment_name=NAME", "trackio": "--report_args trackio.run_name=NAME"}
# Environment variables that may hold a secret: a warning that quotes one shows *** instead.
SECRET_VARIABLES = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MLFLOW_TRACKING_TOKEN",
                    "MLFLOW_TRACKING_PASSWORD", "DATABRICKS_TOKEN")


def redact(text: str) -> str:
    for name in SECRET_VARIABLES:
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def metric_name(task: str, metric: str) -> str:
    return f"{task}/{metric}"


def points(rows: list[dict], settings: set[str] | None = None) -> dict[tuple, dict]:
    """{(checkpoint id, task, settings): {"step": step, "metrics": {name: value}}} from sweep rows: the
    logged metrics of the rows with a step (of ``settings`` only, when given)."""
    found: dict[tuple, dict] = {}
    for r in rows:
        if r.get("step") is None or r.get("value") is None or r["metric"] not in LOGGED_METRICS:
            continue
        if settings is not None and r.get("settings") not in settings:
            continue
        key = (r.get("checkpoint_id") or r["checkpoint"], r["task"], r.get("settings") or "")
        entry = found.setdefault(key, {"step": int(r["step"]), "metrics": {}})
        entry["metrics"][metric_name(r["task"], r["metric"])] = float(r["value"])
    return found


def summary_values(summary: dict) -> dict[str, object]:
    """The summary's verdicts, flat: ``<series>/<field>``."""
    values = {}
    for series, s in sorted(summary.items()):
        for field in SUMMARY_FIELDS:
            if s.get(field) is not None and s.get(field) != "":
                values[f"{series}/{field}"] = s[field]
    return values


class Reporter:
    """The trackers of one command: opened on first use, each result logged once per tracker run."""

    def __init__(self, trackers: dict[str, dict], out: Path | None, log=print):
        self.out, self.log_line = (Path(out) if out else None), log
        self.trackers = [ADAPTERS[name](args, self.out) for name, args in trackers.items()]
        self.opened: set[str] = set()
        self.dropped: set[str] = set()
        self.logged = 0

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _warn(self, tracker, doing: str, err: Exception) -> None:
        reason = redact(" ".join(str(err).split())[:300]) or type(err).__name__
        self.log_line(f"cf-tasks: warning: {tracker.name}: {doing} failed ({type(err).__name__}: {reason}); "
                      "the scored results are kept, and the next run logs what was not logged", file=sys.stderr)
        self.dropped.add(tracker.name)

    def _ready(self, tracker) -> bool:
        if tracker.name in self.dropped:
            return False
        if tracker.name not in self.opened:
            try:
                tracker.open()
            except Exception as err:  # an unreachable server, a wrong run id, a broken install
                self._warn(tracker, "opening its run", err)
                return False
            self.opened.add(tracker.name)
        return True

    def _ledger(self, tracker) -> Path | None:
        if self.out is None:
            return None
        folder = self.out / LEDGER / _digest(tracker.key)
        if not (folder / "run.json").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            write_key_note(folder, tracker.key)
        return folder

    def _claim(self, folder: Path | None, name: str) -> Path | None | bool:
        """Create the ledger file ``name``: its path, None without a ledger, False when it exists."""
        if folder is None:
            return None
        path = folder / f"{name}.json"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False
        os.close(fd)
        return path

    def check_settings(self, hashes: dict[str, str]) -> None:
        """Refuse (one line, before any model loads) a tracker run whose ledger holds one of these tasks
        scored under other settings (a rerun with another --limit, say): its curve would mix both
        settings' points at the same steps. ``hashes``: {task: settings hash} of this sweep."""
        if self.out is None:
            return
        for tracker in self.trackers:
            folder = self.out / LEDGER / _digest(tracker.key)
            for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
                if path.name == "run.json" or path.name.startswith("summary-"):
                    continue
                try:
                    entry = json.loads(path.read_text())
                except (OSError, ValueError):  # a claim whose point is being logged: written once logged
                    continue
                task, used = entry.get("task"), entry.get("settings")
                if task in hashes and used and used != hashes[task]:
                    other = OTHER_RUN.get(tracker.name, "--report_args")
                    raise TrackerError(
                        f"--report_to {tracker.name}: its run already holds {task} scored under other settings "
                        f"({used} in sweep.csv's settings column; this sweep's are {hashes[task]}), and one curve "
                        f"would mix both; log into another run ({other}) or sweep into another --output_path")

    def log_rows(self, rows: list[dict], settings: set[str] | None = None) -> int:
        """Log each result of ``rows`` not yet logged to each tracker; returns the points logged."""
        found = points(rows, settings)
        count = 0
        for tracker in self.trackers:
            if tracker.name in self.dropped:
                continue
            try:
                folder = self._ledger(tracker)
            except OSError as err:
                self._warn(tracker, "writing its ledger", err)
                continue
            for key, entry in sorted(found.items(), key=lambda kv: kv[1]["step"]):
                claim = self._claim(folder, _digest("|".join(key)))
                if claim is False:
                    continue
                if not self._ready(tracker):
                    if claim:
                        claim.unlink(missing_ok=True)
                    break
                try:
                    tracker.log(entry["metrics"], entry["step"])
                except Exception as err:
                    if claim:
                        claim.unlink(missing_ok=True)
                    self._warn(tracker, "logging", err)
                    break
                if claim:
                    claim.write_text(json.dumps({"checkpoint_id": key[0], "task": key[1], "settings": key[2],
                                                 "step": entry["step"]}) + "\n")
                count += 1
        self.logged += count
        return count

    def log_summary(self, summary: dict, step: int) -> None:
        """The summary's verdicts, once per distinct summary and tracker run."""
        values = summary_values(summary)
        if not values:
            return
        name = "summary-" + _digest(json.dumps(values, sort_keys=True, default=str))
        for tracker in self.trackers:
            if tracker.name in self.dropped:
                continue
            try:
                claim = self._claim(self._ledger(tracker), name)
            except OSError as err:
                self._warn(tracker, "writing its ledger", err)
                continue
            if claim is False or not self._ready(tracker):
                continue
            try:
                tracker.summary(values, step)
            except Exception as err:
                if claim:
                    claim.unlink(missing_ok=True)
                self._warn(tracker, "writing the summary", err)

    def close(self) -> None:
        for tracker in self.trackers:
            if tracker.name in self.opened:
                try:
                    tracker.close()
                except Exception as err:
                    self._warn(tracker, "closing its run", err)


def report_eval(trackers: dict[str, dict], rows: list[dict], log=print) -> int:
    """``cf-tasks eval --report_to``: its rows at ``step`` (``--report_args step=N``, default 0)."""
    count = 0
    for name, args in trackers.items():
        step = int(args.pop("step", 0))
        reporter = Reporter({name: args}, None, log)
        count += reporter.log_rows([{**r, "step": step, "checkpoint": "eval"} for r in rows])
        reporter.close()
    return count
