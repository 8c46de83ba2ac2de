"""`cf-tasks eval`: the device follows the machine, the default model's batch size, and every bad
argument refused in one line (exit 2) before any model loads."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

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
    """``cf-tasks eval``'s call of ``run_lm_eval``, without running a model."""
    calls = []
    monkeypatch.setattr(evaluate, "run_lm_eval", lambda model, tasks, **kw: calls.append(kw))
    monkeypatch.setattr(default_model, "default_model_path", lambda: tmp_path / "SmolLM2")
    return calls


@pytest.mark.parametrize(("argv", "batch_size", "device"), [
    ([], default_model.DEFAULT_MODEL_BATCH_SIZE, "cpu"),  # the default model
    (["--batch_size", "2", "--device", "cpu"], "2", "cpu"),
    (["--model_args", "pretrained={model}"], 1, "cpu"),
    (["--model_args", "pretrained={model},device=cpu"], 1, None),  # lm-eval refuses a device given twice
])
def test_eval_batch_size_and_device_defaults(captured_run, cpu_only, tmp_path, argv, batch_size, device):
    argv = [a.replace("{model}", str(tmp_path)) for a in argv]
    assert main(["eval", "--tasks", "cf_capitals", *argv]) == 0
    (call,) = captured_run
    assert (call["batch_size"], call["device"]) == (batch_size, device)
    if not argv:  # the default model, converted once, in float32 and with its chat template
        assert call["model_args"] == f"pretrained={tmp_path / 'SmolLM2'},dtype=float32"
        assert call["apply_chat_template"] is True


def test_eval_passes_a_gpu_the_machine_has(captured_run, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(["eval", "--tasks", "cf_capitals", "--batch_size", "2", "--device", "cuda:1"]) == 0
    (call,) = captured_run
    assert (call["batch_size"], call["device"]) == ("2", "cuda:1")


# ---------------------------------------------------------------- bad arguments, before any model loads
@pytest.fixture
def no_model(monkeypatch):
    """``run_lm_eval`` and the default model's conversion, which a refused command must never reach."""
    import cf_tasks.cli  # noqa: F401

    run = mock.create_autospec(evaluate.run_lm_eval)
    convert = mock.create_autospec(default_model.default_model_path)
    monkeypatch.setattr(evaluate, "run_lm_eval", run)
    monkeypatch.setattr(default_model, "default_model_path", convert)
    yield run, convert
    run.assert_not_called()
    convert.assert_not_called()


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("cf-tasks: error: "), err
    return err


EVAL_ERRORS = [
    (["--metadata", "{seed: 7}"], "--metadata is not valid JSON"),
    (["--metadata", "[7]"], "--metadata must be a JSON object"),
    (["--metadata", '{"seed": "seven"}'], '--metadata seed "seven": pass a whole number'),
    (["--metadata", '{"seed": true}'], "--metadata seed true: pass a whole number"),
    (["--metadata", '{"seeed": 7}'], "--metadata seeed: no task of this run reads it; did you mean seed?"),
    (["--metadata", '{"version": 3}'], "--metadata version: set by each task itself"),
    (["--metadata", '{"hub_repo": 5}'], "--metadata hub_repo 5: pass text"),
    (["--limit", "0"], "--limit 0: must be a positive number"),
    (["--limit", "-3"], "--limit -3: must be a positive number"),
    (["--limit", "inf"], "--limit inf: must be a positive number"),
    (["--limit", "nan"], "--limit nan: must be a positive number"),
    (["--tasks", ""], "--tasks is empty"),
    (["--tasks", " , "], "--tasks is empty"),
    (["--tasks", "cf_capitalz"], "unknown task 'cf_capitalz' (did you mean cf_capitals"),
    (["--batch_size", "abc"], "--batch_size abc: pass a whole number of at least 1, auto or auto:N"),
    (["--batch_size", "0"], "--batch_size 0: pass a whole number"),
    (["--device", "banana"], "--device banana: not a device"),
    (["--device", "cuda"], "--device cuda: this machine has no cuda device"),
    (["--model_args", "pretrained={model},device=cuda:0"], "--model_args device=cuda:0: this machine has no cuda"),
    (["--model_args", "pretrained={model},flash=1"], "--model_args flash: not an argument of lm-eval's hf model"),
    (["--model_args", "pretrained={model},attn_implementaton=eager"], "(did you mean attn_implementation?)"),
    (["--model_args", "pretrained={model},dtype=fp8"], "--model_args dtype=fp8: pass auto"),
    (["--model_args", "pretrained={model},device=mps", "--device", "cpu"], "--device cpu and --model_args device=mps disagree"),
    (["--model_args", "pretrained=/no/such/model"], "pretrained=/no/such/model: no such model folder"),
    (["--model_args", "pretrained=no-such-org/no-such-model"], "neither a folder nor a model in the local Hugging Face cache"),
    (["--model", "banana", "--model_args", "pretrained=x"], "--model banana: not an lm-eval model type"),
    (["--model", "vllm", "--model_args", "pretrained={model}"], "--model vllm but vLLM is not installed"),
    (["--output_path", "{file}"], "is a file, not a folder"),
    (["--output_path", "{file}/sub"], "is a file, so the folder cannot be created"),
]


@pytest.mark.parametrize(("argv", "expected"), EVAL_ERRORS, ids=[" ".join(c[0]) for c in EVAL_ERRORS])
def test_eval_bad_arguments_are_one_line_before_any_model_loads(no_model, cpu_only, tmp_path, capsys, monkeypatch,
                                                               argv, expected):
    import cf_tasks.sweep.checks as checks

    monkeypatch.setattr(checks, "vllm_available", lambda: False)
    monkeypatch.setattr(evaluate, "needs_builtin_tasks", lambda tasks: False)  # lm-eval's own index: ~7 s or more
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    argv = [a.replace("{model}", str(tmp_path)).replace("{file}", str(a_file)) for a in argv]
    assert main(["eval", "--tasks", "cf_capitals", *argv]) == 2
    assert expected in _error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_eval_a_dataset_that_needs_the_hub_is_one_line_before_the_model_loads(no_model, tmp_path, capsys):
    code = main(["eval", "--model_args", f"pretrained={tmp_path}", "--tasks", "arc_easy", "--limit", "2"])
    err = capsys.readouterr().err.strip()
    if code == 0:
        pytest.skip("arc_easy is in the local dataset cache")
    assert code == 2 and err.count("\n") == 0, err
    assert err.startswith("cf-tasks: error: task arc_easy:") and "allenai/ai2_arc" in err and "offline" in err


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux) to drop root's capabilities")
def test_eval_a_read_only_output_folder_is_refused_without_root_capabilities(tmp_path):
    # Tests run as root, which writes anywhere: the command runs with every capability dropped.
    read_only = tmp_path / "results"
    read_only.mkdir(mode=0o555)
    done = subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-m", "cf_tasks.cli", "eval",
         "--model_args", f"pretrained={tmp_path}", "--tasks", "cf_capitals", "--output_path", str(read_only / "run1")],
        capture_output=True, text=True, timeout=300,
    )
    if "setpriv:" in done.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {done.stderr.strip()}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"cf-tasks: error: --output_path {read_only / 'run1'}: {read_only} is not writable; "
                                   "pass a writable folder")
    assert not (read_only / "run1").exists()


def test_eval_results_that_cannot_be_saved_still_print_the_table(monkeypatch, tmp_path, capsys):
    """The folder was writable when checked; a later failure keeps the table on screen."""
    import cf_tasks.results as results

    fake = {"results": {"cf_capitals": {"alias": "cf_capitals", "counterfactual_acc,none": 0.5}},
            "versions": {"cf_capitals": 1.0}, "n-shot": {"cf_capitals": 0}, "higher_is_better": {}, "configs": {}}
    monkeypatch.setattr(evaluate, "run_lm_eval", mock.create_autospec(evaluate.run_lm_eval, return_value=fake))
    monkeypatch.setattr(results, "land_results", mock.create_autospec(results.land_results,
                                                                      side_effect=OSError(28, "No space left on device")))
    out = tmp_path / "out"
    assert main(["eval", "--model_args", f"pretrained={tmp_path}", "--tasks", "cf_capitals", "--output_path",
                 str(out)]) == 1  # not a bad argument: exit 1, as sweep and report
    captured = capsys.readouterr()
    assert "counterfactual_acc" in captured.out and "0.5" in captured.out
    assert captured.err.strip() == (f"cf-tasks: error: --output_path {out}: cannot write the results (No space left "
                                    "on device); the table above is all that was kept: free space or fix permissions "
                                    "and run again")
