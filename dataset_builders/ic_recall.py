"""IC-recall: in-context factual recall (Huang, Nichani, Lee, Ge: "Fine-Tuning Dynamics of In-Context
Factual Recall in Transformers").

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
of the schema; it is the number of pair lines, ``pair_count(context)``. A query's other true answers
(another official language, a nationality alias, a sea that contains a river's mouth) count as its
parametric aliases, and no pair shows one (``widened``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice

from cf_tasks.text import contains_any

from . import tables
from .common import make_rng, slug
# The relation catalogue and the pair format live in ``relations``, shared with the lm-eval hooks;
# the names are read here too (``ic_recall.parse_pairs``), as before they moved.
from .relations import (  # noqa: F401
    COUNTRY_RELATIONS, KEYWORDS, PERSON_RELATIONS, SEPARATOR, Fact, Relation, agrees_with_partner, answer_forms,
    competitors, context_text, extra_answers, key, load_relations, names_relation, pair_count, pair_line, parse_pairs,
    partner_accepted, partners, question_text, relations_by_name, states, stating_relations, true_answer,
    typed_relations,
    vocabulary,
)
from .schema import Item

NAME = "ic_recall"
VERSION = 5
K_VALUES = (2, 4, 8)
QUERIES_PER_RELATION = 8  # the same queries for every k, so that k is the only thing that changes
MAX_ATTEMPTS = 200
RECENT_YEARS = 3  # a fact that changed this close to the tables' date is neither shown nor asked

# Generation.

def eligible_facts(relation: Relation) -> list[Fact]:
    """Facts whose subject does not give its own answer away (Singapore: Singapore) and that did not
    change lately (``recently_changed``)."""
    return [f for f in relation.facts if not contains_any(f.subject, f.forms)
            and not recently_changed(relation.name, f.subject)]


@lru_cache(maxsize=1)
def _changes() -> tuple[int, dict[tuple[str, str], int]]:
    """countries.json's ``as_of`` year and (relation, country key) -> the year its fact changed."""
    import json

    meta = json.loads((tables.DATA_DIR / "countries.json").read_text(encoding="utf-8"))
    fields = {field: name for name, (field, _, _) in COUNTRY_RELATIONS.items()}
    return meta["as_of"], {(fields[f], key(c["name"])): year for c in meta["countries"]
                           for f, year in c.get("changed", {}).items() if f in fields}


def recently_changed(relation: str, subject: str) -> bool:
    """The fact changed within ``RECENT_YEARS`` of the tables' date (Equatorial Guinea's capital, 2026):
    a model can hardly recall it, and an old answer is not a mistake of reading."""
    as_of, changed = _changes()
    return changed.get((relation, key(subject)), -10**6) >= as_of - RECENT_YEARS


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


def widened(relation: str, query: Fact) -> Fact:
    """The query with its other true answers as aliases (another official language, a nationality
    alias, a sea that contains a river's mouth): they count as recalled, and no pair shows them."""
    extra = [a for a in extra_answers(relation, query.subject) if a not in query.forms]
    return Fact(query.subject, query.answer, (*query.aliases, *extra)) if extra else query


def build(seed: int) -> list[Item]:
    rng = make_rng(NAME, VERSION, seed)
    plans = []
    for relation in load_relations():
        facts = eligible_facts(relation)
        queries = choose_queries(relation, facts, QUERIES_PER_RELATION, rng,
                                 usable=lambda q, facts=facts, r=relation.name: enough_pairs(facts, widened(r, q),
                                                                                          max(K_VALUES) + 1))
        queries = [widened(relation.name, q) for q in queries]
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
    return [i.id for i in items if i.relation not in relations_by_name()
            or not states(i.relation, i.subject, i.parametric_answer)]


def _recent_fact(items: list[Item]) -> list[str]:
    return [i.id for i in items if any(recently_changed(i.relation, s)
                                       for s in [i.subject, *(s for s, _ in parse_pairs(i.context) or [])])]


RECENT_RULE = (f"no pair and no query is a fact that changed within {RECENT_YEARS} years of the tables' date "
               "(countries.json changed)", _recent_fact)


def _identifies_relation(items: list[Item]) -> list[str]:
    return [i.id for i in items if stating_relations(parse_pairs(i.context) or []) != (i.relation,)]


LAYOUT_RULE = (f"the context is k in {K_VALUES} distinct 'subject: answer' lines and the question is "
               "'<query subject>:' about another subject", _layout)
QUERY_RULE = ("the parametric answer is the item relation's answer for the query subject", _query_fact)

def _other_truth_refused(items: list[Item]) -> list[str]:
    """A query accepts its other true answers (Switzerland: French as well as German)."""
    return [i.id for i in items if any(a not in i.parametric_aliases for a in extra_answers(i.relation, i.subject))]


OTHER_TRUTHS_RULE = ("a query accepts its other true answers: another official language, a nationality alias, "
                     "a sea that contains the mouth", _other_truth_refused)

EXTRA_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "ic_layout": LAYOUT_RULE,
    "ic_other_truths_accepted": OTHER_TRUTHS_RULE,
    "ic_query_fact": QUERY_RULE,
    "ic_recent_fact": RECENT_RULE,
    "ic_unique_relation": (
        "Assumption 1: the item's relation is the only relation of the fact tables that states "
        "every in-context pair", _identifies_relation),
}
