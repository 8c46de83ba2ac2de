"""The bad day, round 3, outside filter-data: build, eval, sweep, report and experiment mechanism
given empty paths, other scripts' digits, flags of the other backend, a refused published copy, a
folder of the other kind of build, a sweep that selects nothing, adapters without a base, misleading
messages, and reruns of the mechanism study that are cut short or drop the plots."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from unittest import mock

import pytest

from cf_tasks import checkpoints
from cf_tasks.cli import build_parser, main
from cf_tasks.files import OutputLock, write_failure

WORDS = "paris lyon rome london capital city".split()


def one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # (a progress bar drawn by datasets may share the line: its text ends in a carriage return or nothing)
    lines = [line[line.index("cf-tasks: error:"):] for line in err.splitlines() if "cf-tasks: error:" in line]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_round3"), [" ".join(WORDS)])


# ---------------------------------------------------------------- empty paths


@pytest.mark.parametrize("argv, flag", [
    (["build", "--output_path", ""], "--output_path"),
    (["build", "--for_training", "--output_path", " "], "--output_path"),
    (["eval", "--tasks", "cf_capitals", "--limit", "1", "--output_path", ""], "--output_path"),
    (["sweep", "RUN", "--output_path", ""], "--output_path"),
    (["sweep", "", "--output_path", "out"], "RUN_DIR"),
    (["report", "a", "--output_path", ""], "--output_path"),
    (["experiment", "mechanism", "--output_path", ""], "--output_path"),
    (["experiment", "inversion", "--output_path", ""], "--output_path"),
    (["experiment", "inversion", "--output_path", "out", "--model", ""], "--model"),
    (["filter-data", "d.jsonl", "--output_path", ""], "--output_path"),
    (["filter-data", "", "--output_path", "out"], "DATA"),
])
def test_an_empty_path_is_refused_and_the_working_folder_untouched(tmp_path, monkeypatch, capsys, argv, flag):
    monkeypatch.chdir(tmp_path)
    with mock.patch("cf_tasks.evaluate.run_lm_eval", autospec=True) as ran:
        assert main(argv) == 2
    ran.assert_not_called()
    one_line(capsys, f"{flag} is empty", "working folder")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- build


def test_kinds_empty_is_refused(tmp_path, capsys):
    assert main(["build", "--for_training", "--kinds", "", "--output_path", str(tmp_path / "t")]) == 2
    one_line(capsys, "--kinds ''", "no kind")
    assert main(["build", "--kinds", "", "--output_path", str(tmp_path / "d")]) == 2
    one_line(capsys, "--kinds", "--for_training")
    assert not (tmp_path / "t").exists() and not (tmp_path / "d").exists()


@pytest.mark.slow
def test_build_never_overwrites_the_manifest_of_the_other_kind_of_build(tmp_path, capsys):
    training, data = tmp_path / "training", tmp_path / "data"
    assert main(["build", "--for_training", "--kinds", "CF", "--output_path", str(training), "--quiet"]) == 0
    assert main(["build", "--dataset", "cf_capitals", "--output_path", str(data), "--quiet"]) == 0
    before = {p: p.read_bytes() for p in (training / "manifest.json", data / "manifest.json")}
    assert main(["build", "--dataset", "cf_capitals", "--output_path", str(training), "--quiet"]) == 2
    one_line(capsys, f"{training}: its manifest.json records training points", "another --output_path")
    assert main(["build", "--for_training", "--output_path", str(data), "--quiet"]) == 2
    one_line(capsys, f"{data}: its manifest.json records datasets", "another --output_path")
    assert {p: p.read_bytes() for p in before} == before
    assert not (training / "cf_capitals.jsonl").exists() and not (data / "CF.jsonl").exists()
    # the same kind of build into its own folder is a rebuild, as before
    assert main(["build", "--for_training", "--kinds", "CF", "--output_path", str(training), "--quiet"]) == 0


# ---------------------------------------------------------------- eval and sweep: a refused hub_repo


@pytest.mark.parametrize("metadata, words", [
    ({"hub_repo": "not a repo!!"}, ("hub_repo 'not a repo!!'", "neither a folder nor a Hub repo id")),
    ({"hub_repo": "org/name", "revision": "main"}, ("revision 'main' of org/name is a branch", "pin it")),
    ({"hub_repo": "org/name"}, ("needs a pinned revision",)),
])
def test_eval_with_a_refused_hub_repo_is_one_line_before_any_model(capsys, metadata, words):
    with mock.patch("cf_tasks.evaluate.run_lm_eval", autospec=True) as ran, \
            mock.patch("cf_tasks.registry.task_manager", autospec=True) as index:
        assert main(["eval", "--tasks", "cf_capitals", "--limit", "1", "--metadata", json.dumps(metadata)]) == 2
    ran.assert_not_called()
    index.assert_not_called()
    one_line(capsys, *words)


def test_the_sweeps_refused_hub_repo_message_has_no_offline_prefix(monkeypatch):
    from cf_tasks.hub import PublishError
    from cf_tasks.sweep import SweepError
    from cf_tasks.sweep.checks import load_task

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tm = mock.Mock(spec=["load", "task_index"])
    tm.task_index = {}
    tm.load.side_effect = PublishError("hub_repo 'x' is neither a folder nor a Hub repo id ORG/NAME; fix hub_repo")
    with pytest.raises(SweepError) as caught:
        load_task(tm, "cf_capitals")
    assert str(caught.value) == "task cf_capitals: hub_repo 'x' is neither a folder nor a Hub repo id ORG/NAME; fix hub_repo"
    tm.load.side_effect = FileNotFoundError("no cached copy")  # a real offline miss keeps its hint
    with pytest.raises(SweepError, match=r"\(offline: the dataset must be in the local cache"):
        load_task(tm, "cf_capitals")


# ---------------------------------------------------------------- sweep arguments


@pytest.mark.parametrize("shard", ["٠/٢", "１/２", "0/２"])
def test_shard_in_other_scripts_digits_is_refused(tmp_path, capsys, shard):
    assert main(["sweep", str(tmp_path), "--output_path", str(tmp_path / "o"), "--shard", shard]) == 2
    one_line(capsys, f"--shard {shard!r}", "not I/N")


def test_shard_auto_with_other_scripts_digits_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "٠")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    assert main(["sweep", str(tmp_path), "--output_path", str(tmp_path / "o"), "--shard", "auto"]) == 2
    one_line(capsys, "SLURM_ARRAY_TASK_ID", "ASCII digits")


def test_tensor_parallel_size_with_the_hf_backend_is_refused(base, tmp_path, capsys):
    from tiny_model import build_full_checkpoint

    build_full_checkpoint(base, tmp_path / "run" / "checkpoint-1", 1)
    with mock.patch("cf_tasks.registry.task_manager", autospec=True) as index:
        assert main(["sweep", str(tmp_path / "run"), "--backend", "hf", "--tensor_parallel_size", "2",
                     "--output_path", str(tmp_path / "o")]) == 2
    index.assert_not_called()
    one_line(capsys, "--tensor_parallel_size 2", "--backend vllm")
    assert not (tmp_path / "o").exists()


def test_adapters_without_a_base_are_refused_early_naming_base(base, tmp_path, capsys):
    from tiny_model import build_lora_adapter

    run = tmp_path / "run"
    for step in (1, 2):
        adapter = build_lora_adapter(base, run / f"checkpoint-{step}", step)
        config = json.loads((adapter / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = None
        (adapter / "adapter_config.json").write_text(json.dumps(config))
    with mock.patch("cf_tasks.registry.task_manager", autospec=True) as index:
        assert main(["sweep", str(run), "--backend", "hf", "--output_path", str(tmp_path / "o")]) == 2
        one_line(capsys, "--base", "checkpoint-1", "name no base model")
        assert main(["sweep", str(run), "--backend", "hf", "--base", str(tmp_path / "gone"),
                     "--output_path", str(tmp_path / "o")]) == 2
        one_line(capsys, f"--base {tmp_path / 'gone'}", "no such model folder")
    index.assert_not_called()
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("how", ["shard beyond the checkpoints", "watch stopped before the first save"])
def test_a_sweep_that_selects_no_checkpoint_leaves_a_usable_folder(base, tmp_path, how):
    from cf_tasks.sweep import SweepConfig, run_sweep
    from cf_tasks.sweep.checks import check_arguments
    from tiny_model import build_full_checkpoint

    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()
    if how.startswith("shard"):
        build_full_checkpoint(base, run / "checkpoint-1", 1)
        cfg = SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, backend="hf", limit=1, shard=(1, 2),
                          agree=False, quiet=True)
    else:
        cfg = SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, backend="hf", limit=1, watch=True,
                          max_polls=1, poll_interval=0.01, agree=False, quiet=True)
    assert run_sweep(cfg, log=lambda *a, **k: None) == 0
    assert (out / "manifest.json").is_file() and (out / "store").is_dir()
    build_full_checkpoint(base, run / "checkpoint-2", 2)
    again = SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, backend="hf", limit=1, agree=False)
    check_arguments(again)  # no "written by an older cf-tasks"


# ---------------------------------------------------------------- messages that named the wrong cause


def test_a_weights_file_removed_while_checked_is_not_called_corrupt(tmp_path):
    gone = tmp_path / "checkpoint-1" / "model.safetensors"
    line = checkpoints.weights_problem([gone])
    assert line.startswith(f"{gone}: the weights file was removed") and "corrupt" not in line


def test_a_weights_file_being_written_is_not_called_corrupt(base, tmp_path):
    import shutil

    ckpt = tmp_path / "checkpoint-1"
    shutil.copytree(base, ckpt)
    whole = (base / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(whole[: len(whole) // 2])
    found = checkpoints.inspect(ckpt, 1)
    line = checkpoints.check_weights(found)
    assert "still being written" in line and "corrupt" not in line.split(": ", 1)[1]
    old = (ckpt / "model.safetensors").stat().st_mtime - 3600
    os.utime(ckpt / "model.safetensors", (old, old))
    assert "corrupt weights file" in checkpoints.check_weights(found)
    (ckpt / "model.safetensors").write_bytes(whole)
    assert checkpoints.check_weights(found) is None


def test_a_full_disk_while_a_checkpoint_view_is_rebuilt_names_the_folder(tmp_path):
    from cf_tasks.sweep import views

    src = tmp_path / "store" / "id" / "cf_capitals" / "s"
    src.mkdir(parents=True)
    (src / "results.json").write_text(json.dumps({"results": {}, "configs": {}, "versions": {}}))
    (src / "samples_cf_capitals.jsonl").write_text("{}\n")
    out = tmp_path / "out"
    out.mkdir()
    record = {"task": "cf_capitals", "finished": 1.0, "dir": str(src)}
    with mock.patch.object(views.shutil, "copyfile", autospec=True,
                           side_effect=OSError(errno.ENOSPC, "No space left on device")):
        with pytest.raises(OSError) as caught:
            views._write_checkpoint_view(out, "checkpoint-1", [record])
    line = write_failure(caught.value)
    assert line.startswith(f"{out / 'checkpoints'}: cannot write there (No space left on device)")
    assert [p.name for p in (out / "checkpoints").iterdir()] == []  # the half-made view is gone


def test_report_mixed_scorers_help_says_what_it_does():
    parser = build_parser()
    report = parser._subparsers._group_actions[0].choices["report"]
    text = next(a.help for a in report._actions if "--mixed_scorers" in a.option_strings)
    assert "one series per version" not in text
    assert "only its latest version's rows" in text


# ---------------------------------------------------------------- experiment mechanism reruns


def mechanism(out: Path, *extra: str) -> int:
    return main(["experiment", "mechanism", "--output_path", str(out), "--seeds", "0", "--steps", "2", *extra])


@pytest.mark.slow
def test_mechanism_rerun_with_no_plots_removes_the_old_plots(tmp_path):
    out = tmp_path / "m"
    assert mechanism(out) == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["c_only.png", "counterfactual.png", "mix.png", "qk_only.png"]
    assert mechanism(out, "--no_plots") == 0
    assert list(out.glob("*.png")) == []
    assert json.loads((out / "mechanism.json").read_text())["plots"] is False


@pytest.mark.slow
def test_mechanism_rerun_killed_after_its_first_arm_leaves_the_previous_run_whole(tmp_path):
    from cf_tasks.experiments import mechanism as mech

    out = tmp_path / "m"
    assert mechanism(out) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real, calls = mech.finetune, []

    def dies_on_the_second_arm(study, arm, record=None):
        calls.append(arm)
        if len(set(calls)) > 1:
            raise KeyboardInterrupt
        return real(study, arm, record)

    with mock.patch.object(mech, "finetune", autospec=True, side_effect=dies_on_the_second_arm):
        assert main(["experiment", "mechanism", "--output_path", str(out), "--seeds", "1", "--steps", "3"]) == 130
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not [p for p in out.iterdir() if p.is_dir()]  # no staging folder left


def test_a_second_mechanism_run_into_a_busy_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "m"
    out.mkdir()
    with OutputLock(out, "mechanism"):
        assert mechanism(out) == 2
    one_line(capsys, str(out), "another cf-tasks mechanism")
    assert not (out / "summary.csv").exists()


def test_a_full_disk_during_build_is_one_line_exit_1_naming_the_folder(tmp_path, capsys):
    import dataset_builders.serialize as serialize

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with mock.patch.object(serialize, "atomic_write", autospec=True, side_effect=full):
        assert main(["build", "--dataset", "cf_capitals", "--output_path", str(tmp_path / "d"), "--quiet"]) == 1
    one_line(capsys, f"{tmp_path / 'd'}: cannot write there (No space left on device)", "free space")


def test_report_into_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "f.csv").write_text("x\n")
    assert main(["report", str(tmp_path / "a"), "--output_path", str(tmp_path / "f.csv")]) == 2
    one_line(capsys, f"--output_path {tmp_path / 'f.csv'} is a file")
    assert (tmp_path / "f.csv").read_text() == "x\n"


@pytest.mark.parametrize("argv, flag", [
    (["eval", "--model_args", "", "--tasks", "cf_capitals"], "--model_args"),
    (["eval", "--metadata", " ", "--tasks", "cf_capitals"], "--metadata"),
    (["sweep", "RUN", "--output_path", "o", "--metadata", ""], "--metadata"),
    (["filter-data", "d.jsonl", "--output_path", "o", "--context_field", ""], "--context_field"),
    (["publish", "--repo_id", "a/b", "--dry_run", "--out", ""], "--out"),
])
def test_an_empty_value_that_would_mean_the_default_is_refused(tmp_path, monkeypatch, capsys, argv, flag):
    monkeypatch.chdir(tmp_path)
    with mock.patch("cf_tasks.evaluate.run_lm_eval", autospec=True) as ran:
        assert main(argv) == 2
    ran.assert_not_called()
    one_line(capsys, f"{flag} is empty")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_output_inside_a_checkpoint_folder_is_refused(base, tmp_path, capsys):
    from tiny_model import build_full_checkpoint

    ckpt = build_full_checkpoint(base, tmp_path / "run" / "checkpoint-1", 1)
    with mock.patch("cf_tasks.registry.task_manager", autospec=True) as index:
        assert main(["sweep", str(tmp_path / "run"), "--backend", "hf", "--output_path", str(ckpt / "eval")]) == 2
    index.assert_not_called()
    one_line(capsys, f"--output_path {ckpt / 'eval'} is inside the model folder {ckpt}")
    assert not (ckpt / "eval").exists()
