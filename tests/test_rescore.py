"""A scorer change is seen by the store: results carry the scorer version, a sweep after a change
rescores the stored samples without loading a model, and ``report`` refuses to mix versions."""

from __future__ import annotations

import contextlib
import json
import time
from unittest import mock

import pandas as pd
import pytest

import cf_tasks.sweep.plan as plan
import cf_tasks.sweep.settings as sweep_settings
import cf_tasks.tasks as tasks
from cf_tasks.cli import main
from cf_tasks.scoring import SCORER_VERSION, Outcome
from cf_tasks.sweep import SweepConfig, SweepError, report, run_sweep
from tiny_model import build_full_checkpoint

QUIET = dict(log=lambda *a, **k: None)


def _scorer_changed() -> contextlib.ExitStack:
    """A scorer change: the version each task's settings carry (``sweep.settings``) and the one the
    sweep's rescoring line names (``sweep.plan``)."""
    stack = contextlib.ExitStack()
    for module in (sweep_settings, plan):
        stack.enter_context(mock.patch.object(module, "SCORER_VERSION", SCORER_VERSION + 1))
    return stack
TASK = "cf_capitals"


@pytest.fixture(scope="module")
def swept(tiny_model, tmp_path_factory):
    """Two checkpoints of the tiny model swept once (knowledge probe on, no agreeing twin)."""
    root = tmp_path_factory.mktemp("rescore")
    run = root / "run"
    for step, seed in ((1, 31), (2, 32)):
        build_full_checkpoint(tiny_model, run / f"checkpoint-{step}", seed)
    cfg = SweepConfig(run_dir=run, tasks=[TASK], output_path=root / "out", limit=3, agree=False)
    assert run_sweep(cfg, **QUIET) == 0
    return cfg


def _every_answer_is_the_context(doc, generation):
    return Outcome(counterfactual=True, parametric=False)


def test_results_carry_the_scorer_version(swept):
    rows = pd.read_csv(swept.output_path / "sweep.csv")
    assert set(rows.loc[rows.task == TASK, "scorer_version"]) == {SCORER_VERSION}
    for record in (swept.output_path / "store").glob(f"*/{TASK}/*/record.json"):
        assert json.loads(record.read_text())["settings"]["scorer_version"] == SCORER_VERSION
        assert json.loads((record.parent / "results.json").read_text())["scorer_version"] == SCORER_VERSION
        assert (record.parent / f"samples_{TASK}_closedbook.jsonl").is_file()  # the probe's answers, for rescoring


def test_a_scorer_change_rescores_the_stored_samples_without_a_model(swept, tmp_path):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(swept.output_path, out)
    before = pd.read_csv(out / "sweep.csv")
    lines = []
    cfg = SweepConfig(run_dir=swept.run_dir, tasks=[TASK], output_path=out, limit=3, agree=False)
    with _scorer_changed(), \
            mock.patch.object(tasks, "score_doc", autospec=True, side_effect=_every_answer_is_the_context), \
            mock.patch.object(plan, "make_backend", autospec=True) as make:
        start = time.perf_counter()
        assert run_sweep(cfg, log=lambda *a, **k: lines.append(a[0])) == 0
        seconds = time.perf_counter() - start
    make.assert_not_called()  # no backend, so no model
    rescored = [line for line in lines if "rescored from stored samples" in line]
    assert len(rescored) == 2, lines
    after = pd.read_csv(out / "sweep.csv")
    mine = after[after.task == TASK]
    assert set(mine["scorer_version"]) == {SCORER_VERSION + 1}  # the old results left the views
    acc = mine[mine.metric == "counterfactual_acc"]
    assert len(acc) == 2 and (acc["value"] == 1.0).all() and (acc["n"] == 3).all()  # the new rule's numbers
    old = before[(before.task == TASK) & (before.metric == "counterfactual_acc")]
    assert (old["value"] < 1.0).any()  # the tiny model does not always give the context's answer
    records = [json.loads(p.read_text()) for p in (out / "store").glob(f"*/{TASK}/*/record.json")]
    assert sorted(r["settings"]["scorer_version"] for r in records) == [SCORER_VERSION] * 2 + [SCORER_VERSION + 1] * 2
    assert all(r.get("rescored_from") for r in records if r["settings"]["scorer_version"] == SCORER_VERSION + 1)
    print(f"rescored 2 checkpoints from their samples in {seconds:.1f} s")  # shown with pytest -s

    # a second output still scored by the old rules: report refuses to draw both as one curve
    with _scorer_changed():
        with pytest.raises(SweepError, match=rf"{TASK}: rows scored by different scorer versions "
                                            rf"\({SCORER_VERSION}, {SCORER_VERSION + 1}\)"):
            report([out, swept.output_path], tmp_path / "merged", **QUIET)
        assert main(["report", str(out), str(swept.output_path), "--output_path", str(tmp_path / "merged")]) == 2
        assert main(["report", str(out), str(swept.output_path), "--output_path", str(tmp_path / "merged"),
                     "--mixed_scorers"]) == 0
    merged = pd.read_csv(tmp_path / "merged" / "sweep.csv")
    assert set(merged.loc[merged.task == TASK, "scorer_version"]) == {SCORER_VERSION + 1}  # the later version wins


def test_n_is_the_number_of_items_each_metric_was_computed_on(swept):
    rows = pd.read_csv(swept.output_path / "sweep.csv")
    for record in (swept.output_path / "store").glob(f"*/{TASK}/*/record.json"):
        cid = json.loads(record.read_text())["id"]
        samples = [json.loads(line) for line in (record.parent / f"samples_{TASK}.jsonl").read_text().splitlines()]
        known = sum(1 for s in samples if s["known_rate"] == 1.0)
        one_answer = sum(1 for s in samples if s["context_preference"] in ("context", "parametric"))
        mine = rows[(rows.checkpoint_id == cid) & (rows.task == TASK)].set_index("metric")["n"]
        assert mine["counterfactual_acc"] == len(samples) == 3
        assert mine["known_rate"] == 3
        if known:
            assert mine["known_counterfactual_acc"] == known
        if known < 3:
            assert mine["unknown_counterfactual_acc"] == 3 - known
        if "context_preference" in mine:
            assert mine["context_preference"] == one_answer


def test_the_plot_says_run_limit_n_and_what_the_error_bars_are(swept):
    from cf_tasks.sweep.views import _caption, _n_text, label_series, sweep_rows

    rows = sweep_rows(swept.output_path)
    label_series(rows)
    caption = _caption(rows)
    assert f"run {swept.run_dir.name}" in caption and "--limit 3" in caption
    assert "error bars: 95% Wilson interval over the n items" in caption
    assert _n_text(rows, TASK, "counterfactual_acc") == "n=3"
    mixed = rows + [{**r, "task": "cf_world_facts", "limit": None} for r in rows]
    mixed += [{**r, "task": "cf_world_facts_agree", "limit": None} for r in rows]
    assert f"--limit 3 ({TASK}), none (cf_world_facts); " in _caption(mixed)  # which task ran at which limit


def test_rescoring_with_unchanged_rules_reproduces_every_number(swept, tmp_path):
    """The replay runs lm-eval's own filters, metrics and standard errors: with the same rules the
    rescored rows equal the evaluated ones."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(swept.output_path, out)
    before = pd.read_csv(out / "sweep.csv")
    cfg = SweepConfig(run_dir=swept.run_dir, tasks=[TASK], output_path=out, limit=3, agree=False)
    with _scorer_changed(), \
            mock.patch.object(plan, "make_backend", autospec=True) as make:
        assert run_sweep(cfg, **QUIET) == 0
    make.assert_not_called()
    after = pd.read_csv(out / "sweep.csv")
    key = ["checkpoint", "task", "metric"]
    merged = before.merge(after, on=key, suffixes=("_old", "_new"))
    assert len(merged) == len(before) == len(after) > 0
    assert (merged["scorer_version_new"] == SCORER_VERSION + 1).all()
    pd.testing.assert_series_equal(merged["value_old"], merged["value_new"], check_names=False)
    pd.testing.assert_series_equal(merged["stderr_old"], merged["stderr_new"], check_names=False)
    pd.testing.assert_series_equal(merged["n_old"], merged["n_new"], check_names=False)
