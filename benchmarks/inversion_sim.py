"""How often the sweep's "inversion" verdict fires when nothing rises and falls, and how often it
fires when something does: the summary's tests (``whole_series_test``, ``fixed_peak_test``, Holm)
on simulated per-item outcomes, beside the split-half rule of cf-tasks before (the peak chosen on a
seeded half of the items, one-sided exact McNemar tests of the rise and the fall on the other half).

Per-item outcomes: item i has its own accuracy p_i (a Beta draw around the series' accuracy level
with concentration ``kappa``: at 4 some items are nearly always right and some nearly never; at 1
most are), so an item's outcomes are correlated across checkpoints through its difficulty. With
``rho`` > 0 an item also carries a persistent state: a Gaussian AR(1) walk on the logit scale (sd
``sd``, correlation ``rho`` between neighbouring checkpoints), so that an item that just flipped tends
to stay flipped. At checkpoint t the item is right with probability expit(logit(p_i) + u_it + e_t);
the step effect e_t is solved numerically so that the mean accuracy follows the planted path
(flat; a rise of 0.2 to checkpoint 3 then flat; a rise of 0.2 to checkpoint 3 then a fall of 0.15 by
the last of 10 checkpoints, the size of the paper's Figures 2-5).

"In a sweep of 24" is one planted series among 23 flat ones: Holm's first step, p < alpha / 24.

    python benchmarks/inversion_sim.py [--series 2400] [--power_series 400] [--seed 0] [--write docs/statistics.md]
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import time
from pathlib import Path

import numpy as np

from cf_tasks.files import atomic_write
from cf_tasks.sweep.ushape import binomial_tail, fixed_peak_test, whole_series_test
from cf_tasks.sweep.stats import gated_holm

ALPHA = 0.05
CHECKPOINTS = 10
PEAK = 3  # the planted peak's checkpoint index
LEVEL = 0.4  # mean accuracy at the first checkpoint
RISE, FALL = 0.2, 0.15
SERIES_PER_SWEEP = 24
ITEMS = (40, 100, 200, 300)
# name: (kappa, rho, sd) -- heterogeneity of difficulty, persistence across checkpoints
DEPENDENCE = {"difficulty": (4.0, 0.0, 0.0), "difficulty+persistence": (4.0, 0.9, 1.0),
              "strong difficulty": (1.0, 0.0, 0.0)}
SOLVE_ITEMS = 200_000  # items drawn to solve the step effect for a target mean accuracy


def path(kind: str, checkpoints: int = CHECKPOINTS, peak: int = PEAK) -> np.ndarray:
    """Mean accuracy change from the first checkpoint, per checkpoint: flat, rise_flat or rise_fall."""
    up = np.linspace(0, RISE, peak + 1)
    if kind == "flat":
        return np.zeros(checkpoints)
    if kind == "rise_flat":
        return np.concatenate([up, np.full(checkpoints - peak - 1, RISE)])
    return np.concatenate([up, np.linspace(RISE, RISE - FALL, checkpoints - peak)[1:]])


def _latent(rng: np.random.Generator, shape: tuple[int, int, int], kappa: float, rho: float, sd: float) -> np.ndarray:
    """Logit of each item's accuracy at each checkpoint before the step effect (series, items, checkpoints)."""
    s, n, c = shape
    p = np.clip(rng.beta(LEVEL * kappa, (1 - LEVEL) * kappa, size=(s, n, 1)), 1e-6, 1 - 1e-6)
    logit = np.log(p / (1 - p)) + np.zeros((1, 1, c))
    if rho > 0:
        u = np.empty((s, n, c))
        u[..., 0] = rng.normal(0, sd, (s, n))
        for t in range(1, c):
            u[..., t] = rho * u[..., t - 1] + math.sqrt(1 - rho * rho) * rng.normal(0, sd, (s, n))
        logit = logit + u
    return logit


def step_effect(target: np.ndarray, kappa: float, rho: float, sd: float, seed: int = 0) -> np.ndarray:
    """The logit shift per checkpoint that moves the mean accuracy by ``target`` (bisection)."""
    return np.array([_shift(float(change), kappa, rho, sd, seed, SOLVE_ITEMS) for change in target])


@functools.lru_cache(maxsize=None)
def _shift(change: float, kappa: float, rho: float, sd: float, seed: int, items: int) -> float:
    base = _latent(np.random.default_rng(seed), (1, items, 1), kappa, rho, sd)[0, :, 0]
    level = (1 / (1 + np.exp(-base))).mean()
    lo, hi = -12.0, 12.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 / (1 + np.exp(-(base + mid)))).mean() - level < change else (lo, mid)
    return (lo + hi) / 2


def outcomes(rng: np.random.Generator, series: int, items: int, setting: str, kind: str = "flat",
             checkpoints: int = CHECKPOINTS) -> np.ndarray:
    """0/1 outcomes (series, items, checkpoints) under ``setting`` with the mean accuracy path ``kind``."""
    kappa, rho, sd = DEPENDENCE[setting]
    effect = step_effect(path(kind, checkpoints), kappa, rho, sd)
    logit = _latent(rng, (series, items, checkpoints), kappa, rho, sd) + effect
    return (rng.random(logit.shape) < 1 / (1 + np.exp(-logit))).astype(float)


def split_half_p(x: np.ndarray, seed: int = 0) -> float:
    """The rule before: peak chosen on a seeded half of the items, one-sided exact McNemar tests of
    first -> peak and peak -> final on the other half, p = the larger."""
    ids = list(range(x.shape[0]))
    random.Random(seed).shuffle(ids)
    sel, test = ids[:len(ids) // 2], ids[len(ids) // 2:]
    peak = int(x[sel].mean(0).argmax())
    if peak in (0, x.shape[1] - 1):
        return 1.0
    t = x[test]
    rise, fall = t[:, peak] - t[:, 0], t[:, peak] - t[:, -1]
    return max(binomial_tail(int((rise > 0).sum()), int((rise < 0).sum())),
               binomial_tail(int((fall > 0).sum()), int((fall < 0).sum())))


def test_all(x: np.ndarray, resamples: int) -> dict[str, np.ndarray]:
    """Per series: the whole-series p, the fixed-peak p (peak declared at ``PEAK``: two lines, and the
    endpoints-only test of cf-tasks before), the split-half p."""
    whole = [whole_series_test(s, resamples=resamples) for s in x]
    return {"whole": np.array([w["p_inversion"] for w in whole]), "rise": np.array([w["p_rise"] for w in whole]),
            "fixed": np.array([fixed_peak_test(s, PEAK)["p_inversion"] for s in x]),
            "endpoints": np.array([fixed_peak_test(s, PEAK, lines=False)["p_inversion"] for s in x]),
            "split": np.array([split_half_p(s) for s in x])}


def per_sweep(p: np.ndarray, alpha: float = ALPHA, size: int = SERIES_PER_SWEEP, primary: bool = False) -> float:
    """The share of sweeps of ``size`` series that name an inversion anywhere after Holm (with
    ``primary``: the first series of each sweep declared primary, ``--primary``)."""
    sweeps = len(p) // size
    flags = [primary] + [False] * (size - 1)
    return sum(any(q < alpha for q in gated_holm(list(p[i * size:(i + 1) * size]), flags))
               for i in range(sweeps)) / max(sweeps, 1)


def band(alpha: float, n: int) -> float:
    """The upper end of the 99.9% binomial band of a rate alpha estimated from n draws."""
    return alpha + 3.1 * math.sqrt(alpha * (1 - alpha) / n)


def settings_text(series: int, power_series: int, resamples: int, seed: int) -> str:
    deps = "; ".join(f"{k}: kappa {v[0]:g}, AR(1) rho {v[1]:g}, sd {v[2]:g}" for k, v in DEPENDENCE.items())
    return (f"Settings: {CHECKPOINTS} checkpoints, first accuracy {LEVEL}, planted rise {RISE} to checkpoint {PEAK} "
            f"then fall {FALL} by the last; dependence settings ({deps}); alpha {ALPHA}; in a sweep: p < alpha / "
            f"{SERIES_PER_SWEEP}; {series} series per null cell, {power_series} per power cell, {resamples} sign flips, "
            f"seed {seed}.")


BEGIN, END = "<!-- inversion_sim tables: begin -->", "<!-- inversion_sim tables: end -->"


def write_tables(path: Path, text: str) -> None:
    """Put ``text`` between the BEGIN and END markers of ``path`` (written to a temp file, then renamed)."""
    doc = path.read_text(encoding="utf-8")
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to write the tables into; add one")
    head, rest = doc.split(BEGIN, 1)
    atomic_write(path, (head + BEGIN + "\n" + text.rstrip("\n") + "\n" + END + rest.split(END, 1)[1]).encode())


def tables(series: int, power_series: int, resamples: int, seed: int) -> list[str]:
    """The null and power tables, as markdown lines."""
    out = [settings_text(series, power_series, resamples, seed), "",
           "Null: the rate of \"inversion\" (per series at alpha; per sweep of 24 after Holm; 99.9% band up to "
           f"{band(ALPHA, series):.3f} per series)", "",
           "| dependence | null | items | whole series | per sweep | per sweep, one primary | fixed peak "
           "| fixed peak, per sweep | split half (before) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setting in DEPENDENCE:
        for kind in ("flat", "rise_flat"):
            for n in (40, 200):
                rng = np.random.default_rng([seed, list(DEPENDENCE).index(setting), len(kind), n])
                p = test_all(outcomes(rng, series, n, setting, kind), resamples)
                out.append(f"| {setting} | {kind.replace('_', ' then ')} | {n} | {(p['whole'] < ALPHA).mean():.4f} | "
                           f"{per_sweep(p['whole']):.3f} | {per_sweep(p['whole'], primary=True):.3f} | "
                           f"{(p['fixed'] < ALPHA).mean():.4f} | "
                           f"{per_sweep(p['fixed']):.3f} | {(p['split'] < ALPHA).mean():.4f} |")
    out += ["", f"Power: rise {RISE} then fall {FALL} (share of series called an inversion)", "",
            "| dependence | items | whole series, alone | whole series, 1 of 24 | fixed peak, alone | fixed peak, 1 of 24 "
            "| fixed peak, endpoints (before), 1 of 24 | split half (before), 1 of 24 |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setting in DEPENDENCE:
        for n in ITEMS:
            rng = np.random.default_rng([seed, 100 + list(DEPENDENCE).index(setting), n])
            p = test_all(outcomes(rng, power_series, n, setting, "rise_fall"), resamples)
            cells = [f"{(p[k] < a).mean():.2f}" for k in ("whole", "fixed") for a in (ALPHA, ALPHA / SERIES_PER_SWEEP)]
            cells += [f"{(p[k] < ALPHA / SERIES_PER_SWEEP).mean():.2f}" for k in ("endpoints", "split")]
            out.append(f"| {setting} | {n} | " + " | ".join(cells) + " |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=2400, help="series per null cell (a multiple of 24)")
    parser.add_argument("--power_series", type=int, default=400)
    parser.add_argument("--resamples", type=int, default=9999)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path, default=None,
                        help="also put the tables into this markdown file, between its marker comments")
    args = parser.parse_args()
    start = time.perf_counter()
    text = "\n".join(tables(args.series, args.power_series, args.resamples, args.seed))
    print(text)
    if args.write:
        write_tables(args.write, text)
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
