"""Datasets v2 for cf_quotes and ic_recall_cf: each new rule catches its defect injected
into an otherwise valid build, the tables keep no such defect, and cf_quotes keeps >= 300 items on
every seed of the team's list."""

import copy
from dataclasses import replace

import pytest

from dataset_builders import DEFAULT_SEED, build, cf_quotes, ic_recall, ic_recall_cf, tables
from dataset_builders.validate import build_validated, failures

from conftest import seed_matrix

SEEDS = seed_matrix()


def _hit(items, rule, bad_id):
    lines = [line for line in failures(items) if line.startswith(rule + ":")]
    assert len(lines) == 1 and bad_id in lines[0] and "\n" not in lines[0], failures(items)


def _swap(items, old, new):
    return [new if i is old else i for i in items]


# cf_quotes

@pytest.fixture(scope="module")
def quotes():
    items = build("cf_quotes", DEFAULT_SEED)
    assert failures(items) == []
    return items


def _quote(items, quote_id):
    return next(i for i in items if i.id == f"cf_quotes-{quote_id}")


def test_one_word_prompt_is_caught(quotes):
    item = quotes[0]
    short = replace(item, subject="Money talks", question="Money", parametric_answer="talks")
    _hit(_swap(quotes, item, short), "quote_prompt_too_short", item.id)


def test_variant_ending_as_counterfactual_is_caught_from_the_table(quotes):
    item = _quote(quotes, "fortune_favors_the_bold")
    # Without the alias on the item too: the rule reads the table, not the item.
    variant = replace(item, counterfactual_answer="brave", context=cf_quotes.INSTRUCTION.format(word="brave"),
                      parametric_aliases=[])
    _hit(_swap(quotes, item, variant), "quote_variant_ending", item.id)


def test_article_disagreement_is_caught(quotes):
    item = _quote(quotes, "give_a_man_a")  # "... you feed him for a" + "hour"
    wrong = replace(item, counterfactual_answer="hour", context=cf_quotes.INSTRUCTION.format(word="hour"))
    _hit(_swap(quotes, item, wrong), "quote_article_agreement", item.id)


def test_every_alternative_of_the_table_passes_every_rule(quotes):
    """Not just the drawn ones: any alternative may be drawn by another seed."""
    template = quotes[0]
    items = [
        replace(template, id=f"{q['id']}/{word}", subject=q["saying"], question=q["saying"].rsplit(" ", 1)[0],
                context=cf_quotes.INSTRUCTION.format(word=word), counterfactual_answer=word,
                counterfactual_aliases=cf_quotes.spelling_variants(word), parametric_answer=q["last_word"],
                parametric_aliases=[*q["last_word_aliases"], *cf_quotes.spelling_variants(q["last_word"])])
        for q in tables.quotes() if q["id"] not in cf_quotes.ambiguous_quotes() for word in q["alternatives"]
    ]
    assert failures(items) == []


def test_variant_endings_count_as_the_memorised_answer(quotes):
    assert _quote(quotes, "fortune_favors_the_bold").parametric_aliases == ["brave"]
    assert set(_quote(quotes, "he_who_laughs_last").parametric_aliases) == {"longest", "loudest"}
    assert not {"Money talks", "Opposites attract", "Love is blind"} & {i.subject for i in quotes}


def test_ambiguous_saying_is_caught(quotes):  # "A piece of" cake, advice, work
    item = quotes[0]
    piece = replace(item, subject="A piece of cake", question="A piece of", parametric_answer="cake")
    _hit(_swap(quotes, item, piece), "quote_ambiguous_ending", item.id)
    assert not {"A piece of cake", "The night is young", "Time is a great healer"} & {i.subject for i in quotes}


def test_us_spelling_without_its_uk_alias_is_caught(quotes):
    item = _quote(quotes, "discretion_is_the_better")
    assert item.parametric_answer == "valor" and "valour" in item.parametric_aliases
    _hit(_swap(quotes, item, replace(item, parametric_aliases=[])), "quote_spelling_variant", item.id)
    assert "neighbours" in _quote(quotes, "good_fences_make_good").parametric_aliases
    assert "offence" in _quote(quotes, "the_best_defense_is").parametric_aliases


@pytest.mark.parametrize("seed", SEEDS)
def test_cf_quotes_validates_on_every_seed(seed):
    assert len(build_validated("cf_quotes", seed)) >= 300


# ic_recall_cf

@pytest.fixture(scope="module")
def ic_cf():
    items = build("ic_recall_cf", DEFAULT_SEED)
    assert failures(items) == []
    return items


def _with_pair_answer(item, index, answer):
    lines = item.context.split("\n")
    subject, _ = ic_recall.parse_pairs(item.context)[index]
    lines[index] = ic_recall.pair_line(subject, answer)
    return replace(item, context="\n".join(lines)), subject


def _use_tables(monkeypatch, people=None, relations=None):
    from dataset_builders import relations as relation_rules  # the argument ``relations`` is a table

    truths = ic_recall_cf.other_truths(people or tables.people(), tables.countries(), relations or tables.relations())
    monkeypatch.setattr(relation_rules, "_other_truths", lambda: truths)


def test_pair_showing_the_true_answer_is_caught(ic_cf):
    item = ic_cf[0]
    subject, _ = ic_recall.parse_pairs(item.context)[0]
    facts = ic_recall.relations_by_name()[item.relation].facts
    fact = next(f for f in facts if f.subject_key == ic_recall.key(subject))
    honest, _ = _with_pair_answer(item, 0, fact.answer)
    _hit(_swap(ic_cf, item, honest), "ic_pair_true", item.id)


def test_pair_showing_another_nationality_of_the_person_is_caught(ic_cf, monkeypatch):
    item = next(i for i in ic_cf if i.relation == "nationality")
    subject, shown = ic_recall.parse_pairs(item.context)[0]
    people = copy.deepcopy(tables.people())
    for person in people:
        person["nationality_aliases"] = [shown] if person["name"] == subject else []
    _use_tables(monkeypatch, people=people)
    _hit(ic_cf, "ic_pair_true", item.id)


def test_pair_showing_a_container_of_the_river_mouth_is_caught(ic_cf, monkeypatch):
    item = next(i for i in ic_cf if i.relation == "river_mouth")
    subject, shown = ic_recall.parse_pairs(item.context)[0]
    mouth = next(f.answer for f in ic_recall.relations_by_name()["river_mouth"].facts
                 if f.subject_key == ic_recall.key(subject))
    relations = copy.deepcopy(tables.relations())
    river = next(r for r in relations if r["relation"] == "river_mouth")
    river["within"] = {mouth: ["the Middle Sea"], "the Middle Sea": [shown]}  # contained through another body
    _use_tables(monkeypatch, relations=relations)
    assert ic_recall_cf.extra_answers("river_mouth", subject) == ["the Middle Sea", shown]
    _hit(ic_cf, "ic_pair_true", item.id)


@pytest.mark.parametrize("name", ["ic_recall", "ic_recall_cf"])
def test_pair_of_a_recent_change_is_caught(name):  # Equatorial Guinea's capital moved in 2026
    items = build(name, DEFAULT_SEED)
    assert failures(items) == []
    assert ic_recall.recently_changed("country_capital", "Equatorial Guinea")
    assert not ic_recall.recently_changed("country_capital", "France")
    changed = {"country_capital": "Equatorial Guinea", "country_currency": "Bulgaria", "country_language": "Mali"}
    assert not any(subject in i.context + i.question for i in items for r, subject in changed.items()
                   if i.relation == r)
    item = next(i for i in items if i.relation in changed)
    lines = item.context.split("\n")
    stale_line = f"{changed[item.relation]}: " + lines[-1].split(": ", 1)[1]
    stale = replace(item, context="\n".join([*lines[:-1], stale_line]))
    _hit(_swap(items, item, stale), "ic_recent_fact", item.id)


def test_true_pairs_of_the_issue_are_recognised():
    assert ic_recall_cf.is_true("nationality", "Arthur Conan Doyle", "Scottish")  # people.json aliases
    assert not ic_recall_cf.is_true("nationality", "Arthur Conan Doyle", "French")


def test_builder_avoids_containers_and_counts_them_as_true(monkeypatch):
    relations = copy.deepcopy(tables.relations())
    river = next(r for r in relations if r["relation"] == "river_mouth")
    atlantic = ["the Atlantic Ocean"]
    river["within"] = {"the English Channel": atlantic, "the North Sea": atlantic, "the Baltic Sea": atlantic,
                       "the Mediterranean Sea": atlantic, "the Black Sea": ["the Mediterranean Sea"]}
    _use_tables(monkeypatch, relations=relations)
    items = build("ic_recall_cf", 1)
    assert failures(items) == []
    rivers = [i for i in items if i.relation == "river_mouth"]
    assert rivers
    for item in rivers:
        for subject, answer in ic_recall.parse_pairs(item.context):
            assert not ic_recall_cf.is_true("river_mouth", subject, answer), item.id
        if item.parametric_answer in river["within"]:
            assert "the Atlantic Ocean" in item.parametric_aliases
            assert "Atlantic Ocean" not in item.context


# Every seed of SEEDS for ic_recall and ic_recall_cf: tests/test_builders.py::test_every_rule_holds_for_many_seeds.
