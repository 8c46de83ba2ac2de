"""Publishing the datasets as a Hugging Face Hub dataset repository, and loading a published copy.

``export`` writes the Hub layout to a folder: ``data/<config>/test-00000-of-00001.parquet`` per
dataset (the split the task YAMLs read) and a ``README.md`` card whose YAML ``configs`` maps each
config to its file. The YAML header is a ``huggingface_hub.DatasetCardData`` whose ``configs`` and
``dataset_info`` fields ``datasets`` writes itself (``MetadataConfigs`` and ``DatasetInfosDict``,
as ``push_to_hub`` does). An existing card is merged, never overwritten: the user's extra metadata
and other configs are kept, ours are replaced, and only the card body between ``CARD_BEGIN`` and
``CARD_END`` is rewritten. ``upload`` sends the folder in one commit; ``load_published`` is what
the lm-eval tasks call when their metadata names a ``hub_repo`` (with a pinned ``revision``).

The token comes from ``huggingface_hub.get_token()`` (``HF_TOKEN`` or the stored login); it is
handed to ``HfApi`` and never formatted into a message, and error text from the Hub is redacted.
"""

from __future__ import annotations

import argparse
import io
import logging
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .files import atomic_write

if TYPE_CHECKING:
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData

logger = logging.getLogger(__name__)

SPLIT = "test"  # the split every task YAML reads (test_split: test)
DEFAULT_CONFIG = "cf_bio"
CARD_FILE = "README.md"
CARD_BEGIN = "<!-- cf-tasks:begin -->"
CARD_END = "<!-- cf-tasks:end -->"
PRETTY_NAME = "cf-tasks: knowledge-conflict datasets"
LICENSE = "mit"
LANGUAGE = ["en"]
TASK_CATEGORIES = ["question-answering"]
TAGS = ["knowledge-conflict", "counterfactual", "context-reliance", "lm-eval"]
SIZE_CATEGORIES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                   (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"))
_SHA = re.compile(r"^[0-9a-f]{40}$")
_TOKEN_LIKE = re.compile(r"hf_[A-Za-z0-9]{8,}")
MOVING_BRANCHES = ("main", "master")

CITATION = """\
@inproceedings{goyal2025contextparametric,
  title     = {Context-Parametric Inversion: Why Instruction Finetuning May Not Actually Improve Context Reliance},
  author    = {Goyal, Sachin and Baek, Christina and Kolter, J. Zico and Raghunathan, Aditi},
  booktitle = {The Thirteenth International Conference on Learning Representations (ICLR)},
  year      = {2025}
}"""

# What each column means, for the card's schema table (the types come from schema.FIELDS).
FIELD_DOCS = {
    "id": "unique item id within the config",
    "dataset": "the config name",
    "relation": "the fact relation the item changes (e.g. `person_name`, `country_capital`)",
    "subject": "what the question is about",
    "context": "the passage or instruction shown to the model: counterfactual, or in an `_agree` config one that "
               "states the true answer",
    "question": "the question asked after the context (empty for instruction-only items)",
    "counterfactual_answer": "the answer the context supports (in an `_agree` config: the value the twin replaced, "
                             "absent from its context)",
    "parametric_answer": "the real-world answer a model may have memorised",
    "version": "builder version that produced the item",
    "seed": "builder seed that produced the item",
    "counterfactual_aliases": "other accepted forms of the counterfactual answer",
    "parametric_aliases": "other accepted forms of the parametric answer",
    "answer_position": "where the answer sentence sits in the context: beginning, middle or end",
    "mentions_parametric": "true when the context names the real answer (as a former value; in an `_agree` config "
                           "always, as the answer)",
}


class PublishError(Exception):
    """A problem the user can fix; ``str()`` is one line naming the fix."""


# --------------------------------------------------------------------------- inputs


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if it is a valid ``ORG/NAME`` Hub id; else ``PublishError``."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    fix = "pass --repo-id ORG/NAME, e.g. my-org/cf-tasks"
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
                           "(or use --dry-run --out DIR to export without uploading)")
    return token


def redact(text: str, token: str | None = None) -> str:
    """``text`` with the token (and anything shaped like a Hub token) replaced by ``***``."""
    if token:
        text = text.replace(token, "***")
    return _TOKEN_LIKE.sub("***", text)


# --------------------------------------------------------------------------- export


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


def export(out: Path, seed: int, repo_id: str, existing_card: str | None = None,
           progress: bool = False) -> Export:
    """Build every dataset with ``seed`` and write the Hub layout to ``out``.

    ``existing_card`` is the text of a card to merge into; ``None`` merges with ``out/README.md``
    when the folder already has one. Every file is written atomically.
    """
    import pyarrow.parquet as pq
    from tqdm import tqdm

    import dataset_builders
    from dataset_builders.serialize import to_parquet_bytes
    from dataset_builders.validate import ValidationError, build_validated

    out = Path(out)
    if existing_card is None and (out / CARD_FILE).is_file():
        existing_card = (out / CARD_FILE).read_text(encoding="utf-8")
    result = Export(out=out, seed=seed)
    built = {}
    for name in tqdm(dataset_builders.DATASETS, desc="building", unit="dataset", disable=not progress):
        try:
            built[name] = build_validated(name, seed)
        except ValidationError as err:
            first = str(err).splitlines()[0]
            raise PublishError(f"{first} (see `cf-tasks build --dataset {name}`); "
                               "fix the fact table or builder and publish again") from None
    blobs = {}
    for name, items in built.items():
        blob = to_parquet_bytes(items)
        blobs[name] = blob
        result.configs[name] = ConfigExport(
            name=name, path=data_path(name), count=len(items), version=dataset_builders.version(name),
            relations=dict(sorted(Counter(i.relation for i in items).items())),
            num_bytes=pq.read_table(io.BytesIO(blob)).nbytes, download_size=len(blob),
        )
    # Merge before writing anything, so a malformed existing card leaves the folder untouched.
    card = merge_card(existing_card, render_card(result, repo_id))
    for name, blob in blobs.items():
        path = out / result.configs[name].path
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, blob)
    atomic_write(out / CARD_FILE, card.encode("utf-8"))
    return result


# --------------------------------------------------------------------------- card


def size_category(n: int) -> str:
    for bound, label in SIZE_CATEGORIES:
        if n < bound:
            return label
    return "n>10M"


def metadata_configs(exp: Export) -> MetadataConfigs:
    """Our configs as ``datasets`` reads them from a card: one data file each, ``DEFAULT_CONFIG``
    marked default."""
    from datasets.utils.metadata import MetadataConfigs

    return MetadataConfigs({
        name: {"data_files": [{"split": SPLIT, "path": c.path}], **({"default": True} if name == DEFAULT_CONFIG else {})}
        for name, c in exp.configs.items()
    })


def dataset_infos(exp: Export) -> DatasetInfosDict:
    """Each config's ``datasets.DatasetInfo``: features, split size, bytes."""
    import datasets
    from datasets.info import DatasetInfosDict

    feats = features()
    return DatasetInfosDict({
        name: datasets.DatasetInfo(
            features=feats, download_size=c.download_size, dataset_size=c.num_bytes,
            splits=datasets.SplitDict({SPLIT: datasets.SplitInfo(name=SPLIT, num_bytes=c.num_bytes, num_examples=c.count)}),
        )
        for name, c in exp.configs.items()
    })


def card_data(exp: Export) -> DatasetCardData:
    """Our card metadata as a ``huggingface_hub.DatasetCardData``: license, tags, sizes, and the
    ``configs`` and ``dataset_info`` fields written by ``datasets`` itself."""
    from huggingface_hub import DatasetCardData

    total = sum(c.count for c in exp.configs.values())
    data = DatasetCardData(pretty_name=PRETTY_NAME, license=LICENSE, language=list(LANGUAGE),
                           task_categories=list(TASK_CATEGORIES), size_categories=[size_category(total)],
                           tags=list(TAGS))
    metadata_configs(exp).to_dataset_card_data(data)
    dataset_infos(exp).to_dataset_card_data(data)
    return data


def _md(docstring: str | None) -> str:
    """A builder docstring as Markdown (reST double backticks become single)."""
    return (docstring or "").strip().replace("``", "`")


def card_body(exp: Export, repo_id: str) -> str:
    """The card text between the markers: construction, schema, counts, loading, rebuilding, citation."""
    import importlib.metadata

    import dataset_builders
    from dataset_builders.schema import FIELDS
    from dataset_builders.validate import rules_for_dataset

    try:
        tool_version = importlib.metadata.version("cf-tasks")
    except importlib.metadata.PackageNotFoundError:
        tool_version = "unknown"
    first = next(iter(exp.configs), DEFAULT_CONFIG)
    lines = [
        CARD_BEGIN,
        f"# {PRETTY_NAME}",
        "",
        "Question answering under knowledge conflict: each item pairs a context with a question. "
        "A model that relies on the context gives `counterfactual_answer`; one that relies on what "
        "it memorised gives `parametric_answer`. The counterfactual configs reproduce the evaluation "
        "sets of *Context-Parametric Inversion* (Goyal et al., ICLR 2025); each config's section "
        "below says how it is built. These are the datasets the `cf-tasks` lm-eval tasks read.",
        "",
        "Every config is built deterministically by `cf-tasks` from fact tables (people, countries, "
        "world-fact relations, sayings) with a seeded random generator; the same seed and builder "
        "version give byte-identical files. Each build is validated by named rules, listed in each "
        "config's section: the counterfactual answer is in the context and the parametric answer is "
        "not (the `_former` configs, whose contexts name the true answer as the former value, are kept "
        "apart so that one number has one meaning), no sentence gives the true answer away or "
        "contradicts another, and the counterfactual is possible and not also true. Each "
        "knowledge-conflict config has an agreeing twin, `<config>_agree`: the same items and passages "
        "with the true answer stated and no form of the counterfactual left, a control for reading "
        "(a model that follows a counterfactual context less but still reads the agreeing one prefers "
        "its memory).",
        "",
        "## Configs",
        "",
        f"Each config has one split, `{SPLIT}`. Seed: **{exp.seed}**; built with cf-tasks {tool_version}.",
        "",
        "| config | items | builder version | file |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, c in exp.configs.items():
        lines.append(f"| `{name}`{' (default)' if name == DEFAULT_CONFIG else ''} | {c.count} | {c.version} "
                     f"| `{c.path}` |")
    for name, c in exp.configs.items():
        lines += ["", f"### {name}", "", _md(dataset_builders.builder(name).__doc__), "",
                  "| relation | items |", "| --- | ---: |"]
        lines += [f"| `{relation}` | {n} |" for relation, n in c.relations.items()]
        lines += ["", "Validator rules:", ""]
        lines += [f"- `{rule}`: {description}" for rule, (description, _) in rules_for_dataset(name).items()]
    lines += ["", "## Schema", "", "Every config has the same columns.", "",
              "| field | type | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {kind} | {FIELD_DOCS.get(name, '')} |" for name, kind in FIELDS.items()]
    lines += [
        "", "## Loading", "",
        "Pin a revision (a commit sha or a tag) so that scores stay comparable:", "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'ds = load_dataset("{repo_id}", "{first}", split="{SPLIT}", revision="<commit sha>")',
        "```", "",
        "The lm-eval tasks read this copy instead of building in-process when given its repo id:", "",
        "```bash",
        f"cf-tasks eval --tasks cf_suite --metadata '{{\"hub_repo\": \"{repo_id}\", \"revision\": \"<commit sha>\"}}'",
        "```", "",
        "## Rebuilding", "",
        f"With cf-tasks {tool_version} installed, the same files come from", "",
        "```bash",
        f"cf-tasks build --seed {exp.seed} --format parquet --out DIR   # one Parquet file per config",
        f"cf-tasks publish --repo-id {repo_id} --seed {exp.seed} --dry-run --out DIR   # this repository's layout",
        "```", "",
        "## Citation", "",
        "```bibtex", "\n\n".join(citations(exp)), "```",
        CARD_END,
    ]
    return "\n".join(lines) + "\n"


def citations(exp: Export) -> list[str]:
    """The paper's BibTeX, then any other a builder declares as ``CITATION`` (once each)."""
    import dataset_builders

    found = [CITATION]
    for name in exp.configs:
        extra = getattr(dataset_builders.builder(name), "CITATION", None)
        if extra and extra.strip() not in found:
            found.append(extra.strip())
    return found


def render_card(exp: Export, repo_id: str) -> str:
    return _card_text(card_data(exp), card_body(exp, repo_id))


def _card_text(data: DatasetCardData, body: str, order: list[str] | None = None) -> str:
    """A card's text: ``data`` (a ``DatasetCardData``; keys in ``order`` first) as its YAML header."""
    return f"---\n{data.to_yaml(original_order=order)}\n---\n\n{body.lstrip(chr(10))}"


def _split_card(text: str) -> tuple[dict[str, Any], str]:
    """(metadata, body) of a card; ``PublishError`` when its YAML header does not parse."""
    from huggingface_hub import DatasetCard
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    try:
        # Read the YAML ourselves too: card.data holds the keys in DatasetCardData's order.
        match = REGEX_YAML_BLOCK.search(text)
        metadata = (yaml.safe_load(match.group(2)) if match else None) or {}
        odd = [key for key in metadata if not isinstance(key, str)] if isinstance(metadata, dict) else []
        if odd:
            raise PublishError(f"the existing {CARD_FILE} has a metadata key that is not text ({odd[0]!r}); "
                               "fix its metadata block and publish again")
        card = DatasetCard(text, ignore_metadata_errors=True)
    except (ValueError, yaml.YAMLError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PublishError(f"the existing {CARD_FILE} has YAML that does not parse ({reason}); "
                           "fix or remove its metadata block and publish again") from None
    return metadata, card.text


def _unreadable(field_name: str, err: Exception) -> PublishError:
    reason = " ".join(str(err).split())[:200] or type(err).__name__
    return PublishError(f"the existing {CARD_FILE} has a `{field_name}` field that datasets cannot read ({reason}); "
                        "fix it and publish again")


def merge_metadata(existing: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """``existing`` with our keys updated; other keys, configs and their infos are kept.

    ``configs`` and ``dataset_info`` are merged by ``datasets`` (``MetadataConfigs`` and
    ``DatasetInfosDict.to_dataset_card_data``: same-named entries replaced, the others kept, sorted
    by name), as ``push_to_hub`` merges them. The user's key order is kept, ours are appended.
    """
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData

    data = DatasetCardData(**existing)
    for key, value in ours.items():
        if key in (MetadataConfigs.FIELD_NAME, "dataset_info"):
            continue
        if key == "tags" and isinstance(existing.get(key), list):
            value = existing[key] + [t for t in value if t not in existing[key]]
        data[key] = value
    ours_data = DatasetCardData(**ours)
    try:
        MetadataConfigs.from_dataset_card_data(ours_data).to_dataset_card_data(data)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise _unreadable(MetadataConfigs.FIELD_NAME, err) from None
    try:
        DatasetInfosDict.from_dataset_card_data(ours_data).to_dataset_card_data(data)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise _unreadable("dataset_info", err) from None
    ours_names = {e["config_name"] for e in ours.get(MetadataConfigs.FIELD_NAME, [])}
    # datasets re-reads the user's configs (their `features` become Features objects, which YAML
    # cannot write back): keep each of theirs as it was written.
    theirs = {e["config_name"]: e for e in existing.get(MetadataConfigs.FIELD_NAME) or []}
    configs = [e if e["config_name"] in ours_names else theirs[e["config_name"]] for e in data[MetadataConfigs.FIELD_NAME]]
    if any(e.get("default") for e in configs if e["config_name"] not in ours_names):
        # The user chose another default config: keep it (a card with two defaults does not load).
        configs = [{k: v for k, v in e.items() if k != "default"} if e["config_name"] in ours_names else e
                   for e in configs]
    data[MetadataConfigs.FIELD_NAME] = configs
    merged = data.to_dict()
    order = [*existing, *(k for k in merged if k not in existing)]
    return {k: merged[k] for k in order if k in merged}


def merge_body(existing: str, ours: str) -> str:
    """Replace the marked section of ``existing`` with ``ours``; append it when there is none."""
    ours = ours.strip("\n")
    start, end = existing.find(CARD_BEGIN), existing.find(CARD_END)
    if start != -1 and end > start:
        return existing[:start] + ours + existing[end + len(CARD_END):]
    if not existing.strip():
        return ours + "\n"
    return existing.rstrip("\n") + "\n\n" + ours + "\n"


def merge_card(existing: str | None, ours: str) -> str:
    """The card to write: ``ours`` merged into ``existing`` (see the module docstring)."""
    from huggingface_hub import DatasetCardData

    if not existing or not existing.strip():
        return ours
    old_meta, old_body = _split_card(existing)
    new_meta, new_body = _split_card(ours)
    merged = merge_metadata(old_meta, new_meta)
    return _card_text(DatasetCardData(**merged), merge_body(old_body, new_body), order=list(merged))


# --------------------------------------------------------------------------- upload


def _hub_error(action: str, repo_id: str, err: Exception, token: str | None) -> PublishError:
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
        raise _hub_error(step, repo_id, err, token) from None
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
        raise _hub_error("upload to", repo_id, err, token) from None


# --------------------------------------------------------------------------- loading


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
    tags, branches = _refs(hub_repo)
    if revision in tags:
        return
    kind = "a branch, which can move" if revision in branches else "not a tag"
    raise PublishError(f"revision {revision!r} of {hub_repo} is {kind}; {fix}")


@lru_cache(maxsize=32)
def _refs(hub_repo: str) -> tuple[frozenset[str], frozenset[str]]:
    """(tags, branches) of a Hub dataset; cached because every task variant loads its dataset."""
    from huggingface_hub import HfApi

    try:
        refs = HfApi().list_repo_refs(hub_repo, repo_type="dataset")
    except OSError as err:
        raise _hub_error("list the tags of", hub_repo, err, None) from None
    tags = frozenset({t.name for t in refs.tags} | {t.ref for t in refs.tags})
    return tags, frozenset(b.name for b in refs.branches)


def load_published(hub_repo: str, dataset: str, revision: str | None):
    """The ``test`` split of config ``dataset`` of a published copy, as a ``datasets.Dataset``.

    ``hub_repo`` is a Hub repo id (``revision`` must be a commit sha or a tag) or a local folder
    holding an export (``cf-tasks publish --dry-run --out DIR``; ``revision`` is then ignored).
    The result has the same features as the in-process build (``cf_tasks.tasks.built_dataset``).
    """
    import datasets

    import dataset_builders

    local = _is_local(hub_repo)
    if not local:
        try:
            check_repo_id(hub_repo)
        except PublishError:
            raise PublishError(f"hub_repo {hub_repo!r} is neither a folder nor a Hub repo id ORG/NAME; "
                               "fix hub_repo in --metadata") from None
        check_pinned(hub_repo, revision)
    elif revision:
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


# --------------------------------------------------------------------------- command line


def cmd_publish(args: argparse.Namespace) -> int:
    from .cli import UsageError, _writable_dir

    try:
        check_repo_id(args.repo_id)
        if args.dry_run and not args.out:
            raise PublishError("--dry-run needs --out DIR, the folder to export to")
        token = None if args.dry_run else get_token()
    except PublishError as err:
        raise UsageError(str(err)) from None
    try:
        with tempfile.TemporaryDirectory(prefix="cf-tasks-publish-") as tmp:
            out = _writable_dir(args.out) if args.out else Path(tmp)
            # A dry run merges into the card already in --out; an upload merges into the remote card.
            exp = export(out, args.seed, args.repo_id, progress=not args.quiet,
                         existing_card=None if args.dry_run else "")
            commit = None
            if not args.dry_run:
                commit = upload(out, exp, args.repo_id, token, private=args.private, revision=args.revision)
    except PublishError as err:
        raise UsageError(redact(str(err), token)) from None
    if not args.quiet:
        for name, c in exp.configs.items():
            print(f"{name:16s} {c.count:6d} items  v{c.version}  {c.path}")
        if commit is None:
            print(f"exported {len(exp.configs)} config(s) with seed {args.seed} to {out} "
                  f"(check with: datasets.load_dataset({str(out)!r}, {DEFAULT_CONFIG!r}))")
        else:
            sha = getattr(commit, "oid", None) or "<commit sha>"
            print(f"published {len(exp.configs)} config(s) with seed {args.seed} to "
                  f"https://huggingface.co/datasets/{args.repo_id} ({args.revision} @ {sha})")
            print(f"evaluate it with: --metadata '{{\"hub_repo\": \"{args.repo_id}\", \"revision\": \"{sha}\"}}'")
    return 0


def add_publish_parser(sub) -> None:
    """Register ``cf-tasks publish`` on the CLI's subparsers."""
    from dataset_builders import DEFAULT_SEED

    p = sub.add_parser("publish", help="build every dataset and publish it as a Hub dataset repository")
    p.add_argument("--repo-id", required=True, help="Hub dataset repository, ORG/NAME")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--revision", default="main", help="branch to commit to (default main)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"builder seed (default {DEFAULT_SEED})")
    p.add_argument("--dry-run", action="store_true", help="write the repository layout to --out; upload nothing")
    p.add_argument("--out", default=None, help="folder for the layout (required with --dry-run)")
    p.add_argument("--quiet", action="store_true", help="no progress or summary output")
    p.set_defaults(func=cmd_publish)
