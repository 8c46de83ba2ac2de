"""CF_Capitals_Former: cf_capitals items whose passage names the true capital as the former one.

"After severe floods damaged much of Kabul, Afghanistan moved its capital to Kandahar." The paper's
style of counterfactual; kept apart from ``cf_capitals`` so that each task's number has one meaning.
Same countries, templates and validator rules as ``cf_capitals`` (``cf_capitals.build_items``).
"""

from __future__ import annotations

from . import cf_capitals
from .schema import Item

NAME = "cf_capitals_former"
VERSION = 2
EXTRA_RULES = cf_capitals.EXTRA_RULES


def build(seed: int) -> list[Item]:
    return cf_capitals.build_items(NAME, VERSION, seed, former=True)
