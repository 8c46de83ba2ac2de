"""Prompt snapshots: the whole rendered prompt for the first item of every task variant.

Regenerate after an intended prompt change (and bump the task's metadata.version) with
``UPDATE_SNAPSHOTS=1 python -m pytest tests/test_prompts.py``.
"""

import os
from pathlib import Path

import pytest

from cf_tasks.registry import task_manager

SNAPSHOTS = Path(__file__).parent / "snapshots"
VARIANTS = ("", "_alpaca", "_tulu", "_adhere", "_closedbook", "_mc")
DATASETS = ("cf_bio", "cf_world_facts", "cf_world_facts_former", "cf_capitals", "cf_capitals_former", "cf_quotes")
TASKS = [d + v for d in DATASETS for v in VARIANTS] + [d + "_agree" for d in DATASETS]  # the twins


@pytest.fixture(scope="module")
def loaded():
    return task_manager().load(TASKS)["tasks"]


def render(task) -> str:
    doc = task.test_docs()[0]
    text = task.doc_to_text(doc)
    if task.OUTPUT_TYPE == "multiple_choice":
        choices = task.doc_to_choice(doc)
        text += "\n--- choices (target {}) ---\n".format(task.doc_to_target(doc)) + "\n".join(choices)
    return text


@pytest.mark.parametrize("name", TASKS)
def test_prompt_snapshot(loaded, name):
    rendered = render(loaded[name])
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(rendered, encoding="utf-8")
    assert rendered == path.read_text(encoding="utf-8")


def test_every_task_declares_a_version(loaded):
    for name, task in loaded.items():
        assert task.config.metadata["version"] >= 1.0, name


def test_closedbook_prompt_has_no_context(loaded):
    for dataset in DATASETS:
        doc = loaded[dataset].test_docs()[0]
        assert doc["context"] in loaded[dataset].doc_to_text(doc)
        assert doc["context"] not in loaded[dataset + "_closedbook"].doc_to_text(doc)
