"""lm-eval results to files: the results JSON (lm-eval's shape), samples JSONL and a tidy CSV.

The tidy table has one row per task x metric (``task, metric, value, stderr, n, version``), which
pandas reads without help; metric names are the YAML names with lm-eval's ",none" filter suffix
removed. ``n`` is the number of items the value was computed on: the task's item count for a mean
over every item, fewer for a metric some items do not report (``known_counterfactual_acc`` counts
the known items only, ``context_preference`` the items that give exactly one answer), counted from
the samples into ``results["n-items"]`` where they were logged.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from .files import atomic_write

TIDY_COLUMNS = ("task", "metric", "value", "stderr", "n", "version")
# The keys of an lm-eval results dict that hold one entry per task or group (what belongs to one
# requested task is its members' entries under each of them).
RESULT_KEYS_BY_TASK = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                       "n-samples", "n-items", "samples", "attention")


def group_members(results: dict, name: str) -> set[str]:
    """Task or group ``name`` and every task and group under it, from ``results["group_subtasks"]``."""
    found, todo = set(), [name]
    subtasks = results.get("group_subtasks", {})
    while todo:
        t = todo.pop()
        if t not in found:
            found.add(t)
            todo += subtasks.get(t, [])
    return found


def _number(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


PREFERENCE_LABELS = ("context", "parametric")  # the items context_preference is computed on


def metric_counts(samples: list[dict]) -> dict[str, int]:
    """Per metric, the items of ``samples`` (one task's, as lm-eval logs them) that report a value:
    a number that is not NaN; for ``context_preference``, a label it counts (context or parametric
    alone)."""
    counts: dict[str, int] = {}
    for sample in samples:
        for metric in sample.get("metrics") or ():
            value = sample.get(metric)
            if metric == "context_preference":
                counted = value in PREFERENCE_LABELS
            else:
                counted = isinstance(value, (int, float)) and not math.isnan(value)
            counts[metric] = counts.get(metric, 0) + int(counted)
    return counts


def add_item_counts(results: dict) -> dict:
    """``results["n-items"][task][metric]``: the items each metric of each task was computed on,
    from the logged samples (tasks without samples are left out)."""
    counts = {task: metric_counts(samples) for task, samples in (results.get("samples") or {}).items() if samples}
    if counts:
        results.setdefault("n-items", {}).update(counts)
    return results


def tidy_rows(results: dict) -> list[dict]:
    """One row per task x metric from an lm-eval results dict (tasks and groups alike); ``n`` from
    ``n-items`` where the metric has a count, else the task's effective item count."""
    rows = []
    n_items = results.get("n-items", {})
    n_samples = results.get("n-samples", {})
    versions = results.get("versions", {})
    # lm-eval lists groups (with their aggregate metrics) under "results" too.
    for task, metrics in sorted(results.get("results", {}).items()):
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key:
                continue
            metric, _, filt = key.partition(",")
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            rows.append(
                {
                    "task": task,
                    "metric": metric if filt == "none" else f"{metric},{filt}",
                    "value": _number(value),
                    "stderr": _number(stderr),
                    "n": n_items.get(task, {}).get(metric, n_samples.get(task, {}).get("effective")),
                    "version": versions.get(task),
                }
            )
    return rows


def rows_to_csv(rows: list[dict], columns: tuple[str, ...]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return buf.getvalue().encode("utf-8")


def results_json_bytes(results: dict) -> bytes:
    from lm_eval.utils import handle_non_serializable

    clean = {k: v for k, v in results.items() if k != "samples"}
    return (json.dumps(clean, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n").encode()


EVAL_SETTINGS = "settings.json"  # the settings of the eval whose results a folder holds


def result_files(results: dict, settings: dict | None = None) -> dict[str, bytes]:
    """The files of one lm-eval result: samples_<task>.jsonl, results.csv, ``settings`` as
    settings.json where given, and results.json last."""
    from lm_eval.utils import handle_non_serializable

    files = {}
    for task, samples in (results.get("samples") or {}).items():
        lines = "".join(json.dumps(s, default=handle_non_serializable, ensure_ascii=False) + "\n" for s in samples)
        files[f"samples_{task}.jsonl"] = lines.encode("utf-8")
    files["results.csv"] = rows_to_csv(tidy_rows(results), TIDY_COLUMNS)
    if settings is not None:
        files[EVAL_SETTINGS] = (json.dumps(settings, indent=2, sort_keys=True) + "\n").encode()
    files["results.json"] = results_json_bytes(results)
    return files


def save_results(results: dict, out_dir: Path) -> Path:
    """Write one result's files into ``out_dir``, a folder of its own (the store's temp folder),
    each whole, results.json last; returns the JSON."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in result_files(results).items():
        atomic_write(out_dir / name, data)
    return out_dir / "results.json"


def land_results(results: dict, out_dir: Path, settings: dict) -> Path:
    """Write results.json, results.csv, samples_<task>.jsonl and ``settings`` (the run's settings,
    as settings.json) into ``out_dir``, a folder a user reuses (``cf-tasks eval --output_path``), as
    one set; returns the JSON. The files are staged in the folder, then land (one landing at a
    time): the old results.json goes first, the samples of an earlier run's other tasks are
    removed, the new files come in and results.json last, so that the folder never holds two runs'
    files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _land(out_dir, result_files(results, settings), "results.json", "samples_*.jsonl")
    return out_dir / "results.json"


def _land(out: Path, files: dict[str, bytes], record: str, stale: str) -> None:
    import fcntl
    import os
    import shutil

    from .files import clean_stages, stage_dir

    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another run's landing finishes first
        clean_stages(out, "results")  # of a run killed while landing
        stage = stage_dir(out, "results")
        try:
            for name, data in files.items():
                atomic_write(stage / name, data)
            (out / record).unlink(missing_ok=True)
            for old in out.glob(stale):
                if old.name not in files:
                    old.unlink()
            for name in sorted(set(files) - {record}) + [record]:
                os.replace(stage / name, out / name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    finally:
        os.close(fd)
