"""CF_World_Facts_Former: the world-facts items whose context names the true answer as the former
or mistaken value ("Cupertino" in "moved its headquarters from Cupertino to Seattle").

Built by ``cf_world_facts.build_items`` (same facts, candidates and rules), one item per fact; kept
apart so that ``cf_world_facts`` measures one thing: items that never name the true answer.
"""

from __future__ import annotations

from . import cf_world_facts
from .schema import Item

NAME = "cf_world_facts_former"
VERSION = 6
EXTRA_RULES = cf_world_facts.EXTRA_RULES


def build(seed: int) -> list[Item]:
    return cf_world_facts.build_items(NAME, VERSION, seed, former=True)
