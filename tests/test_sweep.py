"""`cf-tasks sweep` / `report` over a run folder built in the test: tiny full checkpoints, LoRA
adapters, a corrupt and a half-written checkpoint."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cf_tasks.cli import main
from cf_tasks.evaluate import run_lm_eval
from cf_tasks.checkpoints import discover
from cf_tasks.sweep import SweepConfig, run_sweep
from tiny_model import build_full_checkpoint, build_lora_adapter

TASKS = "cf_capitals_mc,cf_quotes"
LIMIT = "3"


@pytest.fixture(scope="module")
def run_dir(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    full = root / "full"
    full.mkdir()
    for step, seed in ((100, 1), (200, 2), (300, 3)):
        build_full_checkpoint(tiny_model, full / f"checkpoint-{step}", seed)
    corrupt = full / "checkpoint-400"
    shutil.copytree(full / "checkpoint-100", corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x00garbage, not a safetensors file")
    half = full / "checkpoint-500"
    half.mkdir()
    shutil.copy(full / "checkpoint-100" / "config.json", half / "config.json")  # weights never written
    (full / "logs").mkdir()  # not a checkpoint: ignored

    lora = root / "lora"
    lora.mkdir()
    for step, seed in ((10, 11), (20, 12)):
        build_lora_adapter(tiny_model, lora / f"step_{step}", seed)
    return {"full": full, "lora": lora, "base": tiny_model}


def _csv(path):
    return list(csv.DictReader(path.open()))


def test_discovery_orders_and_classifies(run_dir):
    found = discover(run_dir["full"])
    assert [c.step for c in found] == [100, 200, 300, 400, 500]
    assert [c.error is None for c in found] == [True, True, True, True, False]  # corruption shows at load
    assert "no weights" in found[-1].error and str(found[-1].path) in found[-1].error
    lora = discover(run_dir["lora"])
    assert [(c.kind, c.lora_rank, c.base) for c in lora] == [("lora", 4, str(run_dir["base"]))] * 2


def test_full_sweep_rows_failures_and_resume(run_dir, tmp_path, capsys, made_backends):
    out = tmp_path / "out"
    args = ["sweep", str(run_dir["full"]), "--tasks", TASKS, "--output_path", str(out), "--limit", LIMIT,
            "--backend", "hf"]
    assert main(args) == 1  # two checkpoints failed
    assert made_backends[0].swaps == 2  # checkpoint-200 and -300 went into checkpoint-100's model
    err = capsys.readouterr().err
    assert "checkpoint-400/model.safetensors: corrupt weights file" in err
    assert "checkpoint-500: config.json but no weights" in err

    frame = pd.read_csv(out / "sweep.csv")
    assert list(frame.columns) == ["checkpoint", "step", "task", "metric", "value", "stderr", "n", "backend",
                                   "model", "version", "scorer_version", "run", "settings", "limit",
                                   "apply_chat_template", "metadata", "model_args", "checkpoint_id"]
    assert sorted(frame["step"].unique()) == [100, 200, 300]
    assert set(frame["metric"]) >= {"counterfactual_acc", "parametric_acc", "acc", "context_prob"}
    every_item = frame["metric"].isin(["counterfactual_acc", "parametric_acc", "acc", "context_prob", "known_rate"])
    assert (frame.loc[every_item, "n"] == 3).all() and (frame["n"] <= 3).all() and (frame["backend"] == "hf").all()

    # Swapping weights into the loaded model gives what a fresh load of that checkpoint gives.
    fresh = run_lm_eval("hf", TASKS.split(","), model_args=f"pretrained={run_dir['full'] / 'checkpoint-200'},"
                        "dtype=float32,device=cpu", limit=3)["results"]
    row = frame[(frame.step == 200) & (frame.task == "cf_capitals_mc") & (frame.metric == "context_prob")]
    assert row["value"].item() == pytest.approx(fresh["cf_capitals_mc"]["context_prob,none"], abs=1e-6)
    probs = frame[(frame.task == "cf_capitals_mc") & (frame.metric == "context_prob")]["value"]
    assert probs.nunique() == 3  # each checkpoint really was a different model

    manifest = json.loads((out / "manifest.json").read_text())
    status = {e["name"]: e["status"] for e in manifest["checkpoints"].values()}
    assert status == {"checkpoint-100": "done", "checkpoint-200": "done", "checkpoint-300": "done",
                      "checkpoint-400": "failed", "checkpoint-500": "failed"}
    sweep_json = json.loads((out / "sweep.json").read_text())
    assert {f["checkpoint"] for f in sweep_json["failures"]} == {"checkpoint-400", "checkpoint-500"}
    assert (out / "inversion.png").stat().st_size > 1000
    assert (out / "checkpoints" / "checkpoint-100" / "results.json").is_file()
    assert list((out / "checkpoints" / "checkpoint-100").glob("samples_cf_quotes.jsonl"))

    # Resume: nothing finished is redone; a re-saved checkpoint is.
    before = (out / "checkpoints" / "checkpoint-200" / "results.json").stat().st_mtime_ns
    ckpt300 = run_dir["full"] / "checkpoint-300" / "config.json"
    ckpt300.write_text(ckpt300.read_text() + "\n")  # re-saved: new content (the identity is the content)
    assert main(args) == 1
    assert (out / "checkpoints" / "checkpoint-200" / "results.json").stat().st_mtime_ns == before
    manifest2 = json.loads((out / "manifest.json").read_text())
    redone = [e["name"] for e in manifest2["checkpoints"].values() if e.get("mtime") != manifest["checkpoints"].get(
        next(k for k, v in manifest["checkpoints"].items() if v["name"] == e["name"]), {}).get("mtime")]
    assert redone == ["checkpoint-300"]


@pytest.mark.slow
def test_lora_sweep_with_base_and_shards_merge(run_dir, tmp_path, made_backends):
    outs = []
    for shard in ("0/2", "1/2"):
        out = tmp_path / f"shard{shard[0]}"
        assert main(["sweep", str(run_dir["lora"]), "--tasks", "cf_capitals_mc", "--output_path", str(out),
                     "--limit", LIMIT, "--backend", "hf", "--include_base", "--shard", shard]) == 0
        outs.append(out)
    steps = [sorted(pd.read_csv(o / "sweep.csv")["step"].unique()) for o in outs]
    assert steps == [[0, 20], [10]]  # base (step 0), step_10, step_20 dealt round-robin
    merged = tmp_path / "merged"
    assert main(["report", *map(str, outs), "--output_path", str(merged)]) == 0
    frame = pd.read_csv(merged / "sweep.csv")
    assert sorted(frame["step"].unique()) == [0, 10, 20]
    probs = frame[frame.metric == "context_prob"].set_index("step")["value"]
    assert probs.nunique() == 3  # adapters change the model; unloading restores the base
    # Each adapter scored in the shared engine equals a separate run of that adapter.
    fresh = run_lm_eval("hf", ["cf_capitals_mc"], model_args=f"pretrained={run_dir['base']},peft="
                        f"{run_dir['lora'] / 'step_10'},dtype=float32,device=cpu", limit=3)["results"]
    assert probs[10] == pytest.approx(fresh["cf_capitals_mc"]["context_prob,none"], abs=1e-6)
    assert (merged / "inversion.png").is_file()
    # The merged folder is a store holding both shards' results: a sweep into it has nothing left to
    # score, and its views rebuilt from that store equal the report's.
    results = sorted(p.parent.relative_to(o / "store") for o in outs for p in (o / "store").glob("*/*/*/record.json"))
    assert sorted(p.parent.relative_to(merged / "store") for p in (merged / "store").glob("*/*/*/record.json")) == results
    assert (merged / "checkpoints" / "step_10" / "results.json").is_file()
    before = _values(merged)
    made_backends.clear()
    assert main(["sweep", str(run_dir["lora"]), "--tasks", "cf_capitals_mc", "--output_path", str(merged),
                 "--limit", LIMIT, "--backend", "hf", "--include_base"]) == 0
    assert all(b.lm is None for b in made_backends) and _values(merged) == before  # no model loaded


def _responses(samples):
    return {s["doc_id"]: s["resps"] for s in samples}


def test_lora_group_generates_adapters_together_with_the_answers_of_separate_runs(run_dir, tmp_path, made_backends):
    out = tmp_path / "grouped"
    cfg = SweepConfig(run_dir=run_dir["lora"], tasks=["cf_capitals"], output_path=out, backend="hf", limit=4,
                      batch_size=2, device="cpu", lora_group=4, knowledge=False, agree=False)  # the task alone
    assert run_sweep(cfg, log=lambda *a, **k: None) == 0
    # Both adapters were generated in the first adapter's batches (4 items / batch 2 = 2 batches);
    # the second adapter's lm-eval run got its answers back for those same 2 batches.
    assert made_backends[0].lm.stats == {"group_batches": 2, "reused_batches": 2}
    # Both batches were listed first and decoded together for both adapters (decode.py).
    assert made_backends[0].lm.decode_stats["merged_batches"] == 2
    grouped = {}
    for step in (10, 20):
        lines = (out / "checkpoints" / f"step_{step}" / "samples_cf_capitals.jsonl").read_text().splitlines()
        grouped[step] = _responses(json.loads(line) for line in lines)
        fresh = run_lm_eval("hf", ["cf_capitals"], model_args=f"pretrained={run_dir['base']},peft="
                            f"{run_dir['lora'] / f'step_{step}'},dtype=float32,device=cpu", limit=4,
                            batch_size=2, log_samples=True)
        assert grouped[step] == _responses(fresh["samples"]["cf_capitals"]), step
    assert grouped[10] != grouped[20]  # the adapters answer differently, so a mix-up would show


@pytest.mark.slow
def test_a_group_of_three_is_generated_once_with_the_answers_of_separate_runs(run_dir, tmp_path, made_backends):
    # The first adapter's run lists lm-eval's batches and decodes them together for all three;
    # the later adapters' runs only read their rows back (nothing is generated twice).
    run = tmp_path / "run"
    run.mkdir()
    for step in (10, 20):
        shutil.copytree(run_dir["lora"] / f"step_{step}", run / f"step_{step}")
    build_lora_adapter(run_dir["base"], run / "step_30", seed=31)
    out = tmp_path / "out"
    cfg = SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, backend="hf", limit=6, batch_size=2,
                      device="cpu", knowledge=False, agree=False)
    assert run_sweep(cfg, log=lambda *a, **k: None) == 0
    lm = made_backends[0].lm
    assert lm.stats == {"group_batches": 3, "reused_batches": 6}  # 6 items / batch 2, for 3 adapters
    assert lm.decode_stats["merged_batches"] == 3
    answers = {}
    for step in (10, 20, 30):
        lines = (out / "checkpoints" / f"step_{step}" / "samples_cf_capitals.jsonl").read_text().splitlines()
        answers[step] = _responses(json.loads(line) for line in lines)
    fresh = run_lm_eval("hf", ["cf_capitals"], model_args=f"pretrained={run_dir['base']},peft={run / 'step_30'},"
                        "dtype=float32,device=cpu", limit=6, batch_size=2, log_samples=True)
    assert answers[30] == _responses(fresh["samples"]["cf_capitals"])
    assert len({json.dumps(a, sort_keys=True) for a in answers.values()}) == 3  # a mix-up would show


@pytest.mark.slow
def test_a_failed_decode_of_several_batches_falls_back_to_one_batch_at_a_time(run_dir, tmp_path, made_backends,
                                                                             monkeypatch, capsys):
    from unittest import mock

    import cf_tasks.sweep.hf as hf_backend

    def sweep(out):
        cfg = SweepConfig(run_dir=run_dir["lora"], tasks=["cf_capitals"], output_path=out, backend="hf", limit=4,
                          batch_size=2, device="cpu", knowledge=False, agree=False)
        assert run_sweep(cfg, log=lambda *a, **k: None) == 0
        return {step: _responses(json.loads(line) for line in (out / "checkpoints" / f"step_{step}" /
                                                              "samples_cf_capitals.jsonl").read_text().splitlines())
                for step in (10, 20)}

    expected = sweep(tmp_path / "ok")
    failing = mock.create_autospec(hf_backend.generate_batches, side_effect=RuntimeError("out of memory"))
    monkeypatch.setattr(hf_backend, "generate_batches", failing)
    assert sweep(tmp_path / "fallback") == expected
    assert failing.call_count == 1  # tried once, then never again in this model's life
    err = capsys.readouterr().err
    assert "generating several batches of the LoRA group at once failed (RuntimeError: out of memory)" in err
    # The batches were still generated for both adapters together, one batch at a time.
    assert made_backends[-1].lm.stats == {"group_batches": 2, "reused_batches": 2}
    assert "merged_batches" not in made_backends[-1].lm.decode_stats


def test_a_corrupt_adapter_in_a_group_fails_alone(run_dir, tmp_path, made_backends, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(run_dir["lora"] / "step_10", run / "step_10")
    shutil.copytree(run_dir["lora"] / "step_10", run / "step_15")
    (run / "step_15" / "adapter_model.safetensors").write_bytes(b"\x00not safetensors")
    shutil.copytree(run_dir["lora"] / "step_20", run / "step_20")
    out = tmp_path / "out"
    cfg = SweepConfig(run_dir=run, tasks=["cf_quotes"], output_path=out, backend="hf", limit=2, device="cpu")
    assert run_sweep(cfg) == 1
    manifest = json.loads((out / "manifest.json").read_text())["checkpoints"]
    status = {e["name"]: e["status"] for e in manifest.values()}
    assert status == {"step_10": "done", "step_15": "failed", "step_20": "done"}
    assert "step_15" in capsys.readouterr().err
    # step_10 and step_20 were still generated together, past the corrupt one.
    assert made_backends[0].lm.stats["group_batches"] == made_backends[0].lm.stats["reused_batches"] > 0


@pytest.mark.slow
def test_an_adapter_that_fails_to_load_leaves_its_mates_their_own_configs(run_dir, tmp_path, made_backends):
    # peft registers an adapter's config before loading its weights: a mate whose weights fail to
    # load must not leave its config to the next mate (same rank here, a different scaling).
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(run_dir["lora"] / "step_10", run / "step_10")
    bad = run / "step_15"
    build_lora_adapter(run_dir["base"], bad, seed=13, r=2)  # weights open, but their rank is not the config's
    cfg = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**cfg, "r": 4}))
    scaled = run / "step_20"
    shutil.copytree(run_dir["lora"] / "step_20", scaled)
    cfg = json.loads((scaled / "adapter_config.json").read_text())
    (scaled / "adapter_config.json").write_text(json.dumps({**cfg, "lora_alpha": cfg["lora_alpha"] * 64}))
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, backend="hf", limit=3,
                                 batch_size=3, device="cpu", knowledge=False, agree=False),  # the task alone
                     log=lambda *a, **k: None) == 1
    status = {e["name"]: e["status"] for e in json.loads((out / "manifest.json").read_text())["checkpoints"].values()}
    assert status == {"step_10": "done", "step_15": "failed", "step_20": "done"}
    # step_20 was generated with step_10 and kept its place while step_15 failed on its own.
    assert made_backends[0].lm.stats == {"group_batches": 1, "reused_batches": 1}
    lines = (out / "checkpoints" / "step_20" / "samples_cf_capitals.jsonl").read_text().splitlines()
    fresh = run_lm_eval("hf", ["cf_capitals"], model_args=f"pretrained={run_dir['base']},peft={scaled},dtype=float32,"
                        "device=cpu", limit=3, batch_size=3, log_samples=True)
    assert _responses(json.loads(line) for line in lines) == _responses(fresh["samples"]["cf_capitals"])
    unscaled = run_lm_eval("hf", ["cf_capitals"], model_args=f"pretrained={run_dir['base']},peft="
                           f"{run_dir['lora'] / 'step_20'},dtype=float32,device=cpu", limit=3, batch_size=3,
                           log_samples=True)
    # The scaling shows in the answers, so step_20 scored with another adapter's config would fail.
    assert _responses(fresh["samples"]["cf_capitals"]) != _responses(unscaled["samples"]["cf_capitals"])


def test_a_resaved_adapter_is_scored_with_its_new_weights_under_watch(run_dir, tmp_path, monkeypatch):
    import cf_tasks.sweep.plan as sweep

    run = tmp_path / "live"
    run.mkdir()
    for step in (10, 20):
        shutil.copytree(run_dir["lora"] / f"step_{step}", run / f"step_{step}")

    def resave(_seconds):  # between polls, training re-saves step_20 with step_10's weights
        shutil.copy(run_dir["lora"] / "step_10" / "adapter_model.safetensors", run / "step_20" / "adapter_model.safetensors")

    monkeypatch.setattr(sweep.time, "sleep", resave)
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, backend="hf", limit=3,
                                 batch_size=3, device="cpu", watch=True, poll_interval=0.01, settle_seconds=0,
                                 max_polls=2), log=lambda *a, **k: None) == 0
    answers = {step: _responses(json.loads(line) for line in
                                (out / "checkpoints" / f"step_{step}" / "samples_cf_capitals.jsonl").open())
               for step in (10, 20)}
    assert answers[20] == answers[10]  # not the first poll's step_20, which was still loaded


def test_bad_run_folders_are_one_line_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["sweep", str(empty), "--output_path", str(tmp_path / "o"), "--backend", "hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no checkpoint folders" in err and str(empty) in err
    assert main(["sweep", str(tmp_path / "missing"), "--output_path", str(tmp_path / "o")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["sweep", str(empty), "--output_path", str(tmp_path / "o"), "--shard", "2/2"]) == 2
    assert "I must be in 0..N-1" in capsys.readouterr().err


def test_duplicate_steps_and_missing_base_are_recorded(tmp_path, run_dir):
    run = tmp_path / "dups"
    run.mkdir()
    shutil.copytree(run_dir["full"] / "checkpoint-100", run / "checkpoint-7")
    shutil.copytree(run_dir["full"] / "checkpoint-100", run / "step_7")
    shutil.copytree(run_dir["lora"] / "step_10", run / "epoch_3")
    cfg = json.loads((run / "epoch_3" / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "no_such_base")
    (run / "epoch_3" / "adapter_config.json").write_text(json.dumps(cfg))
    found = {c.name: c.error for c in discover(run)}
    assert "step 7 is claimed by 2 checkpoints" in found["checkpoint-7"] and "rename or remove" in found["step_7"]
    assert "base model" in found["epoch_3"] and "--base" in found["epoch_3"]
    failed = run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=tmp_path / "o", limit=2))
    assert failed == 3


def test_watch_skips_checkpoints_still_being_written(tmp_path, run_dir):
    run = tmp_path / "live"
    run.mkdir()
    shutil.copytree(run_dir["full"] / "checkpoint-100", run / "checkpoint-1")
    (run / "checkpoint-2").mkdir()
    shutil.copy(run_dir["full"] / "checkpoint-100" / "config.json", run / "checkpoint-2" / "config.json")
    (run / "checkpoint-2" / "model.safetensors.tmp").write_bytes(b"partial")
    out = tmp_path / "o"
    failed = run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2, watch=True,
                                   settle_seconds=0, poll_interval=0.01, max_polls=1))
    assert failed == 0  # the half-written checkpoint is waited for, not failed
    names = {e["name"] for e in json.loads((out / "manifest.json").read_text())["checkpoints"].values()}
    assert names == {"checkpoint-1"}


# ---------------------------------------------------------------- the results store
ROOT = Path(__file__).resolve().parents[1]
QUIET = dict(log=lambda *a, **k: None)


def _run_of(tmp_path, run_dir, name, picks):
    """A run folder under ``tmp_path`` with copies of the module's checkpoints: {new name: old name}."""
    run = tmp_path / name
    run.mkdir()
    for new, old in picks.items():
        shutil.copytree(run_dir["full"] / old, run / new)
    return run


def _cli(*args, env=None, **kw):
    """cf-tasks in a new Python process that imports this checkout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "cf_tasks.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _values(out):
    """(run, checkpoint, step, task, metric, settings) -> (value, n) from sweep.json; a duplicate fails."""
    found = {}
    for r in json.loads((out / "sweep.json").read_text())["rows"]:
        key = (Path(r.get("run") or "").name, r["checkpoint"], r["step"], r["task"], r["metric"], r.get("settings"))
        assert key not in found, key
        found[key] = (r["value"], r["n"])
    return found


def _results_in_store(out):
    return sorted(p.parent.relative_to(out / "store").parts for p in (out / "store").glob("*/*/*/record.json"))


@pytest.mark.slow
def test_case1_concurrent_shards_and_a_duplicate_equal_a_serial_run(run_dir, tmp_path):
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100", "checkpoint-2": "checkpoint-200",
                                             "checkpoint-3": "checkpoint-300"})
    serial = tmp_path / "serial"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=serial, limit=2), **QUIET) == 0
    shared = tmp_path / "shared"
    # The command line's batch size on a CPU is 8; the serial run's (SweepConfig's) is 1, as lm-eval's:
    # a log-likelihood can move in its 8th digit with the batch, so both use 1.
    args = [str(run), "--tasks", "cf_capitals_mc", "--output_path", str(shared), "--limit", "2", "--backend", "hf",
            "--batch_size", "1"]
    procs = [_cli("sweep", *args, "--shard", s) for s in ("0/2", "1/2", "0/2")]
    codes = [p.wait(timeout=600) for p in procs]
    assert codes == [0, 0, 0], [p.stderr.read()[-2000:] for p in procs]
    assert _values(shared) == _values(serial)
    ids = _results_in_store(shared)
    assert len(ids) == len(set(ids)) == 3  # three checkpoints x one task, each once
    status = {e["name"]: e["status"] for e in json.loads((shared / "manifest.json").read_text())["checkpoints"].values()}
    assert status == {"checkpoint-1": "done", "checkpoint-2": "done", "checkpoint-3": "done"}
    assert not list(shared.rglob("*.cftmp")) and not list((shared / "claims").glob("*.lock"))


KILL_DURING_WRITE = """
import os, signal, sys
import cf_tasks.results as results
real_save = results.save_results
count = [0]
def save(res, folder):
    real_save(res, folder)
    count[0] += 1
    if count[0] == 2:  # the second result: its files are written, its record not, not yet renamed
        os.kill(os.getpid(), signal.SIGKILL)
    return folder
results.save_results = save
from cf_tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_sigkill_during_a_write_leaves_a_store_the_next_run_completes(run_dir, tmp_path):
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100", "checkpoint-2": "checkpoint-200"})
    serial = tmp_path / "serial"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=serial, limit=2), **QUIET) == 0
    out = tmp_path / "out"
    args = [str(run), "--tasks", "cf_capitals_mc", "--output_path", str(out), "--limit", "2", "--backend", "hf",
            "--batch_size", "1"]  # the serial run's batch size (SweepConfig's default)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, "-c", KILL_DURING_WRITE, "sweep", *args], env=env, capture_output=True,
                            text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert list(out.rglob("*.cftmp")) and list((out / "claims").glob("*.lock"))  # the killed run's temp and claim
    assert len(_results_in_store(out)) == 1  # the first checkpoint's result survived
    assert main(["sweep", *args]) == 0
    assert _values(out) == _values(serial)
    assert not list(out.rglob("*.cftmp"))  # the killed run's temp folder was cleaned
    assert not list((out / "claims").glob("*.lock"))


def test_case2_another_task_into_a_finished_output_keeps_the_first_tasks_results(run_dir, tmp_path):
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100", "checkpoint-2": "checkpoint-200"})
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2), **QUIET) == 0
    first = _values(out)
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, limit=2), **QUIET) == 0
    both = _values(out)
    assert {k: v for k, v in both.items() if k[3] == "cf_capitals_mc"} == first
    # cf_capitals is a knowledge-conflict task: its agreeing twin runs beside it by default.
    assert {k[3] for k in both} == {"cf_capitals_mc", "cf_capitals", "cf_capitals_agree"}
    results = json.loads((out / "checkpoints" / "checkpoint-1" / "results.json").read_text())
    assert set(results["results"]) == {"cf_capitals_mc", "cf_capitals", "cf_capitals_agree"}
    # Both tasks again: nothing is re-scored.
    before = _results_in_store(out)
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc", "cf_capitals"], output_path=out, limit=2),
                     **QUIET) == 0
    assert _results_in_store(out) == before and _values(out) == both


def test_case3_same_named_checkpoints_of_two_runs_never_collide(run_dir, tmp_path):
    run_a = _run_of(tmp_path, run_dir, "run_a", {"checkpoint-1": "checkpoint-100"})
    run_b = _run_of(tmp_path, run_dir, "run_b", {"checkpoint-1": "checkpoint-300"})
    out, alone = tmp_path / "out", tmp_path / "alone"
    for run in (run_a, run_b):
        assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2), **QUIET) == 0
    assert run_sweep(SweepConfig(run_dir=run_a, tasks=["cf_capitals_mc"], output_path=alone, limit=2), **QUIET) == 0
    values = _values(out)
    a = {k[1:]: v for k, v in values.items() if k[0] == "run_a"}
    b = {k[1:]: v for k, v in values.items() if k[0] == "run_b"}
    assert a == {k[1:]: v for k, v in _values(alone).items()}  # run_a's rows still read run_a's results
    assert a.keys() == b.keys() and a != b
    entries = json.loads((out / "manifest.json").read_text())["checkpoints"].values()
    assert sorted(Path(e["run"]).name for e in entries) == ["run_a", "run_b"]
    views = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert len(views) == 2 and all(v.startswith("checkpoint-1@run_") for v in views)
    summary = json.loads((out / "sweep.json").read_text())["summary"]
    assert summary == {} or len(summary) == 2


def test_case4_an_empty_task_list_against_a_finished_output_changes_nothing(run_dir, tmp_path, capsys):
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100"})
    out = tmp_path / "out"
    args = ["sweep", str(run), "--output_path", str(out), "--limit", "2", "--backend", "hf"]
    assert main([*args, "--tasks", "cf_capitals_mc"]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.suffix != ".png"}
    capsys.readouterr()
    for tasks in ("", " , "):
        assert main([*args, "--tasks", tasks]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--tasks is empty" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.suffix != ".png"} == before


def test_case5_results_of_other_settings_are_kept_apart(run_dir, tmp_path, capsys):
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100", "checkpoint-2": "checkpoint-200"})
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=3), **QUIET) == 0
    (run / "checkpoint-3").mkdir()
    for f in (run_dir["full"] / "checkpoint-300").iterdir():
        shutil.copy(f, run / "checkpoint-3" / f.name)
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2), **QUIET) == 0
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    by_settings = {}
    for r in rows:
        by_settings.setdefault((r["settings"], r["limit"]), []).append(r)
    assert sorted(k[1] for k in by_settings) == [2, 3]
    for (settings, limit), group in by_settings.items():
        assert {r["n"] for r in group} == {limit}  # never n=2 beside n=3 in one settings
    assert {r["checkpoint"] for r in by_settings[next(k for k in by_settings if k[1] == 2)]} == \
        {"checkpoint-1", "checkpoint-2", "checkpoint-3"}  # limit 2 re-scored every checkpoint
    series = {(r["series"], r["settings"]) for r in rows}
    assert len({s for s, _ in series}) == len(series)  # one series never holds two settings
    # metadata and the chat template are settings too
    from cf_tasks.registry import task_manager
    from cf_tasks.sweep import task_settings
    from cf_tasks.sweep.store import settings_hash

    tm = task_manager()
    variants = [SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2),
                SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2, metadata={"seed": 7}),
                SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2, apply_chat_template=True),
                SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=3)]
    assert len({settings_hash(task_settings(c, tm)["cf_capitals_mc"]) for c in variants}) == 4
    # report over two outputs of different limits: split into one series per settings, said in one line
    other = tmp_path / "other"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=other, limit=3), **QUIET) == 0
    capsys.readouterr()
    assert main(["report", str(out), str(other), "--output_path", str(tmp_path / "merged")]) == 0
    err = capsys.readouterr().err
    assert "cf_capitals_mc: rows under different evaluation settings" in err and err.count("\n") == 1
    merged, mine, others = _values(tmp_path / "merged"), _values(out), _values(other)
    common = mine.keys() & others.keys()
    assert common and all(mine[k] == others[k] for k in common)
    assert merged == {**others, **mine}  # a result in both outputs counts once


def test_case5_report_refuses_one_checkpoint_scored_from_two_contents(run_dir, tmp_path, capsys):
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100"})
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=a, limit=2), **QUIET) == 0
    shutil.copy(run_dir["full"] / "checkpoint-200" / "model.safetensors", run / "checkpoint-1" / "model.safetensors")
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=b, limit=2), **QUIET) == 0
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--output_path", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "different results" in err and "checkpoint-1" in err


def _permuted_tokenizer(folder):
    """Give the checkpoint's tokenizer another vocabulary order: same size, other ids."""
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    words = sorted((w for w, i in vocab.items() if i >= 4), key=vocab.get)
    ids = [vocab[w] for w in words]
    for w, i in zip(words, reversed(ids)):
        vocab[w] = i
    path.write_text(json.dumps(tok))


def test_case6_hf_weight_swap_loads_fresh_when_the_tokenizer_differs(run_dir, tmp_path, made_backends):
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100", "checkpoint-2": "checkpoint-200"})
    _permuted_tokenizer(run / "checkpoint-2")
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=3), **QUIET) == 0
    assert made_backends[0].swaps == 0
    fresh = run_lm_eval("hf", ["cf_capitals_mc"], model_args=f"pretrained={run / 'checkpoint-2'},dtype=float32,device=cpu",
                        limit=3)["results"]["cf_capitals_mc"]["context_prob,none"]
    swept = {k[1]: v[0] for k, v in _values(out).items() if k[4] == "context_prob"}
    assert swept["checkpoint-2"] == pytest.approx(fresh, abs=1e-6)


def _err_line(capsys):
    """The one line a sweep or report printed (the progress bar aside)."""
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cf-tasks:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_case7_bad_arguments_stop_before_any_model_loads(run_dir, tmp_path, capsys, monkeypatch):
    import cf_tasks.sweep.checks as checks
    import cf_tasks.sweep.plan as sweep

    monkeypatch.setattr(sweep, "make_backend", lambda *a: pytest.fail("a model was loaded"))
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100"})
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    out = tmp_path / "out"
    base = ["sweep", str(run), "--backend", "hf"]
    cases = [
        (["--output_path", str(a_file), "--tasks", "cf_capitals_mc"], "is a file, not a folder"),
        (["--output_path", str(a_file / "sub"), "--tasks", "cf_capitals_mc"], "is a file, so the folder cannot be created"),
        (["--output_path", str(out), "--tasks", "cf_capitalz"], "unknown task 'cf_capitalz' (did you mean cf_capitals"),
        (["--output_path", str(out), "--tasks", "cf_capitals_mc", "--limit", "0"], "--limit 0: must be a positive"),
        (["--output_path", str(out), "--tasks", "cf_capitals_mc", "--limit", "-1"], "--limit -1: must be a positive"),
    ]
    for extra, expected in cases:
        assert main([*base, *extra]) == 2, extra
        assert expected in _err_line(capsys)
    assert not out.exists()  # nothing left behind
    real_listdir = os.listdir

    def unreadable(path):
        if Path(path).name == "checkpoint-1":
            raise PermissionError(13, "Permission denied")
        return real_listdir(path)

    with monkeypatch.context() as m:
        m.setattr(checks.os, "listdir", unreadable)
        assert main([*base, "--output_path", str(out), "--tasks", "cf_capitals_mc"]) == 2
        err = _err_line(capsys)
        assert "checkpoint-1: cannot read the checkpoint folder (Permission denied)" in err
    with monkeypatch.context() as m:
        m.setitem(checks.REQUIRED_PACKAGES, "hf", ("no_such_package_cf",))
        assert main([*base, "--output_path", str(out), "--tasks", "cf_capitals_mc"]) == 2
        assert "pip install no_such_package_cf" in _err_line(capsys)
    assert not out.exists()


def test_case7_a_missing_package_at_load_stops_the_sweep_with_the_install_command(run_dir, tmp_path, capsys,
                                                                                 monkeypatch):
    import cf_tasks.sweep.plan as sweep

    def no_accelerate(self, ckpt):
        raise ModuleNotFoundError("No module named 'accelerate'", name="accelerate")

    monkeypatch.setattr(sweep.HFBackend, "model_for", no_accelerate)
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100", "checkpoint-2": "checkpoint-200"})
    assert main(["sweep", str(run), "--backend", "hf", "--output_path", str(tmp_path / "o"), "--tasks",
                 "cf_capitals_mc", "--limit", "2"]) == 2
    err = _err_line(capsys)
    assert "pip install accelerate" in err and "checkpoint" not in err


def test_case7_a_task_whose_dataset_cannot_load_is_one_line(run_dir, tmp_path, capsys):
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100"})
    code = main(["sweep", str(run), "--backend", "hf", "--output_path", str(tmp_path / "o"), "--tasks", "arc_easy",
                 "--limit", "2"])
    err = capsys.readouterr().err.strip()
    if code != 2 and "arc_easy" not in err:
        pytest.skip("arc_easy is in the local dataset cache")
    assert code == 2 and err.count("\n") == 0, err
    assert err.startswith("cf-tasks: error: task arc_easy:") and "allenai/ai2_arc" in err
    assert not (tmp_path / "o").exists()


def test_case8_files_respect_the_umask_and_leftovers_are_cleaned(run_dir, tmp_path):
    import socket

    from cf_tasks.files import TMP_MARK, host_tag

    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100"})
    out = tmp_path / "out"
    (out / "store" / "abc").mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    host = host_tag(socket.gethostname())
    leftovers = [out / f".sweep.csv.{host}.{dead}.0a1b{TMP_MARK}",
                 out / "store" / "abc" / f".x.{host}.{dead}.0a1c{TMP_MARK}"]
    leftovers[0].write_text("half")
    leftovers[1].mkdir()
    live = out / f".sweep.json.{host}.1.0a1d{TMP_MARK}"  # pid 1 lives: another writer's
    live.write_text("in flight")
    (out / "store" / "abc" / "where").mkdir()
    made_by_test = {out / "store", out / "store" / "abc", out / "store" / "abc" / "where"}
    old = os.umask(0o027)
    try:
        assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2), **QUIET) == 0
    finally:
        os.umask(old)
    assert not any(p.exists() for p in leftovers) and live.exists()
    live.unlink()
    modes = {p.relative_to(out): p.stat().st_mode & 0o777 for p in out.rglob("*") if p not in made_by_test}
    assert {m for p, m in modes.items() if (out / p).is_file()} == {0o640}
    assert {m for p, m in modes.items() if (out / p).is_dir()} == {0o750}


def test_a_changed_lm_eval_hook_stops_the_sweep_in_one_line_before_any_model_loads(run_dir, tmp_path, capsys,
                                                                                  monkeypatch):
    import inspect

    from lm_eval.models.huggingface import HFLM

    from cf_tasks.sweep.hf import HFBackend

    sig = inspect.signature(HFLM._model_generate)  # as if a release renamed **generation_kwargs
    changed = sig.replace(parameters=[*list(sig.parameters.values())[:-1],
                                      inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    monkeypatch.setattr(HFLM._model_generate, "__signature__", changed, raising=False)
    monkeypatch.setattr(HFBackend, "_new_lm", lambda *a: pytest.fail("a model was loaded"))
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100"})
    code = main(["sweep", str(run), "--backend", "hf", "--tasks", "cf_capitals_mc", "--output_path",
                 str(tmp_path / "out"), "--limit", "2"])
    line = _err_line(capsys)
    assert code == 2
    assert line.startswith("cf-tasks: error: lm-eval ") and "HFLM._model_generate(" in line
    assert 'pip install "lm-eval==' in line


def test_case8_weights_rewritten_with_their_old_mtime_are_rescored(run_dir, tmp_path):
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100"})
    out = tmp_path / "out"
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2), **QUIET) == 0
    first = _values(out)
    weights = run / "checkpoint-1" / "model.safetensors"
    stat = weights.stat()
    shutil.copyfile(run_dir["full"] / "checkpoint-200" / "model.safetensors", weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2), **QUIET) == 0
    second = _values(out)
    assert second.keys() == first.keys() and second != first
    other = tmp_path / "other"
    alone = _run_of(tmp_path, run_dir, "alone", {"checkpoint-1": "checkpoint-200"})
    assert run_sweep(SweepConfig(run_dir=alone, tasks=["cf_capitals_mc"], output_path=other, limit=2), **QUIET) == 0
    assert {k[1:]: v for k, v in second.items()} == {k[1:]: v for k, v in _values(other).items()}


@pytest.mark.parametrize("content", ["[1, 2]", '{"rows": 5}', '{"rows": [{"checkpoint": "x"}]}', '{"rows": [', ""])
def test_case8_report_on_a_malformed_sweep_json_is_one_line(tmp_path, capsys, content):
    out = tmp_path / "o"
    out.mkdir()
    (out / "sweep.json").write_text(content)
    assert main(["report", str(out)]) == 2
    assert "not a valid sweep.json" in _err_line(capsys)


def test_case8_concurrent_plots_use_their_own_temp_names(tmp_path):
    from cf_tasks.sweep import plot

    rows = [{"task": "cf_x", "metric": "counterfactual_acc", "step": s, "value": 0.5, "stderr": 0.1} for s in (1, 2)]
    (tmp_path / ".inversion.png.tmp.png").mkdir()  # the one fixed name every sweep used
    plot(rows, tmp_path / "inversion.png")
    assert (tmp_path / "inversion.png").stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [".inversion.png.tmp.png", "inversion.png"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["claim", "evaluate", "write", "views"])
def test_an_interrupt_at_each_stage_resumes_to_the_uninterrupted_csv(run_dir, tmp_path, monkeypatch, stage):
    import cf_tasks.evaluate as evaluate
    import cf_tasks.sweep.plan as sweep
    from cf_tasks.sweep import locks as sweep_locks
    from cf_tasks.sweep import store as sweep_store

    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100", "checkpoint-2": "checkpoint-200"})
    reference = tmp_path / "reference"
    cfg = dict(run_dir=run, tasks=["cf_capitals_mc"], limit=2)
    assert run_sweep(SweepConfig(output_path=reference, **cfg), **QUIET) == 0
    target = {"claim": (sweep_locks, "try_lock"), "evaluate": (evaluate, "run_lm_eval"),
              "write": (sweep_store, "write_json"), "views": (sweep, "rebuild_views")}[stage]
    real = getattr(*target)
    calls = [0]

    def interrupted(*a, **k):
        calls[0] += 1
        if calls[0] == 2 or (stage == "write" and str(a[0]).endswith("record.json") and calls[0] > 2):
            if stage == "write":
                calls[0] = -10**6
            raise KeyboardInterrupt
        return real(*a, **k)

    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(*target, interrupted)
        m.setattr(sweep, "VIEWS_EVERY", 0.0)  # views after each checkpoint: the second call is mid-run
        with pytest.raises(KeyboardInterrupt):
            run_sweep(SweepConfig(output_path=out, **cfg), **QUIET)
    assert run_sweep(SweepConfig(output_path=out, **cfg), **QUIET) == 0
    assert (out / "sweep.csv").read_text() == (reference / "sweep.csv").read_text()
    assert not list(out.rglob("*.cftmp")) and not list((out / "claims").glob("*.lock"))


def test_shard_auto_reads_slurm_or_torchrun_variables():
    from cf_tasks.sweep import SweepError, shard_from_env

    assert shard_from_env({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}) == (3, 4)
    assert shard_from_env({"SLURM_ARRAY_TASK_ID": "11", "SLURM_ARRAY_TASK_COUNT": "4",
                           "SLURM_ARRAY_TASK_MIN": "10"}) == (1, 4)
    assert shard_from_env({"SLURM_ARRAY_TASK_ID": "8", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0",
                           "SLURM_ARRAY_TASK_STEP": "4"}) == (2, 4)
    assert shard_from_env({"RANK": "1", "WORLD_SIZE": "2"}) == (1, 2)
    assert shard_from_env({}) == (0, 1)
    with pytest.raises(SweepError, match="outside 0..1"):
        shard_from_env({"RANK": "2", "WORLD_SIZE": "2"})


def test_a_stale_claim_is_taken_over_and_a_live_one_is_not(tmp_path):
    import socket
    import time

    from cf_tasks.sweep.locks import try_lock, unlock

    lock = tmp_path / "claims" / "x.lock"
    lock.parent.mkdir()
    lock.write_text(json.dumps({"pid": 1, "host": socket.gethostname(), "time": time.time()}))
    assert not try_lock(lock, timeout=3600)  # pid 1 lives on this host
    lock.write_text(json.dumps({"pid": 1, "host": "another-host", "time": time.time()}))
    assert not try_lock(lock, timeout=3600)  # another host's, recent
    old = time.time() - 7200
    os.utime(lock, (old, old))
    assert try_lock(lock, timeout=3600)  # another host's, older than the timeout
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    unlock(lock)
    assert not lock.exists()


# ---------------------------------------------------------------- --model_args
def test_model_args_dtype_bfloat16_on_hf_is_its_own_setting_and_equals_lm_eval(run_dir, tmp_path, made_backends):
    import torch

    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100", "checkpoint-2": "checkpoint-200"})
    out = tmp_path / "out"
    # batch size 1, as the lm-eval run below: in bfloat16 a batch's padding moves a log-likelihood in its 3rd digit
    args = ["sweep", str(run), "--tasks", "cf_capitals_mc", "--output_path", str(out), "--limit", "3", "--batch_size", "1",
            "--backend", "hf", "--device", "cpu"]
    assert main(args) == 0
    assert main([*args, "--model_args", "dtype=bfloat16"]) == 0
    default, bf16 = made_backends
    assert default.lm.model.dtype == torch.float32  # dtype=auto: the checkpoint's own
    assert bf16.lm.model.dtype == torch.bfloat16 and bf16.swaps == 1  # checkpoint-2 went into the bf16 model
    values: dict = {}
    for r in json.loads((out / "sweep.json").read_text())["rows"]:
        values.setdefault((r["model_args"], r["settings"]), {})[(r["checkpoint"], r["metric"])] = r["value"]
    assert sorted(k[0] for k in values) == ["device=cpu,dtype=auto", "device=cpu,dtype=bfloat16"]
    assert len({k[1] for k in values}) == 2  # two settings hashes: the first run's results were kept, not mixed
    assert len(_results_in_store(out)) == 4  # 2 checkpoints x 1 task x 2 settings
    assert set(pd.read_csv(out / "sweep.csv")["model_args"]) == {"device=cpu,dtype=auto", "device=cpu,dtype=bfloat16"}
    f32 = next(v for k, v in values.items() if k[0].endswith("auto"))
    b16 = next(v for k, v in values.items() if k[0].endswith("bfloat16"))
    for name in ("checkpoint-1", "checkpoint-2"):
        fresh = run_lm_eval("hf", ["cf_capitals_mc"], model_args=f"pretrained={run / name},dtype=bfloat16,device=cpu",
                            limit=3)["results"]["cf_capitals_mc"]
        metrics = [m for c, m in b16 if c == name]
        assert "context_prob" in metrics
        for metric in metrics:
            assert b16[(name, metric)] == pytest.approx(fresh[f"{metric},none"], abs=1e-6), (name, metric)
    assert b16[("checkpoint-1", "context_prob")] != f32[("checkpoint-1", "context_prob")]  # the dtype shows


MODEL_ARGS_ERRORS = [
    ("hf", ["--model_args", "pretrained=/elsewhere"], "--model_args pretrained: the sweep sets it to each checkpoint"),
    ("hf", ["--model_args", "dtype=bfloat16,peft=/an/adapter"], "--model_args peft: the sweep attaches each adapter"),
    ("vllm", ["--model_args", "lora_local_path=/an/adapter"], "--model_args lora_local_path: the sweep serves"),
    ("hf", ["--model_args", "batch_size=8"], "--model_args batch_size: pass --batch_size"),
    ("hf", ["--model_args", "dtype"], "'dtype' is not key=value"),
    ("hf", ["--model_args", "dtype=bfloat16,=3"], "'=3' is not key=value"),
    ("hf", ["--model_args", "dtype="], "'dtype=' is not key=value"),
    ("hf", ["--model_args", "dtype=bfloat16,dtype=float32"], "dtype is given twice"),
    ("hf", ["--model_args", "dtype=fp8"], "--model_args dtype=fp8: pass auto"),
    ("hf", ["--model_args", "gpu_memory_utilization=0.9"],
     "--model_args gpu_memory_utilization: an argument of --backend vllm, not of --backend hf"),
    ("hf", ["--model_args", "dtype=bfloat16,max_model_len=4096"],
     "--model_args max_model_len: an argument of --backend vllm, not of --backend hf"),
    ("hf", ["--model_args", "device=cuda:1", "--device", "cpu"], "--device cpu and --model_args device=cuda:1 disagree"),
    ("vllm", ["--model_args", "device=cuda"], "--model_args device: an argument of --backend hf, not of --backend vllm"),
    ("vllm", ["--model_args", "tensor_parallel_size=2", "--tensor_parallel_size", "4"],
     "--tensor_parallel_size 4 and --model_args tensor_parallel_size=2 disagree"),
    ("vllm", ["--model_args", "max_lora_rank=24"], "--model_args max_lora_rank=24: vLLM takes one of 1, 8, 16"),
    ("vllm", ["--model_args", "gpu_memory_utilization=1.5"], "gpu_memory_utilization=1.5: pass a fraction"),
    ("vllm", ["--model_args", "max_model_len=0"], "max_model_len=0: pass a whole number"),
    ("vllm", ["--model_args", "kv_cache_memory_bytes=4GiB"], "kv_cache_memory_bytes=4GiB: pass a whole number"),
    ("hf", ["--model_args", "kv_cache_memory_bytes=1073741824"],
     "--model_args kv_cache_memory_bytes: an argument of --backend vllm, not of --backend hf"),
    ("vllm", ["--model_args", "enforce_eager=yes"], "enforce_eager=yes: pass True or False"),
]


@pytest.mark.parametrize("backend,extra,expected", MODEL_ARGS_ERRORS, ids=[" ".join(c[1]) for c in MODEL_ARGS_ERRORS])
def test_model_args_errors_stop_before_any_model_loads(run_dir, tmp_path, capsys, monkeypatch, backend, extra, expected):
    import cf_tasks.sweep.checks as checks
    import cf_tasks.sweep.plan as sweep

    monkeypatch.setattr(sweep, "make_backend", lambda *a: pytest.fail("a model was loaded"))
    monkeypatch.setattr(sweep, "task_settings", lambda *a: pytest.fail("the task index was loaded"))
    monkeypatch.setitem(checks.REQUIRED_PACKAGES, "vllm", ())  # the checks, with or without vLLM installed
    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100"})
    out = tmp_path / "out"
    assert main(["sweep", str(run), "--backend", backend, "--output_path", str(out), "--tasks", "cf_capitals_mc",
                 *extra]) == 2
    assert expected in _err_line(capsys)
    assert not out.exists()


def test_model_args_defaults_and_typing_per_backend(monkeypatch):
    import cf_tasks.sweep.model_args as margs
    from cf_tasks.sweep import CPU_KV_CACHE_BYTES, parse_model_args, sweep_model_args

    def cfg(backend, model_args=None, **kw):
        return SweepConfig(run_dir=Path("."), tasks=["cf_quotes"], output_path=Path("o"), backend=backend,
                           model_args=model_args, **kw)

    assert parse_model_args("max_model_len=4096, trust_remote_code=True,quantization='awq',gpu_memory_utilization=0.9,") \
        == {"max_model_len": 4096, "trust_remote_code": True, "quantization": "awq", "gpu_memory_utilization": 0.9}
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert sweep_model_args(cfg("hf", device="cuda:0")) == {"dtype": "auto", "device": "cuda:0"}
    assert sweep_model_args(cfg("hf", "dtype=half,device=cpu", device="cpu")) == {"dtype": "float16", "device": "cpu"}
    monkeypatch.setattr(margs, "vllm_on_cpu", lambda: True)
    assert sweep_model_args(cfg("vllm")) == {"dtype": "auto", "tensor_parallel_size": 1, "enforce_eager": True,
                                             "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    # A given memory share or KV cache size replaces the default size (vLLM would take the size over the share).
    assert "kv_cache_memory_bytes" not in sweep_model_args(cfg("vllm", "gpu_memory_utilization=0.3"))
    assert sweep_model_args(cfg("vllm", "kv_cache_memory_bytes=1073741824"))["kv_cache_memory_bytes"] == 2**30
    given = "enforce_eager=False,gpu_memory_utilization=0.5,tensor_parallel_size=2,dtype=bfloat16"
    assert sweep_model_args(cfg("vllm", given, tensor_parallel_size=2)) == {
        "dtype": "bfloat16", "tensor_parallel_size": 2, "enforce_eager": False, "gpu_memory_utilization": 0.5}
    monkeypatch.setattr(margs, "vllm_on_cpu", lambda: False)  # a GPU: vLLM's own defaults
    assert sweep_model_args(cfg("vllm", tensor_parallel_size=4)) == {"dtype": "auto", "tensor_parallel_size": 4}


def test_checkpoint_dtype_reads_the_config_then_the_weights(tiny_model, tmp_path):
    import torch
    from safetensors.torch import save_file

    from cf_tasks.sweep import checkpoint_dtype

    assert checkpoint_dtype(tiny_model) == "float32"
    cases = {"new": {"dtype": "bfloat16"}, "old": {"torch_dtype": "float16"}, "vlm": {"text_config": {"dtype": "bfloat16"}},
             "fp8": {"dtype": "float8_e4m3fn"}, "none": {}}
    for name, config in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    save_file({"w": torch.zeros(2, dtype=torch.bfloat16)}, str(tmp_path / "none" / "model.safetensors"))
    found = {name: checkpoint_dtype(tmp_path / name) for name in cases}
    assert found == {"new": "bfloat16", "old": "float16", "vlm": "bfloat16", "fp8": "auto", "none": "bfloat16"}
    save_file({"v": torch.zeros(2)}, str(tmp_path / "none" / "model-2.safetensors"))
    assert checkpoint_dtype(tmp_path / "none") == "float32"  # mixed weights: what both load them in


def test_the_sweeps_steps_can_be_called_one_by_one(run_dir, tmp_path, monkeypatch):
    """``SweepRun``: the checks and settings (no model), a round's plan, one checkpoint scored, the
    next round's plan without it, and the views; the same rows as ``run_sweep``. The model
    arguments are computed once, by the checks, and reach the backend and every task's settings."""
    from unittest import mock

    import cf_tasks.sweep.checks as checks
    import cf_tasks.sweep.plan as plan
    import cf_tasks.sweep.settings as sweep_settings
    from cf_tasks.sweep import SweepRun

    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100", "checkpoint-2": "checkpoint-200"})
    cfg = dict(run_dir=run, tasks=["cf_capitals_mc"], limit=2)
    assert run_sweep(SweepConfig(output_path=tmp_path / "reference", **cfg), **QUIET) == 0

    lines = []
    computed = mock.create_autospec(checks.sweep_model_args, side_effect=checks.sweep_model_args)
    with mock.patch.object(checks, "sweep_model_args", computed), \
            mock.patch.object(sweep_settings, "sweep_model_args", computed), \
            mock.patch.object(plan, "make_backend", autospec=True, side_effect=plan.make_backend) as make:
        steps = SweepRun(SweepConfig(output_path=tmp_path / "out", **cfg), log=lambda *a, **k: lines.append(a))
        make.assert_not_called()  # the checks and the settings load no model
        todo = steps.plan_round()
        assert [c.name for c, _, _ in todo] == ["checkpoint-1", "checkpoint-2"]
        assert [cid for _, _, cid in todo] == [p["id"] for _, p, _ in todo]
        assert steps.score_all(todo[:1]) == 0  # nobody else holds its claim
        assert [c.name for c, _, _ in steps.plan_round()] == ["checkpoint-2"]
        assert steps.score_all(steps.plan_round()) == 0
        assert steps.plan_round() == []
        assert steps.finish() == 0
    assert computed.call_count == 1
    assert make.call_args.args[2] is steps.model_args
    assert {id(s["model_args"]) for s in steps.settings.values()} == {id(steps.model_args)}
    assert lines[-1][0].startswith("sweep: 2 checkpoints: 2 scored, 0 reused, 0 failed")
    assert _values(tmp_path / "out") == _values(tmp_path / "reference")


def test_the_hf_batch_size_defaults_to_8_on_a_cpu_and_a_given_one_is_kept(run_dir, tmp_path, made_backends):
    from cf_tasks.sweep.hf import CPU_BATCH_SIZE

    run = _run_of(tmp_path, run_dir, "run", {"checkpoint-1": "checkpoint-100"})
    common = ["sweep", str(run), "--tasks", "cf_capitals_mc", "--limit", "2", "--device", "cpu", "--quiet"]
    assert main([*common, "--output_path", str(tmp_path / "default")]) == 0
    assert made_backends[-1].lm.batch_size_per_gpu == CPU_BATCH_SIZE == 8
    assert main([*common, "--output_path", str(tmp_path / "given"), "--batch_size", "3"]) == 0
    assert made_backends[-1].lm.batch_size_per_gpu == 3
    # The batch size is no setting of a result: both runs give the same rows (same settings, same n),
    # with values equal up to a log-likelihood's last digits, which padding in a batch can move.
    default, given = _values(tmp_path / "default"), _values(tmp_path / "given")
    assert default.keys() == given.keys()
    for key, (value, n) in default.items():
        assert given[key][1] == n and given[key][0] == pytest.approx(value, rel=1e-6, abs=1e-9), key

    # On a GPU, lm-eval's default of 1 (the memory a batch needs depends on the model).
    from cf_tasks.sweep import HFBackend

    cfg = SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=tmp_path / "gpu", batch_size=None)
    assert HFBackend(cfg, {"dtype": "auto", "device": "cuda:0"}).batch_size == 1
    assert HFBackend(cfg, {"dtype": "auto", "device": "cpu"}).batch_size == 8
