"""Per-item outcomes of the stored lm-eval samples, and the per-item table (items.csv).

Every result the sweep stores keeps its samples (``store/<checkpoint id>/<task>/<settings>/
samples_<task>.jsonl``); items are paired across checkpoints by the doc's ``id`` field. The paired
tests of the summary (``stats``) read them through ``ItemSource``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..known import AGREE_METRIC

OUTCOMES = ("counterfactual", "parametric", "both", "neither")
KNOWN_KEYS = ("known", "known_rate")  # a sample's per-item value of the knowledge probe, where present
ATTENTION_KEY = "context_attention"
ITEM_COLUMNS = ("checkpoint", "step", "task", "item_id", "relation", "outcome", "known", "context_attention", "run",
                "settings", "checkpoint_id")


# ---------------------------------------------------------------- per-item outcomes
def outcome(sample: dict) -> str | None:
    """counterfactual / parametric / both / neither: which answer an item's output gives.
    Generation tasks: from ``counterfactual_acc`` and ``parametric_acc``; ``_mc`` tasks: the
    likelier choice; ``_agree`` twins (one true answer, stated by the passage): ``both`` when
    given, else ``neither``. None for other tasks."""
    if "counterfactual_acc" in sample and "parametric_acc" in sample:
        cf, pa = bool(sample["counterfactual_acc"]), bool(sample["parametric_acc"])
        return OUTCOMES[[cf and not pa, pa and not cf, cf and pa, True].index(True)]
    if "context_prob" in sample and "acc" in sample:
        return "counterfactual" if sample["acc"] else "parametric"
    if AGREE_METRIC in sample:
        return "both" if sample[AGREE_METRIC] else "neither"
    return None


def item_id(sample: dict) -> str:
    doc = sample.get("doc") or {}
    return str(doc["id"]) if isinstance(doc, dict) and doc.get("id") is not None else f"doc{sample.get('doc_id')}"


def _known(sample: dict):
    for key in KNOWN_KEYS:
        if sample.get(key) is not None:
            return bool(sample[key])
    return None


def read_samples(path: Path) -> list[dict]:
    """One record per item (the first sample of each item id) of a samples_<task>.jsonl."""
    items, seen = [], set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            sample = json.loads(line)
            iid = item_id(sample)
            if iid in seen:
                continue
            seen.add(iid)
            doc = sample.get("doc") if isinstance(sample.get("doc"), dict) else {}
            items.append({"item_id": iid, "relation": doc.get("relation"), "outcome": outcome(sample),
                          "known": _known(sample), "context_attention": sample.get(ATTENTION_KEY),
                          "values": {k: v for k, v in sample.items() if isinstance(v, (int, float)) and k != "doc_id"
                                     and not math.isnan(v)}})
    return items


class ItemSource:
    """The samples of every result in the stores of some output folders, read once each."""

    def __init__(self, outs: list[Path]):
        self.outs = list(dict.fromkeys(Path(o) for o in outs))
        self.cache: dict[tuple, list[dict] | None] = {}

    def path(self, checkpoint_id: str | None, task: str, settings: str | None) -> Path | None:
        if not checkpoint_id or not settings:
            return None
        from .store import STORE

        for out in self.outs:
            for found in sorted((out / STORE / checkpoint_id).glob(f"*/{settings}/samples_{task}.jsonl")):
                return found
        return None

    def items(self, checkpoint_id: str | None, task: str, settings: str | None) -> list[dict] | None:
        key = (checkpoint_id, task, settings)
        if key not in self.cache:
            path = self.path(checkpoint_id, task, settings)
            try:
                self.cache[key] = read_samples(path) if path else None
            except (OSError, ValueError):  # damaged: its store sets it aside; no paired test on it meanwhile
                self.cache[key] = None
        return self.cache[key]

    def correct(self, checkpoint_id: str | None, task: str, settings: str | None, metric: str) -> dict[str, bool] | None:
        items = self.items(checkpoint_id, task, settings)
        if items is None:
            return None
        return {i["item_id"]: bool(i["values"][metric]) for i in items if metric in i["values"]}

    def values(self, checkpoint_id: str | None, task: str, settings: str | None, metric: str) -> dict[str, float] | None:
        """Each item's value of ``metric`` (0/1 or graded), by item id; None without samples."""
        items = self.items(checkpoint_id, task, settings)
        if items is None:
            return None
        return {i["item_id"]: float(i["values"][metric]) for i in items if metric in i["values"]}


# ---------------------------------------------------------------- items.csv
def item_rows(rows: list[dict], outs: list[Path]) -> list[dict]:
    """One row per checkpoint x task x item of the tasks with an outcome label, from the samples
    in the stores of ``outs``; ``known`` and ``context_attention`` empty where not measured."""
    source = ItemSource(list(outs))
    found, seen = [], set()
    for r in rows:
        key = (r.get("run"), r["checkpoint"], r["step"], r["task"], r.get("settings"), r.get("checkpoint_id"))
        if key in seen:
            continue
        seen.add(key)
        for item in source.items(r.get("checkpoint_id"), r["task"], r.get("settings")) or ():
            if item["outcome"] is None:
                continue
            found.append({"checkpoint": r["checkpoint"], "step": r["step"], "task": r["task"], **{
                k: item[k] for k in ("item_id", "relation", "outcome", "known", "context_attention")},
                "run": r.get("run"), "settings": r.get("settings"), "checkpoint_id": r.get("checkpoint_id")})
    found.sort(key=lambda x: (x["step"], x["checkpoint"], x["run"] or "", x["task"], x["settings"] or "", x["item_id"]))
    return found
