"""Tests of an inverted U (a rise, then a fall) in per-item values over checkpoints, items as the unit.

Context-parametric inversion ("Context-Parametric Inversion: Why Instruction Finetuning May Not
Actually Improve Context Reliance", Goyal et al., ICLR 2025, Figures 2-5) is a rise of counterfactual
accuracy early in fine-tuning, then a fall. Every function here takes a matrix of per-item values,
items x checkpoints in step order: 0/1 correctness, or graded values such as the probability ratio
M_C (``context_prob``) of the ``_mc`` tasks. Items are the unit of every test: an item's values at
all checkpoints travel together, so any dependence across checkpoints (an item that is hard stays
hard) is kept.

``whole_series_test``: the two-lines test. For every interior checkpoint b (a candidate peak), the
rise is the per-item least-squares slope over checkpoints 0..b and the fall minus the slope over
b..last; each is a fixed linear combination of an item's values, averaged over items and divided by
its standard error (a t statistic). The null distribution of the largest rise statistic (and of the
largest fall statistic) over all b is drawn by a sign-flip (Rademacher multiplier) bootstrap of the
centred per-item slopes, studentised in each draw, so that choosing the peak is part of the null
(no item is spent on choosing it). The inversion's p at b is the larger of the rise's and the fall's
adjusted p at b (an intersection-union test: both must be small at one peak); the series' p is the
smallest over b, and b is the peak the summary reports.

``fixed_peak_test``: the peak declared in advance (``--peak_step``): the same two lines at that one
peak, with no choice to pay for: the rise is each item's least-squares slope over the checkpoints from
the first to the peak, the fall minus its slope from the peak to the last, each tested one-sided on
all items by a sign-flip test of the per-item slopes (exact where every item that moved moved by the
same amount: with only the peak between the first and the last checkpoint and 0/1 values, that is
the exact one-sided McNemar test; else Monte Carlo). The estimates beside it are the changes between
the three checkpoints (peak minus first, peak minus final) with paired bootstrap intervals from the
same items. ``lines=False`` tests those changes themselves instead (three checkpoints only).

``min_detectable_fall``: the fall between two checkpoints that a one-sided paired test detects with
the given power (normal approximation, outcomes at the two checkpoints independent given accuracy:
the least correlated case, so the largest such fall).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

ALPHA = 0.05
SIGN_FLIPS = 9999  # bootstrap draws: the smallest p is 1 / 10,000, well under 0.05 / 24
SIGN_FLIP_SEED = 0  # every test draws its own generator with this seed: the same data give the same p
INTERVAL_RESAMPLES = 2000
WILSON_Z = 1.959963984540054  # a two-sided 95% interval
_CHUNK = 2000  # draws per matrix product (memory: chunk x items floats)


def as_matrix(values) -> np.ndarray:
    """``values`` as a float matrix items x checkpoints; a ValueError of one line otherwise."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 2:
        raise ValueError(f"values: need a 2-D table items x checkpoints with at least one item and two checkpoints, "
                         f"got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("values: every item needs a finite value at every checkpoint; leave out items with gaps")
    return x


def slope_weights(first: int, last: int, checkpoints: int) -> np.ndarray:
    """Weights w (length ``checkpoints``) with w @ x the least-squares slope of x over positions
    ``first..last`` (checkpoint index as the abscissa), zero elsewhere."""
    t = np.arange(first, last + 1, dtype=float)
    w = np.zeros(checkpoints)
    w[first:last + 1] = (t - t.mean()) / ((t - t.mean()) ** 2).sum()
    return w


def two_lines_contrasts(checkpoints: int) -> tuple[np.ndarray, np.ndarray]:
    """The rise and fall contrasts (each candidate peaks x checkpoints) for peaks 1..checkpoints-2:
    the slope up to the peak, and minus the slope from the peak on."""
    peaks = range(1, checkpoints - 1)
    rise = np.array([slope_weights(0, b, checkpoints) for b in peaks]).reshape(-1, checkpoints)
    fall = np.array([-slope_weights(b, checkpoints - 1, checkpoints) for b in peaks]).reshape(-1, checkpoints)
    return rise, fall


def _t(mean: np.ndarray, var: np.ndarray, n: int) -> np.ndarray:
    """mean / sqrt(var / n), with 0/0 = 0 and x/0 = +-inf (every item moved alike)."""
    se = np.sqrt(np.maximum(var, 0.0) / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = mean / se
        flat = np.where(np.abs(mean) <= 1e-12, 0.0, np.copysign(np.inf, mean))
    return np.where(se > 1e-12, z, flat)


def max_t_pvalues(c: np.ndarray, resamples: int = SIGN_FLIPS, seed: int = SIGN_FLIP_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Per column of the per-item values ``c`` (items x contrasts): the one-sided t statistic of a
    mean above 0, and its p-value adjusted for taking the largest of all columns (single-step
    max-t), from ``resamples`` sign flips of the centred items, studentised in each draw."""
    n = c.shape[0]
    mean = c.mean(0)
    centred = c - mean
    var = centred.var(0, ddof=1) if n > 1 else np.zeros(c.shape[1])
    z = _t(mean, var, n)
    sq = (centred ** 2).sum(0)
    rng = np.random.default_rng(seed)
    maxima = []
    for start in range(0, resamples, _CHUNK):
        g = rng.integers(0, 2, size=(min(_CHUNK, resamples - start), n)) * 2.0 - 1.0
        m = g @ centred / n
        v = (sq - n * m ** 2) / max(n - 1, 1)
        maxima.append(_t(m, v, n).max(1))
    top = np.sort(np.concatenate(maxima))
    exceed = len(top) - np.searchsorted(top, z - 1e-12, side="left")
    return z, (1 + exceed) / (len(top) + 1)


def whole_series_test(values, resamples: int = SIGN_FLIPS, seed: int = SIGN_FLIP_SEED) -> dict:
    """The two-lines test of an inverted U over every checkpoint and every item (see the module's
    docstring). ``values``: items x checkpoints, at least three checkpoints. Returns the peak index
    (the candidate with the smallest inversion p), the rise and fall t statistics there, ``p_rise``
    and ``p_fall`` (each the smallest over peaks, adjusted for the choice), ``p_inversion`` and n."""
    x = as_matrix(values)
    n, k = x.shape
    if k < 3:
        raise ValueError(f"values: an inverted U needs at least three checkpoints, got {k}")
    rise_w, fall_w = two_lines_contrasts(k)
    z_rise, p_rise = max_t_pvalues(x @ rise_w.T, resamples, seed)
    z_fall, p_fall = max_t_pvalues(x @ fall_w.T, resamples, seed + 1)
    both = np.maximum(p_rise, p_fall)
    b = int(np.argmin(both))  # ties: the earliest
    return {"peak": b + 1, "z_rise": float(z_rise[b]), "z_fall": float(z_fall[b]), "p_rise": float(p_rise.min()),
            "p_fall": float(p_fall.min()), "p_inversion": float(both[b]), "n": n, "resamples": resamples}


# ---------------------------------------------------------------- a peak declared in advance
def binomial_tail(successes: int, failures: int) -> float:
    """The probability of ``successes`` or more heads in ``successes + failures`` fair coin flips
    (the one-sided exact McNemar test on the discordant pairs); 1 with no discordant pair."""
    n = successes + failures
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(successes, n + 1))
    return min(1.0, tail / 2**n)


def sign_flip_p(diffs: np.ndarray, resamples: int = SIGN_FLIPS, seed: int = SIGN_FLIP_SEED) -> float:
    """One-sided p of a mean of paired values above 0, by flipping each item's sign: exact where every
    non-zero value has the same size (the binomial tail over the non-zero ones; for differences in
    {-1, 0, 1} the exact McNemar test), else Monte Carlo with ``resamples`` draws,
    p = (1 + draws at least as large) / (resamples + 1)."""
    d = np.asarray(diffs, dtype=float)
    moved = np.abs(d[np.abs(d) > 1e-12])
    if not len(moved) or np.allclose(moved, moved[0], rtol=1e-9, atol=0):
        return binomial_tail(int((d > 1e-12).sum()), int((d < -1e-12).sum()))
    rng = np.random.default_rng(seed)
    observed, hits = d.sum(), 0
    for start in range(0, resamples, _CHUNK):
        g = rng.integers(0, 2, size=(min(_CHUNK, resamples - start), len(d))) * 2.0 - 1.0
        hits += int(((g @ d) >= observed - 1e-12).sum())
    return (1 + hits) / (resamples + 1)


def bootstrap_interval(diffs: np.ndarray, alpha: float = ALPHA, resamples: int = INTERVAL_RESAMPLES,
                       seed: int = SIGN_FLIP_SEED) -> tuple[float, float]:
    """Percentile interval (level 1 - alpha, two-sided) of the mean of the paired differences,
    items resampled with replacement."""
    d = np.asarray(diffs, dtype=float)
    if not len(d):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = np.concatenate([d[rng.integers(0, len(d), size=(min(_CHUNK, resamples - s), len(d)))].mean(1)
                            for s in range(0, resamples, _CHUNK)])
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def fixed_peak_test(values: Sequence[Sequence[float]], peak: int, first: int = 0, final: int = -1,
                    alpha: float = ALPHA, lines: bool = True) -> dict:
    """Rise and fall at a peak declared before looking, on all items.

    ``values``: items x checkpoints in step order (0/1 correctness or graded values in [0, 1]);
    ``peak``, ``first``, ``final``: column indices (negative ones count from the end). The tests:
    with ``lines`` (the default) each item's least-squares slope over the columns ``first..peak``
    (the rise) and minus its slope over ``peak..final`` (the fall), so every checkpoint between
    them counts; without, the changes peak minus first and peak minus final alone. Each is tested
    one-sided (above 0) by ``sign_flip_p`` over the items. Returns ``rise`` (mean of peak minus
    first) and ``fall`` (mean of peak minus final), ``p_rise``, ``p_fall``, their 1 - alpha
    bootstrap intervals (``rise_ci``, ``fall_ci``), ``p_inversion`` (the larger p: both must be
    small), ``n`` and ``test`` (``"two lines"`` or ``"endpoints"``); all from the same items. A
    ValueError of one line for a bad table or column."""
    x = as_matrix(values)
    cols = x.shape[1]
    index = {}
    for name, col in (("peak", peak), ("first", first), ("final", final)):
        if not isinstance(col, (int, np.integer)) or not -cols <= col < cols:
            raise ValueError(f"{name}={col!r}: not a column of a table with {cols} checkpoints; pass 0..{cols - 1}")
        index[name] = int(col) % cols
    if not index["first"] < index["peak"] < index["final"]:
        raise ValueError(f"peak={peak}: must lie strictly between first={first} and final={final}")
    rise = x[:, index["peak"]] - x[:, index["first"]]
    fall = x[:, index["peak"]] - x[:, index["final"]]
    if lines:
        rise_t = x @ slope_weights(index["first"], index["peak"], cols)
        fall_t = -(x @ slope_weights(index["peak"], index["final"], cols))
    else:
        rise_t, fall_t = rise, fall
    p_rise, p_fall = sign_flip_p(rise_t), sign_flip_p(fall_t, seed=SIGN_FLIP_SEED + 1)
    return {"rise": float(rise.mean()), "fall": float(fall.mean()), "p_rise": p_rise, "p_fall": p_fall,
            "rise_ci": bootstrap_interval(rise, alpha), "fall_ci": bootstrap_interval(fall, alpha, seed=SIGN_FLIP_SEED + 1),
            "p_inversion": max(p_rise, p_fall), "n": int(x.shape[0]), "test": "two lines" if lines else "endpoints",
            **{k: index[k] for k in ("peak", "first", "final")}}


# ---------------------------------------------------------------- what a test could have seen
def min_detectable_fall(n: int, accuracy: float, alpha: float = ALPHA, power: float = 0.8,
                        variance: float | None = None) -> float:
    """The smallest fall of accuracy between two checkpoints that a one-sided paired test at level
    ``alpha`` detects with probability ``power`` over ``n`` items at ``accuracy`` (normal
    approximation): (z_{1-alpha} + z_{power}) * sqrt(2 v / n), with v = a (1 - a) the variance of
    one checkpoint's 0/1 outcomes (``variance``: that of graded values instead). The two
    checkpoints' outcomes are taken as independent given the accuracy; items that keep their answer
    make the paired difference less noisy, so the fall a real series needs is at most this. nan for
    n < 1 or an accuracy outside [0, 1]."""
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha={alpha}, power={power}: both must lie strictly between 0 and 1")
    if n < 1 or not 0 <= accuracy <= 1:
        return math.nan
    if variance is None:
        a = min(max(accuracy, 0.5 / n), 1 - 0.5 / n)  # at 0 or 1 a fall is still possible: half an item
        variance = a * (1 - a)
    z = NormalDist().inv_cdf(1 - alpha) + NormalDist().inv_cdf(power)
    return z * math.sqrt(2 * variance / n)


def wilson_interval(accuracy: float, n: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval of a proportion ``accuracy`` over ``n`` items (95% by default); never
    of zero width, also at 0 and 1. (nan, nan) for n < 1."""
    if not n or n < 1:
        return math.nan, math.nan
    p = min(max(float(accuracy), 0.0), 1.0)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)
