"""``--report_to``: joining the trainer's existing run (TensorBoard's log folder, W&B's run id, Trackio's
run name), and the one-line failures: a bad ``--report_args``, a missing extra or an MLflow server
that does not answer exit 2 before any model loads; W&B online without a network is one warning
during the run, and every scored result is kept."""

from __future__ import annotations

import csv
import importlib.util
import time
from pathlib import Path
from unittest import mock

import pytest

from cf_tasks.cli import main
from cf_tasks.sweep import SweepConfig, run_sweep
from cf_tasks.trackers.reporter import LEDGER
from test_trackers import (  # noqa: F401 (fixtures)
    INSTALLED, METRIC, PROJECT, SECRET, STEPS, TASK, needs, offline_trackers, read_back, run3, tensorboard_points,
    trackio_points, wandb_files, wandb_records,
)
from tiny_model import build_full_checkpoint

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there


def _sweep(run: Path, out: Path, report_to: str, report_args: str, log=lambda *a, **k: None) -> int:
    return run_sweep(SweepConfig(run_dir=run, tasks=[TASK], output_path=out, limit=2, agree=False,
                                 report_to=report_to, report_args=report_args), log=log)


def _stored(out: Path) -> list[int]:
    return sorted(int(r["step"]) for r in csv.DictReader((out / "sweep.csv").open())
                  if r["metric"] == "counterfactual_acc" and r["task"] == TASK)


# ---------------------------------------------------------------- one line, exit 2, before any model loads
@pytest.fixture
def one_checkpoint(tiny_model, tmp_path):
    run = tmp_path / "run"
    build_full_checkpoint(tiny_model, run / "checkpoint-1", 1)
    return run


REFUSED = [
    pytest.param("tensorboard", "tensorboard.logdir=x", "tensorboard.logdir is not a tensorboard key",
                 marks=needs["tensorboard"], id="a key the tracker does not read"),
    pytest.param("wandb", "wandb", "'wandb' is not key=value", marks=needs["wandb"], id="not key=value"),
    pytest.param("tensorboard", "mlflow.run_id=1", "which --report_to does not name", marks=needs["tensorboard"],
                 id="a key for a tracker not named"),
    pytest.param("mlflow", f"mlflow.tracking_uri={UNREACHABLE}", f"tracking server {UNREACHABLE} does not answer",
                 marks=needs["mlflow"], id="an MLflow server that does not answer"),
]


@pytest.mark.parametrize("report_to,report_args,said", REFUSED)
def test_a_bad_report_args_exits_2_in_one_line_before_any_model_loads(one_checkpoint, tmp_path, capsys, monkeypatch,
                                                                      report_to, report_args, said):
    import cf_tasks.sweep.plan as plan

    loads = []
    monkeypatch.setattr(plan, "make_backend", lambda *a: loads.append(a))
    capsys.readouterr()
    started = time.monotonic()
    code = main(["sweep", str(one_checkpoint), "--tasks", TASK, "--output_path", str(tmp_path / "out"),
                 "--backend", "hf", "--report_to", report_to, "--report_args", report_args])
    seconds = time.monotonic() - started
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and said in err[0], err
    assert not loads and not (tmp_path / "out").exists()
    assert seconds < 60, seconds  # not MLflow's minutes of retries


@needs["mlflow"]
def test_an_mlflow_server_that_answers_passes_the_check_and_a_refusal_hides_its_password(tmp_path):
    """Any HTTP answer (here a 404 from a plain file server) or TLS handshake counts as reachable; the
    refusal of a server that does not answer never shows the URI's password."""
    import http.server
    import threading

    from cf_tasks.trackers import TrackerError, check

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        assert check("mlflow", f"mlflow.tracking_uri={uri}", out=tmp_path) == {"mlflow": {"tracking_uri": uri}}
        tls = uri.replace("http:", "https:")  # a TLS handshake that fails is an answer too (a certificate to accept)
        assert check("mlflow", f"mlflow.tracking_uri={tls}", out=tmp_path) == {"mlflow": {"tracking_uri": tls}}
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(TrackerError) as refused:
        check("mlflow", "mlflow.tracking_uri=http://me:hunter2secret@127.0.0.1:9", out=tmp_path)
    assert "does not answer" in str(refused.value) and "hunter2secret" not in str(refused.value)
    assert "http://***@127.0.0.1:9" in str(refused.value)


def test_eval_with_a_missing_tracker_exits_2_naming_its_extra_before_any_model_loads(tiny_model, capsys,
                                                                                     monkeypatch):
    import cf_tasks.evaluate

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    loads = []
    monkeypatch.setattr(cf_tasks.evaluate, "run_lm_eval", lambda *a, **k: loads.append(a))
    code = main(["eval", "--model_args", f"pretrained={tiny_model}", "--tasks", TASK, "--report_to", "trackio"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pip install 'cf-tasks[trackio]'" in err[0], err
    assert not loads


# ---------------------------------------------------------------- an unreachable tracker during the run
@pytest.fixture
def fresh_wandb():
    """wandb keeps the settings (mode, base URL) its first run of a process read: start and end clean."""
    import wandb

    wandb.teardown()
    yield
    wandb.teardown()


@pytest.mark.slow
@needs["wandb"]
def test_wandb_online_without_a_network_is_one_warning_and_every_result_is_kept(run3, tmp_path, monkeypatch, capfd,
                                                                                fresh_wandb):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", UNREACHABLE)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "10")  # wandb's own wait (90 s by default), shortened for the test
    out = tmp_path / "out"
    said = []
    code = _sweep(run3, out, "wandb", f"project={PROJECT},wandb.mode=online",
                  log=lambda *a, **k: said.append(" ".join(map(str, a))))
    assert code == 0
    warnings = [line for line in said if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith("cf-tasks: warning: wandb: opening its run failed"), said
    assert "the scored results are kept" in warnings[0]
    assert _stored(out) == STEPS  # every checkpoint scored and in sweep.csv
    assert not [p for p in (out / LEDGER).rglob("*.json") if p.name != "run.json"]  # none counted as logged
    printed = capfd.readouterr()
    for text in [printed.out, printed.err, *said]:
        assert SECRET not in text
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path


# ---------------------------------------------------------------- joining the trainer's run
@needs["tensorboard"]
def test_a_sweep_joins_the_trainers_tensorboard_folder(run3, tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    log_dir = tmp_path / "trainer_logs"
    with SummaryWriter(log_dir=str(log_dir)) as writer:  # the trainer's loss, as transformers writes it
        for step in STEPS:
            writer.add_scalar("train/loss", 2.0 - step / 1000, global_step=step)
    assert _sweep(run3, tmp_path / "out", "tensorboard", f"tensorboard.log_dir={log_dir}") == 0
    assert [s for s, _ in tensorboard_points(log_dir, METRIC)] == STEPS
    assert tensorboard_points(log_dir, "train/loss") == [(s, round(2.0 - s / 1000, 6)) for s in STEPS]
    assert not (tmp_path / "out" / "tensorboard").exists()


@needs["wandb"]
def test_a_sweep_joins_an_existing_wandb_run_by_its_id(run3, tmp_path, offline_trackers, fresh_wandb):
    """Offline, the join is the run id (and resume): ``wandb sync`` uploads both run folders into that run."""
    import wandb

    trainer_dir = tmp_path / "trainer"
    trainer_dir.mkdir()
    run = wandb.init(project=PROJECT, id="trainer-run-1", dir=str(trainer_dir), mode="offline",
                     settings=wandb.Settings(silent=True, console="off"))
    run.log({"train/loss": 1.5, "train/global_step": 100})
    run.finish()
    out = tmp_path / "out"
    said = []
    assert _sweep(run3, out, "wandb", f"project={PROJECT},wandb.id=trainer-run-1",
                  log=lambda *a, **k: said.append(" ".join(map(str, a)))) == 0
    assert not [line for line in said if "warning" in line], said
    runs = [(r.run.run_id, r.run.project) for path in wandb_files(out) for r in wandb_records(path)
            if r.WhichOneof("record_type") == "run"]
    assert runs and set(runs) == {("trainer-run-1", PROJECT)}, (runs, [(p.name, p.stat().st_size)
                                                                       for p in out.rglob("*.wandb")])
    steps = sorted(int(row["train/global_step"]) for path in wandb_files(out) for row in _history(path)
                   if METRIC in row)
    assert steps == STEPS


def _history(path: Path) -> list[dict]:
    import json

    return [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in wandb_records(path) if r.WhichOneof("record_type") == "history"]


@needs["trackio"]
def test_a_sweep_joins_a_trackio_run_by_its_name(run3, tmp_path, offline_trackers, monkeypatch, capfd):
    import trackio

    from trackio.sqlite_storage import SQLiteStorage

    run = trackio.init(project=PROJECT, name="trainer-run", auto_log_cpu=False, auto_log_gpu=False)
    for step in STEPS:
        run.log({"train/loss": 2.0 - step / 1000}, step=step)
    run.finish()
    init = mock.create_autospec(trackio.init, side_effect=trackio.init)
    monkeypatch.setattr(trackio, "init", init)
    capfd.readouterr()
    assert _sweep(run3, tmp_path / "out", "trackio", f"project={PROJECT},trackio.run_name=trainer-run") == 0
    init.assert_called_once_with(project=PROJECT, name="trainer-run", resume="allow", auto_log_cpu=False,
                                 auto_log_gpu=False)  # the scorer's CPU and GPU load stay out of the trainer's run
    assert [s for s, _ in trackio_points(PROJECT, METRIC)] == STEPS  # one run holds both
    assert [s for s, _ in trackio_points(PROJECT, "train/loss")] == STEPS
    assert not SQLiteStorage.get_system_logs(PROJECT, "trainer-run")
    assert "Trackio" not in capfd.readouterr().out  # trackio's progress lines keep off the sweep's stdout


# ---------------------------------------------------------------- two shards at the same time
@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason="no tracker is installed (pip install 'cf-tasks[trackers]')")
def test_two_shards_at_once_log_each_checkpoint_once(run3, tmp_path, offline_trackers):
    """Two ``cf-tasks sweep`` processes into one output folder at once: each scores its shard, and each
    sees the other's results in the store; the ledger lets one of them log each."""
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, "-m", "cf_tasks.cli", "sweep", str(run3), "--tasks", TASK,
                               "--output_path", str(out), "--limit", "2", "--no_agree", "--backend", "hf",
                               "--device", "cpu", "--shard", shard, "--report_to", offline_trackers,
                               "--report_args", f"project={PROJECT}"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for shard in ("0/2", "1/2")]
    done = [p.communicate(timeout=500) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in done]
    for printed, err in done:
        assert "warning" not in err and SECRET not in err, err[-1500:]
        assert "sweep: " in printed and "Trackio" not in printed, printed  # stdout: the sweep's own lines
    assert _stored(out) == STEPS
    for name in INSTALLED:
        assert [s for s, _ in read_back(name, out, METRIC)] == STEPS, name  # each checkpoint once, at its step


# ---------------------------------------------------------------- a rerun with other settings
@needs["tensorboard"]
def test_a_rerun_with_other_settings_is_refused_before_any_model_loads_not_mixed_into_one_curve(
        run3, tmp_path, capsys, monkeypatch):
    """The store keeps both settings' results; a tracker run keeps one setting's curve."""
    import cf_tasks.sweep.plan as plan

    out = tmp_path / "out"
    assert _sweep(run3, out, "tensorboard", None) == 0  # --limit 2
    first = tensorboard_points(out / "tensorboard", METRIC)
    real, loads = plan.make_backend, []
    monkeypatch.setattr(plan, "make_backend", lambda *a: loads.append(a))
    capsys.readouterr()
    args = ["sweep", str(run3), "--tasks", TASK, "--output_path", str(out), "--limit", "3", "--no_agree",
            "--backend", "hf", "--report_to", "tensorboard"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds cf_capitals scored under other settings" in err[0], err
    assert "tensorboard.log_dir=DIR" in err[0] and not loads
    assert tensorboard_points(out / "tensorboard", METRIC) == first  # one point per step, as before
    monkeypatch.setattr(plan, "make_backend", real)
    assert main([*args, "--report_args", f"tensorboard.log_dir={tmp_path / 'limit3'}", "--quiet"]) == 0
    assert [s for s, _ in tensorboard_points(tmp_path / "limit3", METRIC)] == STEPS
    assert _sweep(run3, out, "tensorboard", None) == 0  # the first settings again: nothing new to log
    assert tensorboard_points(out / "tensorboard", METRIC) == first
