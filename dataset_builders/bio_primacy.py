"""Claims of primacy in CF_Bio passages: "best known for", "most famous for", "above all".

people.json lists a person's works best known first. A passage may leave that first work out (a
nationality item drops the works that tie the person to the real nationality, a name swap those that
carry a fragment of the real name); the work told first is then not what the person is best known for,
and a frame that claims it is ("Goya is best known for Saturn Devouring His Son") would be false of the
subject. Such a passage tells its first work with a frame that claims no primacy.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from cf_tasks.text import contains

from . import bio_plausible
from .schema import Item

# What says that a work is the person's main claim to fame.
PRIMACY = re.compile(
    r"\b(best known for|most famous for|rests largely on|fame comes from|above all|owes much of \S+ reputation to|"
    r"first and foremost|reputation is built on|won great renown for|became famous for|gained international fame for)\b",
    re.IGNORECASE)
# What says that the work made the name: false of most (Dvořák was famous for the Slavonic Dances long before the
# New World Symphony, Goya a court painter before The Third of May 1808), so never told.
ORIGIN = re.compile(r"\b(became famous for|gained international fame for)\b", re.IGNORECASE)
# First-work frames that claim no primacy, for a passage whose first listed work is left out.
NEUTRAL_WORK1 = (
    "{Who} {is} known for {work1}.",
    "{Who} {is} remembered for {work1}.",
    "{Who_poss} achievements include {work1}.",
    "{Who} {is} widely known for {work1}.",
)


def work1_frames(pool: tuple[str, ...], told: list[str], listed: list[str]) -> tuple[str, ...]:
    """The frames of ``pool`` that may tell ``told[0]``: all but those that say the work made the name when it
    is the person's first listed work, else only those that claim no primacy, and the neutral ones."""
    if told[:1] == listed[:1]:
        return tuple(t for t in pool if not ORIGIN.search(t))
    return tuple(dict.fromkeys([t for t in pool if not PRIMACY.search(t)] + list(NEUTRAL_WORK1)))


def primacy_claims(items: list[Item]) -> list[str]:
    """Items with a sentence that claims primacy for something other than the person's first listed work, or
    that says a work made the person's name."""
    people = bio_plausible.people_by_id()
    return [i.id for i in items if ORIGIN.search(i.context) or any(
        PRIMACY.search(s) and not contains(s, people[i.subject]["works"][0])
        for s in bio_plausible.sentences(i.context))]


RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "bio_primacy_claim": (
        "a sentence that claims primacy ('best known for', 'most famous for') names the person's first listed "
        "work, the one they are best known for; none says a work made the name ('became famous for')", primacy_claims),
}
