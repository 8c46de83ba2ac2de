"""Paired statistics across checkpoints, the per-series summary, and the per-item table.

The rise and fall of ``counterfactual_acc`` over fine-tuning ("Context-Parametric Inversion: Why
Instruction Finetuning May Not Actually Improve Context Reliance", Goyal et al., Figures 2-5) are
read from the same items at every checkpoint, so they are tested with items as the unit
(``ushape``): by default the two-lines test over the whole series, every item and every checkpoint,
with the peak's choice inside its sign-flip null; with ``--peak_step`` a peak declared in advance,
the rise (first -> peak) and the fall (peak -> final) tested one-sided on all items. Where the
``_mc`` tasks ran, the same test runs on the graded ``context_prob`` (the ratio M_C) per item.

"Inversion" is an intersection-union test (the rise and the fall must both be small at one peak;
``p_inversion``); across the series of one summary (one sweep or report) the p-values are adjusted
by Holm's step-down method (``p_holm``; with ``--primary``, the series declared primary first and
the rest only after them: a serial gatekeeper), and "inversion" is the only word of the verdict that claims
significance: the rise's and the fall's own p-values are printed as unadjusted. Beside each verdict
is the smallest fall the series could have shown at 80% power (``min_detectable_fall``). Where the
task's agreeing twin ``<dataset>_agree`` was scored at the peak and final checkpoints and its
``agree_acc`` falls too, an inversion is called a loss of reading instead (a veto: it can only lower
the rate of "inversion"). The estimates (``rise``, ``drop``) and their bootstrap intervals come from
the items the test used.

Per-item outcomes come from the lm-eval samples that the store keeps for every checkpoint
(``store/<checkpoint id>/<task>/<settings>/samples_<task>.jsonl``); items are paired by the doc's
``id`` field. The statistics guide (docs/statistics.md) gives the tests' calibration and power.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..known import AGREE_METRIC
from ..registry import twin_name, twin_of
from .config import SweepError
from .items import ITEM_COLUMNS, OUTCOMES, ItemSource, item_rows, outcome, read_samples  # noqa: F401 (this module's API)
from .ushape import (binomial_tail, bootstrap_interval, fixed_peak_test, min_detectable_fall, whole_series_test,
                     wilson_interval)

__all__ = ["fixed_peak_test", "min_detectable_fall", "wilson_interval", "whole_series_test", "binomial_tail",
           "holm", "gated_holm", "mcnemar_exact", "paired_change", "summarize", "format_summary", "item_rows", "check_alpha"]

ALPHA = 0.05
POWER = 0.8  # the power of the smallest detectable fall printed beside each verdict
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # every comparison draws from its own generator with this seed: order-independent
METRIC = "counterfactual_acc"
GRADED_METRIC = "context_prob"  # the _mc tasks' per-item M_C, tested where those tasks ran
WHOLE_SERIES = "whole series (two lines, peak chosen inside the null)"
SUMMARY_COLUMNS = (
    "series", "task", "metric", "run", "settings", "n_checkpoints", "first_step", "peak_step", "final_step", "first",
    "peak", "final", "rise", "rise_ci_low", "rise_ci_high", "rise_mcnemar_p", "rise_flips_to_context",
    "rise_flips_to_parametric", "rise_n_pairs", "drop", "drop_ci_low", "drop_ci_high", "mcnemar_p",
    "flips_to_context", "flips_to_parametric", "n_pairs", "agree_task", "agree_peak", "agree_final", "agree_drop",
    "agree_mcnemar_p", "design", "n_items", "p_rise", "p_fall", "p_inversion", "n_series_tested", "family", "p_holm", "alpha",
    "min_detectable_fall", "inversion", "verdict",
)


# ---------------------------------------------------------------- arguments
def check_alpha(value) -> float:
    """``--alpha`` as a number in (0, 1); a SweepError of one line otherwise."""
    try:
        alpha = float(value)
    except (TypeError, ValueError):
        alpha = math.nan
    if not 0 < alpha < 1:
        raise SweepError(f"--alpha {value}: must be a significance level between 0 and 1 (exclusive), e.g. --alpha 0.05")
    return alpha


# ---------------------------------------------------------------- tests
def mcnemar_exact(to_context: int, to_parametric: int) -> float:
    """Two-sided exact McNemar test: the binomial test of ``to_context`` successes among the
    discordant pairs at p = 1/2. No discordant pair gives 1."""
    n = to_context + to_parametric
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(to_context, to_parametric) + 1))
    return min(1.0, 2 * tail / 2**n)  # exact big-integer division, correctly rounded


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``pvalues`` (family-wise error rate at most alpha under any
    dependence between the tests): the k-th smallest p times (m - k + 1), made monotone, capped at 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [1.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def bootstrap_change(gains: int, losses: int, n: int, resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """95% percentile interval of the paired change (later minus earlier accuracy) over ``n``
    items, of which ``gains`` became correct and ``losses`` stopped being correct. Resampling
    ``n`` items with replacement only matters through how many of each kind are drawn, so each
    resample is one multinomial draw over (gain, loss, unchanged)."""
    import numpy as np

    if n <= 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, [gains / n, losses / n, (n - gains - losses) / n], size=resamples)
    changes = (counts[:, 0] - counts[:, 1]) / n
    low, high = np.quantile(changes, [0.025, 0.975])
    return float(low), float(high)


def paired_change(before: dict[str, bool], after: dict[str, bool], resamples: int = BOOTSTRAP_RESAMPLES,
                  seed: int = BOOTSTRAP_SEED) -> dict:
    """Items correct at one checkpoint and not the other, over the items present at both:
    ``to_context`` (wrong before, right after), ``to_parametric`` (right before, wrong after), the
    McNemar p-value, the paired change (after minus before) and its bootstrap interval."""
    common = before.keys() & after.keys()
    gains = sum(1 for i in common if after[i] and not before[i])
    losses = sum(1 for i in common if before[i] and not after[i])
    n = len(common)
    low, high = bootstrap_change(gains, losses, n, resamples, seed) if resamples else (math.nan, math.nan)
    return {"n": n, "to_context": gains, "to_parametric": losses, "p": mcnemar_exact(gains, losses),
            "p_up": binomial_tail(gains, losses), "p_down": binomial_tail(losses, gains),
            "change": (gains - losses) / n if n else math.nan, "ci_low": low, "ci_high": high}


# ---------------------------------------------------------------- summary
def _series_key(row: dict) -> tuple:
    return row["task"], row.get("run") or "", row.get("settings") or ""


def _points(rows: list[dict], metric: str) -> dict[tuple, list[dict]]:
    found: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["metric"] == metric and r.get("value") is not None:
            found.setdefault(_series_key(r), []).append(r)
    for pts in found.values():
        pts.sort(key=lambda r: (r["step"], r["checkpoint"]))
    return found


def _agree_task(task: str, agree_tasks: set[str]) -> str | None:
    """``<dataset>_agree`` for a task of that dataset (``cf_bio``, ``cf_bio_alpaca``, ``cf_bio_known``):
    the longest dataset name the task starts with."""
    datasets = [twin_of(a) for a in agree_tasks]
    matches = [d for d in datasets if d and (task == d or task.startswith(d + "_"))]
    return twin_name(max(matches, key=len)) if matches else None


def _same_settings(a: dict, b: dict) -> bool:
    """Rows evaluated under the same run-wide settings (their own task's settings hashes differ)."""
    return all(a.get(k) == b.get(k) for k in ("run", "limit", "metadata", "apply_chat_template", "backend"))


def _fmt_p(p: float | None) -> str:
    return "n/a" if p is None or (isinstance(p, float) and math.isnan(p)) else f"{p:.3g}"


def _nan_none(x):
    return None if isinstance(x, float) and math.isnan(x) else x


def _matrix(points: list[dict], source: ItemSource, metric: str):
    """The checkpoints of a series with per-item values and, over the items present at all of
    them, the table items x checkpoints: (points kept, item ids, rows of values)."""
    found = [(r, source.values(r.get("checkpoint_id"), r["task"], r.get("settings"), metric)) for r in points]
    kept = [(r, v) for r, v in found if v is not None]
    if not kept:
        return [], [], []
    ids = sorted(set.intersection(*(set(v) for _, v in kept)))
    return [r for r, _ in kept], ids, [[v[i] for _, v in kept] for i in ids]


def _binary(table: list[list[float]]) -> bool:
    return all(v in (0.0, 1.0) for row in table for v in row)


def summarize_series(points: list[dict], source: ItemSource, alpha: float = ALPHA,
                     agree_points: list[dict] | None = None, peak_step: int | None = None) -> dict:
    """One summary row from one series' rows of ``counterfactual_acc`` (or of the graded
    ``context_prob``) of one run folder and one settings: the two-lines test over the whole
    series, or with ``peak_step`` the rise and fall at that step, on the items present at every
    checkpoint tested. The verdict here is the series' alone (a family of one); ``summarize``
    adjusts it across the series of a summary."""
    first, final = points[0], points[-1]
    metric = first["metric"] if first.get("metric") in (METRIC, GRADED_METRIC) else METRIC
    s: dict = {c: None for c in SUMMARY_COLUMNS}
    s.update(task=first["task"], metric=metric, run=first.get("run"), settings=first.get("settings"),
             n_checkpoints=len(points), first_step=first["step"], final_step=final["step"], first=first["value"],
             final=final["value"], alpha=alpha, inversion=False)
    top = max(points, key=lambda r: r["value"])  # without a test: the highest (ties: the earliest)
    s.update(peak_step=top["step"], peak=top["value"], rise=top["value"] - first["value"], drop=top["value"] - final["value"])
    if len(points) < 3:
        s["verdict"] = f"{len(points)} checkpoint(s): an inverted U needs three or more"
        return s
    kept, ids, table = _matrix(points, source, metric)
    missing = [r["step"] for r in (first, final) if r not in kept]
    if missing:
        s["verdict"] = (f"no per-item samples at step {', '.join(map(str, missing))}: paired tests not run "
                        f"(rise {s['rise']:+.3f}, drop {s['drop']:+.3f})")
        return s
    if len(kept) < 3 or not ids:
        s["verdict"] = "fewer than three checkpoints with per-item samples of the same items: paired tests not run"
        return s
    steps = [r["step"] for r in kept]
    if peak_step is not None:
        if peak_step not in steps[1:-1]:
            s["verdict"] = (f"--peak_step {peak_step} is not a checkpoint between the first and the last of this "
                            f"series (steps {', '.join(map(str, steps))}): not tested")
            return s
        test = fixed_peak_test(table, steps.index(peak_step), alpha=alpha)
        s["design"] = f"two lines at a peak declared in advance (step {peak_step})"
    else:
        test = whole_series_test(table)
        s["design"] = WHOLE_SERIES
    i_peak = test["peak"]
    peak = kept[i_peak]
    column = list(zip(*table))
    means = [sum(c) / len(c) for c in column]
    rise_d = [a - b for a, b in zip(column[i_peak], column[0])]
    fall_d = [a - b for a, b in zip(column[i_peak], column[-1])]
    rise_ci, drop_ci = bootstrap_interval(rise_d), bootstrap_interval(fall_d)  # 95%
    s.update(n_checkpoints=len(kept), peak_step=peak["step"], first=means[0], peak=means[i_peak], final=means[-1],
             rise=sum(rise_d) / len(ids), drop=sum(fall_d) / len(ids), n_items=len(ids),
             rise_ci_low=_nan_none(rise_ci[0]), rise_ci_high=_nan_none(rise_ci[1]),
             drop_ci_low=_nan_none(drop_ci[0]), drop_ci_high=_nan_none(drop_ci[1]),
             p_rise=test["p_rise"], p_fall=test["p_fall"], p_inversion=test["p_inversion"])
    if _binary(table):  # the exact McNemar tests between the three checkpoints, two-sided: a cross-check
        as_bool = [{i: bool(v) for i, v in zip(ids, c)} for c in column]
        rise = paired_change(as_bool[0], as_bool[i_peak], resamples=0)
        fall = paired_change(as_bool[i_peak], as_bool[-1], resamples=0)
        s.update(rise_mcnemar_p=rise["p"], rise_flips_to_context=rise["to_context"],
                 rise_flips_to_parametric=rise["to_parametric"], rise_n_pairs=rise["n"], mcnemar_p=fall["p"],
                 flips_to_context=fall["to_context"], flips_to_parametric=fall["to_parametric"], n_pairs=fall["n"])
    spread = None if _binary(table) else _variance(column[i_peak])
    s["_mde"] = lambda level: min_detectable_fall(len(ids), s["peak"], level, POWER, spread)
    s["_agree_falls"] = _agree(s, peak, final, source, alpha, agree_points or [])
    apply_verdict(s, p_holm=s["p_inversion"], n_tested=1)
    return s


def _variance(values) -> float:
    values = list(values)
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)


def apply_verdict(s: dict, p_holm: float, n_tested: int, family: str = "all") -> None:
    """``p_holm``, ``inversion``, ``min_detectable_fall`` and ``verdict`` of a tested summary row,
    given its adjusted p among the ``n_tested`` series of its family (``family``: ``all``, or
    ``primary`` / ``secondary`` under ``--primary``). Only "inversion" (and "loss of reading", which
    replaces it) claims significance, from ``p_holm``; the rise's and the fall's p-values are printed
    as unadjusted."""
    alpha = s["alpha"]
    # the fall a series needs to be called an inversion among n_tested: Holm's first step, alpha / n
    mde = s["_mde"](alpha / n_tested)
    s.update(p_holm=p_holm, n_series_tested=n_tested, family=family, min_detectable_fall=_nan_none(mde),
             inversion=False)
    several = n_tested > 1
    family = {"all": f"over {n_tested} series" if several else "one series",
              "primary": f"over {n_tested} primary series" if several else "one primary series",
              "secondary": f"over {n_tested if several else 'one'} series after the primary"}[family]
    raw = f"unadjusted: rise p={_fmt_p(s['p_rise'])}, fall p={_fmt_p(s['p_fall'])}"
    where = f"peak at step {s['peak_step']}"
    if p_holm < alpha and s.get("_agree_falls"):
        s["verdict"] = (f"loss of reading, not inversion: {s['agree_task']} falls too (unadjusted p="
                        f"{_fmt_p(s['agree_mcnemar_p'])}); Holm p={_fmt_p(p_holm)} {family}, {where}; {raw}")
    elif p_holm < alpha:
        s["inversion"] = True
        held = f"; {s['agree_task']} holds (p={_fmt_p(s['agree_mcnemar_p'])})" if s["agree_task"] else ""
        s["verdict"] = f"inversion (Holm p={_fmt_p(p_holm)} {family}, {where}; {raw}){held}"
    else:
        unit = "" if s["metric"] == METRIC else f" of {s['metric']}"
        s["verdict"] = (f"no inversion shown (Holm p={_fmt_p(p_holm)} {family}; {raw}); a fall{unit} under "
                        f"{mde:.3f} could not be seen (80% power, {s['n_items']} items)")


def _agree(s: dict, peak: dict, final: dict, source: ItemSource, alpha: float, agree_points: list[dict]) -> bool:
    """Fill the agree_* columns from the twin's rows at the peak and final checkpoints; whether
    ``agree_acc`` falls significantly between them."""
    by_id: dict[str, list[dict]] = {}
    for r in agree_points:
        if _same_settings(r, peak):
            by_id.setdefault(r.get("checkpoint_id"), []).append(r)
    pairs = [(a, b) for a in by_id.get(peak.get("checkpoint_id"), []) for b in by_id.get(final.get("checkpoint_id"), [])
             if a.get("settings") == b.get("settings")]
    if not pairs:
        return False
    a, b = pairs[0]
    s.update(agree_task=a["task"], agree_peak=a["value"], agree_final=b["value"], agree_drop=a["value"] - b["value"])
    before = source.correct(a.get("checkpoint_id"), a["task"], a.get("settings"), AGREE_METRIC)
    after = source.correct(b.get("checkpoint_id"), b["task"], b.get("settings"), AGREE_METRIC)
    if before is None or after is None:
        return False
    test = paired_change(before, after, resamples=0)
    if not test["n"]:
        return False
    s["agree_mcnemar_p"] = test["p"]
    return test["change"] < 0 and test["p"] < alpha


def check_peak_step(rows: list[dict], peak_step: int | None) -> None:
    """``--peak_step``: a step of a checkpoint of the summary's series, between a series' first and
    last; a SweepError of one line otherwise."""
    if peak_step is None:
        return
    series = [pts for metric in (METRIC, GRADED_METRIC) for pts in _points(rows, metric).values()]
    steps = sorted({r["step"] for pts in series for r in pts if r.get("step") is not None})
    inside = sorted({r["step"] for pts in series for r in pts[1:-1]})
    if isinstance(peak_step, bool) or not isinstance(peak_step, int) or peak_step not in inside:
        shown = ", ".join(map(str, inside)) if inside else "none: every series has fewer than three checkpoints"
        raise SweepError(f"--peak_step {peak_step}: not the step of a checkpoint between a series' first and last "
                         f"(steps here: {', '.join(map(str, steps)) or 'none'}); pass one of: {shown}")


def _is_primary(s: dict, names) -> bool:
    return s["series"] in names or s["task"] in names


def check_primary(rows: list[dict], primary) -> None:
    """``--primary``: each name is a series label or a task of the summary's series; a SweepError of
    one line otherwise."""
    if not primary:
        return
    series = [pts for metric in (METRIC, GRADED_METRIC) for pts in _points(rows, metric).values()]
    labels = sorted({p[0].get("series") or p[0]["task"] for p in series} | {p[0]["task"] for p in series})
    for name in primary:
        if name not in labels:
            raise SweepError(f"--primary {name!r}: not a series or task of this summary; pass one of: "
                             f"{', '.join(labels) or 'none (no series)'}")


def gated_holm(pvalues: list[float], primary: list[bool]) -> list[float]:
    """Adjusted p-values of a serial gatekeeper: Holm among the ``primary`` p-values, and Holm among
    the rest, each of those at least the largest adjusted primary p (the rest are tested only once
    every primary series is). The family-wise error rate stays at most alpha under any dependence
    (a closed testing procedure); with no primary, or only primaries, it is Holm's."""
    if not any(primary) or all(primary):
        return holm(pvalues)
    first = [i for i, flag in enumerate(primary) if flag]
    rest = [i for i, flag in enumerate(primary) if not flag]
    adjusted = [1.0] * len(pvalues)
    for i, a in zip(first, holm([pvalues[i] for i in first])):
        adjusted[i] = a
    gate = max(adjusted[i] for i in first)
    for i, a in zip(rest, holm([pvalues[i] for i in rest])):
        adjusted[i] = max(gate, a)
    return adjusted


def summarize(rows: list[dict], outs: list[Path] = (), alpha: float = ALPHA, peak_step: int | None = None,
              primary=()) -> dict:
    """One summary row per series of ``counterfactual_acc`` (task x run folder x settings), and of
    ``context_prob`` where the ``_mc`` tasks ran, keyed by the rows' ``series`` label; the samples
    are read from the stores of ``outs``. The series' p-values are Holm-adjusted together:
    "inversion" anywhere in the summary has probability at most ``alpha`` when no series rises
    and falls. ``peak_step``: test every series at that step instead of over the whole series.
    ``primary``: series labels or task names declared primary in advance: they are adjusted among
    themselves only, and the rest after them (``gated_holm``)."""
    source = ItemSource(list(outs))
    agree_rows = [r for r in rows if r["metric"] == AGREE_METRIC and twin_of(r["task"])]
    agree_tasks = {r["task"] for r in agree_rows}
    summary: dict[str, dict] = {}
    series = [*sorted(_points(rows, METRIC).items()), *sorted(_points(rows, GRADED_METRIC).items())]
    for key, points in series:
        twin = _agree_task(points[0]["task"], agree_tasks)
        s = summarize_series(points, source, alpha, [r for r in agree_rows if r["task"] == twin], peak_step)
        label = points[0].get("series") or points[0]["task"]
        if label in summary:  # two run folders of one base name: keep both apart
            label += f" [settings {s['settings']}]" if s["settings"] else f" [{s['run']}]"
        s["series"] = label
        summary[label] = s
    tested = [s for s in summary.values() if s["p_inversion"] is not None]
    flags = [_is_primary(s, primary or ()) for s in tested]
    gated = any(flags) and not all(flags)
    for s, flag, adjusted in zip(tested, flags, gated_holm([s["p_inversion"] for s in tested], flags)):
        family = ("primary" if flag else "secondary") if gated else "all"
        apply_verdict(s, adjusted, flags.count(flag) if gated else len(tested), family)
    for s in summary.values():
        s.pop("_agree_falls", None)
        s.pop("_mde", None)
    return summary


def _r3(x: float) -> float:
    """``x`` rounded to the table's 3 decimals, with no negative zero ("-0.000" means nothing)."""
    return round(x, 3) + 0.0


def format_summary(summary: dict) -> str:
    """The summary as a table for the terminal; the full columns are in summary.csv."""
    width = max([24, *(len(t) for t in summary)])
    lines = [f"{'series':{width}s} {'peak step':>9s} {'peak':>6s} {'final':>6s} {'drop':>6s} {'95% CI':>15s} "
             f"{'Holm p':>7s} {'to_ctx':>6s} {'to_par':>6s}  verdict"]
    for name, s in summary.items():
        ci = (f"[{_r3(s['drop_ci_low']):+.3f},{_r3(s['drop_ci_high']):+.3f}]" if s.get("drop_ci_low") is not None else "")
        flips = [("" if s.get(k) is None else str(s[k])) for k in ("flips_to_context", "flips_to_parametric")]
        lines.append(f"{name:{width}s} {s['peak_step']:9d} {s['peak']:6.3f} {s['final']:6.3f} {_r3(s['drop']):6.3f} "
                     f"{ci:>15s} {_fmt_p(s.get('p_holm')) if s.get('p_holm') is not None else '':>7s} "
                     f"{flips[0]:>6s} {flips[1]:>6s}  {s['verdict']}")
    return "\n".join(lines)


