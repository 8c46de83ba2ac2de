"""CF_Bio: counterfactual biographies (paper section 3.2, "Entity-Based Knowledge Conflict").

Two kinds of item, built from ``data/people.json``:

* ``person_name``: a biography generated from a real person's facts, but naming another famous
  person throughout (full name, surname, possessive). No fragment of the real name may survive
  anywhere in the passage, so a sentence that would carry one (a birthplace such as Vinci for
  Leonardo da Vinci) falls back to a form without it or is left out. The question asks who the
  <domain> known for <works> is: the context answers with the substitute, memory with the real name.
* ``birth_year`` / ``birth_city`` / ``nationality``: the real name is kept and one attribute is
  changed throughout; the question asks for that attribute directly.
"""

from __future__ import annotations

import random

from cf_tasks.text import contains_any, normalize

from . import tables
from .common import country_in_text, make_rng, name_fragments, same_answer
from .schema import Item, answer_position, capitalize_first, fill

NAME = "cf_bio"
VERSION = 1
SUBSTITUTES_PER_PERSON = 2
ATTRIBUTES = ("birth_year", "birth_city", "nationality")

# Each sentence kind lists variants; "{who}" is a mention of the person (full name or surname).
INTRO = (
    "{who} was {a_nationality} {domain} born in {birth_year}.",
    "Born in {birth_year}, {who} became one of the best-known {nationality} {domains}.",
    "{who}, {a_nationality} {domain}, was born in {birth_year}.",
)
INTRO_PLAIN = ("{who} was a celebrated {domain}.",)
BIRTHPLACE = (
    "{Pronoun} was born in {birth_city}, {birth_country}.",
    "{who} grew up in {birth_city}, in {birth_country_in}.",
    "{who_poss} birthplace was the city of {birth_city} in {birth_country_in}.",
)
BIRTHPLACE_PLAIN = ("{Pronoun} was born in {birth_country_in}.",)
WORK_ONE = (
    "{who} is best known for {work1}.",
    "Among {poss} most celebrated achievements is {work1}.",
    "{who_poss} reputation rests largely on {work1}.",
)
WORK_TWO = (
    "{who} also gained lasting recognition for {work2}.",
    "Critics and historians often single out {work2} as well.",
    "{who_poss} later fame owes much to {work2}.",
)
LEGACY = (
    "Today {who} is remembered as one of the most influential {domains} of {poss} era.",
    "Scholars continue to study {who_poss} life and work.",
    "{who_poss} influence on later generations of {domains} is widely acknowledged.",
)
DEATH = (
    "{who} died in {death_city}, {death_country}, in {death_year}.",
    "{Pronoun} spent {poss} final years in {death_city}, where {pronoun} died in {death_year}.",
)
DEATH_PLAIN = ("{who} died in {death_year}.",)

QUESTIONS = {
    "person_name": "What is the name of the {domain} known for {works}?",
    "birth_year": "In what year was {name} born?",
    "birth_city": "In which city was {name} born?",
    "nationality": "What was the nationality of {name}?",
}


def _possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s")


def _works_phrase(works: list[str]) -> str:
    return f"{works[0]} and {works[1]}"


def _biography(facts: dict, name: str, surname: str, forbidden: list[str], rng: random.Random) -> list[str]:
    """Sentences of a biography for ``facts`` that names the person ``name``.

    Every sentence is checked against ``forbidden``: a sentence mentioning any of those phrases
    is swapped for its plain variant, or left out when it has none.
    """
    pronoun = facts["pronoun"]
    poss = "his" if pronoun == "he" else "her"
    mentions = iter([name] + [rng.choice([surname, surname, name]) for _ in range(8)])
    values = {k: str(v) for k, v in facts.items() if isinstance(v, (str, int)) and v is not None}
    values["birth_country_in"] = country_in_text(facts["birth_country"])  # "in the Netherlands"
    values.update(domain=facts["domain"], domains=facts["domain"] + "s", pronoun=pronoun, poss=poss)
    values["a_nationality"] = ("an " if facts["nationality"][:1] in "AEIOU" else "a ") + facts["nationality"]
    works = list(facts["works"])

    def sentence(variants: tuple[str, ...], plain: tuple[str, ...] = ()) -> str | None:
        for pool in (variants, plain):
            if not pool:
                continue
            template = rng.choice(pool)
            who = next(mentions) if ("{who" in template) else name
            text = fill(template, **values, who=who, who_poss=_possessive(who))
            text = capitalize_first(text)
            if not contains_any(text, forbidden):
                return text
        return None

    usable_works = [w for w in works if not contains_any(w, forbidden)]
    body_kinds: list[tuple[tuple[str, ...], tuple[str, ...]]] = [(BIRTHPLACE, BIRTHPLACE_PLAIN), (LEGACY, ())]
    if usable_works:
        values["work1"] = usable_works[0]
        body_kinds.append((WORK_ONE, ()))
    if len(usable_works) > 1:
        values["work2"] = usable_works[1]
        body_kinds.append((WORK_TWO, ()))
    rng.shuffle(body_kinds)
    sentences = [sentence(INTRO, INTRO_PLAIN)]
    sentences += [sentence(v, p) for v, p in body_kinds]
    if facts.get("death_year"):
        sentences.append(sentence(DEATH, DEATH_PLAIN))
    return [s for s in sentences if s]


def _name_items(person: dict, others: list[dict], seed: int, rng: random.Random) -> list[Item]:
    fragments = name_fragments(person["name"], person["surname"], *person["aliases"])
    candidates = [
        o for o in others
        if o["pronoun"] == person["pronoun"]
        and not set(name_fragments(o["name"], *o["aliases"])) & set(fragments)
    ]
    items = []
    for k, sub in enumerate(rng.sample(candidates, SUBSTITUTES_PER_PERSON)):
        sentences = _biography(person, sub["name"], sub["surname"], fragments, rng)
        question = fill(QUESTIONS["person_name"], domain=person["domain"], works=_works_phrase(person["works"]))
        items.append(
            Item(
                id=f"{NAME}-person_name-{person['id']}-{k}",
                dataset=NAME,
                relation="person_name",
                subject=person["id"],
                context=" ".join(sentences),
                question=question,
                counterfactual_answer=sub["name"],
                counterfactual_aliases=list(sub["aliases"]),
                parametric_answer=person["name"],
                parametric_aliases=list(person["aliases"]),
                answer_position=answer_position(sentences, sub["name"]),
                version=VERSION,
                seed=seed,
            )
        )
    return items


def _attribute_items(person: dict, pool: dict[str, list], seed: int, rng: random.Random) -> list[Item]:
    items = []
    for attribute in ATTRIBUTES:
        true_value = str(person[attribute])
        if contains_any(" ".join([person["name"], *person["aliases"]]), [true_value]):
            continue  # Leonardo da Vinci, born in Vinci: the name would give the answer away
        facts = dict(person)
        if attribute == "birth_year":
            offset = rng.choice([-1, 1]) * rng.randint(3, 40)
            cf_value = str(person["birth_year"] + offset)
            facts["birth_year"] = int(cf_value)
        elif attribute == "birth_city":
            forbidden_places = {normalize(person["birth_city"]), normalize(person.get("death_city") or "")}
            choices = [p for p in pool["places"] if normalize(p[0]) not in forbidden_places]
            cf_value, facts["birth_country"] = rng.choice(choices)
            facts["birth_city"] = cf_value
        else:
            cf_value = rng.choice([n for n in pool["nationalities"] if not same_answer(n, true_value)])
            facts["nationality"] = cf_value
        sentences = _biography(facts, person["name"], person["surname"], [true_value], rng)
        items.append(
            Item(
                id=f"{NAME}-{attribute}-{person['id']}",
                dataset=NAME,
                relation=attribute,
                subject=person["id"],
                context=" ".join(sentences),
                question=fill(QUESTIONS[attribute], name=person["name"]),
                counterfactual_answer=cf_value,
                parametric_answer=true_value,
                answer_position=answer_position(sentences, cf_value),
                version=VERSION,
                seed=seed,
            )
        )
    return items


def build(seed: int) -> list[Item]:
    """All CF_Bio items for ``seed``: name substitutions first, then attribute changes."""
    rng = make_rng(NAME, VERSION, seed)
    people = sorted(tables.people(), key=lambda p: p["id"])
    pool = {
        "places": sorted({(p["birth_city"], p["birth_country"]) for p in people}),
        "nationalities": sorted({p["nationality"] for p in people}),
    }
    items: list[Item] = []
    for person in people:
        others = [o for o in people if o["id"] != person["id"]]
        items += _name_items(person, others, seed, rng)
    for person in people:
        items += _attribute_items(person, pool, seed, rng)
    return items
