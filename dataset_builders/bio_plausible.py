"""What makes a counterfactual biography possible and self-consistent (CF_Bio, version 5).

A counterfactual must fit every cue its passage carries (Goyal et al., "Context-Parametric Inversion",
ICLR 2025, section 3.2: the context should be a plausible alternative, so that a model that answers from
memory prefers memory, not a passage that argues against itself):

* a birth year moves either way, and keeps the life and the career possible: no one lives to
  ``MAX_LIFESPAN + 1`` unless they really did, no living person reaches ``MAX_LIVING_AGE + 1``, and the
  person is an adult (``ADULT``) at their first work (``first_work_year``) and at every dated work;
* a birth city is never inside the real one, nor the real one inside it (``places_within``);
* a nationality fits the language of the person's works (``language``; the nationalities' ``languages``);
* a name-swap substitute has the person's domain, works in the language of the person's works and writes
  in every literary form of them (``forms``: no poet given novels).

The attributes live in ``data/people.json``; the answer-neutral sentences told of each person in
``data/people_about.json``. ``RULES`` checks each promise on every build (merged into cf_bio's rules).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from cf_tasks.text import contains, contains_any

from . import tables
from .schema import Item

ADULT = 18  # the youngest age at the first work or any dated work of a counterfactual life
MATURE = 25  # the youngest age at the first work for a person who was this old or older at it
MAX_LIFESPAN = 94  # no one lives to 95 or more, unless the real person did
MAX_LIVING_AGE = 89  # no living person is 90 or more
YEAR_SHIFTS = (*range(-40, -2), *range(3, 41))  # how far a counterfactual birth year moves, either way
LATER_SHARE = (0.25, 0.75)  # the share of birth-year items whose counterfactual is later than the truth
_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
_GERUND = re.compile(r"^[a-z]+ing\b")
# What precedes a noun phrase but not a gerund ("drew wide attention with becoming ...").
_NOUN_ONLY_BEFORE = r"(?:\b(?:with|to|was|is|are|include|includes|on|from|of|came|through|add|added|mention)|:)"
_NOUN_ONLY = re.compile(_NOUN_ONLY_BEFORE + r"\s*$")
_PRONOUN_OPENING = re.compile(r"^(He|She|His|Her)\b")
# not "St. Louis"; but after "Washington, D.C." (not after the initials of "J.R.R. Tolkien")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\"”’'!])(?<!\bSt)(?<!\bDr)(?<!\bMt)[.!?]\s+(?=[A-Z\"“])|(?<=\bD\.C)\.\s+(?=[A-Z])")


def as_of() -> int:
    return tables.people_meta()["as_of"]


@lru_cache(maxsize=1)
def people_by_id() -> dict[str, dict]:
    return {p["id"]: p for p in tables.people()}


@lru_cache(maxsize=1)
def languages() -> dict[str, list[str]]:
    """Nationality adjective -> the languages its writers write in."""
    return {n["adjective"]: list(n["languages"]) for n in tables.people_meta()["nationalities"]}


def dated_years(text: str) -> list[int]:
    return [int(y) for y in _YEAR.findall(text)]


# ---- birth years -------------------------------------------------------------------------------

def life_is_possible(person: dict, born: int) -> bool:
    """``born`` keeps the person's life and career possible (see the module docstring)."""
    end = person["death_year"] or as_of()
    age, true_age = end - born, end - person["birth_year"]
    oldest = MAX_LIVING_AGE if person["death_year"] is None else max(MAX_LIFESPAN, true_age)
    works = [person["first_work_year"], *(y for w in person["works"] for y in dated_years(w))]
    # Someone who came to the first work at MATURE or later has a life before it that the passage may tell
    # (a job, a child): the counterfactual keeps them at least MATURE at it.
    first_age = max(ADULT, min(person["first_work_year"] - person["birth_year"], MATURE))
    return (ADULT <= age <= oldest and all(born + ADULT <= y <= end for y in works)
            and born + first_age <= person["first_work_year"])


def birth_year_choices(person: dict) -> tuple[list[int], list[int]]:
    """(earlier, later) counterfactual birth years that keep the life possible."""
    years = [person["birth_year"] + shift for shift in YEAR_SHIFTS]
    ok = [y for y in years if life_is_possible(person, y)]
    return [y for y in ok if y < person["birth_year"]], [y for y in ok if y > person["birth_year"]]


# ---- places, languages, substitutes ------------------------------------------------------------

def within(a: str, b: str) -> bool:
    """One of the two places lies inside the other (Greenwich and London)."""
    inside = tables.people_meta()["places_within"]
    return inside.get(a) == b or inside.get(b) == a


def culture(person: dict) -> set[str]:
    """The languages of the person's true nationality, but Latin (a learned language many nationalities' writers
    wrote in, not a culture): the culture the name, the works and the life fit."""
    return set(languages().get(person["nationality"], [])) - {"Latin"}


def nationality_fits_language(person: dict, adjective: str) -> bool:
    """A nationality whose writers write in the language of the person's works, or, where the works have no
    language (a painter, a composer, a politician), one that speaks a language of the true nationality: no
    Czech Michelangelo, no Peruvian Andy Warhol."""
    if person.get("language") not in (None, "Latin"):  # Latin works fit too many nationalities to tell
        return person["language"] in languages().get(adjective, [])
    return bool(culture(person) & set(languages().get(adjective, [])))


def substitute_fits(person: dict, sub: dict) -> bool:
    """The substitute could have made the person's works: same domain, a science of the person's (``fields``:
    no Sigmund Freud for Albert Einstein), the works' language, every form,
    alive and an adult at the first of them, and a name of the same culture (their nationalities share a
    language: no Otto von Bismarck born in Kentucky, no Edward Elgar for a Russian composer)."""
    alive_and_adult = sub["birth_year"] + ADULT <= person["first_work_year"] <= (sub["death_year"] or as_of())
    same_field = not person.get("fields") or bool(set(person["fields"]) & set(sub.get("fields", [])))
    return (sub["domain"] == person["domain"] and sub.get("language") == person.get("language")
            and set(person.get("forms", [])) <= set(sub.get("forms", [])) and same_field and alive_and_adult
            and bool(culture(person) & culture(sub)))


# ---- passages ----------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def about() -> dict[str, list[str]]:
    """Person id -> the answer-neutral sentences told of them (``data/people_about.json``)."""
    return {r["person"]: list(r["sentences"]) for r in tables.load_table("people_about.json")}


def gerund_work(work: str) -> bool:
    return bool(_GERUND.match(work))


def noun_only(template: str, slot: str) -> bool:
    """The template puts ``slot`` where a gerund would not read ("drew wide attention with {work1}")."""
    before = template.split("{" + slot + "}")[0]
    return bool(_NOUN_ONLY.search(before))


def sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text) if s.strip()]


def _word_runs(text: str, n: int = 4) -> set[tuple[str, ...]]:
    """Every run of ``n`` words of ``text``, placeholders left out: two sentences of one person that share
    one tell the same fact twice ("a professor of classical philology")."""
    words = re.findall(r"[a-z']+", re.sub(r"\{\w+\}", " ", text).lower())
    return {tuple(words[k:k + n]) for k in range(len(words) - n + 1)}


def about_problems() -> list[str]:
    """One line per people_about.json sentence that could point to an asked fact or break a passage: it
    names a person, place, nationality, country or language of the tables, has a digit (a year, an age),
    mentions no one ({Who...} or {Pronoun}), uses an unknown placeholder, speaks of death or a legacy
    for the living, or shares four words in a row with another of the person's sentences."""
    meta = tables.people_meta()
    names = {n for p in tables.people() for n in (p["name"], p["surname"], p["birth_city"], p["death_city"],
                                                   p["birth_country"], p["death_country"]) if n}
    names |= {x for n in meta["nationalities"] for x in (n["adjective"], *n["nouns"], *n["countries"], *n["languages"])}
    known = {"Who", "who", "Who_poss", "who_poss", "Pronoun", "poss"}
    out = []
    for person_id, texts in about().items():
        person = people_by_id().get(person_id)
        for k, told in enumerate(texts):
            text = re.sub(r"Nobel (Peace )?Prizes?", "the prize", told)  # a prize, not the person Alfred Nobel
            why = [f"names {n}" for n in sorted(names) if len(n) > 2 and re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text)]
            why += ["has a digit"] if re.search(r"\d", text) else []
            why += ["mentions no one"] if not re.search(r"\{(Who|who|Pronoun)", text) else []
            why += [f"unknown placeholder {{{p}}}" for p in re.findall(r"\{(\w+)\}", text) if p not in known]
            if person is None:
                why.append("no such person")
            elif person["death_year"] is None and re.search(r"\b(died|dies|death|legacy|was (a|an|one|known))\b", text):
                why.append("speaks of a living person as dead")
            others = texts[:k] + texts[k + 1:]
            why += ["repeats another of the person's sentences"] if any(_word_runs(told) & _word_runs(t) for t in others) else []
            out += [f"{person_id}: {text!r}: {'; '.join(why)}"] if why else []
    return out


# ---- validator rules (merged into cf_bio's rules) ----------------------------------------------

def by_relation(items: list[Item], relation: str) -> list[tuple[Item, dict]]:
    """The items of ``relation``, each with its person."""
    return [(i, people_by_id()[i.subject]) for i in items if i.relation == relation]


def _life_impossible(items: list[Item]) -> list[str]:
    return [i.id for i, p in by_relation(items, "birth_year")
            if int(i.counterfactual_answer) == p["birth_year"] or not life_is_possible(p, int(i.counterfactual_answer))]


def _years_one_way(items: list[Item]) -> list[str]:
    """Every birth-year item, when fewer than a quarter or more than three quarters move later."""
    pairs = by_relation(items, "birth_year")
    if len(pairs) < 20:  # too few to judge a share
        return []
    later = sum(int(i.counterfactual_answer) > p["birth_year"] for i, p in pairs) / len(pairs)
    return [] if LATER_SHARE[0] <= later <= LATER_SHARE[1] else [i.id for i, _ in pairs]


def _city_within(items: list[Item]) -> list[str]:
    return [i.id for i, p in by_relation(items, "birth_city") if within(i.counterfactual_answer, p["birth_city"])]


def _nationality_language(items: list[Item]) -> list[str]:
    return [i.id for i, p in by_relation(items, "nationality") if not nationality_fits_language(p, i.counterfactual_answer)]


def _substitute_genre(items: list[Item]) -> list[str]:
    by_name = {p["name"]: p for p in tables.people()}
    return [i.id for i, p in by_relation(items, "person_name")
            if i.counterfactual_answer not in by_name or not substitute_fits(p, by_name[i.counterfactual_answer])]


PEN_NAME = ("pen name", "stage name", "pseudonym")  # in a name swap, says the asked name is not the real one
_WROTE_UNDER = re.compile(r"^\{(Who|Pronoun)\} wrote under a (pen|stage) name\b")


def name_speaks_against(sub: dict) -> bool:
    """A name that cannot be a substitute's: a pen or stage name (Lewis Carroll was born Charles Dodgson: "Lewis
    Carroll was born in New York" mixes two kinds of name), or one that names a birthplace ("Leonardo da Vinci
    was born in Caprese")."""
    pen = any(_WROTE_UNDER.match(t) for t in about().get(sub["id"], []))
    return pen or names_birthplace(sub)


def names_birthplace(person: dict) -> bool:
    """The name names the birth city ("Leonardo da Vinci": Vinci), which places the person in its country."""
    return bool(person["birth_city"] and contains(person["name"], person["birth_city"]))


def _nationality_name_place(items: list[Item]) -> list[str]:
    return [i.id for i, p in by_relation(items, "nationality") if names_birthplace(p)]


def _name_swap_pen_name(items: list[Item]) -> list[str]:
    """A name-swap passage never says the person wrote under another name: the asked name is the pen name."""
    return [i.id for i, _ in by_relation(items, "person_name") if contains_any(i.context, list(PEN_NAME))]


def _substitute_name(items: list[Item]) -> list[str]:
    by_name = {p["name"]: p for p in tables.people()}
    return [i.id for i, _ in by_relation(items, "person_name")
            if i.counterfactual_answer in by_name and name_speaks_against(by_name[i.counterfactual_answer])]


def _nationality_stub(items: list[Item]) -> list[str]:
    """A nationality passage keeps at least one of the person's works (else it is no biography)."""
    return [i.id for i, p in by_relation(items, "nationality") if not contains_any(i.context, p["works"])]


def _gerund_frame(items: list[Item]) -> list[str]:
    """A work that opens with a gerund ("becoming the first ...") never follows a word that wants a noun
    ("with", "to", "was", "include", "came", a colon ...)."""
    bad = []
    for i in items:
        for work in people_by_id()[i.subject]["works"]:
            if gerund_work(work) and re.search(rf"{_NOUN_ONLY_BEFORE}\s+{re.escape(work)}", i.context):
                bad.append(i.id)
                break
    return bad


def _mentions(sentence: str, names: list[str]) -> bool:
    return bool(_PRONOUN_OPENING.search(sentence) or re.search(r"\b(he|she|his|her|him|himself|herself)\b", sentence)
                or contains_any(sentence, names))


def _pronoun_astray(items: list[Item]) -> list[str]:
    """A sentence that opens with He/She/His/Her follows a sentence about the person (their name or a
    pronoun), so the pronoun cannot point at another noun; the first sentence names the person."""
    bad = []
    for i in items:
        person = people_by_id()[i.subject]
        names = [i.counterfactual_answer, i.parametric_answer, person["surname"], *i.counterfactual_aliases]
        parts = sentences(i.context)
        if not parts or _PRONOUN_OPENING.search(parts[0]) or any(
                _PRONOUN_OPENING.search(s) and not _mentions(prev, names) for prev, s in zip(parts, parts[1:])):
            bad.append(i.id)
    return bad


def _sentence_twice(items: list[Item]) -> list[str]:
    """No sentence, nor a sentence's four words after the mention of the person, comes twice in a passage."""
    bad = []
    for i in items:
        person = people_by_id()[i.subject]
        names = sorted({i.counterfactual_answer, i.parametric_answer, person["name"], person["surname"]}, key=len,
                       reverse=True)
        parts = [s.strip() for s in sentences(i.context)]
        masked = [re.sub("|".join(re.escape(n + "'s") + "|" + re.escape(n) for n in names), "X", s) for s in parts]
        openings = [" ".join(s.split()[1:5]) for s in masked if len(s.split()) > 5]
        if len(set(parts)) < len(parts) or len(set(openings)) < len(openings):
            bad.append(i.id)
    return bad


def _about_missing(items: list[Item]) -> list[str]:
    """Every passage tells at least one of its person's answer-neutral sentences (a biography, not a frame)."""
    bad = []
    for i in items:
        cores = [max(re.split(r"\{\w+\}", t), key=len).strip(" .") for t in about().get(i.subject, [])]
        if not any(core and core in i.context for core in cores):
            bad.append(i.id)
    return bad


RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "bio_life_impossible": (
        f"a counterfactual birth year differs from the real one and keeps the life possible: no lifespan over "
        f"{MAX_LIFESPAN} unless true, no living person over {MAX_LIVING_AGE}, an adult ({ADULT}) at the first work "
        f"(first_work_year) and at every dated work", _life_impossible),
    "bio_birth_years_one_way": (
        f"counterfactual birth years move either way: {LATER_SHARE[0]:.0%}-{LATER_SHARE[1]:.0%} of them later",
        _years_one_way),
    "bio_birth_city_within": ("a counterfactual birth city is not inside the real one, nor the real one inside it "
                              "(places_within)", _city_within),
    "bio_nationality_language": ("a counterfactual nationality's languages include the language of the person's "
                                 "works (language), or one of the true nationality's languages where the works "
                                 "have none", _nationality_language),
    "bio_substitute_genre": ("a name-swap substitute has the person's domain, a science of the person's (fields), "
                             "the works' language and every "
                             "literary form of the works (forms), was alive and adult at the first work, and "
                             "has a nationality that shares a language with the person's", _substitute_genre),
    "bio_nationality_name_place": ("a nationality item's person has no birth city in the name (Leonardo da Vinci, "
                                   "born in Vinci, is Italian by his name)", _nationality_name_place),
    "bio_name_swap_pen_name": ("a name-swap passage never tells of a pen name or stage name (the asked name "
                               "would be it)", _name_swap_pen_name),
    "bio_substitute_name": ("a name-swap substitute's name is a birth name that names no birthplace (no pen name, "
                            "no Leonardo da Vinci born in Caprese)", _substitute_name),
    "bio_nationality_stub": ("a nationality passage names at least one of the person's works", _nationality_stub),
    "bio_gerund_frame": ("a work that opens with a gerund never follows a word that wants a noun (with, to, was, "
                         "include, came, a colon ...)",
                         _gerund_frame),
    "bio_pronoun_astray": ("a sentence opening with He/She/His/Her follows a sentence about the person",
                           _pronoun_astray),
    "bio_sentence_twice": ("no sentence, nor a sentence opening, comes twice in a passage", _sentence_twice),
    "bio_about_missing": ("every passage tells at least one of the person's answer-neutral sentences "
                          "(people_about.json)", _about_missing),
}

# The rules about the text, which the agreeing twin must keep too.
TEXT_RULES = ("bio_nationality_stub", "bio_gerund_frame", "bio_pronoun_astray", "bio_sentence_twice",
              "bio_about_missing")
