"""The guarantees every build must keep, checked on every build.

Each rule returns the ids of the items that break it; ``check`` turns the failures into one line
per rule. ``build_validated`` builds a dataset, rebuilds it with the same seed (the bytes must be
identical) and with another seed (the substitutions must change), and runs every item rule.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from cf_tasks.registry import twin_of
from cf_tasks.text import contains, contains_any

from . import BUILDERS, build
from .common import POSITIONS, name_fragments, same_answer
from .schema import FIELDS, Item
from .serialize import to_jsonl_bytes

POSITION_SHARE = (0.25, 0.40)  # bounds for each answer position in cf_world_facts
POSITION_BALANCED = ("cf_world_facts", "cf_world_facts_former", "cf_capitals", "cf_capitals_former")  # and twins
FORMER_SUFFIX = "_former"  # datasets whose every context names the true answer as the former value
MIN_RESEED_CHANGE = 0.10  # share of items another seed must change
_PLACEHOLDER = re.compile(r"[{}]|\[\[|\]\]")
_TYPES = {"str": str, "int": int, "bool": bool, "list[str]": list}


class ValidationError(ValueError):
    """A build broke one or more guarantees; ``str()`` has one line per broken rule."""


def _schema(items: list[Item]) -> list[str]:
    bad = []
    for item in items:
        d = item.to_dict()
        for name, type_name in FIELDS.items():
            value = d.get(name)
            expected = _TYPES[type_name]
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                bad.append(item.id)
                break
            if expected is str and name not in ("question",) and not value.strip():
                bad.append(item.id)
                break
            if expected is list and not all(isinstance(v, str) for v in value):
                bad.append(item.id)
                break
        if d.get("answer_position") not in POSITIONS:
            bad.append(item.id)
    return bad


def _answers_differ(items: list[Item]) -> list[str]:
    return [
        i.id for i in items
        if any(same_answer(c, p) for c in [i.counterfactual_answer, *i.counterfactual_aliases]
               for p in [i.parametric_answer, *i.parametric_aliases])
    ]


def _counterfactual_in_context(items: list[Item]) -> list[str]:
    return [i.id for i in items if not contains_any(i.context, [i.counterfactual_answer])]


def _parametric_not_in_context(items: list[Item]) -> list[str]:
    return [
        i.id for i in items
        if not i.mentions_parametric
        and contains_any(i.context + " " + i.question, [i.parametric_answer, *i.parametric_aliases])
    ]


def _no_name_fragment(items: list[Item]) -> list[str]:
    """For name substitutions: no word of the real name survives anywhere in the context."""
    return [
        i.id for i in items
        if i.relation == "person_name"
        and contains_any(i.context, name_fragments(i.parametric_answer, *i.parametric_aliases))
    ]


def _no_placeholder(items: list[Item]) -> list[str]:
    return [
        i.id for i in items
        if any(_PLACEHOLDER.search(s) for s in (i.context, i.question, i.counterfactual_answer, i.parametric_answer))
    ]


def _unique_ids(items: list[Item]) -> list[str]:
    counts = Counter(i.id for i in items)
    return sorted(k for k, n in counts.items() if n > 1)


def _position_shares(items: list[Item]) -> list[str]:
    if not items or (twin_of(items[0].dataset) or items[0].dataset) not in POSITION_BALANCED:
        return []
    counts = Counter(i.answer_position for i in items)
    low, high = POSITION_SHARE
    off = [p for p in POSITIONS if not low <= counts[p] / len(items) <= high]
    return [i.id for i in items if i.answer_position in off] or (
        [f"<no item at {p}>" for p in off]
    )


def _mentions_parametric_split(items: list[Item]) -> list[str]:
    """One number, one meaning: a ``*_former`` dataset names the true answer in every context, any
    other dataset in none (those items live in the ``_former`` twin)."""
    if not items:
        return []
    former = items[0].dataset.endswith(FORMER_SUFFIX)
    return [i.id for i in items if i.mentions_parametric != former]


RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "schema": ("every field present with its type and a known answer_position", _schema),
    "answers_differ": ("counterfactual and parametric answers differ after normalisation", _answers_differ),
    "counterfactual_in_context": ("the counterfactual answer occurs in the context", _counterfactual_in_context),
    "parametric_not_in_context": (
        "the parametric answer and its aliases are absent from context and question "
        "(unless mentions_parametric)",
        _parametric_not_in_context,
    ),
    "no_name_fragment": ("no fragment of a substituted name survives in the context", _no_name_fragment),
    "no_placeholder": ("no template placeholder is left", _no_placeholder),
    "unique_ids": ("ids are unique", _unique_ids),
    "position_shares": (f"each answer position holds {POSITION_SHARE[0]:.0%}-{POSITION_SHARE[1]:.0%} of items",
                        _position_shares),
    "mentions_parametric_split": (
        "items that name the true answer sit only in *_former datasets, and all of theirs do",
        _mentions_parametric_split,
    ),
}


# --- the agreeing twins (``<dataset>_agree``): same items, the passage states the true answer

def _true_answer_stated(items: list[Item]) -> list[str]:
    return [i.id for i in items if not i.mentions_parametric or not contains(i.context, i.parametric_answer)]


def _counterfactual_left(items: list[Item]) -> list[str]:
    return [i.id for i in items if contains_any(i.context, [i.counterfactual_answer, *i.counterfactual_aliases])]


def _not_the_same_items(items: list[Item]) -> list[str]:
    """Compared with the counterfactual dataset built with the same seed (``TWIN_OF`` of the builder)."""
    if not items:
        return []
    mirrored = BUILDERS[items[0].dataset].TWIN_OF
    key = lambda i: (i.question, i.relation, i.subject, i.counterfactual_answer, i.parametric_answer)  # noqa: E731
    theirs = {i.id: key(i) for i in build(mirrored, items[0].seed)}
    mine = {i.id for i in items}
    return [i.id for i in items if theirs.get(i.id) != key(i)] + sorted(set(theirs) - mine)


AGREE_RULES: dict[str, tuple[str, Callable[[list[Item]], list[str]]]] = {
    "schema": RULES["schema"],
    "answers_differ": RULES["answers_differ"],
    "agree_same_items": ("the twin has the ids, questions and answers of its counterfactual dataset (same seed)",
                         _not_the_same_items),
    "agree_true_answer_in_context": ("the context states the true (parametric) answer, and mentions_parametric says so",
                                     _true_answer_stated),
    "agree_no_counterfactual": ("no form of the counterfactual answer (answer or alias) is left in the context",
                                _counterfactual_left),
    "no_placeholder": RULES["no_placeholder"],
    "unique_ids": RULES["unique_ids"],
    "position_shares": RULES["position_shares"],
}


def rules_for_dataset(name: str | None) -> dict[str, tuple[str, Callable[[list[Item]], list[str]]]]:
    """The shared ``RULES`` plus the ``EXTRA_RULES`` of dataset ``name``'s builder, if it has any.

    A builder whose dataset makes promises of its own (ic_recall: the in-context pairs identify
    the relation) declares them next to the code that keeps them, in the same shape as ``RULES``.
    An agreeing twin (a builder with ``TWIN_OF``) has ``AGREE_RULES`` in place of ``RULES``.
    """
    builder = BUILDERS.get(name)
    shared = AGREE_RULES if hasattr(builder, "TWIN_OF") else RULES
    return {**shared, **getattr(builder, "EXTRA_RULES", {})}


def rules_for(items: list[Item]) -> dict[str, tuple[str, Callable[[list[Item]], list[str]]]]:
    """The rules for the dataset that made ``items``."""
    return rules_for_dataset(items[0].dataset if items else None)


def failures(items: list[Item]) -> list[str]:
    """One line per broken item rule, naming the rule and (up to 10 of) the offending ids."""
    lines = []
    for rule, (description, check) in rules_for(items).items():
        bad = check(items)
        if bad:
            shown = ", ".join(bad[:10]) + (f" (+{len(bad) - 10} more)" if len(bad) > 10 else "")
            lines.append(f"{rule}: {description} — broken by {len(bad)} item(s): {shown}")
    return lines


def determinism_failures(name: str, seed: int, items: list[Item]) -> list[str]:
    """Same seed must give the same bytes; another seed must change the substitutions."""
    lines = []
    if to_jsonl_bytes(build(name, seed)) != to_jsonl_bytes(items):
        lines.append(f"deterministic: rebuilding {name} with seed {seed} gave different bytes")
    other = {i.id: (i.counterfactual_answer, i.context) for i in build(name, seed + 1)}
    changed = sum(other.get(i.id) != (i.counterfactual_answer, i.context) for i in items)
    if changed < MIN_RESEED_CHANGE * len(items):
        lines.append(
            f"reseed: seed {seed + 1} changed only {changed} of {len(items)} {name} items "
            f"(need {MIN_RESEED_CHANGE:.0%})"
        )
    return lines


def check(items: list[Item]) -> None:
    lines = failures(items)
    if lines:
        raise ValidationError("\n".join(lines))


def build_validated(name: str, seed: int) -> list[Item]:
    """Build ``name`` and enforce every guarantee; raises ``ValidationError`` listing broken rules."""
    items = build(name, seed)
    lines = failures(items) + determinism_failures(name, seed, items)
    if lines:
        raise ValidationError(f"{name} (seed {seed}) failed validation:\n" + "\n".join(lines))
    return items


def rule_counts(items: list[Item]) -> dict[str, int]:
    """Every item rule of the dataset that made ``items`` with the number of items that break it."""
    return {rule: len(check(items)) for rule, (_, check) in rules_for(items).items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m dataset_builders.validate [--seed N] [DATASET ...]``: each rule's count of offending
    items over all items of each dataset (0 everywhere on a valid build); exit 1 when any is not."""
    import argparse

    from . import DEFAULT_SEED

    parser = argparse.ArgumentParser(prog="python -m dataset_builders.validate", description=main.__doc__)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("datasets", nargs="*", help="dataset names (default: all)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.datasets if n not in BUILDERS]
    if unknown:
        parser.error(f"unknown dataset(s) {', '.join(unknown)}; choose from {', '.join(sorted(BUILDERS))}")
    broken = 0
    for name in args.datasets or sorted(BUILDERS):
        items = build(name, args.seed)
        counts = rule_counts(items)
        broken += sum(counts.values())
        print(f"{name} (seed {args.seed}, {len(items)} items): "
              + ", ".join(f"{rule} {n}" for rule, n in counts.items()))
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
