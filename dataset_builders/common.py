"""Helpers the builders share: seeded RNGs, sentence filtering and passage assembly."""

from __future__ import annotations

import random
import re
from functools import lru_cache

from cf_tasks.text import contains_any, normalize

from .schema import POSITIONS, answer_position, fill

# Particles that are part of many names and say nothing about who is meant.
NAME_PARTICLES = frozenset(
    {"van", "von", "der", "den", "del", "della", "de", "da", "di", "du", "des", "dos", "das", "la",
     "le", "ter", "ten", "bin", "ibn", "al", "el", "y", "of", "the", "and", "jr", "sr", "ii", "iii"}
)


def country_in_text(name: str) -> str:
    """A country's name as it reads in running text: "the Netherlands", "France", "England".

    The article is the ``article`` field of countries.json; names outside that table (England,
    Scotland) take none.
    """
    article = _articles().get(name, "")
    return f"{article} {name}" if article else name


@lru_cache(maxsize=1)
def _articles() -> dict[str, str]:
    from . import tables

    return {c["name"]: c["article"] for c in tables.countries()}


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


def passage_from_templates(
    templates: dict,
    values: dict,
    answer: str,
    forbidden: list[str],
    position: str,
    mentions_parametric: bool,
    rng: random.Random,
) -> tuple[str, str]:
    """A 3-6 sentence counterfactual passage in the shape of a relations.json entry.

    The sentence that states ``answer`` goes at ``position``; the others are reasons and fillers
    that neither state the answer nor mention anything in ``forbidden``. Returns the passage and
    the position actually taken by the answer sentence.

    Optional keys: ``change_sentences`` state a change from the former (parametric) value and join
    the ``former_sentences`` when ``mentions_parametric``; ``change_reasons`` explain that change and
    are used only beside a change sentence, so no reason speaks of a change the passage does not state.
    """
    pool = "former_sentences" if mentions_parametric else "answer_sentences"
    changes = templates.get("change_sentences", []) if mentions_parametric else []
    template = rng.choice(templates[pool] + changes)
    required = fill(template, **values)
    change_reasons = templates.get("change_reasons", []) if template in changes else []
    reasons = [fill(t, **values) for t in templates["reason_sentences"] + change_reasons]
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
    return " ".join(sentences), answer_position(sentences, answer)


def balanced(labels: tuple[str, ...] | list, n: int, rng: random.Random) -> list:
    """``n`` labels in equal shares (remainder spread in order), shuffled."""
    out = [labels[i % len(labels)] for i in range(n)]
    rng.shuffle(out)
    return out


__all__ = ["POSITIONS", "assemble", "balanced", "make_rng", "name_fragments", "passage_from_templates",
           "same_answer", "slug"]
