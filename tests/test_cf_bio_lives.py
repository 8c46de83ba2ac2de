"""CF_Bio since version 5: lives that can be, substitutes that fit the works, passages without slips.

Each rule of ``bio_plausible.RULES`` catches its injected defect; the documented sentences per person
(people_about.json) name nothing that could give an asked fact away.
"""

import re
from dataclasses import replace

import pytest

from dataset_builders import DEFAULT_SEED, bio_plausible, build, cf_bio
from dataset_builders.validate import failures
from builds import assert_caught

PEOPLE = cf_bio.people_by_id()


@pytest.fixture(scope="module")
def items():
    return cf_bio.build(DEFAULT_SEED)


def _first(items, relation, where=lambda item, person: True):
    return next(i for i in items if i.relation == relation and where(i, PEOPLE[i.subject]))


def _swap(items, old, new):
    return [new if i is old else i for i in items], old.id


def _answer(items, item, value):
    context = item.context.replace(item.counterfactual_answer, value)
    return _swap(items, item, replace(item, counterfactual_answer=value, context=context))


def inject_child_at_first_work(items):  # "born in 1808": ten years old at Frankenstein
    item = _first(items, "birth_year", lambda i, p: p["id"] == "mary_shelley")
    return _answer(items, item, str(PEOPLE["mary_shelley"]["first_work_year"] - 10))


def inject_one_way(items):  # every counterfactual birth year earlier than the truth, as in version 4
    pairs = [(i, PEOPLE[i.subject]) for i in items if i.relation == "birth_year"]
    moved = {i.id: replace(i, counterfactual_answer=str(p["birth_year"] - 1)) for i, p in pairs}
    return [moved.get(i.id, i) for i in items], pairs[0][0].id


def inject_city_within(items):  # Greenwich for a Londoner: "born in London" stays right
    item = _first(items, "birth_city", lambda i, p: p["birth_city"] == "London")
    return _answer(items, item, "Greenwich")


def inject_language(items):  # an English writer made German: the works' language argues against it
    item = _first(items, "nationality", lambda i, p: p["language"] == "English" and p["domain"] == "writer")
    return _answer(items, item, "German")


def inject_substitute_genre(items):  # a painter given Hemingway's novels
    item = _first(items, "person_name", lambda i, p: p["id"] == "ernest_hemingway")
    return _answer(items, item, "Pablo Picasso")


def inject_substitute_culture(items):  # a name of another culture, all else fitting: Edward Elgar, a Russian composer
    item = _first(items, "person_name", lambda i, p: p["id"] == "pyotr_ilyich_tchaikovsky")
    return _answer(items, item, "Edward Elgar")


def inject_nationality_culture(items):  # Michelangelo, a Czech painter: no works' language, the culture argues
    item = _first(items, "nationality", lambda i, p: p["id"] == "michelangelo")
    return _answer(items, item, "Czech")


def inject_pen_name(items):  # "Melville wrote under a pen name": the asked name would be the pen name
    item = _first(items, "person_name")
    return _swap(items, item, replace(item, context=item.context + f" {item.counterfactual_answer} wrote under a pen name."))


def inject_substitute_name(items):  # "Leonardo da Vinci was born in Caprese": the name names another birthplace
    item = _first(items, "person_name", lambda i, p: p["domain"] == "painter")
    return _answer(items, item, "Leonardo da Vinci")


def inject_stub(items):  # a nationality passage with no work left
    item = _first(items, "nationality")
    context = item.context
    for work in PEOPLE[item.subject]["works"]:
        context = context.replace(work, "a body of work")
    return _swap(items, item, replace(item, context=context))


def inject_gerund_frame(items):  # "drew wide attention with becoming ..."
    item = _first(items, "birth_year", lambda i, p: any(bio_plausible.gerund_work(w) for w in p["works"]))
    work = next(w for w in PEOPLE[item.subject]["works"] if bio_plausible.gerund_work(w))
    return _swap(items, item, replace(item, context=item.context + f" The career drew wide attention with {work}."))


def inject_pronoun_astray(items):  # "The harvest failed. He ...": the pronoun points at the harvest
    item = _first(items, "birth_year")
    pronoun = PEOPLE[item.subject]["pronoun"].capitalize()
    return _swap(items, item, replace(item, context=item.context + f" The harvest failed. {pronoun} smiled."))


def inject_sentence_twice(items):
    item = _first(items, "birth_city")
    last = bio_plausible.sentences(item.context)[-1].strip()
    return _swap(items, item, replace(item, context=item.context + " " + last))


def inject_about_missing(items):  # a passage of frames only
    item = _first(items, "person_name")
    cores = [max(re.split(r"\{\w+\}", t), key=len).strip(" .") for t in bio_plausible.about()[item.subject]]
    kept = [s for s in bio_plausible.sentences(item.context) if not any(c in s for c in cores)]
    return _swap(items, item, replace(item, context=". ".join(kept)))


def inject_nationality_of_a_named_birthplace(items):  # "Leonardo da Vinci, a Swiss painter": Vinci is Italian
    item = _first(items, "nationality", lambda i, p: p["domain"] == "painter")
    return _swap(items, item, replace(item, subject="leonardo_da_vinci"))


def inject_substitute_of_another_generation(items):  # Jules Verne (born 1828) for Marcel Proust (born 1871)
    item = _first(items, "person_name", lambda i, p: p["domain"] == "writer")  # none fits Proust: one is made
    return _swap(items, item, replace(item, subject="marcel_proust", parametric_answer="Marcel Proust",
                                      counterfactual_answer="Jules Verne"))


CASES = {
    "bio_life_impossible": inject_child_at_first_work,
    "bio_birth_years_one_way": inject_one_way,
    "bio_birth_city_within": inject_city_within,
    "bio_nationality_language": inject_language,
    "bio_substitute_genre": inject_substitute_genre,
    "bio_nationality_name_place": inject_nationality_of_a_named_birthplace,
    "bio_name_swap_pen_name": inject_pen_name,
    "bio_substitute_name": inject_substitute_name,
    "bio_nationality_stub": inject_stub,
    "bio_gerund_frame": inject_gerund_frame,
    "bio_pronoun_astray": inject_pronoun_astray,
    "bio_sentence_twice": inject_sentence_twice,
    "bio_about_missing": inject_about_missing,
}


def test_every_extra_rule_has_a_case():
    from test_cf_bio_passages import CASES as V2_CASES
    from test_cf_bio_primacy import CASES as TIME_CASES
    from test_cf_bio_swaps import CASES as SWAP_CASES

    assert set(CASES) == set(bio_plausible.RULES)
    assert set(CASES) | set(V2_CASES) | set(SWAP_CASES) | set(TIME_CASES) == set(cf_bio.EXTRA_RULES)


def inject_substitute_field(items):  # Sigmund Freud for Albert Einstein: a scientist, German-speaking, alive and adult
    item = _first(items, "person_name", lambda i, p: p["id"] == "albert_einstein")
    return _answer(items, item, "Sigmund Freud")


CULTURE_CASES = {"bio_substitute_genre": inject_substitute_culture, "bio_nationality_language": inject_nationality_culture}


def test_a_substitute_of_another_generation_is_caught(items):
    assert_caught(items, "bio_substitute_incompatible", inject_substitute_of_another_generation)
    proust, verne = PEOPLE["marcel_proust"], PEOPLE["jules_verne"]
    assert cf_bio.lifespan_gap(proust, verne) <= cf_bio.MAX_ERA_GAP  # their lives overlap: the births decide
    assert not cf_bio.compatible_substitute(proust, verne)
    assert cf_bio.compatible_substitute(proust, {**verne, "birth_year": proust["birth_year"] - 5})


def test_a_scientist_substitute_of_another_science_is_caught(items):
    assert_caught(items, "bio_substitute_genre", inject_substitute_field)
    einstein, freud = PEOPLE["albert_einstein"], PEOPLE["sigmund_freud"]
    assert not bio_plausible.substitute_fits(einstein, freud)
    assert bio_plausible.substitute_fits(einstein, {**freud, "fields": ["physics"]})  # the field alone decides
    scientists = [p for p in PEOPLE.values() if p["domain"] == "scientist"]
    assert scientists and all(p.get("fields") for p in scientists)


@pytest.mark.parametrize("rule", sorted(CULTURE_CASES))
def test_a_name_or_nationality_of_another_culture_is_caught(items, rule):
    broken, bad_id = CULTURE_CASES[rule](items)
    hit = [line for line in failures(broken) if line.startswith(rule + ":")]
    assert len(hit) == 1 and bad_id in hit[0], failures(broken)


@pytest.mark.parametrize(("person", "sub", "fits"), [
    ("pyotr_ilyich_tchaikovsky", "edward_elgar", False),  # every other attribute fits: the culture does not
    ("abraham_lincoln", "otto_von_bismarck", False),
    ("abraham_lincoln", "benjamin_disraeli", True),  # both English-speaking
])
def test_a_substitute_shares_the_persons_culture(person, sub, fits):
    p, s = PEOPLE[person], PEOPLE[sub]
    assert (bio_plausible.culture(p) & bio_plausible.culture(s) != set()) is fits
    if not fits:
        assert not bio_plausible.substitute_fits(p, s)


@pytest.mark.parametrize(("person", "nationality", "fits"), [
    ("michelangelo", "Czech", False), ("michelangelo", "Swiss", True),  # Italian is a Swiss language
    ("andy_warhol", "Peruvian", False), ("andy_warhol", "Canadian", True),
    ("michelangelo", "Polish", False),  # both list Latin, which many wrote in: no culture of its own
    ("baruch_spinoza", "French", False),  # works in Latin: the culture decides (Dutch)
])
def test_a_nationality_without_a_works_language_fits_the_culture(person, nationality, fits):
    assert PEOPLE[person]["language"] in (None, "Latin")
    assert bio_plausible.nationality_fits_language(PEOPLE[person], nationality) is fits


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_catches_injected_defect(items, rule):
    assert_caught(items, rule, CASES[rule])


@pytest.mark.parametrize("rule", bio_plausible.TEXT_RULES)
def test_the_twin_keeps_the_text_rules(rule):
    twin = build("cf_bio_agree", DEFAULT_SEED)
    assert failures(twin) == []
    if rule == "bio_nationality_stub":
        return  # the twin's nationality passages are the same passages: the build above checks them
    broken, bad_id = CASES[rule](twin)
    hit = [line for line in failures(broken) if line.startswith(rule + ":")]
    assert len(hit) == 1 and bad_id in hit[0], failures(broken)


@pytest.mark.parametrize(("person", "born", "possible"), [
    ("mary_shelley", 1790, True),   # 61 at death, 28 at Frankenstein
    ("mary_shelley", 1801, False),  # 17 at Frankenstein
    ("kamala_harris", 1936, True),  # 89 in the table's year
    ("kamala_harris", 1935, False),  # a living person of 90
    ("isaac_newton", 1640, True),   # 87: the real life reached 84
    ("isaac_newton", 1632, False),  # 95
    ("katherine_johnson", 1920, True),  # the real life reached 2020 - 1918 = 102 years: never longer than that
    ("katherine_johnson", 1916, False),  # 104
    ("astrid_lindgren", 1920, True),  # 25 at the first work: she was 38; the passage tells of a job and a daughter
    ("astrid_lindgren", 1921, False),  # 24: old enough by ADULT, too young for the life the passage tells
])
def test_a_life_stays_possible(person, born, possible):
    assert bio_plausible.life_is_possible(PEOPLE[person], born) is possible


def test_birth_years_move_both_ways_and_never_in_place(items):
    moves = [int(i.counterfactual_answer) - PEOPLE[i.subject]["birth_year"] for i in items if i.relation == "birth_year"]
    assert min(moves) < 0 < max(moves) and 0 not in moves
    assert 0.35 <= sum(m > 0 for m in moves) / len(moves) <= 0.65


def test_a_counterfactual_birth_city_is_never_inside_the_true_one():
    inside = cf_bio.tables.people_meta()["places_within"]
    assert inside["Greenwich"] == "London"
    for seed in (0, 1, DEFAULT_SEED):
        for item in build("cf_bio", seed):
            if item.relation == "birth_city":
                assert not bio_plausible.within(item.counterfactual_answer, item.parametric_answer), item.id


def test_name_swaps_keep_domain_language_and_form(items):
    by_name = {p["name"]: p for p in cf_bio.tables.people()}
    swaps = [i for i in items if i.relation == "person_name"]
    assert swaps
    for item in swaps:
        person, sub = PEOPLE[item.subject], by_name[item.counterfactual_answer]
        assert sub["domain"] == person["domain"] and sub["language"] == person["language"], item.id
        assert set(person["forms"]) <= set(sub["forms"]), item.id
        assert sub["birth_year"] + 18 <= person["first_work_year"] <= (sub["death_year"] or 2025), item.id


@pytest.mark.slow
def test_the_documented_sentences_name_nothing_that_gives_an_answer_away():
    assert bio_plausible.about_problems() == []
    assert set(bio_plausible.about()) == set(PEOPLE)
    assert all(len(s) >= 3 for s in bio_plausible.about().values())


def test_a_revealing_documented_sentence_is_reported(monkeypatch):
    bad = {"jane_austen": ["{Who} lived in Bath for some years.", "{Pronoun} wrote Emma in 1814.",
                           "The weather was mild."],
           "haruki_murakami": ["{Pronoun} died in a quiet town."]}
    monkeypatch.setattr(bio_plausible, "about", lambda: bad)
    problems = "\n".join(bio_plausible.about_problems())
    assert "has a digit" in problems and "mentions no one" in problems
    assert "speaks of a living person as dead" in problems
    bad["jane_austen"] = ["{Pronoun} was born in London."]
    assert "names London" in "\n".join(bio_plausible.about_problems())
    bad["jane_austen"] = ["{Who} became a professor of classical philology young.",
                          "{Pronoun} was made a professor of classical philology early."]
    assert "\n".join(bio_plausible.about_problems()).count("repeats another of the person's sentences") == 2
    bad.pop("haruki_murakami")
    bad["jane_austen"] = ["{Who} taught classical philology.", "{Pronoun} loved classical philology."]  # three words
    assert bio_plausible.about_problems() == []


def test_every_person_has_the_attributes_the_choices_need():
    languages = {lang for entry in cf_bio.tables.people_meta()["nationalities"] for lang in entry["languages"]}
    for person in PEOPLE.values():
        assert person["birth_year"] + bio_plausible.ADULT <= person["first_work_year"], person["id"]
        assert person["first_work_year"] <= (person["death_year"] or bio_plausible.as_of()), person["id"]
        assert person["language"] is None or person["language"] in languages, person["id"]
        assert bool(person["forms"]) == (person["domain"] == "writer"), person["id"]


@pytest.mark.parametrize(("person", "against"), [("lewis_carroll", True), ("voltaire", True),
                                                 ("leonardo_da_vinci", True), ("herman_melville", False)])
def test_a_pen_name_or_a_name_that_names_a_birthplace_is_no_substitute(person, against):
    assert bio_plausible.name_speaks_against(PEOPLE[person]) is against


def test_the_splitter_ends_a_sentence_after_washington_dc_but_not_inside_initials():
    text = "He died in Washington, D.C. Lincoln was tall. J.R.R. Tolkien wrote. Born in St. Louis, he left."
    assert [s.strip(" .") for s in bio_plausible.sentences(text)] == [
        "He died in Washington, D.C", "Lincoln was tall", "J.R.R. Tolkien wrote", "Born in St. Louis, he left"]
