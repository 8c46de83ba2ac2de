"""``CFTasksCallback``: a tiny ``Trainer`` saves 3 checkpoints; each is scored (in a separate process,
or in the trainer's process) and reported to the trainer's TensorBoard at its step, once."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from cf_tasks.integrations import CFTasksCallback

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                reason="tensorboard is not installed (pip install 'cf-tasks[tensorboard]')")
TASK = "cf_capitals_mc"
TAG = f"eval/{TASK}/acc"


def tensorboard_steps(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = []
    for events in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            found += [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]
    return sorted(found)


def _train(tiny_model: Path, out: Path, monkeypatch, **options) -> CFTasksCallback:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    torch.set_num_threads(1)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(out / "tb"))  # transformers' TensorBoard integration's folder
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok("the capital of paris is lyon", return_tensors=None)["input_ids"]
    data = [{"input_ids": ids, "labels": ids} for _ in range(8)]
    args = TrainingArguments(output_dir=str(out), max_steps=3, save_steps=1, per_device_train_batch_size=2,
                             learning_rate=1e-2, logging_steps=1, report_to=["tensorboard"], use_cpu=True, save_only_model=True, disable_tqdm=True)
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(tiny_model), args=args, train_dataset=data,
                      processing_class=tok)  # the tokenizer is saved with each checkpoint
    callback = CFTasksCallback.attach(trainer, tasks=TASK, limit=2, **options)
    trainer.train()
    return callback


@pytest.mark.slow
@pytest.mark.parametrize("in_process", [False, True], ids=["separate process", "in process"])
def test_three_saves_give_three_points_per_metric_at_their_steps(tiny_model, tmp_path, monkeypatch, in_process):
    out = tmp_path / "run"
    options = {"in_process": True} if in_process else {"sweep_args": ["--no_agree", "--batch_size", "1"]}
    callback = _train(tiny_model, out, monkeypatch, **options)
    assert callback.proc is None  # the separate process was waited for at the end
    rows = [r for r in csv.DictReader((out / "cf_tasks" / "sweep.csv").open()) if r["metric"] == "acc"
            and r["task"] == TASK]
    expected = sorted((int(r["step"]), round(float(r["value"]), 6)) for r in rows)
    assert [s for s, _ in expected] == [1, 2, 3]
    assert tensorboard_steps(out / "tb", TAG) == expected  # three points, each once, at its step
    assert tensorboard_steps(out / "tb", "train/loss")  # beside the trainer's own curves
