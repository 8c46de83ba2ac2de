"""``cf-tasks filter-data`` on a bad day: an input its outputs would replace, weights swapped under
restored time stamps, two runs into one folder, a run cut short, and every input that used to end
in a traceback (one line each, exit 2 before any work, or exit 1 for a failure during the run)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest

from cf_tasks.cli import main
from cf_tasks.files import OutputLock
from cf_tasks.mitigations import filter as filt

WORDS = "paris lyon rome london capital city born year quote answer question background".split()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two tiny models of one architecture and tokenizer (same file sizes), different weights."""
    from tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("tiny_badday")
    return (build_tiny_model(root / "a", [" ".join(WORDS)], seed=0),
            build_tiny_model(root / "b", [" ".join(WORDS)], seed=1))


def rows(count: int = 6, shift: int = 0) -> list[dict]:
    out = []
    for i in range(count):
        w, v = WORDS[(i + shift) % len(WORDS)], WORDS[(3 * i + 1 + shift) % len(WORDS)]
        out.append({"id": f"ex{i:02d}", "instruction": f"what is the capital of {w} ?",
                    "input": f"the capital of {w} is {v} . background {v} city", "output": f"{v} is the capital"})
    return out


def write_jsonl(path: Path, items: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


def run(data, model, out, *extra) -> int:
    return main(["filter-data", str(data), "--model", str(model), "--output_path", str(out), "--quiet", *extra])


def one_line(capsys, *words: str) -> str:
    """The run's stderr: one error line, no traceback, naming every one of ``words``."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # (a progress bar drawn by datasets may share the line: its text ends in a carriage return or nothing)
    lines = [line[line.index("cf-tasks: error:"):] for line in err.splitlines() if "cf-tasks: error:" in line]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- the input is never an output


@pytest.mark.parametrize("name", ["kept.jsonl", "dropped.jsonl"])
def test_an_input_named_like_an_output_is_refused_before_any_work(models, tmp_path, capsys, name):
    out = tmp_path / "out"
    assert run(write_jsonl(tmp_path / "d.jsonl", rows()), models[0], out) == 0
    data = out / name if name == "kept.jsonl" else write_jsonl(out / name, rows(4, shift=1))
    before = snapshot(out)
    with mock.patch.object(filt, "load_tokenizer", autospec=True) as load:
        assert run(data, models[0], out) == 2
    load.assert_not_called()
    one_line(capsys, str(data), "--output_path")
    assert snapshot(out) == before  # the input and every output as they were


def test_a_linked_input_and_a_datasets_folder_inside_an_output_are_refused(models, tmp_path, capsys):
    import datasets

    out = tmp_path / "out"
    out.mkdir()
    kept = out / "kept"
    datasets.Dataset.from_list(rows()).save_to_disk(str(kept))
    before = snapshot(out)
    assert run(kept, models[0], out) == 2
    one_line(capsys, str(kept), "--output_path")
    assert snapshot(out) == before
    write_jsonl(out / "kept.jsonl", rows())
    link = tmp_path / "elsewhere.jsonl"
    os.link(out / "kept.jsonl", link)  # the same file under another name
    assert run(link, models[0], out) == 2
    one_line(capsys, "same file")
    folder = tmp_path / "ds"
    datasets.Dataset.from_list(rows()).save_to_disk(str(folder))
    assert run(folder, models[0], folder / "filtered") == 2  # outputs written inside the input folder
    one_line(capsys, str(folder), "inside the input folder")
    assert not (folder / "filtered").exists()


# ---------------------------------------------------------------- the model is known by its content


def test_weights_swapped_with_the_old_time_stamps_are_scored_again(models, tmp_path):
    a, b = models
    assert (a / "model.safetensors").stat().st_size == (b / "model.safetensors").stat().st_size
    model = tmp_path / "model"
    shutil.copytree(a, model)
    data = write_jsonl(tmp_path / "d.jsonl", rows())
    out = tmp_path / "out"
    assert run(data, model, out) == 0
    with_a = pd.read_parquet(out / "scores.parquet")
    weights = model / "model.safetensors"
    st = weights.stat()
    shutil.copyfile(b / "model.safetensors", weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # same name, size and modification time
    assert run(data, model, out) == 0
    assert run(data, b, tmp_path / "fresh_b") == 0
    swapped = pd.read_parquet(out / "scores.parquet")
    assert not swapped[["loss_with", "loss_without"]].equals(with_a[["loss_with", "loss_without"]])
    pd.testing.assert_frame_equal(swapped, pd.read_parquet(tmp_path / "fresh_b" / "scores.parquet"))
    assert len(list(out.glob("scoring-*.jsonl"))) == 2


# ---------------------------------------------------------------- one writer, outputs that land together


def test_a_second_run_into_a_folder_being_written_is_refused(models, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    data = write_jsonl(tmp_path / "d.jsonl", rows())
    with OutputLock(out, "filter-data"):  # another run holds the folder
        assert run(data, models[0], out) == 2
    one_line(capsys, str(out), "another cf-tasks filter-data")
    assert not (out / "kept.jsonl").exists()
    assert run(data, models[0], out) == 0  # the lock went with its holder


def test_a_run_cut_short_leaves_the_previous_outputs_and_another_input_replaces_them_all(models, tmp_path):
    out = tmp_path / "out"
    first = write_jsonl(tmp_path / "first.jsonl", rows())
    second = write_jsonl(tmp_path / "second.jsonl", rows(8, shift=2))
    assert run(first, models[0], out) == 0
    before = snapshot(out)
    with mock.patch.object(filt, "write_report", autospec=True, side_effect=KeyboardInterrupt):
        assert run(second, models[0], out) == 130
    after = {k: v for k, v in snapshot(out).items() if not k.startswith("scoring-")}
    assert after == {k: v for k, v in before.items() if not k.startswith("scoring-")}  # no file of the second run
    assert not [p for p in out.iterdir() if p.name.endswith(".cftmp")]
    assert run(second, models[0], out) == 0
    record = json.loads((out / "filter.json").read_text())
    assert record["settings"]["data"] == str(second)
    assert (out / "kept.jsonl").read_text().count("\n") + (out / "dropped.jsonl").read_text().count("\n") == 8
    assert f"`{second}`" in (out / "report.md").read_text()
    assert len(pd.read_parquet(out / "scores.parquet")) == 8


def test_a_datasets_input_after_a_jsonl_one_leaves_no_jsonl_outputs_behind(models, tmp_path):
    import datasets

    out = tmp_path / "out"
    assert run(write_jsonl(tmp_path / "d.jsonl", rows()), models[0], out) == 0
    folder = tmp_path / "ds"
    datasets.Dataset.from_list(rows(4, shift=3)).save_to_disk(str(folder))
    assert run(folder, models[0], out) == 0
    assert (out / "kept").is_dir() and not (out / "kept.jsonl").exists() and not (out / "dropped.jsonl").exists()
    assert json.loads((out / "filter.json").read_text())["settings"]["data"] == str(folder)


# ---------------------------------------------------------------- what used to end in a traceback


def test_a_model_folder_without_weights_is_one_line_before_any_work(models, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(models[0], model)
    (model / "model.safetensors").unlink()
    with mock.patch.object(filt, "open_source", autospec=True) as opened:
        assert run(write_jsonl(tmp_path / "d.jsonl", rows()), model, tmp_path / "out") == 2
    opened.assert_not_called()
    one_line(capsys, str(model), "without weights")


def test_corrupt_and_half_written_weights_are_told_apart(models, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(models[0], model)
    weights = model / "model.safetensors"
    data = write_jsonl(tmp_path / "d.jsonl", rows())
    weights.write_bytes((models[0] / "model.safetensors").read_bytes()[:20000])  # a save in progress
    assert run(data, model, tmp_path / "out") == 2
    line = one_line(capsys, str(weights), "still being written")
    assert "corrupt weights" not in line
    old = weights.stat().st_mtime - 3600
    os.utime(weights, (old, old))  # cut short an hour ago: no save is coming
    assert run(data, model, tmp_path / "out") == 2
    one_line(capsys, str(weights), "corrupt", "re-save")
    weights.write_bytes(b"\x00garbage, not a safetensors file")
    os.utime(weights, (old, old))
    assert run(data, model, tmp_path / "out") == 2
    one_line(capsys, str(weights), "corrupt")


@pytest.mark.parametrize("device, words", [("banana", ("--device banana", "not a device")),
                                           ("cuda:7", ("--device cuda:7", "pass"))])
def test_a_bad_or_missing_device_is_one_line_before_any_work(models, tmp_path, capsys, device, words):
    import torch

    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    with mock.patch.object(filt, "load_tokenizer", autospec=True) as load:
        assert run(write_jsonl(tmp_path / "d.jsonl", rows()), models[0], tmp_path / "out", "--device", device) == 2
    load.assert_not_called()
    one_line(capsys, *words)


def test_cuda_on_a_machine_without_one_is_one_line(models, tmp_path, capsys):
    with mock.patch("torch.cuda.is_available", return_value=False):
        assert run(write_jsonl(tmp_path / "d.jsonl", rows()), models[0], tmp_path / "out", "--device", "cuda") == 2
    one_line(capsys, "--device cuda", "no cuda device", "pass cpu")


def test_a_deeply_nested_line_is_one_line(models, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(rows(1)[0]) + "\n" + "[" * 200000 + "]" * 200000 + "\n")
    assert run(data, models[0], tmp_path / "out") == 2
    one_line(capsys, f"{data} line 2", "nested too deeply")


def test_a_model_that_fails_to_load_during_the_run_is_one_line_exit_1(models, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    with mock.patch.object(AutoModelForCausalLM, "from_pretrained", autospec=True,
                           side_effect=RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB")):
        assert run(write_jsonl(tmp_path / "d.jsonl", rows()), models[0], tmp_path / "out") == 1
    one_line(capsys, str(models[0]), "does not load", "RuntimeError: CUDA out of memory")
    assert not (tmp_path / "out" / "kept.jsonl").exists()


def test_a_full_disk_while_writing_the_outputs_is_one_line_exit_1(models, tmp_path, capsys):
    import errno

    out = tmp_path / "out"
    data = write_jsonl(tmp_path / "d.jsonl", rows())
    assert run(data, models[0], out) == 0
    before = snapshot(out)
    def disk_fills(frame, info, args, dropped, stage, *rest):
        raise OSError(errno.ENOSPC, "No space left on device", str(stage / filt.REPORT))

    with mock.patch.object(filt, "write_report", autospec=True, side_effect=disk_fills):
        assert run(data, models[0], out, "--drop", "0.5") == 1
    one_line(capsys, f"{out}: cannot write there", "No space left", "free space")
    assert {k: v for k, v in snapshot(out).items() if not k.startswith("scoring-")} == \
        {k: v for k, v in before.items() if not k.startswith("scoring-")}


def test_a_full_disk_while_scoring_names_the_output_folder(models, tmp_path, capsys):
    import errno

    out = tmp_path / "out"
    real, calls = os.fsync, []

    def fills_on_the_first_batch(fd):
        calls.append(fd)
        if len(calls) > 1:  # the scoring log's header is written; its first batch is not
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    with mock.patch.object(filt.os, "fsync", autospec=True, side_effect=fills_on_the_first_batch):
        assert run(write_jsonl(tmp_path / "d.jsonl", rows()), models[0], out) == 1
    one_line(capsys, f"{out}: cannot write there", "No space left")


def test_an_output_folder_inside_the_model_folder_is_refused(models, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(models[0], model)
    assert run(write_jsonl(tmp_path / "d.jsonl", rows()), model, model / "filtered") == 2
    one_line(capsys, f"--output_path {model / 'filtered'} is inside the model folder {model}")
    assert not (model / "filtered").exists()
