"""`cf-tasks build --for_training`: the JSON Lines formats round-trip, the manifest, and one-line
errors with exit 2 for bad arguments."""

import hashlib
import json

import pytest

from cf_tasks.cli import main
from cf_tasks.files import TMP_MARK
from dataset_builders.serialize import read_jsonl
from dataset_builders.split import SPLIT_SEED
from dataset_builders.training import META_FIELDS, training_points


def test_alpaca_export_round_trips(tmp_path, capsys):
    assert main(["build", "--for_training", "--kinds", "C,S", "--format", "alpaca", "--seed", "1234",
                 "--output_path", str(tmp_path)]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["seed"] == 1234 and manifest["split_seed"] == SPLIT_SEED and manifest["format"] == "alpaca"
    assert list(manifest["kinds"]) == ["C", "S"]
    for kind in ("C", "S"):
        entry = manifest["kinds"][kind]
        data = (tmp_path / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        rows, points = read_jsonl(tmp_path / entry["file"]), training_points(kind, 1234)
        assert len(rows) == entry["count"] == sum(entry["families"].values()) == len(points)
        assert rows == [{"instruction": p["instruction"], "input": p["input"], "output": p["output"],
                         **{k: p[k] for k in META_FIELDS}} for p in points]
    assert "C " in capsys.readouterr().out
    assert not list(tmp_path.glob(f"*{TMP_MARK}")) and not (tmp_path / "CF.jsonl").exists()


def test_messages_export_round_trips_and_defaults_to_the_counterfactual_augmentation(tmp_path):
    assert main(["build", "--for-training", "--format", "messages", "--out", str(tmp_path), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert list(manifest["kinds"]) == ["CF"]
    rows, points = read_jsonl(tmp_path / "CF.jsonl"), training_points("CF", 1234)
    assert len(rows) == len(points)
    for row, p in zip(rows, points):
        assert row["messages"] == [{"role": "user", "content": p["input"] + "\n\n" + p["instruction"]},
                                   {"role": "assistant", "content": p["output"]}]
        assert row["id"] == p["id"] and row["fact_id"] == p["fact_id"]


def test_closed_book_messages_hold_the_question_alone(tmp_path):
    assert main(["build", "--for_training", "--kinds", "S", "--format", "messages", "--output_path", str(tmp_path),
                 "--quiet"]) == 0
    first = read_jsonl(tmp_path / "S.jsonl")[0]
    assert first["messages"][0]["content"] == training_points("S", 1234)[0]["instruction"]


@pytest.mark.parametrize("args, message", [
    (["--kinds", "C,XYZ"], "--kinds 'C,XYZ': unknown kind(s) XYZ; pass a comma-separated subset of C,CS,S,CF"),
    (["--kinds", ","], "no kind"),
    (["--kinds", "C,C"], "a kind named twice"),
    (["--format", "parquet"], "--format parquet does not apply to --for_training; choose alpaca or messages"),
    (["--dataset", "cf_bio"], "--dataset does not apply to --for_training"),
])
def test_bad_training_arguments_are_one_line_errors(tmp_path, capsys, args, message):
    assert main(["build", "--for-training", "--output_path", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not (tmp_path / "manifest.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--format", "alpaca"], "--format alpaca is not one of jsonl, parquet (alpaca and messages need --for_training)"),
    (["--kinds", "C"], "--kinds applies only with --for_training"),
])
def test_training_flags_without_for_training_are_one_line_errors(tmp_path, capsys, args, message):
    assert main(["build", "--dataset", "cf_quotes", "--output_path", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


@pytest.mark.parametrize("command", [["eval", "--tasks", "cf_capitals"], ["sweep", "RUN", "--output_path", "OUT"]])
def test_a_bad_split_in_metadata_stops_before_any_model_loads(tmp_path, capsys, command):
    command = [str(tmp_path / c) if c in ("RUN", "OUT") else c for c in command]
    assert main([*command, "--metadata", '{"split": "test"}']) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "split='test' is not one of heldout, train" in err
    assert not (tmp_path / "OUT").exists()
