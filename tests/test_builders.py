"""Builders: determinism, counts, schema and the dataset-specific guarantees."""

import re
from collections import Counter
from dataclasses import replace

import pytest

import dataset_builders
from cf_tasks.text import contains, contains_any
from dataset_builders import DEFAULT_SEED, build, cf_capitals, cf_quotes, tables
from dataset_builders.common import name_fragments
from dataset_builders.schema import FIELD_NAMES
from dataset_builders.serialize import to_jsonl_bytes, to_parquet_bytes
from dataset_builders.validate import build_validated, failures

from conftest import seed_matrix

EXPECTED_FIELDS = {
    "id", "dataset", "relation", "subject", "context", "question", "counterfactual_answer",
    "counterfactual_aliases", "parametric_answer", "parametric_aliases", "answer_position",
    "mentions_parametric", "version", "seed",
}


@pytest.fixture(scope="module")
def built():
    return {name: build_validated(name, DEFAULT_SEED) for name in dataset_builders.DATASETS}


@pytest.mark.parametrize("name", dataset_builders.DATASETS)
def test_same_seed_gives_identical_bytes(name):
    assert to_jsonl_bytes(build(name, 7)) == to_jsonl_bytes(build(name, 7))
    assert to_parquet_bytes(build(name, 7)) == to_parquet_bytes(build(name, 7))


@pytest.mark.parametrize("name", ["cf_bio", "cf_world_facts", "cf_quotes"])
def test_other_seed_gives_other_substitutions(name):
    a = {i.id: i.counterfactual_answer for i in build(name, 1)}
    b = {i.id: i.counterfactual_answer for i in build(name, 2)}
    assert a.keys() == b.keys()
    changed = sum(a[k] != b[k] for k in a)
    assert changed > 0.3 * len(a)


def test_capitals_other_seed_changes_passages():
    a = {i.id: i.context for i in build("cf_capitals", 1)}
    b = {i.id: i.context for i in build("cf_capitals", 2)}
    assert sum(a[k] != b[k] for k in a) > 0.5 * len(a)


def test_schema_is_the_same_for_every_dataset(built):
    assert set(FIELD_NAMES) == EXPECTED_FIELDS
    for name, items in built.items():
        for item in items:
            d = item.to_dict()
            assert set(d) == EXPECTED_FIELDS
            assert d["dataset"] == name and d["seed"] == DEFAULT_SEED
            assert d["version"] == dataset_builders.version(name)


def test_counts(built):
    # versions 5-7 leave out items no plausible counterfactual fits (version 7: a name swap of another science,
    # nationality or generation; a nationality whose name names the birthplace)
    assert len(built["cf_bio"]) >= 580
    # versions 5 and 7 leave out facts no fitting substitute exists for (version 7: a painter of the title's
    # culture, an inventor of the field)
    assert len(built["cf_world_facts"]) >= 690
    assert len({i.relation for i in built["cf_world_facts"]}) >= 7
    assert len(built["cf_capitals"]) >= 175  # 178: Micronesia and Nauru have no other city the table vouches for
    assert len(built["cf_quotes"]) >= 300
    countries = tables.countries()
    assert len(built["cf_capitals"]) == len(countries) - len(cf_capitals.excluded_countries())
    assert {i.subject for i in built["cf_capitals"]} == {
        c["name"] for c in countries if c["name"] not in cf_capitals.excluded_countries()
    }


def test_every_build_passes_the_validator(built):
    for items in built.values():
        assert failures(items) == []


# Seeds 0, 1 and the default, then ten drawn once with random.Random(2026).sample(range(1, 100000), 10).
VALIDATED_SEEDS = seed_matrix()


@pytest.mark.parametrize("seed", VALIDATED_SEEDS)
@pytest.mark.parametrize("name", dataset_builders.DATASETS)
def test_every_rule_holds_for_many_seeds(name, seed):
    build_validated(name, seed)  # raises ValidationError with one line per broken rule


@pytest.mark.slow
def test_world_facts_positions_are_balanced_and_recorded(built):
    items = built["cf_world_facts"]
    shares = Counter(i.answer_position for i in items)
    for position in ("beginning", "middle", "end"):
        assert 0.25 <= shares[position] / len(items) <= 0.40
    # Re-derive each position from the text. Abbreviations ("St. Petersburg") can fool a naive
    # sentence split, so a few mismatches are tolerated; a wrong recording would break a third.
    agree = 0
    for item in items:
        sentences = re.split(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])", item.context)
        first = next((k for k, s in enumerate(sentences) if contains(s, item.counterfactual_answer)), None)
        expected = "beginning" if first == 0 else "end" if first == len(sentences) - 1 else "middle"
        agree += item.answer_position == expected and 6 <= len(sentences) <= 9
    assert agree >= 0.95 * len(items)


def test_world_facts_mentions_parametric_flag_matches_text(built):
    assert not any(i.mentions_parametric for i in built["cf_world_facts"])
    assert all(i.mentions_parametric for i in built["cf_world_facts_former"])
    for item in built["cf_world_facts"] + built["cf_world_facts_former"]:
        says_parametric = contains_any(item.context, [item.parametric_answer, *item.parametric_aliases])
        assert says_parametric == item.mentions_parametric, item.id


def test_bio_name_substitution_leaves_no_fragment(built):
    names = [i for i in built["cf_bio"] if i.relation == "person_name"]
    # version 5: the same domain, language and forms; version 6: the same culture; version 7: the stated
    # nationality, the same generation and, for a scientist, the same science
    assert len(names) >= 100
    for item in names:
        assert contains(item.context, item.counterfactual_answer)
        assert not contains_any(item.context, name_fragments(item.parametric_answer, *item.parametric_aliases))
    # The published CF_Bio turned "born in Vinci" into "born in the town of Fermi": a birthplace that
    # repeats the real name must not appear, whoever replaces the name.
    people = {p["id"]: p for p in tables.people()}
    tricky = [p for p in people.values() if contains_any(p["birth_city"], name_fragments(p["name"], *p["aliases"]))]
    for person in tricky:
        for item in names:
            if item.subject == person["id"]:
                assert not contains(item.context, person["birth_city"])


def test_bio_attribute_items_change_one_attribute(built):
    people = {p["id"]: p for p in tables.people()}
    attrs = [i for i in built["cf_bio"] if i.relation != "person_name"]
    gives_away = [p for p in people.values() if contains_any(" ".join([p["name"], *p["aliases"]]), [p["birth_city"]])]
    assert "leonardo_da_vinci" in {p["id"] for p in gives_away}  # born in Vinci: no birthplace question
    # Version 2 drops an item when no coherent, plausible counterfactual is left (see cf_bio.py).
    counts = Counter(i.relation for i in attrs)
    assert counts["birth_year"] <= len(people) and counts["nationality"] <= len(people)
    assert counts["birth_city"] <= len(people) - len(gives_away)
    assert min(counts.values()) >= 0.65 * len(people)  # v5, v6: no stub, off-language or off-culture nationality items
    for item in attrs:
        person = people[item.subject]
        assert item.parametric_answer == str(person[item.relation])
        assert contains(item.context, person["name"]) and person["name"] in item.question
        assert contains(item.context, item.counterfactual_answer)
        assert not contains(item.context, item.parametric_answer)


def test_quotes_ask_for_another_last_word(built):
    by_id = {q["id"]: q for q in tables.quotes()}
    for item in built["cf_quotes"]:
        quote = by_id[item.id.removeprefix("cf_quotes-")]
        assert item.counterfactual_answer in quote["alternatives"]
        assert item.parametric_answer == quote["last_word"]
        endings = [quote["last_word"], *quote["last_word_aliases"]]  # and their other spellings (valor / valour)
        assert item.parametric_aliases == [*endings[1:], *(v for e in endings for v in cf_quotes.spelling_variants(e))]
        assert item.question + " " + quote["last_word"] == quote["saying"]
        assert item.context == f'Write a quote that ends in the word "{item.counterfactual_answer}":'


def test_capitals_counterfactual_is_another_city(built):
    countries = {c["name"]: c for c in tables.countries()}
    for item in built["cf_capitals"] + built["cf_capitals_former"]:
        country = countries[item.subject]
        assert item.parametric_answer == country["capital"]
        assert item.counterfactual_answer == country["other_city"]
    assert "Singapore" in cf_capitals.excluded_countries()


def test_validator_reports_builder_ids_one_line_per_rule():
    items = build("cf_quotes", DEFAULT_SEED)
    broken = [replace(items[0], context="Nothing here."), replace(items[1], id=items[2].id)]
    lines = failures(broken + items[2:])
    assert len(lines) == 2
    assert lines[0].startswith("counterfactual_in_context:") and items[0].id in lines[0]
    assert lines[1].startswith("unique_ids:") and items[2].id in lines[1]
