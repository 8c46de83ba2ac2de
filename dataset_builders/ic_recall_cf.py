"""IC-recall with conflicting pairs: the in-context mapping is consistently wrong.

The prompt has the shape of ``ic_recall`` ("Spain: Asia / Japan: Africa / Italy: Asia /
France:"), but every pair shows a wrong answer of the relation, through one permutation of the
relation's answers (here Europe -> Asia, Asia -> Africa). A model can then either follow the
in-context mapping (France -> Asia, the ``counterfactual_answer``) or recall the truth (Europe,
the ``parametric_answer``), which links IC-recall back to context-parametric conflicts
(Goyal et al., "Context-Parametric Inversion") and lets the generation tasks'
``counterfactual_acc`` / ``parametric_acc`` apply.

For the mapping to say anything about the query, at least one pair shares the query's true
answer (a "witness": Spain and Italy above). The permutation sends the answers present in the
prompt to answers absent from it, so no pair shows a true answer of any prompt subject and the
truth never appears in the context. Relations where no answer is shared (capitals) have no
witness and are left out, as are relations whose answers share a kind with a relation about the
same subjects (birth and death city): for those the wrong pairs no longer identify the relation
(the rule ``ic_unique_relation``, in its typed form, proves it per item).

Version 2: a pair meant to be wrong must not be true in another form the tables know ("Arthur
Conan Doyle: Scottish" for a British writer, "The Seine: the Atlantic Ocean" for a river that
flows into the English Channel). ``true_forms`` gathers, per relation and subject, the answer,
its aliases and the other true answers the tables record: a person's ``nationality_aliases``
(people.json), a country's ``other_languages`` (countries.json) and the water bodies that contain
a river's mouth (the ``within`` map of a relation in relations.json). No prompt shows one of them
for its subject (rule ``ic_pair_true``) nor one that is true for the query anywhere in its lines;
the query's other true answers count as its parametric aliases.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import lru_cache

from cf_tasks.text import contains_any

from . import tables
from .common import make_rng, same_answer, slug
from .ic_recall import (
    K_VALUES, LAYOUT_RULE, MAX_ATTEMPTS, OTHER_TRUTHS_RULE, QUERY_RULE, RECENT_RULE, choose_queries, eligible_facts,
    enough_pairs, leaks,
)
from .relations import (  # noqa: F401 (containers, other_truths: read here by the tests)
    Fact, Relation, answer_forms, competitors, containers, context_text, extra_answers, key, load_relations,
    other_truths, parse_pairs, question_text, stating_relations, true_answer, typed_relations, vocabulary,
)
from .schema import Item, answer_position

NAME = "ic_recall_cf"
VERSION = 3
QUERIES_PER_RELATION = 8
# Answers "of the same kind" as a competitor's: at least this share of the relation's answers are
# also the competitor's (birth / death city: 21%). A stray overlap (the nationality "New Zealand"
# is also a birth country: 1 of 34) does not make a kind; ``ic_unique_relation`` still checks each item.
SAME_KIND_SHARE = 0.1


@lru_cache(maxsize=1)
def _fact_forms() -> dict[str, dict[str, frozenset[str]]]:
    """relation -> subject key -> the keys of the subject's answer and aliases."""
    return {r.name: {f.subject_key: f.form_keys for f in r.facts} for r in load_relations()}


def true_forms(relation: str, subject: str) -> frozenset[str]:
    """The keys of every answer that is true for ``subject`` in ``relation``."""
    extras = extra_answers(relation, subject)
    return _fact_forms()[relation].get(key(subject), frozenset()).union(
        *({key(a)} | answer_forms(relation, a) for a in extras))


def is_true(relation: str, subject: str, answer: str) -> bool:
    """True when ``answer``, in any of its forms, is a true answer of ``subject`` in ``relation``."""
    return not ({key(answer)} | answer_forms(relation, answer)).isdisjoint(true_forms(relation, subject))


def answer_classes(facts: list[Fact]) -> dict[str, Fact]:
    """Answer key -> the first fact (by subject) giving that answer: its display form and aliases."""
    out: dict[str, Fact] = {}
    for fact in facts:
        out.setdefault(fact.answer_key, fact)
    return out


def usable_relations() -> list[Relation]:
    """Relations with a shared answer (a witness is possible), enough answers to permute, and no
    relation about the same subjects whose answers are of the same kind."""
    out = []
    for relation in load_relations():
        facts = eligible_facts(relation)
        classes = answer_classes(facts)
        vocab = vocabulary()
        mine = vocab[relation.name]
        same_kind = any(len(mine & vocab[c]) >= SAME_KIND_SHARE * len(mine) for c in competitors(relation.name))
        if len(classes) < len(facts) and len(classes) >= 4 and not same_kind:
            out.append(relation)
    return out


def witnesses(by_answer: dict[str, list[Fact]], query: Fact) -> list[Fact]:
    """Other subjects with the query's true answer, whose line would not show that answer."""
    return [f for f in by_answer[query.answer_key] if f.subject_key != query.subject_key
            and not any(p in f.subject_words for p in query.form_patterns)]


def _draw(relation: str, classes: dict[str, Fact], sharing: list[Fact], others: list[Fact], query: Fact, k: int,
          rng: random.Random) -> list[tuple[Fact, Fact]] | None:
    """(pair fact, fact whose answer is shown) for the k pairs and then the query, or None when
    this draw does not work out. ``sharing``: the query's witnesses; ``others``: pairs with
    another answer that do not show the query's."""
    n_witness = rng.randint(1, max(1, min(len(sharing), k // 2)))
    # At most half the answers may be in the prompt: the others are where the permutation sends them.
    other_keys = sorted({f.answer_key for f in others})
    n_classes = min(k - n_witness, len(classes) // 2 - 1, len(other_keys))
    if k - n_witness and n_classes < 1:
        return None
    chosen_keys = set(rng.sample(other_keys, n_classes))
    candidates = [f for f in others if f.answer_key in chosen_keys]
    if len(candidates) < k - n_witness:
        return None
    pairs = rng.sample(sharing, n_witness) + rng.sample(candidates, k - n_witness)
    rng.shuffle(pairs)
    present = sorted({query.answer_key, *(f.answer_key for f in pairs)})
    taken = frozenset().union(*(answer_forms(relation, c) for c in present))
    absent = [c for c in sorted(classes) if answer_forms(relation, c).isdisjoint(taken)]
    if len(absent) < len(present):
        return None
    targets = rng.sample(absent, len(present))
    mapping = dict(zip(present, targets))
    shown = [(f, classes[mapping[f.answer_key]]) for f in pairs]
    return shown + [(query, classes[mapping[query.answer_key]])]


def build(seed: int) -> list[Item]:
    rng = make_rng(NAME, VERSION, seed)
    plans = [(relation, *_plan(relation, rng)) for relation in usable_relations()]
    items = []
    # Relations interleaved, so that any --limit prefix covers them evenly and the same queries.
    for k in K_VALUES:
        for i in range(QUERIES_PER_RELATION):
            for relation, classes, queries in plans:
                if i < len(queries):
                    items.append(_item(relation, classes, *queries[i], k, seed, rng))
    return items


def _plan(relation: Relation, rng: random.Random) -> tuple[dict[str, Fact], list[tuple[Fact, list[Fact], list[Fact]]]]:
    """The relation's answer classes, and its queries, each with its witnesses and other usable pairs."""
    facts = eligible_facts(relation)
    by_answer: dict[str, list[Fact]] = {}
    for fact in facts:
        by_answer.setdefault(fact.answer_key, []).append(fact)

    def usable(q: Fact) -> bool:
        return bool(witnesses(by_answer, q)) and enough_pairs(facts, q, max(K_VALUES))

    queries = choose_queries(relation, facts, QUERIES_PER_RELATION, rng, usable=usable)
    return answer_classes(facts), [(q, witnesses(by_answer, q), [f for f in facts if not leaks(f, q)])
                                   for q in queries]


def _item(relation: Relation, classes: dict[str, Fact], query: Fact, sharing: list[Fact], others: list[Fact],
          k: int, seed: int, rng: random.Random) -> Item:
    query_truths = [*query.forms, *extra_answers(relation.name, query.subject)]
    for _ in range(MAX_ATTEMPTS):
        drawn = _draw(relation.name, classes, sharing, others, query, k, rng)
        if drawn is None:
            continue
        *shown, (_, in_context) = drawn
        pairs = [(f.subject, c.answer) for f, c in shown]
        if (typed_relations(pairs) == (relation.name,) and not stating_relations(pairs)
                and not contains_any(context_text(pairs), query_truths)
                and not any(is_true(relation.name, f.subject, c.answer) for f, c in drawn)):
            break
    else:
        raise ValueError(f"{NAME}: no usable k={k} prompt for {relation.name} / {query.subject}")
    return Item(
        id=f"{NAME}-k{k}-{relation.name}-{slug(query.subject)}",
        dataset=NAME,
        relation=relation.name,
        subject=query.subject,
        context=context_text(pairs),
        question=question_text(query.subject),
        counterfactual_answer=in_context.answer,
        counterfactual_aliases=list(in_context.aliases),
        parametric_answer=query.answer,
        parametric_aliases=[*query.aliases, *extra_answers(relation.name, query.subject)],
        answer_position=answer_position([a for _, a in pairs], in_context.answer),
        version=VERSION,
        seed=seed,
    )


# Validator rules (run by validate.failures through EXTRA_RULES).

def _consistently_wrong(items: list[Item]) -> list[str]:
    bad = []
    for item in items:
        pairs = parse_pairs(item.context) or []
        truth = [true_answer(item.relation, s) for s, _ in pairs]
        mapping = {(t, key(a)) for t, (_, a) in zip(truth, pairs)}
        sources = {t for t, _ in mapping}
        targets = {a for _, a in mapping}
        source_forms = frozenset().union(*(answer_forms(item.relation, t) for t in sources if t))
        if (None in truth or len(sources) != len(mapping) or len(targets) != len(mapping)
                or any(not answer_forms(item.relation, a) for a in targets)
                or any(not answer_forms(item.relation, a).isdisjoint(source_forms) for a in targets)):
            bad.append(item.id)
    return bad


def _mapping_covers_query(items: list[Item]) -> list[str]:
    bad = []
    for item in items:
        pairs = parse_pairs(item.context) or []
        truth = true_answer(item.relation, item.subject)
        shown = [a for s, a in pairs if true_answer(item.relation, s) == truth]
        if not shown or not same_answer(shown[0], item.counterfactual_answer):
            bad.append(item.id)
    return bad


def _identifies_relation(items: list[Item]) -> list[str]:
    bad = []
    for item in items:
        pairs = parse_pairs(item.context) or []
        if typed_relations(pairs) != (item.relation,) or stating_relations(pairs):
            bad.append(item.id)
    return bad


def _pair_true(items: list[Item]) -> list[str]:
    """A pair meant to be wrong, or the query with its counterfactual, that is true in some form."""
    return [item.id for item in items
            if any(is_true(item.relation, s, a) for s, a in
                   [*(parse_pairs(item.context) or []), (item.subject, item.counterfactual_answer)])]


EXTRA_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "ic_layout": LAYOUT_RULE,
    "ic_other_truths_accepted": OTHER_TRUTHS_RULE,
    "ic_query_fact": QUERY_RULE,
    "ic_recent_fact": RECENT_RULE,
    "ic_unique_relation": (
        "Assumption 1 (typed): the item's relation is the only relation of the fact tables with every "
        "pair's subject and answer, and no relation states the pairs", _identifies_relation),
    "ic_consistently_wrong": (
        "every pair shows a wrong answer through one permutation of the relation's answers that sends "
        "the prompt's true answers to answers absent from it", _consistently_wrong),
    "ic_mapping_covers_query": (
        "a pair shares the query's true answer and shows the counterfactual answer", _mapping_covers_query),
    "ic_pair_true": (
        "no pair (nor the query with its counterfactual) shows an answer that is true for its subject: its "
        "answer or an alias, another nationality, official language or containing water body of the tables",
        _pair_true),
}
