"""End to end through the `lm_eval` command line with a tiny random model built in the test, and
how the tasks are registered: nothing inside lm-eval's folder, each task indexed once."""

import importlib.metadata as md
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dataset_builders
from cf_tasks.registry import ENTRY_POINT_GROUP, ENTRY_POINT_NAME, indexes_our_tasks, task_manager, task_yamls_path
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


def test_the_install_puts_nothing_in_lm_evals_folder():
    import lm_eval

    files = md.distribution("cf-tasks").files or []
    assert not [str(f) for f in files if f.parts[0] in ("lm_eval", "lm-eval")]
    assert not (Path(lm_eval.__file__).parent / "tasks" / "cf_tasks").exists()
    assert callable(lm_eval.simple_evaluate)  # a folder named lm_eval elsewhere would shadow it


def _entry_point_task_dirs() -> list[Path]:
    """The folders lm-eval PR #4015 scans: each ``lm_eval.tasks`` entry point's value, its module
    part, resolved to the package's folder (or a plain module's parent folder)."""
    dirs = []
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        spec = importlib.util.find_spec(ep.value.split(":", 1)[0].strip())
        locations = list(spec.submodule_search_locations or [])
        dirs.append(Path(locations[0]).resolve() if locations else Path(spec.origin).resolve().parent)
    return dirs


def test_the_entry_point_resolves_to_the_task_folder_the_way_pr_4015_reads_it():
    (ep,) = [ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.name == ENTRY_POINT_NAME]
    assert ep.value == "task_yamls"
    assert task_yamls_path() in _entry_point_task_dirs()
    assert (task_yamls_path() / "cf_bio" / "cf_bio.yaml").is_file()


@pytest.fixture
def lm_eval_reads_entry_points(monkeypatch):
    """lm-eval as PR #4015 changes it: entry-point folders scanned after the built-ins, before
    include_path. Yields the path lists lm-eval indexed."""
    import lm_eval.tasks.manager as manager

    real_build, builtins, scanned = manager.TaskIndex.build, Path(manager.__file__).parent, []
    import cf_tasks_autoload  # the start-up hook must not pass for lm-eval's own discovery here

    monkeypatch.setenv(cf_tasks_autoload.OPT_OUT, "1")
    native = indexes_our_tasks(manager.TaskManager(include_defaults=False))  # an lm-eval with #4015
    monkeypatch.delenv(cf_tasks_autoload.OPT_OUT)
    monkeypatch.setitem(cf_tasks_autoload._state, "native", None)

    def build(paths, **kwargs):
        paths = list(paths)
        at = 1 if paths and paths[0] == builtins else 0
        scanned.append(paths if native else paths[:at] + _entry_point_task_dirs() + paths[at:])
        return real_build(scanned[-1], **kwargs)

    monkeypatch.setattr(manager.TaskIndex, "build", staticmethod(build))
    return scanned


def test_tasks_are_indexed_once_when_lm_eval_reads_the_entry_point(lm_eval_reads_entry_points, caplog):
    from lm_eval.tasks import TaskManager

    with caplog.at_level("WARNING"):
        TaskManager(include_path=str(task_yamls_path()), include_defaults=False)
    assert "overrides existing task" in caplog.text  # what passing our folder twice would do
    caplog.clear()
    with caplog.at_level("WARNING"):
        tm = task_manager()
    assert indexes_our_tasks(tm) and "cf_bio" in tm.all_tasks
    assert [Path(p).resolve() for p in lm_eval_reads_entry_points[-1]].count(task_yamls_path()) == 1
    assert "overrides existing task" not in caplog.text


def test_without_entry_point_discovery_our_task_manager_adds_the_include_path():
    tm = task_manager()  # lm-eval 0.4.13 reads no entry point
    assert indexes_our_tasks(tm) and "cf_quotes_mc" in tm.all_tasks
