"""A Hub dataset repository of the datasets: its id, the token, the one-line errors, and the layout
(one Parquet file per config, in the split the tasks read, with the features of the in-process build).

The token comes from ``huggingface_hub.get_token()`` (``HF_TOKEN`` or the stored login); it is
handed to ``HfApi`` and never formatted into a message, and error text from the Hub is redacted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from ..errors import CFTasksError

SPLIT = "test"  # the split every task YAML reads (test_split: test)
DEFAULT_CONFIG = "cf_bio"
CARD_FILE = "README.md"
_TOKEN_LIKE = re.compile(r"hf_[A-Za-z0-9]{8,}")


class PublishError(CFTasksError):
    """A problem the user can fix; ``str()`` is one line naming the fix. Exit 2."""

    exit_code = 2


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if it is a valid ``ORG/NAME`` Hub id; else ``PublishError``."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    fix = "pass --repo_id ORG/NAME, e.g. my-org/cf-tasks"
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise PublishError(f"invalid repo id {repo_id!r}: expected ORG/NAME; {fix}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        reason = str(err).strip().splitlines()[0].rstrip(".")
        raise PublishError(f"invalid repo id {repo_id!r}: {reason}; {fix}") from None
    return repo_id


def get_token() -> str:
    """The Hub token from ``HF_TOKEN`` or the stored login; ``PublishError`` when there is none."""
    import huggingface_hub

    token = huggingface_hub.get_token()
    if not token:
        raise PublishError("no Hugging Face token found; set HF_TOKEN or run `hf auth login` "
                           "(or use --dry_run --out DIR to export without uploading)")
    return token


def redact(text: str, token: str | None = None) -> str:
    """``text`` with the token (and anything shaped like a Hub token) replaced by ``***``."""
    if token:
        text = text.replace(token, "***")
    return _TOKEN_LIKE.sub("***", text)


def hub_error(action: str, repo_id: str, err: Exception, token: str | None) -> PublishError:
    """One line for a failed Hub call, without the token."""
    from huggingface_hub.errors import HfHubHTTPError

    status = None
    if isinstance(err, HfHubHTTPError) and getattr(err, "response", None) is not None:
        status = err.response.status_code
    detail = (getattr(err, "server_message", None) or str(err) or type(err).__name__).strip()
    detail = redact(detail.splitlines()[0] if detail else type(err).__name__, token)
    if status in (401, 403):
        fix = "check that HF_TOKEN (or `hf auth login`) is a token with write access to " + repo_id.split("/")[0]
    elif status == 412:
        fix = "the repository changed while publishing; run the command again"
    elif status is None:
        fix = "check the network connection (and that HF_HUB_OFFLINE is not set) and try again"
    else:
        fix = "check the repo id and branch, then try again"
    code = f"HTTP {status}: " if status else ""
    return PublishError(f"could not {action} {repo_id} ({code}{detail}); {fix}")


@dataclass
class ConfigExport:
    name: str
    path: str  # relative to the export folder, with forward slashes
    count: int
    version: int
    relations: dict[str, int]
    num_bytes: int
    download_size: int


@dataclass
class Export:
    out: Path
    seed: int
    configs: dict[str, ConfigExport] = field(default_factory=dict)

    def files(self) -> list[str]:
        return [CARD_FILE, *(c.path for c in self.configs.values())]


def data_path(config: str) -> str:
    return f"data/{config}/{SPLIT}-00000-of-00001.parquet"


def features():
    """The ``datasets.Features`` of every config (the same as the in-process build)."""
    import datasets

    from dataset_builders.serialize import arrow_schema

    return datasets.Features.from_arrow_schema(arrow_schema())

