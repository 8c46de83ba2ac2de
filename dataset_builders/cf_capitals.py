"""CF_Capitals: "What is the capital of X?" against a context naming another city of X.

The subset of the paper's section 4.1 (e.g. Lyon instead of Paris). One item per country of
``data/countries.json``; the counterfactual capital is another major city of the same country,
or, for city-states without one, a major city of another country on the same continent.
Countries whose name contains their capital (Singapore, Monaco, ...) cannot be asked about without
the context giving the answer away, and are left out (see ``excluded_countries``).
"""

from __future__ import annotations

from cf_tasks.text import contains_any

from . import tables
from .cf_world_facts import build_passage_items
from .common import make_rng

NAME = "cf_capitals"
VERSION = 1

# Passage templates in the shape of a relations.json entry.
TEMPLATES = {
    "relation": "country_capital",
    "question": "What is the capital of {subject}?",
    "answer_sentences": [
        "The capital of {subject} is {answer}.",
        "{Answer} has been the capital of {subject} for many decades.",
        "{Answer} serves as the capital and seat of government of {subject}.",
        "The government of {subject} sits in {answer}, the national capital.",
    ],
    "former_sentences": [
        "{Subject} moved its capital from {parametric} to {answer} after a long political debate.",
        "Although many people still think of {parametric}, the capital of {subject} is now {answer}.",
    ],
    "reason_sentences": [
        "The choice was made to bring the government closer to the country's main trade routes.",
        "Planners argued that a more central capital would serve the whole population better.",
        "The parliament building and most ministries were built there in the twentieth century.",
        "Foreign embassies followed the government within a few years.",
    ],
    "filler_sentences": [
        "{Subject} lies in {continent}.",
        "The official language of {subject} is {language}.",
        "The currency of {subject} is the {currency}.",
        "{Subject} is a sovereign state with its own flag and anthem.",
        "Visitors to {subject} often remark on the variety of its regional food.",
    ],
}


def excluded_countries() -> list[str]:
    """Countries whose own name gives away the capital (Singapore: Singapore)."""
    return [c["name"] for c in tables.countries() if _gives_away(c)]


def _gives_away(country: dict) -> bool:
    return contains_any(country["name"], [country["capital"], *country["capital_aliases"]])


def build(seed: int) -> list:
    rng = make_rng(NAME, VERSION, seed)
    countries = sorted(tables.countries(), key=lambda c: c["id"])
    facts = []
    for country in countries:
        if _gives_away(country):
            continue
        if country.get("other_city"):
            pool = [(country["other_city"], list(country.get("other_city_aliases", [])))]
        else:
            pool = [
                (c["other_city"], list(c.get("other_city_aliases", [])))
                for c in countries
                if c["continent"] == country["continent"] and c.get("other_city") and c is not country
            ]
        facts.append(
            {
                "subject": country["name"],
                "answer": country["capital"],
                "answer_aliases": list(country["capital_aliases"]),
                "cf_pool": pool,
                "values": {k: country[k] for k in ("continent", "language", "currency")},
            }
        )
    return build_passage_items(NAME, VERSION, TEMPLATES, facts, seed, rng, 1, 0.0)
