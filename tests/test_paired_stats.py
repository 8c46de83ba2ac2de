"""Paired statistics across checkpoints (summary.csv) and the per-item table (items.csv).

The tests build 2x2 tables by hand and check the exact McNemar test against scipy; build a store
of known per-item outcomes through the store's own functions and check summary.csv against a
computation from those samples; and sweep the tiny model end to end."""

import json
import math
import time
from unittest import mock

import numpy as np
import pandas as pd
import pytest

from cf_tasks.cli import main
from cf_tasks.sweep import SweepConfig, rebuild_views, run_sweep, store
from cf_tasks.sweep.stats import (BOOTSTRAP_RESAMPLES, ITEM_COLUMNS, SUMMARY_COLUMNS, WHOLE_SERIES, bootstrap_change,
                                  holm, mcnemar_exact, outcome, paired_change, whole_series_test)
from tiny_model import build_full_checkpoint

QUIET = dict(log=lambda *a, **k: None)


# ---------------------------------------------------------------- the tests themselves
def _table(both_right, to_parametric, to_context, both_wrong):
    """Per-item counterfactual correctness at two checkpoints from the cells of a 2x2 table."""
    cells = [(True, True)] * both_right + [(True, False)] * to_parametric + [(False, True)] * to_context + \
        [(False, False)] * both_wrong
    before = {f"i{k}": a for k, (a, _) in enumerate(cells)}
    after = {f"i{k}": b for k, (_, b) in enumerate(cells)}
    return before, after


@pytest.mark.parametrize("cells", [(5, 0, 0, 5), (3, 1, 0, 2), (10, 3, 7, 4), (0, 12, 2, 1), (40, 9, 0, 0),
                                   (7, 10, 10, 3), (100, 600, 700, 50)])
def test_mcnemar_p_and_flips_equal_a_hand_built_table_and_scipy(cells):
    scipy_stats = pytest.importorskip("scipy.stats")
    both_right, to_parametric, to_context, both_wrong = cells
    before, after = _table(*cells)
    test = paired_change(before, after, resamples=200)
    assert (test["to_context"], test["to_parametric"], test["n"]) == (to_context, to_parametric, sum(cells))
    discordant = to_context + to_parametric
    reference = scipy_stats.binomtest(to_context, discordant, 0.5).pvalue if discordant else 1.0
    assert test["p"] == pytest.approx(reference, rel=1e-9, abs=1e-300)
    assert mcnemar_exact(to_parametric, to_context) == test["p"]  # two-sided: symmetric in the two directions
    assert test["change"] == pytest.approx((to_context - to_parametric) / sum(cells))


def test_no_discordant_pair_is_p_one_and_a_zero_interval():
    before, after = _table(4, 0, 0, 6)
    test = paired_change(before, after)
    assert test["p"] == 1.0 and test["change"] == 0.0 and (test["ci_low"], test["ci_high"]) == (0.0, 0.0)


def test_items_missing_at_one_checkpoint_are_left_out_of_the_pairs():
    before, after = _table(10, 5, 1, 4)
    del after["i0"], after["i12"]  # a both-right item and a to_parametric one
    before["extra"] = True
    test = paired_change(before, after, resamples=200)
    assert (test["n"], test["to_parametric"], test["to_context"]) == (18, 4, 1)


def test_bootstrap_interval_contains_the_estimate_and_is_reproducible_with_the_seed():
    gains, losses, n = 7, 31, 120
    estimate = (gains - losses) / n
    low, high = bootstrap_change(gains, losses, n, seed=3)
    assert low < estimate < high and high - low < 0.3
    assert bootstrap_change(gains, losses, n, seed=3) == (low, high)
    assert len({bootstrap_change(gains, losses, n, seed=s) for s in range(5)}) > 1  # the seed moves it
    # the shortcut (one multinomial draw per resample) is resampling items: compare with doing that
    diffs = np.array([1] * gains + [-1] * losses + [0] * (n - gains - losses))
    rng = np.random.default_rng(11)
    means = diffs[rng.integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))].mean(axis=1)
    direct = np.quantile(means, [0.025, 0.975])
    assert low == pytest.approx(direct[0], abs=0.025) and high == pytest.approx(direct[1], abs=0.025)


@pytest.mark.parametrize("sample, label", [
    ({"counterfactual_acc": 1.0, "parametric_acc": 0.0}, "counterfactual"),
    ({"counterfactual_acc": 0.0, "parametric_acc": 1.0}, "parametric"),
    ({"counterfactual_acc": 1.0, "parametric_acc": 1.0}, "both"),
    ({"counterfactual_acc": 0.0, "parametric_acc": 0.0}, "neither"),
    ({"acc": 1.0, "context_prob": 0.7}, "counterfactual"),
    ({"acc": 0.0, "context_prob": 0.2}, "parametric"),
    ({"agree_acc": 1.0}, "both"),
    ({"agree_acc": 0.0}, "neither"),
    ({"acc": 1.0}, None),  # a standard benchmark (arc_easy): no outcome label
])
def test_outcome_labels(sample, label):
    assert outcome(sample) == label


# ---------------------------------------------------------------- a store of known outcomes
N = 80
RUN = "/runs/fake"


def _samples(task, correct, metric="counterfactual_acc", parametric=(), ids=None):
    rows = []
    for i in (range(N) if ids is None else ids):
        s = {"doc_id": i, "doc": {"id": f"{task.split('_agree')[0]}-{i:03d}", "relation": "capital"}, "filter": "none",
             metric: float(i in correct)}
        if metric == "counterfactual_acc":
            s["parametric_acc"] = float(i in parametric)
        rows.append(s)
    return rows


def _put(out, step, task, samples, limit=None, run=RUN):
    """One result into the store through the store's own functions, as the sweep writes it."""
    metrics = [k for k in samples[0] if k.endswith("_acc")]
    results = {"results": {task: {**{f"{m},none": float(np.mean([s[m] for s in samples])) for m in metrics},
                                  **{f"{m}_stderr,none": 0.01 for m in metrics}}},
               "n-samples": {task: {"effective": len(samples), "original": len(samples)}},
               "versions": {task: 2.0}, "configs": {task: {}}, "samples": {task: samples}}
    settings = {"task": task, "backend": "hf", "versions": {task: 2.0}, "limit": limit, "metadata": {},
                "apply_chat_template": False}
    cid = f"ck{store.place_hash(run)[:6]}-{step}"
    h = store.settings_hash(settings)
    record = {"id": cid, "task": task, "settings": settings, "settings_hash": h, "seconds": 0.1,
              "finished": time.time()}
    store.write_result(out, cid, task, h, record, results)
    store.note_place(out, cid, {"place": f"{run}/checkpoint-{step}", "run": run, "name": f"checkpoint-{step}",
                                "step": step, "path": f"{run}/checkpoint-{step}", "kind": "full", "mtime": 0.0,
                                "model": f"{run}/checkpoint-{step}"})
    return samples


def _hand(by_step, peak_step=None):
    """The summary of one series computed from its samples: {step: samples}. The items are those
    present at every step; the peak is the two-lines test's (tested on its own in test_ushape.py),
    or ``peak_step``, where the one-sided p-values are scipy's exact binomial tests on the flips."""
    from scipy.stats import binomtest

    steps = sorted(by_step)
    right = {s: {x["doc"]["id"]: x["counterfactual_acc"] == 1.0 for x in by_step[s]} for s in steps}
    ids = sorted(set.intersection(*(set(r) for r in right.values())))
    table = [[float(right[s][i]) for s in steps] for i in ids]
    acc = {s: float(np.mean([right[s][i] for i in ids])) for s in steps}
    if peak_step is None:
        test = whole_series_test(table)
        peak = steps[test["peak"]]
    else:
        peak = peak_step
    first, final = steps[0], steps[-1]

    def flips(a, b):
        to_context = sum(1 for i in ids if right[b][i] and not right[a][i])
        to_parametric = sum(1 for i in ids if right[a][i] and not right[b][i])
        n = to_context + to_parametric
        up = binomtest(to_context, n, alternative="greater").pvalue if n else 1.0
        down = binomtest(to_parametric, n, alternative="greater").pvalue if n else 1.0
        return to_context, to_parametric, (binomtest(to_context, n).pvalue if n else 1.0), len(ids), up, down

    fall, rise = flips(peak, final), flips(first, peak)
    hand = {"first_step": first, "peak_step": peak, "final_step": final, "drop": acc[peak] - acc[final],
            "rise": acc[peak] - acc[first], "flips_to_context": fall[0], "flips_to_parametric": fall[1],
            "mcnemar_p": fall[2], "n_pairs": fall[3], "rise_flips_to_context": rise[0],
            "rise_flips_to_parametric": rise[1], "rise_mcnemar_p": rise[2], "rise_n_pairs": rise[3],
            "n_items": len(ids), "first": acc[first], "peak": acc[peak], "final": acc[final]}
    if peak_step is None:
        hand.update(p_rise=test["p_rise"], p_fall=test["p_fall"], p_inversion=test["p_inversion"])
    else:
        hand.update(p_rise=rise[4], p_fall=fall[5], p_inversion=max(rise[4], fall[5]))
    return hand


def _check(row, hand):
    for key, value in hand.items():
        assert row[key] == pytest.approx(value, rel=1e-9), key


@pytest.fixture
def fake_store(tmp_path):
    """Three knowledge-conflict series over four checkpoints and the agreeing twins of two.

    cf_bio rises (20 -> 60 of 80 right) and falls (to 24), its twin holds: an inversion.
    cf_capitals does the same, its twin falls too: a loss of reading.
    cf_quotes moves by a few items (ties at the peak, one item missing at the end): not significant.
    """
    pytest.importorskip("scipy")
    out = tmp_path / "out"
    series = {"cf_bio": {}, "cf_capitals": {}, "cf_quotes": {}}
    correct = {100: range(20), 200: range(60), 300: range(50), 400: [*range(20), 70, 71, 72, 73]}
    for step, right in correct.items():
        for task in ("cf_bio", "cf_capitals"):
            series[task][step] = _put(out, step, task, _samples(task, set(right), parametric=set(range(60, 80))))
        _put(out, step, "cf_bio_agree", _samples("cf_bio_agree", set(range(32)) - {step % 7}, metric="agree_acc"))
        _put(out, step, "cf_capitals_agree",
             _samples("cf_capitals_agree", set(range(36 if step < 300 else 12)), metric="agree_acc"))
    quotes = {100: ({0, 1, 2}, None), 200: ({0, 1, 2, 3, 4}, None), 300: ({0, 1, 2, 5, 6}, None),
              400: ({0, 1, 5}, range(1, N))}
    for step, (right, ids) in quotes.items():
        series["cf_quotes"][step] = _put(out, step, "cf_quotes", _samples("cf_quotes", right, ids=ids))
    return out, series


def test_summary_rows_equal_a_hand_computation_from_the_samples(fake_store):
    out, series = fake_store
    summary = rebuild_views(out)
    frame = pd.read_csv(out / "summary.csv")
    assert list(frame.columns) == list(SUMMARY_COLUMNS)
    assert sorted(frame["series"]) == ["cf_bio", "cf_capitals", "cf_quotes"]
    rows = frame.set_index("series")
    for task, by_step in series.items():
        _check(rows.loc[task], _hand(by_step))
        assert summary[task]["mcnemar_p"] == pytest.approx(rows.loc[task, "mcnemar_p"])
        assert rows.loc[task, "drop_ci_low"] <= rows.loc[task, "drop"] <= rows.loc[task, "drop_ci_high"]
        assert rows.loc[task, "rise_ci_low"] <= rows.loc[task, "rise"] <= rows.loc[task, "rise_ci_high"]
    bio, capitals, quotes = rows.loc["cf_bio"], rows.loc["cf_capitals"], rows.loc["cf_quotes"]
    assert (bio["peak_step"], bio["flips_to_parametric"], bio["flips_to_context"]) == (200, 40, 4)
    assert (frame["design"] == WHOLE_SERIES).all() and (frame["metric"] == "counterfactual_acc").all()
    # Holm over the three tested series: the adjusted p of each from the three p_inversion values
    assert frame["p_holm"].tolist() == pytest.approx(holm(frame["p_inversion"].tolist()))
    assert (frame["n_series_tested"] == 3).all()
    assert bio["p_holm"] < 0.05 and bio["p_holm"] >= bio["p_inversion"]
    assert bool(bio["inversion"]) and bio["verdict"].startswith("inversion (Holm p=") and "cf_bio_agree holds" in bio["verdict"]
    assert bio["agree_task"] == "cf_bio_agree" and bio["agree_mcnemar_p"] > 0.05
    assert not capitals["inversion"] and capitals["verdict"].startswith("loss of reading")
    assert capitals["agree_drop"] == pytest.approx((36 - 12) / N) and capitals["agree_mcnemar_p"] < 0.05
    assert quotes["n_items"] == N - 1 and quotes["n_pairs"] == N - 1  # item 0 missing at 400: left out everywhere
    assert not quotes["inversion"] and quotes["verdict"].startswith("no inversion shown (Holm p=")
    # what "no inversion shown" could have seen: the fall detectable at 80% power among three series
    from cf_tasks.sweep.stats import min_detectable_fall

    assert quotes["min_detectable_fall"] == pytest.approx(min_detectable_fall(N - 1, quotes["peak"], 0.05 / 3))
    assert f"under {quotes['min_detectable_fall']:.3f} could not be seen (80% power, {N - 1} items)" in quotes["verdict"]
    # one promise per word: no verdict claims significance except through Holm's p
    assert not any("significant" in v for v in frame["verdict"])
    assert all("unadjusted: rise p=" in v for v in frame["verdict"])
    assert math.isnan(quotes["agree_mcnemar_p"])  # no cf_quotes_agree rows
    # the same store, reported at a level that the cf_bio fall (Holm p ~ 1e-5) does not reach
    assert main(["report", str(out), "--alpha", "1e-6"]) == 0
    strict = pd.read_csv(out / "summary.csv").set_index("series")
    assert not strict.loc["cf_bio", "inversion"] and strict.loc["cf_bio", "alpha"] == 1e-6
    assert strict.loc["cf_bio", "mcnemar_p"] == bio["mcnemar_p"]  # the tests do not move; the verdict does


def test_a_peak_step_declared_in_advance_equals_a_hand_computation(fake_store, tmp_path, capsys):
    out, series = fake_store
    rebuild_views(out)
    assert main(["report", str(out), "--peak_step", "300"]) == 0
    frame = pd.read_csv(out / "summary.csv").set_index("series")
    for task, by_step in series.items():
        _check(frame.loc[task], _hand(by_step, peak_step=300))
        assert frame.loc[task, "design"] == "two lines at a peak declared in advance (step 300)"
    capsys.readouterr()
    before = (out / "summary.csv").read_bytes()
    for bad, shown in (("250", "--peak_step 250: not the step of a checkpoint"), ("100", "--peak_step 100: not the"),
                       ("400", "--peak_step 400: not the"), ("x", "--peak_step 'x' is not a whole number"),
                       ("\u0663\u0660\u0660", "--peak_step '\u0663\u0660\u0660' is not a whole number")):
        assert main(["report", str(out), "--peak_step", bad]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"cf-tasks: error: {shown}"), lines
        if bad.isdigit() and bad.isascii():
            assert "pass one of: 200, 300" in lines[0]
    assert (out / "summary.csv").read_bytes() == before  # nothing written


@pytest.mark.parametrize("flags, message", [
    (["--peak_step", "25"], "--peak_step 25: not the step of a checkpoint between the sweep's first and last "
                            "(steps: 10, 20, 30); pass one of: 20"),
    (["--tasks", "cf_capitals", "--primary", "cf_bio"], "--primary 'cf_bio': not a task this sweep scores; pass one "
                                                        "of: cf_capitals"),
    (["--tasks", "cf_capitals", "--primary", "cf_capitals_agree"], "--primary 'cf_capitals_agree': not a task this "
                                                                   "sweep scores; pass one of: cf_capitals")])
def test_a_verdict_flag_that_cannot_apply_stops_the_sweep_before_any_model_loads(tmp_path, capsys, flags, message):
    import cf_tasks.sweep.plan as plan

    run = tmp_path / "run"
    for step in (10, 20, 30):
        (run / f"checkpoint-{step}").mkdir(parents=True)
    with mock.patch.object(plan, "make_backend", autospec=True) as make:
        assert main(["sweep", str(run), "--output_path", str(tmp_path / "out"), *flags]) == 2
        make.assert_not_called()
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"cf-tasks: error: {message}"]


def test_series_of_other_settings_or_run_folders_are_never_paired(tmp_path):
    pytest.importorskip("scipy")
    out = tmp_path / "out"
    a = {s: _put(out, s, "cf_bio", _samples("cf_bio", set(range(k)))) for s, k in ((1, 5), (2, 30), (3, 6))}
    b = {s: _put(out, s, "cf_bio", _samples("cf_bio", set(range(k)), ids=range(20)), limit=20)
         for s, k in ((1, 1), (2, 2), (3, 19))}
    _put(out, 1, "cf_bio", _samples("cf_bio", set(range(3))), run="/runs/other")
    _put(out, 2, "cf_bio", _samples("cf_bio", set(range(3))), run="/runs/other")
    rebuild_views(out)
    frame = pd.read_csv(out / "summary.csv")
    assert len(frame) == 3 and frame["series"].is_unique
    for hand in (_hand(a), _hand(b)):
        matches = [r for _, r in frame.iterrows() if all(r[k] == pytest.approx(v) for k, v in hand.items())]
        assert len(matches) == 1, hand
    two = frame[frame["run"] == "/runs/other"].iloc[0]
    assert two["n_checkpoints"] == 2 and not two["inversion"] and math.isnan(two["p_inversion"])
    assert two["verdict"] == "2 checkpoint(s): an inverted U needs three or more"
    assert (frame["n_series_tested"].dropna() == 2).all()  # the untested series is not in Holm's family


def test_one_checkpoint_and_missing_samples_are_said_in_words(tmp_path):
    out = tmp_path / "out"
    _put(out, 1, "cf_bio", _samples("cf_bio", {1, 2}))
    summary = rebuild_views(out)
    assert summary["cf_bio"]["verdict"] == "1 checkpoint(s): an inverted U needs three or more"
    _put(out, 2, "cf_bio", _samples("cf_bio", {1}))
    _put(out, 3, "cf_bio", _samples("cf_bio", {1, 4}))
    for f in (out / "store").glob("*/cf_bio/*/samples_cf_bio.jsonl"):
        if f.parts[-4].endswith("-3"):
            f.unlink()
    s = rebuild_views(out)["cf_bio"]
    assert s["verdict"].startswith("no per-item samples at step 3") and s["mcnemar_p"] is None and not s["inversion"]


def test_report_items_writes_one_row_per_checkpoint_task_and_item(fake_store, tmp_path):
    out, _ = fake_store
    rebuild_views(out)
    merged = tmp_path / "merged"
    assert main(["report", str(out), "--output_path", str(merged), "--items"]) == 0
    items = pd.read_csv(merged / "items.csv")
    assert list(items.columns) == list(ITEM_COLUMNS)
    # 4 checkpoints x (cf_bio, cf_capitals, both twins: 80 items each) + cf_quotes' 80, 80, 80 and 79 items
    assert len(items) == 4 * 4 * N + 3 * N + N - 1
    assert set(items["outcome"]) <= {"counterfactual", "parametric", "both", "neither"}
    bio = items[(items.task == "cf_bio") & (items.step == 400)].set_index("item_id")
    assert bio.loc["cf_bio-070", "outcome"] == "both" and bio.loc["cf_bio-000", "outcome"] == "counterfactual"
    assert bio.loc["cf_bio-062", "outcome"] == "parametric" and bio.loc["cf_bio-040", "outcome"] == "neither"
    assert items["known"].isna().all() and items["context_attention"].isna().all()  # not measured here
    first = pd.read_csv(merged / "summary.csv")
    assert first["mcnemar_p"].notna().all()
    # the merged folder has no store of its own: reporting it again finds the samples where they were
    assert main(["report", str(merged)]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(merged / "summary.csv"), first)


def test_known_and_attention_fill_their_columns_where_the_samples_carry_them(tmp_path):
    out = tmp_path / "out"
    samples = _samples("cf_bio", {0, 1})
    for i, s in enumerate(samples):
        s["known_rate"], s["context_attention"] = float(i % 2), i / 100
    _put(out, 1, "cf_bio", samples)
    rebuild_views(out)
    assert main(["report", str(out), "--items"]) == 0
    items = pd.read_csv(out / "items.csv")
    assert items["known"].tolist() == [bool(i % 2) for i in range(N)]
    assert items["context_attention"].tolist() == pytest.approx([i / 100 for i in range(N)])


@pytest.mark.parametrize("alpha", ["0", "1", "-0.1", "1.5", "abc", "nan", ""])
def test_bad_alpha_is_one_line_and_exit_2(alpha, tmp_path, capsys):
    import cf_tasks.sweep.plan as plan

    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    with mock.patch.object(plan, "make_backend", autospec=True) as make:
        assert main(["sweep", str(run), "--output_path", str(tmp_path / "out"), "--alpha", alpha]) == 2
        make.assert_not_called()
    assert main(["report", str(tmp_path / "missing"), "--alpha", alpha]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"cf-tasks: error: --alpha {alpha}: must be") for line in lines)
    assert not (tmp_path / "out").exists()


def test_bad_alpha_through_the_api_stops_before_any_model_loads(tmp_path):
    import cf_tasks.sweep.plan as plan
    from cf_tasks.sweep import SweepError

    (tmp_path / "run" / "checkpoint-1").mkdir(parents=True)
    cfg = SweepConfig(run_dir=tmp_path / "run", tasks=["cf_bio"], output_path=tmp_path / "out", alpha=2.0)
    with mock.patch.object(plan, "make_backend", autospec=True) as make, pytest.raises(SweepError, match="--alpha 2.0"):
        run_sweep(cfg, **QUIET)
    make.assert_not_called()


# ---------------------------------------------------------------- the tiny model end to end
@pytest.fixture(scope="module")
def tiny_run(tiny_model, tmp_path_factory):
    run = tmp_path_factory.mktemp("paired_run")
    for step, seed in ((1, 21), (2, 22), (3, 23)):
        build_full_checkpoint(tiny_model, run / f"checkpoint-{step}", seed)
    return run


def test_a_sweep_of_the_tiny_model_keeps_every_checkpoints_samples_and_summarises_them(tiny_run, tmp_path):
    pytest.importorskip("scipy")
    out = tmp_path / "out"
    cfg = SweepConfig(run_dir=tiny_run, tasks=["cf_quotes", "cf_capitals_mc"], output_path=out, limit=4, alpha=0.2,
                      agree=False)  # the hand computation below has no agree control
    assert run_sweep(cfg, **QUIET) == 0
    records = list((out / "store").glob("*/*/*/record.json"))
    assert len(records) == 6 and all(list(r.parent.glob("samples_*.jsonl")) for r in records)
    by_step = {}
    for step in (1, 2, 3):
        path = out / "checkpoints" / f"checkpoint-{step}" / "samples_cf_quotes.jsonl"
        by_step[step] = [json.loads(line) for line in path.read_text().splitlines()]
    row = pd.read_csv(out / "summary.csv").set_index("series").loc["cf_quotes"]
    _check(row, _hand(by_step))
    assert row["alpha"] == 0.2
    # the _mc task: its graded context_prob (M_C) tested per item over the same three checkpoints
    graded = pd.read_csv(out / "summary.csv").set_index("series").loc["cf_capitals_mc"]
    assert graded["metric"] == "context_prob" and graded["n_items"] == 4 and graded["design"] == WHOLE_SERIES
    assert 0 <= graded["p_inversion"] <= 1 and math.isnan(graded["mcnemar_p"])  # no McNemar on graded values
    assert main(["report", str(out), "--items"]) == 0
    items = pd.read_csv(out / "items.csv")
    assert list(items.columns) == list(ITEM_COLUMNS) and len(items) == 3 * (4 + 4)
    labels = {(r.step, r.item_id): r.outcome for r in items[items.task == "cf_quotes"].itertuples()}
    for step, samples in by_step.items():
        for s in samples:
            assert labels[(step, s["doc"]["id"])] == outcome(s)


# ---------------------------------------------------------------- series declared primary
def test_gated_holm_equals_a_hand_computation():
    from cf_tasks.sweep.stats import gated_holm

    p = [0.01, 0.004, 0.03, 0.2, 0.001]
    # primary: series 0 and 2. Holm among them: 0.01 * 2 = 0.02, max(0.02, 0.03) = 0.03; the gate is 0.03.
    # The rest, Holm among three: 0.001 * 3 = 0.003, 0.004 * 2 = 0.008, 0.2; each at least the gate.
    assert gated_holm(p, [True, False, True, False, False]) == pytest.approx([0.02, 0.03, 0.03, 0.2, 0.03])
    assert gated_holm(p, [False] * 5) == holm(p) == gated_holm(p, [True] * 5)
    # a primary series that shows nothing closes the gate: no other series can be called
    assert min(gated_holm([0.5, 1e-6, 1e-6], [True, False, False])[1:]) == 0.5


def test_gated_holm_keeps_the_family_wise_error_rate_under_the_null():
    """Uniform p-values, 24 series, the first declared primary: "inversion" anywhere in at most
    alpha of 20,000 summaries (99.9% band)."""
    from cf_tasks.sweep.stats import gated_holm

    rng = np.random.default_rng(0)
    flags = [True] + [False] * 23
    hits = np.mean([min(gated_holm(list(rng.random(24)), flags)) < 0.05 for _ in range(20000)])
    assert hits <= 0.05 + 3.1 * math.sqrt(0.05 * 0.95 / 20000)


def test_a_primary_series_is_adjusted_alone_and_gates_the_rest(fake_store, capsys):
    out, _ = fake_store
    rebuild_views(out)
    plain = pd.read_csv(out / "summary.csv").set_index("series")
    assert (plain["family"] == "all").all()
    assert main(["report", str(out), "--primary", "cf_bio"]) == 0
    frame = pd.read_csv(out / "summary.csv").set_index("series")
    bio = frame.loc["cf_bio"]
    assert bio["family"] == "primary" and bio["n_series_tested"] == 1
    assert bio["p_holm"] == pytest.approx(bio["p_inversion"]) and bio["p_holm"] < plain.loc["cf_bio", "p_holm"]
    assert "one primary series" in bio["verdict"] and bool(bio["inversion"])
    rest = frame.loc[["cf_capitals", "cf_quotes"]]
    assert (rest["family"] == "secondary").all() and (rest["n_series_tested"] == 2).all()
    expected = [max(bio["p_holm"], a) for a in holm(rest["p_inversion"].tolist())]
    assert rest["p_holm"].tolist() == pytest.approx(expected)
    assert "over 2 series after the primary" in frame.loc["cf_quotes", "verdict"]
    # a primary series that shows nothing: no other series may be called an inversion
    assert main(["report", str(out), "--primary", "cf_quotes"]) == 0
    gated = pd.read_csv(out / "summary.csv").set_index("series")
    assert not gated["inversion"].any()
    assert (gated["p_holm"] >= gated.loc["cf_quotes", "p_holm"]).all()
    capsys.readouterr()
    before = (out / "summary.csv").read_bytes()
    for bad, shown in (("cf_nope", "--primary 'cf_nope': not a series or task of this summary; pass one of: cf_bio, "
                                   "cf_capitals, cf_quotes"),
                       ("cf_bio,", "--primary 'cf_bio,': an empty name"), ("", "--primary '': an empty name")):
        assert main(["report", str(out), "--primary", bad]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"cf-tasks: error: {shown}"), lines
    assert (out / "summary.csv").read_bytes() == before  # nothing written
