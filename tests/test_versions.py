"""Versioning that cannot be skipped: a dataset's bytes change only with its version, and the
builder ``VERSION`` and the task ``metadata.version`` are one number."""

from pathlib import Path

import pytest

import dataset_builders
from dataset_builders import DATASETS, version
from golden import SEEDS, digest, load_golden

TASK_YAMLS = Path(__file__).resolve().parents[1] / "task_yamls"


def _read_yaml(path: Path) -> dict:
    """A task YAML with its ``include:`` files merged (local keys win), ``!function`` tags as text."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, tag, node: tag)
    config = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)
    includes = config.pop("include", [])
    merged: dict = {}
    for include in [includes] if isinstance(includes, str) else includes:
        merged.update(_read_yaml(path.parent / include))
    return {**merged, **config}


def _task_configs():
    for path in sorted(TASK_YAMLS.rglob("*.yaml")):
        config = _read_yaml(path)
        if isinstance(config.get("task"), str):
            yield path, config


@pytest.mark.parametrize("name", DATASETS)
def test_bytes_match_the_recorded_digest_of_this_version(name):
    recorded = load_golden().get(name, {}).get(str(version(name)))
    assert recorded, (
        f"no golden sha256 for {name} version {version(name)}: run `python tests/golden.py` to record it"
    )
    for seed in SEEDS:
        assert digest(name, seed) == recorded.get(str(seed)), (
            f"{name} (builder version {version(name)}, seed {seed}) changed its bytes: bump VERSION in "
            f"dataset_builders/{name}.py and metadata.version of its tasks in task_yamls/, add a CHANGELOG "
            f"line saying which items changed, then run `python tests/golden.py`"
        )


def test_every_dataset_task_declares_its_builder_version():
    seen = set()
    for path, config in _task_configs():
        metadata = config.get("metadata") or {}
        dataset = metadata.get("dataset")
        assert dataset in DATASETS, f"{path}: metadata.dataset {dataset!r} is not a dataset"
        assert float(metadata["version"]) == float(version(dataset)), (
            f"{path.relative_to(TASK_YAMLS)}: metadata.version {metadata['version']} but dataset_builders "
            f"{dataset} VERSION {version(dataset)}; they move together"
        )
        seen.add(dataset)
    assert seen == set(DATASETS)


def test_a_task_whose_version_differs_from_its_builder_refuses_to_load():
    from cf_tasks.tasks import load

    stale = float(version("cf_quotes")) - 1
    with pytest.raises(ValueError, match=r"cf_quotes: task metadata.version .* but the dataset builder is version"):
        load("cf_quotes", version=stale)


def test_recording_never_overwrites_a_digest(tmp_path, monkeypatch):
    import golden

    path = tmp_path / "dataset_sha256.json"
    name = "cf_quotes"
    v = str(version(name))
    path.write_text('{"%s": {"%s": {"0": "old"}}}' % (name, v))
    monkeypatch.setattr(golden, "GOLDEN_PATH", path)
    monkeypatch.setattr(dataset_builders, "DATASETS", (name,))
    added = golden.record()
    kept = golden.load_golden()[name][v]
    assert kept["0"] == "old"  # a changed build cannot be recorded over its version's digest
    assert sorted(kept) == sorted(str(s) for s in SEEDS) and len(added) == len(SEEDS) - 1
