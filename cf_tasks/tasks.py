"""lm-eval hooks for the task YAMLs in ``task_yamls/``: dataset loading, per-item scoring and the
aggregations the YAMLs name with ``!function cf_tasks.tasks.<name>``.

Metric names are the same strings in YAML, the results JSON and every table:
``counterfactual_acc``, ``parametric_acc``, ``both_rate``, ``neither_rate``,
``context_preference`` for generation tasks; ``acc``, ``context_prob``, ``acc_norm`` and
``context_prob_norm`` for the ``_mc`` ones; ``agree_acc`` for the agreeing twins (``<dataset>_agree``);
and the knowledge probe's ``known_rate``,
``known_counterfactual_acc``, ``known_parametric_acc``, ``unknown_counterfactual_acc`` for the
``_known`` ones (``KnownTask``, ``cf_tasks/known.py``).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from functools import lru_cache
from typing import Any

import yaml
from lm_eval.api.task import ConfigurableTask

from .known import KNOWN_METRICS, conditioned
from .scoring import score, score_quote
from .text import contains

GENERATION_METRICS = ("counterfactual_acc", "parametric_acc", "both_rate", "neither_rate", "context_preference")
MC_METRICS = ("acc", "context_prob", "acc_norm", "context_prob_norm")
AGREE_METRICS = ("agree_acc",)
PERSON_RELATIONS = frozenset({"person_name"})
QUOTE_RELATIONS = frozenset({"quote_ending"})
PAIR_LINE = re.compile(r"\s*([^:\n]{1,80}):[ \t]*(.*)", re.DOTALL)


METADATA_KEYS = {"seed": "the builder seed, a whole number, e.g. {\"seed\": 7}",
                 "hub_repo": "a published copy, ORG/NAME or a local folder",
                 "revision": "the commit or tag of hub_repo",
                 "split": "one part of the subject split, \"heldout\" or \"train\""}
TASK_OWN_KEYS = ("dataset", "version")  # each task's YAML sets them


def check_metadata(metadata: dict | None, only_ours: bool, values: bool = True) -> None:
    """The ``--metadata`` a run passes to every task, checked before any model loads: (``values``)
    the types of the keys ``load`` reads and no key a task sets itself, and (``only_ours``: every
    task of the run is one of ours) no key that no task reads. ``ValueError`` with one line naming
    the key and the fix. ``values=False``: the values were checked already, only the keys are."""
    for key, value in (metadata or {}).items():
        if values:
            _check_metadata_value(key, value)
        if key not in METADATA_KEYS and only_ours:
            close = difflib.get_close_matches(key, list(METADATA_KEYS), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ValueError(f"--metadata {key}: no task of this run reads it; {hint}the tasks read "
                             f"{', '.join(METADATA_KEYS)}")


def _check_metadata_value(key: str, value: Any) -> None:
    if key in TASK_OWN_KEYS:
        raise ValueError(f"--metadata {key}: set by each task itself; remove it")
    if key == "seed" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"--metadata seed {json.dumps(value)}: pass a whole number, e.g. {{\"seed\": 7}}")
    if key in ("hub_repo", "revision") and not (isinstance(value, str) and value.strip()):
        raise ValueError(f"--metadata {key} {json.dumps(value)}: pass text ({METADATA_KEYS[key]})")
    if key == "split":
        from dataset_builders.split import check_split

        check_split(value)


def load(dataset: str, seed: int | None = None, hub_repo: str | None = None, revision: str | None = None,
         version: float | None = None, split: str | None = None, **_metadata: Any):
    """The ``test`` split of a dataset: built in-process (default) or read from a Hub copy.

    lm-eval passes the task's ``metadata`` (merged with ``--metadata``) as keyword arguments;
    keys other than these are ignored. The task's ``version`` must be its builder's ``VERSION``:
    the two move together, so lm-eval's ``versions`` name the dataset's version.

    ``split`` keeps the items whose subject lies in one part of the subject split
    (``dataset_builders.split``): ``"heldout"`` (the subjects a fine-tuning study never trains on),
    ``"train"``, or None (every item). The build itself, and so its bytes, stays the same.
    """
    import datasets

    from dataset_builders import DEFAULT_SEED
    from dataset_builders import version as builder_version
    from dataset_builders.split import check_split, in_part

    split = check_split(split)

    if version is not None and float(version) != float(builder_version(dataset)):
        raise ValueError(
            f"{dataset}: task metadata.version {version} but the dataset builder is version "
            f"{builder_version(dataset)}; bump task_yamls and dataset_builders together"
        )

    if hub_repo:
        from .hub import load_published

        ds = load_published(hub_repo, dataset, revision)
    else:
        ds = built_dataset(dataset, DEFAULT_SEED if seed is None else int(seed))
    if split is not None:
        ds = ds.select(in_part(dataset, list(ds["subject"]), split))
    return datasets.DatasetDict({"test": ds})


@lru_cache(maxsize=32)
def built_dataset(dataset: str, seed: int):
    """A validated build as a ``datasets.Dataset``; variants of a task share one build, and later
    processes read it from the dataset cache (``dataset_cache``)."""
    import datasets

    from dataset_builders.serialize import arrow_schema

    from .dataset_cache import validated_items

    features = datasets.Features.from_arrow_schema(arrow_schema())
    return datasets.Dataset.from_list(validated_items(dataset, seed), features=features)


def score_doc(doc: dict, generation: str):
    """Which answer ``generation`` gives for ``doc``: a completion of the saying for the quote
    tasks (whose ``question`` is the saying without its last word), a stated answer otherwise."""
    if doc.get("relation") in QUOTE_RELATIONS:
        return score_quote(generation, doc["question"], doc["counterfactual_answer"], doc["parametric_answer"],
                           instruction=doc.get("context") or "",
                           counterfactual_aliases=doc.get("counterfactual_aliases") or (),
                           parametric_aliases=doc.get("parametric_aliases") or ())
    return score(
        _pair_answer(doc, generation),
        doc["counterfactual_answer"],
        doc["parametric_answer"],
        doc.get("counterfactual_aliases") or (),
        doc.get("parametric_aliases") or (),
        person=doc.get("relation") in PERSON_RELATIONS,
    )


def _pair_answer(doc: dict, generation: str) -> str:
    """For a "Subject:" query (the IC-recall tasks), the part of a "Subject: answer" line that
    answers the query: a pair for another subject ("Guatemala: Dzongkha" after "Ecuador:") answers
    nothing about the query."""
    query = doc.get("question") or ""
    pair = PAIR_LINE.match(generation)
    if not query.rstrip().endswith(":") or pair is None:
        return generation
    label = pair.group(1)
    if contains(label, query.rstrip().rstrip(":")) or contains(label, "answer"):  # "The answer is: ..."
        return pair.group(2)
    return ""


def process_results(doc: dict, results: list[str]) -> dict[str, Any]:
    """Generation tasks: which answer the (first) generation states."""
    outcome = score_doc(doc, results[0])
    label = outcome.label
    return {
        "counterfactual_acc": float(outcome.counterfactual),
        "parametric_acc": float(outcome.parametric),
        "both_rate": float(label == "both"),
        "neither_rate": float(label == "neither"),
        "context_preference": label,
    }


def process_results_agree(doc: dict, results: list[str]) -> dict[str, float]:
    """Agreeing twins (``<dataset>_agree``): the passage states the true answer, and ``agree_acc`` is
    1 when the generation gives it (the same rules as ``parametric_acc``)."""
    return {"agree_acc": float(score_doc(doc, results[0]).parametric)}


def context_preference(labels: list[str]) -> float:
    """context-only / (context-only + parametric-only); NaN when neither ever occurs alone."""
    context_only = sum(1 for label in labels if label == "context")
    parametric_only = sum(1 for label in labels if label == "parametric")
    total = context_only + parametric_only
    return context_only / total if total else float("nan")


def process_results_mc(doc: dict, results: list[tuple[float, bool]]) -> dict[str, float]:
    """Log-likelihood variants: choice 0 is the counterfactual answer, choice 1 the parametric one.

    ``context_prob`` is p_c / (p_c + p_a), the ratio M_C of the paper's Theorem 1. The two answers
    of an item differ in length, so ``acc_norm`` and ``context_prob_norm`` compare log-likelihoods
    per character of the answer, as lm-eval's ``acc_norm`` does (``len`` of the choice string).
    """
    log_c, log_a = results[0][0], results[1][0]
    norm_c = log_c / _answer_length(doc["counterfactual_answer"])
    norm_a = log_a / _answer_length(doc["parametric_answer"])
    return {
        "acc": float(log_c > log_a),
        "context_prob": _sigmoid(log_c - log_a),
        "acc_norm": float(norm_c > norm_a),
        "context_prob_norm": _sigmoid(norm_c - norm_a),
    }


def _answer_length(answer: str) -> int:
    return max(1, len(answer))


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


class KnownTask(ConfigurableTask):
    """``<task>_known``: the task's prompt and the closed-book prompt on each item, one lm-eval task.

    The YAML is the task's own (``include:`` of its dataset and prompt files) plus
    ``_prompts/<family>_known_yaml``, which names this class and ``closedbook_prompt``: the prompt
    file (in ``task_yamls/_prompts``) of the dataset's ``_closedbook`` task. Each item gets two
    generation requests: idx 0 with the task's prompt, idx 1 with the closed-book prompt, both
    rendered by lm-eval's own ``fewshot_context`` (so ``--apply_chat_template``, a system
    instruction and ``--limit`` treat them as the plain tasks). ``process_results`` scores the first
    as the task does and the second as the closed-book task does; an item is known when the
    closed-book answer is parametric-correct (``cf_tasks.known``).
    """

    def __init__(self, config: dict | None = None) -> None:
        config = dict(config or {})
        config.pop("class", None)
        prompt_file = config.pop("closedbook_prompt", None)
        if not prompt_file:
            raise ValueError(f"{config.get('task')}: a _known task needs closedbook_prompt (a file of "
                             "task_yamls/_prompts); include _prompts/qa_known_yaml or _prompts/quote_known_yaml")
        from .registry import task_yamls_path

        self.closedbook_doc_to_text = yaml.safe_load(
            (task_yamls_path() / "_prompts" / prompt_file).read_text(encoding="utf-8"))["doc_to_text"]
        config["metric_list"] = [*config.get("metric_list", []), *(
            {"metric": m, "aggregation": "mean", "higher_is_better": h} for m, h in KNOWN_METRICS.items())]
        self._closed_book_turn = False
        super().__init__(config=config)

    def doc_to_text(self, doc, doc_to_text=None):
        if self._closed_book_turn:
            doc_to_text = self.closedbook_doc_to_text
        return super().doc_to_text(doc, doc_to_text)

    def fewshot_context(self, doc, num_fewshot, **kwargs):
        """Both prompts of the item: [the task's, the closed-book one]."""
        own = super().fewshot_context(doc, num_fewshot, **kwargs)
        self._closed_book_turn = True
        try:
            closed = super().fewshot_context(doc, num_fewshot, **kwargs)
        finally:
            self._closed_book_turn = False
        return [own, closed]

    def construct_requests(self, doc, ctx, **kwargs):
        requests = []
        for idx, prompt in enumerate(ctx):
            request = super().construct_requests(doc, prompt, **kwargs)
            request.idx = idx
            requests.append(request)
        return requests

    def process_results(self, doc: dict, results: list[str]) -> dict[str, Any]:
        own = process_results(doc, results[:1])
        closed = process_results(doc, results[1:])
        return {**own, **conditioned(own["counterfactual_acc"], own["parametric_acc"], closed["parametric_acc"] == 1.0)}
