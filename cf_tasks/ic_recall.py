"""lm-eval hooks for the IC-recall tasks (``task_yamls/ic_recall/``; "Fine-Tuning Dynamics of
In-Context Factual Recall in Transformers").

Metric names, the same strings in YAML, the results JSON and every table:

* ``ic_recall_k{2,4,8}``: ``answer_acc`` (the query's true answer is stated) and ``copy_rate``
  (the answer of the last in-context pair is stated: copying rather than recalling; counted
  whether or not the true answer is stated too);
* ``ic_recall_cot_k{2,4,8}``: ``relation_acc`` (the relation named before "Answer:" is the
  hidden one, and no relation about the same subjects is named too) and ``answer_acc``;
* ``ic_recall_cf``: the generation tasks' ``counterfactual_acc`` (the in-context mapping is
  followed), ``parametric_acc`` (the truth is recalled), ``both_rate``, ``neither_rate`` and
  ``context_preference``.

Only the first non-empty line of a generation is scored (for the chain of thought: the text after
"Answer:" up to the end of its line), so that a model continuing the list with further pairs is
judged on its answer alone.
"""

from __future__ import annotations

import re
from typing import Any

from .tasks import process_results as generation_results
from .tasks import score_doc

ANSWER_MARK = re.compile(r"\banswer\s*:", re.IGNORECASE)
IC_RECALL_METRICS = ("answer_acc", "copy_rate")
COT_METRICS = ("relation_acc", "answer_acc")


def first_line(text: str) -> str:
    """The first line of ``text`` that holds anything but white space ("" when none does)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def split_cot(generation: str) -> tuple[str, str]:
    """(relation part, answer part) of a chain of thought that continues a prompt ending in
    "Relation:". The answer part is the rest of the line after the first "Answer:" ("" if none)."""
    mark = ANSWER_MARK.search(generation)
    if mark is None:
        return generation.strip(), ""
    return generation[: mark.start()].strip(), first_line(generation[mark.end():] + "\n")


def _k_docs(k: int):
    def process_docs(dataset):
        from dataset_builders.relations import pair_count

        return dataset.select([i for i, context in enumerate(dataset["context"]) if pair_count(context) == k])

    process_docs.__name__ = f"docs_k{k}"
    process_docs.__doc__ = f"The items with {k} in-context pairs (the order of the dataset is kept)."
    return process_docs


docs_k2 = _k_docs(2)
docs_k4 = _k_docs(4)
docs_k8 = _k_docs(8)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """``ic_recall``: is the query's answer (or, instead, the copied last pair's answer) stated?"""
    outcome = score_doc(doc, first_line(results[0]))
    return {"answer_acc": float(outcome.parametric), "copy_rate": float(outcome.counterfactual)}


def process_results_cot(doc: dict, results: list[str]) -> dict[str, float]:
    """``ic_recall_cot``: the two decoding steps of the paper, scored separately."""
    from dataset_builders.relations import names_relation

    relation, answer = split_cot(results[0])
    return {
        "relation_acc": float(names_relation(relation, doc["relation"])),
        "answer_acc": float(score_doc(doc, answer).parametric),
    }


def process_results_cf(doc: dict, results: list[str]) -> dict[str, Any]:
    """``ic_recall_cf``: the generation tasks' metrics on the first line of the generation."""
    return generation_results(doc, [first_line(results[0])])
