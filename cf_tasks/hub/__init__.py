"""Publishing the datasets as a Hugging Face Hub dataset repository, and loading a published copy.

One job per module:

- ``repo``: the repository's id, the token, ``PublishError`` and the layout (``Export``);
- ``export``: every dataset built and written in the Hub layout to a folder, with its card;
- ``card``: the dataset card (``README.md``): rendered, and merged into a card already there;
- ``upload``: the folder sent in one commit, merged into the repository's own card;
- ``load``: a published copy, which the lm-eval tasks read when their metadata names a ``hub_repo``
  (with a pinned ``revision``).

The ``cf-tasks publish`` command that drives them is ``cf_tasks.commands.publish``.
"""

from __future__ import annotations

from .card import (
    CARD_BEGIN, CARD_END, CITATION, FIELD_DOCS, LANGUAGE, LICENSE, PRETTY_NAME, SIZE_CATEGORIES, TAGS, TASK_CATEGORIES,
    card_body, card_data, card_text, citations, dataset_infos, merge_body, merge_card, merge_metadata, metadata_configs,
    render_card, size_category,
)
from .export import export
from .load import MOVING_BRANCHES, check_pinned, check_source, load_published, repo_refs
from .repo import (
    CARD_FILE, DEFAULT_CONFIG, SPLIT, ConfigExport, Export, PublishError, check_repo_id, data_path, features, get_token,
    hub_error, redact,
)
from .upload import read_remote_card, upload

__all__ = [
    "CARD_BEGIN", "CARD_END", "CARD_FILE", "CITATION", "DEFAULT_CONFIG", "FIELD_DOCS", "LANGUAGE", "LICENSE",
    "MOVING_BRANCHES", "PRETTY_NAME", "SIZE_CATEGORIES", "SPLIT", "TAGS", "TASK_CATEGORIES", "ConfigExport", "Export",
    "PublishError", "card_body", "card_data", "card_text", "check_pinned", "check_repo_id", "check_source", "citations", "data_path",
    "dataset_infos", "export", "features", "get_token", "hub_error", "load_published", "merge_body", "merge_card",
    "merge_metadata", "metadata_configs", "read_remote_card", "redact", "render_card", "repo_refs", "size_category",
    "upload",
]
