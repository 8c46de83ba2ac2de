"""The report of the injection study (``cf-tasks experiment inversion --report_only``).

Two steps. ``collect`` copies what the study measured into the report folder as plain files
(``measure.csv``, ``loss.csv``, ``gate.json``, ``epochs.csv``, ``data.csv``, ``runs.csv``,
``sweep.csv``, ``sweep_summary.csv``, ``settings.json``). ``render`` reads only those files and
writes everything else: ``mc_curves.csv``, ``peak.json``, ``tests.csv``, the plots and
``results.md``. A report folder is thus its own source: rendering it again, into itself or a fresh
folder, gives the same bytes (the plots aside, which depend on matplotlib's version).

The peak is declared by a rule fixed before the study ran: the first checkpoint at which the
control arm ``c_only`` reaches 90% of its largest rise of mean ``M_C`` on the probe facts E. The
rise (step 0 to the peak) and the fall (the peak to the last step) of each arm are then tested on
every fact of E with no selection (``cf_tasks.sweep.ushape.fixed_peak_test``), on ``M_C`` itself and
on whether the passage's answer is preferred (``M_C > 0.5``).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from ..files import atomic_write
from ..results import rows_to_csv
from .study_folder import fmt_number, folder_design, md_table, own_views, read_csv, read_jsonl, save_fig

RAW = ("measure.csv", "loss.csv", "gate.json", "epochs.csv", "data.csv", "runs.csv", "sweep.csv",
       "sweep_summary.csv", "settings.json")
CONTROL = "c_only"
RUN_COLUMNS = ("run", "arm", "seed", "steps", "planned_steps", "lr", "batch_size", "points", "seconds")
PEAK_SHARE = 0.9  # the declared peak: the control reaches this share of its largest rise
SWEEP_COLUMNS = ("run", "step", "task", "metric", "value", "stderr", "n", "version", "scorer_version")
SWEEP_METRICS = ("counterfactual_acc", "parametric_acc", "known_rate", "known_counterfactual_acc",
                 "unknown_counterfactual_acc", "agree_acc")
CURVE_COLUMNS = ("run", "step", "group", "n", "mc", "mc_ci_low", "mc_ci_high", "recall", "n_known", "mc_known",
                 "context_preferred")
TEST_COLUMNS = ("run", "measure", "design", "n", "first_step", "peak_step", "final_step", "first", "peak", "final",
                "rise", "rise_ci_low", "rise_ci_high", "p_rise", "fall", "fall_ci_low", "fall_ci_high", "p_fall",
                "p_inversion", "min_detectable_fall")
DECLARED, WHOLE = "declared peak", "whole series"


def has_study(out: Path) -> bool:
    """A study folder of this design, or a report folder made from one."""
    out = Path(out)
    if (out / "config.json").is_file():
        return folder_design(out) == "inject"
    return is_report(out)


def is_report(folder: Path) -> bool:
    return (Path(folder) / "settings.json").is_file() and (Path(folder) / "measure.csv").is_file()


def _json(value) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8")


# ----------------------------------------------------------------------------------------- collect

def collect(out: Path, target: Path) -> None:
    """The study's measurements, as plain files in ``target``."""
    from .inject_measure import LOSS_COLUMNS, MEASURE_COLUMNS

    out, target = Path(out), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    settings = json.loads((out / "config.json").read_text())
    atomic_write(target / "settings.json", _json(settings))
    groups = out / "data" / "groups.json"
    if groups.is_file():
        g = json.loads(groups.read_text())
        rows = [{"what": "candidate facts", "part": k, "count": v} for k, v in g["candidates"].items()]
        rows += [{"what": "known closed-book by the base model", "part": k, "count": v}
                 for k, v in g["known_at_base"].items()]
        rows += [{"what": "group", "part": k, "count": v} for k, v in g["groups"].items()]
        for name in ("cs_heavy", "c_only", "augmented"):
            mix = out / "data" / f"mix_{name}.jsonl"
            if mix.is_file():
                kinds: dict[str, int] = {}
                for p in read_jsonl(mix):
                    kinds[p["kind"]] = kinds.get(p["kind"], 0) + 1
                rows += [{"what": f"mix {name}", "part": k, "count": v} for k, v in sorted(kinds.items())]
        atomic_write(target / "data.csv", rows_to_csv(rows, ("what", "part", "count")))
    phase = out / "phase_a"
    if (phase / "gate.json").is_file():
        atomic_write(target / "gate.json", _json({**json.loads((phase / "gate.json").read_text()),
                                                  "inject": json.loads((phase / "inject.json").read_text())}))
        atomic_write(target / "epochs.csv", (phase / "epochs.csv").read_bytes())
    measured = read_csv(phase / "measure.csv")
    losses: list[dict] = []
    runs = []
    for run_dir in sorted((out / "runs").glob("*")):
        if (run_dir / "run.json").is_file():
            measured += read_csv(run_dir / "measure.csv")
            losses += read_csv(run_dir / "loss.csv")
            info = json.loads((run_dir / "run.json").read_text())
            runs.append({"run": run_dir.name, **{k: info.get(k) for k in ("arm", "seed", "steps", "lr", "batch_size",
                                                                          "seconds")},
                         "planned_steps": info.get("planned_steps", info["steps"]),
                         "points": " ".join(f"{k}:{v}" for k, v in info["points"].items())})
    atomic_write(target / "measure.csv", rows_to_csv(measured, MEASURE_COLUMNS))
    atomic_write(target / "loss.csv", rows_to_csv(losses, LOSS_COLUMNS))
    atomic_write(target / "runs.csv", rows_to_csv(runs, RUN_COLUMNS))
    sweeps, near = out / "sweeps", None
    if (sweeps / "sweep.json").is_file():
        from ..sweep.views import rebuild_views

        # the sweep's own verdict at the swept checkpoint nearest the peak declared from measure.csv
        peak = declare_peak(curves(measured))["peak_step"]
        swept = sorted({int(r["step"]) for r in read_csv(sweeps / "sweep.csv")})
        inside = swept[1:-1]
        near = min(inside, key=lambda s: (abs(s - peak), s)) if peak is not None and inside else None
        rebuild_views(sweeps, peak_step=near)
    with tempfile.TemporaryDirectory(prefix="cf-tasks-views-") as scratch:
        views = own_views(out, sweeps, Path(scratch), near) if (sweeps / "sweep.json").is_file() else sweeps
        sweep_rows, summary = _sweep_rows(views)
    atomic_write(target / "sweep.csv", rows_to_csv(sweep_rows, SWEEP_COLUMNS))
    atomic_write(target / "sweep_summary.csv", rows_to_csv(summary, list(summary[0]) if summary else ["run"]))


def _sweep_rows(sweeps: Path) -> tuple[list[dict], list[dict]]:
    rows = []
    for r in read_csv(sweeps / "sweep.csv"):
        if r["metric"] in SWEEP_METRICS:
            rows.append({**{k: r.get(k, "") for k in SWEEP_COLUMNS}, "run": Path(r["run"]).name})
    rows.sort(key=lambda r: (r["run"], r["task"], r["metric"], int(r["step"])))
    summary = []
    for r in read_csv(sweeps / "summary.csv"):
        name = Path(r.get("run") or "").name
        summary.append({**r, "run": name, "series": f"{r['task']} [{name}]"})
    summary.sort(key=lambda r: (r["run"], r["task"]))
    return rows, summary


# ------------------------------------------------------------------------------------------ render

def _mean_ci(values: list[float]) -> tuple[float, float, float]:
    n = len(values)
    if not n:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = 1.96 * sd / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def curves(measured: list[dict]) -> list[dict]:
    """Per run, step and group: mean M_C (normal 95% interval), recall, M_C over the facts known at
    that checkpoint, and the share whose passage answer is preferred."""
    keyed: dict[tuple, list[dict]] = {}
    for r in measured:
        keyed.setdefault((r["run"], int(r["step"]), r["group"]), []).append(r)
    out = []
    for (run, step, group), rows in sorted(keyed.items()):
        mc = [float(r["mc"]) for r in rows if r["mc"] != ""]
        if not mc:
            continue
        known = [float(r["mc"]) for r in rows if r["known"] == "1" and r["mc"] != ""]
        asked = [r for r in rows if r["known"] != ""]  # recall is not measured for every group at every step
        mean, low, high = _mean_ci(mc)
        out.append({"run": run, "step": step, "group": group, "n": len(rows), "mc": round(mean, 4),
                    "mc_ci_low": round(low, 4), "mc_ci_high": round(high, 4),
                    "recall": round(len(known) / len(asked), 4) if asked else "",
                    "n_known": len(known) if asked else "",
                    "mc_known": round(sum(known) / len(known), 4) if known else "",
                    "context_preferred": round(sum(v > 0.5 for v in mc) / len(mc), 4)})
    return out


def declare_peak(curve: list[dict]) -> dict:
    """The peak rule, applied to the control arm's mean M_C on E (first seed)."""
    control = sorted((c for c in curve if c["run"].startswith(CONTROL + "-") and c["group"] == "E"),
                     key=lambda c: (c["run"], c["step"]))
    if not control:
        return {"rule": _rule(), "peak_step": None, "from": None}
    run = control[0]["run"]
    series = [(c["step"], c["mc"]) for c in control if c["run"] == run]
    start = series[0][1]
    top = max(v for _, v in series)
    step = next(s for s, v in series if v - start >= PEAK_SHARE * (top - start))
    return {"rule": _rule(), "from": run, "peak_step": step, "control_start": start, "control_max": top}


def _rule() -> str:
    return (f"the first checkpoint at which {CONTROL}'s mean M_C on E reaches {PEAK_SHARE:g} of its largest "
            "rise over step 0")


def fixed_peak_tests(measured: list[dict], peak_step: int) -> list[dict]:
    """Per run and measure: the rise and fall at the declared peak (``fixed_peak_test``) and, beside
    it, the two-lines test over every checkpoint with the peak chosen inside its null
    (``whole_series_test``); both on every fact of E present at every checkpoint."""
    from ..sweep.ushape import fixed_peak_test, min_detectable_fall, whole_series_test

    rows = []
    runs = sorted({r["run"] for r in measured if r["run"] not in ("base", "phase_a")})
    for run in runs:
        mine = [r for r in measured if r["run"] == run and r["group"] == "E"]
        steps = sorted({int(r["step"]) for r in mine})
        if peak_step not in steps[1:-1]:  # a rise and a fall need a peak strictly inside the series
            continue
        by_fact: dict[str, dict[int, float]] = {}
        for r in mine:
            by_fact.setdefault(r["fact_id"], {})[int(r["step"])] = float(r["mc"])
        facts = sorted(f for f, v in by_fact.items() if len(v) == len(steps))
        graded = [[by_fact[f][s] for s in steps] for f in facts]
        binary = [[1.0 if v > 0.5 else 0.0 for v in row] for row in graded]
        for measure, values in (("M_C", graded), ("context preferred", binary)):
            t = fixed_peak_test(values, steps.index(peak_step))
            t.update(rise_ci_low=t["rise_ci"][0], rise_ci_high=t["rise_ci"][1], fall_ci_low=t["fall_ci"][0],
                     fall_ci_high=t["fall_ci"][1])
            at_peak = [v[steps.index(peak_step)] for v in values]
            mean = sum(at_peak) / len(at_peak)
            variance = sum((v - mean) ** 2 for v in at_peak) / max(1, len(at_peak) - 1)
            rows.append({"run": run, "measure": measure, "design": DECLARED, "n": len(facts), "first_step": steps[0],
                         "peak_step": peak_step, "final_step": steps[-1],
                         "first": _mean([v[0] for v in values]), "peak": _mean([v[steps.index(peak_step)]
                                                                                for v in values]),
                         "final": _mean([v[-1] for v in values]),
                         **{k: _round(t.get(k)) for k in ("rise", "rise_ci_low", "rise_ci_high", "p_rise", "fall",
                                                          "fall_ci_low", "fall_ci_high", "p_fall",
                                                          "p_inversion")},
                         "min_detectable_fall": _round(min_detectable_fall(len(facts), mean, variance=variance))})
            w = whole_series_test(values)
            top = w["peak"]
            rows.append({"run": run, "measure": measure, "design": WHOLE, "n": len(facts), "first_step": steps[0],
                         "peak_step": steps[top], "final_step": steps[-1], "first": _mean([v[0] for v in values]),
                         "peak": _mean([v[top] for v in values]), "final": _mean([v[-1] for v in values]),
                         "rise": _round(_mean([v[top] - v[0] for v in values])),
                         "fall": _round(_mean([v[top] - v[-1] for v in values])),
                         **{k: _round(w[k]) for k in ("p_rise", "p_fall", "p_inversion")}})
    return rows


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else math.nan


def _round(x):
    if x is None:
        return ""
    return float(f"{x:.4g}") if isinstance(x, float) else x


def render(source: Path, target: Path) -> None:
    """Everything derived, from the plain files of ``source`` (a report folder) into ``target``."""
    source, target = Path(source), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    if source.resolve() != target.resolve():
        for name in RAW:
            if (source / name).is_file():
                atomic_write(target / name, (source / name).read_bytes())
    measured = read_csv(source / "measure.csv")
    curve = curves(measured)
    atomic_write(target / "mc_curves.csv", rows_to_csv(curve, CURVE_COLUMNS))
    peak = declare_peak(curve)
    atomic_write(target / "peak.json", _json(peak))  # declared before the tests read it
    tests = fixed_peak_tests(measured, peak["peak_step"]) if peak["peak_step"] is not None else []
    atomic_write(target / "tests.csv", rows_to_csv(tests, TEST_COLUMNS))
    losses = read_csv(source / "loss.csv")
    sweep = read_csv(source / "sweep.csv")
    _plots(curve, losses, sweep, target)
    text = results_md(source, curve, peak, tests, losses, sweep)
    atomic_write(target / "results.md", text.encode("utf-8"))


def build_report(cfg, log=print) -> Path:
    """Collect from the study folder (when it is one), then render into the report folder."""
    out = Path(cfg.output_path)
    if (out / "config.json").is_file():
        target = cfg.report_dir
        collect(out, target)
        render(target, target)
    else:  # a report folder: rendered again from its own files, in place unless --report_path says where
        target = Path(cfg.report_path) if cfg.report_path else out
        render(out, target)
    log(f"report: {target}")
    return target


# --------------------------------------------------------------------------------------- results.md

def results_md(source: Path, curve, peak, tests, losses, sweep) -> str:
    settings = json.loads((source / "settings.json").read_text())
    parts = ["# Injection study: tables (generated by `cf-tasks experiment inversion --report_only`)", "",
             "Every number below is computed from the CSV and JSON files beside this one.", "",
             "## Settings", "", md_table([{"setting": k, "value": json.dumps(v)} for k, v in sorted(settings.items())
                                          if k != "model_id"], ("setting", "value")), ""]
    data = read_csv(source / "data.csv")
    if data:
        parts += ["## Facts and mixes", "", md_table(data, ("what", "part", "count")), ""]
    gate_path = source / "gate.json"
    gate = json.loads(gate_path.read_text()) if gate_path.is_file() else None
    if gate is not None:
        fig = gate["figures"]
        rows = []
        for key in sorted({k.removeprefix("phase_a_").removeprefix("base_") for k in fig}):
            rows.append({"figure": key, "base model": fig.get(f"base_{key}"), "after phase A": fig.get(f"phase_a_{key}")})
        parts += ["## Phase A: knowledge injection and the gate", "",
                  f"Phase A trained {gate['inject']['epochs']} epoch(s) ({gate['inject']['steps']} steps) on "
                  f"{gate['inject']['points']} closed-book points.", "", md_table(rows, ("figure", "base model",
                                                                                        "after phase A")), "",
                  md_table([{"check": k, "needs": v["needs"], "met": "yes" if v["met"] else "NO"}
                            for k, v in gate["checks"].items()], ("check", "needs", "met")), "",
                  f"Gate met: {'yes' if gate['met'] else 'NO'}.", ""]
        epochs = read_csv(source / "epochs.csv")
        if epochs:
            parts += ["Phase A's epochs (`epochs.csv`: mean training loss per epoch; closed-book recall on T and E "
                      "where it was measured):", "", md_table(epochs, ("epoch", "steps", "loss", "recall")), ""]
    runs = read_csv(source / "runs.csv")
    if not runs:
        parts += ["## Phase B", "", "Phase B did not run: " + ("the gate failed (the checks marked NO above), "
                  "and a failed gate stops the study." if gate is not None and not gate["met"]
                  else "no run has finished yet."), ""]
        return "\n".join(parts)
    if runs:
        parts += ["## Phase B runs", "", "`steps`: the steps trained; `planned_steps`: the study's setting "
                  "(a run closed early with `--finish` stops at its last checkpoint).", "",
                  md_table(runs, RUN_COLUMNS), ""]
    if curve:
        shown = [c for c in curve if c["run"] not in ("base", "phase_a")]
        parts += ["## M_C and recall at every checkpoint (mc_curves.csv)", "",
                  "`mc`: mean M_C = p(passage answer) / (p(passage answer) + p(true answer)) under the "
                  "counterfactual passage, with a normal 95% interval; `mc_known`: over the facts recalled "
                  "closed-book at that checkpoint; `context_preferred`: share with M_C > 0.5.", "",
                  md_table(shown, CURVE_COLUMNS), ""]
    parts += ["## The declared peak (peak.json)", "", f"Rule: {peak['rule']}.", "",
              f"Peak step: {peak['peak_step']} (from {peak['from']}).", ""]
    if tests:
        parts += ["## Tests on every probe fact E (tests.csv)", "",
                  "`declared peak`: the rise is each fact's least-squares line from step 0 to the declared peak, "
                  "the fall its line from the peak to the last step, each tested one-sided on the same facts "
                  "(sign-flip permutation on the facts' slopes); `rise` and `fall` are the changes between those "
                  "three steps, with bootstrap intervals; `min_detectable_fall`: the smallest fall a one-sided "
                  "test at 0.05 detects with probability 0.8 at this n and the variance at the peak). `whole series`: the two-lines test of an "
                  "inverted U over every checkpoint, the peak chosen inside its sign-flip null (p-values adjusted "
                  "for that choice; the statistics guide).", "", md_table(tests, TEST_COLUMNS), ""]
        parts += ["## Reading", ""] + [f"- {line}" for line in reading(tests)] + [""]
    probe = [r for r in losses if r["split"] == "probe"]
    if probe:
        keyed: dict[tuple, dict] = {}
        for r in probe:
            keyed.setdefault((r["run"], int(r["step"])), {"run": r["run"], "step": int(r["step"])})[r["kind"]] = r["loss"]
        parts += ["## Loss of fixed probe points (loss.csv)", "",
                  "C: invented entities (context only); CS: T's facts with a passage that states them; S: T's "
                  "facts closed-book. The C+S condition holds while S is below C.", "",
                  md_table([keyed[k] for k in sorted(keyed)], ("run", "step", "C", "CS", "S")), ""]
    if sweep:
        keyed = {}
        for r in sweep:
            keyed.setdefault((r["run"], r["task"], int(r["step"])), {"run": r["run"], "task": r["task"],
                                                                     "step": int(r["step"])})[r["metric"]] = r["value"]
        parts += ["## The sweep at its checkpoints (sweep.csv)", "",
                  md_table([keyed[k] for k in sorted(keyed)], ("run", "task", "step") + SWEEP_METRICS), ""]
    summary = read_csv(source / "sweep_summary.csv")
    if summary:
        shown = [c for c in ("series", "peak_step", "first", "peak", "final", "rise", "drop", "p_rise", "p_fall",
                             "p_holm", "verdict") if c in summary[0]]
        parts += ["## The sweep's own verdict (sweep_summary.csv)", "", md_table(summary, shown), ""]
    return "\n".join(parts)


def reading(tests: list[dict]) -> list[str]:
    """One generated sentence per run, measure and design: the rise and the fall with their p-values."""
    lines = []
    for t in tests:
        if t["design"] == WHOLE:
            lines.append(f"{t['run']}, {t['measure']}, whole series: the inverted U fits best with its peak at step "
                         f"{t['peak_step']} ({fmt_number(t['peak'])}); rise {fmt_number(t['rise'])} (p = "
                         f"{fmt_number(t['p_rise'], 4)}), fall to step {t['final_step']} {fmt_number(t['fall'])} "
                         f"(p = {fmt_number(t['p_fall'], 4)}), inversion p = {fmt_number(t['p_inversion'], 4)}.")
            continue
        lines.append(f"{t['run']}, {t['measure']} on {t['n']} facts: {fmt_number(t['first'])} at step "
                     f"{t['first_step']}, {fmt_number(t['peak'])} at the declared peak (step {t['peak_step']}), "
                     f"{fmt_number(t['final'])} at step {t['final_step']}; rise {fmt_number(t['rise'])} "
                     f"(one-sided p = {fmt_number(t['p_rise'], 4)}), fall {fmt_number(t['fall'])} "
                     f"(95% CI {fmt_number(t['fall_ci_low'])} to {fmt_number(t['fall_ci_high'])}, one-sided p = "
                     f"{fmt_number(t['p_fall'], 4)}; a fall of {fmt_number(t['min_detectable_fall'])} was detectable at 80% power).")
    return lines


# ------------------------------------------------------------------------------------------- plots

def _plots(curve, losses, sweep, target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted({c["run"] for c in curve if c["run"] not in ("base", "phase_a")})
    if runs:
        fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharex=True)
        for ax, (key, title) in zip(axes, (("mc", "mean M_C (95% interval)"), ("mc_known", "M_C, facts recalled"),
                                           ("recall", "closed-book recall"))):
            for run in runs:
                for group, style in (("E", "-"), ("N", ":"), ("T", "--")):
                    pts = [c for c in curve if c["run"] == run and c["group"] == group and c[key] != ""]
                    if not pts:
                        continue
                    line, = ax.plot([c["step"] for c in pts], [float(c[key]) for c in pts], style, marker="o",
                                    markersize=3, label=f"{run} {group}")
                    if key == "mc":
                        ax.fill_between([c["step"] for c in pts], [c["mc_ci_low"] for c in pts],
                                        [c["mc_ci_high"] for c in pts], color=line.get_color(), alpha=0.12)
            ax.set_title(title)
            ax.set_xlabel("phase-B step")
        axes[0].legend(fontsize=6)
        fig.suptitle("E: probe facts (taught in phase A, never in phase B); N: held-out facts never taught")
        fig.tight_layout()
        save_fig(fig, target / "mc.png")
        plt.close(fig)
    probe = [r for r in losses if r["split"] == "probe"]
    if probe:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in sorted({r["run"] for r in probe}):
            for kind, style in (("C", "-"), ("CS", "--"), ("S", ":")):
                pts = sorted((int(r["step"]), float(r["loss"])) for r in probe if r["run"] == run and r["kind"] == kind)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", markersize=3, label=f"{run} {kind}")
        ax.set_yscale("log")
        ax.set_xlabel("phase-B step")
        ax.set_ylabel("answer loss of fixed probe points")
        ax.legend(fontsize=6)
        fig.tight_layout()
        save_fig(fig, target / "loss.png")
        plt.close(fig)
