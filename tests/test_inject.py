"""`cf-tasks experiment inversion` (the injection design) on the tiny model: the study end to end, its
measurements against a direct recomputation, the gate, resuming after a kill, a rerun with other
settings, bad arguments, and a report that regenerates to the same bytes."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from cf_tasks.cli import main
from cf_tasks.experiments import inject, inject_facts, inject_report, lm, study_folder

QUICK = ["experiment", "inversion", "--quick"]


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def study(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("inject")
    assert main([*QUICK, "--model", str(tiny_model), "--output_path", str(out)]) == 0
    return out


@pytest.mark.slow
def test_study_writes_every_part(study):
    assert json.loads((study / "config.json").read_text())["design"] == "inject"
    gate = json.loads((study / "phase_a" / "gate.json").read_text())
    assert set(gate["checks"]) == {"recall_T", "recall_E", "mc_E", "n_unchanged", "cs_condition"}
    groups = inject_facts.load_groups(study)
    assert {len(groups["T"]), len(groups["N"])} == {6, 3}
    assert not {p["fact_id"] for p in groups["T"]} & {p["fact_id"] for p in groups["E"] + groups["N"]}
    base = {r["fact_id"]: r for r in study_folder.read_jsonl(study / "data" / "base_known.jsonl")}
    assert all(not base[p["fact_id"]]["known"] for g in groups.values() for p in g)  # unknown facts only
    for run in ("cs_heavy-seed0", "c_only-seed0"):
        rows = _csv(study / "runs" / run / "measure.csv")
        assert sorted({int(r["step"]) for r in rows}) == [0, 2, 4]
        assert sorted((r["step"], r["group"], r["fact_id"]) for r in rows) == sorted(
            (str(s), g, p["fact_id"]) for s in (0, 2, 4) for g in ("E", "N") for p in groups[g])
        assert all(r["mc"] and r["known"] in ("0", "1") for r in rows)
        assert sorted(p.name for p in (study / "runs" / run).glob("checkpoint-*")) == ["checkpoint-0", "checkpoint-4"]
        assert not (study / "runs" / run / "state").exists()
    mix = study_folder.read_jsonl(study / "data" / "mix_cs_heavy.jsonl")
    kinds = {k: sum(p["kind"] == k for p in mix) for k in ("C", "CS", "S")}
    assert kinds == {"C": 2, "CS": 6, "S": 2}  # C+S : C = 3 : 1, plus S points of T


@pytest.mark.slow
def test_measured_mc_equals_a_direct_recomputation(study):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = study / "runs" / "cs_heavy-seed0" / "checkpoint-4"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    groups = inject_facts.load_groups(study)
    rows = {r["fact_id"]: r for r in _csv(study / "runs" / "cs_heavy-seed0" / "measure.csv") if r["step"] == "4"}
    for p in groups["E"][:3] + groups["N"][:1]:
        prompt = lm.generation_prompt(tok, {"input": p["cf_input"], "instruction": p["instruction"]})
        logp = {}
        for name, answer in (("context", p["cf_answer"]), ("memory", p["output"])):
            head = tok(prompt, add_special_tokens=False)["input_ids"]
            tail = tok(" " + answer, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([head + tail])).logits[0]
            lp = torch.log_softmax(logits.float(), dim=-1)
            logp[name] = sum(float(lp[len(head) - 1 + i, t]) for i, t in enumerate(tail))
        expected = 1 / (1 + math.exp(logp["memory"] - logp["context"]))
        assert float(rows[p["fact_id"]]["mc"]) == pytest.approx(expected, abs=2e-6)
        assert float(rows[p["fact_id"]]["logp_context"]) == pytest.approx(logp["context"], abs=2e-4)


def _killed_at_step_3(study, tiny_model, out, monkeypatch):
    """A copy of the study's data and phase A in ``out``, and cs_heavy killed after its checkpoint at
    step 2, before step 3's update; returns the study's config."""
    shutil.copytree(study / "data", out / "data")
    shutil.copytree(study / "phase_a", out / "phase_a")
    cfg = inject.InjectConfig(output_path=out, model=str(tiny_model))
    for key, value in inject.QUICK.items():
        setattr(cfg, key, value)
    real_step, calls = inject._step, []

    def dying_step(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step(*args)

    monkeypatch.setattr(inject, "_step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        inject.train_arm(cfg, "cs_heavy", 0, out / "phase_a" / "model", log=lambda *a: None)
    monkeypatch.setattr(inject, "_step", real_step)
    return cfg


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_checkpoint_with_the_same_rows(study, tiny_model, tmp_path, monkeypatch):
    out = tmp_path / "again"
    cfg = _killed_at_step_3(study, tiny_model, out, monkeypatch)
    state = json.loads((out / "runs" / "cs_heavy-seed0" / "state" / "state.json").read_text())
    assert state["step"] == 2 and not (out / "runs" / "cs_heavy-seed0" / "run.json").exists()
    inject.train_arm(cfg, "cs_heavy", 0, out / "phase_a" / "model", log=lambda *a: None)
    for name in ("measure.csv", "loss.csv"):
        assert (_csv(out / "runs" / "cs_heavy-seed0" / name)
                == _csv(study / "runs" / "cs_heavy-seed0" / name)), name


@pytest.mark.slow
def test_a_failed_gate_stops_before_phase_b_and_names_the_check(tiny_model, tmp_path, capsys):
    out = tmp_path / "gated"
    rc = main([*QUICK, "--model", str(tiny_model), "--output_path", str(out), "--gate_recall", "0.95"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert err[-1].startswith("cf-tasks: error: the phase-A gate failed: recall_T (>= 0.95); recall_E (>= 0.95)")
    assert "gate.json" in err[-1]
    assert not json.loads((out / "phase_a" / "gate.json").read_text())["met"]
    assert not (out / "runs").exists()
    report = tmp_path / "report"
    assert main([*QUICK, "--output_path", str(out), "--report_only", "--report_path", str(report)]) == 0
    text = (report / "results.md").read_text()
    assert "Gate met: NO." in text and "| recall_T | >= 0.95 | NO |" in text
    assert text.rstrip().endswith("Phase B did not run: the gate failed (the checks marked NO above), "
                                  "and a failed gate stops the study.")


@pytest.mark.slow
def test_a_rerun_with_other_settings_is_refused(study, tiny_model, capsys):
    before = (study / "config.json").read_bytes()
    rc = main([*QUICK, "--model", str(tiny_model), "--output_path", str(study), "--lr", "3e-5"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "lr=1e-05" in err and "3e-05" in err and "another --output_path" in err
    assert (study / "config.json").read_bytes() == before


@pytest.mark.slow
def test_a_rerun_with_the_same_settings_reuses_everything(study, tiny_model):
    stamps = {p: p.stat().st_mtime_ns for p in (study / "runs").rglob("*.csv")}
    assert main([*QUICK, "--model", str(tiny_model), "--output_path", str(study)]) == 0
    assert {p: p.stat().st_mtime_ns for p in (study / "runs").rglob("*.csv")} == stamps


@pytest.mark.parametrize("argv, message", [
    (["--arms", "cs_heavy,bogus"], "--arms cs_heavy,bogus: unknown arm bogus"),
    (["--steps", "8", "--save_every", "16"], "--steps 8 is below the checkpoint interval --save_every 16"),
    (["--gate_recall", "1.5"], "--gate_recall 1.5: a gate threshold is a number between 0 and 1"),
    (["--gate_mc", "-0.1"], "--gate_mc -0.1: a gate threshold"),
    (["--gate_n_shift", "nan"], "--gate_n_shift nan: a gate threshold"),
    (["--lr", "inf"], "--lr inf: a learning rate is a finite number"),
    (["--inject_lr", "0"], "--inject_lr 0.0: a learning rate"),
    (["--sweep_every", "20"], "--sweep_every 20: must be a multiple of --save_every 16"),
    (["--t_epochs", "7"], "--t_epochs 7: must be between 1 and the phase-A epochs (6)"),
    (["--t_epochs", "0"], "--t_epochs 0: must be between 1 and the phase-A epochs (6)"),
    (["--seeds", "٠"], "--seeds ٠: pass comma-separated non-negative integers"),
    (["--output_path", ""], "--output_path is empty"),
])
def test_bad_arguments_are_one_line_and_exit_2_before_any_work(tmp_path, capsys, argv, message):
    out = tmp_path / "o"
    assert main(["experiment", "inversion", "--output_path", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_report_renders_to_the_same_bytes_from_its_own_files(study, tmp_path):
    report = study / "report"
    fresh = tmp_path / "fresh"
    assert main(["experiment", "inversion", "--output_path", str(report), "--report_only",
                 "--report_path", str(fresh)]) == 0
    for name in ("results.md", "mc_curves.csv", "tests.csv", "peak.json", *inject_report.RAW):
        assert (fresh / name).read_bytes() == (report / name).read_bytes(), name


def test_peak_rule_and_fixed_peak_tests_by_hand():
    rows = []
    # the control rises 0.2 -> 0.6 -> 0.66 -> 0.7: 90% of its largest rise (0.5) is first reached at step 16
    for step, values in ((0, (0.2, 0.2)), (8, (0.6, 0.6)), (16, (0.66, 0.66)), (24, (0.7, 0.7))):
        for i, v in enumerate(values):
            rows.append({"run": "c_only-seed0", "step": str(step), "group": "E", "fact_id": f"f{i}", "mc": str(v),
                         "known": "1"})
    curve = inject_report.curves(rows)
    peak = inject_report.declare_peak(curve)
    assert peak["peak_step"] == 16 and peak["from"] == "c_only-seed0"  # 0.46 >= 0.9 * 0.5; 0.4 is not
    heavy = []
    for i, series in enumerate(((0.2, 0.8, 0.9, 0.3), (0.1, 0.5, 0.6, 0.4), (0.3, 0.6, 0.7, 0.2))):
        for step, v in zip((0, 8, 16, 24), series):
            heavy.append({"run": "cs_heavy-seed0", "step": str(step), "group": "E", "fact_id": f"f{i}",
                          "mc": str(v), "known": "1"})
    found = inject_report.fixed_peak_tests(heavy, 16)
    assert {(t["measure"], t["design"]) for t in found} == {
        (m, d) for m in ("M_C", "context preferred") for d in ("declared peak", "whole series")}
    tests = {t["measure"]: t for t in found if t["design"] == "declared peak"}
    graded = tests["M_C"]
    assert graded["n"] == 3 and graded["peak_step"] == 16
    assert graded["rise"] == pytest.approx((0.7 + 0.5 + 0.4) / 3, abs=1e-3)
    assert graded["fall"] == pytest.approx((0.6 + 0.2 + 0.5) / 3, abs=1e-3)
    assert graded["first"] == pytest.approx(0.2) and graded["final"] == pytest.approx(0.3)
    binary = tests["context preferred"]
    assert binary["first"] == 0 and binary["peak"] == 1 and binary["final"] == 0


@pytest.mark.slow
def test_a_study_folder_keeps_its_design(study, tiny_model, capsys):
    before = (study / "config.json").read_bytes()
    rc = main(["experiment", "inversion", "--design", "known_lora", "--quick", "--model", str(tiny_model),
               "--output_path", str(study)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "holds a study of another design (inject)" in err and len(err.splitlines()) == 1
    assert (study / "config.json").read_bytes() == before


@pytest.mark.slow
def test_finish_closes_a_stopped_run_at_its_last_checkpoint(study, tiny_model, tmp_path, monkeypatch):
    out = tmp_path / "closed"
    cfg = _killed_at_step_3(study, tiny_model, out, monkeypatch)
    assert inject.finish_early(cfg, "c_only", 0) is None  # never started: nothing to close
    run_dir = inject.finish_early(cfg, "cs_heavy", 0, log=lambda *a: None)
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["steps"], info["planned_steps"]) == (2, 4)
    assert (run_dir / "checkpoint-2" / "model.safetensors").is_file() and not (run_dir / "state").exists()
    full = [r for r in _csv(study / "runs" / "cs_heavy-seed0" / "measure.csv") if int(r["step"]) <= 2]
    assert _csv(run_dir / "measure.csv") == full


@pytest.mark.parametrize("folder", ["inversion", "inversion_weak_t"])
def test_committed_study_renders_to_its_own_bytes(tmp_path, folder):
    from conftest import ROOT

    committed = ROOT / "docs" / "reproduction" / folder
    inject_report.render(committed, tmp_path)
    for name in ("results.md", "mc_curves.csv", "tests.csv", "peak.json"):
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), name


def test_the_reproduction_guide_types_no_figure_of_the_study():
    import re

    from conftest import ROOT

    text = (ROOT / "docs" / "reproduction.md").read_text()
    start = text.index("## A positive control on a real transformer")
    section = text[start:text.index("\n## ", start + 10)]
    prose = re.sub(r"```.*?```|<!--.*?-->", "", section, flags=re.S)
    assert not re.findall(r"\d\.\d|\d+ of \d+|\bp\s*[=<]", prose), "figures belong in the generated results.md"


@pytest.mark.slow
def test_t_epochs_teaches_t_only_in_the_last_epochs_of_phase_a(study, tiny_model, tmp_path, monkeypatch):
    out = tmp_path / "weak_t"
    shutil.copytree(study / "data", out / "data")
    cfg = inject.InjectConfig(output_path=out, model=str(tiny_model))
    for key, value in inject.QUICK.items():
        setattr(cfg, key, value)
    cfg.inject_min_epochs = cfg.inject_max_epochs = 3
    cfg.t_epochs = 1
    t_ids = {p["fact_id"] for p in inject_facts.load_groups(out)["T"]}
    seen, real_step = [], inject._step

    def recording_step(model, tokenizer, optimizer, batch):
        seen.append({p["fact_id"] for p in batch})
        return real_step(model, tokenizer, optimizer, batch)

    monkeypatch.setattr(inject, "_step", recording_step)
    inject.inject(cfg, tiny_model, log=lambda *a: None)
    epochs = _csv(out / "phase_a" / "epochs.csv")
    ends = [int(r["steps"]) for r in epochs]
    assert len(epochs) == 3 and ends[-1] == len(seen) == json.loads((out / "phase_a" / "inject.json").read_text())["steps"]
    early, last = set().union(*seen[:ends[1]]), set().union(*seen[ends[1]:])
    assert not early & t_ids and t_ids <= last  # T only in the last epoch, every T fact in it
    assert ends[2] - ends[1] > ends[1] - ends[0]  # the last epoch is longer by T's batches
    assert "t_epochs" not in inject.InjectConfig(output_path=out).settings()  # older folders keep their record
