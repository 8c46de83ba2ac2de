"""IC-recall: in-context factual recall (the second source paper, seeds/002: Huang, Nichani, Lee, Ge).

A prompt lists k (subject, answer) pairs of one hidden relation, one per line, then a query
subject ("France: Paris / Japan: Tokyo / Kenya:"). The model must infer the relation from the
pairs and recall the query's answer from memory: the context never contains it.

This module holds what the IC-recall datasets share:

* the relation loader: every relation of the fact tables (``countries.json``, ``people.json``,
  ``relations.json``) as a ``Relation`` of (subject, answer, aliases) facts, with a description
  and the keywords that count as naming it (for the chain-of-thought task's ``relation_acc``);
* the paper's Assumption 1, checked on the rendered text: ``stating_relations`` lists every
  relation of the tables that states all the in-context pairs; an item is valid only when that is
  its own relation alone;
* Assumption 2 (confusing relations): relations that share subjects and agree on some of them
  (capital / largest city, birthplace / place of death) are "partners"; prompts of such relations
  mix agreeing pairs with pairs that tell the partners apart, and the query is one on which the
  partners disagree, so guessing the partner gives a wrong answer;
* the ``ic_recall`` builder. ``ic_recall_cf.py`` builds the conflicting variant.

Items use the shared ``Item`` schema so that the validator, ``cf-tasks build``, the Parquet files
and the Hub export treat them like every other dataset. The fields mean: ``context`` the k pair
lines, ``question`` the query line, ``subject`` the query subject, ``parametric_answer`` the
query's true answer. In ``ic_recall`` nothing conflicts with it, so ``counterfactual_answer``
holds the answer of the last in-context pair: the answer a model that copies from the context
instead of recalling would give (the lm-eval hooks report it as ``copy_rate``). k is not a field
of the schema; it is the number of pair lines, ``pair_count(context)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import islice

from cf_tasks.text import contains_any, normalize

from . import tables
from .common import make_rng, slug
from .schema import Item, capitalize_first

NAME = "ic_recall"
VERSION = 2
K_VALUES = (2, 4, 8)
QUERIES_PER_RELATION = 8  # the same queries for every k, so that k is the only thing that changes
SEPARATOR = ": "
MAX_ATTEMPTS = 200

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
        raise ValueError(f"dataset_builders/ic_recall.py: no KEYWORDS for relation(s) {', '.join(missing)}; add them")
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


# Generation.

def eligible_facts(relation: Relation) -> list[Fact]:
    """Facts whose subject does not give its own answer away (Singapore: Singapore)."""
    return [f for f in relation.facts if not contains_any(f.subject, f.forms)]


def leaks(fact: Fact, query: Fact) -> bool:
    """True when a pair about ``fact`` would show the query's answer (as its answer or in its line).

    The same tests as ``common.same_answer`` and ``cf_tasks.text.contains``, on cached forms.
    """
    return (
        fact.subject_key == query.subject_key
        or not fact.form_keys.isdisjoint(query.form_keys)
        or any(pattern in fact.line_words for pattern in query.form_patterns)
    )


def enough_pairs(facts: list[Fact], query: Fact, n: int) -> bool:
    """True when at least ``n`` facts can sit in a prompt about ``query``."""
    count = 0
    for fact in facts:
        count += not leaks(fact, query)
        if count >= n:
            return True
    return False


def choose_queries(relation: Relation, facts: list[Fact], n: int, rng: random.Random,
                   usable: Callable[[Fact], bool] = lambda f: True) -> list[Fact]:
    """``n`` usable query facts at random; for relations with confusing partners, facts on which
    every partner gives another answer come first, so that guessing the partner is wrong."""
    telling = [f for f in facts if not partner_accepted(relation.name, f)]
    rest = [f for f in facts if partner_accepted(relation.name, f)]
    order = rng.sample(telling, len(telling)) + rng.sample(rest, len(rest))
    return list(islice((f for f in order if usable(f)), n))


@dataclass(frozen=True)
class Pools:
    """The facts that may sit in a prompt about one query, split by Assumption 2."""

    confusing: list[Fact]  # a partner relation gives the same answer for the subject
    telling: list[Fact]  # no partner does: such a pair rules the partners out

    @classmethod
    def for_query(cls, relation: Relation, facts: list[Fact], query: Fact) -> Pools:
        pool = [f for f in facts if not leaks(f, query)]
        return cls([f for f in pool if agrees_with_partner(relation.name, f)],
                   [f for f in pool if not agrees_with_partner(relation.name, f)])


def draw_pairs(pools: Pools, k: int, rng: random.Random) -> list[Fact]:
    """k true pairs; where the relation has confusing partners, up to k/2 of them are pairs a
    partner agrees with (Assumption 2) and the others tell the relations apart (Assumption 1)."""
    n_confusing = min(k // 2, len(pools.confusing))
    chosen = rng.sample(pools.confusing, n_confusing) + rng.sample(pools.telling, k - n_confusing)
    rng.shuffle(chosen)
    return chosen


def build(seed: int) -> list[Item]:
    rng = make_rng(NAME, VERSION, seed)
    plans = []
    for relation in load_relations():
        facts = eligible_facts(relation)
        queries = choose_queries(relation, facts, QUERIES_PER_RELATION, rng,
                                 usable=lambda q, facts=facts: enough_pairs(facts, q, max(K_VALUES) + 1))
        plans.append((relation, [(q, Pools.for_query(relation, facts, q)) for q in queries]))
    items = []
    # Relations interleaved, so that any --limit prefix covers them evenly and the same queries.
    for k in K_VALUES:
        for i in range(QUERIES_PER_RELATION):
            for relation, queries in plans:
                if i < len(queries):
                    items.append(_item(relation, *queries[i], k, seed, rng))
    return items


def _item(relation: Relation, query: Fact, pools: Pools, k: int, seed: int, rng: random.Random) -> Item:
    for _ in range(MAX_ATTEMPTS):
        pairs = draw_pairs(pools, k, rng)
        if stating_relations([(f.subject, f.answer) for f in pairs]) == (relation.name,):
            break
    else:
        raise ValueError(f"{NAME}: no unambiguous k={k} prompt for {relation.name} / {query.subject}")
    last = pairs[-1]
    return Item(
        id=f"{NAME}-k{k}-{relation.name}-{slug(query.subject)}",
        dataset=NAME,
        relation=relation.name,
        subject=query.subject,
        context=context_text([(f.subject, f.answer) for f in pairs]),
        question=question_text(query.subject),
        counterfactual_answer=last.answer,
        counterfactual_aliases=list(last.aliases),
        parametric_answer=query.answer,
        parametric_aliases=list(query.aliases),
        answer_position="end",
        version=VERSION,
        seed=seed,
    )


# Validator rules for the IC-recall datasets (run by validate.failures through EXTRA_RULES).

def _layout(items: list[Item]) -> list[str]:
    bad = []
    for item in items:
        pairs = parse_pairs(item.context)
        subjects = [key(s) for s, _ in pairs or []]
        if (pairs is None or len(pairs) not in K_VALUES or len(set(subjects)) != len(subjects)
                or key(item.subject) in subjects or item.question != question_text(item.subject)):
            bad.append(item.id)
    return bad


def _query_fact(items: list[Item]) -> list[str]:
    return [i.id for i in items if i.relation not in _index() or not states(i.relation, i.subject, i.parametric_answer)]


def _identifies_relation(items: list[Item]) -> list[str]:
    return [i.id for i in items if stating_relations(parse_pairs(i.context) or []) != (i.relation,)]


LAYOUT_RULE = (f"the context is k in {K_VALUES} distinct 'subject: answer' lines and the question is "
               "'<query subject>:' about another subject", _layout)
QUERY_RULE = ("the parametric answer is the item relation's answer for the query subject", _query_fact)

EXTRA_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "ic_layout": LAYOUT_RULE,
    "ic_query_fact": QUERY_RULE,
    "ic_unique_relation": (
        "Assumption 1: the item's relation is the only relation of the fact tables that states "
        "every in-context pair", _identifies_relation),
}
