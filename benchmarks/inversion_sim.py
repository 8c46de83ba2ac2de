"""How often the sweep's "inversion" verdict fires when nothing rises and falls, and how often it
fires when something does: the summary's rule simulated on per-item outcomes, next to the rule of
cf-tasks 0.x before the split (peak and tests on the same items, no correction across series).

Per-item outcomes: item i has its own accuracy p_i (a Beta draw around the series' accuracy
level, concentration ``CONCENTRATION``: some items nearly always right, some nearly never), and
at checkpoint t it is right with probability expit(logit(p_i) + e_t), drawn independently per
checkpoint. Under the null e_t = 0 (outcomes that do not depend on the step); the least
favourable null for an intersection-union test is a real rise with no fall (e_t climbs to
``RISE`` and stays). The planted effect is a rise to a peak at a third of the checkpoints and a
fall back to the start.

The new rule uses the summary's own functions (``split_items``, ``choose_peak``'s tie rule,
``binomial_tail``, ``holm``) on arrays; ``tests/test_inversion_sim.py`` checks that it gives the
same peak and p-values as ``summarize`` on the same items.

    python benchmarks/inversion_sim.py [--series 4000] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from cf_tasks.sweep.stats import SELECTION_SEED, binomial_tail, holm, mcnemar_exact, split_items

ALPHA = 0.05
CONCENTRATION = 4.0  # Beta(a, b) with a + b = 4: items differ a lot in how often they are right
LEVELS = (0.1, 0.3, 0.5, 0.7)
CHECKPOINTS = (5, 10, 20, 50)
ITEMS = (50, 200, 1000)
SERIES_PER_SWEEP = 24  # the series one sweep of cf_suite reports at once
RISE = 1.0  # the least favourable null's rise, on the logit scale


def item_ids(n: int) -> list[str]:
    return [f"item-{i:04d}" for i in range(n)]


def outcomes(rng: np.random.Generator, series: int, checkpoints: int, items: int, level: float,
             effect: np.ndarray | None = None) -> np.ndarray:
    """Booleans (series, checkpoints, items): right or wrong; ``effect`` the logit shift per checkpoint."""
    p = rng.beta(level * CONCENTRATION, (1 - level) * CONCENTRATION, size=(series, 1, items))
    p = np.clip(p, 1e-6, 1 - 1e-6)
    logit = np.log(p / (1 - p))
    shift = np.zeros(checkpoints) if effect is None else np.asarray(effect, dtype=float)
    prob = 1 / (1 + np.exp(-(logit + shift[None, :, None])))
    return rng.random((series, checkpoints, items)) < prob


def rise_and_fall(checkpoints: int, size: float) -> np.ndarray:
    """A logit shift that climbs to ``size`` at a third of the checkpoints and falls back to 0."""
    peak = max(1, checkpoints // 3)
    up = np.linspace(0, size, peak + 1)
    down = np.linspace(size, 0, checkpoints - peak)
    return np.concatenate([up, down[1:]])


def rise_only(checkpoints: int, size: float = RISE) -> np.ndarray:
    peak = max(1, checkpoints // 3)
    return np.concatenate([np.linspace(0, size, peak + 1), np.full(checkpoints - peak - 1, size)])


def _flips(x: np.ndarray, before: np.ndarray, after: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.arange(x.shape[0])
    b, a = x[rows, before][:, mask], x[rows, after][:, mask]
    return (a & ~b).sum(1), (b & ~a).sum(1)


def new_rule(x: np.ndarray, seed: int = SELECTION_SEED) -> dict[str, np.ndarray]:
    """The summary's test of each series (before Holm): peak on the selection half, one-sided
    exact McNemar tests of the rise and the fall on the test half, p = the larger."""
    s, c, n = x.shape
    ids = item_ids(n)
    selection, _ = split_items(ids, seed)
    sel = np.array([i in selection for i in ids])
    peak = x[:, :, sel].mean(2).argmax(1)  # argmax: the earliest of equal maxima, as choose_peak
    first, final = np.zeros(s, int), np.full(s, c - 1)
    up, back = _flips(x, first, peak, ~sel)
    down_to_ctx, down = _flips(x, peak, final, ~sel)
    p_rise = np.array([binomial_tail(int(g), int(lo)) for g, lo in zip(up, back)])
    p_fall = np.array([binomial_tail(int(lo), int(g)) for g, lo in zip(down_to_ctx, down)])
    return {"peak": peak, "p_rise": p_rise, "p_fall": p_fall, "p": np.maximum(p_rise, p_fall)}


def old_rule(x: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """The verdict before the split: the peak and both two-sided tests on all items."""
    s, c, n = x.shape
    peak = x.mean(2).argmax(1)
    first, final, every = np.zeros(s, int), np.full(s, c - 1), np.ones(n, bool)
    up, back = _flips(x, first, peak, every)
    to_ctx, down = _flips(x, peak, final, every)
    rises = np.array([g > lo and mcnemar_exact(int(g), int(lo)) < alpha for g, lo in zip(up, back)])
    falls = np.array([lo > g and mcnemar_exact(int(g), int(lo)) < alpha for g, lo in zip(to_ctx, down)])
    return rises & falls


def simulate(rng: np.random.Generator, series: int, shape=None, effect=None, alpha: float = ALPHA,
             chunk: int = 200) -> dict[str, np.ndarray]:
    """``series`` series, each of a random (level, checkpoints, items) from the grids (or ``shape``);
    ``effect(checkpoints)`` the logit shift (None: the null). Per series: the old verdict and the
    new p before Holm."""
    old, new, rise_p = [], [], []
    done = 0
    while done < series:
        level, c, n = shape or (LEVELS[rng.integers(len(LEVELS))], CHECKPOINTS[rng.integers(len(CHECKPOINTS))],
                                ITEMS[rng.integers(len(ITEMS))])
        k = min(chunk if shape else 20, series - done)
        x = outcomes(rng, k, c, n, level, None if effect is None else effect(c))
        old.append(old_rule(x, alpha))
        tested = new_rule(x)
        new.append(tested["p"])
        rise_p.append(tested["p_rise"])
        done += k
    return {"old": np.concatenate(old), "p": np.concatenate(new), "p_rise": np.concatenate(rise_p)}


def per_sweep(flags_or_p: np.ndarray, alpha: float = ALPHA, size: int = SERIES_PER_SWEEP, holm_p: bool = True) -> float:
    """The share of sweeps of ``size`` series that name an inversion anywhere (Holm-adjusted
    p-values for the new rule, the old verdicts as they are)."""
    sweeps = len(flags_or_p) // size
    hits = 0
    for i in range(sweeps):
        part = flags_or_p[i * size:(i + 1) * size]
        hits += any(p < alpha for p in holm(list(part))) if holm_p else bool(part.any())
    return hits / sweeps


def band(alpha: float, n: int) -> float:
    """The upper end of the 99.9% binomial band of a rate alpha estimated from n draws."""
    return alpha + 3.1 * math.sqrt(alpha * (1 - alpha) / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=4800)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    for name, effect in (("null: outcomes independent of the step", None),
                         ("null for the fall: a real rise, no fall", rise_only)):
        sim = simulate(rng, args.series, effect=effect)
        n = len(sim["p"])
        print(f"{name} ({n} series, levels {LEVELS}, checkpoints {CHECKPOINTS}, items {ITEMS}, alpha {ALPHA})")
        print(f"  per series:   old rule {sim['old'].mean():.4f}   new rule {(sim['p'] < ALPHA).mean():.4f}"
              f"   (band up to {band(ALPHA, n):.4f})")
        print(f"  per sweep of {SERIES_PER_SWEEP}: old rule {per_sweep(sim['old'], holm_p=False):.4f}   "
              f"new rule (Holm) {per_sweep(sim['p']):.4f}   ({n // SERIES_PER_SWEEP} sweeps)")
    print("\npower: rise to a peak at a third of 10 checkpoints and fall back; accuracy level 0.4; "
          "400 series per cell")
    print("| rise and fall (mean accuracy) | items | old rule | new, alone | new, 1 of 24 series (Holm) |")
    print("|---|---|---|---|---|")
    for size in (0.25, 0.5, 0.75, 1.0):
        for n in (100, 250, 500, 1000):
            effect = rise_and_fall(10, size)
            x_rng = np.random.default_rng([args.seed, int(size * 100), n])
            x = outcomes(x_rng, 400, 10, n, 0.4, effect)
            change = x[:, 3].mean() - x[:, 0].mean()
            tested = new_rule(x)
            print(f"| {change:.3f} (logit {size}) | {n} | {old_rule(x).mean():.2f} | {(tested['p'] < ALPHA).mean():.2f} | "
                  f"{(tested['p'] < ALPHA / SERIES_PER_SWEEP).mean():.2f} |")
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
