"""CF_Bio: counterfactual biographies (paper section 3.2, "Entity-Based Knowledge Conflict").

Two kinds of item, built from ``data/people.json``:

* ``person_name``: a biography generated from a real person's facts, but naming another famous
  person throughout (full name, surname, possessive). No fragment of the real name may survive
  anywhere in the passage, so a sentence that would carry one (a birthplace such as Vinci for
  Leonardo da Vinci) falls back to a form without it or is left out. The substitute has the same
  pronoun, the same living/dead status and a lifespan close to the real person's. The question
  asks who the <domain> known for <works> is: the context answers with the substitute.
* ``birth_year`` / ``birth_city`` / ``nationality``: the real name is kept and one attribute is
  changed; every other sentence is kept coherent with it (version 2):
  - birth_year: an earlier or a later year (version 5; a direction first, then a year) that keeps the
    life possible: an adult at the first work (``first_work_year``) and at every dated work, no lifespan
    of 95 or more unless the real one was, no living person of 90 or more (``bio_plausible``);
  - birth_city: the passage says "born in <city>"; the city lies in the person's real birth
    country (so birth country and nationality still agree) and is attested in the table by then;
    it is never inside the real one, nor the real one inside it (``places_within``: Greenwich, London);
  - nationality: a nationality of the same region (or its ``kin``) that existed in the person's lifetime and is
    not also true of them, nor nested in it or containing it (British / Welsh); the passage names no
    place and no work that would imply the real one (``national_works``: "a major US party"); its
    languages include the language of the works (``language``); an item left with no work is dropped;
    drawn evenly among those that fit (``bio_swaps``: not every American made Canadian).
* a name-swap substitute shares the person's domain, the language of the works and every literary form
  of them (``forms``: no poet given novels), and the nationality the passage states; one of
  another nationality is told without a nationality, a place or a national work (``bio_swaps``);
* every passage tells the person's documented, answer-neutral sentences (``data/people_about.json``)
  one after each work, in place of generic legacy and career sentences;
* birth cities are cities or towns (``places_not_drawn`` keeps villages, estates and districts out), and
  a name-swap substitute has no title in its name ("Queen Victoria", "Elizabeth I").

Passages come in a declarative and a narrative style; living people are written in the present
tense and never "die". ``EXTRA_RULES`` checks each of these promises on every build.

``build_pairs`` tells each biography a second time, with the same template choices, with the true
name or value: the agreeing twin ``cf_bio_agree``, checked by ``AGREE_RULES``.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from functools import lru_cache

from cf_tasks.text import contains, contains_any

from . import bio_places, bio_plausible, bio_primacy, bio_swaps, tables
from .bio_plausible import birth_year_choices, nationality_fits_language, noun_only, substitute_fits, within
from .common import country_in_text, make_rng, name_fragments
from .schema import Item, answer_position, capitalize_first, fill

NAME = "cf_bio"
VERSION = 7
SUBSTITUTES_PER_PERSON = 4  # at most: few people have a substitute of their own nationality, so some take more
ATTRIBUTES = ("birth_year", "birth_city", "nationality")
NAME_FOR_PRONOUN = 0.4  # the share of He/She openings told with the name instead (varied references)
MAX_ERA_GAP = 10  # most years between the lifespans of a person and a name-swap substitute
GENERATION = 30  # most years between the births of a person and a name-swap substitute (no Verne for Proust)
NATIONALITY_LATEST = 50  # a nationality whose state arose more than 50 years after a birth is implausible
# A name that carries a title, an honorific or a regnal number ("Queen Victoria", "Mahatma Gandhi",
# "Elizabeth I") names a role as well as a person: never a name-swap substitute.
TITLED = re.compile(r"^(Queen|King|Pope|Emperor|Empress|Prince|Princess|Saint|St\.|Lord|Lady|Sir|Dame|Tsar|Sultan|"
                    r"Mahatma|Mother)\b|\b(the (Great|Elder|Younger))$|\s[IVX]+$")
# What only a dead person's biography says; a living person's passage never does.
_PAST = re.compile(r"\b(died|dies|death|final years|legacy|(was|were) (a|an|one|best|also|regarded|known))\b", re.I)

# Sentence variants per style and kind; "{Who}"/"{who}" is a mention of the person (full name or
# surname), "{is}" the tense ("is" for the living, "was" otherwise). "*_PLAIN" variants are the
# fallbacks used when a variant would name something forbidden (a name fragment, the true value).
# Works are never the subject of a verb, so plural titles ("the Gymnopédies") stay grammatical.
DECLARATIVE = {
    "open": (
        "{Who} {is} {a_nationality} {domain} born in {birth_year}.",
        "{Who}, {a_nationality} {domain}, was born in {birth_year}.",
        "Born in {birth_year}, {who} {is} {a_nationality} {domain}.",
        "The {nationality} {domain} {who} was born in {birth_year}.",
        "{Who}, born in {birth_year}, {is} among the most celebrated {nationality} {domains}.",
        "Few {nationality} {domains} are as famous as {who}, who was born in {birth_year}.",
        "The life of {who}, {a_nationality} {domain}, began in {birth_year}.",
    ),
    # With places shown, the opening leaves the year to the birth sentence (no "born in" twice).
    "open_before_place": (
        "{Who} {is} one of the greatest {nationality} {domains} of all time.",
        "{Who} {is} one of the best-known {nationality} {domains}.",
        "Among {nationality} {domains}, few are as widely known as {who}.",
        "{Who} {is} {a_nationality} {domain} whose work is known far beyond {poss} own country.",
        "{Who} {is} widely regarded as one of the greatest {nationality} {domains}.",
        "{Who} {is} one of the most influential {nationality} {domains} in history.",
        "In the history of {nationality} {domains}, {who} holds a special place.",
        "{Who} {is} considered one of the most influential {nationality} {domains}.",
        "{Who} {is} one of the most famous {nationality} {domains}.",
    ),
    "place": (
        "{Pronoun} was born in {birth_city}, in {birth_country_in}, in {birth_year}.",
        "{Who} was born in {birth_city}, in {birth_country_in}, in {birth_year}.",
        "Records show that {who} was born in {birth_city}, in {birth_country_in}, in {birth_year}.",
        "{Pronoun} was born in {birth_city}, in {birth_country_in}, in the year {birth_year}.",
        "In {birth_year}, {who} was born in {birth_city}, in {birth_country_in}.",
        "The year {birth_year} saw {who} born in {birth_city}, in {birth_country_in}.",
        "According to the records, {who} was born in {birth_city}, in {birth_country_in}, in {birth_year}.",
    ),
    # Who, what and where in one sentence (half the passages with places): fewer frame words.
    "open_place": (
        "{Who}, {a_nationality} {domain}, was born in {birth_city}, in {birth_country_in}, in {birth_year}.",
        "The {nationality} {domain} {who} was born in {birth_city}, in {birth_country_in}, in {birth_year}.",
        "{Who} {is} {a_nationality} {domain} born in {birth_city}, in {birth_country_in}, in {birth_year}.",
        "Born in {birth_city}, in {birth_country_in}, in {birth_year}, {who} {is} {a_nationality} {domain}.",
    ),
    "place_plain": ("{Pronoun} was born in {birth_country_in} in {birth_year}.", "{Pronoun} was born in {birth_year}.",
                    "{Who_poss} life began in {birth_year}.", "In {birth_year}, {who} was born."),
    "work1": ("{Who} {is} best known for {work1}.", "{Who_poss} reputation rests largely on {work1}.",
              "{Who} {is} perhaps best known for {work1}.", "Much of {who_poss} fame comes from {work1}.",
              "{Who} {is} most famous for {work1}.", "{Who} {is} widely known for {work1}.",
              "Above all, {who} {is} known for {work1}.", "{Who} owes much of {poss} reputation to {work1}.",
              "{Who} {is} known above all for {work1}."),
    "work2": ("{Who} {is} also known for {work2}.", "Another of {who_poss} best-known achievements is {work2}.",
              "Another high point of {who_poss} career was {work2}.", "{Who} {is} also remembered for {work2}.",
              "{Pronoun} {is} also famous for {work2}.", "{Pronoun} {is} also well known for {work2}.",
              "{Who_poss} work also includes {work2}."),
    "work3": ("{Pronoun} {is} also associated with {work3}.", "{Pronoun} {is} further remembered for {work3}.",
              "{Who_poss} reputation also owes much to {work3}.", "{Who} {is} remembered as well for {work3}.",
              "{Pronoun} also earned acclaim for {work3}."),
    "work23": ("{Pronoun} {is} also known for {work2} and {work3}.", "{Who_poss} other achievements include {work2} and {work3}.",
               "{Who} {is} also well known for {work2} and {work3}.",
               "{Who} {is} remembered as well for {work2} and {work3}.",
               "Other landmarks of {who_poss} career are {work2} and {work3}.",
               "{Pronoun} {is} also credited with {work2} and {work3}.",
               "Alongside this, {who} {is} known for {work2} and {work3}.",
               "{Who} {is} also widely cited for {work2} and {work3}.",
               "{Pronoun} {is} also famous for {work2} and {work3}.",
               "Among {poss} other achievements are {work2} and {work3}.",
               "The list of {who_poss} achievements also includes {work2} and {work3}.",
               "{Who_poss} name is also attached to {work2} and {work3}."),
    "death": ("{Who} died in {death_place}, in {death_year}.",
              "{Who} died in {death_year} in {death_place}.",
              "{Who_poss} death came in {death_year}, in {death_place}.",
              "In {death_year}, {who} died in {death_place}.",
              "{Who_poss} life came to an end in {death_place}, in {death_year}.",
              "{Who} spent {poss} last days in {death_place}, and died there in {death_year}.",
              "The end came for {who} in {death_year}, in {death_place}.",
              "{Pronoun} breathed {poss} last in {death_place}, in {death_year}.",
              "It was in {death_city}, in {death_country_in}, that {who} died, in {death_year}.",
              "{Who_poss} life closed in {death_year} in {death_place}.",
              "{Pronoun} ended {poss} days in {death_place}, in {death_year}."),
    "death_plain": ("{Who} died in {death_year}.", "{Who_poss} death came in {death_year}.",
                    "In {death_year}, {who} died.", "{Who_poss} life came to an end in {death_year}.",
                    "{Who_poss} death in {death_year} was widely mourned.", "{Who} lived until {death_year}.",
                    "The year {death_year} brought {who_poss} death.", "{Pronoun} breathed {poss} last in {death_year}.",
                    "{Who_poss} life closed in {death_year}."),
}
NARRATIVE = {
    "open": ("{Who} was born in {birth_city}, in {birth_country_in}, in {birth_year}.",
             "In {birth_year}, {who} was born in {birth_city}, in {birth_country_in}.",
             "{Who} was born in {birth_city}, in {birth_country_in}, in the year {birth_year}.",
             "The story of {who} begins in {birth_year}, when {pronoun} was born in {birth_city}, in {birth_country_in}.",
             "{Who_poss} life began in {birth_year}, when {pronoun} was born in {birth_city}, in {birth_country_in}."),
    "open_plain": ("{Who} was born in {birth_country_in} in {birth_year}.", "{Who} was born in {birth_year}.",
                   "The story of {who} begins in {birth_year}.", "{Who_poss} life began in {birth_year}."),
    # Not "became": a nationality acquired later would leave the nationality at birth open.
    "renown": (
        "{Pronoun} {is} one of the best-known {nationality} {domains} of {poss} time.",
        "{Pronoun} {is} {a_nationality} {domain} of wide renown.",
        "{Pronoun} {is} one of the most celebrated {nationality} {domains} of {poss} generation.",
        "{Pronoun} {is} widely regarded as one of the greatest {nationality} {domains}.",
        "Among {nationality} {domains}, {pronoun} {is} one of the most famous.",
        "{Pronoun} {is} considered one of the most influential {nationality} {domains}.",
        "{Pronoun} {is} {a_nationality} {domain} of great distinction.",
        "{Pronoun} grew up to be one of the great {nationality} {domains}.",
        "{Pronoun} {is} one of the most important {nationality} {domains}.",
    ),
    # Fame for the work, never fame from it: the best-known work is often not the one that made the name
    # (Germinal came after Zola was famous).
    "work1": ("{Who} {is} perhaps best known for {work1}.", "{Who_poss} name became closely linked with {work1}.",
              "{Who_poss} career is closely tied to {work1}.", "{Who} became famous for {work1}.",
              "{Who_poss} name will always be linked with {work1}.", "{Who} {is} most famous for {work1}.",
              "{Who} won great renown for {work1}.", "{Who} gained international fame for {work1}.",
              "{Who} {is} remembered first and foremost for {work1}.", "{Who_poss} reputation is built on {work1}."),
    "work2": ("{Pronoun} {is} also admired for {work2}.", "{Who} {is} also known for {work2}.",
              "{Pronoun} {is} also celebrated for {work2}.", "{Who} {is} also famous for {work2}.",
              "{Who} also became known for {work2}.", "{Who} {is} further known for {work2}.",
              "{Pronoun} also gained renown for {work2}."),
    "work3": ("{Who_poss} record also includes {work3}.", "{Pronoun} {is} remembered too for {work3}.",
              "{Who_poss} name is also linked with {work3}.", "{Pronoun} {is} known as well for {work3}.",
              "{Who} also won praise for {work3}."),
    "work23": ("{Pronoun} {is} also admired for {work2} and {work3}.", "{Who_poss} record also includes {work2} and {work3}.",
               "{Pronoun} {is} also known for {work2} and {work3}.", "{Who} {is} further known for {work2} and {work3}.",
               "{Who_poss} name is also bound up with {work2} and {work3}.",
               "{Pronoun} also became known for {work2} and {work3}.",
               "{Pronoun} {is} also remembered for {work2} and {work3}.",
               "{Pronoun} {is} equally admired for {work2} and {work3}.",
               "No account of {who_poss} career leaves out {work2} and {work3}."),
    "death": ("{Pronoun} died in {death_year} in {death_place}.",
              "{Pronoun} died in {death_place}, in {death_year}.",
              "{Who_poss} life ended in {death_year} in {death_place}.",
              "In {death_year}, {pronoun} died in {death_place}.",
              "{Pronoun} passed away in {death_place}, in {death_year}.",
              "{Who_poss} final home was {death_place}, where {pronoun} died in {death_year}.",
              "{Pronoun} died at {death_place}, in {death_year}.",
              "The end came in {death_year}, in {death_place}.",
              "{Who} breathed {poss} last in {death_year} in {death_place}.",
              "{Pronoun} ended {poss} days in {death_year} in {death_place}.",
              "It was in {death_city}, in {death_country_in}, that {pronoun} passed away, in {death_year}."),
    "death_plain": ("{Pronoun} died in {death_year}.", "{Who_poss} life ended in {death_year}.",
                    "{Pronoun} passed away in {death_year}.", "In {death_year}, {pronoun} died.",
                    "{Who_poss} career closed with {poss} death in {death_year}.",
                    "{Pronoun} lived until {death_year}.", "Death came to {who} in {death_year}.",
                    "{Pronoun} ended {poss} days in {death_year}.", "The end came in {death_year}."),
}

QUESTIONS = {
    "person_name": "What is the name of the {domain} known for {works}?",
    "birth_year": "In what year was {name} born?",
    "birth_city": "In which city was {name} born?",
    "nationality": "What {is} the nationality of {name}?",
}


# ---- the table's facts -------------------------------------------------------------------------

def as_of() -> int:
    return tables.people_meta()["as_of"]


@lru_cache(maxsize=1)
def nationalities() -> dict[str, dict]:
    return {n["adjective"]: n for n in tables.people_meta()["nationalities"]}


@lru_cache(maxsize=1)
def people_by_id() -> dict[str, dict]:
    return {p["id"]: p for p in tables.people()}


def is_living(person: dict) -> bool:
    return person["death_year"] is None


def lifespan_gap(a: dict, b: dict) -> int:
    """Years between two lifespans (0 when they overlap); the living count up to ``as_of``."""
    end = lambda p: p["death_year"] or as_of()  # noqa: E731
    return max(0, max(a["birth_year"], b["birth_year"]) - min(end(a), end(b)))


def compatible_substitute(person: dict, sub: dict) -> bool:
    """A name swap must not make a living person dead (or the dead alive), nor move them in time (lifespans
    within ``MAX_ERA_GAP`` years, births within ``GENERATION``: Jules Verne, born 1828, overlaps Marcel Proust's
    life but is of another generation), nor give them a title ("Queen Victoria was one of the best-known
    American writers")."""
    return (is_living(person) == is_living(sub) and lifespan_gap(person, sub) <= MAX_ERA_GAP
            and abs(sub["birth_year"] - person["birth_year"]) <= GENERATION and not TITLED.search(sub["name"]))


def true_nationality_terms(person: dict) -> list[str]:
    """Every phrase that states or implies the person's real nationality: its forms and aliases,
    their countries, and the real birth and death places."""
    table = nationalities()
    terms = [person["nationality"], person["nationality_noun"], *person["nationality_aliases"]]
    for adjective in [person["nationality"], *person["nationality_aliases"]]:
        entry = table.get(adjective, {})
        terms += entry.get("nouns", []) + entry.get("countries", [])
    terms += [c for c in (person["birth_country"], person["death_country"]) if c]
    # A birth or death city places the person as surely as the country does (unless it is in the name).
    terms += [c for c in (person["birth_city"], person["death_city"]) if c and not contains(person["name"], c)]
    return terms


def nationality_is_true(person: dict, adjective: str) -> bool:
    """True forms, a nationality nested in a true one or containing it (``part_of``: Welsh for a British
    person), and the nationality of a country the person was born or died in (arguably true)."""
    true_forms = {person["nationality"], person["nationality_noun"], *person["nationality_aliases"]}
    if adjective in true_forms or nested_nationality(person, adjective):
        return True
    places = {person["birth_country"], person["death_country"]} - {None}
    return bool(places & set(nationalities()[adjective]["countries"]))


def nested_nationality(person: dict, adjective: str) -> bool:
    """One of the two lies inside the other (``part_of``): British and Welsh."""
    table = nationalities()
    true_forms = {person["nationality"], *person["nationality_aliases"]}
    inside = set(table.get(adjective, {}).get("part_of", []))
    return bool(inside & true_forms) or any(adjective in table.get(t, {}).get("part_of", []) for t in true_forms)


def nationality_is_plausible(person: dict, adjective: str, birth_year: int) -> bool:
    """Same region as the real nationality (or its ``kin``), and the state existed within the person's life."""
    entry, real = nationalities()[adjective], nationalities()[person["nationality"]]
    since = entry["since"]
    near = entry["region"] == real["region"] or bio_swaps.kin(person["nationality"], adjective)
    return entry["drawn"] and near and (
        since is None or since <= birth_year + NATIONALITY_LATEST)


@lru_cache(maxsize=1)
def places() -> dict[str, tuple[str, int]]:
    """city -> (country, first year the table attests it: someone born or died there).

    A city named in two countries (Milan) and the places listed under ``places_not_drawn`` are
    left out: they are never drawn as a counterfactual birth city.
    """
    seen: dict[str, dict[str, int]] = {}
    for p in tables.people():
        for kind in ("birth", "death"):
            city, country, year = p[f"{kind}_city"], p[f"{kind}_country"], p[f"{kind}_year"]
            if city:
                years = seen.setdefault(city, {})
                years[country] = min(years.get(country, year), year)
    return {
        city: next(iter(by_country.items()))
        for city, by_country in sorted(seen.items())
        if len(by_country) == 1 and city not in tables.people_meta()["places_not_drawn"]
    }


# ---- passages ----------------------------------------------------------------------------------

def _possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s")


def works_phrase(works: list[str]) -> str:
    return f"{works[0]} and {works[1]}"


def _values(facts: dict, works: list[str]) -> dict[str, str]:
    """Template values for ``facts`` (every one but the mention of the person, ``who``)."""
    pronoun = facts["pronoun"]
    living = facts["death_year"] is None
    values = {k: str(v) for k, v in facts.items() if isinstance(v, (str, int)) and v is not None}
    values.update(
        domain=facts["domain"], domains=facts["domain"] + "s", pronoun=pronoun,
        poss="his" if pronoun == "he" else "her",
        a_nationality=("an " if facts["nationality"][:1] in "AEIOU" else "a ") + facts["nationality"],
        birth_country_in=country_in_text(facts["birth_country"]),
    )
    values["is"] = "is" if living else "was"  # "is" is a keyword, so not an argument name above
    if not living:
        values["death_country_in"] = country_in_text(facts["death_country"])
        # The country once: "died in Boston" after "born in Amherst, in the United States"
        values["death_place"] = facts["death_city"] if facts["death_country"] == facts["birth_country"] else (
            f"{facts['death_city']}, in {values['death_country_in']}")
    values.update({f"work{k + 1}": w for k, w in enumerate(works[:3])})
    return values


def biography(facts: dict, name: str, surname: str, forbidden: list[str], twin: tuple[dict, str, str],
               rng: random.Random, with_places: bool = True) -> tuple[list[str], list[str]]:
    """Sentences of a biography for ``facts`` that names the person ``name``, and of its twin.

    A sentence mentioning any ``forbidden`` phrase is swapped for a plain variant, or left out
    when it has none; ``with_places=False`` leaves out every birth and death place.

    ``twin`` (facts, name, surname) is told with the same choices of template and of mention
    (surname or full name): the agreeing twin's true facts and name fill the very sentences of the
    counterfactual passage, derived forms included ("an Italian", "Curie's").
    """
    living = facts["death_year"] is None
    named = False  # the first sentence kept names the person in full, later ones mostly by surname
    works = [w for w in facts["works"] if not contains_any(w, forbidden)]
    views = [(_values(facts, works), name, surname), (_values(twin[0], works), twin[1], twin[2])]

    after_pronoun = False  # the last sentence kept opened with He/She

    def sentence(*pools: tuple[str, ...]) -> list[str] | None:
        nonlocal named, after_pronoun
        for pool in pools:
            if not pool:
                continue
            template = rng.choice(pool)
            # He ... Curie ... She: no run of pronouns; and a pronoun opening names the person now and then
            if template.startswith("{Pronoun}") and (after_pronoun or rng.random() < NAME_FOR_PRONOUN):
                template = "{Who}" + template[len("{Pronoun}"):]
            full = rng.choice((False, False, False, True)) if named else True  # mostly the surname once named
            texts = []
            for values, view_name, view_surname in views:
                who = view_name if full else view_surname
                text = capitalize_first(fill(template, **values, who=who, who_poss=_possessive(who)))
                # "Washington, D.C." or "Whaam!" at the end of a sentence takes no second stop
                texts.append(text.replace("..", ".").replace("!.", "!").replace("?.", "?"))
            if not contains_any(texts[0], forbidden):
                named = named or "{who" in template.lower()
                after_pronoun = template.startswith("{Pronoun}")
                return texts
        return None

    style = rng.choice((DECLARATIVE, NARRATIVE))
    # A work that opens with a gerund ("becoming the first ...") takes only the frames that read with one.
    # Two further works share one sentence ("also known for X and Y"): fewer frame words per passage.
    slots = ([("work1", ["work1"])] if works else []) + (
        [("work23", ["work2", "work3"])] if len(works) > 2 else [("work2", ["work2"])] if len(works) > 1 else [])
    # "best known for" only the person's first listed work (a nationality item may have left it out)
    pools = {**style, "work1": bio_primacy.work1_frames(style["work1"], works, facts["works"])}
    work_pools = [tuple(t for t in pools[kind] if not any(bio_plausible.gerund_work(works[int(n[-1]) - 1])
                                                          and noun_only(t, n) for n in names))
                  for kind, names in slots]
    # The person's own answer-neutral sentences, one after each work, the rest after the last
    about = [(t,) for t in bio_plausible.about().get(twin[0]["id"], [])]
    body = [pool for k in range(max(len(work_pools), len(about))) for pool in work_pools[k:k + 1] + about[k:k + 1]]
    if style is DECLARATIVE:  # encyclopedic: who, where from, main work before "also"
        merged = sentence(style["open_place"]) if with_places and rng.random() < 0.5 else None
        if merged:
            opening = [merged]
        elif with_places:
            opening = [sentence(style["open_before_place"]),
                       sentence(style["place"], style["place_plain"][:1], style["place_plain"][1:])]
        else:
            opening = [sentence(style["open"])]
    else:  # narrative: birth, renown, works, in the order of a life
        first = sentence(style["open"], style["open_plain"]) if with_places else sentence(style["open_plain"][1:])
        opening = [first, sentence(style["renown"])]
    middle = [sentence(pool) for pool in body]
    closing = []
    if not living:
        closing = [sentence(style["death"], style["death_plain"]) if with_places else sentence(style["death_plain"])]
    kept = [texts for texts in opening + middle + closing if texts]
    return [t[0] for t in kept], [t[1] for t in kept]


# ---- items -------------------------------------------------------------------------------------

def _name_items(person: dict, others: list[dict], seed: int, rng: random.Random) -> list[tuple[Item, list[str]]]:
    fragments = name_fragments(person["name"], person["surname"], *person["aliases"])
    # The passage tells the person's places and works: a substitute whose name shares a word with them
    # ("Paul Cézanne" for a writer born in Saint Paul) would leave that word in the agreeing twin.
    told = " ".join(filter(None, (person["birth_city"], person["death_city"], *person["works"],
                                  *bio_plausible.about().get(person["id"], []))))
    candidates = [
        o for o in others
        if o["pronoun"] == person["pronoun"] and compatible_substitute(person, o) and substitute_fits(person, o)
        and not bio_plausible.name_speaks_against(o)
        and not set(name_fragments(o["name"], *o["aliases"])) & set(fragments)
        and not contains_any(told, name_fragments(o["name"], *o["aliases"]))
    ]
    # The substitutes of the stated nationality first; one of another nationality only where no work ties the
    # person to a nationality, told with no nationality and no place (the passage then states none).
    same = [o for o in candidates if bio_swaps.substitute_nationality_fits(person, o)]
    terms = true_nationality_terms(person) + bio_swaps.nationality_words() + bio_swaps.national_details(person)
    other = [o for o in candidates if o not in same] if bio_swaps.may_cross_nationality(person, terms) else []
    picked = rng.sample(same, min(SUBSTITUTES_PER_PERSON, len(same)))
    picked += rng.sample(other, min(SUBSTITUTES_PER_PERSON - len(picked), len(other)))
    items = []
    for k, sub in enumerate(picked):
        crossed = sub in other
        sentences, agree = biography(person, sub["name"], sub["surname"],
                                      [*fragments, *bio_plausible.PEN_NAME, *(terms if crossed else [])],
                                      (person, person["name"], person["surname"]), rng, with_places=not crossed)
        question = fill(QUESTIONS["person_name"], domain=person["domain"], works=works_phrase(person["works"]))
        items.append((
            Item(
                id=f"{NAME}-person_name-{person['id']}-{k}",
                dataset=NAME,
                relation="person_name",
                subject=person["id"],
                context=" ".join(sentences),
                question=question,
                counterfactual_answer=sub["name"],
                counterfactual_aliases=list(sub["aliases"]),
                parametric_answer=person["name"],
                parametric_aliases=list(person["aliases"]),
                answer_position=answer_position(sentences, sub["name"]),
                version=VERSION,
                seed=seed,
            ),
            agree,
        ))
    return items


def nationality_choices(person: dict) -> list[str]:
    """The counterfactual nationalities that fit ``person`` (none when every work names the real one)."""
    forbidden = true_nationality_terms(person) + person.get("national_works", [])
    works = " ".join(w for w in person["works"] if not contains_any(w, forbidden))
    if not works or bio_plausible.names_birthplace(person):
        # every work ties the person to the real nationality (what is left is no biography), or the name
        # does (Leonardo da Vinci: Vinci)
        return []
    return [
        n for n in nationalities()
        if not nationality_is_true(person, n) and nationality_is_plausible(person, n, person["birth_year"])
        and not contains_any(works, [n, *nationalities()[n]["countries"]])
        and nationality_fits_language(person, n)  # no Spanish author of War and Peace
    ]


def _counterfactual(person: dict, attribute: str, rng: random.Random, used: Counter
                    ) -> tuple[str, dict, list[str], bool] | None:
    """(value, changed facts, extra forbidden phrases, with_places) for one attribute, or None
    when no plausible value is left (the item is then dropped); ``used`` counts the nationalities drawn."""
    facts = dict(person)
    if attribute == "birth_year":
        # Either way, as long as the life stays possible: an adult at the first work (first_work_year),
        # no lifespan of 95 or more unless true, no living person of 90 or more. A direction first, so
        # that earlier and later come about equally often whatever the number of years each side offers.
        sides = [[y for y in side if nationality_is_plausible(person, person["nationality"], y)
                  and bio_places.country_existed(person["birth_country"], y)]  # no birth in Pakistan in 1930
                 for side in birth_year_choices(person)]
        sides = [side for side in sides if side]
        if not sides:
            return None
        facts["birth_year"] = rng.choice(rng.choice(sides))
        return str(facts["birth_year"]), facts, [], True
    if attribute == "birth_city":
        text = " ".join([person["name"], *person["aliases"], *person["works"]])
        cities = [
            city for city, (country, since) in places().items()
            if country == person["birth_country"] and since <= person["birth_year"]
            and city not in (person["birth_city"], person["death_city"]) and not contains(text, city)
            and not within(city, person["birth_city"])  # Greenwich for a Londoner keeps the truth right
        ]
        if not cities:
            return None
        facts["birth_city"] = rng.choice(cities)
        return facts["birth_city"], facts, [], True
    choices = nationality_choices(person)
    if not choices:
        return None
    facts["nationality"] = bio_swaps.balanced_choice(person["nationality"], choices, used, rng)
    forbidden = true_nationality_terms(person) + person.get("national_works", []) + bio_swaps.national_details(person)
    return facts["nationality"], facts, forbidden, False


def _attribute_items(person: dict, seed: int, rng: random.Random, used: Counter) -> list[tuple[Item, list[str]]]:
    items = []
    for attribute in ATTRIBUTES:
        true_value = str(person[attribute])
        if contains_any(" ".join([person["name"], *person["aliases"]]), [true_value]):
            continue  # Leonardo da Vinci, born in Vinci: the name would give the answer away
        drawn = _counterfactual(person, attribute, rng, used)
        if drawn is None:
            continue
        cf_value, facts, forbidden, with_places = drawn
        tense = "is" if is_living(person) else "was"  # "What is the nationality of" a living person
        sentences, agree = biography(facts, person["name"], person["surname"], [true_value, *forbidden],
                                      (person, person["name"], person["surname"]), rng, with_places)
        cf_aliases = parametric_aliases = []
        if attribute == "nationality":
            cf_aliases = [n for n in nationalities()[cf_value]["nouns"] if n != cf_value]
            parametric_aliases = [n for n in (person["nationality_noun"], *person["nationality_aliases"])
                                  if n != true_value]
        items.append((
            Item(
                id=f"{NAME}-{attribute}-{person['id']}",
                dataset=NAME,
                relation=attribute,
                subject=person["id"],
                context=" ".join(sentences),
                question=fill(QUESTIONS[attribute], name=person["name"], **{"is": tense}),
                counterfactual_answer=cf_value,
                counterfactual_aliases=cf_aliases,
                parametric_answer=true_value,
                parametric_aliases=parametric_aliases,
                answer_position=answer_position(sentences, cf_value),
                version=VERSION,
                seed=seed,
            ),
            agree,
        ))
    return items


def build_pairs(seed: int) -> list[tuple[Item, list[str]]]:
    """Every CF_Bio item for ``seed`` (name substitutions first, then attribute changes), each with
    the sentences of its agreeing twin: the same biography told with the true name or value."""
    rng = make_rng(NAME, VERSION, seed)
    people = sorted(tables.people(), key=lambda p: p["id"])
    pairs: list[tuple[Item, list[str]]] = []
    for person in people:
        others = [o for o in people if o["id"] != person["id"]]
        pairs += _name_items(person, others, seed, rng)
    used: Counter = Counter()  # (true, counterfactual nationality) -> items so far: an even spread
    for person in people:
        pairs += _attribute_items(person, seed, rng, used)
    return pairs


def build(seed: int) -> list[Item]:
    """All CF_Bio items for ``seed``: name substitutions first, then attribute changes."""
    return [item for item, _ in build_pairs(seed)]


# ---- validator rules (merged into validate.RULES for this dataset) ------------------------------

def _relation(items: list[Item], relation: str) -> list[tuple[Item, dict]]:
    return [(i, people_by_id()[i.subject]) for i in items if i.relation == relation]


def _nationality_implied(items: list[Item]) -> list[str]:
    return [i.id for i, p in _relation(items, "nationality") if contains_any(i.context, true_nationality_terms(p))]


def _birth_city_not_born_in(items: list[Item], stated: Callable[[Item], str] = lambda i: i.counterfactual_answer
                            ) -> list[str]:
    """The birth city the passage states (``stated``) follows "born in"."""
    return [i.id for i, _ in _relation(items, "birth_city") if not contains(i.context, f"born in {stated(i)}")]


def _birth_city_country(items: list[Item]) -> list[str]:
    countries = {c for p in tables.people() for c in (p["birth_country"], p["death_country"]) if c}
    bad = []
    for i, p in _relation(items, "birth_city"):
        in_works = {c for c in countries if contains_any(" ".join(p["works"]), [c])}  # "leading Ghana to ..."
        allowed = {p["birth_country"], p["death_country"]} | in_works
        if places().get(i.counterfactual_answer, (None,))[0] != p["birth_country"] or contains_any(
                i.context, sorted(countries - allowed)):
            bad.append(i.id)
    return bad


def _birth_village(items: list[Item]) -> list[str]:
    return [i.id for i, _ in _relation(items, "birth_city") if i.counterfactual_answer in tables.people_meta()["places_not_drawn"]]


def _national_work(items: list[Item]) -> list[str]:
    return [i.id for i, p in _relation(items, "nationality") if contains_any(i.context, p.get("national_works", []))]


def _nested_nationality(items: list[Item]) -> list[str]:
    return [i.id for i, p in _relation(items, "nationality") if nested_nationality(p, i.counterfactual_answer)]


def _titled_substitute(items: list[Item]) -> list[str]:
    return [i.id for i in items if i.relation == "person_name" and TITLED.search(i.counterfactual_answer)]


def _living_described_dead(items: list[Item]) -> list[str]:
    return [i.id for i in items if is_living(people_by_id()[i.subject]) and _PAST.search(i.context)]


def _substitute_incompatible(items: list[Item]) -> list[str]:
    by_name = {p["name"]: p for p in tables.people()}
    return [
        i.id for i, p in _relation(items, "person_name")
        if i.counterfactual_answer not in by_name or not compatible_substitute(p, by_name[i.counterfactual_answer])
    ]


def _noun_as_adjective(items: list[Item]) -> list[str]:
    domains = {p["domain"] for p in tables.people()}
    phrases = [f"{noun} {d}{s}" for n in nationalities().values() for noun in n["nouns"] if noun != n["adjective"]
               for d in domains for s in ("", "s")]
    return [i.id for i in items if contains_any(i.context, phrases)]


def _nationality_also_true(items: list[Item]) -> list[str]:
    return [i.id for i, p in _relation(items, "nationality") if nationality_is_true(p, i.counterfactual_answer)]


def _nationality_implausible(items: list[Item]) -> list[str]:
    return [
        i.id for i, p in _relation(items, "nationality")
        if i.counterfactual_answer not in nationalities()
        or not nationality_is_plausible(p, i.counterfactual_answer, p["birth_year"])
    ]


EXTRA_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "bio_nationality_implied": (
        "a nationality item names no form, alias or country of the real nationality, nor the real birth or "
        "death place", _nationality_implied),
    "bio_birth_city_not_born_in": ("a birth-city item says 'born in <counterfactual city>'", _birth_city_not_born_in),
    "bio_birth_city_country": (
        "a counterfactual birth city lies in the real birth country, and the passage names no other country "
        "than the birth and death countries", _birth_city_country),
    "bio_living_described_dead": ("a living person is written in the present tense, never dies and has no legacy",
                                  _living_described_dead),
    "bio_substitute_incompatible": (
        f"a name-swap substitute shares the living/dead status, lives within {MAX_ERA_GAP} years of the person and "
        f"was born within {GENERATION} years of the person",
        _substitute_incompatible),
    "bio_noun_as_adjective": ("a nationality noun is never used as an adjective ('a New Zealander politician')",
                              _noun_as_adjective),
    "bio_nationality_also_true": (
        "a counterfactual nationality is not also true (an alias, or the nationality of the birth or death country)",
        _nationality_also_true),
    "bio_nationality_implausible": (
        f"a counterfactual nationality is drawn from the real one's region and existed within "
        f"{NATIONALITY_LATEST} years of the birth", _nationality_implausible),
    "bio_birth_city_is_city": ("a counterfactual birth city is a city or town, not a village, estate or district "
                               "(places_not_drawn)", _birth_village),
    "bio_national_work": ("a nationality item names no work that ties the person to the real nationality "
                          "(national_works: 'a major US party')", _national_work),
    "bio_nested_nationality": ("a counterfactual nationality neither lies inside the real one nor contains it "
                               "(British and Welsh; part_of)", _nested_nationality),
    "bio_titled_substitute": ("a name-swap substitute's name carries no title, honorific or regnal number "
                              "(Queen Victoria, Mahatma Gandhi, Elizabeth I)", _titled_substitute),
    **bio_plausible.RULES,
    **bio_swaps.rules(true_nationality_terms, nationality_choices),
    **bio_primacy.RULES,
    **bio_places.RULES,
}


def _substitute_fragment(items: list[Item]) -> list[str]:
    return [i.id for i in items if i.relation == "person_name"
            and contains_any(i.context, name_fragments(i.counterfactual_answer, *i.counterfactual_aliases))]


# The agreeing twin (cf_bio_agree) tells the same biography with the true name or value: the rules
# above that are about the text, not about the counterfactual (which the twin no longer states).
AGREE_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "agree_bio_birth_city_born_in": ("a birth-city twin says 'born in <true city>'",
                                     lambda items: _birth_city_not_born_in(items, lambda i: i.parametric_answer)),
    "agree_bio_no_substitute_fragment": ("a name-swap twin keeps no fragment of the substitute's name",
                                         _substitute_fragment),
    **{rule: EXTRA_RULES[rule] for rule in ("bio_birth_city_country", "bio_living_described_dead",
                                            "bio_noun_as_adjective", *bio_plausible.TEXT_RULES, *bio_primacy.RULES)},
}
