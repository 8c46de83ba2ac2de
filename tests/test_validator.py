"""Each validator rule, shown to catch a defect injected into an otherwise valid build."""

from dataclasses import replace

import pytest

from dataset_builders import DEFAULT_SEED, build
from dataset_builders import validate
from dataset_builders.validate import ValidationError, build_validated, failures
from builds import built, assert_clean


def _first(items, **where):
    return next(i for i in items if all(getattr(i, k) == v for k, v in where.items()))


def _swap(items, old, new):
    return [new if i is old else i for i in items]


def inject_schema(items):
    return _swap(items, items[0], replace(items[0], answer_position="top")), items[0].id


def inject_answers_differ(items):
    item = items[0]
    return _swap(items, item, replace(item, counterfactual_answer=item.parametric_answer.upper())), item.id


def inject_cf_missing(items):
    item = items[0]
    return _swap(items, item, replace(item, context=item.context.replace(item.counterfactual_answer, "X"))), item.id


def inject_parametric_leak(items):
    item = next(i for i in items if not i.mentions_parametric)
    leaked = replace(item, context=item.context + f" Some say {item.parametric_answer.lower()}.")
    return _swap(items, item, leaked), item.id


def inject_parametric_accented(items):
    item = next(i for i in items if not i.mentions_parametric and i.parametric_answer.isalpha())
    accented = item.parametric_answer[:-1] + {"a": "á", "e": "é", "i": "í", "o": "ó", "u": "ú"}.get(
        item.parametric_answer[-1], item.parametric_answer[-1])
    leaked = replace(item, context=item.context + f" Not {accented.upper()}!")
    return _swap(items, item, leaked), item.id


def inject_name_fragment(items):
    item = _first(items, relation="person_name")
    surname = item.parametric_aliases[0]
    return _swap(items, item, replace(item, context=item.context + f" The town of {surname} rejoiced.")), item.id


def inject_placeholder(items):
    item = items[3]
    return _swap(items, item, replace(item, context=item.context + " {subject}")), item.id


def inject_duplicate_id(items):
    return _swap(items, items[5], replace(items[5], id=items[4].id)), items[4].id


def inject_position_imbalance(items):
    moved = [replace(i, answer_position="beginning") if i.answer_position == "end" else i for i in items]
    return moved, next(i.id for i in moved if i.answer_position == "beginning")


def inject_mention_in_default_dataset(items):
    item = items[7]
    return _swap(items, item, replace(item, mentions_parametric=True)), item.id


CASES = {
    "schema": ("cf_quotes", inject_schema),
    "answers_differ": ("cf_quotes", inject_answers_differ),
    "counterfactual_in_context": ("cf_world_facts", inject_cf_missing),
    "parametric_not_in_context": ("cf_world_facts", inject_parametric_leak),
    "no_name_fragment": ("cf_bio", inject_name_fragment),
    "no_placeholder": ("cf_bio", inject_placeholder),
    "unique_ids": ("cf_capitals", inject_duplicate_id),
    "position_shares": ("cf_world_facts", inject_position_imbalance),
    "mentions_parametric_split": ("cf_bio", inject_mention_in_default_dataset),
}


def test_every_rule_has_a_case():
    assert set(CASES) == set(validate.RULES)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_catches_injected_defect(rule):
    dataset, inject = CASES[rule]
    items = built(dataset)
    assert_clean(items)
    broken, bad_id = inject(items)
    lines = failures(broken)
    hit = [line for line in lines if line.startswith(rule + ":")]
    assert len(hit) == 1, lines
    assert bad_id in hit[0]
    assert "\n" not in hit[0]


def test_accent_and_case_insensitive_leak_is_caught():
    items = build("cf_world_facts", DEFAULT_SEED)
    broken, bad_id = inject_parametric_accented(items)
    assert any(line.startswith("parametric_not_in_context:") and bad_id in line for line in failures(broken))


def test_nondeterministic_builder_is_caught(monkeypatch):
    import itertools

    from dataset_builders import cf_quotes

    counter = itertools.count()
    real = cf_quotes.build

    def flaky(seed):
        items = real(seed)
        return [replace(items[0], question=items[0].question + "!" * next(counter)), *items[1:]]

    monkeypatch.setattr(cf_quotes, "build", flaky)
    with pytest.raises(ValidationError, match=r"deterministic: rebuilding cf_quotes with seed 3"):
        build_validated("cf_quotes", 3)


def test_seed_insensitive_builder_is_caught(monkeypatch):
    from dataset_builders import cf_quotes

    real = cf_quotes.build
    monkeypatch.setattr(cf_quotes, "build", lambda seed: [replace(i, seed=seed) for i in real(0)])
    with pytest.raises(ValidationError, match=r"reseed: seed 4 changed only 0 of"):
        build_validated("cf_quotes", 3)
