"""The scorer, run over the cases kept as data in tests/data/scoring_cases.jsonl."""

import json
from collections import Counter
from pathlib import Path

import pytest

from cf_tasks.scoring import score
from cf_tasks.tasks import context_preference, process_results, process_results_mc

CASES = [json.loads(line) for line in (Path(__file__).parent / "data" / "scoring_cases.jsonl").open(encoding="utf-8")]


def test_enough_cases_for_every_rule():
    rules = Counter(c["rule"] for c in CASES)
    assert len(CASES) >= 60
    for rule in ("case", "punctuation", "accents", "articles", "word_boundary", "aliases", "surname",
                 "shared_tokens", "fuzzy", "numbers", "negation", "labels"):
        assert rules[rule] >= 3, rule


@pytest.mark.parametrize("case", CASES, ids=[f"{c['rule']}:{c['generation'][:30]!r}" for c in CASES])
def test_scoring_case(case):
    outcome = score(
        case["generation"], case["counterfactual"], case["parametric"],
        case["counterfactual_aliases"], case["parametric_aliases"], person=case["person"],
    )
    assert outcome.label == case["expected"]
    assert outcome.counterfactual == (case["expected"] in ("context", "both"))
    assert outcome.parametric == (case["expected"] in ("parametric", "both"))


def test_process_results_reports_every_metric_under_its_name():
    doc = {"counterfactual_answer": "Lyon", "parametric_answer": "Paris", "counterfactual_aliases": [],
           "parametric_aliases": [], "relation": "country_capital"}
    out = process_results(doc, ["Lyon, not Paris"])
    assert out == {"counterfactual_acc": 1.0, "parametric_acc": 0.0, "both_rate": 0.0, "neither_rate": 0.0,
                   "context_preference": "context"}


def test_context_preference_ignores_both_and_neither():
    assert context_preference(["context", "context", "parametric", "both", "neither"]) == pytest.approx(2 / 3)
    assert context_preference(["both", "neither"]) != context_preference(["both", "neither"])  # NaN


def test_mc_context_prob_is_the_normalised_ratio():
    out = process_results_mc({}, [(-1.0, False), (-2.0, False)])
    assert out["acc"] == 1.0
    assert out["context_prob"] == pytest.approx(1 / (1 + 2.718281828459045 ** -1))
    extreme = process_results_mc({}, [(-5000.0, False), (-1.0, False)])
    assert extreme == {"acc": 0.0, "context_prob": pytest.approx(0.0)}
