"""CF_Capitals_Former_Agree: the agreeing twin of ``cf_capitals_former`` (issue 15, item 4).

The same countries, ids, questions and neutral sentences; the sentence that stated a move from the
true capital to another city ("After severe floods damaged much of Kabul, Afghanistan moved its
capital to Kandahar.") gives way to one that names the true capital ("Kabul is the capital of
Afghanistan."), since with the true answer a move would be no move at all. ``counterfactual_answer``
keeps the city the twin replaced; it is left nowhere in the passage.
"""

from __future__ import annotations

from . import cf_capitals, cf_capitals_former
from .common import agree_twin
from .schema import Item

NAME = "cf_capitals_former_agree"
VERSION = 1
TWIN_OF = cf_capitals_former.NAME
EXTRA_RULES = cf_capitals.AGREE_RULES


def build(seed: int) -> list[Item]:
    pairs = cf_capitals.build_pairs(cf_capitals_former.NAME, cf_capitals_former.VERSION, seed, former=True)
    return [agree_twin(item, sentences, NAME, VERSION) for item, sentences in pairs]
