"""``--report_to`` / ``--report_args``: each checkpoint's metrics in the trackers at its step, read
back through each tracker's own API (TensorBoard's event reader, MLflow's file store, Trackio's
local database, W&B's offline run file); a rerun and two shards log each checkpoint once."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from cf_tasks.cli import main
from cf_tasks.sweep import SweepConfig, run_sweep
from cf_tasks.trackers import LOGGED_METRICS, TrackerError, check, parse_report_args, parse_report_to
from cf_tasks.trackers.reporter import LEDGER, Reporter, points, redact
from tiny_model import build_full_checkpoint

QUIET = dict(log=lambda *a, **k: None)
TRACKERS = ("tensorboard", "mlflow", "trackio", "wandb")
SECRET = "wandbkey" + "x" * 32
HF_SECRET = "hf_TrackerTestTokenThatMustNeverBeWritten"
STEPS = [100, 200, 300]
TASK = "cf_capitals"
METRIC = f"{TASK}/counterfactual_acc"


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs = {name: pytest.mark.skipif(not installed(name), reason=f"{name} is not installed (pip install 'cf-tasks[{name}]')")
         for name in TRACKERS}


# ---------------------------------------------------------------- readers: each tracker's own API
def tensorboard_points(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = []
    for events in sorted(Path(log_dir).glob("events.out.tfevents.*")):  # one file per writing process
        acc = EventAccumulator(str(events))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            found += [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]  # stored as float32
    return sorted(found)


def mlflow_points(out: Path, tag: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    runs = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]  # shards and reruns share the output folder's run
    return sorted((m.step, round(m.value, 6)) for m in client.get_metric_history(runs[0].info.run_id, tag))


def trackio_points(project: str, tag: str) -> list[tuple[int, float]]:
    from trackio.sqlite_storage import SQLiteStorage

    runs = SQLiteStorage.get_runs(project)
    assert len(runs) == 1, runs
    return sorted((row["step"], row[tag]) for row in SQLiteStorage.get_logs(project, runs[0]) if tag in row)


def wandb_records(path: Path):
    """The records of a W&B run file (``run-<id>.wandb``): LevelDB's log format (32 KiB blocks of
    records with a 7-byte header: CRC, length, type) after a 7-byte ``:W&B`` header, each record one
    ``wandb_internal_pb2.Record`` (wandb's own protobuf)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def wandb_files(out: Path, wait: float = 30.0) -> list[Path]:
    """The W&B run files under ``out``, once each holds its run record and has stopped growing: W&B's
    service writes a finished run's file on its own, so a read right after ``finish`` can, on a busy
    machine, come before the last records."""
    import time

    deadline, last = time.monotonic() + wait, None
    while True:
        paths = sorted(out.rglob("*.wandb"))
        sizes = [p.stat().st_size for p in paths]
        ready = paths and all(any(r.WhichOneof("record_type") == "run" for r in wandb_records(p)) for p in paths)
        if (ready and sizes == last) or time.monotonic() > deadline:
            return paths
        last = sizes
        time.sleep(0.5)


def wandb_points(out: Path, tag: str) -> list[tuple[int, float]]:
    """Every history row of the W&B offline run files under ``out``: (the step axis, the value)."""
    import json

    found = []
    for path in wandb_files(out):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                if tag in row:
                    found.append((int(row["train/global_step"]), row[tag]))
    return sorted(found)


def summaries(name: str, out: Path) -> dict[str, str]:
    """The summary's verdicts as tracker ``name`` holds them ({"<series>/verdict": value}), through its
    own API: TensorBoard's text entry, MLflow's run tags, Trackio's ``summary/`` metrics (a number
    each: the verdict itself is not a number, its ``inversion`` flag is), W&B's summary records."""
    import json

    if name == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        found = {}
        for events in sorted((out / "tensorboard").glob("events.out.tfevents.*")):
            acc = EventAccumulator(str(events))
            acc.Reload()
            for tag in acc.Tags()["tensors"]:
                if tag.startswith("cf_tasks/summary"):
                    for event in acc.Tensors(tag):
                        for line in event.tensor_proto.string_val[0].decode().splitlines()[2:]:
                            _, key, value, _ = line.split("|")
                            found[key.strip()] = value.strip()
        return found
    if name == "mlflow":
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
        (run,) = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
        return dict(run.data.tags)
    if name == "trackio":
        from trackio.sqlite_storage import SQLiteStorage

        (run,) = SQLiteStorage.get_runs(PROJECT)
        return {k[len("summary/"):]: str(v) for row in SQLiteStorage.get_logs(PROJECT, run) for k, v in row.items()
                if k.startswith("summary/")}
    found = {}
    for path in wandb_files(out):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "summary":
                for item in record.summary.update:
                    found[item.key or "/".join(item.nested_key)] = str(json.loads(item.value_json))
    return found


# ---------------------------------------------------------------- arguments
def test_report_to_names_and_report_args_are_checked():
    assert parse_report_to(None) == parse_report_to("none") == []
    assert parse_report_to("wandb, tensorboard") == ["tensorboard", "wandb"]
    assert parse_report_to("all") == ["tensorboard", "wandb", "mlflow", "trackio"]
    with pytest.raises(TrackerError, match="comet is not a tracker"):
        parse_report_to("tensorboard,comet")
    args = parse_report_args("project=p,wandb.id=abc,mlflow.run_id=r1", ["wandb", "mlflow", "tensorboard"])
    assert args == {"wandb": {"project": "p", "id": "abc"}, "mlflow": {"project": "p", "run_id": "r1"}, "tensorboard": {}}
    for text, fix in (("project", "not key=value"), ("wandb.run_id=1", "not a wandb key"),
                      ("trackio.project=x", "which --report_to does not name"), ("color=red", "prefix it")):
        with pytest.raises(TrackerError, match=fix):
            parse_report_args(text, ["wandb"])
    with pytest.raises(TrackerError, match="without --report_to"):
        parse_report_args("project=x", [])


def test_a_missing_tracker_exits_2_naming_its_extra_before_any_model_loads(tiny_model, tmp_path, capsys, monkeypatch):
    import cf_tasks.sweep.plan as plan

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    loads = []
    monkeypatch.setattr(plan, "make_backend", lambda *a: loads.append(a))
    run = tmp_path / "run"
    build_full_checkpoint(tiny_model, run / "checkpoint-1", 1)
    capsys.readouterr()
    code = main(["sweep", str(run), "--tasks", TASK, "--output_path", str(tmp_path / "out"), "--backend", "hf",
                 "--report_to", "wandb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pip install 'cf-tasks[wandb]'" in err[0], err
    assert not loads and not (tmp_path / "out").exists()


@needs["tensorboard"]
def test_eval_refuses_a_bad_report_args_in_one_line_before_any_model_loads(tiny_model, capsys, monkeypatch):
    import cf_tasks.evaluate

    loads = []
    monkeypatch.setattr(cf_tasks.evaluate, "run_lm_eval", lambda *a, **k: loads.append(a))
    code = main(["eval", "--model_args", f"pretrained={tiny_model}", "--tasks", TASK, "--report_to", "tensorboard",
                 "--report_args", "tensorboard.logdir=x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not a tensorboard key" in err[0], err
    assert not loads


def test_points_keep_the_logged_metrics_at_their_steps():
    rows = [{"checkpoint": "c1", "checkpoint_id": "a", "step": 5, "task": "t", "metric": "counterfactual_acc",
             "value": 0.5, "settings": "s"},
            {"checkpoint": "c1", "checkpoint_id": "a", "step": 5, "task": "t", "metric": "context_prob_norm",
             "value": 0.1, "settings": "s"},
            {"checkpoint": "c2", "checkpoint_id": "b", "step": None, "task": "t", "metric": "counterfactual_acc",
             "value": 0.7, "settings": "s"},
            {"checkpoint": "c3", "checkpoint_id": "c", "step": 9, "task": "t", "metric": "parametric_acc",
             "value": 0.2, "settings": "other"}]
    assert points(rows, {"s"}) == {("a", "t", "s"): {"step": 5, "metrics": {"t/counterfactual_acc": 0.5}}}


def test_a_secret_in_a_warning_is_redacted(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "abcdef123456")
    assert redact("401: key abcdef123456 refused") == "401: key *** refused"


# ---------------------------------------------------------------- sweeps into the trackers
@pytest.fixture(scope="module")
def run3(tiny_model, tmp_path_factory):
    run = tmp_path_factory.mktemp("trackers_run")
    for step, seed in zip(STEPS, (1, 2, 3)):
        build_full_checkpoint(tiny_model, run / f"checkpoint-{step}", seed)
    return run


def _sweep(run: Path, out: Path, report_to: str, shard=(0, 1), report_args: str | None = None) -> int:
    return run_sweep(SweepConfig(run_dir=run, tasks=[TASK], output_path=out, limit=2, shard=shard, agree=False,
                                 report_to=report_to, report_args=report_args), **QUIET)


INSTALLED = [name for name in TRACKERS if installed(name)]
PROJECT = "cf-test"


@pytest.mark.parametrize("name", list(TRACKERS))
def test_each_tracker_is_installed_for_the_read_back_tests(name):
    """The sweeps below log to every installed tracker at once; this says which are left out."""
    if not installed(name):
        pytest.skip(f"{name} is not installed (pip install 'cf-tasks[{name}]'): its read-back is not tested")


def read_back(name: str, out: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every point of ``tag`` that tracker ``name`` holds, through its own API."""
    if name == "tensorboard":
        return tensorboard_points(out / "tensorboard", tag)
    if name == "mlflow":
        return mlflow_points(out, tag)
    if name == "trackio":
        return [(s, round(v, 6)) for s, v in trackio_points(PROJECT, tag)]
    return [(s, round(v, 6)) for s, v in wandb_points(out, tag)]


@pytest.fixture
def offline_trackers(tmp_path, monkeypatch):
    """Every tracker offline, into this test's folder; a W&B key that must never be written."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's file store, as the user opts in
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    if installed("trackio"):
        import trackio.sqlite_storage as storage
        import trackio.utils as utils

        for module in (utils, storage):  # read when trackio is first imported
            monkeypatch.setattr(module, "TRACKIO_DIR", tmp_path / "trackio", raising=False)
    return ",".join(INSTALLED)


def _no_secret_in(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes() and HF_SECRET.encode() not in path.read_bytes(), path


@pytest.mark.skipif(not INSTALLED, reason="no tracker is installed (pip install 'cf-tasks[trackers]')")
def test_a_sweep_logs_each_checkpoint_once_and_a_rerun_logs_nothing_new(run3, tmp_path, offline_trackers, capfd,
                                                                        monkeypatch):
    import csv

    monkeypatch.setenv("HF_TOKEN", HF_SECRET)
    out = tmp_path / "out"
    said = []
    assert run_sweep(SweepConfig(run_dir=run3, tasks=[TASK], output_path=out, limit=2, agree=False,
                                 report_to=offline_trackers, report_args=f"project={PROJECT}"),
                     log=lambda *a, **k: said.append(" ".join(map(str, a)))) == 0
    assert said and not [line for line in said if "warning" in line], said
    rows = [r for r in csv.DictReader((out / "sweep.csv").open()) if r["metric"] == "counterfactual_acc"]
    expected = sorted((int(r["step"]), round(float(r["value"]), 6)) for r in rows)
    assert [s for s, _ in expected] == STEPS
    for name in INSTALLED:
        assert read_back(name, out, METRIC) == expected, name
    logged = [r for r in csv.DictReader((out / "sweep.csv").open()) if r["metric"] in LOGGED_METRICS and r["value"]]
    metrics = sorted({r["metric"] for r in logged})
    assert {"counterfactual_acc", "parametric_acc", "known_rate"} <= set(metrics), metrics
    for metric in metrics:  # every logged metric, each checkpoint once at its step
        want = sorted((int(r["step"]), round(float(r["value"]), 6)) for r in logged if r["metric"] == metric)
        for name in INSTALLED:
            assert read_back(name, out, f"{TASK}/{metric}") == want, (name, metric)
    ledger = sorted(p.name for p in (out / LEDGER).rglob("*.json") if not p.name.startswith("mlflow-run"))
    assert _sweep(run3, out, offline_trackers, report_args=f"project={PROJECT}") == 0  # all logged already
    assert sorted(p.name for p in (out / LEDGER).rglob("*.json") if not p.name.startswith("mlflow-run")) == ledger
    for name in INSTALLED:
        assert read_back(name, out, METRIC) == expected, name
    if "mlflow" in INSTALLED:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
        run = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])[0]
        assert run.data.tags[f"{TASK}/verdict"]  # the summary's verdict, at the end
    (summary,) = csv.DictReader((out / "summary.csv").open())
    for name in INSTALLED:  # the summary's verdicts at the end, in each tracker
        held = summaries(name, out)
        if name == "trackio":  # numbers only: the inversion flag stands for the verdict
            assert float(held[f"{TASK}/inversion"]) == float(summary["inversion"] == "True"), held
        else:
            assert held[f"{TASK}/verdict"] == summary["verdict"] and summary["verdict"], (name, held)
        assert f"{TASK}/peak_step" in held, (name, held)
    _no_secret_in(tmp_path)
    printed = capfd.readouterr()
    for text in [printed.out, printed.err, *said]:
        assert SECRET not in text and HF_SECRET not in text


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason="no tracker is installed (pip install 'cf-tasks[trackers]')")
def test_two_shards_together_log_each_checkpoint_once(run3, tmp_path, offline_trackers):
    out = tmp_path / "out"
    assert _sweep(run3, out, offline_trackers, shard=(0, 2), report_args=f"project={PROJECT}") == 0
    for name in INSTALLED:
        assert [s for s, _ in read_back(name, out, METRIC)] == [100, 300], name
    assert _sweep(run3, out, offline_trackers, shard=(1, 2), report_args=f"project={PROJECT}") == 0
    for name in INSTALLED:
        assert [s for s, _ in read_back(name, out, METRIC)] == STEPS, name
    _no_secret_in(tmp_path)


@needs["tensorboard"]
def test_an_unreachable_tracker_warns_and_loses_no_result(run3, tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "blocked").write_text("a file where the log folder should be")
    lines = []
    code = run_sweep(SweepConfig(run_dir=run3, tasks=[TASK], output_path=out, limit=2, agree=False,
                                 report_to="tensorboard", report_args=f"tensorboard.log_dir={tmp_path / 'blocked'}"),
                     log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert code == 0
    warnings = [x for x in lines if x.startswith("cf-tasks: warning: tensorboard")]
    assert len(warnings) == 1 and "the scored results are kept" in warnings[0], lines
    assert len(list((out / "store").glob("*/*/*/record.json"))) == 3  # every result scored and stored
    assert not [p for p in (out / LEDGER).rglob("*.json") if p.name != "run.json"]  # nothing counted as logged
    assert _sweep(run3, out, "tensorboard") == 0  # once the folder is fixed, the next run logs them all
    assert [s for s, _ in tensorboard_points(out / "tensorboard", METRIC)] == STEPS


@needs["tensorboard"]
def test_eval_logs_its_results_once_at_the_given_step(tiny_model, tmp_path, capsys):
    log_dir = tmp_path / "tb"
    code = main(["eval", "--model_args", f"pretrained={tiny_model}", "--tasks", "cf_capitals_mc", "--limit", "2",
                 "--device", "cpu", "--no_knowledge", "--report_to", "tensorboard",
                 "--report_args", f"tensorboard.log_dir={log_dir},step=7"])
    assert code == 0, capsys.readouterr().err[-2000:]
    assert [s for s, _ in tensorboard_points(log_dir, "cf_capitals_mc/acc")] == [7]
    assert [s for s, _ in tensorboard_points(log_dir, "cf_capitals_mc/context_prob")] == [7]


@pytest.mark.slow
@needs["mlflow"]
def test_a_sweep_joins_an_existing_mlflow_run(run3, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "trainer_mlruns").resolve().as_uri()
    client = MlflowClient(tracking_uri=uri)
    trainer_run = client.create_run(client.create_experiment("training")).info.run_id
    client.log_metric(trainer_run, "loss", 1.5, step=100)
    assert _sweep(run3, tmp_path / "out", "mlflow",
                  report_args=f"mlflow.tracking_uri={uri},mlflow.run_id={trainer_run}") == 0
    assert [m.step for m in client.get_metric_history(trainer_run, METRIC)] == STEPS
    assert [m.value for m in client.get_metric_history(trainer_run, "loss")] == [1.5]  # the trainer's own, kept
    assert len(client.search_runs([client.get_experiment_by_name("training").experiment_id])) == 1
