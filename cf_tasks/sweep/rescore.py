"""Rescoring stored results after a scorer change, from their samples: no model is loaded.

Every result's settings carry ``scorer_version`` (``cf_tasks.scoring.SCORER_VERSION``) for the tasks
cf-tasks scores, so a change of the scoring rules changes the settings hash and the store asks for
new results. Where the store holds a result of the same checkpoint, task and settings but another
scorer version, with the samples of every task it ran (and of the closed-book tasks of its knowledge
probe), the new result is made by running lm-eval again with ``ReplayLM``: a model that answers each
request with the response stored for that task, item and request. lm-eval then filters, scores
(with the new rules), aggregates and computes standard errors as in any run, so a rescored result
is what a fresh evaluation would give on the same generations. Results with ``context_attention``
need the model and are evaluated again instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from lm_eval.api.model import LM

SCORER_KEY = "scorer_version"


# Not a CFTasksError (cf_tasks.errors): control flow, caught by the sweep (which then runs the
# model instead); it never reaches the user.
class NotReplayable(ValueError):
    """A request with no stored response (another item, task or request than the stored run's)."""


class ReplayLM(LM):
    """An lm-eval model that returns the stored responses: ``samples`` maps a task to its
    samples as lm-eval logs them (``doc_id``, ``doc``, ``resps``: per request, its responses)."""

    def __init__(self, samples: dict[str, list[dict]]):
        super().__init__()
        self.by_key = {(task, s["doc_id"]): s for task, rows in samples.items() for s in rows}
        self.replayed = 0

    def _response(self, request):
        sample = self.by_key.get((request.task_name, request.doc_id))
        if sample is None or len(sample.get("resps") or ()) <= request.idx:
            raise NotReplayable(f"{request.task_name}: no stored response for item {request.doc_id} "
                                f"request {request.idx}")
        doc = request.doc if isinstance(request.doc, dict) else {}
        stored = sample.get("doc") if isinstance(sample.get("doc"), dict) else {}
        if doc.get("id") != stored.get("id"):
            raise NotReplayable(f"{request.task_name}: item {request.doc_id} is {doc.get('id')!r} now but "
                                f"{stored.get('id')!r} in the stored samples")
        self.replayed += 1
        return sample["resps"][request.idx][0]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        return [str(self._response(r)) for r in requests]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return [(float(r[0]), bool(r[1])) for r in (self._response(q) for q in requests)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        return [float(self._response(r)) for r in requests]

    # The prompt is not needed to find a response (task, item and request are), so a chat
    # template is applied as plain text.
    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        return json.dumps(chat_history)

    @property
    def tokenizer_name(self) -> str:
        return "replay"

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return ""


def without_scorer(settings: dict) -> dict:
    """The settings less the scorer version, as stored (JSON: tuples are lists)."""
    return json.loads(json.dumps({k: v for k, v in settings.items() if k != SCORER_KEY}, sort_keys=True, default=str))


def read_samples(folder: Path) -> dict[str, list[dict]]:
    """Every samples_<task>.jsonl of a result folder: {task: samples}."""
    found = {}
    for path in sorted(Path(folder).glob("samples_*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            found[path.name[len("samples_"):-len(".jsonl")]] = [json.loads(line) for line in fh if line.strip()]
    return found


def source_for(records: list[dict], settings: dict) -> dict | None:
    """Among a checkpoint's stored records of one task, one that differs from ``settings`` only
    in its scorer version (a result from before the key existed counts as another version) and
    whose folder still holds samples; None when there is none or the result needs the model."""
    wanted = without_scorer(settings)
    if settings.get("attention"):
        return None
    for record in sorted(records, key=lambda r: -r.get("finished", 0)):
        old = record.get("settings") or {}
        if old.get(SCORER_KEY) == settings.get(SCORER_KEY) or without_scorer(old) != wanted:
            continue
        if any(Path(record["dir"]).glob("samples_*.jsonl")):
            return record
    return None


def rescore(record: dict, task: str, tm, limit, apply_chat_template: bool, metadata: dict | None,
            knowledge=None) -> dict:
    """lm-eval's results for ``task`` from the stored samples of ``record``'s folder, scored by
    the rules installed now. Raises NotReplayable when a request has no stored response."""
    from ..evaluate import run_lm_eval

    samples = read_samples(Path(record["dir"]))
    lm = ReplayLM(samples)
    results = run_lm_eval(lm, [task], limit=limit, task_manager=tm, log_samples=True,
                          apply_chat_template=apply_chat_template, metadata=metadata, knowledge=knowledge,
                          keep_probe_samples=True)
    if results is None or not lm.replayed:
        raise NotReplayable(f"{task}: nothing was replayed from {record['dir']}")
    try:
        before = json.loads((Path(record["dir"]) / "results.json").read_text())
    except (OSError, json.JSONDecodeError):
        before = {}
    if isinstance(before.get("config"), dict):
        results["config"] = {**results.get("config", {}), **{k: before["config"][k] for k in ("model", "model_args")
                                                             if k in before["config"]}}
    results["rescored_from"] = {"settings_hash": record.get("settings_hash"),
                                SCORER_KEY: (record.get("settings") or {}).get(SCORER_KEY)}
    return results
