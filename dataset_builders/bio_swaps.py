"""CF_Bio's swaps that the dataset as a whole must not give away (Goyal et al., "Context-Parametric Inversion",
ICLR 2025, section 3.2: a counterfactual the passage never argues against).

* A counterfactual nationality is drawn evenly among every one that fits (``balanced_choice``): not every American
  made Canadian, a mapping a model could learn from the dataset itself. Besides the nationalities of the same
  region, those of the nationality's ``kin`` (``data/people.json``: the English-speaking nations, Spain and
  Spanish America, Portugal and Brazil) fit as well.
* A name-swap substitute shares the nationality the passage states (``substitute_nationality_fits``): no
  "Ernest Hemingway was an English novelist". A substitute of another nationality is told in a passage that
  states no nationality, no place and no national work.
* A nationality item, and a name swap of another nationality, leave out the person's sentences that tie them to
  their real country's institutions, money or land (``national`` in ``data/people_about.json``: a senator, a
  dollar coin, the desert), which not every nationality has.

``rules`` builds the validator rules (merged into cf_bio's); cf_bio passes in its nationality functions.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable
from functools import lru_cache

from cf_tasks.text import contains_any

from . import tables
from .schema import Item

SPREAD_MIN_ITEMS = 6  # a true nationality with fewer nationality items is too small to judge a spread
SPREAD_MAX_SHARE = 0.6  # the most items of one true nationality that one counterfactual nationality may take


@lru_cache(maxsize=1)
def _table() -> dict[str, dict]:
    return {n["adjective"]: n for n in tables.people_meta()["nationalities"]}


def kin(a: str, b: str) -> bool:
    """Two nationalities of different regions that share a language and names (``kin``, either way)."""
    table = _table()
    return b in table.get(a, {}).get("kin", []) or a in table.get(b, {}).get("kin", [])


def balanced_choice(true: str, choices: list[str], used: Counter, rng: random.Random) -> str:
    """One of ``choices``, the least used so far for the true nationality ``true`` (``used``, updated), the
    tie broken by ``rng``: each true nationality's items spread as evenly as their choices allow."""
    if len(choices) == 1:  # forced: it neither counts nor weighs on the items that have a choice
        return choices[0]
    fewest = min(used[true, c] for c in choices)
    choice = rng.choice([c for c in choices if used[true, c] == fewest])
    used[true, choice] += 1
    return choice


def substitute_nationality_fits(person: dict, sub: dict) -> bool:
    """The substitute is of the nationality the passage states (``nationality``), or of one inside it
    (``part_of``: an English substitute for a British person; not a British one for an English person)."""
    forms = {sub["nationality"], *sub["nationality_aliases"], *_table().get(sub["nationality"], {}).get("part_of", [])}
    return person["nationality"] in forms


def may_cross_nationality(person: dict, terms: list[str]) -> bool:
    """A substitute of another nationality may be told of the person only when no work ties the person to a
    nationality (``national_works``, or a work that names one of ``terms``): the passage then states none."""
    return not person.get("national_works") and not contains_any(" ".join(person["works"]), terms)


@lru_cache(maxsize=1)
def _national() -> dict[str, list[str]]:
    return {r["person"]: list(r.get("national", [])) for r in tables.load_table("people_about.json")}


def national_details(person: dict) -> list[str]:
    """Phrases of the person's documented sentences that only some nationalities fit ("a senator")."""
    return _national().get(person["id"], [])


def nationality_words() -> list[str]:
    """Every nationality adjective, noun and country of the table."""
    return sorted({w for n in _table().values() for w in (n["adjective"], *n["nouns"], *n["countries"])})


def rules(true_terms: Callable[[dict], list[str]], choices: Callable[[dict], list[str]]
          ) -> dict[str, tuple[str, Callable[[list[Item]], list[str]]]]:
    """The rules, given cf_bio's ``true_terms`` (what states a person's real nationality) and ``choices`` (the
    counterfactual nationalities that fit a person)."""
    people = {p["id"]: p for p in tables.people()}

    def one_way(items: list[Item]) -> list[str]:
        groups: dict[str, list[Item]] = defaultdict(list)
        for i in items:
            if i.relation == "nationality" and len(choices(people[i.subject])) > 1:  # a forced choice is no pattern
                groups[i.parametric_answer].append(i)
        bad = []
        for group in groups.values():
            fit = {c for i in group for c in choices(people[i.subject])}
            top = Counter(i.counterfactual_answer for i in group).most_common(1)[0][1]
            if len(group) >= SPREAD_MIN_ITEMS and len(fit) > 1 and top > SPREAD_MAX_SHARE * len(group):
                bad += [i.id for i in group]
        return bad

    def substitute_nationality(items: list[Item]) -> list[str]:
        by_name = {p["name"]: p for p in people.values()}
        bad = []
        for i in items:
            if i.relation != "person_name" or i.counterfactual_answer not in by_name:
                continue
            person = people[i.subject]
            states = [*true_terms(person), *person.get("national_works", []), *nationality_words(),
                      *national_details(person)]
            if not substitute_nationality_fits(person, by_name[i.counterfactual_answer]) and contains_any(i.context, states):
                bad.append(i.id)
        return bad

    def national_detail(items: list[Item]) -> list[str]:
        return [i.id for i in items if i.relation == "nationality"
                and contains_any(i.context, national_details(people[i.subject]))]

    return {
        "bio_national_detail": (
            "a nationality item tells none of the person's sentences that tie them to the real country's "
            "institutions, money or land (national: a senator, a dollar coin)", national_detail),
        "bio_nationality_one_way": (
            f"the items of one true nationality (at least {SPREAD_MIN_ITEMS}) that each more than one counterfactual "
            f"nationality fits never take one of them more than {SPREAD_MAX_SHARE:.0%} of the time", one_way),
        "bio_substitute_nationality": (
            "a name-swap substitute is of the nationality the passage states (or one inside it, part_of); one of "
            "another nationality only in a passage that states no nationality, place, national work or national "
            "detail",
            substitute_nationality),
    }
