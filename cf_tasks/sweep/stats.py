"""Paired statistics across checkpoints, and the per-item table.

The rise and fall of ``counterfactual_acc`` over fine-tuning (the paper's Figures 2-5) are read from
the same items at two checkpoints, so they are tested as paired outcomes, as the published
replication of the paper does: an exact McNemar test on the items that flipped between the two
checkpoints, and a paired bootstrap interval of the change (items resampled with replacement). Per
series (task x run folder x settings): the rise from the first checkpoint to the peak and the fall
from the peak to the final checkpoint; "inversion" only when both are significant at ``alpha``
and, where the task's agreeing twin ``<dataset>_agree`` was scored at those checkpoints, while its
``agree_acc`` does not fall significantly too (a fall in both is a loss of reading).

Per-item outcomes come from the lm-eval samples that the store keeps for every checkpoint
(``store/<checkpoint id>/<task>/<settings>/samples_<task>.jsonl``); items are paired by the doc's
``id`` field. Only numbers from the standard library and numpy (a pandas dependency) are used.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .config import SweepError

ALPHA = 0.05
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # every comparison draws from its own generator with this seed: order-independent
METRIC = "counterfactual_acc"
AGREE_SUFFIX = "_agree"
AGREE_METRIC = "agree_acc"
OUTCOMES = ("counterfactual", "parametric", "both", "neither")
KNOWN_KEYS = ("known", "known_rate")  # a sample's per-item value of the knowledge probe, where present
ATTENTION_KEY = "context_attention"
SUMMARY_COLUMNS = (
    "series", "task", "run", "settings", "n_checkpoints", "first_step", "peak_step", "final_step", "first", "peak",
    "final", "rise", "rise_ci_low", "rise_ci_high", "rise_mcnemar_p", "rise_flips_to_context",
    "rise_flips_to_parametric", "rise_n_pairs", "drop", "drop_ci_low", "drop_ci_high", "mcnemar_p",
    "flips_to_context", "flips_to_parametric", "n_pairs", "agree_task", "agree_peak", "agree_final", "agree_drop",
    "agree_mcnemar_p", "alpha", "inversion", "verdict",
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
            self.cache[key] = read_samples(path) if path else None
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
    datasets = [a[: -len(AGREE_SUFFIX)] for a in agree_tasks]
    matches = [d for d in datasets if task == d or task.startswith(d + "_")]
    return max(matches, key=len) + AGREE_SUFFIX if matches else None


def _same_settings(a: dict, b: dict) -> bool:
    """Rows evaluated under the same run-wide settings (their own task's settings hashes differ)."""
    return all(a.get(k) == b.get(k) for k in ("run", "limit", "metadata", "apply_chat_template", "backend"))


def _fmt_p(p: float | None) -> str:
    return "n/a" if p is None or (isinstance(p, float) and math.isnan(p)) else f"{p:.3g}"


def _nan_none(x):
    return None if isinstance(x, float) and math.isnan(x) else x


def summarize_series(points: list[dict], source: ItemSource, alpha: float = ALPHA,
                     agree_points: list[dict] | None = None) -> dict:
    """One summary row from one series' ``counterfactual_acc`` rows (one run folder, one settings)."""
    first, final = points[0], points[-1]
    peak = max(points, key=lambda r: r["value"])  # ties: the earliest checkpoint at the maximum
    s: dict = {c: None for c in SUMMARY_COLUMNS}
    s.update(task=first["task"], run=first.get("run"), settings=first.get("settings"), n_checkpoints=len(points),
             first_step=first["step"], peak_step=peak["step"], final_step=final["step"], first=first["value"],
             peak=peak["value"], final=final["value"], rise=peak["value"] - first["value"],
             drop=peak["value"] - final["value"], alpha=alpha, inversion=False)
    if len(points) < 2:
        s["verdict"] = "one checkpoint: nothing to compare"
        return s
    task = first["task"]
    at = {key: source.correct(r.get("checkpoint_id"), task, r.get("settings"), METRIC)
          for key, r in (("first", first), ("peak", peak), ("final", final))}
    missing = sorted({r["step"] for key, r in (("first", first), ("peak", peak), ("final", final)) if at[key] is None})
    if missing:
        s["verdict"] = (f"no per-item samples at step {', '.join(map(str, missing))}: paired tests not run "
                        f"(rise {s['rise']:+.3f}, drop {s['drop']:+.3f})")
        return s
    rise = paired_change(at["first"], at["peak"])
    fall = paired_change(at["peak"], at["final"])
    s.update(rise_ci_low=_nan_none(rise["ci_low"]), rise_ci_high=_nan_none(rise["ci_high"]), rise_mcnemar_p=rise["p"],
             rise_flips_to_context=rise["to_context"], rise_flips_to_parametric=rise["to_parametric"],
             rise_n_pairs=rise["n"],
             # the drop is peak minus final, so its interval is the change's, negated
             drop_ci_low=_nan_none(-fall["ci_high"]), drop_ci_high=_nan_none(-fall["ci_low"]), mcnemar_p=fall["p"],
             flips_to_context=fall["to_context"], flips_to_parametric=fall["to_parametric"], n_pairs=fall["n"])
    if rise["n"] == 0 or fall["n"] == 0:
        s["verdict"] = "no items present at both checkpoints compared: paired tests not run"
        return s
    rises = rise["change"] > 0 and rise["p"] < alpha
    falls = fall["change"] < 0 and fall["p"] < alpha
    agree_falls = _agree(s, peak, final, source, alpha, agree_points or [])
    ps = f"rise p={_fmt_p(rise['p'])}, fall p={_fmt_p(fall['p'])}"
    if falls and agree_falls:
        s["verdict"] = (f"loss of reading: {s['agree_task']} falls too (agree p={_fmt_p(s['agree_mcnemar_p'])}); "
                        f"{'rise significant' if rises else 'rise not significant'} ({ps})")
    elif rises and falls:
        s["inversion"] = True
        held = f"; {s['agree_task']} holds (p={_fmt_p(s['agree_mcnemar_p'])})" if s["agree_task"] else ""
        s["verdict"] = f"inversion ({ps}){held}"
    elif falls:
        s["verdict"] = f"fall significant, rise not significant ({ps})"
    elif rises:
        s["verdict"] = f"rise significant, fall not significant ({ps})"
    else:
        s["verdict"] = f"rise and fall not significant ({ps})"
    return s


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


def summarize(rows: list[dict], outs: list[Path] = (), alpha: float = ALPHA) -> dict:
    """One summary row per series of ``counterfactual_acc`` (task x run folder x settings), keyed by
    the rows' ``series`` label; the samples are read from the stores of ``outs``."""
    source = ItemSource(list(outs))
    agree_rows = [r for r in rows if r["metric"] == AGREE_METRIC and r["task"].endswith(AGREE_SUFFIX)]
    agree_tasks = {r["task"] for r in agree_rows}
    summary: dict[str, dict] = {}
    for key, points in sorted(_points(rows, METRIC).items()):
        twin = _agree_task(points[0]["task"], agree_tasks)
        s = summarize_series(points, source, alpha, [r for r in agree_rows if r["task"] == twin])
        label = points[0].get("series") or points[0]["task"]
        if label in summary:  # two run folders of one base name: keep both apart
            label += f" [settings {s['settings']}]" if s["settings"] else f" [{s['run']}]"
        s["series"] = label
        summary[label] = s
    return summary


def format_summary(summary: dict) -> str:
    """The summary as a table for the terminal; the full columns are in summary.csv."""
    width = max([24, *(len(t) for t in summary)])
    lines = [f"{'series':{width}s} {'peak step':>9s} {'peak':>6s} {'final':>6s} {'drop':>6s} {'95% CI':>15s} "
             f"{'p':>7s} {'to_ctx':>6s} {'to_par':>6s}  verdict"]
    for name, s in summary.items():
        ci = (f"[{s['drop_ci_low']:+.3f},{s['drop_ci_high']:+.3f}]" if s.get("drop_ci_low") is not None else "")
        flips = [("" if s.get(k) is None else str(s[k])) for k in ("flips_to_context", "flips_to_parametric")]
        lines.append(f"{name:{width}s} {s['peak_step']:9d} {s['peak']:6.3f} {s['final']:6.3f} {s['drop']:6.3f} "
                     f"{ci:>15s} {_fmt_p(s.get('mcnemar_p')) if s.get('mcnemar_p') is not None else '':>7s} "
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
