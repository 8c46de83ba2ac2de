"""cf_world_facts v5: a counterfactual that nothing in the passage argues against (the creator's form and
culture, the language of a place's name, a description a filler would contradict), passages without the
template slips a reviewer found, a ``_former`` passage as long as its twin, and answers scored in every
form they are remembered in. Each rule is shown to catch a defect injected into a valid build."""

import copy
from dataclasses import replace

import pytest

from cf_tasks.scoring import score, score_quote
from dataset_builders import DEFAULT_SEED, build, cf_world_facts, cues, tables
from dataset_builders.schema import fill
from dataset_builders.validate import failures

from conftest import seed_matrix
from builds import assert_clean

SEEDS = seed_matrix()


@pytest.fixture(scope="module")
def items():
    return build("cf_world_facts", DEFAULT_SEED)


@pytest.fixture(scope="module")
def former():
    return build("cf_world_facts_former", DEFAULT_SEED)


def _item(items, relation, subject):
    return next(i for i in items if i.relation == relation and i.subject == subject)


def _inject(items, old, **changes):
    new = replace(old, **changes)
    return [new if i is old else i for i in items], old.id


def _hit(lines, rule, bad_id):
    hit = [line for line in lines if line.startswith(rule + ":")]
    return len(hit) == 1 and bad_id in hit[0]


def inject_poet_for_a_russian_novel(items):  # Crime and Punishment by Walt Whitman (alive, adult, a poet)
    return _inject(items, _item(items, "book_author", "Crime and Punishment"), counterfactual_answer="Walt Whitman",
                   counterfactual_aliases=["Whitman"])


def inject_german_for_an_italian_opera(items):  # Rigoletto (1851) by Richard Wagner (an opera composer)
    return _inject(items, _item(items, "composition_composer", "Rigoletto"), counterfactual_answer="Richard Wagner",
                   counterfactual_aliases=["Wagner"])


def inject_dutch_painter_for_guernica(items):  # Guernica (1937) by Piet Mondrian (alive, adult, a painter)
    return _inject(items, _item(items, "painting_painter", "Guernica"), counterfactual_answer="Piet Mondrian",
                   counterfactual_aliases=["Mondrian"])


def inject_sound_inventor_for_a_vaccine(items):  # the rabies vaccine (1885) by Thomas Edison (alive, adult)
    return _inject(items, _item(items, "invention_inventor", "the rabies vaccine"),
                   counterfactual_answer="Thomas Edison", counterfactual_aliases=["Edison"])


def inject_disc_maker_for_the_phonograph(items):  # its tinfoil and wax cylinders set it against Berliner's discs
    return _inject(items, _item(items, "invention_inventor", "the phonograph"), counterfactual_answer="Emile Berliner",
                   counterfactual_aliases=["Berliner"])


def inject_bosch_for_a_portrait(items):  # Lady with an Ermine by Hieronymus Bosch, who painted no portraits
    return _inject(items, _item(items, "painting_painter", "Lady with an Ermine"),
                   counterfactual_answer="Hieronymus Bosch", counterfactual_aliases=["Bosch"])


def inject_mexico_for_a_quechua_name(items):  # Cotopaxi in Mexico: Spanish-speaking, but the name is Quechua
    item = _item(items, "mountain_country", "Cotopaxi")
    return _inject(items, item, counterfactual_answer="Mexico",
                   context=item.context.replace(item.counterfactual_answer, "Mexico"))


def inject_german_name_in_moscow(items):  # Schönbrunn Palace in Moscow
    item = _item(items, "landmark_city", "Schönbrunn Palace")
    return _inject(items, item, counterfactual_answer="Moscow",
                   context=item.context.replace(item.counterfactual_answer, "Moscow"))


def inject_contradicted_filler(items):  # "never fully built" beside "later improvements"
    item = _item(items, "invention_inventor", "the Analytical Engine")
    return _inject(items, item, context=item.context + " Later improvements made the Analytical Engine far more reliable.")


def inject_fact_denied_filler(items):  # the Liberty Bell, shown indoors (its relations.json fact), at sunset
    item = _item(items, "landmark_city", "the Liberty Bell")
    return _inject(items, item, context=item.context + " The Liberty Bell is especially striking at sunset.")


def inject_fact_denied_answer_sentence(items):  # the Statue of Liberty, on an island, "in the heart of" a city
    item = _item(items, "landmark_city", "the Statue of Liberty")
    return _inject(items, item, context=item.context + f" The statue stands in the heart of {item.counterfactual_answer}.")


def inject_kind_twice(items):
    item = next(i for i in items if i.relation == "landmark_city" and "the landmark" not in i.context.lower())
    return _inject(items, item, context=item.context + " The landmark is especially striking at sunset."
                   " Souvenir shops sell miniature models of the landmark.")


def inject_it_after_other_noun(items):
    item = next(i for i in items if i.relation == "landmark_city")
    return _inject(items, item, context=item.context + f" The history of {item.subject} is told in several museum "
                   "exhibitions. It is especially striking at sunset.")


def inject_museum_before_named(items):
    item = next(i for i in items if i.relation == "painting_museum" and i.answer_position != "beginning")
    return _inject(items, item, context=f"{item.subject[:1].upper()}{item.subject[1:]} is one of the highlights of "
                   f"the museum's collection. {item.context}")


def inject_state_for_a_city(items):  # "Washington" accepted for the Space Needle's city
    item = _item(items, "landmark_city", "the Space Needle")
    return _inject(items, item, parametric_aliases=[*item.parametric_aliases, "Washington"])


def inject_filler_twice(items):  # "It rewards a long, slow look." beside the same filler with the name
    item = next(i for i in items if i.relation == "painting_museum")
    return _inject(items, item, context=item.context + f" It rewards a long, slow look. {item.subject[:1].upper()}"
                   f"{item.subject[1:]} rewards a long, slow look.")


def inject_double_stop(items):  # "... the best-known sights of Washington, D.C.."
    item = next(i for i in items if i.relation == "landmark_city")
    return _inject(items, item, context=item.context.rstrip(".") + "..")


CASES = {
    "single_full_stop": [inject_double_stop],
    "creator_fits_work": [inject_poet_for_a_russian_novel, inject_german_for_an_italian_opera,
                          inject_dutch_painter_for_guernica, inject_sound_inventor_for_a_vaccine,
                          inject_disc_maker_for_the_phonograph, inject_bosch_for_a_portrait],
    "place_speaks_name": [inject_german_name_in_moscow, inject_mexico_for_a_quechua_name],
    "description_not_contradicted": [inject_contradicted_filler, inject_fact_denied_filler,
                                     inject_fact_denied_answer_sentence],
    "kind_once": [inject_kind_twice],
    "template_once": [inject_filler_twice],
    "it_follows_subject": [inject_it_after_other_noun],
    "museum_named_first": [inject_museum_before_named],
    "city_answer_only_city": [inject_state_for_a_city],
}


def test_every_new_rule_has_a_case():
    assert set(CASES) == set(cues.RULES) and "former_length_matched" in cf_world_facts.EXTRA_RULES
    assert set(cues.RULES) <= set(cf_world_facts.EXTRA_RULES)


@pytest.mark.parametrize("rule,inject", [(r, f) for r, fs in CASES.items() for f in fs],
                         ids=lambda x: getattr(x, "__name__", x))
def test_rule_catches_injected_defect(items, rule, inject):
    assert_clean(items)
    broken, bad_id = inject(items)
    assert _hit(failures(broken), rule, bad_id), failures(broken)


@pytest.mark.parametrize("rule,inject", [("kind_once", inject_kind_twice), ("it_follows_subject", inject_it_after_other_noun)])
def test_text_rules_hold_for_the_twins_too(rule, inject):
    twins = build("cf_world_facts_agree", DEFAULT_SEED)
    assert failures(twins) == []
    broken, bad_id = inject(twins)
    assert _hit(failures(broken), rule, bad_id)


def test_former_passage_as_long_as_its_twin(former):
    pairs = cf_world_facts.build_pairs("cf_world_facts_former", former[0].version, DEFAULT_SEED, former=True)
    gaps = [len(i.context.split()) - len(" ".join(a).split()) for i, a in pairs]
    assert abs(sum(gaps) / len(gaps)) <= cues.FORMER_LENGTH_GAP
    padded = [replace(i, context=i.context + " This sentence adds words that its twin does not have at all.")
              for i in former]
    assert [line for line in failures(padded) if line.startswith("former_length_matched:")]
    assert not [line for line in failures(former) if line.startswith("former_length_matched:")]


def test_tables_give_every_true_creator_and_place_the_cues_of_its_own_work():
    """The true answer always fits its own cues (else the cues, not the counterfactual, are wrong)."""
    for record in tables.relations():
        for fact in record["facts"]:
            if "creator_traits" in record:
                assert cues.creator_fits(record, fact, fact["answer"]), fact["subject"]
            if "languages" in record or record["relation"] == "mountain_country":
                if not fact.get("name_implies_answer"):
                    assert "name_languages" in fact, fact["subject"]
                    assert cues.speaks_name(record, fact, fact["answer"]), fact["subject"]


@pytest.mark.parametrize("relation", ["book_author", "composition_composer", "painting_painter",
                                      "invention_inventor"])
def test_counterfactual_creators_share_form_and_culture(items, relation):
    traits = cf_world_facts.relations_by_name()[relation]["creator_traits"]
    drawn = [i for i in items if i.relation == relation]
    assert len(drawn) >= 30
    for item in drawn:
        fact = cf_world_facts.facts_by_subject()[(relation, item.subject)]
        own = traits[item.counterfactual_answer]
        forms = [fact["form"]] if isinstance(fact["form"], str) else fact["form"]
        assert set(forms) & set(own["forms"]), item.id
        assert "cultures" not in fact or set(fact["cultures"]) & set(own["cultures"]), item.id


def test_works_whose_cues_no_other_creator_fits_are_left_out(items):
    subjects = {i.subject for i in items if i.relation in ("composition_composer", "painting_painter")}
    assert "Rhapsody in Blue" not in subjects  # no other jazz composer
    assert "the Venus of Urbino" not in subjects  # no other Italian painter alive and adult in 1538
    assert "Washington Crossing the Delaware" not in subjects  # no other American painter in 1851
    assert "Liberty Leading the People" not in subjects  # the French revolution of 1830: no other French painter
    landmarks = {i.subject for i in items if i.relation == "landmark_city"}
    assert "the Sagrada Família" not in landmarks  # a Catalan name: no other Catalan-speaking city
    fields = {i.counterfactual_answer for i in items if i.subject == "the smallpox vaccine"}
    assert fields and fields <= {"Philippe Pinel", "Benjamin Rush", "René Laennec", "Louis Pasteur", "Robert Koch",
                                 "Joseph Lister", "Howard Florey", "Jonas Salk"}  # physicians only


def test_every_other_inventor_has_one_lifespan_and_its_fields():
    record = cf_world_facts.relations_by_name()["invention_inventor"]
    spans = cf_world_facts.lifespans("invention_inventor")
    for other in record["other_answers"]:
        assert other["answer"] in spans and other["answer"] in record["creator_traits"], other["answer"]
    broken = {**record, "creator_traits": {k: v for k, v in record["creator_traits"].items() if k != "Robert Koch"}}
    fact = next(f for f in record["facts"] if f["subject"] == "the rabies vaccine")
    with pytest.raises(ValueError, match="Robert Koch.*creator_traits"):
        cues.creator_fits(broken, fact, "Robert Koch")


def test_a_state_is_not_a_city_answer(items):
    item = _item(items, "landmark_city", "the Space Needle")
    assert "Washington" not in item.parametric_aliases
    assert not score("It is in Washington.", item.counterfactual_answer, item.parametric_answer,
                     item.counterfactual_aliases, item.parametric_aliases).parametric
    assert all(i.counterfactual_answer != "Washington, D.C." for i in items if i.subject == "the Space Needle")


def test_quote_endings_score_in_every_remembered_form():
    quotes = build("cf_quotes", DEFAULT_SEED)
    item = next(i for i in quotes if i.parametric_answer == "midstream")
    assert item.parametric_aliases == ["mid-stream"]
    outcome = score_quote(" mid-stream.", item.question, item.counterfactual_answer, item.parametric_answer,
                          parametric_aliases=item.parametric_aliases)
    assert outcome.parametric and not outcome.counterfactual
    assert not score_quote(" mid-stream.", item.question, item.counterfactual_answer, item.parametric_answer).parametric
    broken = [replace(i, parametric_aliases=[]) if i is item else i for i in quotes]
    assert _hit(failures(broken), "quote_spelling_variant", item.id)


@pytest.mark.parametrize("name", ["ic_recall", "ic_recall_cf"])
def test_ic_recall_language_queries_accept_other_official_languages(name):
    built = build(name, DEFAULT_SEED)
    swiss = [i for i in built if i.relation == "country_language" and len(i.parametric_aliases) > 0]
    assert swiss, "no language query with another official language"
    item = swiss[0]
    broken = [replace(i, parametric_aliases=[]) if i is item else i for i in built]
    assert _hit(failures(broken), "ic_other_truths_accepted", item.id)
    assert failures(built) == []


def test_a_fact_denies_only_what_its_relation_presumes():
    """Every ``denies`` key of a fact (relations.json) or description (about.json) names a ``presumes`` key of
    its relation, every presumed template is one of the relation's, and no fact loses a whole pool."""
    for record in tables.relations():
        assert cues.presumes_problems(record) == [], record["relation"]
        for fact in record["facts"]:
            assert set(fact.get("denies", [])) <= set(record.get("presumes", {})), fact["subject"]
    landmarks = cf_world_facts.relations_by_name()["landmark_city"]
    assert "the Liberty Bell" not in tables.about()  # its denial comes from its fact, not a description
    assert "{Subject} {is} especially striking at sunset." in cues.contradicted_templates(landmarks, "the Liberty Bell")


def test_a_misspelt_denial_fails_in_one_line_naming_the_fact_and_the_fix():
    record = copy.deepcopy(cf_world_facts.relations_by_name()["landmark_city"])
    bell = next(f for f in record["facts"] if f["subject"] == "the Liberty Bell")
    bell["denies"] = ["outdoor"]  # the key is "outdoors"
    with pytest.raises(ValueError) as err:
        cf_world_facts.prepared_facts(record)
    message = str(err.value)
    assert "\n" not in message and "the Liberty Bell" in message and "'outdoor'" in message
    assert "fix the key or add it to presumes" in message


def test_a_misspelt_presumed_template_fails():
    record = copy.deepcopy(cf_world_facts.relations_by_name()["landmark_city"])
    record["presumes"]["outdoors"] = ["{Subject} is especially striking at sunset."]  # not the template's {is}
    with pytest.raises(ValueError, match="no template of the relation; copy the template exactly"):
        cf_world_facts.prepared_facts(record)


def test_denied_templates_stay_out_of_every_pool(items, former):
    """A denied answer or former sentence is left out too, not only reasons and fillers."""
    for item in [*items, *former]:
        if item.subject in ("the Statue of Liberty", "Christ the Redeemer", "Times Square"):
            assert "in the heart of" not in item.context, item.id
        if item.subject == "Times Square":
            assert "stands in" not in item.context and "built in" not in item.context, item.id


def test_a_plural_subject_is_them_as_an_object(items):
    """"even if they have never seen them": ``{them}`` is the object form ("it" for one subject)."""
    record = cf_world_facts.relations_by_name()["landmark_city"]
    template = next(t for pool in cues.SUBJECT_POOLS for t in record[pool] if "never seen" in t)
    assert fill(template, subject="the Spanish Steps", **cf_world_facts.number_values(True)).endswith(
        "never seen them in person.")
    assert fill(template, subject="the Colosseum", **cf_world_facts.number_values(False)).endswith(
        "never seen it in person.")
    every = items + build("cf_world_facts_agree", DEFAULT_SEED)
    assert not [i.id for i in every if "seen they" in i.context or "{" in i.context]
