"""`cf-tasks sweep --timings` (seconds per phase, printed and written to the output folder) and
the views rebuilt once per batch of finished checkpoints, not after each."""

import json
import shutil
from unittest import mock

import pytest

from cf_tasks.cli import main
from cf_tasks.sweep import SweepConfig, run_sweep
from cf_tasks.sweep import timings as timings_module
from cf_tasks.sweep.timings import STARTUP, Timings, process_age
from tiny_model import build_full_checkpoint

QUIET = dict(log=lambda *a, **k: None)


@pytest.fixture(scope="module")
def run(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("timed_run")
    for step, seed in ((100, 1), (200, 2)):
        build_full_checkpoint(tiny_model, root / f"checkpoint-{step}", seed)
    return root


def _sweep_args(run, out, *extra):
    return ["sweep", str(run), "--tasks", "cf_capitals_mc", "--limit", "2", "--output_path", str(out), "--quiet", *extra]


def test_nested_phases_are_taken_out_of_the_outer_one_and_other_is_the_rest():
    clock = iter([0.0,  # Timings()
                  1.0,  # enter outer
                  2.0,  # enter inner
                  5.0,  # leave inner: 3 s
                  6.0,  # leave outer: 5 s, of which 3 inner
                  6.5,  # enter outer again
                  7.0,  # leave: 0.5 s
                  10.0])  # table()
    with mock.patch.object(timings_module, "process_age", autospec=True, return_value=2.0), \
            mock.patch.object(timings_module.time, "perf_counter", side_effect=lambda: next(clock)):
        t = Timings()
        with t.phase("evaluation"):
            with t.phase("views"):
                pass
        with t.phase("evaluation"):
            pass
        table = t.table()
    rows = {r["phase"]: r for r in table["phases"]}
    assert table["wall"] == 12.0  # 2 s before the object, 10 s after
    assert rows[STARTUP]["seconds"] == 2.0
    assert rows["evaluation"]["seconds"] == 2.5 and rows["evaluation"]["times"] == 2
    assert rows["views"]["seconds"] == 3.0
    assert rows["other"]["seconds"] == 4.5  # 12 - 2 - 2.5 - 3
    assert [r["phase"] for r in table["phases"]] == [STARTUP, "evaluation", "views", "other"]  # the sweep's order
    assert sum(r["seconds"] for r in table["phases"]) == pytest.approx(table["wall"])
    assert rows["views"]["share"] == pytest.approx(0.25)


def test_process_age_reads_the_process_start_and_is_none_where_it_cannot():
    import subprocess
    import sys

    # A process that sleeps 1.5 s before asking: its age covers the sleep.
    code = "import time; time.sleep(1.5); from cf_tasks.sweep.timings import process_age; print(process_age())"
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1.4 <= age < 30
    assert 0 <= process_age()
    with mock.patch("builtins.open", side_effect=PermissionError("no /proc")):
        assert process_age() is None
        assert STARTUP not in {r["phase"] for r in Timings().table()["phases"]}


@pytest.mark.slow
def test_timings_are_printed_and_written_one_file_per_process(run, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_sweep_args(run, out)) == 0
    assert not (out / "timings").exists()  # only when asked
    capsys.readouterr()

    out = tmp_path / "timed"
    assert main(_sweep_args(run, out, "--timings")) == 0
    printed = capsys.readouterr()
    files = list((out / "timings").glob("*.json"))
    assert len(files) == 1 and f"timings written to {files[0]}" in printed.err
    first = files[0].read_bytes()
    table = json.loads(first)
    rows = {r["phase"]: r for r in table["phases"]}
    for phase in ("checks", "task index", "task settings (datasets)", "checkpoint ids", "model engine and loads",
                  "evaluation", "results into the store", "views", "other"):
        assert phase in rows, phase
        assert f"\n{phase:<28} {rows[phase]['seconds']:9.1f}" in "\n" + printed.out
    assert rows["evaluation"]["times"] == 2  # one lm-eval run per checkpoint
    assert sum(r["seconds"] for r in table["phases"]) == pytest.approx(table["wall"], abs=0.01)
    # The evaluation phase is the time the manifest gives each checkpoint's lm-eval run.
    manifest = json.loads((out / "manifest.json").read_text())
    inside = sum(e["seconds"] for e in manifest["checkpoints"].values())
    assert rows["evaluation"]["seconds"] == pytest.approx(inside, abs=0.1)

    # A rerun reuses every result: no evaluation, and a file of its own beside the first.
    assert main(_sweep_args(run, out, "--timings")) == 0
    files = sorted((out / "timings").glob("*.json"))
    assert len(files) == 2 and first in [f.read_bytes() for f in files]
    rerun = json.loads(next(f for f in files if f.read_bytes() != first).read_text())
    assert "evaluation" not in {r["phase"] for r in rerun["phases"]}
    assert "model engine and loads" not in {r["phase"] for r in rerun["phases"]}


def _counting_views(monkeypatch):
    import cf_tasks.sweep.plan as plan

    counted = mock.create_autospec(plan.rebuild_views, side_effect=plan.rebuild_views)
    monkeypatch.setattr(plan, "rebuild_views", counted)
    return counted


@pytest.mark.slow
def test_views_are_rebuilt_once_for_checkpoints_that_finish_close_together(run, tmp_path, monkeypatch):
    import cf_tasks.sweep.plan as plan

    cfg = dict(run_dir=run, tasks=["cf_capitals_mc"], limit=2)
    counted = _counting_views(monkeypatch)
    assert run_sweep(SweepConfig(output_path=tmp_path / "batched", **cfg), **QUIET) == 0
    assert counted.call_count == 1  # two checkpoints within a minute: the closing rebuild only

    counted.reset_mock()
    monkeypatch.setattr(plan, "VIEWS_EVERY", 0.0)
    assert run_sweep(SweepConfig(output_path=tmp_path / "each", **cfg), **QUIET) == 0
    assert counted.call_count == 3  # after each checkpoint, then the closing one
    for name in ("sweep.csv", "sweep.json"):
        assert (tmp_path / "batched" / name).read_text().replace("batched", "X") == \
            (tmp_path / "each" / name).read_text().replace("each", "X")


def test_views_show_each_watch_round_before_its_pause(run, tmp_path, monkeypatch):
    import cf_tasks.sweep.plan as plan

    live = tmp_path / "live"
    live.mkdir()
    shutil.copytree(run / "checkpoint-100", live / "checkpoint-100")
    counted = _counting_views(monkeypatch)
    rows_at_round = []  # sweep.csv's checkpoint rows when each round starts (after the previous pause)
    real_discover = plan.discover

    def discover(*args, **kwargs):
        csv = tmp_path / "out" / "sweep.csv"
        rows_at_round.append(csv.read_text().count("checkpoint-") if csv.exists() else 0)
        if len(rows_at_round) == 2:  # a checkpoint saved during the first pause
            shutil.copytree(run / "checkpoint-200", live / "checkpoint-200")
        return real_discover(*args, **kwargs)

    monkeypatch.setattr(plan, "discover", discover)
    cfg = SweepConfig(run_dir=live, tasks=["cf_capitals_mc"], limit=2, output_path=tmp_path / "out", watch=True,
                      poll_interval=0.01, settle_seconds=0, max_polls=3)
    assert run_sweep(cfg, **QUIET) == 0
    assert rows_at_round[0] == 0
    assert rows_at_round[1] > 0  # the first round's checkpoint is in the views before the pause
    assert rows_at_round[2] == 2 * rows_at_round[1]  # and the second round's beside it
    assert counted.call_count == 3  # once per round that scored something, then the closing one


def test_timings_that_cannot_be_written_fail_nothing(run, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "timings").write_text("a file where the folder goes")
    assert main(_sweep_args(run, out, "--timings")) == 0
    printed = capsys.readouterr()
    assert "evaluation" in printed.out  # the table is printed
    line = next(l for l in printed.err.splitlines() if "timings not written" in l)
    assert line.startswith(f"cf-tasks: timings not written to {out / 'timings'} (")
    assert (out / "sweep.csv").is_file() and (out / "timings").read_text() == "a file where the folder goes"
