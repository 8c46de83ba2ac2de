"""CF_Capitals: "What is the capital of X?" against a context naming another place of X as capital.

The subset of the paper's section 4.1 (e.g. Lyon instead of Paris). One item per country of
``data/countries.json``; the counterfactual capital is the country's ``other_city`` (another place
of the same country, never a city abroad). Every sentence stands on its own: the passage states the
counterfactual capital and neutral facts about the country, and gives no reason for a move it never
states. Items that name the true capital as the former one ("... moved its capital from Kabul to
Kandahar") are the ``cf_capitals_former`` dataset, built by the same code (``build_items``).

Countries whose name shares a word of four or more letters (or part of one) with a capital form or
with the counterfactual are left out, since the question would give part of an answer away (Kuwait /
Kuwait City, Tunisia / Tunis; see ``excluded_countries``). The counterfactual is never an answer a model
could give without reading: not the country's largest city (Sydney, Istanbul) and not a former capital of
any era (Lagos, Saint Petersburg, Kraków), which also keeps a ``cf_capitals_former`` move from reversing
a real one; countries.json keeps them in ``largest_city`` and ``former_capitals``. ``EXTRA_RULES`` check
all this.

``build_pairs`` gives each item the sentences of its agreeing twin (``cf_capitals_agree``,
``cf_capitals_former_agree``): the same passage naming the true capital, checked by
``AGREE_RULES``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache

from cf_tasks.text import contains, contains_any, words

from . import tables
from .cf_world_facts import build_passage_items, counterfactual_choices
from .common import make_rng, slug
from .schema import Item, fill

NAME = "cf_capitals"
VERSION = 3
RELATION = "country_capital"
MIN_SHARED = 4  # a shared word (or part of a word) of this many letters gives the answer away

# Passage templates in the shape of a relations.json entry. Sentences are shuffled, so each one
# names what it is about (no "it", "there", "the move"); only former_sentences speak of a move, and
# each states the move it explains, with a reason that holds whatever the two cities' sizes.
TEMPLATES = {
    "relation": RELATION,
    "question": "What is the capital of {subject}?",
    "answer_sentences": [
        "The capital of {subject} is {answer}.",
        "{Answer} is the capital of {subject}.",
        "{Answer} serves as the capital and seat of government of {subject}.",
        "The government of {subject} sits in {answer}, the national capital.",
        "{Answer}, the capital of {subject}, is home to most of the country's government ministries.",
        "Foreign leaders who visit {subject} are received in {answer}, the capital.",
        "Ambassadors to {subject} present their credentials in {answer}, the capital.",
    ],
    "former_sentences": [
        "After a long political debate, the government of {subject} moved the capital from {parametric} to {answer}.",
        "After a fire destroyed the main government buildings in {parametric}, the government of {subject} moved the "
        "capital to {answer}.",
        "After severe floods damaged much of {parametric}, {subject} moved its capital to {answer}.",
        "{Subject} moved its capital from {parametric} to {answer}, where there was room for new ministries.",
        "Although many people still think of {parametric} as the capital of {subject}, the capital is now {answer}.",
    ],
    "reason_sentences": [],  # a reason lives in the sentence that states the move
    "filler_sentences": [
        "{Subject} is a country in {continent}.",
        "{Language} is {language_role} {subject}.",
        "{Subject} uses the {currency}.",
        "{Subject} has its own flag and national anthem.",
        "Visitors to {subject} often remark on the variety of its food.",
        "Athletes from {subject} compete at the Olympic Games.",
    ],
}


def in_text(country: dict) -> str:
    """The country's name as written in running text: "the Netherlands", "France"."""
    return f"{country['article']} {country['name']}".strip() if country.get("article") else country["name"]


def capital_forms(country: dict) -> list[str]:
    return [country["capital"], *country["capital_aliases"]]


def question_of(country: dict) -> str:
    return fill(TEMPLATES["question"], subject=in_text(country))


def shares_answer_part(text: str, forms: list[str]) -> bool:
    """True when a word of ``text`` and a word of an answer form (``MIN_SHARED``+ letters) are equal
    or one contains the other: "Kuwait" / "Kuwait City", "Tunisia" / "Tunis"."""
    mine = [w for w in words(text) if len(w) >= MIN_SHARED]
    theirs = [w for f in forms for w in words(f) if len(w) >= MIN_SHARED]
    return any(a in b or b in a for a in mine for b in theirs)


def excluded_countries() -> list[str]:
    """Countries left out: the question shares part of an answer, or no other place of the country."""
    return [c["name"] for c in tables.countries() if _fact(c) is None]


@lru_cache(maxsize=1)
def countries_by_name() -> dict[str, dict]:
    return {c["name"]: c for c in tables.countries()}


def _fact(country: dict) -> dict | None:
    other = [country["other_city"], *country["other_city_aliases"]] if country["other_city"] else []
    if not other or shares_answer_part(question_of(country), capital_forms(country) + other):
        return None
    fact = {
        "subject": in_text(country),
        "answer": country["capital"],
        "answer_aliases": list(country["capital_aliases"]),
        "cf_pool": [(country["other_city"], list(country["other_city_aliases"]))],
        "values": {
            "continent": country["continent"],
            "language": country["language"],
            "language_role": "one of the official languages of" if country["other_languages"]
            else "the official language of",
            "currency": country["currency"],
        },
    }
    return fact if counterfactual_choices(fact, fact["cf_pool"]) else None


def build_pairs(dataset: str, version: int, seed: int, former: bool) -> list[tuple[Item, list[str]]]:
    """One item per kept country, each with the sentences of its agreeing twin; ``former``: the
    passage names the true capital as the former one."""
    rng = make_rng(dataset, version, seed)
    kept = [(c, f) for c in sorted(tables.countries(), key=lambda c: c["id"]) if (f := _fact(c))]
    pairs = build_passage_items(dataset, version, TEMPLATES, [f for _, f in kept], seed, rng, 1, float(former))
    # Subject and id keep the table's name ("United States"), the text has the article.
    return [(replace(item, subject=c["name"], id=f"{dataset}-{RELATION}-{slug(c['name'])}-0"), agree)
            for (c, _), (item, agree) in zip(kept, pairs, strict=True)]


def build_items(dataset: str, version: int, seed: int, former: bool) -> list[Item]:
    """The counterfactual items of ``build_pairs``."""
    return [item for item, _ in build_pairs(dataset, version, seed, former)]


def build(seed: int) -> list[Item]:
    return build_items(NAME, VERSION, seed, former=False)


# --- validator rules (shared with cf_capitals_former) -------------------------------------------

# Words that speak of a change of capital or give a reason for one.
_CHANGE = re.compile(
    r"\b(mov(e|ed|es|ing)|relocat\w*|transferr?\w*|(new|former|old) capital|chos(e|en)|choice|planners?|"
    r"because|decid\w*|decision|no longer|now|since|until|reason\w*)\b", re.IGNORECASE)
# A sentence cannot lean on another one (the sentences are shuffled).
_DANGLING_START = re.compile(r"^(It|Its|This|These|Those|They|Their|The (city|move|choice|decision|country))\b")
_THERE = re.compile(r"\bthere\b(?! (is|are|was|were|has been|have been)\b)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<!\bSt\.)(?<![A-Z]\.)(?<=[.!?])\s+(?=\S)")


def sentences(text: str) -> list[str]:
    """Sentences of a passage; "St. John's" and "Washington, D.C." do not end one."""
    return [s for s in _SENTENCE_END.split(text) if s]


def _country(item: Item) -> dict:
    return countries_by_name()[item.subject]


def _states_change(sentence: str, item: Item) -> bool:
    return (contains_any(sentence, [item.parametric_answer, *item.parametric_aliases])
            and contains(sentence, item.counterfactual_answer) and bool(_CHANGE.search(sentence)))


def _speaks_of_move(items: list[Item]) -> list[str]:
    return [i.id for i in items if any(_CHANGE.search(s) for s in sentences(i.context))]


def _unstated_change(items: list[Item]) -> list[str]:
    return [i.id for i in items
            if any(_CHANGE.search(s) and not _states_change(s, i) for s in sentences(i.context))]


def _former_move_stated(items: list[Item]) -> list[str]:
    return [i.id for i in items
            if i.mentions_parametric and not any(_states_change(s, i) for s in sentences(i.context))]


def _country_article(items: list[Item]) -> list[str]:
    bad = []
    for i in items:
        country = _country(i)
        name = re.escape(country["name"])
        wrong = (rf"(?<!\bthe )(?<!\bThe )\b{name}\b" if country["article"] else rf"\b[Tt]he {name}\b")
        text = (i.question + " " + i.context).replace(country["currency"], "")  # "the Belize dollar"
        if re.search(wrong, text):
            bad.append(i.id)
    return bad


def _question_gives_answer(items: list[Item]) -> list[str]:
    return [i.id for i in items if shares_answer_part(i.question, [i.parametric_answer, *i.parametric_aliases,
                                                                   i.counterfactual_answer, *i.counterfactual_aliases])]


def _sole_official_language(items: list[Item]) -> list[str]:
    return [i.id for i in items
            if _country(i)["other_languages"] and re.search(r"\bthe official language\b", i.context, re.IGNORECASE)]


def _dangling_reference(items: list[Item]) -> list[str]:
    return [i.id for i in items
            if any(_DANGLING_START.match(s) or _THERE.search(s) for s in sentences(i.context))]


def _counterfactual_same_country(items: list[Item]) -> list[str]:
    def ok(i: Item) -> bool:
        c = _country(i)
        return bool(c["other_city"]) and contains_any(i.counterfactual_answer,
                                                      [c["other_city"], *c["other_city_aliases"]])
    return [i.id for i in items if not ok(i)]


def _former_capital(items: list[Item]) -> list[str]:
    return [i.id for i in items if contains_any(i.counterfactual_answer, _country(i)["former_capitals"])]


def _largest_city(items: list[Item]) -> list[str]:
    def largest(i: Item) -> list[str]:
        c = _country(i)
        return [c["largest_city"], *c["largest_city_aliases"]]
    return [i.id for i in items if contains_any(i.counterfactual_answer, largest(i))]


def _reverses_real_move(items: list[Item]) -> list[str]:
    """A passage that moves the capital from the true one to a former capital tells history backwards."""
    return [i.id for i in items if i.mentions_parametric
            and contains_any(i.counterfactual_answer, _country(i)["former_capitals"])]


def _grammar(items: list[Item]) -> list[str]:
    def bad(text: str) -> bool:
        return any(not s[0].isupper() for s in sentences(text)) or bool(re.search(r"\b(\w+) \1\b", text, re.I))
    return [i.id for i in items if bad(i.context) or bad(i.question)]


EXTRA_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "unstated_change": ("a sentence that speaks of a move or a reason names the former and the new capital",
                        _unstated_change),
    "former_move_stated": ("an item naming the true capital states the move from it to the counterfactual",
                           _former_move_stated),
    "country_article": ("a country's name has 'the' exactly where countries.json gives it an article",
                        _country_article),
    "question_gives_answer": (f"the question shares no word ({MIN_SHARED}+ letters, or part of one) with the "
                              "true or the counterfactual capital", _question_gives_answer),
    "sole_official_language": ("no passage calls a language 'the official language' of a country with several",
                               _sole_official_language),
    "dangling_reference": ("no sentence leans on another: no leading it/its/this/they/the city, no 'there'",
                           _dangling_reference),
    "counterfactual_same_country": ("the counterfactual capital is the other_city of the same country",
                                    _counterfactual_same_country),
    "former_capital": ("the counterfactual is not a former capital of the country, of any era (a stale fact, not "
                       "the context)", _former_capital),
    "largest_city": ("the counterfactual is not the country's largest city (the answer a model gives without reading)",
                     _largest_city),
    "reverses_real_move": ("a passage that names the true capital never moves it to a former capital (a real move "
                           "told backwards)", _reverses_real_move),
    "grammar": ("every sentence starts with a capital letter and no word is doubled", _grammar),
}

# The agreeing twins (cf_capitals_agree, cf_capitals_former_agree): the rules above that are about the
# text, not about the counterfactual capital (which the twins no longer state). A twin names only the
# true capital, so no sentence may speak of a move or give a reason for one.
AGREE_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "agree_no_move": ("no sentence speaks of a move of the capital or gives a reason for one (the twin states none)",
                      _speaks_of_move),
    **{rule: EXTRA_RULES[rule] for rule in ("country_article", "question_gives_answer", "sole_official_language",
                                            "dangling_reference", "grammar")},
}
