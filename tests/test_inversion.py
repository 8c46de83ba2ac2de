"""`cf-tasks experiment inversion --design known_lora --quick` on the tiny model: the LoRA design's whole
study (data, LoRA training, sweep, report) end to end, and its parts checked against direct recomputation."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cf_tasks.cli import main
from cf_tasks.experiments import known_lora, lm, study_folder


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def study(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    rc = main(["experiment", "inversion", "--design", "known_lora", "--quick", "--model", str(tiny_model), "--output_path", str(out)])
    assert rc == 0
    return out


def test_quick_study_saves_checkpoints_at_the_right_steps(study):
    run = study / "runs" / "cs_heavy-seed0"
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["checkpoint-2", "checkpoint-4"]
    for step in (2, 4):
        config = json.loads((run / f"checkpoint-{step}" / "adapter_config.json").read_text())
        assert sorted(config["target_modules"]) == sorted(known_lora.ALL_LINEAR)
    assert not list((study / "runs").glob(".*"))  # no temp folder left


def test_loss_rows_equal_a_direct_recomputation(study, tiny_model):
    from peft import PeftModel

    rows = _csv(study / "runs" / "cs_heavy-seed0" / "loss.csv")
    probe = study_folder.read_jsonl(study / "data" / "loss_probe.jsonl")
    assert {p["kind"] for p in probe} == {"C", "CS", "S"}
    probe_rows = {(int(r["step"]), r["kind"]): float(r["loss"]) for r in rows if r["split"] == "probe"}
    assert sorted({s for s, _ in probe_rows}) == [0, 2, 4]
    # Step 0 is the base model; checkpoint-2 is the saved adapter on it.
    model, tokenizer = lm.load_model(tiny_model)
    for kind, (loss, n) in lm.mean_loss_by_kind(model, tokenizer, probe).items():
        assert probe_rows[(0, kind)] == pytest.approx(loss, abs=1e-4)
    adapted = PeftModel.from_pretrained(model, study / "runs" / "cs_heavy-seed0" / "checkpoint-2")
    adapted.eval()
    for kind, (loss, n) in lm.mean_loss_by_kind(adapted, tokenizer, probe).items():
        assert probe_rows[(2, kind)] == pytest.approx(loss, abs=1e-4)
    # Training moves the probe points' loss (the learning rate is high enough for something to happen).
    assert probe_rows[(4, "C")] != pytest.approx(probe_rows[(0, "C")], abs=1e-3)
    # The first batch's per-kind losses are those of the base model (LoRA starts at zero).
    points = study_folder.read_jsonl(study / "data" / "main.jsonl")
    first = lm.batches(points, 4, 4, seed=0)[0]
    base, _ = lm.load_model(tiny_model)
    expected = lm.mean_loss_by_kind(base, tokenizer, first)
    train1 = {r["kind"]: (float(r["loss"]), int(r["n"])) for r in rows if r["split"] == "train" and r["step"] == "1"}
    assert set(train1) == set(expected)
    for kind, (loss, n) in expected.items():
        assert train1[kind][0] == pytest.approx(loss, abs=1e-4) and train1[kind][1] == n
    assert sorted({int(r["step"]) for r in rows if r["split"] == "train"}) == [1, 2, 3, 4]


def test_sweep_rows_for_every_checkpoint_and_task_on_held_out_items(study):
    from dataset_builders.split import split_of

    rows = _csv(study / "sweeps" / "sweep.csv")
    have = {(int(r["step"]), r["task"], r["metric"]) for r in rows}
    for step in (0, 2, 4):
        for task, metric in (("cf_capitals", "counterfactual_acc"), ("cf_capitals", "known_rate"),
                             ("cf_capitals", "context_attention"), ("cf_capitals_agree", "agree_acc")):
            assert (step, task, metric) in have
    assert {json.loads(r["metadata"])["split"] for r in rows} == {"heldout"}
    samples = list((study / "sweeps" / "store").glob("*/cf_capitals/*/samples_cf_capitals.jsonl"))
    assert samples
    subjects = {json.loads(line)["doc"]["subject"] for s in samples for line in s.read_text().splitlines()}
    assert subjects and all(split_of("cf_capitals", s) == "heldout" for s in subjects)
    trained = {p["subject"] for p in study_folder.read_jsonl(study / "data" / "main.jsonl")}
    assert not subjects & trained


def test_report_files_and_rerun_reuses_everything(study, tiny_model):
    report = study / "report"
    for name in ("curves.csv", "summary.csv", "loss.csv", "data.csv", "timing.csv", "results.md",
                 "curves_cf_capitals.png", "loss.png"):
        assert (report / name).is_file(), name
    curves = _csv(report / "curves.csv")
    assert {(c["run"], int(c["step"])) for c in curves if c["metric"] == "counterfactual_acc"} == \
        {("cs_heavy-seed0", s) for s in (0, 2, 4)}
    summary = _csv(report / "summary.csv")
    assert [(s["run"], s["task"]) for s in summary] == [("cs_heavy-seed0", "cf_capitals")]
    assert "verdict" in summary[0] and summary[0]["verdict"]
    run_json = study / "runs" / "cs_heavy-seed0" / "run.json"
    before = (run_json.stat().st_mtime_ns, sorted(p.name for p in (study / "sweeps" / "store").iterdir()))
    assert main(["experiment", "inversion", "--design", "known_lora", "--quick", "--model", str(tiny_model),
                 "--output_path", str(study)]) == 0
    assert (run_json.stat().st_mtime_ns, sorted(p.name for p in (study / "sweeps" / "store").iterdir())) == before
    (report / "results.md").unlink()
    assert main(["experiment", "inversion", "--output_path", str(study), "--report_only"]) == 0
    assert "cs_heavy-seed0" in (report / "results.md").read_text()


def test_knowledge_decision_uses_the_scorer():
    points = [
        {"fact_id": "f1", "kind": "S", "instruction": "What is the capital of France?", "output": "Paris", "relation": "capital"},
        {"fact_id": "f2", "kind": "S", "instruction": "What is the capital of Peru?", "output": "Lima", "relation": "capital"},
        {"fact_id": "f3", "kind": "S", "instruction": "What is the capital of Chile?", "output": "Santiago", "relation": "capital"},
        {"fact_id": "f1", "kind": "S", "instruction": "What is the capital of France?", "output": "Paris", "relation": "capital"},
    ]
    canned = {"f1": "The capital of France is Paris.", "f2": "It is not Lima, it is Cusco.", "f3": "I do not know."}
    asked = []

    def generate(ps):
        asked.extend(p["fact_id"] for p in ps)
        return [canned[p["fact_id"]] for p in ps]

    known = known_lora.decide_known(points, generate)
    assert asked == ["f1", "f2", "f3"]  # one question per fact
    assert {f: v["known"] for f, v in known.items()} == {"f1": True, "f2": False, "f3": False}


def test_runs_order_puts_the_main_arm_first_and_its_second_seed_last(tmp_path):
    cfg = known_lora.StudyConfig(output_path=tmp_path, arms=("c_only", "cs_heavy", "qk_only"), seeds=(0, 1))
    assert known_lora.runs(cfg) == [("cs_heavy", 0), ("c_only", 0), ("qk_only", 0), ("cs_heavy", 1)]


@pytest.mark.parametrize("argv, message", [
    (["--arms", "cs_heavy,bogus"], "unknown arm bogus"),
    (["--seeds", "0,x"], "--seeds 0,x"),
    (["--steps", "0"], "--steps 0"),
    (["--tasks", "cf_capitals,cf_quotes"], "unknown task cf_quotes"),
    (["--lr", "inf"], "--lr inf"),
    (["--t_facts", "10"], "--t_facts applies to --design inject only"),
    (["--model", "/nonexistent/model"], "not a transformers model folder"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    assert main(["experiment", "inversion", "--design", "known_lora", "--output_path", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_report_only_on_a_folder_without_a_study(tmp_path, capsys):
    assert main(["experiment", "inversion", "--design", "known_lora", "--output_path", str(tmp_path), "--report_only"]) == 2
    assert "holds no study" in capsys.readouterr().err


def test_readme_commands_parse():
    import re
    import shlex

    from conftest import ROOT

    from cf_tasks.cli import build_parser

    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    lines = [line.split("#")[0] for line in text.splitlines() if line.startswith("cf-tasks experiment inversion")]
    assert len(lines) >= 3
    for line in lines:
        args = build_parser().parse_args(shlex.split(line)[1:])
        assert args.func.__module__ == "cf_tasks.experiments.command" and args.output_path


def test_a_rerun_with_other_settings_is_refused(study, tiny_model, capsys):
    before = (study / "config.json").read_bytes()
    for flag, value in (("--lr", "1e-4"), ("--steps", "6"), ("--limit", "2")):
        rc = main(["experiment", "inversion", "--design", "known_lora", "--quick", "--model", str(tiny_model),
                   "--output_path", str(study), flag, value])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "another --output_path" in err, (flag, err)
        assert f"{flag[2:]}=" in err
    assert (study / "config.json").read_bytes() == before


def test_a_moved_study_resumed_counts_each_result_once(study, tiny_model, tmp_path):
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(study, moved)
    before = _csv(study / "report" / "curves.csv")
    assert main(["experiment", "inversion", "--design", "known_lora", "--quick", "--model", str(tiny_model),
                 "--output_path", str(moved)]) == 0
    after = _csv(moved / "report" / "curves.csv")
    key = ("run", "step", "task", "metric")
    assert sorted(tuple(r[k] for k in key) for r in after) == sorted(tuple(r[k] for k in key) for r in before)


@pytest.mark.parametrize("name, point", [
    ("_prompts/qa_default_yaml", {"input": "Paris is the capital of Italy.", "instruction": "What is the capital of Italy?"}),
    ("_prompts/qa_closedbook_yaml", {"input": "", "instruction": "What is the capital of Italy?"}),
])
def test_the_study_prompts_are_the_tasks_own(name, point):
    import jinja2

    jinja = lm.task_yaml(name)["doc_to_text"]
    expected = jinja2.Template(jinja).render(context=point["input"], question=point["instruction"])
    assert lm.prompt_text(point) == expected
