"""The tests of an inverted U (cf_tasks.sweep.ushape, exposed by cf_tasks.sweep.stats): the fixed-peak
test (its two lines and its endpoints form) against scipy, hand-fitted slopes and an exact enumeration, the two-lines test's calibration under the null and its
power under a planted rise and fall (small seeded simulations), the smallest detectable fall against
its formula and a simulation, and Wilson intervals against known values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from cf_tasks.sweep import stats
from cf_tasks.sweep.ushape import (as_matrix, max_t_pvalues, sign_flip_p, slope_weights, two_lines_contrasts,
                                   whole_series_test)

ALPHA = 0.05


def band(alpha: float, n: int) -> float:
    """The upper end of the 99.9% binomial band of a rate alpha estimated from n draws."""
    return alpha + 3.1 * math.sqrt(alpha * (1 - alpha) / n)


def _series(rng, n, shift, kappa=4.0, level=0.4):
    """0/1 outcomes items x checkpoints: item difficulty Beta(level kappa, (1 - level) kappa), the
    logit shifted by ``shift`` per checkpoint."""
    p = np.clip(rng.beta(level * kappa, (1 - level) * kappa, size=(n, 1)), 1e-6, 1 - 1e-6)
    logit = np.log(p / (1 - p)) + np.asarray(shift)
    return (rng.random(logit.shape) < 1 / (1 + np.exp(-logit))).astype(float)


# ---------------------------------------------------------------- the public functions of stats
def test_the_study_functions_are_stats_public_api():
    assert stats.fixed_peak_test.__module__ == "cf_tasks.sweep.ushape"
    assert {"fixed_peak_test", "min_detectable_fall"} <= set(stats.__all__)


@pytest.mark.parametrize("seed", range(4))
def test_fixed_peak_endpoints_on_binary_values_is_the_one_sided_exact_mcnemar_test(seed):
    binomtest = pytest.importorskip("scipy.stats").binomtest
    x = np.random.default_rng(seed).integers(0, 2, size=(60, 5)).astype(float)
    x[:25, 2] = 1  # a rise to the peak for some items
    got = stats.fixed_peak_test(x.tolist(), peak=2, lines=False)
    assert got["test"] == "endpoints"
    for key, a, b in (("rise", 2, 0), ("fall", 2, 4)):
        up, down = int(((x[:, a] == 1) & (x[:, b] == 0)).sum()), int(((x[:, a] == 0) & (x[:, b] == 1)).sum())
        hand = binomtest(up, up + down, 0.5, alternative="greater").pvalue if up + down else 1.0
        assert got[f"p_{key}"] == pytest.approx(hand, rel=1e-12)
        assert got[key] == pytest.approx((x[:, a] - x[:, b]).mean())
        low, high = got[f"{key}_ci"]
        assert low <= got[key] <= high  # the interval from the same items as the estimate
    assert got["p_inversion"] == max(got["p_rise"], got["p_fall"]) and got["n"] == 60
    assert (got["first"], got["peak"], got["final"]) == (0, 2, 4)


def test_fixed_peak_on_graded_values_matches_an_exact_sign_flip_enumeration():
    rng = np.random.default_rng(5)
    d = rng.normal(0.15, 0.3, size=12)
    exact = _exact_sign_flip_p(d)
    # the Monte Carlo p of 9,999 flips lies within 4 standard errors of the exact one
    assert sign_flip_p(d) == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / 9999) + 1e-4)
    graded = np.column_stack([np.full(12, 0.5), 0.5 + d, 0.5 + d / 3])
    got = stats.fixed_peak_test(graded, peak=1)
    assert got["p_rise"] == sign_flip_p(d) and got["rise"] == pytest.approx(d.mean())


def _exact_sign_flip_p(d):
    """The one-sided sign-flip p of the mean of ``d`` above 0 by enumerating every sign pattern."""
    return np.mean([np.dot(signs, np.abs(d)) >= d.sum() - 1e-12 for signs in itertools.product((-1, 1), repeat=len(d))])


@pytest.mark.parametrize("seed", range(3))
def test_fixed_peak_two_lines_tests_hand_fitted_slopes_by_an_exact_enumeration(seed):
    """The default test at a declared peak: each item's least-squares line up to the peak and from
    it (numpy's polyfit, by hand), every sign pattern of the 12 items enumerated."""
    rng = np.random.default_rng(seed)
    x = (rng.random((12, 6)) < np.array([0.3, 0.45, 0.6, 0.65, 0.5, 0.4])).astype(float)
    got = stats.fixed_peak_test(x, peak=3)
    rise = np.array([np.polyfit(np.arange(4), row[:4], 1)[0] for row in x])
    fall = -np.array([np.polyfit(np.arange(3), row[3:], 1)[0] for row in x])
    for key, d in (("rise", rise), ("fall", fall)):
        exact = _exact_sign_flip_p(d)
        assert got[f"p_{key}"] == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / 9999) + 1e-4), key
    # the estimates stay the changes between the three checkpoints, from the same items
    assert got["rise"] == pytest.approx((x[:, 3] - x[:, 0]).mean())
    assert got["fall"] == pytest.approx((x[:, 3] - x[:, 5]).mean())
    assert got["test"] == "two lines" and got["p_inversion"] == max(got["p_rise"], got["p_fall"])


def test_two_lines_differ_from_the_endpoints_where_the_middle_checkpoints_speak():
    """Every item right at the first checkpoint, the peak and the last, so the endpoints see no
    change; wrong at the second and at the sixth, so each item's line rises to the peak (1, 0, 1, 1:
    slope 0.1) and falls after it (1, 1, 0, 1: slope -0.1). Only the two lines see it."""
    x = np.ones((30, 7))
    x[:, 1] = x[:, 5] = 0
    lines, ends = stats.fixed_peak_test(x, peak=3), stats.fixed_peak_test(x, peak=3, lines=False)
    assert ends["p_rise"] == 1.0 and ends["p_fall"] == 1.0 and ends["rise"] == ends["fall"] == 0
    assert lines["p_rise"] == lines["p_fall"] == stats.binomial_tail(30, 0)  # all 30 items, one slope size


def test_a_sign_flip_of_values_of_one_size_is_the_exact_binomial_tail():
    d = np.array([0.5, 0.5, -0.5, 0.0, 0.5, 0.5, 0.5, -0.5, 0.5, 0.5])
    assert sign_flip_p(d) == stats.binomial_tail(7, 2) == pytest.approx(_exact_sign_flip_p(d))


@pytest.mark.parametrize("peak, first, final, message", [
    (0, 0, -1, "strictly between"), (4, 0, -1, "strictly between"), (7, 0, -1, "peak=7: not a column"),
    (2, 3, -1, "strictly between"), (1.5, 0, -1, "peak=1.5: not a column")])
def test_fixed_peak_refuses_a_bad_column_in_one_line(peak, first, final, message):
    with pytest.raises(ValueError, match=message) as err:
        stats.fixed_peak_test(np.zeros((5, 5)), peak, first, final)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("values", [[1, 0, 1], [[1], [0]], [[0, 1], [1, math.nan]], []])
def test_a_table_that_is_not_items_by_checkpoints_is_refused(values):
    with pytest.raises(ValueError, match="values: "):
        as_matrix(values)


# ---------------------------------------------------------------- the two-lines test
def test_the_contrasts_are_least_squares_slopes():
    x = np.array([0.1, 0.4, 0.5, 0.2, 0.3])
    for first, last in ((0, 2), (2, 4), (0, 4)):
        t = np.arange(first, last + 1)
        assert slope_weights(first, last, 5) @ x == pytest.approx(np.polyfit(t, x[first:last + 1], 1)[0])
    rise, fall = two_lines_contrasts(5)
    assert rise.shape == fall.shape == (3, 5)  # candidate peaks 1, 2, 3
    assert fall[0] @ x == pytest.approx(-np.polyfit(np.arange(1, 5), x[1:], 1)[0])


def test_max_t_p_values_are_adjusted_for_the_largest_of_the_columns():
    rng = np.random.default_rng(0)
    c = rng.normal(0, 1, size=(80, 6))
    c[:, 2] += 0.6
    z, p = max_t_pvalues(c, resamples=1999)
    assert int(np.argmax(z)) == 2 and p[2] == p.min()
    # a single column's sign-flip p is no larger than its p adjusted for six columns
    _, alone = max_t_pvalues(c[:, [2]], resamples=1999)
    assert alone[0] <= p[2] and p[2] < 0.05
    assert np.all(np.diff(p[np.argsort(-z)]) >= 0)  # a larger statistic never gets a larger p


def test_every_item_moving_alike_is_the_smallest_p_not_a_crash():
    x = np.column_stack([np.zeros(30), np.ones(30), np.zeros(30)])
    got = whole_series_test(x, resamples=199)
    assert got["p_inversion"] == pytest.approx(1 / 200) and got["peak"] == 1
    flat = whole_series_test(np.ones((30, 4)), resamples=199)
    assert flat["p_rise"] == 1.0 and flat["p_fall"] == 1.0


def test_under_the_flat_null_the_rise_alone_stays_within_alphas_band():
    """400 series of 60 items over 6 checkpoints, outcomes independent of the step (items differ
    in difficulty): the rise's max-t p (the peak chosen inside the null) is below alpha at most
    alpha of the time, and "inversion" too."""
    rng = np.random.default_rng(1)
    tested = [whole_series_test(_series(rng, 60, np.zeros(6)), resamples=499) for _ in range(400)]
    rise = np.mean([t["p_rise"] < ALPHA for t in tested])
    assert rise <= band(ALPHA, 400) and rise >= 0.01  # calibrated, not merely conservative
    assert np.mean([t["p_inversion"] < ALPHA for t in tested]) <= band(ALPHA, 400)


def test_a_real_rise_without_a_fall_is_not_called_an_inversion_more_than_alpha():
    """The least favourable null of the intersection-union test: the rise is real, so the verdict
    rests on the fall alone."""
    rng = np.random.default_rng(2)
    shift = np.array([0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    tested = [whole_series_test(_series(rng, 60, shift), resamples=499) for _ in range(400)]
    assert np.mean([t["p_rise"] < ALPHA for t in tested]) > 0.9
    assert np.mean([t["p_inversion"] < ALPHA for t in tested]) <= band(ALPHA, 400)


def test_a_planted_inversion_is_found_at_the_benchmarks_power(load_benchmark):
    """The benchmark's planted rise of 0.2 to checkpoint 3 and fall of 0.15 by the last of 10, 200
    items: power 0.98 alone and 0.79 as one of 24 series in the guide's table (400 series); here 80."""
    sim = load_benchmark("inversion_sim")
    x = sim.outcomes(np.random.default_rng(3), 80, 200, "difficulty", "rise_fall")
    assert x.shape == (80, 200, 10)
    means = x.mean(1).mean(0)
    assert means[3] - means[0] == pytest.approx(0.2, abs=0.02) and means[3] - means[-1] == pytest.approx(0.15, abs=0.02)
    tested = [whole_series_test(s, resamples=1999) for s in x]
    p = np.array([t["p_inversion"] for t in tested])
    assert (p < ALPHA).mean() >= 0.9 and (p < ALPHA / 24).mean() >= 0.7
    assert np.median([t["peak"] for t in tested]) in (2, 3, 4)


def test_a_planted_inversion_is_found_at_a_declared_peak_at_the_benchmarks_power(load_benchmark):
    """The same planted series, the peak declared at checkpoint 3: power 0.90 as one of 24 series in
    the guide's table (400 series), 0.67 for the endpoints-only test of before; here 80 series."""
    sim = load_benchmark("inversion_sim")
    x = sim.outcomes(np.random.default_rng(4), 80, 200, "difficulty", "rise_fall")
    lines = np.array([stats.fixed_peak_test(s, 3)["p_inversion"] for s in x])
    ends = np.array([stats.fixed_peak_test(s, 3, lines=False)["p_inversion"] for s in x])
    assert (lines < ALPHA / 24).mean() >= 0.78
    assert (lines < ALPHA / 24).mean() > (ends < ALPHA / 24).mean() + 0.1


# ---------------------------------------------------------------- what a test could have seen
def test_min_detectable_fall_is_the_normal_formula():
    z = 1.6448536269514722 + 0.8416212335729143
    assert stats.min_detectable_fall(100, 0.5) == pytest.approx(z * math.sqrt(2 * 0.25 / 100))
    assert stats.min_detectable_fall(40, 0.4) > stats.min_detectable_fall(400, 0.4)
    assert stats.min_detectable_fall(40, 0.4, alpha=ALPHA / 24) > stats.min_detectable_fall(40, 0.4)
    assert stats.min_detectable_fall(40, 1.0) > 0  # a fall from 1 is possible
    assert math.isnan(stats.min_detectable_fall(0, 0.5))
    with pytest.raises(ValueError, match="alpha="):
        stats.min_detectable_fall(40, 0.5, alpha=0)


def test_a_fall_of_the_min_detectable_size_is_found_about_80_percent_of_the_time():
    """Independent outcomes at accuracy 0.5 then 0.5 - mde, 200 items, the exact one-sided McNemar
    test of the fixed-peak design (``fixed_peak_test``'s p for 0/1 values): 600 simulated series."""
    n, acc = 200, 0.5
    mde = stats.min_detectable_fall(n, acc)
    rng = np.random.default_rng(7)
    found = []
    for _ in range(600):
        peak, final = rng.random(n) < acc, rng.random(n) < acc - mde
        found.append(stats.binomial_tail(int((peak & ~final).sum()), int((final & ~peak).sum())) < ALPHA)
    assert 0.72 <= np.mean(found) <= 0.88


def test_wilson_intervals_equal_known_values_and_never_have_zero_width():
    low, high = stats.wilson_interval(0.0, 10)
    assert low == pytest.approx(0.0) and high == pytest.approx(0.2775, abs=1e-4)
    low, high = stats.wilson_interval(1.0, 10)
    assert high == pytest.approx(1.0) and low == pytest.approx(0.7225, abs=1e-4)
    low, high = stats.wilson_interval(0.5, 100)
    assert (low, high) == pytest.approx((0.4038, 0.5962), abs=1e-4)
    assert stats.wilson_interval(0.3, 0) == pytest.approx((math.nan, math.nan), nan_ok=True)


def test_the_plots_bars_are_wilson_intervals_never_of_zero_width(tmp_path):
    """A series at accuracy 0 and 1: every bar drawn has its Wilson width (below and above the
    point) and none is zero; a point without n gets no bar."""
    from unittest import mock

    from matplotlib.axes import Axes

    from cf_tasks.sweep import views

    rows = [{"checkpoint": f"checkpoint-{s}", "step": s, "task": "cf_bio", "metric": m, "value": v, "stderr": 0.0,
             "n": n, "run": "/r", "limit": None, "model": "/r/m"}
            for s, v, n in ((1, 0.0, 20), (2, 1.0, 20), (3, 0.5, None))
            for m in ("counterfactual_acc", "parametric_acc")]
    views.label_series(rows)
    real = Axes.errorbar
    with mock.patch.object(Axes, "errorbar", autospec=True, side_effect=real) as drawn:
        views.plot(rows, tmp_path / "p.png")
    assert drawn.call_count == 2 and (tmp_path / "p.png").stat().st_size > 0
    for call in drawn.call_args_list:
        below, above = call.kwargs["yerr"]
        assert below[0] == pytest.approx(0.0, abs=1e-12) and above[0] == pytest.approx(0.1611, abs=1e-3)  # 0 of 20
        assert above[1] == pytest.approx(0.0, abs=1e-12) and below[1] == pytest.approx(0.1611, abs=1e-3)  # 20 of 20
        assert math.isnan(below[2]) and math.isnan(above[2])  # no n: no bar
        assert all(lo + hi > 0 for lo, hi in zip(below[:2], above[:2]))
