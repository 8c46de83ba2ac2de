"""The scorer against a careful reader, on real generations of the default model.

tests/data/real_generations.jsonl holds generations of SmolLM2-135M-Instruct on every generation
task (made by tests/make_real_generations.py), each with the doc fields the scorer reads and the
label a careful reader gave it: ``expected`` is the answer the generation gives ("context",
"parametric", "both" or "neither"), ``note`` says why for the hard cases. The rules the reader
applied are the scorer's: an answer counts when it is given as the answer; a mention the model
rejects, or a word used outside the saying it was asked to complete, is not an answer.
"""

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from cf_tasks.ic_recall import process_results_cf
from cf_tasks.scoring import LABELS
from cf_tasks.tasks import process_results

DATA = Path(__file__).parent / "data" / "real_generations.jsonl"
ROWS = [json.loads(line) for line in DATA.open(encoding="utf-8")]
MIN_OVERALL = 0.97
MIN_PER_FAMILY = 0.95
GENERATION_TASKS = {f + v for f in ("cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes")
                    for v in ("", "_alpaca", "_adhere", "_tulu")} | {"ic_recall_cf"}


def scored_label(row: dict) -> str:
    """The label the task's own ``process_results`` hook gives the generation."""
    hook = process_results_cf if row["family"] == "ic_recall_cf" else process_results
    return hook(row, [row["generation"]])["context_preference"]


def agreement() -> tuple[dict[str, float], float, list[str]]:
    agree, total, misses = Counter(), Counter(), []
    for row in ROWS:
        got = scored_label(row)
        total[row["family"]] += 1
        agree[row["family"]] += got == row["expected"]
        if got != row["expected"]:
            misses.append(f"{row['task']} {row['id']}: read {row['expected']}, scored {got}: {row['generation']!r}")
    per_family = {f: agree[f] / total[f] for f in sorted(total)}
    return per_family, sum(agree.values()) / sum(total.values()), misses


def test_the_labelled_set_covers_every_generation_task_and_the_hard_cases():
    assert len(ROWS) >= 300
    assert all(r["expected"] in LABELS for r in ROWS), "label every row (expected: one of LABELS)"
    assert {r["task"] for r in ROWS} == GENERATION_TASKS
    notes = defaultdict(int)
    for r in ROWS:
        notes[r["family"]] += bool(r["note"])
    assert sum(notes.values()) >= 50  # hard cases are over-represented and each one is explained
    assert sum(r["family"] == "cf_quotes" for r in ROWS) >= 100


def test_scorer_agrees_with_the_reader():
    per_family, overall, misses = agreement()
    report = "\n".join([f"{f}: {a:.1%}" for f, a in per_family.items()] + [f"overall: {overall:.1%}"] + misses)
    assert overall >= MIN_OVERALL, report
    for family, value in per_family.items():
        assert value >= MIN_PER_FAMILY, report


@pytest.mark.parametrize("label", LABELS)
def test_every_label_occurs(label):
    assert any(r["expected"] == label for r in ROWS)
