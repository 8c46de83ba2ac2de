"""How natural the passages read: ours beside the paper's released passages of the same family.

Three measures, per family (world facts, biographies, capitals):

- the mean per-token loss of a passage under the default model (SmolLM2-135M-Instruct), averaged
  over the sampled passages: lower reads more natural to the model. The first tokens of any text
  cost the most, so a longer passage has a lower mean by its length alone; the loss over each
  passage's first ``FIRST_TOKENS`` tokens is printed beside it, which compares passages of unequal
  length fairly;
- distinct word bigrams per 100 words, pooled over the sampled passages: higher repeats itself less;
  they fall as text grows, so the figure over the sample's first ``BIGRAM_WORDS`` words is printed
  beside it, which compares sources of unequal length fairly;
- the most frequent sentence frame's share, over every passage of each of our datasets: a frame is a
  sentence with its item's names and values masked (subject, answers, years, places, works).

The paper's passages (Goyal et al., "Context-Parametric Inversion", ICLR 2025) are not shipped with
cf-tasks; point ``--paper-dir`` at a folder with the authors' released ``world_facts.json``,
``famous_biographies.jsonl`` and ``country_capitals_only.json`` to print them beside ours.

    python benchmarks/fluency_bench.py [--paper-dir DIR] [--n 150] [--seed 0] [--no-model] [--family F] [--paper-only]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

FAMILIES = {"world facts": "cf_world_facts", "biographies": "cf_bio", "capitals": "cf_capitals"}
PAPER_FILES = {"world facts": "world_facts.json", "biographies": "famous_biographies.jsonl",
               "capitals": "country_capitals_only.json"}
_WORD = re.compile(r"[A-Za-zÀ-ÿ0-9']+")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\"”])[.!?]\s+(?=[A-Z\"“])")


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def bigrams_per_100_words(passages: list[str]) -> float:
    """Distinct word bigrams (within a passage) per 100 words, pooled over ``passages``."""
    seen: set[tuple[str, str]] = set()
    total = 0
    for text in passages:
        ws = words(text)
        total += len(ws)
        seen.update(zip(ws, ws[1:]))
    return 100 * len(seen) / max(total, 1)


BIGRAM_WORDS = 4000  # distinct bigrams grow less than words: compare sources over the same number of words


def bigrams_at_words(passages: list[str], n_words: int = BIGRAM_WORDS) -> float:
    """``bigrams_per_100_words`` over the first ``n_words`` words of ``passages`` (the last one cut),
    so that sources of unequal length compare fairly."""
    kept, total = [], 0
    for text in passages:
        ws = words(text)[: n_words - total]
        kept.append(" ".join(ws))
        total += len(ws)
        if total >= n_words:
            break
    return bigrams_per_100_words(kept)


def bench_sample(passages: list[str], n: int = 150, seed: int = 0) -> list[str]:
    """The passages a source is measured on: ``n`` of them drawn with ``random.Random(seed)``."""
    return random.Random(seed).sample(passages, min(n, len(passages)))


def paper_passages(folder: Path, family: str) -> list[str]:
    path = folder / PAPER_FILES[family]
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = json.loads(text)
    if family == "world facts":  # the file also holds capital questions: those are the capitals family
        rows = [r for r in rows if "capital" not in r.get("question", "").lower()]
    return [" ".join(r["context"].split()) for r in rows]


def _masks(item) -> list[str]:
    """The names and values of one item that a template fills in, longest first."""
    from dataset_builders import tables

    values = [item.subject, item.counterfactual_answer, item.parametric_answer, *item.counterfactual_aliases,
              *item.parametric_aliases]
    if item.dataset.startswith("cf_bio"):
        person = next(p for p in tables.people() if p["id"] == item.subject)
        sub = next((p for p in tables.people() if p["name"] == item.counterfactual_answer), None)
        for p in filter(None, (person, sub)):
            values += [p["name"], p["surname"], *p["aliases"], *p["works"], p["domain"], p["nationality"],
                       *(p[k] for k in ("birth_city", "birth_country", "death_city", "death_country") if p[k])]
    if item.dataset.startswith("cf_capitals"):
        country = next(c for c in tables.countries() if c["name"] == item.subject)
        values += [country["currency"], country["language"], country["continent"], *country["other_languages"]]
    return sorted({v for v in values if v}, key=len, reverse=True)


def frame_share(items) -> tuple[float, str]:
    """The share of sentences that have the most frequent frame, and that frame."""
    frames: Counter[str] = Counter()
    for item in items:
        text = item.context
        for value in _masks(item):
            text = re.sub(re.escape(value), "X", text, flags=re.IGNORECASE)
        text = re.sub(r"\b\d{3,4}\b", "N", text)
        frames.update(s.strip() for s in _SENTENCE_END.split(text) if s.strip())
    frame, count = frames.most_common(1)[0]
    return count / sum(frames.values()), frame


FIRST_TOKENS = 64


@lru_cache(maxsize=1)
def _default_model():
    """The default model and its tokenizer, loaded once for every source measured."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cf_tasks.default_model import default_model_path

    path = default_model_path()
    return (AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(path))


def mean_token_loss(passages: list[str]) -> tuple[float, float]:
    """Mean over passages of the mean next-token loss under the default model: over the whole passage,
    and over its first ``FIRST_TOKENS`` tokens."""
    import torch

    model, tokenizer = _default_model()
    whole, first = [], []
    with torch.inference_mode():
        for text in passages:
            ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=1024)["input_ids"]
            logits = model(input_ids=ids).logits[0, :-1]
            losses = torch.nn.functional.cross_entropy(logits.float(), ids[0, 1:], reduction="none")
            whole.append(float(losses.mean()))
            first.append(float(losses[:FIRST_TOKENS].mean()))
    return sum(whole) / len(whole), sum(first) / len(first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paper-dir", type=Path, help="folder with the paper's released passages")
    parser.add_argument("--n", type=int, default=150, help="passages sampled per family and source")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--no-model", action="store_true", help="skip the per-token loss (no model load)")
    parser.add_argument("--paper-only", action="store_true", help="measure only the paper's passages")
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES),
                        help="measure only this family (repeatable; default: all)")
    args = parser.parse_args()

    import dataset_builders

    print(f"{'family':12s} {'source':24s} {'passages':>8s} {'words':>6s} {'loss/token':>10s} "
          f"{'first ' + str(FIRST_TOKENS):>9s} {'bigrams/100w':>12s} {'at ' + str(BIGRAM_WORDS) + 'w':>8s}")
    for family, dataset in FAMILIES.items():
        if args.family and family not in args.family:
            continue
        items = dataset_builders.build(dataset)
        sources = {} if args.paper_only else {
            f"{dataset} v{dataset_builders.version(dataset)}": [i.context for i in items]}
        if args.paper_dir:
            sources["paper (Goyal et al.)"] = paper_passages(args.paper_dir, family)
        for source, passages in sources.items():
            sample = bench_sample(passages, args.n, args.seed)
            loss, first = ("-", "-") if args.no_model else (f"{v:.2f}" for v in mean_token_loss(sample))
            mean_words = sum(len(words(p)) for p in sample) / len(sample)
            print(f"{family:12s} {source:24s} {len(sample):8d} {mean_words:6.0f} {loss:>10s} {first:>9s} "
                  f"{bigrams_per_100_words(sample):12.1f} {bigrams_at_words(sample):8.1f}")
    if args.paper_only:
        return
    print()
    print("most frequent sentence frame per dataset (all items, names and values masked as X):")
    for dataset in dataset_builders.DATASETS:
        if dataset.startswith(("cf_bio", "cf_world_facts", "cf_capitals")):
            share, frame = frame_share(dataset_builders.build(dataset))
            print(f"  {dataset:28s} {share:6.1%}  {frame}")


if __name__ == "__main__":
    main()
