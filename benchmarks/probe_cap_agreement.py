"""What a shorter answer cap, or a stop sequence, would do to scoring, measured on the labelled
real generations.

Greedy decoding with a cap of N new tokens gives exactly the first N tokens of the same answer
under a larger cap, so a cap's effect on labels can be measured without running the model: each
generation of ``tests/data/real_generations.jsonl`` (SmolLM2-135M-Instruct, 32-token cap) is cut
to its first N tokens (the default model's tokenizer), scored again, and compared with the careful
reader's label and with the label of the whole generation.

A stop sequence is measured the same way: each generation is cut where lm-eval would cut it (before
the first occurrence of any of the stop strings), scored again and compared.

The knowledge probe's closed-book answers are not in that set: this measures how soon the default
model states its answer in the labelled tasks' answers, the nearest evidence there is.

    python benchmarks/probe_cap_agreement.py [--caps 8,12,16,20,24,32] [--stops '\n|. |\n,. ']
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caps", default="8,12,16,20,24,32", help="new-token caps to compare")
    parser.add_argument("--stops", default="\\n|. |\\n,. ",
                        help="stop-sequence sets to compare: sets separated by |, strings of a set by a comma "
                             "(\\n for a newline)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from cf_tasks.default_model import default_model_path
    from test_scoring_real import ROWS, scored_label

    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    full = [scored_label(r) for r in ROWS]

    def row_for(label: str, cut_text) -> str:
        """One table row: each generation cut by ``cut_text``, scored again, against the reader's
        label and against the whole generation's."""
        agree = changed = cut = 0
        per_family = Counter()
        for row, whole in zip(ROWS, full):
            text = cut_text(row["generation"])
            cut += text != row["generation"]
            scored = scored_label({**row, "generation": text})
            agree += scored == row["expected"]
            changed += scored != whole
            per_family[row["family"]] += scored != whole
        return (f"{label} {agree / len(ROWS):17.1%} {changed:15d} {cut:12d}   changed per family: "
                + json.dumps({k: v for k, v in sorted(per_family.items()) if v}))

    def capped(cap: int):
        def cut(text: str) -> str:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            return tok.decode(ids[:cap]) if len(ids) > cap else text
        return cut

    def stopped(stops: list[str]):
        def cut(text: str) -> str:
            for stop in stops:
                text = text.split(stop)[0]  # as lm-eval cuts at its ``until`` strings
            return text
        return cut

    print(f"{'cap':>4s} {'agree with reader':>18s} {'labels changed':>15s} {'answers cut':>12s}")
    for cap in (int(c) for c in args.caps.split(",")):
        print(row_for(f"{cap:4d}", capped(cap)))
    print(f"\n{'stop sequences':>16s} {'agree with reader':>18s} {'labels changed':>15s} {'answers cut':>12s}")
    for group in args.stops.split("|"):
        stops = [x.replace("\\n", "\n") for x in group.split(",") if x]
        print(row_for(f"{json.dumps(stops):>16s}", stopped(stops)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
