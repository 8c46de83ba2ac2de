"""Training points: the invented entities' rules (each with its injected defect), the kinds' shapes,
and the disjointness rule that keeps every held-out subject out of the training data."""

import copy

import pytest

from cf_tasks.text import contains
from dataset_builders import invented
from dataset_builders.split import mentions_heldout, split_of
from dataset_builders.training import (
    KINDS, TrainingDataError, check_training, disjointness_failures, point_text, training_points,
)


@pytest.fixture(scope="module")
def c_points():
    return invented.invented_points(1234)


@pytest.fixture(scope="module")
def cf_points():
    return training_points("CF", 1234)


@pytest.fixture(scope="module")
def cs_s_points():
    return training_points("CS", 1234), training_points("S", 1234)


def _find(points, family, relation):
    return copy.deepcopy(next(p for p in points if p["family"] == family and p["relation"] == relation))


def test_c_points_are_valid_seeded_and_cover_the_families(c_points):
    assert invented.failures(c_points) == []
    assert {p["family"] for p in c_points} == {"cf_capitals", "cf_world_facts", "cf_bio"}
    assert {p["relation"] for p in c_points} >= set(invented.WORLD_RELATIONS) | set(invented.BIO_RELATIONS)
    assert invented.invented_points(1234) == c_points
    assert [p["input"] for p in invented.invented_points(7)] != [p["input"] for p in c_points]


def test_c_point_reads_like_its_evaluation_twin(c_points):
    capital = _find(c_points, "cf_capitals", "country_capital")
    assert capital["instruction"] == f"What is the capital of {capital['subject']}?"
    born = _find(c_points, "cf_bio", "birth_year")
    assert born["instruction"] == f"In what year was {born['subject']} born?"
    assert f"in {born['output']}" in born["input"].lower()  # "In 1882, ..." or "born in 1882"


def _inject(points, index, **changes):
    points = copy.deepcopy(points)
    points[index].update(changes)
    return points


def _broken(points, rule):
    return invented.RULES[rule][1](points)


@pytest.mark.parametrize("rule, real", [("c_no_real_name", "Lincoln"), ("c_no_real_place", "Kandahar"),
                                        ("c_not_common_word", "Window")])
def test_c_rule_catches_a_real_or_common_token(c_points, rule, real):
    p = c_points[3]
    token = p["invented"][0]
    bad = _inject(c_points, 3, invented=[real, *p["invented"][1:]], input=p["input"].replace(token, real),
                  instruction=p["instruction"].replace(token, real), output=p["output"].replace(token, real),
                  subject=p["subject"].replace(token, real))
    assert _broken(bad, rule) == [p["id"]]


def test_c_rule_catches_an_unlisted_invented_word(c_points):
    p = c_points[5]
    bad = _inject(c_points, 5, input=p["input"] + " Zorblaxian traders visit it.")
    assert _broken(bad, "c_unvetted_word") == [p["id"]]


def test_c_rule_catches_an_unstated_answer(c_points):
    p = c_points[8]
    bad = _inject(c_points, 8, input=p["input"].replace(p["output"], "Somewhere"))
    assert _broken(bad, "c_states_answer") == [p["id"]]


@pytest.mark.parametrize("defect", ["foreign_entity", "stray_year", "stated_twice"])
def test_c_rule_catches_an_inconsistent_passage(c_points, defect):
    capital = next(i for i, p in enumerate(c_points) if p["relation"] == "country_capital")
    p, other = c_points[capital], c_points[capital + 1]
    extra = {"foreign_entity": f"{other['output']} is a city of {p['subject']}.",
             "stray_year": f"{p['subject']} was founded in 1712.",
             "stated_twice": f"{p['output']} lies on a river."}[defect]
    bad = _inject(c_points, capital, input=p["input"] + " " + extra)
    assert _broken(bad, "c_self_consistent") == [p["id"]]


@pytest.mark.parametrize("defect", ["article", "lower_case", "doubled", "placeholder"])
def test_c_rule_catches_bad_grammar(c_points, defect):
    bio = next(i for i, p in enumerate(c_points) if p["family"] == "cf_bio" and " a " in p["input"])
    p = c_points[bio]
    text = {"article": p["input"].replace(" a ", " an ", 1),
            "lower_case": p["input"] + " then nothing happened.",
            "doubled": p["input"].replace(" was ", " was was ", 1),
            "placeholder": p["input"] + " {Subject} rests."}[defect]
    assert text != p["input"]
    assert _broken(_inject(c_points, bio, input=text), "c_grammar") == [p["id"]]


def test_invented_rules_fail_the_whole_export_in_one_line_per_rule(c_points):
    p = c_points[0]
    bad = _inject(c_points, 0, input=p["input"].replace(p["output"], "Somewhere"))
    with pytest.raises(TrainingDataError) as err:
        check_training(bad)
    assert str(err.value).startswith("c_states_answer:") and p["id"] in str(err.value)


# --- CS, S and CF ---------------------------------------------------------------------------------

def test_cs_and_s_share_their_facts(cs_s_points):
    cs, s = cs_s_points
    assert cs and [p["fact_id"] for p in cs] == [p["fact_id"] for p in s]
    assert len({p["fact_id"] for p in cs}) == len(cs)  # one point per fact
    for a, b in zip(cs, s):
        assert a["kind"] == "CS" and b["kind"] == "S" and b["input"] == ""
        assert a["instruction"] == b["instruction"] and a["output"] == b["output"]
    # the passage states the true answer
    assert all(contains(p["input"], p["output"]) for p in cs)


def test_cf_points_are_the_training_parts_counterfactual_items(cf_points):
    from dataset_builders import build

    items = {i.id: i for f in ("cf_capitals", "cf_world_facts", "cf_bio") for i in build(f, 1234)}
    assert {p["family"] for p in cf_points} == {"cf_capitals", "cf_world_facts", "cf_bio"}
    for p in cf_points:
        item = items[p["id"].removeprefix("CF-")]
        assert p["output"] == item.counterfactual_answer and p["input"] == item.context
        assert split_of(item.dataset, item.subject) == "train"


def test_every_kind_is_disjoint_from_the_heldout_part(c_points, cf_points, cs_s_points):
    points = c_points + cf_points + cs_s_points[0] + cs_s_points[1]
    assert {p["kind"] for p in points} == set(KINDS)
    assert disjointness_failures(points) == []
    assert not any(mentions_heldout(point_text(p)) for p in points)


def test_an_injected_overlap_fails_in_one_line_naming_the_ids(cf_points):
    points = copy.deepcopy(cf_points)
    assert split_of("cf_capitals", "France") == "heldout"
    points[2]["input"] += " Many visitors also travel to France."
    points[7]["answer_aliases"] = ["the Mona Lisa"]
    lines = disjointness_failures(points)
    assert len(lines) == 1 and lines[0].startswith("heldout_disjoint:")
    assert f"{points[2]['id']} (France)" in lines[0] and f"{points[7]['id']} (the Mona Lisa)" in lines[0]


def test_a_point_about_a_heldout_subject_fails(cf_points):
    points = copy.deepcopy(cf_points)
    points[0]["subject"] = "Germany"
    lines = disjointness_failures(points)
    assert len(lines) == 1 and lines[0].startswith("heldout_subject:") and points[0]["id"] in lines[0]


def test_unknown_kind_is_one_line():
    with pytest.raises(ValueError, match="unknown kind 'X'; choose from C, CS, S, CF"):
        training_points("X")
