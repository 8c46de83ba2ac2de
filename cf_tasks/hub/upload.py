"""Uploading an export to the Hub in one commit, merged into the repository's own card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..files import atomic_write
from .card import merge_card, render_card
from .repo import CARD_FILE, Export, hub_error


def read_remote_card(api, repo_id: str, revision: str) -> str | None:
    """The card at ``revision``, or ``None`` when the repository has none yet."""
    from huggingface_hub.errors import EntryNotFoundError

    try:
        path = api.hf_hub_download(repo_id, CARD_FILE, repo_type="dataset", revision=revision)
    except EntryNotFoundError:
        return None
    return Path(path).read_text(encoding="utf-8")


def upload(out: Path, exp: Export, repo_id: str, token: str, *, private: bool = False,
           revision: str = "main") -> Any:
    """Create ``repo_id`` if needed, merge its card into ``out`` and push the export in one commit.

    Returns the ``CommitInfo`` (its ``oid`` is the revision to pin).
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(token=token)
    step = "create the dataset repository"
    try:
        api.create_repo(repo_id, repo_type="dataset", private=True if private else None, exist_ok=True)
        if revision != "main":
            step = f"create branch {revision!r} in"
            api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
        step = "read the current revision of"
        parent = api.dataset_info(repo_id, revision=revision).sha
        step = "read the dataset card of"
        remote_card = read_remote_card(api, repo_id, parent or revision)
    except OSError as err:  # HfHubHTTPError, connection and offline errors are all OSErrors
        raise hub_error(step, repo_id, err, token) from None
    # The card is merged into the remote one as read at ``parent``; the commit names that parent,
    # so an edit pushed in between makes the commit fail instead of being overwritten.
    atomic_write(Path(out) / CARD_FILE, merge_card(remote_card, render_card(exp, repo_id)).encode("utf-8"))
    operations = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(Path(out) / p)) for p in exp.files()]
    try:
        return api.create_commit(
            repo_id, operations, repo_type="dataset", revision=revision, parent_commit=parent,
            commit_message=f"cf-tasks: publish {', '.join(exp.configs)} (seed {exp.seed})",
        )
    except OSError as err:
        raise hub_error("upload to", repo_id, err, token) from None
