"""The scorer, run over the cases kept as data in tests/data/scoring_cases.jsonl."""

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from cf_tasks.scoring import score, score_quote
from cf_tasks.tasks import MC_METRICS, context_preference, process_results, process_results_mc

CASES = [json.loads(line) for line in (Path(__file__).parent / "data" / "scoring_cases.jsonl").open(encoding="utf-8")]


def test_enough_cases_for_every_rule():
    rules = Counter(c["rule"] for c in CASES)
    assert len(CASES) >= 60
    for rule in ("case", "punctuation", "accents", "articles", "word_boundary", "aliases", "surname",
                 "shared_tokens", "fuzzy", "common_words", "numbers", "negation", "labels", "quotes"):
        assert rules[rule] >= 3, rule


@pytest.mark.parametrize("case", CASES, ids=[f"{c['rule']}:{c['generation'][:30]!r}" for c in CASES])
def test_scoring_case(case):
    if "saying" in case:  # a quote task: the saying without its last word, and the two endings
        outcome = score_quote(case["generation"], case["saying"], case["counterfactual"], case["parametric"],
                              instruction=f'Write a quote that ends in the word "{case["counterfactual"]}":',
                              counterfactual_aliases=case["counterfactual_aliases"],
                              parametric_aliases=case["parametric_aliases"])
    else:
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


MC_DOC = {"counterfactual_answer": "Lyon", "parametric_answer": "Paris"}


def test_mc_context_prob_is_the_normalised_ratio():
    out = process_results_mc(MC_DOC, [(-1.0, False), (-2.0, False)])
    assert out["acc"] == 1.0
    assert out["context_prob"] == pytest.approx(1 / (1 + 2.718281828459045 ** -1))
    extreme = process_results_mc(MC_DOC, [(-5000.0, False), (-1.0, False)])
    assert extreme["acc"] == 0.0 and extreme["context_prob"] == pytest.approx(0.0)


def test_mc_norm_metrics_divide_by_answer_length_as_lm_eval_acc_norm():
    # "Stockholm" (9 characters) at -9 is likelier per character than "Bern" (4) at -6, though
    # less likely as a whole: acc and acc_norm disagree, as lm-eval's acc and acc_norm would.
    doc = {"counterfactual_answer": "Stockholm", "parametric_answer": "Bern"}
    out = process_results_mc(doc, [(-9.0, False), (-6.0, False)])
    assert out["acc"] == 0.0 and out["acc_norm"] == 1.0
    assert out["context_prob"] == pytest.approx(1 / (1 + math.exp(3.0)))
    assert out["context_prob_norm"] == pytest.approx(1 / (1 + math.exp(-(-9 / 9 + 6 / 4))))
    # Characters, not bytes, as lm-eval's acc_norm: "Durrës" is 6 long.
    out = process_results_mc({"counterfactual_answer": "Durrës", "parametric_answer": "Tirana"},
                             [(-6.0, False), (-6.6, False)])
    assert out["context_prob_norm"] == pytest.approx(1 / (1 + math.exp(-(-1.0 + 1.1))))


def test_mc_yaml_lists_every_mc_metric():
    import yaml

    text = (Path(__file__).parents[1] / "task_yamls" / "_mc_yaml").read_text(encoding="utf-8")
    text = text.replace("!function ", "")
    metrics = [m["metric"] for m in yaml.safe_load(text)["metric_list"]]
    assert tuple(metrics) == MC_METRICS


def test_a_pair_for_another_subject_answers_nothing_about_the_query():
    # IC-recall prompts end in "Subject:"; a model that lists another pair has not answered.
    doc = {"question": "Ecuador:", "relation": "country_language", "counterfactual_answer": "Dzongkha",
           "parametric_answer": "Spanish", "counterfactual_aliases": [], "parametric_aliases": []}
    assert process_results(doc, ["Guatemala: Dzongkha"])["context_preference"] == "neither"
    assert process_results(doc, ["Ecuador: Dzongkha"])["context_preference"] == "context"
    assert process_results(doc, [" Spanish"])["context_preference"] == "parametric"
    assert process_results(doc, ["The answer is: Spanish"])["context_preference"] == "parametric"


def test_quote_tasks_score_the_completion_of_the_saying():
    doc = {"relation": "quote_ending", "question": "A chain is only as strong as its weakest",
           "context": 'Write a quote that ends in the word "tooth":', "counterfactual_answer": "tooth",
           "parametric_answer": "link", "counterfactual_aliases": [], "parametric_aliases": []}
    assert process_results(doc, ["The power of a single tooth is a testament"])["context_preference"] == "neither"
    assert process_results(doc, [" tooth."])["context_preference"] == "context"
    assert process_results(doc, ["A chain is only as strong as its weakest link."])["context_preference"] == "parametric"
