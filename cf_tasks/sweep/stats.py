"""Paired statistics across checkpoints, and the per-item table.

The rise and fall of ``counterfactual_acc`` over fine-tuning (the paper's Figures 2-5) are read from
the same items at two checkpoints, so they are tested as paired outcomes, as the published
replication of the paper does: an exact McNemar test on the items that flipped between the two
checkpoints, and a paired bootstrap interval of the change (items resampled with replacement).

A verdict that keeps its promise: the peak is the highest of many noisy accuracies, so testing
first -> peak and peak -> final on the items that chose the peak finds a rise and a fall where there
is none. Each series' items are therefore split in two halves by a seeded shuffle of their ids
(``SELECTION_SEED``): the peak is chosen on the selection half, and the rise (first -> peak) and the
fall (peak -> final) are tested on the other half, whose outcomes played no part in the choice.
"Inversion" is an intersection-union test: the one-sided p of the rise and of the fall must both be
small, and the series' p is the larger of the two (``p_inversion``). Across the series of one
summary (one sweep or report) the p-values are adjusted by Holm's step-down method (``p_holm``),
so that the chance of naming an inversion anywhere in a sweep where nothing rises and falls stays
at most ``alpha``. Where the task's agreeing twin ``<dataset>_agree`` was scored at the peak and
final checkpoints and its ``agree_acc`` falls significantly too, the verdict is a loss of reading
instead (a veto: it can only lower the rate of "inversion").

Per-item outcomes come from the lm-eval samples that the store keeps for every checkpoint
(``store/<checkpoint id>/<task>/<settings>/samples_<task>.jsonl``); items are paired by the doc's
``id`` field. Only numbers from the standard library and numpy (a pandas dependency) are used.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from ..known import AGREE_METRIC
from ..registry import twin_name, twin_of
from .config import SweepError

ALPHA = 0.05
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # every comparison draws from its own generator with this seed: order-independent
SELECTION_SEED = 0  # the shuffle of item ids that splits a series' items into selection and test halves
METRIC = "counterfactual_acc"
OUTCOMES = ("counterfactual", "parametric", "both", "neither")
KNOWN_KEYS = ("known", "known_rate")  # a sample's per-item value of the knowledge probe, where present
ATTENTION_KEY = "context_attention"
SUMMARY_COLUMNS = (
    "series", "task", "run", "settings", "n_checkpoints", "first_step", "peak_step", "final_step", "first", "peak",
    "final", "rise", "rise_ci_low", "rise_ci_high", "rise_mcnemar_p", "rise_flips_to_context",
    "rise_flips_to_parametric", "rise_n_pairs", "drop", "drop_ci_low", "drop_ci_high", "mcnemar_p",
    "flips_to_context", "flips_to_parametric", "n_pairs", "agree_task", "agree_peak", "agree_final", "agree_drop",
    "agree_mcnemar_p", "selection_seed", "n_selection_items", "n_test_items", "p_rise", "p_fall", "p_inversion",
    "n_series_tested", "p_holm", "alpha", "inversion", "verdict",
)
ITEM_COLUMNS = ("checkpoint", "step", "task", "item_id", "relation", "outcome", "known", "context_attention", "run",
                "settings", "checkpoint_id")


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


def binomial_tail(successes: int, failures: int) -> float:
    """One-sided exact McNemar test: the probability of ``successes`` or more successes among
    ``successes + failures`` discordant pairs at p = 1/2. No discordant pair gives 1."""
    n = successes + failures
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(successes, n + 1))
    return min(1.0, tail / 2**n)


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


def split_items(item_ids, seed: int = SELECTION_SEED) -> tuple[set[str], set[str]]:
    """The selection half and the test half of a series' items: the sorted ids shuffled by
    ``random.Random(seed)``; the first ``len // 2`` select the peak, the rest test it."""
    ordered = sorted(set(item_ids))
    random.Random(seed).shuffle(ordered)
    half = len(ordered) // 2
    return set(ordered[:half]), set(ordered[half:])


def choose_peak(corrects: list[dict[str, bool] | None], selection: set[str]) -> int:
    """The index of the checkpoint with the highest accuracy on the ``selection`` items it scored
    (ties: the earliest); checkpoints without per-item outcomes are not candidates."""
    best, best_acc = 0, -1.0
    for i, correct in enumerate(corrects):
        if correct is None:
            continue
        chosen = [correct[k] for k in selection if k in correct]
        acc = sum(chosen) / len(chosen) if chosen else -1.0
        if acc > best_acc:
            best, best_acc = i, acc
    return best


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
    low, high = bootstrap_change(gains, losses, n, resamples, seed)
    return {"n": n, "to_context": gains, "to_parametric": losses, "p": mcnemar_exact(gains, losses),
            "p_up": binomial_tail(gains, losses), "p_down": binomial_tail(losses, gains),
            "change": (gains - losses) / n if n else math.nan, "ci_low": low, "ci_high": high}


# ---------------------------------------------------------------- per-item outcomes
def outcome(sample: dict) -> str | None:
    """counterfactual / parametric / both / neither: which answer an item's output gives.
    Generation tasks: from ``counterfactual_acc`` and ``parametric_acc``; ``_mc`` tasks: the
    likelier choice; ``_agree`` twins (one true answer, stated by the passage): ``both`` when
    given, else ``neither``. None for other tasks."""
    if "counterfactual_acc" in sample and "parametric_acc" in sample:
        cf, pa = bool(sample["counterfactual_acc"]), bool(sample["parametric_acc"])
        return OUTCOMES[[cf and not pa, pa and not cf, cf and pa, True].index(True)]
    if "context_prob" in sample and "acc" in sample:
        return "counterfactual" if sample["acc"] else "parametric"
    if AGREE_METRIC in sample:
        return "both" if sample[AGREE_METRIC] else "neither"
    return None


def item_id(sample: dict) -> str:
    doc = sample.get("doc") or {}
    return str(doc["id"]) if isinstance(doc, dict) and doc.get("id") is not None else f"doc{sample.get('doc_id')}"


def _known(sample: dict):
    for key in KNOWN_KEYS:
        if sample.get(key) is not None:
            return bool(sample[key])
    return None


def read_samples(path: Path) -> list[dict]:
    """One record per item (the first sample of each item id) of a samples_<task>.jsonl."""
    items, seen = [], set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            sample = json.loads(line)
            iid = item_id(sample)
            if iid in seen:
                continue
            seen.add(iid)
            doc = sample.get("doc") if isinstance(sample.get("doc"), dict) else {}
            items.append({"item_id": iid, "relation": doc.get("relation"), "outcome": outcome(sample),
                          "known": _known(sample), "context_attention": sample.get(ATTENTION_KEY),
                          "values": {k: v for k, v in sample.items() if isinstance(v, (int, float)) and k != "doc_id"
                                     and not math.isnan(v)}})
    return items


class ItemSource:
    """The samples of every result in the stores of some output folders, read once each."""

    def __init__(self, outs: list[Path]):
        self.outs = list(dict.fromkeys(Path(o) for o in outs))
        self.cache: dict[tuple, list[dict] | None] = {}

    def path(self, checkpoint_id: str | None, task: str, settings: str | None) -> Path | None:
        if not checkpoint_id or not settings:
            return None
        from .store import STORE

        for out in self.outs:
            for found in sorted((out / STORE / checkpoint_id).glob(f"*/{settings}/samples_{task}.jsonl")):
                return found
        return None

    def items(self, checkpoint_id: str | None, task: str, settings: str | None) -> list[dict] | None:
        key = (checkpoint_id, task, settings)
        if key not in self.cache:
            path = self.path(checkpoint_id, task, settings)
            try:
                self.cache[key] = read_samples(path) if path else None
            except (OSError, ValueError):  # damaged: its store sets it aside; no paired test on it meanwhile
                self.cache[key] = None
        return self.cache[key]

    def correct(self, checkpoint_id: str | None, task: str, settings: str | None, metric: str) -> dict[str, bool] | None:
        items = self.items(checkpoint_id, task, settings)
        if items is None:
            return None
        return {i["item_id"]: bool(i["values"][metric]) for i in items if metric in i["values"]}


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


def _restrict(correct: dict[str, bool], keep: set[str]) -> dict[str, bool]:
    return {k: v for k, v in correct.items() if k in keep}


def summarize_series(points: list[dict], source: ItemSource, alpha: float = ALPHA,
                     agree_points: list[dict] | None = None, seed: int = SELECTION_SEED) -> dict:
    """One summary row from one series' ``counterfactual_acc`` rows (one run folder, one settings):
    the peak chosen on the selection half of the items, the rise and the fall tested on the test
    half. The verdict here is the series' alone (a family of one); ``summarize`` adjusts it across
    the series of a sweep."""
    first, final = points[0], points[-1]
    s: dict = {c: None for c in SUMMARY_COLUMNS}
    s.update(task=first["task"], run=first.get("run"), settings=first.get("settings"), n_checkpoints=len(points),
             first_step=first["step"], final_step=final["step"], first=first["value"], final=final["value"],
             alpha=alpha, inversion=False)

    def set_peak(peak: dict) -> None:
        s.update(peak_step=peak["step"], peak=peak["value"], rise=peak["value"] - first["value"],
                 drop=peak["value"] - final["value"])

    set_peak(max(points, key=lambda r: r["value"]))  # without per-item outcomes: the highest (ties: earliest)
    if len(points) < 2:
        s["verdict"] = "one checkpoint: nothing to compare"
        return s
    task = first["task"]
    corrects = [source.correct(r.get("checkpoint_id"), task, r.get("settings"), METRIC) for r in points]
    missing = sorted({r["step"] for r, c in ((first, corrects[0]), (final, corrects[-1])) if c is None})
    if missing:
        s["verdict"] = (f"no per-item samples at step {', '.join(map(str, missing))}: paired tests not run "
                        f"(rise {s['rise']:+.3f}, drop {s['drop']:+.3f})")
        return s
    selection, test = split_items({k for c in corrects if c is not None for k in c}, seed)
    i_peak = choose_peak(corrects, selection)
    peak = points[i_peak]
    set_peak(peak)
    before, top, after = (_restrict(corrects[i], test) for i in (0, i_peak, len(points) - 1))
    rise = paired_change(before, top)
    fall = paired_change(top, after)
    s.update(selection_seed=seed, n_selection_items=len(selection), n_test_items=len(test),
             rise_ci_low=_nan_none(rise["ci_low"]), rise_ci_high=_nan_none(rise["ci_high"]), rise_mcnemar_p=rise["p"],
             rise_flips_to_context=rise["to_context"], rise_flips_to_parametric=rise["to_parametric"],
             rise_n_pairs=rise["n"],
             # the drop is peak minus final, so its interval is the change's, negated
             drop_ci_low=_nan_none(-fall["ci_high"]), drop_ci_high=_nan_none(-fall["ci_low"]), mcnemar_p=fall["p"],
             flips_to_context=fall["to_context"], flips_to_parametric=fall["to_parametric"], n_pairs=fall["n"])
    if rise["n"] == 0 or fall["n"] == 0:
        s["verdict"] = "no test items present at both checkpoints compared: paired tests not run"
        return s
    s.update(p_rise=rise["p_up"], p_fall=fall["p_down"], p_inversion=max(rise["p_up"], fall["p_down"]))
    s["_agree_falls"] = _agree(s, peak, final, source, alpha, agree_points or [])
    apply_verdict(s, p_holm=s["p_inversion"], n_tested=1)
    return s


def apply_verdict(s: dict, p_holm: float, n_tested: int) -> None:
    """``p_holm``, ``inversion`` and ``verdict`` of a tested summary row, given its adjusted p among
    the ``n_tested`` series of its family."""
    alpha = s["alpha"]
    s.update(p_holm=p_holm, n_series_tested=n_tested)
    rises, falls = s["p_rise"] < alpha, s["p_fall"] < alpha
    ps = f"rise p={_fmt_p(s['p_rise'])}, fall p={_fmt_p(s['p_fall'])}"
    if n_tested > 1:
        ps += f", Holm p={_fmt_p(p_holm)} over {n_tested} series"
    s["inversion"] = False
    if falls and s.get("_agree_falls"):
        s["verdict"] = (f"loss of reading: {s['agree_task']} falls too (agree p={_fmt_p(s['agree_mcnemar_p'])}); "
                        f"{'rise significant' if rises else 'rise not significant'} ({ps})")
    elif p_holm < alpha:
        s["inversion"] = True
        held = f"; {s['agree_task']} holds (p={_fmt_p(s['agree_mcnemar_p'])})" if s["agree_task"] else ""
        s["verdict"] = f"inversion ({ps}){held}"
    elif rises and falls:
        s["verdict"] = f"rise and fall significant alone, not after correcting for {n_tested} series ({ps})"
    elif falls:
        s["verdict"] = f"fall significant, rise not significant ({ps})"
    elif rises:
        s["verdict"] = f"rise significant, fall not significant ({ps})"
    else:
        s["verdict"] = f"rise and fall not significant ({ps})"


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
    test = paired_change(before, after)
    if not test["n"]:
        return False
    s["agree_mcnemar_p"] = test["p"]
    return test["change"] < 0 and test["p"] < alpha


def summarize(rows: list[dict], outs: list[Path] = (), alpha: float = ALPHA, seed: int = SELECTION_SEED) -> dict:
    """One summary row per series of ``counterfactual_acc`` (task x run folder x settings), keyed by
    the rows' ``series`` label; the samples are read from the stores of ``outs``. The series' p-values
    are Holm-adjusted together: "inversion" anywhere in the summary has probability at most ``alpha``
    when no series rises and falls."""
    source = ItemSource(list(outs))
    agree_rows = [r for r in rows if r["metric"] == AGREE_METRIC and twin_of(r["task"])]
    agree_tasks = {r["task"] for r in agree_rows}
    summary: dict[str, dict] = {}
    for key, points in sorted(_points(rows, METRIC).items()):
        twin = _agree_task(points[0]["task"], agree_tasks)
        s = summarize_series(points, source, alpha, [r for r in agree_rows if r["task"] == twin], seed)
        label = points[0].get("series") or points[0]["task"]
        if label in summary:  # two run folders of one base name: keep both apart
            label += f" [settings {s['settings']}]" if s["settings"] else f" [{s['run']}]"
        s["series"] = label
        summary[label] = s
    tested = [s for s in summary.values() if s["p_inversion"] is not None]
    for s, adjusted in zip(tested, holm([s["p_inversion"] for s in tested])):
        apply_verdict(s, adjusted, len(tested))
    for s in summary.values():
        s.pop("_agree_falls", None)
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


# ---------------------------------------------------------------- items.csv
def item_rows(rows: list[dict], outs: list[Path]) -> list[dict]:
    """One row per checkpoint x task x item of the tasks with an outcome label, from the samples
    in the stores of ``outs``; ``known`` and ``context_attention`` empty where not measured."""
    source = ItemSource(list(outs))
    found, seen = [], set()
    for r in rows:
        key = (r.get("run"), r["checkpoint"], r["step"], r["task"], r.get("settings"), r.get("checkpoint_id"))
        if key in seen:
            continue
        seen.add(key)
        for item in source.items(r.get("checkpoint_id"), r["task"], r.get("settings")) or ():
            if item["outcome"] is None:
                continue
            found.append({"checkpoint": r["checkpoint"], "step": r["step"], "task": r["task"], **{
                k: item[k] for k in ("item_id", "relation", "outcome", "known", "context_attention")},
                "run": r.get("run"), "settings": r.get("settings"), "checkpoint_id": r.get("checkpoint_id")})
    found.sort(key=lambda x: (x["step"], x["checkpoint"], x["run"] or "", x["task"], x["settings"] or "", x["item_id"]))
    return found
