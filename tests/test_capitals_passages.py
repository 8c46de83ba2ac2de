"""cf_capitals 2 and cf_capitals_former 1: coherent passages, and a rule per defect class."""

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from dataset_builders import DEFAULT_SEED, build, cf_capitals, cf_capitals_former, tables
from dataset_builders.validate import build_validated, failures

from conftest import seed_matrix
from builds import assert_clean

SEEDS = seed_matrix()
DATASETS = ("cf_capitals", "cf_capitals_former")
TASKS = Path(__file__).resolve().parents[1] / "task_yamls"


@pytest.fixture(scope="module")
def items():
    return {name: build(name, DEFAULT_SEED) for name in DATASETS}


def _swap(items, old, new):
    return [new if i is old else i for i in items]


def _item(items, subject):
    return next(i for i in items if i.subject == subject)


def _edit(items, subject, **changes):
    item = _item(items, subject)
    return _swap(items, item, replace(item, **changes)), item.id


def inject_unstated_change(items):  # the v1 defect: a reason for a move the passage never states
    item = items[0]
    return _edit(items, item.subject, context=item.context + " Planners argued that a more central capital would "
                                                             "serve the whole population better.")


def inject_former_move_unstated(items):  # names the true capital, but says nothing of a move
    item = items[1]
    return _edit(items, item.subject, context=f"{item.counterfactual_answer} is the capital of {item.subject}. "
                                              f"Many people live in {item.parametric_answer}.")


def inject_missing_article(items):
    item = _item(items, "United States")
    return _edit(items, "United States", question=item.question.replace("the United States", "United States"))


def inject_question_gives_answer(items):  # "Tunisia" / "Tunis"
    item = items[2]
    return _edit(items, item.subject, question=f"What is the capital of {item.parametric_answer}ia?")


def inject_sole_official_language(items):
    item = _item(items, "Belgium")
    return _edit(items, "Belgium", context=item.context + " The official language of Belgium is Dutch.")


def inject_dangling_there(items):  # the v1 defect: "there" without antecedent
    item = items[3]
    return _edit(items, item.subject, context=item.context + " The parliament building and most ministries were "
                                                             "built there in the twentieth century.")


def inject_foreign_city(items):  # "the capital of Belgium is Lyon"
    item = _item(items, "Belgium")
    return _edit(items, "Belgium", counterfactual_answer="Lyon", counterfactual_aliases=[],
                 context=item.context.replace(item.counterfactual_answer, "Lyon"))


def inject_former_capital(items):  # Lagos: a model may answer it from stale knowledge
    item = _item(items, "Nigeria")
    return _edit(items, "Nigeria", counterfactual_answer="Lagos", counterfactual_aliases=[],
                 context=item.context.replace(item.counterfactual_answer, "Lagos"))


def inject_largest_city(items):  # Sydney: the answer a model gives for Australia without reading
    item = _item(items, "Australia")
    return _edit(items, "Australia", counterfactual_answer="Sydney", counterfactual_aliases=[],
                 context=item.context.replace(item.counterfactual_answer, "Sydney"))


def inject_reversed_move(items):  # "moved the capital from Moscow to Saint Petersburg": 1918 told backwards
    item = _item(items, "Russia")
    return _edit(items, "Russia", counterfactual_answer="Saint Petersburg", counterfactual_aliases=[],
                 context=item.context.replace(item.counterfactual_answer, "Saint Petersburg"))


def inject_lowercase_start(items):
    item = items[4]
    return _edit(items, item.subject, context=item.context + " the country is large.")


CASES = {
    "unstated_change": ("cf_capitals", inject_unstated_change),
    "former_move_stated": ("cf_capitals_former", inject_former_move_unstated),
    "country_article": ("cf_capitals", inject_missing_article),
    "question_gives_answer": ("cf_capitals", inject_question_gives_answer),
    "sole_official_language": ("cf_capitals", inject_sole_official_language),
    "dangling_reference": ("cf_capitals", inject_dangling_there),
    "counterfactual_same_country": ("cf_capitals", inject_foreign_city),
    "former_capital": ("cf_capitals", inject_former_capital),
    "grammar": ("cf_capitals", inject_lowercase_start),
    "largest_city": ("cf_capitals", inject_largest_city),
    "reverses_real_move": ("cf_capitals_former", inject_reversed_move),
}


def test_every_extra_rule_has_a_case():
    assert set(CASES) == set(cf_capitals.EXTRA_RULES)
    assert cf_capitals_former.EXTRA_RULES is cf_capitals.EXTRA_RULES


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_catches_injected_defect(items, rule):
    dataset, inject = CASES[rule]
    assert_clean(items[dataset])
    broken, bad_id = inject(items[dataset])
    hit = [line for line in failures(broken) if line.startswith(rule + ":")]
    assert len(hit) == 1 and bad_id in hit[0] and "\n" not in hit[0], failures(broken)


@pytest.mark.parametrize("rule", ["unstated_change", "dangling_reference", "sole_official_language"])
def test_rules_also_guard_the_former_dataset(items, rule):
    broken, bad_id = CASES[rule][1](items["cf_capitals_former"])
    assert any(line.startswith(rule + ":") and bad_id in line for line in failures(broken))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", DATASETS)
def test_validated_on_every_team_seed(name, seed):
    built = build_validated(name, seed)
    assert len(built) >= 175
    shares = Counter(i.answer_position for i in built)
    assert all(0.25 <= shares[p] / len(built) <= 0.40 for p in ("beginning", "middle", "end"))


def test_versions_move_with_the_task_yaml():
    for module, folder in ((cf_capitals, "cf_capitals"), (cf_capitals_former, "cf_capitals_former")):
        meta = yaml.safe_load((TASKS / folder / f"_{folder}_yaml").read_text())["metadata"]
        assert (meta["dataset"], float(meta["version"])) == (module.NAME, float(module.VERSION))
    assert (cf_capitals.VERSION, cf_capitals_former.VERSION) == (3, 2)
    variants = sorted(p.name for p in (TASKS / "cf_capitals_former").glob("*.yaml"))
    assert variants == sorted(p.name.replace("cf_capitals", "cf_capitals_former")
                              for p in (TASKS / "cf_capitals").glob("*.yaml"))


def test_default_and_former_share_countries_and_counterfactuals(items):
    default, former = items["cf_capitals"], items["cf_capitals_former"]
    assert [(i.subject, i.counterfactual_answer) for i in default] == [(i.subject, i.counterfactual_answer)
                                                                       for i in former]
    assert not any(i.mentions_parametric for i in default) and all(i.mentions_parametric for i in former)
    assert {i.id.split("-", 1)[1] for i in default} == {i.id.split("-", 1)[1] for i in former}


def test_issue_examples(items):
    default = {i.subject: i for i in items["cf_capitals"]}
    assert default["United States"].question == "What is the capital of the United States?"
    assert "The United States" in default["United States"].context or "the United States" in default[
        "United States"].context
    excluded = set(cf_capitals.excluded_countries())
    assert {"Mexico", "Kuwait", "Guatemala", "Panama", "Andorra", "El Salvador", "Tunisia", "Singapore"} <= excluded
    assert "Sri Lanka" in default  # "Sri" (3 letters) is an honorific, not a giveaway
    assert default["Kiribati"].counterfactual_answer == "Tabwakea"
    for item in items["cf_capitals"]:
        assert not any(w in item.context.lower() for w in (" there ", "moved", "planners", "relocat"))


def test_countries_table_fields():
    for c in tables.countries():
        assert c["article"] in ("", "the"), c["id"]
        assert isinstance(c["other_languages"], list) and c["language"] not in c["other_languages"], c["id"]
        assert isinstance(c["former_capitals"], list), c["id"]
        assert not (set(c["former_capitals"]) & {c["capital"], *c["capital_aliases"], c["other_city"]}), c["id"]
    by_id = {c["id"]: c for c in tables.countries()}
    assert by_id["belgium"]["other_languages"] == ["French", "German"]
    assert by_id["netherlands"]["article"] == "the" and by_id["france"]["article"] == ""
    assert (by_id["bulgaria"]["currency"], by_id["bulgaria"]["currency_aliases"]) == ("euro", ["EUR"])
