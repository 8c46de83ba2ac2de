"""`cf-tasks sweep` on a bad day: every bad flag refused in one line (exit 2) before any model loads,
checkpoint names that look like checkpoints but are not scored listed with the reason, and a full
checkpoint without its (untied) output head refused instead of scored with another one's."""

import json
import os
import shutil
from pathlib import Path

import pytest

from cf_tasks.checkpoints import discover, skipped, step_of
from cf_tasks.cli import main
from cf_tasks.sweep import SweepConfig, run_sweep

QUIET = dict(log=lambda *a, **k: None)


@pytest.fixture
def cpu_only(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def no_model(monkeypatch):
    import cf_tasks.sweep.plan as plan

    monkeypatch.setattr(plan, "make_backend", lambda *a: pytest.fail("a model was loaded"))
    monkeypatch.setattr(plan, "task_settings", lambda *a: pytest.fail("the task index was loaded"))


def _error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cf-tasks:")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("cf-tasks: error: ")
    return lines[0]


SWEEP_ERRORS = [
    (["--model_args", "flash=1"], "--model_args flash: not an argument of lm-eval's hf model; remove or correct it"),
    (["--model_args", "attn_implementaton=eager"], "(did you mean attn_implementation?)"),
    (["--device", "cuda"], "--device cuda: this machine has no cuda device; pass cpu or leave it out"),
    (["--model_args", "device=cuda"], "--model_args device=cuda: this machine has no cuda device; pass cpu"),
    (["--device", "banana"], "--device banana: not a device; pass cpu, cuda, cuda:N or mps"),
    (["--batch_size", "abc"], "--batch_size abc: pass a whole number of at least 1, auto or auto:N"),
    (["--batch_size", "-2"], "--batch_size -2: pass a whole number"),
    (["--watch", "--poll_interval", "-1"], "--poll_interval -1: must be a finite number above 0"),
    (["--watch", "--poll_interval", "0"], "--poll_interval 0: must be a finite number above 0"),
    (["--watch", "--poll_interval", "nan"], "--poll_interval nan: must be a finite number above 0"),
    (["--watch", "--settle_seconds", "-5"], "--settle_seconds -5: must be a finite number at least 0"),
    (["--watch", "--max_polls", "0"], "--max_polls 0: must be a finite number at least 1"),
    (["--lock_timeout", "-1"], "--lock_timeout -1: must be a finite number above 0"),
    (["--lock_timeout", "inf"], "--lock_timeout inf: must be a finite number above 0"),
    (["--lora_group", "0"], "--lora_group 0: must be a finite number at least 1"),
    (["--limit", "inf"], "--limit inf: must be a positive number"),
    (["--limit", "nan"], "--limit nan: must be a positive number"),
    (["--metadata", '{"seed": "x"}'], '--metadata seed "x": pass a whole number'),
]


@pytest.mark.parametrize(("extra", "expected"), SWEEP_ERRORS, ids=[" ".join(c[0]) for c in SWEEP_ERRORS])
def test_sweep_bad_flags_are_one_line_before_any_model_loads(no_model, cpu_only, tmp_path, capsys, extra, expected):
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    out = tmp_path / "out"
    assert main(["sweep", str(run), "--backend", "hf", "--output_path", str(out), "--tasks", "cf_capitals_mc",
                 *extra]) == 2
    assert expected in _error_line(capsys)
    assert not out.exists()


def test_sweep_metadata_key_no_task_reads_is_refused_before_the_datasets_load(monkeypatch, tmp_path, capsys):
    import cf_tasks.sweep.plan as plan
    import cf_tasks.sweep.settings as sweep_settings

    monkeypatch.setattr(plan, "make_backend", lambda *a: pytest.fail("a model was loaded"))
    monkeypatch.setattr(sweep_settings, "load_task", lambda *a: pytest.fail("a dataset was loaded"))
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    assert main(["sweep", str(run), "--backend", "hf", "--output_path", str(tmp_path / "out"), "--tasks",
                 "cf_capitals_mc", "--metadata", '{"sed": 3}']) == 2
    err = _error_line(capsys)
    assert "--metadata sed: no task of this run reads it; did you mean seed?" in err and "cache" not in err


# ---------------------------------------------------------------- checkpoint names
ODD_NAMES = {
    "Checkpoint-13": "names are matched in lower case; rename it to checkpoint-13 to score it",
    "checkpoint-1e3": "not one of checkpoint-N, step_N, step-N, global_stepN or epoch_N",
    "checkpoint-12 (copy)": "not one of checkpoint-N",
    "step_12.bak": "not one of checkpoint-N",
    "checkpoint-\u0663": "not written in ASCII digits 0-9; rename it to checkpoint-3 to score it",  # Arabic-Indic 3
    "checkpoint-\uff11\uff13": "not written in ASCII digits 0-9; rename it to checkpoint-13 to score it",  # full-width
    "epoch_\u0661\u0662": "rename it to epoch_12",
}


def _odd_run(tmp_path) -> Path:
    run = tmp_path / "run"
    (run / "checkpoint-100").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "trainer_state.json").write_text("{}")
    for name in ODD_NAMES:
        (run / name).mkdir()
    (run / "checkpoint-7").symlink_to(tmp_path / "deleted")
    (run / "step_9").write_text("not a folder")
    return run


def test_names_that_look_like_checkpoints_are_listed_with_the_reason(tmp_path):
    run = _odd_run(tmp_path)
    assert [c.name for c in discover(run)] == ["checkpoint-100"]
    assert step_of("checkpoint-\u0663") is None and step_of("checkpoint-\uff11\uff13") is None
    reasons = {path.name: reason for path, reason in skipped(run)}
    assert set(reasons) == {*ODD_NAMES, "checkpoint-7", "step_9"}  # not logs, trainer_state.json or checkpoint-100
    for name, expected in ODD_NAMES.items():
        assert expected in reasons[name], (name, reasons[name])
    assert reasons["checkpoint-7"] == f"a symlink to {tmp_path / 'deleted'}, which does not exist; fix or remove the link"
    assert reasons["step_9"].startswith("a file, not a checkpoint folder")


def test_a_sweep_lists_each_skipped_name_once(tmp_path, capsys):
    run = _odd_run(tmp_path)
    shutil.rmtree(run / "checkpoint-100")
    assert main(["sweep", str(run), "--backend", "hf", "--output_path", str(tmp_path / "out"), "--tasks",
                 "cf_capitals_mc"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    listed = [line for line in lines if line.startswith("cf-tasks: skipped ")]
    assert len(listed) == len(ODD_NAMES) + 2 == len(set(listed))
    assert f"cf-tasks: skipped {run / 'Checkpoint-13'}: names are matched in lower case" in "\n".join(listed)
    assert lines[-1].startswith("cf-tasks: error: ") and f"; {len(listed)} skipped name(s) listed above" in lines[-1]


# ---------------------------------------------------------------- a checkpoint without its output head
def _drop_head(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    del state["lm_head.weight"]
    save_file(state, str(weights), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def headless_run(tiny_model, tmp_path_factory):
    from tiny_model import build_full_checkpoint

    run = tmp_path_factory.mktemp("headless") / "run"
    run.mkdir()
    build_full_checkpoint(tiny_model, run / "checkpoint-1", seed=1)
    build_full_checkpoint(tiny_model, run / "checkpoint-2", seed=2)
    _drop_head(run / "checkpoint-2")
    assert json.loads((run / "checkpoint-2" / "config.json").read_text())["tie_word_embeddings"] is False
    return run


@pytest.mark.parametrize("first", [True, False], ids=["after-a-loaded-checkpoint", "loaded-fresh"])
def test_a_checkpoint_without_its_untied_head_is_refused(headless_run, tmp_path, made_backends, first):
    run = headless_run
    if not first:
        run = tmp_path / "run"
        run.mkdir()
        (run / "checkpoint-2").symlink_to(headless_run / "checkpoint-2")
    messages = []
    out = tmp_path / "out"
    failed = run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals_mc"], output_path=out, limit=2, device="cpu",
                                   agree=False, knowledge=False), log=lambda *a, **k: messages.append(" ".join(map(str, a))))
    assert failed == 1
    errors = [m for m in messages if m.startswith("cf-tasks: error: ")]
    assert errors == [f"cf-tasks: error: {run / 'checkpoint-2' / 'model.safetensors'}: lacks lm_head.weight, which the "
                      "model does not tie to another weight (its config.json has tie_word_embeddings false); re-save "
                      "the checkpoint with all its weights"]
    assert made_backends[0].swaps == 0
    rows = (out / "sweep.csv").read_text() if (out / "sweep.csv").exists() else ""
    assert "checkpoint-2" not in rows
    assert ("checkpoint-1" in rows) == first


def test_a_tied_head_may_be_missing_and_an_untied_one_may_not():
    from transformers import LlamaConfig, LlamaForCausalLM

    from cf_tasks.sweep.hf import _untied_missing

    for tied in (True, False):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied))
        names = set(model.state_dict()) - {"lm_head.weight"}
        assert _untied_missing(model, names) == ([] if tied else ["lm_head.weight"])
        base_names = {n.removeprefix("model.") for n in names}  # saved from the base model: transformers reads them
        assert _untied_missing(model, base_names | {"lm_head.weight"}) == []
        assert _untied_missing(model, names - {"model.norm.weight"}) == ([] if tied else ["lm_head.weight"]) + ["model.norm.weight"]


def test_a_gpu_number_the_machine_lacks_is_refused(no_model, monkeypatch, tmp_path, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    assert main(["sweep", str(run), "--backend", "hf", "--output_path", str(tmp_path / "out"), "--tasks",
                 "cf_capitals_mc", "--device", "cuda:1"]) == 2
    assert "--device cuda:1: this machine has 1 cuda device(s), numbered from 0; pass cuda:0" in _error_line(capsys)
