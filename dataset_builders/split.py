"""The seeded split of the fact tables' subjects into a training part and a held-out part.

A fine-tuning study (the context-parametric inversion of Goyal et al., sections 3-4) trains on
facts and evaluates on others: ``split_of`` assigns every subject (a person, a country, a work, a
landmark, a company, a saying) to ``"train"`` or ``"heldout"`` by a seeded hash of its canonical
name, about half each. The key is the name alone, so one real-world subject lands in the same part
in every dataset that names it ("the Mona Lisa" in two relations of cf_world_facts, a country in
cf_capitals and in ic_recall). The dataset builds do not change: the evaluation filters a build by
its items' subjects (``cf_tasks.tasks.load(split=...)``), the training data keeps the training part
(``dataset_builders.training``).

``name_forms`` lists every form (name and aliases) of every subject, so that
``mentions_heldout`` can prove that no training text names a held-out one.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from typing import NamedTuple

from cf_tasks.text import normalize, unaccented, words

from . import tables

SPLIT_SEED = 20250421  # changing it moves subjects between the parts: never change it within a study
PARTS = ("train", "heldout")
SPLITS = ("heldout", "train")  # the values of the ``split`` task metadata (absent: every item)
# The evaluation families whose subjects are split (a dataset's family: its name without _former/_agree).
FAMILIES = ("cf_bio", "cf_capitals", "cf_quotes", "cf_world_facts")
_SUFFIXES = ("_agree", "_former", "_cf")


class Subject(NamedTuple):
    """One subject of a fact table: its key (``subject_key`` of its name), the name, every form a
    text may name it by, and the family whose table holds it."""

    key: str
    name: str
    forms: tuple[str, ...]
    family: str


def family_of(dataset: str) -> str:
    """``cf_capitals_former_agree`` -> ``cf_capitals``; ``ic_recall_cf`` -> ``ic_recall``."""
    name = dataset
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and name != suffix:
                name, changed = name.removesuffix(suffix), True
    return name


def subject_key(name: str) -> str:
    """The canonical key of a subject's name: folded words without articles ("the Nile" -> "nile")."""
    return normalize(name, drop_articles=True)


def canonical_name(dataset_or_family: str, subject: str) -> str:
    """The name an item's ``subject`` field stands for: cf_bio stores a person id ("marie_curie")."""
    if family_of(dataset_or_family) == "cf_bio":
        person = _people_by_id().get(subject)
        if person is not None:
            return person["name"]
    return subject


def part_of_key(key: str, split_seed: int = SPLIT_SEED) -> str:
    """``"train"`` or ``"heldout"`` for a subject key: the parity of a seeded sha256 (stable across
    Python versions and processes, unlike ``hash``)."""
    digest = hashlib.sha256(f"{split_seed}:{key}".encode("utf-8")).digest()
    return PARTS[digest[0] & 1]


def split_of(dataset_or_family: str, subject: str, split_seed: int = SPLIT_SEED) -> str:
    """The part (``"train"`` or ``"heldout"``) of an item's ``subject`` in dataset ``dataset_or_family``."""
    return part_of_key(subject_key(canonical_name(dataset_or_family, subject)), split_seed)


def check_split(split: str | None) -> str | None:
    """``split`` as given in task metadata, checked: "heldout", "train" or None (every item)."""
    if split is None or split in SPLITS:
        return split
    raise ValueError(f"metadata split={split!r} is not one of {', '.join(SPLITS)}; pass "
                     "'{\"split\": \"heldout\"}' or '{\"split\": \"train\"}', or leave split out for every item")


def in_part(dataset: str, subjects: list[str], split: str | None) -> list[int]:
    """Indices of the ``subjects`` (items' subject fields) that lie in ``split`` (None: all)."""
    if check_split(split) is None:
        return list(range(len(subjects)))
    return [i for i, s in enumerate(subjects) if split_of(dataset, s) == split]


# --- the subjects of the fact tables ---------------------------------------------------------------

@lru_cache(maxsize=1)
def _people_by_id() -> dict[str, dict]:
    return {p["id"]: p for p in tables.people()}


@lru_cache(maxsize=1)
def all_subjects() -> tuple[Subject, ...]:
    """Every subject of the evaluation families, one entry per key (the first family that has it)."""
    found: dict[str, Subject] = {}

    def add(name: str, forms: list[str], family: str) -> None:
        key = subject_key(name)
        if key and key not in found:
            kept = tuple(dict.fromkeys(f for f in [name, *forms] if f and words(f)))
            found[key] = Subject(key, name, kept, family)

    for p in sorted(tables.people(), key=lambda p: p["id"]):
        add(p["name"], [*p["aliases"], p["surname"]], "cf_bio")
    for c in sorted(tables.countries(), key=lambda c: c["id"]):
        add(c["name"], list(c["aliases"]), "cf_capitals")
    for r in sorted(tables.relations(), key=lambda r: r["relation"]):
        for f in r["facts"]:
            add(f["subject"], [], "cf_world_facts")
    for q in sorted(tables.quotes(), key=lambda q: q["id"]):
        add(q["saying"], [], "cf_quotes")
    return tuple(found.values())


def subjects(part: str, family: str | None = None) -> list[Subject]:
    """The subjects in ``part`` ("train" or "heldout"), optionally of one family, in table order."""
    if part not in PARTS:
        raise ValueError(f"part {part!r} is not one of {', '.join(PARTS)}")
    return [s for s in all_subjects() if part_of_key(s.key) == part and (family is None or s.family == family)]


ARTICLE_FREE_MAX_ZIPF = 3.0  # "the Danube" is also named "Danube", "The Ambassadors" never "Ambassadors"
_CASED = re.compile(r"[A-Za-z0-9]+")


@lru_cache(maxsize=1)
def name_forms() -> dict[tuple[str, ...], tuple[str | None, tuple[bool, ...]]]:
    """Every form of every subject (both parts) as folded words -> (the subject's name, which words
    must be capitalised in a text that names it); the continents of countries.json map to None.

    A proper name names the subject only capitalised: "US" is not "us", "Turkey" not "turkey".
    Articles and lower-case words of a form ("the telephone") match in any case. The longest form
    found wins, so "South Sudan" does not name Sudan, nor "South America" the United States.
    """
    from wordfreq import zipf_frequency

    out: dict[tuple[str, ...], tuple[str | None, tuple[bool, ...]]] = {}

    def add(form: str, name: str | None) -> None:
        toks, caps = tuple(words(form)), _capitals(form)
        if not toks or len(caps) != len(toks):
            return
        out.setdefault(toks, (name, caps))
        rest = toks[1:]
        if toks[0] in ("the", "a", "an") and rest and (
                len(rest) > 1 or zipf_frequency(rest[0], "en") < ARTICLE_FREE_MAX_ZIPF):
            out.setdefault(rest, (name, caps[1:]))

    for s in all_subjects():
        for form in s.forms:
            add(form, s.name)
    for continent in sorted({c["continent"] for c in tables.countries()}):
        add(continent, None)
    return out


@lru_cache(maxsize=1)
def heldout_names() -> frozenset[str]:
    return frozenset(s.name for s in subjects("heldout"))


def _cased_words(text: str) -> list[str]:
    """The words of ``text`` as ``words`` finds them, with their case kept."""
    return _CASED.findall(re.sub(r"'s\b", "", unaccented(text)).replace("'", ""))


def _capitals(form: str) -> tuple[bool, ...]:
    """Per word of ``form``: must it be capitalised (a capitalised word that is not an article)?"""
    return tuple(w[:1].isupper() and w.lower() not in ("the", "a", "an") for w in _cased_words(form))


def mentions_heldout(text: str) -> list[str]:
    """The held-out subjects ``text`` names (on word boundaries, accent-insensitive, proper names
    capitalised, a name inside a longer one not counted: see ``name_forms``)."""
    forms, heldout = name_forms(), heldout_names()
    toks = words(text)
    cased = _cased_words(text)
    if len(cased) != len(toks):  # a letter that folds into two words: fall back to any case
        cased = [t.capitalize() for t in toks]
    found: list[tuple[int, int, str | None]] = []  # (start, end, name)
    for n in sorted({len(f) for f in forms}, reverse=True):
        for i in range(len(toks) - n + 1):
            hit = forms.get(tuple(toks[i:i + n]))
            if hit is None or not all(cased[i + k][:1].isupper() for k, cap in enumerate(hit[1]) if cap):
                continue
            if not any(a <= i and i + n <= b for a, b, _ in found):  # inside a longer name: not this one
                found.append((i, i + n, hit[0]))
    hits: list[str] = []
    for _, _, name in sorted(found):
        if name in heldout and name not in hits:
            hits.append(name)
    return hits
