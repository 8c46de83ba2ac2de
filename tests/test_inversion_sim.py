"""The inversion benchmark's simulation is the one the statistics guide describes (its planted paths
and dependence settings hold), its verdict is the summary's own, and a sweep of flat series names
an inversion at most ``alpha`` of the time after Holm."""

from __future__ import annotations

import numpy as np
import pytest

from cf_tasks.sweep.items import ItemSource
from cf_tasks.sweep.stats import binomial_tail, holm, summarize_series
from cf_tasks.sweep.ushape import whole_series_test

ALPHA = 0.05


@pytest.fixture(scope="module")
def sim(load_benchmark):
    return load_benchmark("inversion_sim")


@pytest.mark.parametrize("setting", ["difficulty", "difficulty+persistence", "strong difficulty"])
def test_the_simulated_series_follow_the_planted_paths(sim, setting):
    for kind in ("flat", "rise_flat", "rise_fall"):
        x = sim.outcomes(np.random.default_rng(0), 40, 500, setting, kind)
        means = x.mean(1).mean(0)
        assert means - means[0] == pytest.approx(sim.path(kind), abs=0.015), kind
        assert means[0] == pytest.approx(sim.LEVEL, abs=0.015)


def test_items_are_correlated_across_checkpoints_and_persistence_adds_to_it(sim):
    def neighbour_correlation(setting):
        x = sim.outcomes(np.random.default_rng(1), 20, 500, setting)
        return np.mean([np.corrcoef(s[:, 4], s[:, 5])[0, 1] for s in x])

    difficulty, persistent = neighbour_correlation("difficulty"), neighbour_correlation("difficulty+persistence")
    assert 0.1 < difficulty < persistent


def test_a_flat_sweep_names_an_inversion_at_most_alpha_of_the_time(sim):
    """20 sweeps of 24 flat series (40 items, 10 checkpoints) and the per-sweep Holm rule: none may
    name an inversion beyond the binomial band of alpha over 20 sweeps (here: at most 3)."""
    x = sim.outcomes(np.random.default_rng(2), 480, 40, "difficulty")
    p = np.array([whole_series_test(s, resamples=499)["p_inversion"] for s in x])
    assert sim.per_sweep(p) <= sim.band(ALPHA, 20)
    assert (p < ALPHA).mean() <= sim.band(ALPHA, len(p))


def test_per_sweep_counts_a_sweep_once_holm_adjusted(sim):
    p = np.array([0.5] * 24 + [0.001] + [0.5] * 23 + [0.003] * 24)
    # sweep 1: nothing; sweep 2: 0.001 * 24 = 0.024 < 0.05; sweep 3: 24 ties of 0.003 -> 0.072
    assert sim.per_sweep(p) == pytest.approx(1 / 3)
    # the first series of each sweep primary, tested at alpha alone: sweep 2's 0.001 and sweep 3's
    # 0.003 are their sweeps' primaries
    assert sim.per_sweep(p, primary=True) == pytest.approx(2 / 3)
    assert sim.per_sweep(np.array([0.04] + [0.5] * 23), primary=True) == 1.0 == 1 - sim.per_sweep(np.array([0.04] + [0.5] * 23))


class _Items(ItemSource):
    """Per-item values held in memory: {checkpoint id: {item id: value}}."""

    def __init__(self, by_id: dict[str, dict[str, float]]):
        super().__init__([])
        self.by_id = by_id

    def values(self, checkpoint_id, task, settings, metric):
        return self.by_id.get(checkpoint_id)


def test_the_simulated_test_is_the_summarys_test(sim):
    x = sim.outcomes(np.random.default_rng(4), 6, 60, "difficulty", "rise_fall", checkpoints=7)
    ids = [f"item-{i:03d}" for i in range(x.shape[1])]
    for s in x:
        expected = whole_series_test(s)
        by_id = {f"c{t}": dict(zip(ids, s[:, t])) for t in range(s.shape[1])}
        points = [{"task": "cf_bio", "metric": "counterfactual_acc", "step": 10 * t, "checkpoint": f"checkpoint-{t}",
                   "checkpoint_id": f"c{t}", "settings": "h", "value": float(s[:, t].mean())} for t in range(s.shape[1])]
        row = summarize_series(points, _Items(by_id), ALPHA)
        assert row["peak_step"] == 10 * expected["peak"] and row["n_items"] == 60
        assert (row["p_rise"], row["p_fall"], row["p_inversion"]) == pytest.approx(
            (expected["p_rise"], expected["p_fall"], expected["p_inversion"]))
        assert row["inversion"] == (row["p_inversion"] < ALPHA)
        assert row["rise"] == pytest.approx(s[:, expected["peak"]].mean() - s[:, 0].mean())
        assert row["rise_ci_low"] <= row["rise"] <= row["rise_ci_high"]


def test_the_split_half_rule_of_before_is_the_one_documented(sim):
    """The benchmark's comparison column: the peak on a seeded half, McNemar on the other half."""
    x = np.zeros((10, 3))
    x[:, 1] = 1  # every item rises then falls
    assert sim.split_half_p(x) == pytest.approx(binomial_tail(5, 0))
    assert sim.split_half_p(np.ones((10, 3))) == 1.0


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


def test_the_benchmark_writes_its_tables_between_the_guides_markers(sim, tmp_path, monkeypatch):
    monkeypatch.setattr(sim, "SOLVE_ITEMS", 20_000)  # a coarser solve of the step effect: this checks the tables' form
    lines = sim.tables(24, 2, 99, 0)
    assert lines[0].startswith("Settings: 10 checkpoints") and "kappa 4, AR(1) rho 0.9" in lines[0]
    assert sum(line.startswith("| difficulty") for line in lines) == 4 + 4 + 8  # null cells, power cells
    doc = tmp_path / "guide.md"
    doc.write_text(f"intro\n{sim.BEGIN}\nold table\n{sim.END}\noutro\n")
    sim.write_tables(doc, "\n".join(lines))
    text = doc.read_text()
    assert text.startswith(f"intro\n{sim.BEGIN}\nSettings: ") and text.endswith(f"{sim.END}\noutro\n")
    assert "old table" not in text and text.count("| dependence |") == 2
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no <!-- inversion_sim tables: begin -->"):
        sim.write_tables(doc, "x")
    assert doc.read_text() == "no markers\n"
