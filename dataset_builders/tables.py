"""Loading of the fact tables in ``dataset_builders/data/`` (the one source of truth for every fact).

Each table is a JSON file with a ``version`` and one list of records; a record missing a required
field is reported with the file, the record and the field, so a bad edit fails at load time.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"

REQUIRED = {
    "people.json": (
        "people",
        ("id", "name", "surname", "aliases", "domain", "works", "birth_year", "birth_city",
         "birth_country", "nationality", "pronoun", "death_year", "death_city", "death_country"),
    ),
    "countries.json": (
        "countries",
        ("id", "name", "aliases", "capital", "capital_aliases", "largest_city", "other_city",
         "other_city_aliases", "currency", "currency_aliases", "language", "continent"),
    ),
    "relations.json": (
        "relations",
        ("relation", "description", "subject_label", "answer_label", "question", "statement",
         "answer_sentences", "reason_sentences", "former_sentences", "filler_sentences", "facts"),
    ),
    "quotes.json": ("quotes", ("id", "saying", "last_word", "alternatives")),
    "about.json": ("about", ("subject", "sentences")),
    "people_about.json": ("about", ("person", "sentences")),
}


class TableError(ValueError):
    """A fact table is missing, unreadable or lacks a field."""


@lru_cache(maxsize=None)
def load_table(filename: str, data_dir: Path = DATA_DIR) -> tuple[dict, ...]:
    """Records of one fact table, checked for the fields the builders need."""
    path = Path(data_dir) / filename
    key, required = REQUIRED[filename]
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TableError(f"{path}: fact table not found; reinstall cf-tasks or restore the file") from None
    except json.JSONDecodeError as err:
        raise TableError(f"{path}: not valid JSON ({err}); fix the file or restore it from git") from None
    records = raw.get(key) if isinstance(raw, dict) else None
    if not isinstance(records, list) or not records:
        raise TableError(f"{path}: expected a non-empty list under {key!r}")
    for i, record in enumerate(records):
        missing = [f for f in required if f not in record]
        if missing:
            name = record.get("id") or record.get("relation") or f"#{i}"
            raise TableError(f"{path}: record {name} lacks field(s) {', '.join(missing)}; add them")
    return tuple(records)


def people() -> tuple[dict, ...]:
    return load_table("people.json")


def countries() -> tuple[dict, ...]:
    return load_table("countries.json")


def relations() -> tuple[dict, ...]:
    return load_table("relations.json")


def quotes() -> tuple[dict, ...]:
    return load_table("quotes.json")


@lru_cache(maxsize=1)
def people_meta() -> dict:
    """people.json's fields beside the people list: as_of, nationalities, places_not_drawn."""
    return json.loads((DATA_DIR / "people.json").read_text(encoding="utf-8"))


def about() -> dict[str, list[str]]:
    """Subject -> the sentences that describe it (what it is, then documented details)."""
    return {r["subject"]: list(r["sentences"]) for r in load_table("about.json")}
