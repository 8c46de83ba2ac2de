"""CF_Bio: a claim of primacy names the person's first listed work, and a country is named only in the years
it bore that name; each rule catches its defect, and the fact tables keep both promises."""

from dataclasses import replace

import pytest

from cf_tasks.text import contains
from dataset_builders import DEFAULT_SEED, bio_places, bio_plausible, bio_primacy, cf_bio, tables
from dataset_builders.common import country_in_text
from dataset_builders.validate import failures

from builds import assert_caught, built

PEOPLE = cf_bio.people_by_id()


@pytest.fixture(scope="module")
def items():
    return built("cf_bio", DEFAULT_SEED)


def _first(items, relation, where):
    return next(i for i in items if i.relation == relation and where(i, PEOPLE[i.subject]))


def _swap(items, old, new):
    return [new if i is old else i for i in items], old.id


def inject_primacy_claim(items):  # "Grieg is best known for the Holberg Suite": not what he is best known for
    item = _first(items, "birth_year", lambda i, p: len(p["works"]) > 1)
    person = PEOPLE[item.subject]
    told = f" {person['surname']} is best known for {person['works'][1]}."
    return _swap(items, item, replace(item, context=item.context + told))


def inject_country_out_of_time(items):  # "born in Boston, in the United States, in 1770"
    item = _first(items, "birth_year", lambda i, p: p["birth_country"] == "United States"
                  and contains(i.context, country_in_text("United States")))
    context = item.context.replace(item.counterfactual_answer, "1770")
    return _swap(items, item, replace(item, counterfactual_answer="1770", context=context))


def test_a_work_never_made_the_name(items):  # "Goya became famous for The Third of May 1808": he was before
    item = _first(items, "birth_year", lambda i, p: True)
    first = PEOPLE[item.subject]["works"][0]
    broken, bad_id = _swap(items, item, replace(item, context=item.context + f" The name became famous for {first}."))
    hit = [line for line in failures(broken) if line.startswith("bio_primacy_claim:")]
    assert len(hit) == 1 and bad_id in hit[0]


CASES = {"bio_primacy_claim": inject_primacy_claim, "bio_country_out_of_time": inject_country_out_of_time}


def test_every_rule_of_these_modules_has_a_case():
    assert set(CASES) == set(bio_primacy.RULES) | set(bio_places.RULES)
    assert set(CASES) <= set(cf_bio.EXTRA_RULES)
    assert "bio_primacy_claim" in cf_bio.AGREE_RULES


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_catches_injected_defect(items, rule):
    assert_caught(items, rule, CASES[rule])


@pytest.mark.parametrize("style", [cf_bio.DECLARATIVE, cf_bio.NARRATIVE])
def test_a_passage_without_the_first_work_claims_no_primacy_for_the_next(style):
    listed = ["the Emancipation Proclamation", "the Gettysburg Address"]
    kept = bio_primacy.work1_frames(style["work1"], listed, listed)
    assert kept == tuple(t for t in style["work1"] if not bio_primacy.ORIGIN.search(t))
    assert any(bio_primacy.PRIMACY.search(t) for t in style["work1"])  # the rule reads the frames it guards
    left = bio_primacy.work1_frames(style["work1"], listed[1:], listed)
    assert len(left) >= 3 and not any(bio_primacy.PRIMACY.search(t) for t in left)


def test_a_sentence_split_keeps_initials_and_numbered_titles_whole():
    text = "Above all, John F. Kennedy is known for Jimson Weed/White Flower No. 1. He lived in Washington."
    assert bio_plausible.sentences(text) == [  # the splitter the primacy rule reads sentences with
        "Above all, John F. Kennedy is known for Jimson Weed/White Flower No. 1", "He lived in Washington."]


def test_the_nationality_item_that_drops_the_first_work_tells_the_next_plainly(items):
    # Merkel's first work names Germany: her nationality passage starts from the refugee policy
    item = _first(items, "nationality", lambda i, p: p["id"] == "angela_merkel")
    assert contains(item.context, PEOPLE["angela_merkel"]["works"][1])
    assert not bio_primacy.PRIMACY.search(item.context), item.context


def test_every_real_birth_and_death_lies_within_its_countrys_years():
    years = tables.people_meta()["country_years"]
    named = {c for p in tables.people() for c in (p["birth_country"], p["death_country"]) if c}
    assert set(years) <= named  # no span for a country the table never names
    for p in tables.people():
        for kind in ("birth", "death"):
            country, year = p[f"{kind}_country"], p[f"{kind}_year"]
            assert country is None or bio_places.country_existed(country, year), (p["id"], kind, country, year)


@pytest.mark.parametrize(("country", "year", "existed"), [
    ("Pakistan", 1946, False), ("Pakistan", 1947, True), ("Holy Roman Empire", 1806, True),
    ("Holy Roman Empire", 1807, False), ("Czechoslovakia", 1917, False), ("Germany", 1471, True),
])
def test_a_country_fits_only_its_years(country, year, existed):
    assert bio_places.country_existed(country, year) is existed


def test_a_former_state_takes_its_article():
    assert country_in_text("Gold Coast") == "the Gold Coast"
    assert country_in_text("Holy Roman Empire") == "the Holy Roman Empire"
    assert country_in_text("Bohemia") == "Bohemia"


def test_no_listed_work_contains_another():  # "In the Hall of the Mountain King" beside "the Peer Gynt suites"
    for p in tables.people():
        works = [w.lower() for w in p["works"]]
        assert len(set(works)) == len(works), p["id"]
        assert not [(a, b) for a in works for b in works if a != b and a in b], p["id"]
