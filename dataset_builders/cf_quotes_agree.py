"""CF_Quotes_Agree: the agreeing twin of ``cf_quotes`` (issue 15, item 4).

The same sayings, ids and prompts; the instruction asks for the saying's own last word
('Write a quote that ends in the word "fonder": Absence makes the heart grow'), so the instruction
and the memorised saying agree. ``counterfactual_answer`` keeps the word the twin replaced.
"""

from __future__ import annotations

from . import cf_quotes
from .common import agree_twin
from .schema import Item

NAME = "cf_quotes_agree"
VERSION = 1
TWIN_OF = cf_quotes.NAME
EXTRA_RULES = cf_quotes.AGREE_RULES


def build(seed: int) -> list[Item]:
    return [agree_twin(item, sentences, NAME, VERSION) for item, sentences in cf_quotes.build_pairs(seed)]
