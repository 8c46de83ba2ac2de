"""Helpers the builders share: seeded RNGs, sentence filtering, passage assembly and agreeing twins."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

from cf_tasks.text import contains_any, normalize

from .schema import POSITIONS, Item, answer_position, fill

# Particles that are part of many names and say nothing about who is meant.
NAME_PARTICLES = frozenset(
    {"van", "von", "der", "den", "del", "della", "de", "da", "di", "du", "des", "dos", "das", "la",
     "le", "ter", "ten", "bin", "ibn", "al", "el", "y", "of", "the", "and", "jr", "sr", "ii", "iii"}
)


def country_in_text(name: str) -> str:
    """A country's name as it reads in running text: "the Netherlands", "France", "England".

    The article is the ``article`` field of countries.json, or for a former state or land of
    people.json (the Gold Coast) its ``articles``; other names (England, Scotland) take none.
    """
    article = _articles().get(name, "")
    return f"{article} {name}" if article else name


@lru_cache(maxsize=1)
def _articles() -> dict[str, str]:
    from . import tables

    return {**tables.people_meta().get("articles", {}), **{c["name"]: c["article"] for c in tables.countries()}}


def make_rng(dataset: str, version: int, seed: int) -> random.Random:
    """A private RNG for one build; a str seed is hashed stably by ``random`` (not by ``hash``)."""
    return random.Random(f"{dataset}:{version}:{seed}")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", normalize(text)).strip("_")


def name_fragments(*names: str) -> list[str]:
    """Every word of the given names that could identify the person (particles excluded)."""
    out: list[str] = []
    for name in names:
        for tok in normalize(name).split():
            if len(tok) >= 3 and tok not in NAME_PARTICLES and tok not in out:
                out.append(tok)
    return out


def same_answer(a: str, b: str) -> bool:
    return normalize(a, drop_articles=True) == normalize(b, drop_articles=True)


def assemble(required: str, others: list[str], position: str, rng: random.Random) -> list[str]:
    """Place ``required`` at ``position`` among ``others`` (already shuffled, at least 2 of them)."""
    if position == "beginning":
        return [required, *others]
    if position == "end":
        return [*others, required]
    cut = rng.randint(1, len(others) - 1)
    return [*others[:cut], required, *others[cut:]]


class Passage(NamedTuple):
    """A counterfactual passage's sentences and those of its agreeing twin (the same sentences in
    the same order, the answer sentence stating the true answer)."""

    sentences: list[str]
    agree: list[str]


def passage_from_templates(
    templates: dict,
    values: dict,
    answer: str,
    forbidden: list[str],
    position: str,
    mentions_parametric: bool,
    rng: random.Random,
    agree_rng: random.Random,
) -> Passage:
    """A 3-6 sentence counterfactual passage in the shape of a relations.json entry, and its twin.

    The sentence that states ``answer`` goes at ``position``; the others are reasons and fillers
    that neither state the answer nor mention anything in ``forbidden``.

    Optional keys: ``change_sentences`` state a change from the former (parametric) value and join
    the ``former_sentences`` when ``mentions_parametric``; ``change_reasons`` explain that change and
    are used only beside a change sentence, so no reason speaks of a change the passage does not state.

    The twin fills the same answer sentence with the true answer (``values["parametric"]``). A former
    or change sentence names both answers, so the twin takes an answer sentence instead (drawn from
    ``agree_rng``, which leaves ``rng`` and so the counterfactual passage as they were), and a change
    reason, which would speak of a change the twin does not state, gives way to another reason.
    """
    pool = "former_sentences" if mentions_parametric else "answer_sentences"
    changes = templates.get("change_sentences", []) if mentions_parametric else []
    template = rng.choice(templates[pool] + changes)
    required = fill(template, **values)
    change_reasons = templates.get("change_reasons", []) if template in changes else []
    plain_reasons = [fill(t, **values) for t in templates["reason_sentences"]]
    reasons = plain_reasons + [fill(t, **values) for t in change_reasons]
    fillers = [fill(t, **values) for t in templates["filler_sentences"]]
    ok = lambda s: not contains_any(s, forbidden) and not contains_any(s, [answer])  # noqa: E731
    reasons = [s for s in reasons if ok(s)]
    fillers = [s for s in fillers if ok(s)]
    n_sentences = rng.randint(3, 6)
    n_reasons = min(len(reasons), rng.randint(1, 2), n_sentences - 1)
    n_fillers = min(len(fillers), n_sentences - 1 - n_reasons)
    others = rng.sample(reasons, n_reasons) + rng.sample(fillers, n_fillers)
    if len(others) < 2:
        raise ValueError(f"too few usable reason/filler templates for {values}; add templates")
    rng.shuffle(others)
    sentences = assemble(required, others, position, rng)

    answers = templates["answer_sentences"]
    truth = {**values, "answer": values["parametric"]}
    agree_required = fill(template if template in answers else agree_rng.choice(answers), **truth)
    spare = [s for s in plain_reasons if ok(s) and s not in others]
    agree = []
    for sentence in sentences:
        if sentence == required:
            agree.append(agree_required)
        elif sentence in plain_reasons or sentence in fillers:
            agree.append(sentence)
        elif spare:  # a change reason
            agree.append(spare.pop(agree_rng.randrange(len(spare))))
    return Passage(sentences, agree)


# Shares of the ways a later sentence of an article refers to its subject (article_from_templates).
REFERENCE_WEIGHTS = {"name": 0.4, "kind": 0.35, "pronoun": 0.25}


def _compares(template: str, kinds: list[str]) -> bool:
    """The sentence sets the subject among others of its kind ("Few rivers are as ... as", "one of the
    landmarks of"): calling the subject by its kind there reads "The landmark is one of the landmarks"."""
    return template.startswith("Few ") or any(k.split()[-1][:5].lower() in template.lower() for k in kinds)


def _reference(template: str, values: dict, kinds_of: list[str], previous: str, after_answer: bool,
               rng: random.Random, kind_used: bool = False, after_subject: bool = True) -> str:
    """How a sentence after the first refers to the subject: by name, by its kind ("the river") or, for
    a singular subject at the start of a sentence that names no other thing first, as "it". An
    answer sentence never uses "it", nor does the sentence after it (the answer may be what "it" reads as).
    The kind is not used in a sentence that compares the subject with others of its kind ("Few rivers
    are as ... as", "one of the best-known companies", "is a painting that"), and neither the kind nor
    "it" twice in a row (``previous``). The kind is used once in a passage (``kind_used``: "the landmark"
    twice reads as a template), and "it" only after a sentence about the subject (``after_subject``), not
    after one about another noun ("The history of the Arc is told ... It is especially striking")."""
    singular = values.get("it") == "it"
    ways = ["name"] + (["kind"] if singular and previous != "kind" and not kind_used
                       and not _compares(template, kinds_of) else [])
    if (singular and not after_answer and after_subject and previous != "pronoun" and template.startswith("{Subject} ")
            and "{answer}" not in template and "{Answer}" not in template):
        ways.append("pronoun")
    return rng.choices(ways, [REFERENCE_WEIGHTS[w] for w in ways])[0]


def _refer(template: str, values: dict, reference: str, kind_noun: str) -> str:
    subject = {"name": values["subject"], "kind": kind_noun, "pronoun": "it"}[reference]
    return fill(template, **{**values, "subject": subject})


LATE_ABOUT = 3  # an article's documented sentences after the opening; any further one ends the article


def article_from_templates(templates: dict, values: dict, answer: str, forbidden: list[str], position: str,
                           mentions_parametric: bool, rng: random.Random, agree_rng: random.Random,
                           about: list[str]) -> Passage:
    """A 5-9 sentence counterfactual passage that reads like a short article, and its twin.

    Unlike ``passage_from_templates`` (a shuffled set of sentences, each naming the subject), the
    article opens with a sentence that introduces the subject (``opening_sentences``), then what it
    is and two documented details where the subject has them (``about``: its sentences in about.json,
    which hold for any answer; a further one ends the article), tells where it comes from
    (``reason_sentences``) before how it is seen (``filler_sentences``), and refers to the subject after the first sentence by name, by its kind
    (``kind``: "the river", "the work") or as "it" (``REFERENCE_WEIGHTS``). The sentence that states
    ``answer`` goes at ``position``: first, somewhere after the first sentence (middle), or last. No other sentence
    states ``answer`` or mentions anything in ``forbidden``; ``change_sentences`` and
    ``change_reasons`` work as in ``passage_from_templates``, and so does the twin (same templates,
    order and references, the answer sentence stating the true answer).
    """
    pool = "former_sentences" if mentions_parametric else "answer_sentences"
    changes = templates.get("change_sentences", []) if mentions_parametric else []
    template = rng.choice(templates[pool] + changes)
    change_reasons = templates.get("change_reasons", []) if template in changes else []
    ok = lambda t: not contains_any(fill(t, **values), [*forbidden, answer])  # noqa: E731
    described = [t for t in about if ok(t)]
    # what the subject is and its first details open the article; a further detail closes it (LATE_ABOUT)
    opening = [rng.choice([t for t in templates["opening_sentences"] if ok(t)]), *described[:LATE_ABOUT]]
    plain = [t for t in templates["reason_sentences"] if ok(t)]
    reasons = plain + [t for t in change_reasons if ok(t)]
    fillers = [t for t in templates["filler_sentences"] if ok(t)]
    n_body = rng.randint(5, 7) - len(opening)
    n_reasons = min(len(reasons), rng.randint(1, 2), n_body - 1)
    body = rng.sample(reasons, n_reasons) + rng.sample(fillers, min(len(fillers), n_body - n_reasons))
    order = assemble(template, [*opening, *body, *described[LATE_ABOUT:]], position, rng)
    kind_noun = rng.choice(templates["kind"])
    answers = templates["answer_sentences"]
    agree_template = template if template in answers else agree_rng.choice(answers)
    # a template that names the kind itself ("as the company has grown", the twin's "is the work of")
    # uses it up
    literal_kind = any(kind_noun.lower() in t.lower() for t in [*order, agree_template])
    references = ["name"]
    for previous, t in zip(order, order[1:]):
        references.append(_reference(t, values, templates["kind"], references[-1], t == template or previous == template,
                                     rng, kind_used=literal_kind or "kind" in references,
                                     after_subject=previous.startswith("{Subject} ")))
    sentences = [_refer(t, values, r, kind_noun) for t, r in zip(order, references)]

    truth = {**values, "answer": values["parametric"]}
    spare = [t for t in plain if t not in order and not ("kind" in references and kind_noun.lower() in t.lower())]
    agree = []
    for t, r in zip(order, references):
        if t == template:
            compares = _compares(agree_template, templates["kind"])
            agree.append(_refer(agree_template, truth, "name" if r == "kind" and compares else r, kind_noun))
        elif t in change_reasons:
            if spare:
                other = spare.pop(agree_rng.randrange(len(spare)))
                agree.append(_refer(other, values, "name", kind_noun))  # the name fits any sentence
        else:
            agree.append(_refer(t, values, r, kind_noun))
    return Passage(sentences, agree)


def agree_twin(item: Item, sentences: list[str], dataset: str, version: int) -> Item:
    """The agreeing twin of a counterfactual ``item``: same id, question and answers, its passage
    (``sentences``) states the true answer. ``counterfactual_answer`` keeps the value the twin
    replaced, so the validator can check that none of it is left."""
    return replace(item, dataset=dataset, version=version, context=" ".join(sentences),
                   answer_position=answer_position(sentences, item.parametric_answer), mentions_parametric=True)


def balanced(labels: tuple[str, ...] | list, n: int, rng: random.Random) -> list:
    """``n`` labels in equal shares (remainder spread in order), shuffled."""
    out = [labels[i % len(labels)] for i in range(n)]
    rng.shuffle(out)
    return out


__all__ = ["POSITIONS", "Passage", "agree_twin", "article_from_templates", "assemble", "balanced", "make_rng", "name_fragments",
           "passage_from_templates", "same_answer", "slug"]
