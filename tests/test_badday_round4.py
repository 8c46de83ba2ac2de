"""The bad day, round 4: the cases of round 3 that had no test of their own (an injection study
reused with another --steps, --limit or --model, or moved and resumed; a LoRA study reused with
another --model), and what a fresh pass over the commands found: a dry run of ``publish --results``
into a sweep's folder, over an earlier dry run or beside a second one; two studies into one folder;
``--finish`` on a folder without a study; a ``--report_path`` inside the study; other scripts'
digits and negative seeds for the mechanism study; empty or repeated tracker arguments; a file
given as an output folder."""

from __future__ import annotations

import csv
import errno
import json
import shutil
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest

from cf_tasks.cli import main
from cf_tasks.files import OutputLock

INJECT = ["experiment", "inversion", "--quick"]
LORA = ["experiment", "inversion", "--design", "known_lora", "--quick"]


def one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("cf-tasks: error:")]
    assert len(lines) == 1 and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ a study reused or moved (slow)


@pytest.fixture(scope="module")
def inject_study(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("inject_round4") / "study"
    assert main([*INJECT, "--model", str(tiny_model), "--output_path", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def other_model(tiny_model, tmp_path_factory):
    from tiny_model import build_full_checkpoint

    return build_full_checkpoint(tiny_model, tmp_path_factory.mktemp("other_model") / "model", seed=7)


@pytest.mark.slow
@pytest.mark.parametrize("flag, value, key", [("--steps", "6", "steps="), ("--limit", "2", "limit="),
                                              ("--model", None, "model_id=")])
def test_an_injection_study_reused_with_other_settings_is_refused(inject_study, tiny_model, other_model, capsys,
                                                                  flag, value, key):
    before = _files(inject_study)
    model = str(other_model) if flag == "--model" else str(tiny_model)
    extra = [] if flag == "--model" else [flag, value]
    assert main([*INJECT, "--model", model, "--output_path", str(inject_study), *extra]) == 2
    one_line(capsys, key, "pass the same settings or another --output_path")
    assert _files(inject_study) == before  # config.json, the runs and the sweeps as they were


@pytest.mark.slow
def test_a_moved_injection_study_resumed_counts_each_result_once(inject_study, tiny_model, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(inject_study, moved)
    assert main([*INJECT, "--model", str(tiny_model), "--output_path", str(moved)]) == 0
    for name, key in (("mc_curves.csv", ("run", "step", "group")), ("sweep.csv", ("run", "step", "task", "metric"))):
        before = Counter(tuple(r[k] for k in key) for r in _rows(inject_study / "report" / name))
        after = Counter(tuple(r[k] for k in key) for r in _rows(moved / "report" / name))
        assert after == before and max(after.values()) == 1, name
    assert (moved / "report" / "results.md").read_bytes() == (inject_study / "report" / "results.md").read_bytes()


@pytest.mark.slow
def test_a_lora_study_reused_with_another_model_is_refused(tiny_model, other_model, tmp_path, capsys):
    out = tmp_path / "lora"
    assert main([*LORA, "--model", str(tiny_model), "--output_path", str(out), "--arms", "cs_heavy",
                 "--seeds", "0"]) == 0
    capsys.readouterr()
    before = _files(out)
    assert main([*LORA, "--model", str(other_model), "--output_path", str(out), "--arms", "cs_heavy",
                 "--seeds", "0"]) == 2
    one_line(capsys, "model_id=", "another --output_path")
    assert _files(out) == before


@pytest.mark.slow
@pytest.mark.parametrize("inside", ["runs/cs_heavy-seed0", "sweeps", "phase_a", "."])
def test_a_report_path_inside_the_study_is_refused(inject_study, capsys, inside):
    before = _files(inject_study)
    target = inject_study / inside
    assert main(["experiment", "inversion", "--output_path", str(inject_study), "--report_only",
                 "--report_path", str(target)]) == 2
    one_line(capsys, "is inside the study folder", "pass a folder outside it")
    assert _files(inject_study) == before  # the run's own measure.csv, the sweep's sweep.csv untouched


def test_a_report_path_inside_the_studys_report_folder_is_allowed(tmp_path):
    from cf_tasks.experiments.command import check_report_path

    check_report_path(str(tmp_path / "s"), str(tmp_path / "s" / "report" / "again"))
    check_report_path(str(tmp_path / "s"), str(tmp_path / "elsewhere"))
    with pytest.raises(Exception, match="inside the study folder"):
        check_report_path(str(tmp_path / "s"), str(tmp_path / "s" / "runs" / ".." / "sweeps"))


def test_a_report_path_inside_a_new_study_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "new"
    assert main([*INJECT, "--output_path", str(out), "--report_path", str(out / "runs")]) == 2
    one_line(capsys, "--report_path", "inside the study folder")
    assert not out.exists()


# ------------------------------------------------------------------------ one run per study folder


@pytest.mark.parametrize("design", [INJECT, LORA])
def test_a_second_study_into_a_busy_folder_is_refused_before_any_work(tiny_model, tmp_path, capsys, design):
    out = tmp_path / "busy"
    out.mkdir()
    with OutputLock(out, "experiment inversion", on_folder=True):  # another study is running there
        assert main([*design, "--model", str(tiny_model), "--output_path", str(out)]) == 2
    one_line(capsys, str(out), "another cf-tasks experiment inversion is writing there")
    assert list(out.iterdir()) == []  # no settings record, no lock file


def test_finish_on_a_folder_without_a_study_is_refused_before_any_work(tiny_model, tmp_path, capsys):
    out = tmp_path / "none"
    assert main([*INJECT, "--model", str(tiny_model), "--output_path", str(out), "--finish"]) == 2
    one_line(capsys, "--finish", "holds no study to close")
    assert not out.exists()


# ---------------------------------------------------------------- publish --results --dry_run


def _sweep_folder(folder: Path, label: str, plot: bool = True, store: bool = False) -> Path:
    """A sweep output folder as ``publish --results`` reads it: its tables (and plot)."""
    folder.mkdir(parents=True)
    (folder / "sweep.csv").write_text(f"run,step,task,metric,value\n{label},10,cf_capitals,counterfactual_acc,0.5\n")
    (folder / "summary.csv").write_text(f"run,task,metric,verdict\n{label},cf_capitals,counterfactual_acc,flat\n")
    if plot:
        (folder / "inversion.png").write_bytes(f"plot of {label}".encode())
    if store:
        (folder / "store").mkdir()
        (folder / "manifest.json").write_text("{}\n")
    return folder


def _dry_run(results: Path, target: Path) -> int:
    return main(["publish", "--results", str(results), "--repo_id", "my-org/study", "--dry_run",
                 "--output_path", str(target), "--quiet"])


@pytest.mark.parametrize("where", ["another sweep", "the sweep read", "inside the sweep read"])
def test_a_dry_run_into_a_sweeps_folder_is_refused(tmp_path, capsys, where):
    a = _sweep_folder(tmp_path / "a", "run_a", store=True)
    b = _sweep_folder(tmp_path / "b", "run_b", store=True)
    target = {"another sweep": b, "the sweep read": a, "inside the sweep read": a / "repo"}[where]
    before = {p: _files(p) for p in (a, b)}
    assert _dry_run(a, target) == 2
    one_line(capsys, f"--output_path {target}", "pass a new folder")
    assert {p: _files(p) for p in (a, b)} == before


def test_a_dry_run_over_an_earlier_one_of_another_study_keeps_nothing_of_it(tmp_path):
    a = _sweep_folder(tmp_path / "a", "run_a")
    b = _sweep_folder(tmp_path / "b", "run_b", plot=False)
    repo = tmp_path / "repo"
    assert _dry_run(a, repo) == 0
    assert (repo / "inversion.png").read_bytes() == b"plot of run_a"
    assert _dry_run(b, repo) == 0
    assert sorted(p.name for p in repo.iterdir()) == ["README.md", "settings.json", "summary.csv", "sweep.csv"]
    assert "run_a" not in (repo / "sweep.csv").read_text() + (repo / "summary.csv").read_text()
    assert (repo / "sweep.csv").read_bytes() == (b / "sweep.csv").read_bytes()


def test_a_second_dry_run_into_a_folder_being_written_is_refused(tmp_path, capsys):
    a = _sweep_folder(tmp_path / "a", "run_a")
    repo = tmp_path / "repo"
    repo.mkdir()
    with OutputLock(repo, "publish", on_folder=True):
        assert _dry_run(a, repo) == 2
    one_line(capsys, str(repo), "another cf-tasks publish is writing there")
    assert list(repo.iterdir()) == []


def test_a_full_disk_during_a_dry_run_keeps_the_earlier_one_whole(tmp_path, capsys):
    import cf_tasks.sweep.publish as publish

    a = _sweep_folder(tmp_path / "a", "run_a")
    b = _sweep_folder(tmp_path / "b", "run_b")
    repo = tmp_path / "repo"
    assert _dry_run(a, repo) == 0
    before = _files(repo)

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with mock.patch.object(publish, "atomic_write", autospec=True, side_effect=full):
        assert _dry_run(b, repo) == 1
    one_line(capsys, "No space left on device", str(repo))
    assert _files(repo) == before  # no staging folder left, the earlier set whole
    assert [p.name for p in repo.iterdir() if p.name.startswith(".")] == []


# ------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("seeds", ["-1", "٣", "0,１"])
def test_mechanism_seeds_in_other_digits_or_negative_are_refused(tmp_path, capsys, seeds):
    out = tmp_path / "m"
    assert main(["experiment", "mechanism", "--output_path", str(out), f"--seeds={seeds}", "--steps", "1"]) == 2
    one_line(capsys, "--seeds", "non-negative integers in ASCII digits")
    assert not out.exists()


@pytest.mark.parametrize("command", [["sweep", "RUN", "--tasks", "cf_capitals"], ["eval", "--tasks", "cf_capitals"]])
@pytest.mark.parametrize("flag, value, more", [("--report_to", "", []),
                                               ("--report_args", "", ["--report_to", "tensorboard"]),
                                               ("--report_args", " ", ["--report_to", "tensorboard"])])
def test_an_empty_tracker_argument_is_refused_before_any_model(tmp_path, capsys, command, flag, value, more):
    out = tmp_path / "o"
    argv = [str(tmp_path) if a == "RUN" else a for a in command]
    with mock.patch("cf_tasks.evaluate.run_lm_eval", autospec=True) as run:
        assert main([*argv, "--output_path", str(out), *more, f"{flag}={value}"]) == 2
    one_line(capsys, f"{flag} is empty", "leave it out")
    run.assert_not_called()  # refused with the other arguments, before any model
    assert not out.exists()


@pytest.mark.parametrize("args", ["project=a,project=b", "wandb.project=a,wandb.project=b"])
def test_a_tracker_key_given_twice_is_refused(args):
    from cf_tasks.trackers import TrackerError, parse_report_args

    with pytest.raises(TrackerError, match="project is given twice; pass each key once"):
        parse_report_args(args, ["wandb"])
    assert parse_report_args("project=a,wandb.project=b", ["wandb"]) == {"wandb": {"project": "b"}}


@pytest.mark.parametrize("argv", [["build", "--dataset", "cf_capitals", "--quiet", "--out"],
                                  ["experiment", "mechanism", "--output_path"],
                                  ["experiment", "inversion", "--quick", "--output_path"]])
def test_a_file_given_as_the_output_folder_is_named_a_file(tmp_path, capsys, argv):
    path = tmp_path / "afile"
    path.write_text("keep me\n")
    assert main([*argv, str(path)]) == 2
    one_line(capsys, f"{path} is a file, not a folder")
    assert path.read_text() == "keep me\n"


# --------------------------------------------------------------------- build into a used folder


def _build(out: Path, *args: str) -> int:
    return main(["build", "--output_path", str(out), "--quiet", *args])


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_second_build_of_the_same_settings_keeps_the_first_ones_record(tmp_path):
    out = tmp_path / "d"
    assert _build(out, "--dataset", "cf_capitals", "--seed", "3") == 0
    assert _build(out, "--dataset", "cf_quotes", "--seed", "3") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["datasets"]) == ["cf_capitals", "cf_quotes"] and manifest["seed"] == 3
    for entry in manifest["datasets"].values():
        assert entry["sha256"] == _sha(out / entry["file"])


def test_a_build_of_other_settings_beside_an_earlier_builds_files_is_refused(tmp_path, capsys):
    out = tmp_path / "d"
    assert _build(out, "--dataset", "cf_capitals", "--seed", "3") == 0
    before = _files(out)
    assert _build(out, "--dataset", "cf_quotes", "--seed", "4") == 2
    one_line(capsys, "holds cf_capitals of a build with seed 3", "pass another --output_path")
    assert _files(out) == before
    assert _build(out, "--dataset", "cf_capitals", "--seed", "4") == 0  # replaced whole: nothing of seed 3 left
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 4 and list(manifest["datasets"]) == ["cf_capitals"]
    assert manifest["datasets"]["cf_capitals"]["sha256"] == _sha(out / "cf_capitals.jsonl")


def test_training_points_of_another_kind_keep_the_first_kinds_record_and_another_seed_is_refused(tmp_path, capsys):
    out = tmp_path / "t"
    assert _build(out, "--for_training", "--kinds", "C", "--seed", "5") == 0
    assert _build(out, "--for_training", "--kinds", "S", "--seed", "5") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["kinds"]) == ["C", "S"]
    for entry in manifest["kinds"].values():
        assert entry["sha256"] == _sha(out / entry["file"])
    before = _files(out)
    assert _build(out, "--for_training", "--kinds", "S", "--seed", "6") == 2
    one_line(capsys, "holds C of a build with seed 5")
    assert _files(out) == before


# ------------------------------------------------------------- report and sweep: outputs inside inputs


@pytest.mark.parametrize("part", ["store", "store/x", "checkpoints", "claims"])
def test_a_report_into_the_store_or_views_of_a_folder_it_reads_is_refused(tmp_path, capsys, part):
    a = _sweep_folder(tmp_path / "a", "run_a", store=True)
    before = _files(a)
    assert main(["report", str(a), "--output_path", str(a / part)]) == 2
    one_line(capsys, f"is inside {a / part.split('/')[0]}", "pass a folder outside it")
    assert _files(a) == before  # nothing written into the store or beside it
    assert part == "store" or not (a / part).exists()


def test_one_study_given_twice_to_compare_is_refused(tmp_path, capsys):
    a = _sweep_folder(tmp_path / "a", "run_a")
    _sweep_folder(tmp_path / "b", "run_b")
    out = tmp_path / "cmp"
    again = f"{tmp_path}/./a/"  # the same folder, written another way
    assert main(["report", "--compare", str(a), str(tmp_path / "b"), again, "--output_path", str(out)]) == 2
    one_line(capsys, "is given twice", "pass each study once")
    assert not out.exists()


@pytest.mark.parametrize("key", ["tensorboard.log_dir", "wandb.dir"])
def test_a_tracker_folder_inside_a_checkpoint_is_refused_before_any_model(tmp_path, capsys, key):
    run = tmp_path / "run"
    (run / "checkpoint-10").mkdir(parents=True)
    tracker = key.split(".")[0]
    inside = run / "checkpoint-10" / "logs"
    assert main(["sweep", str(run), "--tasks", "cf_capitals", "--output_path", str(tmp_path / "o"),
                 "--report_to", tracker, "--report_args", f"{key}={inside}"]) == 2
    one_line(capsys, f"--report_args {key}={inside} is inside the model folder", "pass an output folder outside it")
    assert list((run / "checkpoint-10").iterdir()) == [] and not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- eval into a used folder


def _fake_results(task: str, value: float) -> dict:
    return {"results": {task: {"alias": task, "counterfactual_acc,none": value}}, "versions": {task: 1.0},
            "n-shot": {task: 0}, "higher_is_better": {}, "configs": {},
            "samples": {task: [{"doc_id": 0, "filtered_resps": ["Paris"], "counterfactual_acc": value}]}}


def test_an_eval_of_other_settings_into_a_used_folder_is_refused_and_the_same_settings_replace(tmp_path, monkeypatch,
                                                                                              capsys):
    from cf_tasks import evaluate

    out, real_run = tmp_path / "out", evaluate.run_lm_eval
    base = ["eval", "--model_args", f"pretrained={tmp_path}", "--output_path", str(out)]
    monkeypatch.setattr(evaluate, "run_lm_eval", mock.create_autospec(real_run, return_value=_fake_results("cf_capitals", 0.25)))
    assert main(base + ["--tasks", "cf_capitals"]) == 0
    capsys.readouterr()
    before = _files(out)
    assert sorted(before) == ["results.csv", "results.json", "samples_cf_capitals.jsonl", "settings.json"]
    for other, named in ((["--tasks", "cf_quotes"], "other --tasks"), (["--tasks", "cf_capitals", "--limit", "3"], "other --limit"),
                         (["--tasks", "cf_capitals", "--no_knowledge"], "other --no_knowledge")):
        run = mock.create_autospec(real_run, return_value=_fake_results("cf_quotes", 0.75))
        monkeypatch.setattr(evaluate, "run_lm_eval", run)
        assert main(base + other) == 2
        one_line(capsys, f"--output_path {out} holds the results of another eval ({named})",
                 "pass another --output_path, or delete")
        run.assert_not_called()  # refused before any model loads
        assert _files(out) == before
    # an earlier cf-tasks left no settings record: refused too, never replaced unseen
    (out / "settings.json").unlink()
    assert main(base + ["--tasks", "cf_capitals"]) == 2
    one_line(capsys, "its settings are not recorded")
    assert main(base + ["--tasks", "cf_capitals"]) == 2  # still refused: nothing was written
    capsys.readouterr()
    (out / "results.json").unlink()  # the fix the message names
    # the same settings run again replace their own results (task order does not matter)
    monkeypatch.setattr(evaluate, "run_lm_eval", mock.create_autospec(real_run, return_value=_fake_results("cf_capitals", 0.5)))
    assert main(base + ["--tasks", "cf_capitals"]) == 0
    assert main(base + ["--tasks", "cf_capitals,"]) == 0
    assert {r["task"]: float(r["value"]) for r in _rows(out / "results.csv")} == {"cf_capitals": 0.5}


def test_a_full_disk_while_eval_lands_its_files_keeps_the_earlier_run_whole(tmp_path, monkeypatch, capsys):
    import cf_tasks.results as results
    from cf_tasks import evaluate

    out, real_run = tmp_path / "out", evaluate.run_lm_eval
    monkeypatch.setattr(evaluate, "run_lm_eval",
                        mock.create_autospec(real_run, return_value=_fake_results("cf_capitals", 0.25)))
    assert main(["eval", "--model_args", f"pretrained={tmp_path}", "--tasks", "cf_capitals", "--output_path",
                 str(out)]) == 0
    capsys.readouterr()
    before = _files(out)
    monkeypatch.setattr(evaluate, "run_lm_eval",
                        mock.create_autospec(real_run, return_value=_fake_results("cf_capitals", 0.75)))
    real = results.atomic_write

    def fills_at_the_json(path, data):
        if path.name == "results.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(results, "atomic_write", mock.create_autospec(real, side_effect=fills_at_the_json))
    assert main(["eval", "--model_args", f"pretrained={tmp_path}", "--tasks", "cf_capitals", "--output_path",
                 str(out)]) == 1
    one_line(capsys, f"--output_path {out}", "No space left on device")
    assert _files(out) == before and sorted(p.name for p in out.iterdir()) == sorted(before)


@pytest.mark.parametrize("extra", [["--dataset", "cf_capitals"], ["--for_training", "--kinds", "C"]])
def test_a_second_build_into_a_folder_being_built_is_refused(tmp_path, capsys, extra):
    out = tmp_path / "d"
    out.mkdir()
    with OutputLock(out, "build", on_folder=True):  # another build is writing there
        assert _build(out, *extra) == 2
    one_line(capsys, str(out), "another cf-tasks build is writing there")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("flag, value", [("--t_facts", "100000"), ("--n_facts", "200")])
def test_more_facts_than_the_study_has_are_refused_before_the_folder_is_claimed(tiny_model, tmp_path, capsys,
                                                                               flag, value):
    from cf_tasks.experiments import inject, inject_facts

    cands = inject_facts.candidate_facts()  # the most each flag takes moves with the datasets' facts
    most = len(cands["train"]) if flag == "--t_facts" else len(cands["heldout"]) // 2
    assert 0 < most < int(value)
    words = f"pass at most {most}"

    out = tmp_path / "s"
    with mock.patch.object(inject_facts, "load_model", autospec=True) as load_a, \
            mock.patch.object(inject, "load_model", autospec=True) as load_b:
        assert main([*INJECT, "--model", str(tiny_model), "--output_path", str(out), flag, value]) == 2
    one_line(capsys, f"{flag} {value}", words)
    load_a.assert_not_called()
    load_b.assert_not_called()
    assert not (out / "config.json").exists()  # a corrected rerun is not refused as "other settings"


def test_a_datasets_export_and_a_sweeps_dry_run_never_share_a_folder(tmp_path, capsys):
    a = _sweep_folder(tmp_path / "a", "run_a")
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)  # a dataset export's parquet files
    (repo / "README.md").write_text("the datasets' card\n")
    before = _files(repo)
    assert _dry_run(a, repo) == 2
    one_line(capsys, "holds a dataset export", "pass a new folder")
    assert _files(repo) == before
    study = tmp_path / "study"
    assert _dry_run(a, study) == 0
    before = _files(study)
    assert main(["publish", "--repo_id", "my-org/cf-tasks", "--dry_run", "--out", str(study), "--quiet"]) == 2
    one_line(capsys, f"--out {study} holds a sweep's results", "pass a new folder")
    assert _files(study) == before


# ---------------------------------------------------------------------------- numbers in other scripts' digits


@pytest.mark.parametrize("argv", [
    ["build", "--seed", "\u0667"], ["publish", "--repo_id", "o/n", "--seed", "\u0667"],
    ["eval", "--tasks", "cf_bio", "--limit", "\u0663"], ["sweep", "r", "--output_path", "o", "--max_polls", "\u0663"],
    ["sweep", "r", "--output_path", "o", "--limit", "\uff13"], ["experiment", "inversion", "--steps", "\u0663"],
    ["experiment", "mechanism", "--steps", "\u0663"], ["filter-data", "in.jsonl", "--batch_size", "\u0663"],
])
def test_a_number_in_another_scripts_digits_is_refused_by_every_command(argv, tmp_path, monkeypatch, capsys):
    """Python's int() and float() read Arabic-Indic or full-width digits as numbers; no one types a
    number of steps that way, so every numeric flag takes ASCII only (exit 2, nothing written)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid int value" in err or "invalid float value" in err, err
    assert list(tmp_path.iterdir()) == []
