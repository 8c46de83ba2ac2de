"""The inversion verdict keeps its promise: simulated series where nothing rises and falls name an
inversion at most ``alpha`` of the time (per series, and per sweep after Holm), and the simulation's
rule is the summary's own (same peak, same p-values as ``summarize_series`` on the same items)."""

from __future__ import annotations


import numpy as np
import pytest

from cf_tasks.sweep.stats import ItemSource, binomial_tail, holm, split_items, summarize_series

ALPHA = 0.05


@pytest.fixture(scope="module")
def sim(load_benchmark):
    return load_benchmark("inversion_sim")


def test_under_the_null_the_rate_of_inversion_stays_within_alphas_band(sim):
    """2,400 series of outcomes that do not depend on the step: accuracy levels 0.1-0.7, 5-50
    checkpoints, 50-1,000 items. Each of the two one-sided tests alone, the per-series verdict and
    the per-sweep verdict (100 sweeps of 24 series, Holm) stay within alpha's binomial band."""
    result = sim.simulate(np.random.default_rng(1), 2400)
    n = len(result["p"])
    assert n == 2400
    assert (result["p_rise"] < ALPHA).mean() <= sim.band(ALPHA, n)
    assert (result["p"] < ALPHA).mean() <= sim.band(ALPHA, n)
    assert sim.per_sweep(result["p"]) <= sim.band(ALPHA, n // sim.SERIES_PER_SWEEP)


def test_a_real_rise_without_a_fall_is_not_called_an_inversion_more_than_alpha(sim):
    """The least favourable null of an intersection-union test: the rise is real, so the verdict
    rests on the fall test alone. The old rule (peak and tests on the same items) fails here."""
    result = sim.simulate(np.random.default_rng(2), 2400, effect=sim.rise_only)
    n = len(result["p"])
    assert (result["p"] < ALPHA).mean() <= sim.band(ALPHA, n)
    assert result["old"].mean() > sim.band(ALPHA, n)  # the peak chosen on the tested items: biased


def test_a_planted_rise_and_fall_is_found(sim):
    x = sim.outcomes(np.random.default_rng(3), 200, 10, 500, 0.4, sim.rise_and_fall(10, 1.0))
    assert (sim.new_rule(x)["p"] < ALPHA).mean() > 0.9


class _Items(ItemSource):
    """Per-item outcomes held in memory: {checkpoint id: {item id: right}}."""

    def __init__(self, by_id: dict[str, dict[str, bool]]):
        super().__init__([])
        self.by_id = by_id

    def correct(self, checkpoint_id, task, settings, metric):
        return self.by_id.get(checkpoint_id)


def test_the_simulated_rule_is_the_summarys_rule(sim):
    x = sim.outcomes(np.random.default_rng(4), 12, 7, 60, 0.5, sim.rise_and_fall(7, 0.8))
    tested = sim.new_rule(x)
    ids = sim.item_ids(x.shape[2])
    for s in range(x.shape[0]):
        by_id = {f"c{t}": {i: bool(v) for i, v in zip(ids, x[s, t])} for t in range(x.shape[1])}
        points = [{"task": "cf_bio", "step": 10 * t, "checkpoint": f"checkpoint-{t}", "checkpoint_id": f"c{t}",
                   "settings": "h", "value": float(x[s, t].mean())} for t in range(x.shape[1])]
        row = summarize_series(points, _Items(by_id), ALPHA)
        assert row["peak_step"] == 10 * tested["peak"][s]
        assert (row["p_rise"], row["p_fall"], row["p_inversion"]) == pytest.approx(
            (tested["p_rise"][s], tested["p_fall"][s], tested["p"][s]))
        assert row["n_selection_items"] + row["n_test_items"] == 60 and row["selection_seed"] == 0
        assert row["inversion"] == (row["p_inversion"] < ALPHA)


def test_holm_equals_a_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    # sorted: 0.005*5, 0.01*4, 0.03*3, 0.04*2, 0.5*1, then made monotone
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.5])
    assert holm([]) == [] and holm([0.7]) == [0.7] and holm([0.6, 0.6]) == [1.0, 1.0]


def test_one_sided_binomial_tail_equals_scipy():
    stats = pytest.importorskip("scipy.stats")
    for k, n in ((0, 0), (3, 10), (9, 10), (40, 100), (70, 100)):
        expected = stats.binomtest(k, n, 0.5, alternative="greater").pvalue if n else 1.0
        assert binomial_tail(k, n - k) == pytest.approx(expected, rel=1e-12)


def test_the_split_is_seeded_disjoint_and_half():
    ids = [f"x{i}" for i in range(101)]
    selection, test = split_items(ids, 0)
    assert (selection, test) == split_items(reversed(ids), 0)  # the order the items come in does not matter
    assert not selection & test and selection | test == set(ids) and (len(selection), len(test)) == (50, 51)
    assert split_items(ids, 1) != (selection, test)
