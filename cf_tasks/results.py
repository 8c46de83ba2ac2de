"""lm-eval results to files: the results JSON (lm-eval's shape), samples JSONL and a tidy CSV.

The tidy table has one row per task x metric (``task, metric, value, stderr, n, version``), which
pandas reads without help; metric names are the YAML names with lm-eval's ",none" filter suffix
removed.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from .files import atomic_write

TIDY_COLUMNS = ("task", "metric", "value", "stderr", "n", "version")


def _number(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def tidy_rows(results: dict) -> list[dict]:
    """One row per task x metric from an lm-eval results dict (tasks and groups alike)."""
    rows = []
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
                    "n": n_samples.get(task, {}).get("effective"),
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


def save_results(results: dict, out_dir: Path) -> Path:
    """Write results.json, results.csv and samples_<task>.jsonl into ``out_dir``; returns the JSON."""
    from lm_eval.utils import handle_non_serializable

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for task, samples in (results.get("samples") or {}).items():
        lines = "".join(json.dumps(s, default=handle_non_serializable, ensure_ascii=False) + "\n" for s in samples)
        atomic_write(out_dir / f"samples_{task}.jsonl", lines.encode("utf-8"))
    atomic_write(out_dir / "results.csv", rows_to_csv(tidy_rows(results), TIDY_COLUMNS))
    path = out_dir / "results.json"
    atomic_write(path, results_json_bytes(results))
    return path
