"""Dataset builds and clean verdicts shared by the tests of one process.

A build is a pure function of (dataset, seed) and the validator a pure function of the items, so the
injection tests (one per rule: a clean dataset, one planted defect, the rule names it) need each clean
build and its clean verdict once, not once per rule. Only the clean verdict is kept: every defect is
validated afresh. A test that changes what the validator reads (a monkeypatched table) calls
``failures`` itself, never ``assert_clean``.
"""

from __future__ import annotations

import functools
import hashlib

from dataset_builders import DEFAULT_SEED, build
from dataset_builders.validate import failures


@functools.lru_cache(maxsize=None)
def _built(name: str, seed: int) -> tuple:
    return tuple(build(name, seed))


def built(name: str, seed: int = DEFAULT_SEED) -> list:
    """``build(name, seed)``, built once per process; a new list each call (the items are frozen)."""
    return list(_built(name, seed))


_CLEAN: set[str] = set()


def assert_clean(items) -> None:
    """``failures(items) == []``, checked once per distinct content."""
    key = hashlib.sha1(repr(list(items)).encode("utf-8")).hexdigest()
    if key not in _CLEAN:
        found = failures(list(items))
        assert found == [], found
        _CLEAN.add(key)


def assert_caught(items, rule: str, inject) -> None:
    """A clean build, one defect planted by ``inject`` (which returns the broken items and the bad id): the
    rule reports it in exactly one line that names the planted item."""
    assert_clean(items)
    broken, bad_id = inject(items)
    hit = [line for line in failures(broken) if line.startswith(rule + ":")]
    assert len(hit) == 1 and bad_id in hit[0] and "\n" not in hit[0], failures(broken)
