"""Views rebuilt from the store: sweep.csv, sweep.json, manifest.json, checkpoints/<name>/, the plot
and the per-series summary (summary.csv, tested in ``stats``); and ``report``, which merges the views
of several output folders (and writes items.csv on request)."""

from __future__ import annotations

import io
import json
import textwrap
import shutil
import sys
from pathlib import Path

from ..files import atomic_write, tmp_name, tmp_owner
from ..known import AGREE_METRIC, agree_twin
from ..results import TIDY_COLUMNS, add_item_counts, rows_to_csv, tidy_rows
from . import locks, store
from .config import LOCK_TIMEOUT, SweepError
from .stats import (ALPHA, ITEM_COLUMNS, SUMMARY_COLUMNS, check_peak_step, check_primary, format_summary, item_rows,
                    summarize)
from .ushape import wilson_interval
from .model_args import model_args_string
from .rescore import SCORER_KEY, read_samples, without_scorer
from .store import merge_results

SWEEP_COLUMNS = ("checkpoint", "step", "task", "metric", "value", "stderr", "n", "backend", "model", "version",
                 "scorer_version", "run", "settings", "limit", "apply_chat_template", "metadata", "model_args",
                 "checkpoint_id")
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
    for record in _latest_scorer(records):
        by_id.setdefault(record["id"], []).append(record)
    current = [(place, sorted(by_id.get(place["id"], []), key=lambda r: (r["task"], r["settings_hash"])))
               for place in newest.values()]
    current.sort(key=lambda pr: (pr[0]["step"], pr[0]["name"], pr[0]["run"]))
    return current, store.read_failures(out)


def _latest_scorer(records: list[dict]) -> list[dict]:
    """The records less those superseded by a result of the same checkpoint, task and settings
    scored by a later scorer version (a rescored result replaces the old one in the views; the
    store keeps both)."""
    def version(r):
        return (r["settings"] or {}).get(SCORER_KEY) or 0

    best: dict[tuple, int] = {}
    keys = []
    for r in records:
        key = (r["id"], r["task"], json.dumps(without_scorer(r["settings"] or {}), sort_keys=True, default=str))
        keys.append(key)
        best[key] = max(best.get(key, 0), version(r))
    return [r for r, key in zip(records, keys) if version(r) == best[key]]


def _row_settings(record: dict) -> dict:
    s = record["settings"]
    return {"settings": record["settings_hash"], "scorer_version": s.get(SCORER_KEY), "limit": s.get("limit"),
            "apply_chat_template": s.get("apply_chat_template"),
            "metadata": json.dumps(s["metadata"], sort_keys=True) if s.get("metadata") else None,
            "model_args": model_args_string(s.get("model_args"))}


def sweep_rows(out: Path) -> list[dict]:
    rows = []
    for place, records in _current(out)[0]:
        for record in records:
            results = json.loads((Path(record["dir"]) / "results.json").read_text())
            if "n-items" not in results:  # stored before the counts were kept: count from the samples
                results["samples"] = read_samples(Path(record["dir"]))
                add_item_counts(results)
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
    samples files copied from the store: contents only, so that editing the view never changes a
    stored result). Rebuilt only when its sources changed."""
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
        if json.loads(marker.read_text()) == sources and all(f.stat().st_nlink == 1 for f in final.iterdir()):
            return  # up to date (a view of an older cf-tasks with links into the store is rebuilt)
    except (OSError, json.JSONDecodeError):
        pass
    tmp = parent / tmp_name(name)
    tmp.mkdir()
    try:
        parts = []
        for src in map(Path, sources):
            parts.append(json.loads((src / "results.json").read_text()))
            for f in src.glob("samples_*.jsonl"):
                shutil.copyfile(f, tmp / f.name)
        merged = merge_results(parts)
        (tmp / "results.json").write_bytes((json.dumps(merged, indent=2, ensure_ascii=False) + "\n").encode())
        (tmp / "results.csv").write_bytes(rows_to_csv(tidy_rows(merged), TIDY_COLUMNS))
        (tmp / "sources.json").write_text(json.dumps(sources, indent=2) + "\n")
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError) and err.filename is None:  # a write on an open file names no path:
            err.filename = str(tmp)  # the view's folder is named in the one-line error
        raise
    if final.exists():
        aside = parent / tmp_name(name)
        final.rename(aside)
        tmp.rename(final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        tmp.rename(final)


def rebuild_views(out: Path, alpha: float = ALPHA, peak_step: int | None = None, primary=()) -> dict:
    """sweep.csv, sweep.json, inversion.png, manifest.json and checkpoints/<name>/, all from the
    store, under the views lock (so that an older rebuild never lands last)."""
    with locks.views_lock(out):
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
            if folder.name not in names.values() and not tmp_owner(folder.name) and (folder / "sources.json").is_file():
                shutil.rmtree(folder, ignore_errors=True)  # a view folder whose checkpoint left the view
        store.write_json(out / MANIFEST, manifest)
        rows = sweep_rows(out)
        fails = [{"checkpoint": f["name"], "path": f["path"], "run": f.get("run"), "error": f["error"]} for f in failures]
        return write_outputs(out, rows, fails, stores=[out], alpha=alpha, peak_step=peak_step, primary=primary)


def write_outputs(out: Path, rows: list[dict], failures: list[dict], settings: dict | None = None, *,
                  stores: list[Path] = (), alpha: float = ALPHA, peak_step: int | None = None, primary=()) -> dict:
    """sweep.csv, sweep.json, inversion.png and the per-series summary (summary.csv, with the paired
    tests on the samples kept in the stores of ``stores``; ``peak_step``: a peak declared in
    advance; ``primary``: series declared primary), from the rows."""
    label_series(rows)
    summary = summarize(rows, stores, alpha, peak_step, primary)
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
    labels = run_labels(runs)
    for r in rows:
        label = r["task"]
        if len(kinds[r["task"]]) > 1:
            if len({k[0] for k in kinds[r["task"]]}) > 1 or len(runs) > 1:
                label += f" [{labels[r.get('run') or '']}]"
            if len({k[1] for k in kinds[r["task"]]}) > 1:
                label += f" [settings {r.get('settings') or '?'}]"
        r["series"] = label


def run_labels(runs) -> dict[str, str]:
    """A short label per run folder: its name, or the shortest end of its path that tells it from
    the others (``a/run`` and ``b/run`` for two runs named ``run``)."""
    runs = sorted(set(runs))
    parts = {run: Path(run or "?").parts or ("?",) for run in runs}
    labels = {}
    for run in runs:
        for depth in range(1, len(parts[run]) + 1):
            tail = parts[run][-depth:]
            if not any(other != run and parts[other][-depth:] == tail for other in runs):
                break
        labels[run] = "/".join(tail).replace("//", "/") or "?"
    return labels


def _series(rows: list[dict], series: str, metric: str) -> list[tuple[int, float, int | None]]:
    """(step, value, n) of a series' metric, in step order."""
    pts = [(r["step"], r["value"], r.get("n")) for r in rows
           if r.get("series", r["task"]) == series and r["metric"] == metric and r["value"] is not None]
    return sorted(pts, key=lambda p: (p[0], p[1]))


def wilson_bar(value: float, n: int | None) -> tuple[float, float]:
    """The 95% Wilson interval of an accuracy over ``n`` items as distances below and above the
    point (nan, nan: no bar, where n is unknown)."""
    if not n:
        return float("nan"), float("nan")
    low, high = wilson_interval(value, n)
    return max(0.0, value - low), max(0.0, high - value)


def _n_text(rows: list[dict], series: str, metric: str) -> str:
    ns = sorted({int(r["n"]) for r in rows if r.get("series", r["task"]) == series and r["metric"] == metric
                 and r.get("n") is not None})
    return "n=?" if not ns else f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}-{ns[-1]}"


def _caption(rows: list[dict]) -> str:
    """What the figure shows: the model or run, --limit, and what the error bars are."""
    runs = sorted(set(run_labels({r.get("run") or "" for r in rows}).values()))
    models = sorted({Path(str(r.get("model") or "?")).name for r in rows if r.get("step") is not None})
    by_limit: dict[str, set] = {}
    for r in rows:
        limit = "none" if r.get("limit") in (None, "") else f"{float(r['limit']):g}"
        by_limit.setdefault(limit, set()).add(str(r.get("task") or "?"))
    if len(by_limit) > 1:  # say which tasks ran at which limit (the twins go with their task)
        limits = [f"{lim} ({', '.join(sorted(t for t in tasks if not t.endswith('_agree')) or sorted(tasks))})"
                  for lim, tasks in sorted(by_limit.items())]
    else:
        limits = sorted(by_limit)
    what = f"run {', '.join(runs)}" if len(runs) <= 2 else f"{len(runs)} runs"
    if len(models) == 1 and models[0] not in runs:
        what = f"model {models[0]}, {what}"
    return (f"{what}; --limit {', '.join(limits)}; n = items each point is computed on; "
            "error bars: 95% Wilson interval over the n items (none where n is unknown)")


def plot(rows: list[dict], path: Path) -> None:
    """One panel per cf task series: counterfactual and parametric accuracy against step, with 95%
    Wilson intervals; standard tasks' accuracy on a second axis. The caption names the run (or model),
    ``--limit`` and what the error bars are; each line's legend entry gives its n; the legend sits
    below the panels, so it never covers a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def key(r):
        return r.get("series", r["task"])

    def bars(pts):
        """Wilson intervals as (below, above) distances: never of zero width, also at 0 and 1."""
        return [list(col) for col in zip(*(wilson_bar(p[1], p[2]) for p in pts))] or None

    agree_tasks = {r["task"] for r in rows if r["metric"] == AGREE_METRIC}
    cf_series = sorted({key(r) for r in rows if r["metric"] == "counterfactual_acc" and r["task"] not in agree_tasks})
    cf_tasks = {r["task"] for r in rows if r["metric"] == "context_prob"}
    standard = sorted({key(r) for r in rows if r["metric"] in ("acc", "exact_match") and r["task"] not in cf_tasks})
    panels: list[str | None] = list(cf_series) or [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.0, 4.6 * len(panels)), 3.4), squeeze=False)
    legend: dict[str, object] = {}
    for ax, series in zip(axes[0], panels):
        if series is not None:
            for metric, color in (("counterfactual_acc", "tab:blue"), ("parametric_acc", "tab:orange")):
                pts = _series(rows, series, metric)
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=bars(pts),
                            marker="o", color=color, label=f"{metric} ({_n_text(rows, series, metric)})", capsize=2)
            # Known items (the knowledge probe) in their own line style; the agreeing twin in its own colour.
            lines = [(series, metric, style) for metric, style in KNOWN_STYLES.items()]
            lines += [(twin, AGREE_METRIC, AGREE_STYLE) for twin in _twin_series(rows, series, agree_tasks)]
            for name, metric, style in lines:
                pts = _series(rows, name, metric)
                if pts:
                    label = metric if name == series else f"{name} {metric}"
                    ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=bars(pts), capsize=2,
                                label=f"{label} ({_n_text(rows, name, metric)})", **style)
            ax.set_title(f"{series} ({_n_text(rows, series, 'counterfactual_acc')})", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        if standard:
            ax2 = ax.twinx()
            for std in standard:
                metric = "acc" if any(key(r) == std and r["metric"] == "acc" for r in rows) else "exact_match"
                pts = _series(rows, std, metric)
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], "--", color="tab:green",
                         label=f"{std} {metric} ({_n_text(rows, std, metric)}; right axis)")
            ax2.set_ylabel("in-distribution accuracy")
            ax2.set_ylim(-0.02, 1.02)
    for each in fig.axes:  # the panels' lines first, then the second axes' (standard tasks)
        handles, labels = each.get_legend_handles_labels()
        legend.update({lab: h for h, lab in zip(handles, labels) if lab not in legend})
    axes[0][0].set_ylabel("accuracy")
    # Caption above and legend below the panels; the figure grows to hold both, so neither is cut
    # and the legend never covers a point.
    width = fig.get_size_inches()[0]
    caption = textwrap.fill(_caption(rows), width=int(width * 15))
    lines = caption.count("\n") + 1
    ncol = max(1, min(3, len(legend), int(width // 2.7)))
    legend_rows = -(-len(legend) // ncol) if legend else 0
    height = 3.4 + 0.19 * legend_rows + 0.16 * lines + 0.25
    fig.set_size_inches(width, height)
    fig.suptitle(caption, fontsize=8)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, (0.19 * legend_rows + 0.05) / height, 1, 1))  # it leaves room for the caption
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


def _check_scorers(rows: list[dict], mixed: bool) -> None:
    """Refuse (one line) a task whose rows were scored by two scorer versions, unless ``mixed``: their
    numbers follow different rules, so they are no points of one curve. Rows from before scorer
    versions were recorded count as a version of their own."""
    versions: dict[str, set] = {}
    for r in rows:
        versions.setdefault(r["task"], set()).add(r.get("scorer_version") or None)
    mixed_tasks = {t: v for t, v in versions.items() if len(v) > 1}
    if mixed_tasks and not mixed:
        task, found = sorted(mixed_tasks.items())[0]
        names = ", ".join("none recorded" if v is None else str(v) for v in sorted(found, key=lambda v: (v is None, str(v))))
        raise SweepError(f"{task}: rows scored by different scorer versions ({names}); re-run cf-tasks sweep into the "
                         "older outputs (it rescores their stored samples), or pass --mixed_scorers to report them anyway "
                         "(a checkpoint scored under several versions then shows its latest version only)")


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
    for number, row in enumerate(rows, 1):
        wrong = next((k for k, kinds in ROW_TYPES.items() if k in row and not isinstance(row[k], kinds)
                      or k in ("checkpoint", "task", "metric") and not row.get(k)
                      or isinstance(row.get(k), bool)), None)
        if wrong:
            raise SweepError(f"{path}: row {number} has {wrong} {json.dumps(row[wrong])[:40]}, not {ROW_KINDS[wrong]}; "
                             "re-run cf-tasks sweep for that output to rebuild it")
    if not isinstance(data.get("failures", []), list) or not all(
            isinstance(f, dict) and isinstance(f.get("error"), str) for f in data.get("failures", [])):
        raise SweepError(f"{path}: its failures are not a list of failure records; re-run cf-tasks sweep for that output "
                         "to rebuild it")
    if not isinstance(data.get("stores", []), list):
        raise SweepError(f"{path}: its stores are not a list of folders; re-run cf-tasks sweep for that output to "
                         "rebuild it")
    return data


# What a sweep.json row's fields hold: a report refuses a row of other types (one line) before it reads them.
ROW_TYPES = {"checkpoint": str, "step": (int, type(None)), "task": str, "metric": str, "value": (int, float, type(None)),
             "stderr": (int, float, type(None)), "n": (int, type(None)), "run": (str, type(None)),
             "settings": (str, type(None)), "checkpoint_id": (str, type(None))}
ROW_KINDS = {"checkpoint": "a name", "step": "a whole number", "task": "a task name", "metric": "a metric name",
             "value": "a number", "stderr": "a number", "n": "a whole number", "run": "a folder",
             "settings": "a settings hash", "checkpoint_id": "a checkpoint id"}


def _output_rows(out: Path) -> tuple[list[dict], list[dict], list[Path]]:
    """An output folder's rows, failures and the stores its samples are in: rebuilt from its own
    store, or read from its sweep.json (which lists the stores its rows came from)."""
    if (out / store.STORE).is_dir():
        fails = [{"checkpoint": f["name"], "path": f["path"], "run": f.get("run"), "error": f["error"]}
                 for f in store.read_failures(out)]
        return sweep_rows(out), fails, [out]
    data = _read_sweep_json(out / "sweep.json")
    return data["rows"], data.get("failures", []), [out] + [Path(p) for p in data.get("stores", []) if isinstance(p, str)]


def report(outs: list[Path], target: Path, log=print, alpha: float = ALPHA, items: bool = False,
           mixed_scorers: bool = False, peak_step: int | None = None, primary=()) -> dict:
    """Merge sweep outputs (shards, other machines) into ``target`` and redraw the plot. The same
    result seen in two outputs counts once; one checkpoint scored from different contents is
    refused; a task with rows of several settings is split into one series per settings. The
    summary's paired tests read the samples in the stores; ``items`` also writes items.csv;
    ``peak_step`` tests each series at a peak declared in advance (a SweepError if no series has
    a checkpoint there); ``primary``: series or tasks declared primary (a SweepError if one is not in
    the summary).

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
    _check_scorers(rows, mixed_scorers)
    check_peak_step(rows, peak_step)  # before anything is written
    label_series(rows)
    check_primary(rows, primary)
    split = sorted({r["task"] for r in rows if len({x.get("settings") for x in rows if x["task"] == r["task"]}) > 1})
    if split:
        log(f"cf-tasks: {', '.join(split)}: rows under different evaluation settings (limit, metadata, chat template, "
            "model args, task version, ...); drawn as one series per settings", file=sys.stderr)
    target.mkdir(parents=True, exist_ok=True)
    store.clean_leftovers(target, LOCK_TIMEOUT)  # a killed report's or sweep's temp folders
    if all((out / store.STORE).is_dir() for out in outs):
        for out in outs:
            store.merge_store(out, target)
        summary = rebuild_views(target, alpha=alpha, peak_step=peak_step, primary=primary)
        rows, stores = sweep_rows(target), [target]
    else:
        rows.sort(key=_row_order)
        summary = write_outputs(target, rows, failures, stores=stores, alpha=alpha, peak_step=peak_step,
                                primary=primary)
    if summary:
        log(format_summary(summary))
    if items:
        found = item_rows(rows, stores)
        atomic_write(target / ITEMS, rows_to_csv(found, ITEM_COLUMNS))
        log(f"cf-tasks: {len(found)} item rows written to {target / ITEMS}", file=sys.stderr)
    return summary
