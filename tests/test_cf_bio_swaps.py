"""CF_Bio: nationality counterfactuals spread over every one that fits, and name-swap
substitutes of the nationality the passage states (``bio_swaps``)."""

import random
from collections import Counter
from dataclasses import replace

import pytest

from dataset_builders import DEFAULT_SEED, bio_swaps, cf_bio, tables
from dataset_builders.validate import failures
from builds import assert_caught

PEOPLE = cf_bio.people_by_id()
BY_NAME = {p["name"]: p for p in tables.people()}


@pytest.fixture(scope="module")
def items():
    return cf_bio.build(DEFAULT_SEED)


def inject_one_way(items):  # every American made Canadian, as in version 6
    american = [i for i in items if i.relation == "nationality" and i.parametric_answer == "American"]
    moved = {i.id: replace(i, counterfactual_answer="Canadian", context=i.context.replace(i.counterfactual_answer,
                                                                                          "Canadian"))
             for i in american}
    return [moved.get(i.id, i) for i in items], american[0].id


def inject_cross_nationality(items):  # "Aldous Huxley is an American novelist": the name argues against it
    item = next(i for i in items if i.relation == "person_name" and PEOPLE[i.subject]["nationality"] == "American"
                and PEOPLE[i.subject]["domain"] == "writer" and BY_NAME[i.counterfactual_answer]["nationality"] == "American"
                and "American" in i.context)
    swapped = replace(item, counterfactual_answer="Aldous Huxley", counterfactual_aliases=[],
                      context=item.context.replace(item.counterfactual_answer, "Aldous Huxley"))
    return [swapped if i is item else i for i in items], item.id


def inject_national_detail(items):  # "Susan B. Anthony ... a British activist ... appeared on a dollar coin"
    item = next(i for i in items if i.relation == "nationality" and i.subject == "susan_b_anthony")
    return [replace(i, context=i.context + " Anthony appeared on a dollar coin.") if i is item else i
            for i in items], item.id


CASES = {"bio_nationality_one_way": inject_one_way, "bio_substitute_nationality": inject_cross_nationality,
         "bio_national_detail": inject_national_detail}


def test_every_rule_has_a_case():
    assert set(CASES) == set(bio_swaps.rules(cf_bio.true_nationality_terms, cf_bio.nationality_choices))


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_catches_injected_defect(items, rule):
    assert_caught(items, rule, CASES[rule])


def test_a_nationality_with_a_single_fit_is_not_a_spread_defect(items):
    # Italian works fit only Swiss among the drawn nationalities: every Italian made Swiss is no defect
    italian = [i for i in items if i.relation == "nationality" and i.parametric_answer == "Italian"]
    assert len(italian) >= bio_swaps.SPREAD_MIN_ITEMS
    assert {c for i in italian for c in cf_bio.nationality_choices(PEOPLE[i.subject])} == {"Swiss"}
    assert not any(line.startswith("bio_nationality_one_way:") for line in failures(items))


def test_nationalities_spread_over_their_kin(items):
    # over the items that have a choice (a forced one, such as Swiss for a French writer whose works name
    # Belgium, neither counts nor weighs on the others)
    spread = {true: Counter(i.counterfactual_answer for i in items
                            if i.relation == "nationality" and i.parametric_answer == true
                            and len(cf_bio.nationality_choices(PEOPLE[i.subject])) > 1)
              for true in ("American", "English", "French", "German")}
    assert set(spread["American"]) >= {"Canadian", "British", "English", "Irish"}, spread  # not 28 of 28 Canadian
    assert len(spread["English"]) >= 4 and "American" in spread["English"], spread
    for true, counts in spread.items():
        assert max(counts.values()) - min(counts.values()) <= 2, (true, counts)


@pytest.mark.parametrize(("true", "other", "near"), [
    ("American", "English", True), ("English", "Australian", True), ("Mexican", "Spanish", True),
    ("Brazilian", "Portuguese", True),
    ("American", "Nigerian", False),  # English-speaking, but not kin
    ("American", "Mexican", True),  # same region (the language rule keeps it out of an English writer's draw)
    ("French", "Canadian", False),
])
def test_kin_of_another_region_is_plausible(true, other, near):
    assert cf_bio.nationality_is_plausible({"nationality": true}, other, 1950) is near
    assert bio_swaps.kin(true, other) == bio_swaps.kin(other, true)


def test_kin_names_only_known_nationalities_of_other_regions():
    table = {n["adjective"]: n for n in tables.people_meta()["nationalities"]}
    for adjective, entry in table.items():
        for other in entry.get("kin", []):
            assert other in table and table[other]["region"] != entry["region"], (adjective, other)
            assert adjective in table[other].get("kin", []), (adjective, other)  # listed both ways


def test_balanced_choice_spreads_evenly():
    used, rng = Counter(), random.Random(0)
    drawn = Counter(bio_swaps.balanced_choice("American", ["Canadian", "British", "Irish"], used, rng) for _ in range(9))
    assert drawn == Counter({"Canadian": 3, "British": 3, "Irish": 3})
    # a person who fits only one takes it, and the others catch up after
    assert bio_swaps.balanced_choice("American", ["Irish"], used, rng) == "Irish"
    assert bio_swaps.balanced_choice("American", ["Canadian", "Irish"], used, rng) == "Canadian"


@pytest.mark.parametrize(("person", "sub", "fits"), [
    ("abraham_lincoln", "benjamin_disraeli", False),  # same culture, another nationality
    ("arthur_conan_doyle", "rudyard_kipling", True),  # an English substitute for a British person
    ("ernest_hemingway", "jd_salinger", True),
])
def test_a_substitute_is_of_the_stated_nationality(person, sub, fits):
    assert bio_swaps.substitute_nationality_fits(PEOPLE[person], PEOPLE[sub]) is fits


def test_national_details_are_phrases_of_the_persons_sentences():
    about = {r["person"]: r for r in tables.load_table("people_about.json")}
    details = {person: r["national"] for person, r in about.items() if "national" in r}
    assert {"hillary_clinton", "susan_b_anthony", "georgia_okeeffe"} <= set(details)
    for person, phrases in details.items():
        assert all(any(p in t for t in about[person]["sentences"]) for p in phrases), person


def test_a_substitute_of_another_nationality_is_told_without_nationality_or_place(items):
    crossed = [i for i in items if i.relation == "person_name"
               and not bio_swaps.substitute_nationality_fits(PEOPLE[i.subject], BY_NAME[i.counterfactual_answer])]
    assert crossed
    for item in crossed:
        person = PEOPLE[item.subject]
        assert not person.get("national_works"), item.id
        words = [*bio_swaps.nationality_words(), person["birth_city"], *filter(None, [person["death_city"]]),
                 *bio_swaps.national_details(person)]
        assert not [w for w in words if cf_bio.contains(item.context, w)], item.id
        assert all(w in item.context for w in person["works"][:2]), item.id  # the question's works are told
