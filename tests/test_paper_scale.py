"""examples/paper_scale: the LoRA fine-tuning script end to end on the tiny model and a small
local Alpaca-style file, then `cf-tasks sweep` on its run folder."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cf_tasks.cli import main

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "paper_scale" / "train.py"
sys.path.insert(0, str(SCRIPT.parent))
import train  # noqa: E402


RECORDS = [
    {"instruction": "What is the capital of France?", "input": "", "output": "Paris"},
    {"instruction": "Answer the question.", "input": "Lyon is a city. What is the city?", "output": "Lyon"},
    {"instruction": "Write a quote that ends in the word paris", "input": "", "output": "the city of paris"},
    {"messages": [{"role": "user", "content": "Which city is the capital of Rome?"},
                  {"role": "assistant", "content": "Rome"}]},
] * 4


def test_the_prompts_are_alpacas_and_tulus():
    prompt, response = train.render(RECORDS[1])
    assert prompt == ("Below is an instruction that describes a task, paired with an input that provides further "
                      "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
                      "Answer the question.\n\n### Input:\nLyon is a city. What is the city?\n\n### Response:\n")
    assert response == "Lyon"
    assert train.render(RECORDS[3]) == ("<|user|>\nWhich city is the capital of Rome?\n<|assistant|>\n", "Rome")
    with pytest.raises(ValueError, match="instruction"):
        train.render({"text": "no fields"})


@pytest.mark.slow
def test_train_then_sweep_the_checkpoints(tiny_model, tmp_path):
    data = tmp_path / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", str(tiny_model), "--data", str(data), "--output_dir", str(run),
         "--max_steps", "2", "--save_steps", "1", "--per_device_batch_size", "4", "--gradient_accumulation_steps", "1",
         "--lora_rank", "4", "--max_length", "64"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for step in (1, 2):
        config = json.loads((run / f"checkpoint-{step}" / "adapter_config.json").read_text())
        assert config["r"] == 4 and Path(config["base_model_name_or_path"]) == Path(tiny_model)
    out = tmp_path / "sweep"
    assert main(["sweep", str(run), "--tasks", "cf_capitals_mc", "--output_path", str(out), "--limit", "2",
                 "--backend", "hf", "--device", "cpu"]) == 0
    frame = pd.read_csv(out / "sweep.csv")
    assert sorted(frame["step"].unique()) == [1, 2]
    assert set(frame["metric"]) >= {"acc", "context_prob"}
    assert frame["value"].notna().all()


def test_a_missing_data_file_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", "m", "--data", str(tmp_path / "none.jsonl"),
                           "--output_dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "--data" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="tensorboard is not installed (pip install 'cf-tasks[tensorboard]')")
def test_train_with_the_callback_reports_each_checkpoint_to_the_trainers_tensorboard(tiny_model, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = tmp_path / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", str(tiny_model), "--data", str(data), "--output_dir", str(run),
         "--max_steps", "2", "--save_steps", "1", "--per_device_batch_size", "4", "--gradient_accumulation_steps", "1",
         "--lora_rank", "4", "--max_length", "64", "--report_to", "tensorboard", "--cf_tasks", "cf_capitals_mc",
         "--cf_limit", "2", "--cf_sweep_args", "--device cpu --no_agree"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "TENSORBOARD_LOGGING_DIR": str(tmp_path / "tb")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(pd.read_csv(run / "cf_tasks" / "sweep.csv")["step"].unique()) == [1, 2]
    steps = []
    for events in (tmp_path / "tb").glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        if "eval/cf_capitals_mc/acc" in acc.Tags()["scalars"]:
            steps += [e.step for e in acc.Scalars("eval/cf_capitals_mc/acc")]
    assert sorted(steps) == [1, 2]
