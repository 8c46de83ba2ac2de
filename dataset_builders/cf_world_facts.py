"""CF_World_Facts: coherent counterfactual passages about world facts (paper section 3.2, item 2).

Each fact of ``data/relations.json`` gets passages of 3-6 sentences that state another answer of
the same relation with a plausible reason. The paper notes that generated counterfactual contexts
put the answer first too often, so the sentence carrying the answer is placed at the beginning,
middle or end in equal shares, and the position is recorded per item. A minority of items also
name the true answer as the former value ("moved from Paris to Rome"); they are flagged
``mentions_parametric``.
"""

from __future__ import annotations

import random

from cf_tasks.text import contains_any

from . import tables
from .common import POSITIONS, balanced, make_rng, passage_from_templates, same_answer, slug
from .schema import Item, fill

NAME = "cf_world_facts"
VERSION = 1
ITEMS_PER_FACT = 2
MENTIONS_PARAMETRIC_SHARE = 0.3


def counterfactual_choices(fact: dict, answers: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Other answers of the relation that differ from the true one and are not in the subject."""
    true_forms = [fact["answer"], *fact.get("answer_aliases", [])]
    return [
        (answer, aliases)
        for answer, aliases in answers
        if not any(same_answer(answer, t) for t in true_forms)
        and not contains_any(fact["subject"], [answer, *aliases])
    ]


def build_passage_items(
    dataset: str,
    version: int,
    templates: dict,
    facts: list[dict],
    seed: int,
    rng: random.Random,
    items_per_fact: int,
    mentions_share: float,
) -> list[Item]:
    """Items for the facts of one relation, with balanced answer positions.

    A fact may carry its own ``cf_pool`` of (answer, aliases) to draw the counterfactual from
    (default: the other answers of the relation) and extra template ``values``.
    """
    answers = sorted({(f["answer"], tuple(f.get("answer_aliases", []))) for f in facts})
    slots = [(fact, k) for fact in facts for k in range(items_per_fact)]
    positions = balanced(POSITIONS, len(slots), rng)
    n_mentions = round(mentions_share * len(slots))
    mentions = balanced([True] * n_mentions + [False] * (len(slots) - n_mentions), len(slots), rng)
    items = []
    for (fact, k), position, mention in zip(slots, positions, mentions):
        pool = fact.get("cf_pool") or [(a, list(al)) for a, al in answers]
        choices = counterfactual_choices(fact, pool)
        cf_answer, cf_aliases = choices[rng.randrange(len(choices))]
        parametric = [fact["answer"], *fact.get("answer_aliases", [])]
        values = {"subject": fact["subject"], "answer": cf_answer, "parametric": fact["answer"], **fact.get("values", {})}
        context, taken = passage_from_templates(
            templates, values, cf_answer, [] if mention else parametric, position, mention, rng
        )
        items.append(
            Item(
                id=f"{dataset}-{templates['relation']}-{slug(fact['subject'])}-{k}",
                dataset=dataset,
                relation=templates["relation"],
                subject=fact["subject"],
                context=context,
                question=fill(templates["question"], subject=fact["subject"]),
                counterfactual_answer=cf_answer,
                counterfactual_aliases=list(cf_aliases),
                parametric_answer=fact["answer"],
                parametric_aliases=list(fact.get("answer_aliases", [])),
                answer_position=taken,
                mentions_parametric=mention,
                version=version,
                seed=seed,
            )
        )
    return items


def build(seed: int) -> list[Item]:
    rng = make_rng(NAME, VERSION, seed)
    items: list[Item] = []
    for relation in sorted(tables.relations(), key=lambda r: r["relation"]):
        items += build_passage_items(
            NAME, VERSION, relation, relation["facts"], seed, rng, ITEMS_PER_FACT, MENTIONS_PARAMETRIC_SHARE
        )
    return items
