"""The relations of the fact tables, and the in-context pair format: what the IC-recall datasets
and their lm-eval hooks share.

* the relation loader: every relation of the fact tables (``countries.json``, ``people.json``,
  ``relations.json``) as a ``Relation`` of (subject, answer, aliases) facts, with a description
  and the keywords that count as naming it (``names_relation``: the chain-of-thought task's
  ``relation_acc``);
* what the relations say about pairs: ``stating_relations`` (the paper's Assumption 1: every
  relation that states all the pairs), ``competitors`` (relations sharing a subject) and
  ``partners`` (Assumption 2: competitors that agree on some subjects, capital / largest city);
* the format: one "Subject: answer" line per pair, the query line "Subject:"; ``pair_count`` is
  an item's k.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from cf_tasks.text import contains_any, normalize

from . import tables
from .schema import capitalize_first

SEPARATOR = ": "

# Relations read from countries.json: name -> (answer field, aliases field or None, description).
COUNTRY_RELATIONS = {
    "country_capital": ("capital", "capital_aliases", "the capital city of a country"),
    "country_largest_city": ("largest_city", "largest_city_aliases", "the largest city of a country"),
    "country_currency": ("currency", "currency_aliases", "the currency of a country"),
    "country_language": ("language", None, "the main language spoken in a country"),
    "country_continent": ("continent", None, "the continent on which a country lies"),
}
# Relations read from people.json (names as in cf_bio): name -> (answer field, description).
PERSON_RELATIONS = {
    "birth_city": ("birth_city", "the city where a person was born"),
    "death_city": ("death_city", "the city where a person died"),
    "birth_year": ("birth_year", "the year in which a person was born"),
    "death_year": ("death_year", "the year in which a person died"),
    "birth_country": ("birth_country", "the country where a person was born"),
    "death_country": ("death_country", "the country where a person died"),
    "nationality": ("nationality", "the nationality of a person"),
}
# What counts as naming a relation in a chain of thought: any one alternative whose phrases all
# occur (word boundaries, case and accents ignored). Each description must satisfy its own
# keywords and no competitor's (tests/test_ic_recall.py checks it).
KEYWORDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "country_capital": (("capital",), ("capitals",), ("seat of government",)),
    "country_largest_city": (("largest",), ("biggest",), ("most populous",), ("most populated",)),
    "country_currency": (("currency",), ("currencies",), ("money",)),
    "country_language": (("language",), ("languages",), ("spoken",), ("tongue",)),
    "country_continent": (("continent",), ("continents",)),
    "birth_city": (("birthplace",), ("place of birth",), ("born", "city"), ("birth", "city"), ("hometown",)),
    "death_city": (("place of death",), ("died", "city"), ("death", "city"), ("dies", "city")),
    "birth_year": (("year of birth",), ("born", "year"), ("birth", "year"), ("birthyear",)),
    "death_year": (("year of death",), ("died", "year"), ("death", "year"), ("dies", "year")),
    "birth_country": (("country of birth",), ("born", "country"), ("birth", "country")),
    "death_country": (("country of death",), ("died", "country"), ("death", "country"), ("dies", "country")),
    "nationality": (("nationality",), ("nationalities",), ("citizenship",), ("citizen",)),
    "landmark_city": (("landmark",), ("landmarks",), ("stands",), ("located",), ("location",)),
    "book_author": (("author",), ("authors",), ("wrote",), ("writer",), ("written",)),
    "invention_inventor": (("inventor",), ("inventors",), ("invented",), ("inventing",), ("invention",)),
    "painting_museum": (("museum",), ("museums",), ("gallery",), ("displayed",), ("exhibited",)),
    "painting_painter": (("painter",), ("painters",), ("painted",), ("artist",)),
    "company_headquarters": (("headquarters",), ("headquartered",), ("head office",), ("based",)),
    "river_mouth": (("flows",), ("flow",), ("mouth",), ("empties",), ("drains",)),
    "mountain_country": (("mountain",), ("mountains",), ("peak",)),
    "composition_composer": (("composer",), ("composers",), ("composed",), ("wrote", "music")),
}


@dataclass(frozen=True)
class Fact:
    subject: str
    answer: str
    aliases: tuple[str, ...] = ()

    @property
    def forms(self) -> tuple[str, ...]:
        return (self.answer, *self.aliases)

    # Normalised forms, computed once: the builder compares every fact with every query.
    @cached_property
    def subject_key(self) -> str:
        return key(self.subject)

    @cached_property
    def answer_key(self) -> str:
        return key(self.answer)

    @cached_property
    def form_keys(self) -> frozenset[str]:
        return frozenset(key(x) for x in self.forms)

    @cached_property
    def form_patterns(self) -> tuple[str, ...]:
        return tuple(f" {normalize(x)} " for x in self.forms if normalize(x))

    @cached_property
    def subject_words(self) -> str:
        return f" {normalize(self.subject)} "

    @cached_property
    def line_words(self) -> str:
        return f" {normalize(pair_line(self.subject, self.answer))} "


@dataclass(frozen=True)
class Relation:
    name: str
    description: str
    facts: tuple[Fact, ...]

    @property
    def keywords(self) -> tuple[tuple[str, ...], ...]:
        return KEYWORDS[self.name]


def key(text: str) -> str:
    """The form subjects and answers are compared in (``common.same_answer``'s normalisation)."""
    return normalize(text, drop_articles=True)


@lru_cache(maxsize=1)
def load_relations() -> tuple[Relation, ...]:
    """Every relation of the fact tables, sorted by name; facts sorted by subject."""
    countries = tables.countries()
    country_aliases = {c["name"]: tuple(c["aliases"]) for c in countries}
    out = []
    for name, (field, alias_field, description) in COUNTRY_RELATIONS.items():
        facts = [Fact(c["name"], c[field], tuple(c[alias_field]) if alias_field else ()) for c in countries]
        out.append(Relation(name, description, tuple(facts)))
    for name, (field, description) in PERSON_RELATIONS.items():
        facts = [
            Fact(p["name"], str(p[field]), country_aliases.get(p[field], ()) if field.endswith("_country") else ())
            for p in tables.people() if p[field] is not None
        ]
        out.append(Relation(name, description, tuple(facts)))
    for rel in tables.relations():
        facts = [Fact(f["subject"], f["answer"], tuple(f.get("answer_aliases", []))) for f in rel["facts"]]
        out.append(Relation(rel["relation"], rel["description"], tuple(facts)))
    missing = [r.name for r in out if r.name not in KEYWORDS]
    if missing:
        raise ValueError(f"dataset_builders/relations.py: no KEYWORDS for relation(s) {', '.join(missing)}; add them")
    return tuple(sorted((Relation(r.name, r.description, tuple(sorted(r.facts, key=lambda f: f.subject)))
                         for r in out), key=lambda r: r.name))


@lru_cache(maxsize=1)
def relations_by_name() -> dict[str, Relation]:
    return {r.name: r for r in load_relations()}


@lru_cache(maxsize=1)
def _index() -> dict[str, dict[str, frozenset[str]]]:
    """relation -> subject key -> the keys of the subject's answer forms."""
    return {r.name: {key(f.subject): frozenset(key(x) for x in f.forms) for f in r.facts} for r in load_relations()}


@lru_cache(maxsize=1)
def vocabulary() -> dict[str, frozenset[str]]:
    """relation -> the keys of every answer form it gives."""
    return {r.name: frozenset(key(x) for f in r.facts for x in f.forms) for r in load_relations()}


@lru_cache(maxsize=1)
def _truth() -> dict[str, dict[str, str]]:
    """relation -> subject key -> the key of the subject's (main) answer."""
    return {r.name: {key(f.subject): key(f.answer) for f in r.facts} for r in load_relations()}


def true_answer(relation: str, subject: str) -> str | None:
    """The key of ``relation``'s answer for ``subject`` (None when it has no such subject)."""
    return _truth()[relation].get(key(subject))


@lru_cache(maxsize=1)
def _answer_forms() -> dict[str, dict[str, frozenset[str]]]:
    """relation -> answer key -> the keys of every form that answer takes in the relation."""
    out: dict[str, dict[str, set[str]]] = {}
    for r in load_relations():
        for f in r.facts:
            out.setdefault(r.name, {}).setdefault(f.answer_key, set()).update(f.form_keys)
    return {r: {a: frozenset(forms) for a, forms in answers.items()} for r, answers in out.items()}


def answer_forms(relation: str, answer: str) -> frozenset[str]:
    """Every form (as keys) that ``answer`` takes in ``relation``; empty if it is none of its answers."""
    return _answer_forms()[relation].get(key(answer), frozenset())


def states(relation: str, subject: str, answer: str) -> bool:
    """True when ``relation`` maps ``subject`` to ``answer`` (or one of its aliases)."""
    return key(answer) in _index()[relation].get(key(subject), ())


def stating_relations(pairs: list[tuple[str, str]]) -> tuple[str, ...]:
    """Assumption 1: every relation of the tables that maps each pair's subject to its answer."""
    keyed = [(key(s), key(a)) for s, a in pairs]
    return tuple(r for r, answers in _index().items() if all(a in answers.get(s, ()) for s, a in keyed))


def typed_relations(pairs: list[tuple[str, str]]) -> tuple[str, ...]:
    """Relations that have every pair's subject and every pair's answer among their answers.

    The conflicting variant's pairs are wrong on purpose; what identifies their relation is which
    subjects they are about and what kind of answer they give.
    """
    keyed = [(key(s), key(a)) for s, a in pairs]
    index, vocab = _index(), vocabulary()
    return tuple(r for r in index if all(s in index[r] and a in vocab[r] for s, a in keyed))


@lru_cache(maxsize=None)
def competitors(relation: str) -> tuple[str, ...]:
    """The other relations that share at least one subject with ``relation``."""
    index = _index()
    mine = index[relation].keys()
    return tuple(r for r in index if r != relation and not mine.isdisjoint(index[r]))


@lru_cache(maxsize=None)
def partners(relation: str) -> tuple[str, ...]:
    """Assumption 2's confusing relations: competitors that give the same answer for some subject."""
    index = _index()
    mine = index[relation]
    return tuple(
        r for r in competitors(relation)
        if any(s in index[r] and not mine[s].isdisjoint(index[r][s]) for s in mine)
    )


def agrees_with_partner(relation: str, fact: Fact) -> bool:
    """True when a confusing partner of ``relation`` also states the pair (subject, answer)."""
    return fact.answer_key in _agreeing()[relation].get(fact.subject_key, ())


def partner_accepted(relation: str, fact: Fact) -> bool:
    """True when a partner's answer for the subject would count as ``fact``'s answer (shares a form)."""
    return not fact.form_keys.isdisjoint(_agreeing()[relation].get(fact.subject_key, ()))


@lru_cache(maxsize=1)
def _agreeing() -> dict[str, dict[str, frozenset[str]]]:
    """relation -> subject key -> the answer forms its partners give for that subject."""
    index = _index()
    out: dict[str, dict[str, frozenset[str]]] = {}
    for relation in index:
        forms: dict[str, set[str]] = {}
        for partner in partners(relation):
            for subject, answers in index[partner].items():
                forms.setdefault(subject, set()).update(answers)
        out[relation] = {s: frozenset(f) for s, f in forms.items()}
    return out


# Other true answers than a fact's own: what a query accepts besides its answer (both IC-recall datasets).

def containers(body: str, within: dict[str, list[str]]) -> list[str]:
    """The water bodies that contain ``body``, directly or through another one (``within`` map)."""
    by_key = {key(k): v for k, v in within.items()}
    out: list[str] = []
    todo = list(by_key.get(key(body), []))
    while todo:
        outer = todo.pop(0)
        if outer not in out:
            out.append(outer)
            todo += by_key.get(key(outer), [])
    return out


def other_truths(people: tuple[dict, ...], countries: tuple[dict, ...],
                 relations: tuple[dict, ...]) -> dict[str, dict[str, list[str]]]:
    """relation -> subject key -> the true answers besides the fact's own answer and aliases, as
    written in the tables (fields read with defaults: they may be absent)."""
    out: dict[str, dict[str, list[str]]] = {}
    for person in people:
        out.setdefault("nationality", {})[key(person["name"])] = list(person.get("nationality_aliases", []))
    for country in countries:
        out.setdefault("country_language", {})[key(country["name"])] = list(country.get("other_languages", []))
    for relation in relations:
        within = relation.get("within", {})
        out.setdefault(relation["relation"], {}).update(
            {key(f["subject"]): containers(f["answer"], within) for f in relation["facts"]})
    return out


@lru_cache(maxsize=1)
def _other_truths() -> dict[str, dict[str, list[str]]]:
    return other_truths(tables.people(), tables.countries(), tables.relations())


def extra_answers(relation: str, subject: str) -> list[str]:
    """The other true answers of ``subject`` in ``relation`` (nationality aliases, other official
    languages, containing water bodies), as written in the tables."""
    return _other_truths().get(relation, {}).get(key(subject), [])


def names_relation(text: str, relation: str) -> bool:
    """``relation_acc``: ``text`` names ``relation`` and none of the relations sharing its subjects."""
    def named(name: str) -> bool:
        return any(all(contains_any(text, [phrase]) for phrase in alt) for alt in KEYWORDS[name])

    return named(relation) and not any(named(other) for other in competitors(relation))


# Rendering and parsing: one "Subject: answer" line per pair; the query line is "Subject:".

def pair_line(subject: str, answer: str) -> str:
    return f"{capitalize_first(subject)}{SEPARATOR}{answer}"


def context_text(pairs: list[tuple[str, str]]) -> str:
    return "\n".join(pair_line(s, a) for s, a in pairs)


def question_text(subject: str) -> str:
    return capitalize_first(subject) + SEPARATOR.rstrip()


def parse_pairs(context: str) -> list[tuple[str, str]] | None:
    """The pairs of a rendered context, or None when a line is not "subject: answer"."""
    pairs = []
    for line in context.split("\n"):
        subject, sep, answer = line.partition(SEPARATOR)
        if not sep or not subject.strip() or not answer.strip():
            return None
        pairs.append((subject, answer))
    return pairs


def pair_count(context: str) -> int:
    """k of an item: the number of in-context pair lines."""
    return context.count("\n") + 1
