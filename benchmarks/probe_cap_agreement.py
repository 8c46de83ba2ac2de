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
    print(f"{'cap':>4s} {'agree with reader':>18s} {'labels changed':>15s} {'answers cut':>12s}")
    for cap in (int(c) for c in args.caps.split(",")):
        agree = changed = cut = 0
        per_family = Counter()
        for row, whole in zip(ROWS, full):
            ids = tok(row["generation"], add_special_tokens=False)["input_ids"]
            text = tok.decode(ids[:cap]) if len(ids) > cap else row["generation"]
            cut += len(ids) > cap
            label = scored_label({**row, "generation": text})
            agree += label == row["expected"]
            changed += label != whole
            per_family[row["family"]] += label != whole
        n = len(ROWS)
        print(f"{cap:4d} {agree / n:17.1%} {changed:15d} {cut:12d}   changed per family: "
              + json.dumps({k: v for k, v in sorted(per_family.items()) if v}))
    print(f"\n{'stop sequences':>16s} {'agree with reader':>18s} {'labels changed':>15s} {'answers cut':>12s}")
    for group in args.stops.split("|"):
        stops = [x.replace("\\n", "\n") for x in group.split(",") if x]
        agree = changed = cut = 0
        per_family = Counter()
        for row, whole in zip(ROWS, full):
            text = row["generation"]
            for stop in stops:
                text = text.split(stop)[0]  # as lm-eval cuts at its ``until`` strings
            cut += text != row["generation"]
            label = scored_label({**row, "generation": text})
            agree += label == row["expected"]
            changed += label != whole
            per_family[row["family"]] += label != whole
        n = len(ROWS)
        print(f"{json.dumps(stops):>16s} {agree / n:17.1%} {changed:15d} {cut:12d}   changed per family: "
              + json.dumps({k: v for k, v in sorted(per_family.items()) if v}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
