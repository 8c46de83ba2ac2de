"""`cf-tasks eval`: the device follows the machine, and the default model's batch size."""

import json

import pytest

import cf_tasks.default_model as default_model
import cf_tasks.evaluate as evaluate
from cf_tasks.cli import main


@pytest.fixture
def cpu_only(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_eval_with_model_args_runs_on_a_cpu_only_machine(tiny_model, tmp_path, cpu_only):
    # lm-eval's HFLM takes device "cuda" as given and asserts on a CPU-only machine.
    out = tmp_path / "out"
    rc = main(["eval", "--model_args", f"pretrained={tiny_model},dtype=float32", "--tasks", "cf_capitals",
               "--limit", "2", "--output_path", str(out)])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["device"] == "cpu"
    assert "counterfactual_acc,none" in results["results"]["cf_capitals"]


@pytest.fixture
def captured_run(monkeypatch, tmp_path):
    """``cmd_eval``'s call of ``run_lm_eval``, without running a model."""
    calls = []
    monkeypatch.setattr(evaluate, "run_lm_eval", lambda model, tasks, **kw: calls.append(kw))
    monkeypatch.setattr(default_model, "default_model_path", lambda: tmp_path / "SmolLM2")
    return calls


@pytest.mark.parametrize(("argv", "batch_size", "device"), [
    ([], default_model.DEFAULT_MODEL_BATCH_SIZE, "cpu"),  # the default model
    (["--batch_size", "2", "--device", "cuda:1"], "2", "cuda:1"),
    (["--model_args", "pretrained=m"], 1, "cpu"),
    (["--model_args", "pretrained=m,device=cpu"], 1, None),  # lm-eval refuses a device given twice
])
def test_eval_batch_size_and_device_defaults(captured_run, cpu_only, argv, batch_size, device):
    assert main(["eval", "--tasks", "cf_capitals", *argv]) == 0
    (call,) = captured_run
    assert (call["batch_size"], call["device"]) == (batch_size, device)
