"""Deterministic, seeded generators of the knowledge-conflict datasets.

``build(name, seed)`` returns a dataset's items; the same name, seed and builder version give
byte-identical output. Facts come from the tables in ``data/`` (see ``tables.py``).
"""

from __future__ import annotations

from types import ModuleType

from . import cf_bio, cf_capitals, cf_capitals_former, cf_quotes, cf_world_facts, cf_world_facts_former, ic_recall, ic_recall_cf
from .agree import TWINS, Twin
from .schema import Item

DEFAULT_SEED = 1234
BUILDERS: dict[str, ModuleType | Twin] = {
    m.NAME: m for m in (cf_bio, cf_world_facts, cf_world_facts_former, cf_capitals, cf_capitals_former, cf_quotes,
                        ic_recall, ic_recall_cf,
                        # the agreeing twins: same items, the passage states the true answer
                        *TWINS)
}
DATASETS: tuple[str, ...] = tuple(BUILDERS)
# dataset -> its agreeing twin (``<dataset>_agree``)
AGREE_TWINS: dict[str, str] = {twin.TWIN_OF: twin.NAME for twin in TWINS}


class UnknownDataset(KeyError):
    def __str__(self) -> str:
        return f"unknown dataset {self.args[0]!r}; choose one of: all, {', '.join(DATASETS)}"


def builder(name: str) -> ModuleType | Twin:
    try:
        return BUILDERS[name]
    except KeyError:
        raise UnknownDataset(name) from None


def build(name: str, seed: int = DEFAULT_SEED) -> list[Item]:
    """The items of dataset ``name`` for ``seed`` (not validated; see ``validate.build_validated``)."""
    return builder(name).build(seed)


def version(name: str) -> int:
    return builder(name).VERSION
