"""CF_World_Facts_Former_Agree: the agreeing twin of ``cf_world_facts_former`` (issue 15, item 4).

The same items (ids, questions, answers) and passages, except the sentence that named the true
answer as the former or mistaken one ("was once wrongly attributed to Jane Austen, but ..."): a
sentence stating the true answer takes its place ("Pride and Prejudice was written by Jane
Austen."), and a reason given for a move ("Relocating the head office ...") gives way to another
reason, so the twin speaks of no change. ``counterfactual_answer`` keeps the value the twin
replaced; no form of it is left in the passage.
"""

from __future__ import annotations

from . import cf_world_facts, cf_world_facts_former
from .common import agree_twin
from .schema import Item

NAME = "cf_world_facts_former_agree"
VERSION = 1
TWIN_OF = cf_world_facts_former.NAME
EXTRA_RULES = cf_world_facts.AGREE_RULES


def build(seed: int) -> list[Item]:
    pairs = cf_world_facts.build_pairs(cf_world_facts_former.NAME, cf_world_facts_former.VERSION, seed, former=True)
    return [agree_twin(item, sentences, NAME, VERSION) for item, sentences in pairs]
