"""CF_Bio version 2: each coherence rule catches its defect, and every team seed builds and validates."""

from collections import Counter
from dataclasses import replace

import pytest

from cf_tasks.text import contains
from dataset_builders import DEFAULT_SEED, cf_bio
from dataset_builders.common import country_in_text
from dataset_builders.validate import build_validated, failures

from conftest import seed_matrix
from builds import assert_caught

SEEDS = seed_matrix()
PEOPLE = cf_bio.people_by_id()


@pytest.fixture(scope="module")
def items():
    return cf_bio.build(DEFAULT_SEED)


def _first(items, relation, where=lambda item, person: True):
    return next(i for i in items if i.relation == relation and where(i, PEOPLE[i.subject]))


def _swap(items, old, new):
    return [new if i is old else i for i in items], old.id


def inject_nationality_implied(items):
    item = _first(items, "nationality")
    born = country_in_text(PEOPLE[item.subject]["birth_country"])
    return _swap(items, item, replace(item, context=item.context + f" The family lived in {born}."))


def inject_birth_city_not_born_in(items):
    item = _first(items, "birth_city")
    context = item.context.replace(f"born in {item.counterfactual_answer}", f"raised in {item.counterfactual_answer}")
    return _swap(items, item, replace(item, context=context))


def inject_birth_city_country(items):
    item = _first(items, "birth_city", lambda i, p: p["birth_country"] != "Japan")
    city, country = item.counterfactual_answer, country_in_text(PEOPLE[item.subject]["birth_country"])
    return _swap(items, item, replace(item, context=item.context.replace(f"{city}, in {country}", f"{city}, in Japan")))


def inject_living_described_dead(items):
    item = _first(items, "person_name", lambda i, p: p["death_year"] is None)
    return _swap(items, item, replace(item, context=item.context + " The politician died in 1890."))


def inject_substitute_incompatible(items):
    item = _first(items, "person_name", lambda i, p: p["id"] == "hillary_clinton")  # living; Lincoln is not
    context = item.context.replace(item.counterfactual_answer, "Abraham Lincoln")
    return _swap(items, item, replace(item, counterfactual_answer="Abraham Lincoln", context=context))


def inject_noun_as_adjective(items):
    item = items[0]
    return _swap(items, item, replace(item, context=item.context + " A New Zealander politician praised the work."))


def inject_nationality_also_true(items):
    item = _first(items, "nationality", lambda i, p: p["id"] == "david_hume")  # Scottish, so also British
    context = item.context.replace(item.counterfactual_answer, "British")
    return _swap(items, item, replace(item, counterfactual_answer="British", context=context))


def inject_nationality_implausible(items):
    item = _first(items, "nationality", lambda i, p: p["id"] == "william_shakespeare")  # 1564: no Pakistan
    context = item.context.replace(item.counterfactual_answer, "Pakistani")
    return _swap(items, item, replace(item, counterfactual_answer="Pakistani", context=context))


def inject_birth_village(items):  # "born in Downe": a village, not a city
    item = _first(items, "birth_city", lambda i, p: p["birth_country"] == "England")
    context = item.context.replace(item.counterfactual_answer, "Downe")
    return _swap(items, item, replace(item, counterfactual_answer="Downe", context=context))


def inject_national_work(items):  # "a major US party" in a passage that makes Hillary Clinton Canadian
    item = _first(items, "nationality", lambda i, p: bool(p["national_works"]))
    work = PEOPLE[item.subject]["national_works"][0]
    return _swap(items, item, replace(item, context=item.context + f" The career included {work}."))


def inject_nested_nationality(items):  # Shakespeare, English and so British, called Welsh
    item = _first(items, "nationality", lambda i, p: p["id"] == "william_shakespeare")
    context = item.context.replace(item.counterfactual_answer, "Welsh")
    return _swap(items, item, replace(item, counterfactual_answer="Welsh", context=context))


def inject_titled_substitute(items):  # "Queen Victoria was one of the best-known American writers"
    item = _first(items, "person_name", lambda i, p: p["id"] == "harriet_beecher_stowe")
    context = item.context.replace(item.counterfactual_answer, "Queen Victoria")
    return _swap(items, item, replace(item, counterfactual_answer="Queen Victoria", context=context))


CASES = {
    "bio_birth_city_is_city": inject_birth_village,
    "bio_national_work": inject_national_work,
    "bio_nested_nationality": inject_nested_nationality,
    "bio_titled_substitute": inject_titled_substitute,
    "bio_nationality_implied": inject_nationality_implied,
    "bio_birth_city_not_born_in": inject_birth_city_not_born_in,
    "bio_birth_city_country": inject_birth_city_country,
    "bio_living_described_dead": inject_living_described_dead,
    "bio_substitute_incompatible": inject_substitute_incompatible,
    "bio_noun_as_adjective": inject_noun_as_adjective,
    "bio_nationality_also_true": inject_nationality_also_true,
    "bio_nationality_implausible": inject_nationality_implausible,
}


def test_every_extra_rule_has_a_case():
    from test_cf_bio_lives import CASES as V5_CASES
    from test_cf_bio_primacy import CASES as TIME_CASES
    from test_cf_bio_swaps import CASES as SWAP_CASES

    assert set(CASES) | set(V5_CASES) | set(SWAP_CASES) | set(TIME_CASES) == set(cf_bio.EXTRA_RULES)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_catches_injected_defect(items, rule):
    assert_caught(items, rule, CASES[rule])


def test_a_legacy_is_caught_for_the_living(items):  # "legacy" reads like an obituary
    item = _first(items, "person_name", lambda i, p: p["death_year"] is None)
    broken, bad_id = _swap(items, item, replace(item, context=item.context + " Her legacy continues to inspire."))
    hit = [line for line in failures(broken) if line.startswith("bio_living_described_dead:")]
    assert len(hit) == 1 and bad_id in hit[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_team_seeds_validate_with_enough_items(seed):
    items = build_validated("cf_bio", seed)
    # version 5 leaves out a name swap with no substitute of the same domain, language and forms, alive and
    # adult at the first work, and a nationality item whose works all name the real nationality or whose
    # language no other nationality fits; version 6 also one with no substitute or nationality of the person's
    # culture (a shared language); version 7 also one with no substitute of the stated nationality or, for a
    # scientist, of the same science, or born more than a generation apart (108 name swaps at every team seed)
    assert len(items) >= 580
    counts = Counter(i.relation for i in items)
    assert min(counts.values()) >= 100, counts


def test_living_people_are_in_the_present_tense(items):
    living = [i for i in items if PEOPLE[i.subject]["death_year"] is None]
    assert living
    for item in living:
        assert not contains(item.context, "died") and " was a " not in item.context, item.id
    assert all(i.question.startswith("What is") for i in living if i.relation == "nationality")


def test_nationality_items_name_no_place_and_take_noun_aliases(items):
    for item in (i for i in items if i.relation == "nationality"):
        person = PEOPLE[item.subject]
        places = [c for c in (person["birth_city"], person["death_city"]) if c and not contains(person["name"], c)]
        assert not any(contains(item.context, c) for c in places), item.id
        noun = person["nationality_noun"]
        assert noun in item.parametric_aliases or noun == person["nationality"], item.id
        assert item.counterfactual_answer not in person["nationality_aliases"]


def test_birth_city_items_keep_the_real_birth_country(items):
    for item in (i for i in items if i.relation == "birth_city"):
        person = PEOPLE[item.subject]
        expected = f"born in {item.counterfactual_answer}, in {country_in_text(person['birth_country'])}"
        assert expected.lower() in item.context.lower(), item.id  # "Born in ..." may open the passage
