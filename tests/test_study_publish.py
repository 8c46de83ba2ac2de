"""``cf-tasks publish --results`` (a dry run loaded back with ``datasets``) and ``cf-tasks report
--compare`` (two studies on one plot; mixed dataset or scorer versions refused in one line)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import datasets
import pandas as pd
import pytest

from cf_tasks.cli import main
from cf_tasks.sweep import SweepConfig, run_sweep
from cf_tasks.sweep.compare import compare, draw_studies
from tiny_model import build_full_checkpoint

TASK = "cf_capitals"
TOKEN = "hf_StudyTokenThatMustNeverBeWritten42"


@pytest.fixture(scope="module")
def studies(tiny_model, tmp_path_factory):
    """Two sweeps of two runs (other seeds), three checkpoints each."""
    root = tmp_path_factory.mktemp("studies")
    outs = []
    for name, seeds in (("study_a", (1, 2, 3)), ("study_b", (4, 5, 6))):
        run = root / f"run_{name}"
        for step, seed in zip((10, 20, 30), seeds):
            build_full_checkpoint(tiny_model, run / f"checkpoint-{step}", seed)
        out = root / name
        assert run_sweep(SweepConfig(run_dir=run, tasks=[TASK], output_path=out, limit=2, agree=False),
                         log=lambda *a, **k: None) == 0
        outs.append(out)
    return outs


@pytest.mark.slow
def test_a_dry_run_publish_loads_back_into_sweep_csvs_rows(studies, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    repo = tmp_path / "repo"
    assert main(["publish", "--results", str(studies[0]), "--repo_id", "my-org/study-a", "--dry_run",
                 "--output_path", str(repo)]) == 0
    assert {p.name for p in repo.iterdir()} == {"README.md", "sweep.csv", "summary.csv", "items.csv",
                                                "inversion.png", "settings.json"}
    loaded = datasets.load_dataset(str(repo), "sweep", split="train", cache_dir=str(tmp_path / "cache")).to_pandas()
    expected = pd.read_csv(studies[0] / "sweep.csv")
    pd.testing.assert_frame_equal(loaded[list(expected.columns)], expected, check_dtype=False)
    expected_steps = sorted(expected["step"].unique())
    summary = datasets.load_dataset(str(repo), "summary", split="train", cache_dir=str(tmp_path / "cache")).to_pandas()
    expected = pd.read_csv(studies[0] / "summary.csv")
    assert len(expected) == 1 and expected["verdict"].notna().all()
    pd.testing.assert_frame_equal(summary[list(expected.columns)], expected, check_dtype=False)
    items = datasets.load_dataset(str(repo), "items", split="train", cache_dir=str(tmp_path / "cache"))
    assert len(items) == 3 * 2  # three checkpoints x two items
    assert set(items["task"]) == {TASK}
    assert {(r["step"], r["task"]) for r in items} == {(int(s), TASK) for s in expected_steps}
    card = (repo / "README.md").read_text()
    assert "config_name: sweep" in card and TASK in card and "Goyal et al." in card
    settings = (repo / "settings.json").read_text()
    assert '"limit": 2' in settings
    logged = capsys.readouterr()
    for text in [logged.out, logged.err] + [p.read_bytes().decode("latin-1") for p in repo.iterdir()]:
        assert TOKEN not in text and "hf_Study" not in text


def test_publish_results_of_a_folder_without_a_sweep_is_one_line(tmp_path, capsys):
    assert main(["publish", "--results", str(tmp_path), "--repo_id", "my-org/x", "--dry_run",
                 "--output_path", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a sweep output folder" in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_compare_draws_both_studies_a_sweep_and_a_published_copy(studies, tmp_path):
    repo = tmp_path / "published_b"
    assert main(["publish", "--results", str(studies[1]), "--repo_id", "my-org/study-b", "--dry_run",
                 "--output_path", str(repo), "--quiet"]) == 0
    target = tmp_path / "cmp"
    read, drawn = compare([str(studies[0]), str(repo)], target)
    assert [label for label, _ in read] == ["study_a", "published_b"]
    for label in ("study_a", "published_b"):
        assert any(f"{TASK} {label}: counterfactual_acc" == line for line in drawn), drawn
    fig, _ = draw_studies(read)  # the figure's own lines: each study's sweep.csv points, in a colour of its own
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    colours = set()
    for label, study in (("study_a", studies[0]), ("published_b", studies[1])):
        for metric in ("counterfactual_acc", "parametric_acc"):
            frame = pd.read_csv(study / "sweep.csv").query("metric == @metric").sort_values("step")
            line = lines[f"{label}: {metric}"]
            assert list(line.get_xdata()) == list(frame["step"]) == [10, 20, 30]
            assert list(line.get_ydata()) == pytest.approx(list(frame["value"]))
        colours.add(line.get_color())
    assert len(colours) == 2
    assert (target / "compare.png").stat().st_size > 0
    table = list(csv.DictReader((target / "compare.csv").open()))
    assert {r["study"] for r in table} == {"study_a", "published_b"}
    assert main(["report", "--compare", str(studies[0]), str(studies[1]), "--output_path", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "compare.png").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("column", ["version", "scorer_version"])
def test_compare_refuses_mixed_versions_in_one_line_unless_asked(studies, tmp_path, capsys, column):
    other = tmp_path / "other"
    other.mkdir()
    frame = pd.read_csv(studies[1] / "sweep.csv")
    frame[column] = 99
    frame.to_csv(other / "sweep.csv", index=False)
    target = tmp_path / "cmp"
    assert main(["report", "--compare", str(studies[0]), str(other), "--output_path", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mixed_versions" in err[0] and "99 in other" in err[0], err
    assert not target.exists()  # refused before anything is written
    assert main(["report", "--compare", str(studies[0]), str(other), "--output_path", str(target),
                 "--mixed_versions"]) == 0
    assert (target / "compare.png").is_file()


@pytest.mark.slow
def test_an_upload_is_one_commit_of_the_dry_runs_files_without_the_token(studies, tmp_path, monkeypatch, capsys):
    from unittest import mock

    import huggingface_hub
    from huggingface_hub import HfApi, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    api = mock.create_autospec(HfApi, instance=True)
    api.create_commit.return_value = mock.Mock(oid="abc123")
    made = mock.create_autospec(HfApi, return_value=api)
    monkeypatch.setattr(huggingface_hub, "HfApi", made)
    assert main(["publish", "--results", str(studies[0]), "--repo_id", "my-org/study-a"]) == 0
    made.assert_called_once_with(token=TOKEN)
    api.create_repo.assert_called_once_with("my-org/study-a", repo_type="dataset", private=None, exist_ok=True)
    (commit,) = api.create_commit.call_args_list
    assert sorted(op.path_in_repo for op in commit.args[1]) == ["README.md", "inversion.png", "items.csv",
                                                                 "settings.json", "summary.csv", "sweep.csv"]
    assert "abc123" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_of_an_unreachable_published_study_is_one_line(studies, tmp_path, capsys):
    assert main(["report", "--compare", str(studies[0]), "my-org/not-here", "--output_path", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "my-org/not-here: cannot read the published study" in err[0], err
    assert not (tmp_path / "c").exists()


def _synthetic_study(folder: Path, level: float) -> Path:
    folder.mkdir()
    rows = [{"run": "r", "checkpoint": f"checkpoint-{s}", "step": s, "task": TASK, "metric": m, "value": level + d,
             "version": 1, "scorer_version": 1} for s in (10, 20, 30) for m, d in (("counterfactual_acc", 0.0),
                                                                                   ("parametric_acc", 0.1))]
    pd.DataFrame(rows).to_csv(folder / "sweep.csv", index=False)
    return folder


def test_the_compare_png_shows_each_studys_lines(tmp_path):
    """The written PNG itself holds both studies' lines: pixels of each study's colour, far more than
    its legend entries alone would paint."""
    import matplotlib.colors
    import matplotlib.image
    import numpy as np

    low, high = _synthetic_study(tmp_path / "low", 0.1), _synthetic_study(tmp_path / "high", 0.7)
    assert main(["report", "--compare", str(low), str(high), "--output_path", str(tmp_path / "cmp")]) == 0
    image = matplotlib.image.imread(tmp_path / "cmp" / "compare.png")[..., :3]
    height = image.shape[0]
    for colour, level in (("C0", 0.1), ("C1", 0.7)):  # the first study's colour, the second's
        close = np.abs(image - np.array(matplotlib.colors.to_rgb(colour))).max(axis=2) < 0.08
        rows = np.nonzero(close.sum(axis=1) > 40)[0]  # the rows a line runs along
        assert close.sum() > 1500, (colour, close.sum())
        # the low study's lines lie in the lower part of the panel, the high study's in the upper
        assert (rows.mean() > height / 2) == (level < 0.5), (colour, rows)


def test_compare_reads_a_published_study_from_the_hub(tmp_path, monkeypatch):
    """A repo id is read through huggingface_hub (here its download stands in for the network) and drawn
    under its own name beside a local folder."""
    from unittest import mock

    import huggingface_hub

    local, published = _synthetic_study(tmp_path / "local", 0.1), _synthetic_study(tmp_path / "hub_copy", 0.7)
    download = mock.create_autospec(huggingface_hub.hf_hub_download, return_value=str(published / "sweep.csv"))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    read, drawn = compare([str(local), "my-org/study-b"], tmp_path / "cmp")
    download.assert_called_once_with("my-org/study-b", "sweep.csv", repo_type="dataset")
    assert [label for label, _ in read] == ["local", "my-org/study-b"]
    assert f"{TASK} my-org/study-b: counterfactual_acc" in drawn
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert table.groupby("study")["value"].mean().round(2).to_dict() == {"local": 0.15, "my-org/study-b": 0.75}
