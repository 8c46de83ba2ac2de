"""The knowledge probe: which items a model knows, and the metrics conditioned on it.

A counterfactual context is a conflict only where the model knows the fact it contradicts. An item
is *known* when the model's closed-book answer (the ``<dataset>_closedbook`` prompt, the question
without its passage) is scored parametric-correct. Per knowledge-conflict (KC) task:

- ``known_rate``: the share of items known;
- ``known_counterfactual_acc``, ``known_parametric_acc``: accuracies on the known items (real
  conflicts: does the context win over memory?);
- ``unknown_counterfactual_acc``: counterfactual accuracy on the items not known (no conflict).

Two ways to get them, with the same numbers: the lm-eval task ``<task>_known``
(``cf_tasks.tasks.KnownTask``: both prompts on each item), and ``cf-tasks eval`` / ``sweep``, which
run ``<dataset>_closedbook`` beside the task in the same lm-eval pass and merge its per-item answers
into the task's results (``Probe``, ``add_knowledge``). Per item, a conditioned metric is left out
where its condition does not hold, and lm-eval 0.4.13 averages each metric over the items that
report it, with the closed-form standard error of a mean (``mean_stderr``); the merge does the same.

Also the names of the agreeing twins (``<dataset>_agree``, metric ``agree_acc``) the sweep runs
beside each KC task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .registry import KC_DATASETS, KC_TASKS, KC_VARIANTS, twin_name

__all__ = ["AGREE_METRIC", "KC_DATASETS", "KC_TASKS", "KC_VARIANTS", "KNOWN_METRICS", "Probe", "add_knowledge",
           "agree_twin", "closedbook_of", "conditioned", "dataset_of", "probe_for"]

# metric -> higher_is_better (as the task's own counterfactual_acc / parametric_acc)
KNOWN_METRICS = {"known_rate": True, "known_counterfactual_acc": True, "known_parametric_acc": False,
                 "unknown_counterfactual_acc": True}
AGREE_METRIC = "agree_acc"


def dataset_of(task: str) -> str | None:
    """The dataset of a KC task (``cf_bio_alpaca`` -> ``cf_bio``); None for any other task."""
    return KC_TASKS.get(task)


def closedbook_of(task: str) -> str | None:
    """The closed-book task that probes a KC task's items; None for any other task."""
    dataset = dataset_of(task)
    return f"{dataset}_closedbook" if dataset else None


def agree_twin(task: str, available: Iterable[str]) -> str | None:
    """A KC task's agreeing twin among ``available`` task names: ``<task>_agree`` (the same prompt)
    where it exists, else ``<dataset>_agree``; None where neither exists (or not a KC task)."""
    dataset = dataset_of(task)
    if dataset is None:
        return None
    names = set(available)
    return next((t for t in (twin_name(task), twin_name(dataset)) if t in names), None)


def conditioned(counterfactual: float, parametric: float, known: bool) -> dict[str, float]:
    """One item's conditioned metrics: a metric whose condition does not hold is left out."""
    item = {"known_rate": float(known)}
    if known:
        item["known_counterfactual_acc"] = float(counterfactual)
        item["known_parametric_acc"] = float(parametric)
    else:
        item["unknown_counterfactual_acc"] = float(counterfactual)
    return item


@dataclass(frozen=True)
class Probe:
    """The closed-book runs of one lm-eval pass: ``pairs`` maps each KC task of the pass to its
    closed-book task; ``extra`` are the closed-book tasks the pass runs only for the probe (their
    results are dropped after the merge)."""

    pairs: dict[str, str]
    extra: tuple[str, ...]


def probe_for(members: Iterable[str]) -> Probe | None:
    """The probe of a pass whose leaf tasks are ``members``; None when none of them is a KC task."""
    members = list(members)
    pairs = {t: closedbook_of(t) for t in members if closedbook_of(t)}
    if not pairs:
        return None
    extra = tuple(sorted({c for c in pairs.values() if c not in members}))
    return Probe(pairs=dict(sorted(pairs.items())), extra=extra)


def add_knowledge(results: dict, probe: Probe) -> dict:
    """Merge the closed-book answers into each KC task's results (``results`` from
    ``simple_evaluate(log_samples=True)``): the conditioned metrics with their standard errors
    in ``results``, the per-item values in the task's samples (``known_rate`` is 1.0 for a known
    item), ``higher_is_better``. Items are paired by ``doc_id`` and checked by the doc's ``id``."""
    from lm_eval.api.metrics import mean, mean_stderr

    samples = results.get("samples") or {}
    for task, closedbook in probe.pairs.items():
        if task not in results.get("results", {}):
            continue
        closed = {s["doc_id"]: s for s in samples.get(closedbook, [])}
        values: dict[str, list[float]] = {}
        own = samples.get(task, [])
        for sample in own:
            other = closed.get(sample["doc_id"])
            if other is None or other["doc"].get("id") != sample["doc"].get("id"):
                raise ValueError(f"{task}: item {sample['doc_id']} has no closed-book answer in {closedbook} "
                                 "(the two tasks must run on the same items)")
            item = conditioned(sample["counterfactual_acc"], sample["parametric_acc"], other["parametric_acc"] == 1.0)
            sample.update(item)
            sample["metrics"] = [*sample.get("metrics", []), *item]
            for metric, value in item.items():
                values.setdefault(metric, []).append(value)
        suffix = own[0].get("filter", "none") if own else "none"
        entry = results["results"][task]
        for metric in KNOWN_METRICS:
            xs = values.get(metric)
            if xs:  # as lm-eval: a metric no item reports is absent; one item has no stderr
                entry[f"{metric},{suffix}"] = mean(xs)
                entry[f"{metric}_stderr,{suffix}"] = mean_stderr(xs) if len(xs) > 1 else "N/A"
        results.setdefault("higher_is_better", {}).setdefault(task, {}).update(KNOWN_METRICS)
    return results
