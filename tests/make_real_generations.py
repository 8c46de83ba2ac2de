"""Regenerate the real generations behind tests/data/real_generations.jsonl.

Runs the default model (SmolLM2-135M-Instruct) through lm-eval as ``cf-tasks eval`` does (hf
backend, float32, chat template, greedy decoding, batch size 8) on a seeded sample of the items of
every generation task, and writes one JSON line per generation with the doc fields the scorer
needs. Labels are not made here: they are a careful reader's, kept in the data file, and carried
over for every (task, id, generation) that comes back unchanged; a new or changed generation gets
``"expected": null`` and must be read and labelled by hand (or its row dropped) before
tests/test_scoring_real.py passes again. The rows keep every doc field the scorer reads, so the
labelled set stays valid when the datasets are rebuilt; the current file was made from the
version-1 datasets (seed 1234) with ``--per_task 30`` (510 generations).

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python tests/make_real_generations.py [--per_task 30]

The sample over-represents hard cases: half of each quote task's items are sayings with a negation
word ("A rolling stone gathers no moss"), and half of the cf_world_facts items name the true
answer in their context. lm-eval's ``samples`` (not ``--limit``) picks the items, so they vary.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).parent / "data" / "real_generations.jsonl"
FAMILIES = ("cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes")
VARIANTS = ("", "_alpaca", "_adhere", "_tulu")
TASKS = tuple(f + v for f in FAMILIES for v in VARIANTS) + ("ic_recall_cf",)
DOC_FIELDS = ("id", "relation", "subject", "context", "question", "counterfactual_answer", "parametric_answer",
              "counterfactual_aliases", "parametric_aliases")
NEGATION = frozenset({"no", "not", "never", "nor", "none", "nothing"})
SEED = 16
BATCH_SIZE = 8


def family(task: str) -> str:
    return next((f for f in FAMILIES if task == f or task.startswith(f + "_")), task)


def _hard(doc: dict) -> bool:
    if doc["relation"] == "quote_ending":
        words = doc["subject"].lower().replace(",", " ").split()
        return any(w in NEGATION or w.endswith("n't") for w in words)
    return bool(doc.get("mentions_parametric"))


def sample_indices(task: str, docs: list[dict], n: int) -> list[int]:
    """``n`` indices of ``docs``, half of them hard cases where the dataset has any."""
    rng = random.Random(f"{SEED}-{task}")
    hard = [i for i, d in enumerate(docs) if _hard(d)]
    easy = [i for i, d in enumerate(docs) if not _hard(d)]
    k = min(len(hard), n // 2)
    picked = rng.sample(hard, k) + rng.sample(easy, min(len(easy), n - k))
    return sorted(picked)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per_task", type=int, default=30, help="items per task (ic_recall_cf and quote tasks too)")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--output_path", type=Path, default=OUT)
    args = p.parse_args(argv)

    import lm_eval
    import torch

    from cf_tasks.default_model import default_model_path
    from cf_tasks.files import atomic_write
    from cf_tasks.registry import task_manager
    from cf_tasks.tasks import built_dataset
    from dataset_builders import DEFAULT_SEED

    tasks = [t for t in args.tasks.split(",") if t]
    samples = {}
    for task in tasks:
        docs = built_dataset(family(task), DEFAULT_SEED).to_list()
        samples[task] = sample_indices(task, docs, args.per_task)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={default_model_path()},dtype=float32,device={device}",
        tasks=tasks, samples=samples, batch_size=BATCH_SIZE, apply_chat_template=True, log_samples=True,
        task_manager=task_manager(),
    )
    old = {}
    if args.output_path.is_file():
        for line in args.output_path.open(encoding="utf-8"):
            row = json.loads(line)
            old[(row["task"], row["id"], row["generation"])] = row
    rows = []
    for task in tasks:
        for s in sorted(results["samples"][task], key=lambda s: s["doc_id"]):
            doc = s["doc"]
            row = {"task": task, "family": family(task), **{k: doc[k] for k in DOC_FIELDS},
                   "generation": s["resps"][0][0]}
            if family(task) != "cf_quotes":
                row.pop("context")  # long and not needed to read the answer
            kept = old.get((task, row["id"], row["generation"]), {})
            row["expected"] = kept.get("expected")
            row["note"] = kept.get("note", "")
            rows.append(row)
    atomic_write(args.output_path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8"))
    unlabelled = sum(r["expected"] is None for r in rows)
    print(f"{len(rows)} generations written to {args.output_path}; {unlabelled} need a label", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
