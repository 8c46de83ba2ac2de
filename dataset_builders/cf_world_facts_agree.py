"""CF_World_Facts_Agree: the agreeing twin of ``cf_world_facts`` (issue 15, item 4).

The same items (ids, questions, answers) with the same passages, except that the answer sentence
states the true answer ("The Eiffel Tower stands in the heart of Paris."): context and memory
agree. A model that reads well answers these; a fall in ``cf_world_facts``'s counterfactual_acc
while ``agree_acc`` here holds is a preference for memory, a fall in both a loss of reading.
``counterfactual_answer`` keeps the value the twin replaced; no form of it is left in the passage.
"""

from __future__ import annotations

from . import cf_world_facts
from .common import agree_twin
from .schema import Item

NAME = "cf_world_facts_agree"
VERSION = 1
TWIN_OF = cf_world_facts.NAME
EXTRA_RULES = cf_world_facts.AGREE_RULES


def build(seed: int) -> list[Item]:
    pairs = cf_world_facts.build_pairs(cf_world_facts.NAME, cf_world_facts.VERSION, seed, former=False)
    return [agree_twin(item, sentences, NAME, VERSION) for item, sentences in pairs]
