"""Invented entities: facts about people, towns, countries, works and companies that exist nowhere.

The "C" training points of the fine-tuning study (Goyal et al., sections 3-4): a passage states the
facts of an invented entity and the question asks one of them, so only the context can answer.
The passages and questions come from the evaluation datasets' own templates (cf_capitals'
``TEMPLATES``, the relations of ``relations.json``, cf_bio's biography sentences), so a C point and a
CS point (a real fact, stated by its passage) differ only in whether the subject is known.

Names are built from syllables with a seeded ``random.Random`` and kept only when they are no word
of any fact table (no real person, no real place) and rare in every language of ``LANGUAGES``
(wordfreq's Zipf frequency below ``MAX_ZIPF``: not a common word). ``RULES`` re-check every
promise on the points themselves (``check_points``), each with a test that injects its defect.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from functools import lru_cache

from cf_tasks.text import contains, words

from . import cf_bio, cf_capitals, tables
from .cf_world_facts import number_values, relations_by_name
from .common import POSITIONS, passage_from_templates
from .schema import fill

VERSION = 4  # bump with every change of the generated points (names, frames, templates, counts)
MAX_ZIPF = 2.0  # wordfreq Zipf frequency: below 2 is rarer than once per 100 million words
LANGUAGES = ("en", "de", "fr", "es", "it", "nl", "pt")
# English words of the passage templates that wordfreq puts below MAX_ZIPF; vetted by reading them.
RARE_TEMPLATE_WORDS = frozenset({"hydrologists", "birdwatchers", "easels", "paragliders", "bibliographers",
                                 "concertgoers", "canoeists"})
MIN_TOKEN_LENGTH = 5  # short names ("Kova", "Joba") are more often real somewhere
CAPITALS_POINTS = 96
WORLD_FACTS_POINTS_PER_RELATION = 24
BIO_PEOPLE = 48  # each gives one point per cf_bio relation
BIO_RELATIONS = ("person_name", "birth_year", "birth_city", "nationality")
DATASET = "invented"

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "tr", "v",
           "z", "th", "sh", "h", "j")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o")
_CODAS = ("", "", "n", "r", "l", "s", "nd", "rk", "th", "v", "sk")

# Name frames per kind of entity; "{X}" is an invented token. Titles are singular ("The Ballad of
# Orvenna was written by"), as the relations' templates treat a work as one thing.
FRAMES = {
    "landmark": ("the {X} Tower", "the {X} Bridge", "the {X} Gate", "the {X} Cathedral", "the {X} Palace"),
    "book": ("The Ballad of {X}", "A Winter in {X}", "The House of {X}", "The Last Days of {X}"),
    "invention": ("the {X} lamp", "the {X} engine", "the {X} loom", "the {X} pump"),
    "painting": ("The Harbour at {X}", "Evening over {X}", "The {X} Triptych", "The Garden at {X}"),
    "museum": ("the {X} Museum", "the {X} Gallery", "the {X} Museum of Art"),
    "company": ("{X}", "{X} Systems", "{X} Motors", "{X} Foods"),
    "river": ("the {X}",),
    "water": ("the {X} Sea", "Lake {X}", "the Gulf of {X}", "the Bay of {X}"),
    "mountain": ("Mount {X}",),
    "composition": ("the {X} Sonata", "the {X} Suite", "the {X} Concerto", "the {X} Overture"),
}
# The works a biography names, by the person's domain.
BIO_WORKS = {
    "writer": ("The Ballad of {X}", "A Winter in {X}", "the {X} Letters", "The House of {X}"),
    "painter": ("The Harbour at {X}", "Evening over {X}", "the {X} Triptych"),
    "composer": ("the {X} Sonata", "the {X} Suite", "the {X} Overture"),
    "scientist": ("the {X} effect", "the {X} equation", "the {X} theorem"),
    "politician": ("the Treaty of {X}", "the {X} Reforms", "the {X} Accord"),
    "philosopher": ("the {X} Dialogues", "the {X} Meditations", "the {X} Lectures"),
}
# relation -> (subject kind, answer kind, domain of an answer person)
WORLD_RELATIONS = {
    "landmark_city": ("landmark", "town", None),
    "book_author": ("book", "person", "writer"),
    "invention_inventor": ("invention", "person", "inventor"),
    "painting_museum": ("painting", "museum", None),
    "company_headquarters": ("company", "town", None),
    "river_mouth": ("river", "water", None),
    "mountain_country": ("mountain", "country", None),
    "painting_painter": ("painting", "person", "painter"),
    "composition_composer": ("composition", "person", "composer"),
}
BIO_DOMAINS = tuple(BIO_WORKS)
COUNTRY_ENDINGS = ("ia", "ia", "a", "ar", "en")  # "Velmoria", "Tashar": country names read as such
CURRENCY_UNITS = ("crown", "mark", "florin", "dollar")


class InventedError(ValueError):
    """Invented points broke one or more rules; ``str()`` has one line per rule."""


# --- the words a name must not be ------------------------------------------------------------------

@lru_cache(maxsize=1)
def real_name_words() -> frozenset[str]:
    """Every word (3+ letters) of a person's name, alias or work in the fact tables."""
    out: set[str] = set()
    for p in tables.people():
        for text in [p["name"], p["surname"], *p["aliases"], *p["works"]]:
            out.update(w for w in words(text) if len(w) >= 3)
    for r in tables.relations():
        for name in r.get("creators", {}):
            out.update(w for w in words(name) if len(w) >= 3)
        if r["relation"] in ("book_author", "invention_inventor", "painting_painter", "composition_composer"):
            for f in r["facts"]:
                for text in [f["subject"], f["answer"], *f.get("answer_aliases", [])]:
                    out.update(w for w in words(text) if len(w) >= 3)
    return frozenset(out)


@lru_cache(maxsize=1)
def real_place_words() -> frozenset[str]:
    """Every word (3+ letters) of a place in the fact tables: countries, cities, water bodies,
    landmarks, mountains, museums, companies, nationalities."""
    out: set[str] = set()

    def add(*texts: str | None) -> None:
        for text in texts:
            if text:
                out.update(w for w in words(text) if len(w) >= 3)

    for c in tables.countries():
        add(c["name"], *c["aliases"], c["capital"], *c["capital_aliases"], c["largest_city"], c["other_city"],
            *c["other_city_aliases"], c["currency"], c["language"], *c.get("other_languages", []), *c.get("former_capitals", []),
            *c.get("largest_city_aliases", []))
    for p in tables.people():
        add(p["birth_city"], p["birth_country"], p["death_city"], p["death_country"], p["nationality"])
    for n in tables.people_meta()["nationalities"]:
        add(n["adjective"], *n.get("nouns", []), *n.get("countries", []))
    for r in tables.relations():
        if r["relation"] in ("landmark_city", "painting_museum", "company_headquarters", "river_mouth",
                             "mountain_country"):
            for f in r["facts"]:
                add(f["subject"], f["answer"], *f.get("answer_aliases", []))
        for a in r.get("other_answers", []):
            add(a["answer"], *a["answer_aliases"])
        for group in r.get("regions", {}).values():
            add(*group)
        add(*r.get("collections", {}))
    return frozenset(out)


@lru_cache(maxsize=65536)
def zipf(token: str) -> float:
    """The highest wordfreq Zipf frequency of ``token`` over ``LANGUAGES``."""
    from wordfreq import zipf_frequency

    return max(zipf_frequency(token, lang) for lang in LANGUAGES)


def usable_token(token: str, used: set[str]) -> bool:
    folded = token.lower()
    return (len(folded) >= MIN_TOKEN_LENGTH and folded not in used and folded not in real_name_words()
            and folded not in real_place_words() and zipf(folded) < MAX_ZIPF)


# --- the generator ---------------------------------------------------------------------------------

class Namer:
    """Invented tokens from one seeded ``random.Random``, never the same token twice."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def syllables(self, n: int) -> list[str]:
        """``n`` syllables, no onset twice in a row ("Stastastond", "Krakrork" read as stammers)."""
        parts: list[str] = []
        while len(parts) < n:
            onset = self.rng.choice(_ONSETS)
            if not parts or not parts[-1].startswith(onset) and not onset.startswith(parts[-1][0]):
                parts.append(onset + self.rng.choice(_VOWELS))
        return parts

    def token(self, syllables: tuple[int, ...] = (2, 2, 3)) -> str:
        while True:
            parts = self.syllables(self.rng.choice(syllables))
            token = ("".join(parts) + self.rng.choice(_CODAS)).capitalize()
            if usable_token(token, self.used):
                self.used.add(token.lower())
                return token

    def country(self) -> str:
        while True:
            stem = "".join(self.syllables(2))
            name = (stem.rstrip("aeiou") + self.rng.choice(COUNTRY_ENDINGS)).capitalize()
            if usable_token(name, self.used):
                self.used.add(name.lower())
                return name

    def adjective(self, country: str) -> str | None:
        """"Velmoria" -> "Velmorian", "Tashar" -> "Tasharian"; None when the adjective is not usable."""
        base = country.lower()
        adj = base + "n" if base.endswith("a") else base + "ian"
        if not usable_token(adj, self.used):
            return None
        self.used.add(adj)
        return adj.capitalize()


def _framed(namer: Namer, kind: str, frames: dict = FRAMES) -> tuple[str, list[str]]:
    token = namer.token()
    return fill(namer.rng.choice(frames[kind]), X=token), [token]


def _person(namer: Namer) -> tuple[str, str, list[str]]:
    first, last = namer.token((2,)), namer.token((2, 3))
    return f"{first} {last}", last, [first, last]


def _country(namer: Namer) -> tuple[str, str, list[str]]:
    while True:
        name = namer.country()
        adjective = namer.adjective(name)
        if adjective:
            return name, adjective, [name, adjective]


def _entity(namer: Namer, kind: str) -> tuple[str, list[str]]:
    if kind == "person":
        name, _, tokens = _person(namer)
        return name, tokens
    if kind == "country":
        name = namer.country()
        return name, [name]
    if kind == "town":
        token = namer.token()
        return token, [token]
    return _framed(namer, kind)


def _point(family: str, relation: str, index: int, subject: str, question: str, sentences: list[str],
           answer: str, facts: dict, invented: list[str]) -> dict:
    text = f"{question} {' '.join(sentences)} {answer}"
    return {
        "id": f"C-{family}-{relation}-{index}",
        "kind": "C",
        "dataset": DATASET,
        "family": family,
        "relation": relation,
        "subject": subject,
        "instruction": question,
        "input": " ".join(sentences),
        "output": answer,
        "answer_aliases": [],
        "fact_id": f"C/{family}/{relation}/{index}",
        "facts": facts,
        "invented": [t for t in invented if contains(text, t)],  # the tokens this text uses
    }


def capital_points(namer: Namer, n: int = CAPITALS_POINTS) -> list[dict]:
    """Invented countries and their capitals, in cf_capitals' sentences (the continent filler, which
    would name a real place, is left out)."""
    templates = {**cf_capitals.TEMPLATES,
                 "filler_sentences": [t for t in cf_capitals.TEMPLATES["filler_sentences"] if "{continent}" not in t]}
    positions = [POSITIONS[i % len(POSITIONS)] for i in range(n)]
    namer.rng.shuffle(positions)
    points = []
    for index, position in enumerate(positions):
        country, adjective, tokens = _country(namer)
        capital = namer.token()
        currency = f"{adjective} {namer.rng.choice(CURRENCY_UNITS)}"
        values = {"subject": country, "answer": capital, "parametric": capital, "language": adjective,
                  "language_role": "the official language of", "currency": currency}
        passage = passage_from_templates(templates, values, capital, [], position, False, namer.rng,
                                         random.Random(0))
        points.append(_point("cf_capitals", cf_capitals.RELATION, index, country,
                             fill(templates["question"], subject=country), passage.sentences, capital,
                             {"capital": capital, "language": adjective, "currency": currency},
                             [*tokens, capital]))
    return points


def world_fact_points(namer: Namer, per_relation: int = WORLD_FACTS_POINTS_PER_RELATION) -> list[dict]:
    """Invented landmarks, books, inventions, paintings, companies, rivers, mountains and pieces of
    music, each with the relation's own sentences stating its invented answer."""
    points = []
    for relation, (subject_kind, answer_kind, _) in WORLD_RELATIONS.items():
        record = relations_by_name()[relation]
        positions = [POSITIONS[i % len(POSITIONS)] for i in range(per_relation)]
        namer.rng.shuffle(positions)
        for index, position in enumerate(positions):
            subject, subject_tokens = _entity(namer, subject_kind)
            answer, answer_tokens = _entity(namer, answer_kind)
            values = {"subject": subject, "answer": answer, "parametric": answer, **number_values(False)}
            passage = passage_from_templates(record, values, answer, [], position, False, namer.rng,
                                             random.Random(0))
            points.append(_point("cf_world_facts", relation, index, subject, fill(record["question"], **values),
                                 passage.sentences, answer, {relation: answer},
                                 [*subject_tokens, *answer_tokens]))
    return points


def _invented_person(namer: Namer) -> tuple[dict, list[str]]:
    """An invented person in the shape of a people.json record (places and works invented too)."""
    rng = namer.rng
    name, surname, tokens = _person(namer)
    country, adjective, country_tokens = _country(namer)
    birth_city, death_city = namer.token(), namer.token()
    domain = rng.choice(BIO_DOMAINS)
    works: list[tuple[str, list[str]]] = []
    while len(works) < 2:  # two works of different frames ("the Tevan Sonata and the Logul Suite")
        work = _framed(namer, domain, BIO_WORKS)
        if not works or work[0].replace(work[1][0], "") != works[0][0].replace(works[0][1][0], ""):
            works.append(work)
    birth_year = rng.randint(1700, 1975)
    living = birth_year >= 1945 and rng.random() < 0.5
    death_year = None if living else min(birth_year + rng.randint(45, 90), cf_bio.as_of() - 1)
    person = {
        "id": "invented_" + surname.lower(), "name": name, "surname": surname, "aliases": [surname],
        "domain": domain, "works": [w for w, _ in works], "birth_year": birth_year,
        "birth_city": birth_city, "birth_country": country, "nationality": adjective,
        "nationality_noun": adjective, "nationality_aliases": [], "pronoun": rng.choice(("he", "she")),
        "death_year": death_year, "death_city": None if living else death_city,
        "death_country": None if living else country,
    }
    invented = [*tokens, *country_tokens, birth_city, *(t for _, ts in works for t in ts)]
    return person, invented + ([] if living else [death_city])


def bio_points(namer: Namer, n_people: int = BIO_PEOPLE) -> list[dict]:
    """Biographies of invented people (cf_bio's sentences), one point per cf_bio relation: the name
    of the person known for two works, the birth year, the birth city and the nationality."""
    points = []
    for index in range(n_people):
        person, invented = _invented_person(namer)
        for relation in BIO_RELATIONS:
            sentences, _ = cf_bio.biography(person, person["name"], person["surname"], [],
                                             (person, person["name"], person["surname"]), namer.rng)
            tense = "was" if person["death_year"] else "is"
            if relation == "person_name":
                question = fill(cf_bio.QUESTIONS[relation], domain=person["domain"],
                                works=cf_bio.works_phrase(person["works"]))
                answer = person["name"]
            else:
                question = fill(cf_bio.QUESTIONS[relation], name=person["name"], **{"is": tense})
                answer = str(person[relation])
            facts = {k: person[k] for k in ("name", "birth_year", "birth_city", "birth_country", "nationality",
                                            "death_year", "death_city")}
            points.append(_point("cf_bio", relation, index, person["name"], question, sentences, answer, facts,
                                 invented))
    return points


def invented_points(seed: int) -> list[dict]:
    """Every C point for ``seed``: invented capitals, world facts and biographies (checked by ``RULES``)."""
    namer = Namer(random.Random(f"invented:{seed}"))
    points = capital_points(namer) + world_fact_points(namer) + bio_points(namer)
    check_points(points)
    return points


# --- the rules -------------------------------------------------------------------------------------

_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)])[.!?]\s+")
_PLACEHOLDER = re.compile(r"[{}]")
_ARTICLE = re.compile(r"\b(a|an)\s+([A-Za-z]+)")


def _text(point: dict) -> str:
    return f"{point['instruction']} {point['input']} {point['output']}"


def _no_real_name(points: list[dict]) -> list[str]:
    return [p["id"] for p in points if any(t.lower() in real_name_words() for t in p["invented"])]


def _no_real_place(points: list[dict]) -> list[str]:
    return [p["id"] for p in points if any(t.lower() in real_place_words() for t in p["invented"])]


def _not_common_word(points: list[dict]) -> list[str]:
    return [p["id"] for p in points if any(zipf(t.lower()) >= MAX_ZIPF for t in p["invented"])]


def _unvetted_word(points: list[dict]) -> list[str]:
    """Every word of the text is a word of English (Zipf at least ``MAX_ZIPF``), a number, or an
    invented token the point lists (and the rules above vet): no name escapes the checks."""
    def unvetted(p: dict) -> bool:
        mine = {t.lower() for t in p["invented"]}
        return any(not w.isdigit() and w not in mine and w not in RARE_TEMPLATE_WORDS and _english_zipf(w) < MAX_ZIPF
                   for w in words(_text(p)))
    return [p["id"] for p in points if unvetted(p)]


@lru_cache(maxsize=65536)
def _english_zipf(word: str) -> float:
    from wordfreq import zipf_frequency

    return zipf_frequency(word, "en")


def _states_answer(points: list[dict]) -> list[str]:
    return [p["id"] for p in points if not p["input"] or not contains(p["input"], p["output"])]


def _entity_of(point: dict) -> str:
    return f"{point['family']}/{point['subject']}"


def _self_consistent(points: list[dict]) -> list[str]:
    """No token invented for another point, no year the entity's facts do not hold, and the asked
    attribute in one sentence only (the name of a person asked for runs through the biography)."""
    owner: dict[str, str] = {}
    for p in points:
        for t in p["invented"]:
            owner.setdefault(t.lower(), _entity_of(p))
    bad = []
    for p in points:
        me = _entity_of(p)
        foreign = any(owner.get(w, me) != me for w in words(_text(p)))
        years = {str(v) for v in p["facts"].values() if isinstance(v, int)}
        stray_year = any(y not in years for y in _YEAR.findall(p["input"]))
        once = p["relation"] == "person_name" or sum(contains(s, p["output"]) for s in sentences(p["input"])) == 1
        if foreign or stray_year or not once:
            bad.append(p["id"])
    return bad


def sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text) if s]


def _takes_an(word: str) -> bool:
    w = word.lower()
    return (w[:1] in "aeiou" and not w.startswith(("uni", "use", "eu", "one"))) or w.startswith(("hour", "honest"))


def _grammar(points: list[dict]) -> list[str]:
    """Sentences start with a capital and end with a stop, no placeholder, no doubled word, and "a" /
    "an" agree with the next word ("an Ulvenian painter")."""
    def bad(text: str) -> bool:
        if _PLACEHOLDER.search(text) or re.search(r"\b(\w+) \1\b", text, re.IGNORECASE):
            return True
        if any(not s[:1].isupper() for s in sentences(text)) or not text.rstrip().endswith((".", "?", "!")):
            return True
        return any((m.group(1).lower() == "an") != _takes_an(m.group(2)) for m in _ARTICLE.finditer(text))
    return [p["id"] for p in points if bad(p["input"]) or bad(p["instruction"])]


RULES: dict[str, tuple[str, Callable[[list[dict]], list[str]]]] = {
    "c_no_real_name": ("no invented token is a word of a real person's name, alias or work in the fact tables",
                       _no_real_name),
    "c_no_real_place": ("no invented token is a word of a real place, company or nationality in the fact tables",
                        _no_real_place),
    "c_not_common_word": (f"every invented token is rare in {', '.join(LANGUAGES)} (wordfreq Zipf < {MAX_ZIPF})",
                          _not_common_word),
    "c_unvetted_word": ("every word of the text is an English word, a number or an invented token the point "
                        "lists", _unvetted_word),
    "c_states_answer": ("the passage states the asked answer", _states_answer),
    "c_self_consistent": ("no token of another invented entity, no year outside the entity's facts, and the "
                          "asked attribute in one sentence only", _self_consistent),
    "c_grammar": ("sentences start with a capital letter and end with a stop, no placeholder or doubled word, "
                  "and 'a'/'an' agree with the next word", _grammar),
}


def rule_failures(rules: dict, points: list[dict], separator: str = ", ") -> list[str]:
    """One line per broken rule of ``rules`` (name -> (description, check returning the offenders)),
    naming it and (up to 10 of) the offenders."""
    lines = []
    for rule, (description, check) in rules.items():
        bad = check(points)
        if bad:
            shown = separator.join(bad[:10]) + (f" (+{len(bad) - 10} more)" if len(bad) > 10 else "")
            lines.append(f"{rule}: {description} — broken by {len(bad)} point(s): {shown}")
    return lines


def failures(points: list[dict]) -> list[str]:
    """One line per broken rule, naming it and (up to 10 of) the offending ids."""
    return rule_failures(RULES, points)


def check_points(points: list[dict]) -> None:
    lines = failures(points)
    if lines:
        raise InventedError("\n".join(lines))
