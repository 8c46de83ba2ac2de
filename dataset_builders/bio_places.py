"""A country as it was named at a date: a CF_Bio passage never has a person born in a state before it existed
("born in Karachi, in Pakistan, in 1930") or after its name went out of use.

``country_years`` in ``data/people.json`` gives the first and last year of each such name; every other country
of the table is a long-used name of the land (Germany, Italy, India) and fits every year.
"""

from __future__ import annotations

from collections.abc import Callable

from cf_tasks.text import contains

from . import bio_plausible, tables
from .common import country_in_text
from .schema import Item


def country_existed(country: str | None, year: int) -> bool:
    """The place's country bore the name ``country`` in ``year`` (a missing country fits every year)."""
    first, last = tables.people_meta().get("country_years", {}).get(country, (None, None))
    return (first is None or first <= year) and (last is None or year <= last)


def country_out_of_time(items: list[Item]) -> list[str]:
    """Birth-year items whose passage names the birth country while the counterfactual year lies outside the
    years that country bore its name."""
    return [i.id for i, p in bio_plausible.by_relation(items, "birth_year")
            if contains(i.context, country_in_text(p["birth_country"]))
            and not country_existed(p["birth_country"], int(i.counterfactual_answer))]


RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "bio_country_out_of_time": (
        "a counterfactual birth year lies within the years in which the named birth country bore its name "
        "(country_years: no birth in Pakistan before 1947)", country_out_of_time),
}
