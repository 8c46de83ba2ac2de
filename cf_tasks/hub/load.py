"""Loading a published copy: what the lm-eval tasks read when their metadata names a ``hub_repo``.

The copy is a Hub dataset at a pinned ``revision`` (a commit sha or a tag: a branch moves) or a
local folder holding an export (``cf-tasks publish --dry_run --out DIR``). It is checked against
the in-process build's columns and features, and a copy built by another builder version is
named in a warning.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from pathlib import Path

from .repo import SPLIT, PublishError, check_repo_id, features, hub_error

logger = logging.getLogger(__name__)

_SHA = re.compile(r"^[0-9a-f]{40}$")
MOVING_BRANCHES = ("main", "master")


def _is_local(hub_repo: str) -> bool:
    return Path(hub_repo).expanduser().is_dir()


def check_pinned(hub_repo: str, revision: str | None) -> None:
    """``revision`` must be a commit sha or a tag of ``hub_repo``; else ``PublishError``.

    A 40-hex sha is accepted as is; any other name is looked up among the repository's tags
    (a branch moves, so it is refused). With ``HF_HUB_OFFLINE`` the lookup is skipped.
    """
    fix = (f"pin it in --metadata, e.g. '{{\"hub_repo\": \"{hub_repo}\", \"revision\": \"<commit sha>\"}}' "
           f"(the sha `cf-tasks publish` printed, or a tag)")
    if not revision:
        raise PublishError(f"hub_repo {hub_repo!r} needs a pinned revision; {fix}")
    if _SHA.match(revision):
        return
    if revision in MOVING_BRANCHES:
        raise PublishError(f"revision {revision!r} of {hub_repo} is a branch, which can move; {fix}")
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        logger.info("offline: cannot check that %r is a tag of %s", revision, hub_repo)
        return
    tags, branches = repo_refs(hub_repo)
    if revision in tags:
        return
    kind = "a branch, which can move" if revision in branches else "not a tag"
    raise PublishError(f"revision {revision!r} of {hub_repo} is {kind}; {fix}")


@lru_cache(maxsize=32)
def repo_refs(hub_repo: str) -> tuple[frozenset[str], frozenset[str]]:
    """(tags, branches) of a Hub dataset; cached because every task variant loads its dataset."""
    from huggingface_hub import HfApi

    try:
        refs = HfApi().list_repo_refs(hub_repo, repo_type="dataset")
    except OSError as err:
        raise hub_error("list the tags of", hub_repo, err, None) from None
    tags = frozenset({t.name for t in refs.tags} | {t.ref for t in refs.tags})
    return tags, frozenset(b.name for b in refs.branches)


def check_source(hub_repo: str, revision: str | None) -> bool:
    """``PublishError`` unless ``hub_repo`` is a local folder or a Hub repo id pinned at a commit
    or tag (checked before any model loads); True for a local folder."""
    if _is_local(hub_repo):
        return True
    try:
        check_repo_id(hub_repo)
    except PublishError:
        raise PublishError(f"hub_repo {hub_repo!r} is neither a folder nor a Hub repo id ORG/NAME; "
                           "fix hub_repo in --metadata") from None
    check_pinned(hub_repo, revision)
    return False


def load_published(hub_repo: str, dataset: str, revision: str | None):
    """The ``test`` split of config ``dataset`` of a published copy, as a ``datasets.Dataset``.

    ``hub_repo`` is a Hub repo id (``revision`` must be a commit sha or a tag) or a local folder
    holding an export (``cf-tasks publish --dry_run --out DIR``; ``revision`` is then ignored).
    The result has the same features as the in-process build (``cf_tasks.tasks.built_dataset``).
    """
    import datasets

    import dataset_builders

    local = check_source(hub_repo, revision)
    if local and revision:
        logger.info("hub_repo %s is a local folder; revision %r is ignored", hub_repo, revision)
    ds = datasets.load_dataset(str(Path(hub_repo).expanduser()) if local else hub_repo, dataset,
                               revision=None if local else revision, split=SPLIT)
    expected = features()
    if set(ds.column_names) != set(expected):
        missing = sorted(set(expected) - set(ds.column_names))
        extra = sorted(set(ds.column_names) - set(expected))
        raise PublishError(f"{dataset} at {hub_repo}@{revision} has other columns than this cf-tasks "
                           f"(missing {missing}, extra {extra}); pin a revision published by this version "
                           "or build in-process (drop hub_repo)")
    ds = ds.select_columns(list(expected))
    if ds.features != expected:
        ds = ds.cast(expected)
    current = dataset_builders.version(dataset)
    versions = set(ds.unique("version")) if len(ds) else {current}
    if versions != {current}:
        logger.warning("%s at %s@%s was built by builder version(s) %s; this cf-tasks builds version %s",
                       dataset, hub_repo, revision, sorted(versions), current)
    return ds
