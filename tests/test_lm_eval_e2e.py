"""End to end through the `lm_eval` command line with a tiny random model built in the test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dataset_builders

from cf_tasks.registry import installed_in_lm_eval, task_yamls_path
from cf_tasks.tasks import GENERATION_METRICS, score_doc

LM_EVAL = str(Path(sys.executable).with_name("lm_eval"))


def _run(args, timeout=600):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([LM_EVAL, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_lm_eval_cli_runs_generation_and_mc_tasks(tiny_model, tmp_path):
    out = tmp_path / "out"
    _run([
        "--model", "hf", "--model_args", f"pretrained={tiny_model},dtype=float32",
        "--tasks", "cf_bio,cf_capitals_mc", "--include_path", str(task_yamls_path()),
        "--limit", "6", "--output_path", str(out), "--log_samples",
    ])
    results_file = next(out.rglob("results_*.json"))
    report = json.loads(results_file.read_text())
    results = report["results"]
    # lm-eval's `versions` name the dataset builder's version (the two move together).
    assert float(report["versions"]["cf_bio"]) == float(dataset_builders.version("cf_bio"))
    assert float(report["versions"]["cf_capitals_mc"]) == float(dataset_builders.version("cf_capitals"))
    for metric in GENERATION_METRICS[:4]:
        assert 0.0 <= results["cf_bio"][f"{metric},none"] <= 1.0
    assert 0.0 <= results["cf_capitals_mc"]["context_prob,none"] <= 1.0
    # The reported rates are the mean of the per-item scores of the logged generations.
    samples = [json.loads(line) for line in next(out.rglob("samples_cf_bio_*.jsonl")).open()]
    assert len(samples) == 6
    outcomes = [score_doc(s["doc"], s["filtered_resps"][0]) for s in samples]
    assert results["cf_bio"]["counterfactual_acc,none"] == pytest.approx(sum(o.counterfactual for o in outcomes) / 6)
    assert results["cf_bio"]["parametric_acc,none"] == pytest.approx(sum(o.parametric for o in outcomes) / 6)
    assert samples[0]["arguments"]["gen_args_0"]["arg_0"].startswith("Background: ")


@pytest.mark.skipif(
    not installed_in_lm_eval() and os.environ.get("CF_TASKS_EXPECT_WHEEL") != "1",
    reason="cf-tasks is not installed from a wheel here (editable install)",
)
def test_plain_lm_eval_lists_the_tasks_without_include_path():
    proc = _run(["ls", "tasks"], timeout=300)
    for name in ("cf_bio", "cf_world_facts_alpaca", "cf_quotes_mc", "cf_suite"):
        assert name in proc.stdout
