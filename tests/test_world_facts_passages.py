"""cf_world_facts v2 and cf_world_facts_former: plausible counterfactuals from the tables, and each
world-facts validator rule shown to catch a defect injected into an otherwise valid build."""

from collections import Counter
from dataclasses import replace

import pytest

from cf_tasks.text import contains_any
from dataset_builders import DEFAULT_SEED, build, cf_world_facts, cues, tables
from dataset_builders.common import same_answer
from dataset_builders.validate import build_validated, failures

from conftest import seed_matrix
from builds import assert_clean

SEEDS = seed_matrix()


@pytest.fixture(scope="module")
def items():
    return build("cf_world_facts", DEFAULT_SEED)


def _item(items, relation, subject):
    return next(i for i in items if i.relation == relation and i.subject == subject)


def _inject(items, old, **changes):
    new = replace(old, **changes)
    return [new if i is old else i for i in items], old.id


def _hit(lines, rule, bad_id):
    hit = [line for line in lines if line.startswith(rule + ":")]
    return len(hit) == 1 and bad_id in hit[0]


def inject_creator_outside_time(items):  # Nineteen Eighty-Four (1949) by J. K. Rowling (born 1965)
    return _inject(items, _item(items, "book_author", "Nineteen Eighty-Four"), counterfactual_answer="J. K. Rowling",
                   counterfactual_aliases=["Rowling"])


def inject_inventor_long_dead(items):  # the World Wide Web (1989) by James Hargreaves (died 1778)
    return _inject(items, _item(items, "invention_inventor", "the World Wide Web"),
                   counterfactual_answer="James Hargreaves", counterfactual_aliases=["Hargreaves"])


def inject_container_of_truth(items):  # the Ganges empties into the Bay of Bengal, which lies in the Indian Ocean
    return _inject(items, _item(items, "river_mouth", "the Ganges"), counterfactual_answer="the Indian Ocean",
                   counterfactual_aliases=["Indian Ocean"])


def inject_part_of_truth(items):  # the Amazon empties into the Atlantic; the North Sea lies in it
    return _inject(items, _item(items, "river_mouth", "the Amazon"), counterfactual_answer="the North Sea",
                   counterfactual_aliases=["North Sea"])


def inject_same_metro_area(items):  # Ford is in Dearborn, a suburb of Detroit
    return _inject(items, _item(items, "company_headquarters", "Ford"), counterfactual_answer="Detroit",
                   counterfactual_aliases=[])


def inject_mouth_outside_region(items):  # the Volga into the Arabian Sea
    return _inject(items, _item(items, "river_mouth", "the Volga"), counterfactual_answer="the Arabian Sea",
                   counterfactual_aliases=["Arabian Sea"])


def inject_singular_verb(items):
    item = _item(items, "landmark_city", "the Spanish Steps")
    return _inject(items, item, context=item.context + " The Spanish Steps is busy every day.")


def inject_unstated_change(items):
    item = _item(items, "company_headquarters", "Apple")
    return _inject(items, item, context=item.context + " Executives at Apple have no plans to relocate.")


def inject_denied_change(items):
    former = build("cf_world_facts_former", DEFAULT_SEED)
    item = next(i for i in former if "moved its headquarters" in i.context)
    return _inject(former, item, context=item.context + f" Executives at {item.subject} have no plans to relocate.")


def inject_lowercase_start(items):
    item = _item(items, "painting_museum", "the Mona Lisa")
    return _inject(items, item, context=item.context + f" {item.counterfactual_answer} is proud of it.")


def inject_dangling_sentence(items):
    item = _item(items, "company_headquarters", "Nike")
    dangling = " The location was chosen because of the skilled workforce nearby."
    return _inject(items, item, context=item.context + dangling)


def inject_museum_outside_period(items):  # a 1931 Dalí in the Mauritshuis (Dutch Golden Age)
    return _inject(items, _item(items, "painting_museum", "The Persistence of Memory"),
                   counterfactual_answer="the Mauritshuis", counterfactual_aliases=["Mauritshuis"])


def inject_container_accepted(items):  # the English Channel for the Thames, with the Atlantic still a true alias
    item = next(i for i in items if i.subject == "the Thames")
    return _inject(items, item, counterfactual_answer="the English Channel", counterfactual_aliases=["English Channel"],
                   context=item.context.replace(item.counterfactual_answer, "the English Channel"),
                   parametric_aliases=[*item.parametric_aliases, "the Atlantic Ocean"])


def inject_name_gives_answer(items):  # the AK-47 (Avtomat Kalashnikova) by Richard Arkwright
    item = items[0]
    return _inject(items, item, relation="invention_inventor", subject="the AK-47",
                   parametric_answer="Mikhail Kalashnikov", parametric_aliases=["Kalashnikov"])


def inject_answer_only_implied(items):  # "Visitors to Rome rarely leave without seeing the Eiffel Tower."
    item = next(i for i in items if i.relation == "landmark_city")
    others = [s for s in cf_world_facts.sentences(item.context) if not contains_any(s, [item.counterfactual_answer])]
    implied = f"Visitors to {item.counterfactual_answer} rarely leave without seeing {item.subject}."
    return _inject(items, item, context=" ".join([*others, implied]))


def inject_moved_abroad(items):  # Nokia from Espoo to Stockholm
    return _inject(items, next(i for i in items if i.subject == "Nokia"), counterfactual_answer="Stockholm",
                   counterfactual_aliases=[])


def inject_year_outside_answer(items):  # a detail that dates the work can rule out a creator
    item = _item(items, "painting_painter", "The Starry Night")
    return _inject(items, item, context=item.context + " The painting was finished in 1889.")


def inject_place_outside_answer(items):  # a detail that places the company contradicts another city
    item = next(i for i in items if i.subject == "Nike")
    return _inject(items, item, context=item.context + " The company sells most of its shoes in Germany.")


def inject_person_outside_answer(items):  # a named maker in a description sentence
    item = next(i for i in items if i.relation == "book_author")
    return _inject(items, item, context=item.context + " It was admired by Charles Dickens.")


CASES = {
    "names_only_in_answer_sentence": [inject_year_outside_answer, inject_place_outside_answer,
                                      inject_person_outside_answer],
    "container_not_true_answer": [inject_container_accepted],
    "name_gives_answer": [inject_name_gives_answer],
    "answer_stated": [inject_answer_only_implied],
    "headquarters_same_country": [inject_moved_abroad],
    "creator_in_time": [inject_creator_outside_time, inject_inventor_long_dead],
    "counterfactual_not_true": [inject_container_of_truth, inject_part_of_truth, inject_same_metro_area],
    "counterfactual_in_region": [inject_mouth_outside_region],
    "plural_agreement": [inject_singular_verb],
    "no_unstated_change": [inject_unstated_change, inject_denied_change],
    "sentence_case": [inject_lowercase_start],
    "sentence_refers_to_subject": [inject_dangling_sentence],
    "museum_collects_period": [inject_museum_outside_period],
}


def test_every_world_facts_rule_has_a_case():  # the cues rules have theirs in test_world_facts_cues.py
    # the cues rules and former_length_matched have theirs in test_world_facts_cues.py
    assert set(CASES) | set(cues.RULES) | {"former_length_matched"} == set(cf_world_facts.EXTRA_RULES)


@pytest.mark.parametrize("rule,inject", [(r, f) for r, fs in CASES.items() for f in fs],
                         ids=lambda x: getattr(x, "__name__", x))
def test_rule_catches_injected_defect(items, rule, inject):
    assert_clean(items)
    broken, bad_id = inject(items)
    assert _hit(failures(broken), rule, bad_id), failures(broken)


@pytest.mark.parametrize("seed", SEEDS)
def test_both_datasets_validate_on_every_seed(seed):
    default = build_validated("cf_world_facts", seed)
    former = build_validated("cf_world_facts_former", seed)
    # facts without a candidate that fits every cue are left out (753 and 328 items in version 5, 697 and 319
    # in version 7, where painters share the title's culture and inventors the field)
    assert len(default) >= 680 and len(former) >= 300
    assert not any(i.mentions_parametric for i in default) and all(i.mentions_parametric for i in former)
    for built in (default, former):
        shares = Counter(i.answer_position for i in built)
        assert all(0.25 <= shares[p] / len(built) <= 0.40 for p in ("beginning", "middle", "end"))


def test_former_items_name_the_true_answer_and_default_items_do_not(items):
    former = build("cf_world_facts_former", DEFAULT_SEED)
    assert all(contains_any(i.context, [i.parametric_answer, *i.parametric_aliases]) for i in former)
    assert not any(contains_any(i.context, [i.parametric_answer, *i.parametric_aliases]) for i in items)
    assert all(i.id.startswith("cf_world_facts_former-") and i.dataset == "cf_world_facts_former" for i in former)


def test_items_of_a_fact_have_distinct_counterfactuals(items):
    pairs = Counter((i.relation, i.subject, i.counterfactual_answer) for i in items)
    assert max(pairs.values()) == 1


def test_true_creators_fit_their_works_and_have_one_lifespan():
    for record in tables.relations():
        if "creators" not in record:
            continue
        spans = cf_world_facts.lifespans(record["relation"])  # raises unless exactly one home per creator
        people = {n for p in tables.people() for n in (p["name"], *p["aliases"])}
        assert not people & set(record["creators"]), record["relation"]
        for fact in record["facts"]:
            if fact["year"] is not None:
                birth, death = spans[fact["answer"]]
                assert birth + 15 <= fact["year"] and (death is None or fact["year"] <= death), fact


def test_water_bodies_are_known_and_containers_count_as_true():
    record = next(r for r in tables.relations() if r["relation"] == "river_mouth")
    known = {a for a, _ in cf_world_facts.answer_pool(record)}
    assert {b for bodies in record["regions"].values() for b in bodies} <= known
    assert set(record["within"]) | {c for cs in record["within"].values() for c in cs} <= known
    assert all(f["region"] in record["regions"] for f in record["facts"])
    ganges = next(f for f in cf_world_facts.prepared_facts(record) if f["subject"] == "the Ganges")
    assert "the Indian Ocean" in ganges["answer_aliases"]
    assert not any(same_answer(a, "the Indian Ocean") for a, _ in ganges["cf_pool"])


def test_plural_subjects_agree(items):
    steps = [i for i in items if i.subject == "the Spanish Steps"]
    assert steps and all(i.question == "In which city are the Spanish Steps located?" for i in steps)


def test_a_subject_whose_name_places_it_gets_no_counterfactual():
    """Westminster Abbey in Moscow contradicts its own name: such facts are flagged in the table."""
    from dataset_builders import build, tables

    flagged = {f["subject"] for r in tables.relations() for f in r["facts"] if f.get("name_implies_answer")}
    assert {"Westminster Abbey", "the Hollywood Sign", "the Louvre Pyramid", "India Gate", "the CN Tower",
            "the AK-47"} <= flagged
    for name in ("cf_world_facts", "cf_world_facts_former"):
        assert not {i.subject for i in build(name, 1234)} & flagged, name


def test_about_sentences_are_neutral_and_the_check_catches_each_defect():
    assert cf_world_facts.about_problems() == []
    injected = ({"subject": "the Eiffel Tower", "sentences": [
        "{Subject} was completed in 1889.",                       # a year
        "{Subject} is a French national symbol.",                   # a nationality
        "{Subject} is admired by visitors from Germany.",          # a place
        "{Subject} was later moved to a new site.",                # a change
        "Visitors climb {subject} by stairs or lift.",             # does not open with {Subject}
        "{Subject} is often called 'the iron lady'.",              # the split would not end it
        "{Subject} is a wrought-iron lattice tower with three levels.",  # fine
    ]},)
    problems = cf_world_facts.about_problems(injected)
    assert len(problems) == 6
    assert [w for p in problems for w in ("digit", "nationality", "place", "change", "open", "one sentence")
            if w in p] == ["digit", "nationality", "place", "change", "open", "one sentence"]


def test_fictional_names_are_excepted_only_where_listed():
    jane = ({"subject": "Jane Eyre", "sentences": ["{Subject} centres on her employer Mr Rochester."]},)
    assert cf_world_facts.about_problems(jane) and not cf_world_facts.about_problems(
        ({**jane[0], "fictional_names": ["Rochester"]},))


DESCRIBED = ("book_author", "invention_inventor", "painting_museum", "composition_composer",
             "company_headquarters")


def _told(sentence: str) -> str:
    """The start of an about.json sentence after its ``{Subject}``: how it reads in any passage."""
    return sentence.split("} ", 1)[1][:25]


def test_works_inventions_and_companies_are_described_and_painters_and_places_not(items):
    assert {r["relation"] for r in tables.relations() if r.get("described")} == set(DESCRIBED)
    about = tables.about()
    former = build("cf_world_facts_former", DEFAULT_SEED)
    for item in [*items, *former]:
        told = [_told(s) for s in about.get(item.subject, []) if _told(s) in item.context]
        # a painting's look points to its painter; a place's description (a glacier, an emperor's tomb)
        # can rule out another country or city
        assert len(told) == (len(about.get(item.subject, [])) if item.relation in DESCRIBED else 0), item.id
        assert item.relation not in DESCRIBED or len(about[item.subject]) in (3, 4), item.id


def test_articles_open_with_the_subject_and_describe_it_after_the_first_sentence(items):
    about = tables.about()
    for item in items:
        assert contains_any(cf_world_facts.sentences(item.context)[0], [item.subject]), item.id
        # split with the names masked ("Madame X.", "H&M.", "J. K. Rowling" end no sentence to the splitter)
        # (an answer that ends in a full stop, "Washington, D.C.", keeps it: it ends the sentence too)
        answer = item.counterfactual_answer
        masked = item.context.replace(item.subject, "Sub").replace(answer, "Ans" + "." * answer.endswith("."))
        parts = cf_world_facts.sentences(masked)
        assert 6 <= len(parts) <= 9, item.id
        if item.relation in DESCRIBED:
            described = [_told(s) for s in about[item.subject]]
            assert all(d in item.context for d in described), item.id
            # an opening, then what the subject is (the answer sentence may come between)
            where = next(k for k, s in enumerate(parts) if described[0] in s)
            assert where == 1 + any("Ans" in s for s in parts[:where]), item.id


def test_it_never_follows_the_answer_sentence(items):
    for item in items:
        parts = cf_world_facts.sentences(item.context)
        for before, sentence in zip(parts, parts[1:]):
            if contains_any(before, [item.counterfactual_answer]):
                assert not sentence.startswith("It "), item.id


def test_the_subject_is_referred_to_in_all_three_ways(items):
    starts = Counter()
    for item in items:
        for sentence in cf_world_facts.sentences(item.context)[1:]:
            record = cf_world_facts.relations_by_name()[item.relation]
            starts["it" if sentence.startswith("It ") else "kind" if contains_any(sentence, record["kind"])
                   else "name" if contains_any(sentence, [item.subject]) else "none"] += 1
    # each way in at least 5% of sentences: since version 5 the kind is used once per passage and "It" only
    # after a sentence about the subject (rules kind_once, it_follows_subject), so "it" is the rarest
    assert starts["none"] == 0 and min(starts["it"], starts["kind"], starts["name"]) > 0.05 * sum(starts.values())


def test_no_reference_by_kind_or_it_twice_in_a_row(items):
    for item in items:
        kinds = cf_world_facts.relations_by_name()[item.relation]["kind"]
        refs = ["it" if s.startswith("It ") else "kind" if contains_any(s, kinds) and not contains_any(s, [item.subject])
                else "other" for s in cf_world_facts.sentences(item.context)]
        assert all(not (a == b != "other") for a, b in zip(refs, refs[1:])), (item.id, refs)
