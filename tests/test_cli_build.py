"""`cf-tasks build`: files, manifest, formats and errors."""

import hashlib
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from cf_tasks.cli import main
from cf_tasks.files import TMP_MARK
from dataset_builders import DATASETS, build
from dataset_builders.serialize import read_jsonl


@pytest.mark.slow
def test_build_all_writes_files_and_manifest(tmp_path, capsys):
    assert main(["build", "--out", str(tmp_path), "--seed", "5"]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["seed"] == 5 and set(manifest["datasets"]) == set(DATASETS)
    for name, entry in manifest["datasets"].items():
        data = (tmp_path / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        rows = read_jsonl(tmp_path / entry["file"])
        assert len(rows) == entry["count"]
        assert rows == [i.to_dict() for i in build(name, 5)]
    out = capsys.readouterr().out
    assert "cf_bio" in out and f"built {len(DATASETS)} dataset(s)" in out
    assert not list(tmp_path.glob(f"*{TMP_MARK}"))


def test_build_parquet_reads_back_with_pandas(tmp_path):
    assert main(["build", "--dataset", "cf_capitals", "--format", "parquet", "--out", str(tmp_path), "--quiet"]) == 0
    frame = pd.read_parquet(tmp_path / "cf_capitals.parquet")
    expected = [i.to_dict() for i in build("cf_capitals")]
    assert len(frame) == len(expected)
    assert frame.iloc[0]["parametric_answer"] == expected[0]["parametric_answer"]
    assert list(frame.iloc[0]["parametric_aliases"]) == expected[0]["parametric_aliases"]


def test_unknown_dataset_is_one_line_error(tmp_path, capsys):
    assert main(["build", "--dataset", "cf_nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "unknown dataset 'cf_nope'" in err and "cf_bio" in err


def test_unwritable_output_folder_is_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main(["build", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert str(blocker / "sub") in err and "choose a writable --out" in err


def test_console_script_runs_as_a_module(tmp_path):
    # bars that finish within 2 s are not drawn unless the user sets TQDM_DELAY: theirs wins
    proc = subprocess.run(
        [sys.executable, "-m", "cf_tasks.cli", "build", "--dataset", "cf_quotes", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TQDM_DELAY": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cf_quotes.jsonl").is_file()
    assert "building" in proc.stderr  # the progress display
