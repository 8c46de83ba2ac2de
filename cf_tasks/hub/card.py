"""The Hub dataset card: its YAML header and its text, and the merge into a card already there.

The YAML header is a ``huggingface_hub.DatasetCardData`` whose ``configs`` and ``dataset_info``
fields ``datasets`` writes itself (``MetadataConfigs`` and ``DatasetInfosDict``, as ``push_to_hub``
does). An existing card is merged, never overwritten: the user's extra metadata and other configs
are kept, ours are replaced, and only the card body between ``CARD_BEGIN`` and ``CARD_END`` is
rewritten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from .repo import CARD_FILE, DEFAULT_CONFIG, SPLIT, Export, PublishError, features

if TYPE_CHECKING:
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData

CARD_BEGIN = "<!-- cf-tasks:begin -->"
CARD_END = "<!-- cf-tasks:end -->"
PRETTY_NAME = "cf-tasks: knowledge-conflict datasets"
LICENSE = "mit"
LANGUAGE = ["en"]
TASK_CATEGORIES = ["question-answering"]
TAGS = ["knowledge-conflict", "counterfactual", "context-reliance", "lm-eval"]
SIZE_CATEGORIES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                   (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"))

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

    from ..scoring import SCORER_VERSION
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
        f"Each config has one split, `{SPLIT}`. Seed: **{exp.seed}**; built with cf-tasks {tool_version}. "
        f"The cf-tasks tasks score generations on these items with scorer version **{SCORER_VERSION}**; "
        "scores of another scorer version follow other rules and are not comparable.",
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
        f"cf-tasks publish --repo_id {repo_id} --seed {exp.seed} --dry_run --out DIR   # this repository's layout",
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
    return card_text(card_data(exp), card_body(exp, repo_id))


def card_text(data: DatasetCardData, body: str, order: list[str] | None = None) -> str:
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
    return card_text(DatasetCardData(**merged), merge_body(old_body, new_body), order=list(merged))
