"""The report of the LoRA study (``cf-tasks experiment inversion --design known_lora [--report_only]``).

``cf-tasks report`` recomputes the sweep's summary from its store, the base model becomes step 0 of
every run, and ``curves.csv``, ``summary.csv``, ``loss.csv``, ``data.csv``, ``timing.csv``, the plots
and ``results.md`` are written from the study folder's files (``known_lora`` writes them).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..files import atomic_write
from ..results import rows_to_csv
from .lm import kind_counts
from .study_folder import md_table, parse_run_name, read_csv, read_jsonl, read_timing, save_fig

CURVE_METRICS = ("counterfactual_acc", "parametric_acc", "known_rate", "known_counterfactual_acc",
                 "known_parametric_acc", "unknown_counterfactual_acc", "context_attention", "agree_acc")
SUMMARY_SHOWN = ("run", "task", "first_step", "peak_step", "final_step", "first", "peak", "final", "rise",
                 "rise_mcnemar_p", "drop", "drop_ci_low", "drop_ci_high", "mcnemar_p", "agree_peak",
                 "agree_final", "agree_mcnemar_p", "inversion", "verdict")
LOSS_COLUMNS = ("run", "arm", "seed", "step", "split", "kind", "loss", "n")


def _run_of(row: dict) -> tuple[str, str, str]:
    name = Path(row.get("run") or "").name
    parsed = parse_run_name(name)
    return (name, parsed[0], str(parsed[1])) if parsed else (name, "", "")


def _kc_task(task: str) -> str:
    from ..registry import twin_of

    return twin_of(task) or task


def build_report(cfg, log=print) -> Path:
    """Rebuild the report from the sweep's store and the runs' logs (``--report_only``); ``cfg`` is
    the study's ``known_lora.StudyConfig``."""
    from ..sweep import report as sweep_report

    out = Path(cfg.output_path)
    sweeps = out / "sweeps"
    target = cfg.report_dir
    target.mkdir(parents=True, exist_ok=True)
    by_run = out / "sweeps_by_run"
    if (sweeps / "sweep.json").is_file():
        sweep_report([sweeps], sweeps, log=lambda *a, **k: None, items=True)
        by_run.mkdir(exist_ok=True)
        summary_of_runs(out, sweeps, by_run, cfg.alpha)
    rows = read_csv(by_run / "sweep.csv") if (by_run / "sweep.csv").is_file() else []
    curves = []
    for r in rows:
        if r["metric"] not in CURVE_METRICS:
            continue
        name, arm, seed = _run_of(r)
        curves.append({"run": name, "arm": arm, "seed": seed, "step": int(r["step"]), "checkpoint": r["checkpoint"],
                       "task": _kc_task(r["task"]), "metric": r["metric"], "value": r["value"],
                       "stderr": r["stderr"], "n": r["n"]})
    curves.sort(key=lambda c: (c["run"], c["task"], c["metric"], c["step"]))
    atomic_write(target / "curves.csv", rows_to_csv(curves, ("run", "arm", "seed", "step", "checkpoint", "task",
                                                            "metric", "value", "stderr", "n")))
    summary = []
    if (by_run / "summary.csv").is_file():
        for r in read_csv(by_run / "summary.csv"):
            name, arm, seed = _run_of(r)
            summary.append({"run": name, "arm": arm, "seed": seed, **{k: v for k, v in r.items() if k != "run"}})
    columns = ["run", "arm", "seed"] + [k for k in (summary[0] if summary else {}) if k not in ("run", "arm", "seed")]
    atomic_write(target / "summary.csv", rows_to_csv(summary, columns))
    loss = []
    for path in sorted((out / "runs").glob("*/loss.csv")):
        loss += read_csv(path)
    atomic_write(target / "loss.csv", rows_to_csv(loss, LOSS_COLUMNS))
    data_rows = _data_rows(out)
    atomic_write(target / "data.csv", rows_to_csv(data_rows, ("what", "kind", "count")))
    timing = [{"part": k, "seconds": v} for k, v in read_timing(out).items()]
    atomic_write(target / "timing.csv", rows_to_csv(timing, ("part", "seconds")))
    runs_info = {p.parent.name: json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/run.json"))}
    _plots(curves, loss, target)
    atomic_write(target / "results.md", _results_md(cfg, curves, summary, data_rows, timing, runs_info).encode())
    log(f"report: {target}")
    return target


def summary_of_runs(out: Path, sweeps: Path, target: Path, alpha: float) -> dict:
    """The sweep's views with the base model as step 0 of every run.

    All runs are swept into one output folder, where the base model is one checkpoint found under
    several run folders, so its rows carry the run folder that saw it last. Here every run gets the
    base model's rows as its step 0 (the same result: same content, same settings), and the sweep's
    own ``write_outputs`` writes sweep.csv, summary.csv (its paired tests, read from the samples in
    the store) and the plot into ``target``."""
    from ..sweep import sweep_rows, write_outputs

    # A run is known by its folder's name: a study folder moved and resumed finds its checkpoints at
    # new paths with the same content, and each result must count once, under the latest path.
    latest: dict[tuple, dict] = {}
    for r in sweep_rows(sweeps):
        r = {k: v for k, v in r.items() if k != "series"}
        latest[(Path(r["run"]).name, r["step"], r["checkpoint"], r["task"], r["metric"], r.get("settings"))] = r
    rows = list(latest.values())
    base = [r for r in rows if r["step"] == 0 and r["checkpoint"] == "base"]
    run_dirs = sorted({r["run"] for r in rows if r["checkpoint"] != "base"})
    merged = [r for r in rows if not (r["step"] == 0 and r["checkpoint"] == "base")]
    for run in run_dirs:
        merged += [{**r, "run": run} for r in base]
    merged.sort(key=lambda r: (r["step"], r["checkpoint"], r["run"], r["task"], r["metric"], r.get("settings") or ""))
    return write_outputs(target, merged, [], stores=[sweeps], alpha=alpha)


def _data_rows(out: Path) -> list[dict]:
    path = out / "data" / "manifest.json"
    if not path.is_file():
        return []
    m = json.loads(path.read_text())
    rows = [{"what": "pool", "kind": k, "count": v} for k, v in m["pool"].items()]
    rows += [{"what": "kept (known)", "kind": k, "count": v} for k, v in m["kept"].items()]
    if "facts_asked" in m:
        rows += [{"what": "facts asked closed-book", "kind": "", "count": m["facts_asked"]},
                 {"what": "facts known", "kind": "", "count": m["facts_known"]}]
    for mix, counts in m["mixes"].items():
        rows += [{"what": f"mix {mix}", "kind": k, "count": v} for k, v in counts.items()]
    kept = out / "data" / "filtered" / "kept.jsonl"
    if kept.is_file():
        rows += [{"what": "mix filtered", "kind": k, "count": v} for k, v in kind_counts(read_jsonl(kept)).items()]
    return rows


def _plots(curves: list[dict], loss: list[dict], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_names = sorted({c["run"] for c in curves} | {r["run"] for r in loss})
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(run_names)}
    panels = ("counterfactual_acc", "known_counterfactual_acc", "unknown_counterfactual_acc", "agree_acc",
              "context_attention", "known_rate")
    for task in sorted({c["task"] for c in curves}):
        fig, axes = plt.subplots(2, 3, figsize=(13, 7), sharex=True)
        for ax, metric in zip(axes.flat, panels):
            for name in run_names:
                pts = sorted((c["step"], float(c["value"])) for c in curves
                             if c["run"] == name and c["task"] == task and c["metric"] == metric and c["value"] != "")
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=colours[name], label=name,
                            linestyle="--" if name.endswith("seed1") else "-")
            ax.set_title(metric)
            ax.set_xlabel("step")
        axes.flat[0].legend(fontsize=7)
        fig.suptitle(f"{task} (held-out items), per fine-tuning run; step 0 is the base model")
        fig.tight_layout()
        save_fig(fig, target / f"curves_{task}.png")
        plt.close(fig)
    if loss:
        kinds = [k for k in ("C", "CS", "S", "CF") if any(r["kind"] == k for r in loss)]
        fig, axes = plt.subplots(1, len(kinds), figsize=(4.5 * len(kinds), 3.8), sharey=True, squeeze=False)
        for ax, kind in zip(axes[0], kinds):
            for name in run_names:
                train = sorted((int(r["step"]), float(r["loss"])) for r in loss
                               if r["run"] == name and r["kind"] == kind and r["split"] == "train")
                if train:
                    xs, ys = zip(*train)
                    ax.plot(xs, _smooth(ys), color=colours[name], alpha=0.35, linewidth=1)
                probe = sorted((int(r["step"]), float(r["loss"])) for r in loss
                               if r["run"] == name and r["kind"] == kind and r["split"] == "probe")
                if probe:
                    ax.plot(*zip(*probe), marker="o", color=colours[name], label=name)
            ax.set_title(f"loss on {kind} points")
            ax.set_xlabel("step")
        axes[0][0].set_ylabel("answer-token cross-entropy")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("dots: fixed probe points at each checkpoint; faint: training batches (moving mean of 5)")
        fig.tight_layout()
        save_fig(fig, target / "loss.png")
        plt.close(fig)


def _smooth(ys: tuple[float, ...], window: int = 5) -> list[float]:
    return [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1]) for i in range(len(ys))]


def _results_md(cfg, curves, summary, data_rows, timing, runs_info) -> str:
    parts = ["# Inversion study: tables (generated by `cf-tasks experiment inversion --report_only`)", ""]
    if runs_info:
        parts += ["## Runs", "", md_table([{"run": k, **v, "points": json.dumps(v["points"]),
                                             "target_modules": ",".join(v["target_modules"])}
                                            for k, v in runs_info.items()],
                                           ("run", "steps", "save_every", "batch_size", "lr", "rank", "target_modules",
                                            "points", "seconds")), ""]
    if data_rows:
        parts += ["## Training data", "", md_table(data_rows, ("what", "kind", "count")), ""]
    if summary:
        shown = [c for c in SUMMARY_SHOWN if c in summary[0]]
        parts += ["## Summary (paired tests, from summary.csv)", "", md_table(summary, shown), ""]
    if curves:
        steps_rows = []
        keyed: dict[tuple, dict] = {}
        for c in curves:
            key = (c["run"], c["task"], c["step"])
            keyed.setdefault(key, {"run": c["run"], "task": c["task"], "step": c["step"]})[c["metric"]] = c["value"]
        steps_rows = [keyed[k] for k in sorted(keyed)]
        cols = ("run", "task", "step", "counterfactual_acc", "parametric_acc", "known_rate", "known_counterfactual_acc",
                "unknown_counterfactual_acc", "agree_acc", "context_attention")
        parts += ["## Curves (from curves.csv)", "", md_table(steps_rows, cols), ""]
    if timing:
        parts += ["## Wall time (seconds)", "", md_table(timing, ("part", "seconds")), ""]
    return "\n".join(parts)
