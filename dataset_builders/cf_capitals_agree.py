"""CF_Capitals_Agree: the agreeing twin of ``cf_capitals`` (issue 15, item 4).

The same countries, ids and questions with the same passages, except that the capital sentence
names the true capital ("The capital of France is Paris."): context and memory agree, a control
for reading. ``counterfactual_answer`` keeps the city the twin replaced; it is left nowhere in the
passage.
"""

from __future__ import annotations

from . import cf_capitals
from .common import agree_twin
from .schema import Item

NAME = "cf_capitals_agree"
VERSION = 1
TWIN_OF = cf_capitals.NAME
EXTRA_RULES = cf_capitals.AGREE_RULES


def build(seed: int) -> list[Item]:
    pairs = cf_capitals.build_pairs(cf_capitals.NAME, cf_capitals.VERSION, seed, former=False)
    return [agree_twin(item, sentences, NAME, VERSION) for item, sentences in pairs]
