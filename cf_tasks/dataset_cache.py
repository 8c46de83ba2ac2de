"""Validated dataset builds, kept on disk between processes.

A validated build of a dataset (``dataset_builders.validate.build_validated``) takes seconds: it
builds the dataset twice to prove that the build is deterministic. Every lm-eval process that loads
the tasks (each ``cf-tasks eval``, each sweep, each ``lm_eval`` run) would pay for it again, so the
items of each (dataset, version, seed) are kept in a cache file whose name carries a digest of every
builder source and fact table. A change to any builder, fact table or version gives another name, so
a stale file is never read; a file whose content does not match its own checksum and key is built
again. The cache lives in ``$CF_TASKS_DATASET_CACHE`` (``off`` turns it off), by default
``datasets/`` in the cf-tasks cache folder (``$CF_TASKS_CACHE``, else ``~/.cache/cf-tasks``).
A cache that cannot be written is skipped: the build is used as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from .files import atomic_write

FORMAT = 1  # the cache file's layout; bump to ignore every existing file
OFF = ("off", "0", "no", "false")


def cache_dir() -> Path | None:
    """Where the cache files go, or None when ``CF_TASKS_DATASET_CACHE`` turns the cache off."""
    given = os.environ.get("CF_TASKS_DATASET_CACHE")
    if given is not None and given.strip().lower() in OFF:
        return None
    if given:
        return Path(given)
    from .default_model import cache_root

    return cache_root() / "datasets"


@lru_cache(maxsize=1)
def builders_digest() -> str:
    """SHA-256 over the path and bytes of every source file and fact table of ``dataset_builders``
    (and of the text helpers the builders use), in a fixed order."""
    import dataset_builders

    from . import text

    root = Path(dataset_builders.__file__).parent
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".json"))
    digest = hashlib.sha256(f"format {FORMAT}\n".encode())
    for path in [*files, Path(text.__file__)]:
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else f"cf_tasks/{path.name}"
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_key(dataset: str, seed: int) -> dict:
    from dataset_builders import version

    return {"dataset": dataset, "version": version(dataset), "seed": int(seed), "builders": builders_digest(),
            "format": FORMAT}


def cache_path(folder: Path, key: dict) -> Path:
    return folder / f"{key['dataset']}-v{key['version']}-seed{key['seed']}-{key['builders'][:16]}.json"


def _items_bytes(items: list[dict]) -> bytes:
    return json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def read_cached(path: Path, key: dict) -> list[dict] | None:
    """The items of a cache file, or None where it is missing, unreadable, of another key, or does
    not match its own checksum (a cut-short or edited file)."""
    try:
        stored = json.loads(path.read_bytes())
        items = stored["items"]
        if stored.get("key") != key or hashlib.sha256(_items_bytes(items)).hexdigest() != stored.get("sha256"):
            return None
        return items
    except (OSError, ValueError, KeyError, TypeError):
        return None


def validated_items(dataset: str, seed: int) -> list[dict]:
    """The items of a validated build of ``dataset`` at ``seed``, as dicts in the schema's field order:
    from the cache where it holds this exact build, else built, validated and cached."""
    from dataset_builders.schema import Item
    from dataset_builders.validate import build_validated

    folder = cache_dir()
    key = cache_key(dataset, seed) if folder is not None else None
    if folder is not None:
        cached = read_cached(cache_path(folder, key), key)
        if cached is not None:
            return [Item(**d).to_dict() for d in cached]
    items = [i.to_dict() for i in build_validated(dataset, seed)]
    if folder is not None:
        data = json.dumps({"key": key, "sha256": hashlib.sha256(_items_bytes(items)).hexdigest(), "items": items},
                          ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write(cache_path(folder, key), data)
        except OSError:
            pass  # a read-only or full cache folder: the build is used as it is
    return items
