"""The dataset cache: a cached build equals a fresh one byte for byte, and a changed builder, version
or seed, a damaged file or a read-only folder never gives stale or broken items."""

import hashlib
import json
import os
from unittest import mock

import pytest

import dataset_builders
from cf_tasks import dataset_cache, tasks
from dataset_builders import validate

NAME, SEED = "cf_capitals", 1234  # the fastest knowledge-conflict dataset to build


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "datasets"
    monkeypatch.setenv("CF_TASKS_DATASET_CACHE", str(folder))
    tasks.built_dataset.cache_clear()
    yield folder
    tasks.built_dataset.cache_clear()


def _arrow_bytes(ds) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    table = ds.data.table
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _builds():
    return mock.patch.object(validate, "build_validated", autospec=True, side_effect=validate.build_validated)


def test_a_cached_build_equals_a_fresh_build_byte_for_byte(cache, monkeypatch):
    with _builds() as build:
        first = tasks.built_dataset(NAME, SEED)
        tasks.built_dataset.cache_clear()
        second = tasks.built_dataset(NAME, SEED)  # as a new process would: from the file
    assert build.call_count == 1
    assert len(list(cache.glob(f"{NAME}-v*-seed{SEED}-*.json"))) == 1
    monkeypatch.setenv("CF_TASKS_DATASET_CACHE", "off")
    tasks.built_dataset.cache_clear()
    fresh = tasks.built_dataset(NAME, SEED)
    assert second.features == fresh.features and len(second) == len(fresh) > 100
    assert _arrow_bytes(second) == _arrow_bytes(first) == _arrow_bytes(fresh)
    assert len(list(cache.iterdir())) == 1  # "off" wrote nothing


@pytest.mark.parametrize("change", ["builder source", "version", "seed"])
def test_a_changed_builder_version_or_seed_never_reads_the_old_file(cache, monkeypatch, change):
    dataset_cache.validated_items(NAME, SEED)
    old = next(cache.iterdir())
    stale = json.loads(old.read_bytes())
    stale["items"][0]["counterfactual_answer"] = "Stale"  # what the old builder made, checksum made to match
    stale["sha256"] = hashlib.sha256(dataset_cache._items_bytes(stale["items"])).hexdigest()
    old.write_text(json.dumps(stale))
    assert dataset_cache.validated_items(NAME, SEED)[0]["counterfactual_answer"] == "Stale"  # the planted file is read
    seed = SEED
    if change == "builder source":
        monkeypatch.setattr(dataset_cache, "builders_digest", lambda: "0" * 64)
    elif change == "version":
        real = dataset_builders.version
        monkeypatch.setattr(dataset_builders, "version", lambda name: real(name) + 1)
    else:
        seed = SEED + 1
    with _builds() as build:
        items = dataset_cache.validated_items(NAME, seed)
    assert build.call_count == 1 and items[0]["counterfactual_answer"] != "Stale"
    assert len(list(cache.iterdir())) == 2  # a file of its own, beside the old one


def test_the_digest_covers_every_builder_file_and_fact_table(tmp_path, monkeypatch):
    """Editing a fact table changes the digest (and so the cache file's name)."""
    import shutil

    copy = tmp_path / "dataset_builders"
    shutil.copytree(os.path.dirname(dataset_builders.__file__), copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(dataset_builders, "__file__", str(copy / "__init__.py"))
    dataset_cache.builders_digest.cache_clear()
    try:
        before = dataset_cache.builders_digest()
        table = sorted((copy / "data").glob("*.json"))[0]
        table.write_text(table.read_text() + " ")
        dataset_cache.builders_digest.cache_clear()
        after = dataset_cache.builders_digest()
    finally:
        dataset_cache.builders_digest.cache_clear()
    assert before != after


@pytest.mark.parametrize("damage", ["cut short", "edited item", "other key", "not json"])
def test_a_damaged_file_is_built_again_not_read(cache, damage):
    expected = dataset_cache.validated_items(NAME, SEED)
    path = next(cache.iterdir())
    data = path.read_bytes()
    if damage == "cut short":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "edited item":
        path.write_bytes(data.replace(expected[0]["counterfactual_answer"].encode(), b"Nowhere", 1))
    elif damage == "other key":
        stored = json.loads(data)
        stored["key"]["seed"] = SEED + 7
        path.write_text(json.dumps(stored))
    else:
        path.write_bytes(b"\x00\x01 not json")
    with _builds() as build:
        assert dataset_cache.validated_items(NAME, SEED) == expected
    assert build.call_count == 1
    assert dataset_cache.read_cached(path, dataset_cache.cache_key(NAME, SEED)) == expected  # written again


def test_a_read_only_cache_folder_still_gives_the_build(cache):
    cache.mkdir()
    cache.chmod(0o555)
    try:
        with mock.patch.object(dataset_cache, "atomic_write", autospec=True,
                               side_effect=PermissionError(13, "Permission denied")) as write:
            items = dataset_cache.validated_items(NAME, SEED)
    finally:
        cache.chmod(0o755)
    assert write.call_count == 1 and len(items) > 100
    assert list(cache.iterdir()) == []


def test_the_suite_never_uses_the_users_cache():
    from pathlib import Path

    from cf_tasks.dataset_cache import cache_dir
    from cf_tasks.default_model import cache_root

    folder = cache_dir()
    assert folder is not None and Path(cache_root()) not in folder.parents and folder.name.startswith("cf-tasks-test")
