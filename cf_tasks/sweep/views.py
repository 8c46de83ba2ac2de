"""Views rebuilt from the store: sweep.csv, sweep.json, manifest.json, checkpoints/<name>/, the plot
and the per-series summary (summary.csv, tested in ``stats``); and ``report``, which merges the views
of several output folders (and writes items.csv on request)."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from pathlib import Path

from ..files import atomic_write, tmp_name
from ..known import AGREE_METRIC, agree_twin
from ..results import TIDY_COLUMNS, rows_to_csv, tidy_rows
from . import store
from .config import SweepError
from .stats import ALPHA, ITEM_COLUMNS, SUMMARY_COLUMNS, format_summary, item_rows, summarize
from .model_args import model_args_string
from .store import _merge_results

SWEEP_COLUMNS = ("checkpoint", "step", "task", "metric", "value", "stderr", "n", "backend", "model", "version",
                 "run", "settings", "limit", "apply_chat_template", "metadata", "model_args", "checkpoint_id")
MANIFEST = "manifest.json"
SUMMARY = "summary.csv"
ITEMS = "items.csv"
# The knowledge probe's lines: the colour of the metric they condition, a line style of their own.
KNOWN_STYLES = {"known_counterfactual_acc": {"color": "tab:blue", "linestyle": "--", "marker": "s"},
                "known_parametric_acc": {"color": "tab:orange", "linestyle": "--", "marker": "s"},
                "unknown_counterfactual_acc": {"color": "tab:blue", "linestyle": ":", "marker": "x"}}
AGREE_STYLE = {"color": "tab:purple", "linestyle": "-", "marker": "^"}


def _current(out: Path) -> tuple[list[tuple[dict, list[dict]]], list[dict]]:
    """Each checkpoint place with its current content's records (newest per task and settings),
    and the failures."""
    records, places = store.read_store(out)
    newest: dict[str, dict] = {}
    for place in places:
        if place["place"] not in newest or place["seen"] > newest[place["place"]]["seen"]:
            newest[place["place"]] = place
    by_id: dict[str, list[dict]] = {}
    for record in records:
        by_id.setdefault(record["id"], []).append(record)
    current = [(place, sorted(by_id.get(place["id"], []), key=lambda r: (r["task"], r["settings_hash"])))
               for place in newest.values()]
    current.sort(key=lambda pr: (pr[0]["step"], pr[0]["name"], pr[0]["run"]))
    return current, store.read_failures(out)


def _row_settings(record: dict) -> dict:
    s = record["settings"]
    return {"settings": record["settings_hash"], "limit": s.get("limit"), "apply_chat_template": s.get("apply_chat_template"),
            "metadata": json.dumps(s["metadata"], sort_keys=True) if s.get("metadata") else None,
            "model_args": model_args_string(s.get("model_args"))}


def sweep_rows(out: Path) -> list[dict]:
    rows = []
    for place, records in _current(out)[0]:
        for record in records:
            results = json.loads((Path(record["dir"]) / "results.json").read_text())
            for row in tidy_rows(results):
                rows.append({"checkpoint": place["name"], "step": place["step"], "backend": record["settings"]["backend"],
                             "model": place["model"], **row, "run": place["run"], **_row_settings(record),
                             "checkpoint_id": record["id"]})
    rows.sort(key=_row_order)
    return rows


def _row_order(r: dict):
    return (r["step"], r["checkpoint"], r.get("run") or "", r["task"], r["metric"], r.get("settings") or "")


def _view_names(current) -> dict[str, str]:
    """The folder name under checkpoints/ per place: the checkpoint's name, qualified by its run
    folder when two runs have a checkpoint of that name."""
    by_name: dict[str, list[dict]] = {}
    for place, _ in current:
        by_name.setdefault(place["name"], []).append(place)
    names = {}
    for name, places in by_name.items():
        for place in places:
            names[place["place"]] = name if len(places) == 1 else \
                f"{name}@{Path(place['run']).name}-{store.place_hash(place['run'])[:6]}"
    return names


def _write_checkpoint_view(out: Path, name: str, records: list[dict]) -> None:
    """checkpoints/<name>/: the checkpoint's newest result per task (merged results.json, the
    samples files linked from the store). Rebuilt only when its sources changed."""
    parent = out / "checkpoints"
    parent.mkdir(exist_ok=True)
    latest: dict[str, dict] = {}
    for record in records:
        if record["task"] not in latest or record["finished"] > latest[record["task"]]["finished"]:
            latest[record["task"]] = record
    sources = sorted(r["dir"] for r in latest.values())
    final = parent / name
    marker = final / "sources.json"
    try:
        if json.loads(marker.read_text()) == sources:
            return
    except (OSError, json.JSONDecodeError):
        pass
    tmp = parent / tmp_name(name)
    tmp.mkdir()
    parts = []
    for src in map(Path, sources):
        parts.append(json.loads((src / "results.json").read_text()))
        for f in src.glob("samples_*.jsonl"):
            try:
                os.link(f, tmp / f.name)
            except OSError:
                shutil.copyfile(f, tmp / f.name)
    merged = _merge_results(parts)
    (tmp / "results.json").write_bytes((json.dumps(merged, indent=2, ensure_ascii=False) + "\n").encode())
    (tmp / "results.csv").write_bytes(rows_to_csv(tidy_rows(merged), TIDY_COLUMNS))
    (tmp / "sources.json").write_text(json.dumps(sources, indent=2) + "\n")
    if final.exists():
        aside = parent / tmp_name(name)
        final.rename(aside)
        tmp.rename(final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        tmp.rename(final)


def rebuild_views(out: Path, alpha: float = ALPHA) -> dict:
    """sweep.csv, sweep.json, inversion.png, manifest.json and checkpoints/<name>/, all from the
    store, under the views lock (so that an older rebuild never lands last)."""
    with store.views_lock(out):
        current, failures = _current(out)
        names = _view_names(current)
        manifest: dict = {"checkpoints": {}}
        for place, records in current:
            entry = {k: place[k] for k in ("name", "step", "path", "run", "kind", "mtime", "model")}
            entry.update(id=place["id"], backend=records[0]["settings"]["backend"] if records else None,
                         tasks={r["task"]: r["settings_hash"] for r in records},
                         task_versions={k: v for r in records for k, v in r["settings"]["versions"].items()},
                         seconds=round(sum(r.get("seconds", 0.0) for r in records), 2))
            if records:
                _write_checkpoint_view(out, names[place["place"]], records)
                entry.update(status="done", results=f"checkpoints/{names[place['place']]}")
            manifest["checkpoints"][place["place"]] = entry
        for failure in failures:
            entry = manifest["checkpoints"].setdefault(failure["place"], {
                k: failure.get(k) for k in ("name", "step", "path", "run", "kind", "mtime", "model")})
            entry.update(status="failed", error=failure["error"])
        for folder in (out / "checkpoints").glob("*") if (out / "checkpoints").is_dir() else ():
            if folder.name not in names.values() and (folder / "sources.json").is_file():
                shutil.rmtree(folder, ignore_errors=True)  # a view folder whose checkpoint left the view
        store.write_json(out / MANIFEST, manifest)
        rows = sweep_rows(out)
        fails = [{"checkpoint": f["name"], "path": f["path"], "run": f.get("run"), "error": f["error"]} for f in failures]
        return write_outputs(out, rows, fails, stores=[out], alpha=alpha)


def write_outputs(out: Path, rows: list[dict], failures: list[dict], settings: dict | None = None, *,
                  stores: list[Path] = (), alpha: float = ALPHA) -> dict:
    """sweep.csv, sweep.json, inversion.png and the per-series summary (summary.csv, with the paired
    tests on the samples kept in the stores of ``stores``), from the rows."""
    label_series(rows)
    summary = summarize(rows, stores, alpha)
    atomic_write(out / "sweep.csv", rows_to_csv(rows, SWEEP_COLUMNS))
    atomic_write(out / SUMMARY, rows_to_csv(list(summary.values()), SUMMARY_COLUMNS))
    # the stores the samples came from: a later report of a merged folder finds them again
    payload = {"rows": rows, "summary": summary, "failures": failures,
               "stores": list(dict.fromkeys(str(Path(s).resolve()) for s in stores))}
    atomic_write(out / "sweep.json", (json.dumps(payload, indent=2) + "\n").encode())
    if rows:
        plot(rows, out / "inversion.png")
    return summary


def label_series(rows: list[dict]) -> None:
    """Give each row its ``series``: the task, qualified by run folder and settings when the task
    has rows of more than one, so that rows of different settings or runs never share a curve."""
    kinds: dict[str, set] = {}
    for r in rows:
        kinds.setdefault(r["task"], set()).add((r.get("run") or "", r.get("settings") or ""))
    runs = {r.get("run") or "" for r in rows}
    for r in rows:
        label = r["task"]
        if len(kinds[r["task"]]) > 1:
            if len({k[0] for k in kinds[r["task"]]}) > 1 or len(runs) > 1:
                label += f" [{Path(r.get('run') or '?').name}]"
            if len({k[1] for k in kinds[r["task"]]}) > 1:
                label += f" [settings {r.get('settings') or '?'}]"
        r["series"] = label


def _series(rows: list[dict], series: str, metric: str) -> list[tuple[int, float, float]]:
    pts = [(r["step"], r["value"], r["stderr"] or 0.0) for r in rows
           if r.get("series", r["task"]) == series and r["metric"] == metric and r["value"] is not None]
    return sorted(pts)


def plot(rows: list[dict], path: Path) -> None:
    """One panel per cf task series: counterfactual and parametric accuracy against step; standard
    tasks' accuracy on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def key(r):
        return r.get("series", r["task"])

    agree_tasks = {r["task"] for r in rows if r["metric"] == AGREE_METRIC}
    cf_series = sorted({key(r) for r in rows if r["metric"] == "counterfactual_acc" and r["task"] not in agree_tasks})
    cf_tasks = {r["task"] for r in rows if r["metric"] == "context_prob"}
    standard = sorted({key(r) for r in rows if r["metric"] in ("acc", "exact_match") and r["task"] not in cf_tasks})
    panels: list[str | None] = list(cf_series) or [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, series in zip(axes[0], panels):
        if series is not None:
            for metric, color in (("counterfactual_acc", "tab:blue"), ("parametric_acc", "tab:orange")):
                pts = _series(rows, series, metric)
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                            marker="o", color=color, label=metric, capsize=2)
            # Known items (the knowledge probe) in their own line style; the agreeing twin in its own colour.
            lines = [(series, metric, style) for metric, style in KNOWN_STYLES.items()]
            lines += [(twin, AGREE_METRIC, AGREE_STYLE) for twin in _twin_series(rows, series, agree_tasks)]
            for name, metric, style in lines:
                pts = _series(rows, name, metric)
                if pts:
                    ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], capsize=2,
                                label=metric if name == series else f"{name} {metric}", **style)
            ax.set_title(series, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        if standard:
            ax2 = ax.twinx()
            for std in standard:
                metric = "acc" if any(key(r) == std and r["metric"] == "acc" for r in rows) else "exact_match"
                pts = _series(rows, std, metric)
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], "--", color="tab:green", label=f"{std} {metric}")
            ax2.set_ylabel("in-distribution accuracy")
            ax2.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("accuracy")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(loc="best", fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    try:
        fig.savefig(png, dpi=110, format="png")
    finally:
        plt.close(fig)
    atomic_write(path, png.getvalue())



def _twin_series(rows: list[dict], series: str, agree_tasks: set[str]) -> list[str]:
    """The series of a knowledge-conflict series' agreeing twin: the twin task's rows of the same
    run folder, limit, chat template and metadata."""
    mine = next(r for r in rows if r.get("series", r["task"]) == series)
    twin = agree_twin(mine["task"], agree_tasks)
    same = ("run", "limit", "apply_chat_template", "metadata")
    return sorted({r.get("series", r["task"]) for r in rows if r["task"] == twin and r["metric"] == AGREE_METRIC
                   and all(r.get(k) == mine.get(k) for k in same)})


def _read_sweep_json(path: Path) -> dict:
    if not path.is_file():
        raise SweepError(f"{path}: no sweep.json; pass folders written by cf-tasks sweep")
    try:
        data = json.loads(path.read_text())
        rows = data["rows"]
        if not isinstance(rows, list) or not all(isinstance(r, dict) and {"checkpoint", "step", "task", "metric"} <= r.keys()
                                                 for r in rows):
            raise TypeError
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise SweepError(f"{path}: not a valid sweep.json (malformed or cut short); re-run cf-tasks sweep for that "
                         "output to rebuild it") from None
    return data


def _output_rows(out: Path) -> tuple[list[dict], list[dict], list[Path]]:
    """An output folder's rows, failures and the stores its samples are in: rebuilt from its own
    store, or read from its sweep.json (which lists the stores its rows came from)."""
    if (out / store.STORE).is_dir():
        fails = [{"checkpoint": f["name"], "path": f["path"], "run": f.get("run"), "error": f["error"]}
                 for f in store.read_failures(out)]
        return sweep_rows(out), fails, [out]
    data = _read_sweep_json(out / "sweep.json")
    return data["rows"], data.get("failures", []), [out] + [Path(p) for p in data.get("stores", []) if isinstance(p, str)]


def report(outs: list[Path], target: Path, log=print, alpha: float = ALPHA, items: bool = False) -> dict:
    """Merge sweep outputs (shards, other machines) into ``target`` and redraw the plot. The same
    result seen in two outputs counts once; one checkpoint scored from different contents is
    refused; a task with rows of several settings is split into one series per settings. The
    summary's paired tests read the samples in the stores; ``items`` also writes items.csv.

    Outputs with a store are merged store into store (``target`` gets every result it lacks, and
    its views are rebuilt from its store, so it can be resumed or merged again); outputs of an
    earlier version (a sweep.json only) are merged row by row."""
    outs = [Path(o) for o in outs]
    target = Path(target)
    checked = outs + ([target] if (target / store.STORE).is_dir() and target.resolve() not in
                      {o.resolve() for o in outs} else [])
    rows, failures, seen, stores = [], [], {}, []
    for out in checked:
        if not out.is_dir():
            raise SweepError(f"{out}: not a folder; pass folders written by cf-tasks sweep")
        out_rows, out_failures, out_stores = _output_rows(out)
        stores += out_stores
        for row in out_rows:
            row = {k: v for k, v in row.items() if k != "series"}
            where = (row.get("run"), row["checkpoint"], row["step"], row["task"], row["metric"], row.get("settings"))
            if where in seen:
                other, first_out = seen[where]
                if other.get("checkpoint_id") != row.get("checkpoint_id") or other.get("value") != row.get("value"):
                    raise SweepError(f"{row['checkpoint']} (step {row['step']}) has different results for {row['task']} "
                                     f"under the same settings in {first_out} and {out} (re-saved between the sweeps?); "
                                     "re-sweep one of them")
                continue
            seen[where] = (row, out)
            rows.append(row)
        failures += out_failures
    split = sorted({r["task"] for r in rows if len({x.get("settings") for x in rows if x["task"] == r["task"]}) > 1})
    if split:
        log(f"cf-tasks: {', '.join(split)}: rows under different evaluation settings (limit, metadata, chat template, "
            "model args, task version, ...); drawn as one series per settings", file=sys.stderr)
    target.mkdir(parents=True, exist_ok=True)
    if all((out / store.STORE).is_dir() for out in outs):
        for out in outs:
            store.merge_store(out, target)
        summary = rebuild_views(target, alpha=alpha)
        rows, stores = sweep_rows(target), [target]
    else:
        rows.sort(key=_row_order)
        summary = write_outputs(target, rows, failures, stores=stores, alpha=alpha)
    if summary:
        log(format_summary(summary))
    if items:
        found = item_rows(rows, stores)
        atomic_write(target / ITEMS, rows_to_csv(found, ITEM_COLUMNS))
        log(f"cf-tasks: {len(found)} item rows written to {target / ITEMS}", file=sys.stderr)
    return summary
