"""IC-recall (task_yamls/ic_recall, seeds/002): the relation loader, the builders' guarantees
(Assumptions 1 and 2, determinism), prompt snapshots, the scoring hooks, an end-to-end run
through the `lm_eval` command line with the tiny model, and the bundled SmolLM2 behind `slow`.

Regenerate the snapshots after an intended prompt change (and bump the task's metadata.version)
with ``UPDATE_SNAPSHOTS=1 python -m pytest tests/test_ic_recall.py``.
"""

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

import dataset_builders
from cf_tasks import ic_recall as hooks
from cf_tasks.registry import task_manager, task_yamls_path
from cf_tasks.results import tidy_rows
from cf_tasks.text import contains_any
from dataset_builders import DEFAULT_SEED, build, ic_recall, tables
from dataset_builders.serialize import to_jsonl_bytes, to_parquet_bytes
from dataset_builders.validate import ValidationError, build_validated, check, failures

SNAPSHOTS = Path(__file__).parent / "snapshots"
LM_EVAL = str(Path(sys.executable).with_name("lm_eval"))
DATASETS = ("ic_recall", "ic_recall_cf")
TASKS = ("ic_recall_k2", "ic_recall_k4", "ic_recall_k8", "ic_recall_cot_k2", "ic_recall_cot_k4",
         "ic_recall_cot_k8", "ic_recall_cf")


@pytest.fixture(scope="module")
def built():
    return {name: build_validated(name, DEFAULT_SEED) for name in DATASETS}


# The relation loader.

def test_loader_covers_every_table_and_names_each_relation():
    relations = ic_recall.relations_by_name()
    assert {"country_capital", "country_largest_city", "country_currency", "country_language",
            "country_continent", "birth_city", "death_city", "birth_year", "nationality"} <= set(relations)
    assert {r["relation"] for r in tables.relations()} <= set(relations)
    for name, relation in relations.items():
        assert relation.facts and relation.description
        # The description names its relation and no relation about the same subjects.
        assert ic_recall.names_relation(relation.description, name), name


def test_confusing_partners_come_from_the_data():
    # Assumption 2: relations that share subjects and agree on some of them.
    assert "country_largest_city" in ic_recall.partners("country_capital")
    assert "birth_city" in ic_recall.partners("death_city")
    assert "painting_painter" in ic_recall.competitors("painting_museum")
    assert "painting_painter" not in ic_recall.partners("painting_museum")  # a museum is never a painter
    assert ic_recall.partners("book_author") == ()


def test_stating_relations_sees_both_confusing_relations():
    france = ("France", "Paris")
    assert ic_recall.stating_relations([france]) == ("country_capital", "country_largest_city")
    assert ic_recall.stating_relations([france, ("Australia", "Canberra")]) == ("country_capital",)
    assert ic_recall.stating_relations([france, ("Australia", "Sydney")]) == ("country_largest_city",)
    assert ic_recall.stating_relations([france, ("Australia", "Paris")]) == ()


# The builders.

@pytest.mark.parametrize("name", DATASETS)
def test_same_seed_gives_identical_bytes_and_another_seed_other_prompts(name):
    assert to_jsonl_bytes(build(name, 7)) == to_jsonl_bytes(build(name, 7))
    assert to_parquet_bytes(build(name, 7)) == to_parquet_bytes(build(name, 7))
    a = {i.id: i.context for i in build(name, 1)}
    b = {i.id: i.context for i in build(name, 2)}
    assert sum(a.get(k) != b.get(k) for k in b) > 0.5 * len(b)


@pytest.mark.parametrize("name", DATASETS)
def test_build_passes_the_shared_and_the_ic_recall_rules(built, name):
    items = built[name]
    assert failures(items) == []
    assert {i.version for i in items} == {dataset_builders.version(name)}
    counts = Counter(ic_recall.pair_count(i.context) for i in items)
    assert set(counts) == set(ic_recall.K_VALUES) and len(set(counts.values())) == 1  # one third per k
    for item in items:
        pairs = ic_recall.parse_pairs(item.context)
        assert len(pairs) == ic_recall.pair_count(item.context)
        assert f"-k{len(pairs)}-" in item.id
        # The context never gives the query's answer: it must come from memory.
        assert not contains_any(item.context + "\n" + item.question, [item.parametric_answer, *item.parametric_aliases])


def test_every_k_asks_the_same_queries(built):
    by_k = {k: [(i.relation, i.subject) for i in built["ic_recall"] if ic_recall.pair_count(i.context) == k]
            for k in ic_recall.K_VALUES}
    assert by_k[2] == by_k[4] == by_k[8]
    assert len({r for r, _ in by_k[2]}) == len(ic_recall.load_relations())
    # Interleaved: a --limit prefix covers every relation.
    n = len(ic_recall.load_relations())
    assert len({r for r, _ in by_k[2][:n]}) == n


def test_ic_recall_pairs_are_true_and_identify_the_relation(built):
    for item in built["ic_recall"]:
        pairs = ic_recall.parse_pairs(item.context)
        assert ic_recall.stating_relations(pairs) == (item.relation,), item.id
        assert ic_recall.states(item.relation, item.subject, item.parametric_answer)
        assert item.counterfactual_answer == pairs[-1][1]  # the copy distractor: the last answer


def test_confusing_relations_get_confusing_pairs_and_telling_queries(built):
    # Assumption 2: half the pairs of a capital prompt are capitals that are also the largest city;
    # the query is a country whose largest city is another one.
    capitals = [i for i in built["ic_recall"] if i.relation == "country_capital"]
    for item in capitals:
        pairs = ic_recall.parse_pairs(item.context)
        agreeing = [p for p in pairs if ic_recall.states("country_largest_city", *p)]
        assert len(agreeing) == len(pairs) // 2, item.id
        query = ic_recall.Fact(item.subject, item.parametric_answer, tuple(item.parametric_aliases))
        assert not ic_recall.partner_accepted("country_capital", query)


def test_validator_rejects_an_ambiguous_prompt(built):
    items = built["ic_recall"]
    item = next(i for i in items if i.relation == "country_capital" and ic_recall.pair_count(i.context) == 2)
    same = [c for c in tables.countries() if c["capital"] == c["largest_city"] and c["name"] != item.subject]
    ambiguous = replace(item, context=ic_recall.context_text([(c["name"], c["capital"]) for c in same[:2]]),
                        counterfactual_answer=same[1]["capital"], counterfactual_aliases=[])
    wrong = replace(items[1], context=items[1].context.replace("\n", "\nFrance: Rome\n", 1))
    broken = [ambiguous if i is item else wrong if i is items[1] else i for i in items]
    with pytest.raises(ValidationError) as err:
        check(broken)
    lines = str(err.value).splitlines()
    assert len(lines) == 2  # one line per broken rule, each naming the ids
    assert lines[0].startswith("ic_layout:") and items[1].id in lines[0]  # 3 pairs: no k
    assert lines[1].startswith("ic_unique_relation: Assumption 1")
    assert item.id in lines[1] and items[1].id in lines[1] and "broken by 2 item(s)" in lines[1]


def test_ic_recall_cf_is_consistently_wrong_and_covers_the_query(built):
    items = built["ic_recall_cf"]
    assert len({i.relation for i in items}) >= 8
    for item in items:
        pairs = ic_recall.parse_pairs(item.context)
        truth = [ic_recall.true_answer(item.relation, s) for s, _ in pairs]
        assert all(t != ic_recall.key(a) for t, (_, a) in zip(truth, pairs)), item.id
        mapping = dict(zip(truth, (ic_recall.key(a) for _, a in pairs)))
        assert len(set(mapping.values())) == len(mapping)  # one permutation
        assert mapping[ic_recall.true_answer(item.relation, item.subject)] == ic_recall.key(item.counterfactual_answer)
        assert ic_recall.typed_relations(pairs) == (item.relation,)
    # Relations with a confusing partner of the same kind (birth / death city) are left out.
    assert not {"birth_city", "death_city", "country_capital"} & {i.relation for i in items}


def test_cf_validator_rejects_a_pair_that_shows_the_truth(built):
    items = built["ic_recall_cf"]
    item = items[0]
    subject, _ = ic_recall.parse_pairs(item.context)[0]
    fact = next(f for f in ic_recall.relations_by_name()[item.relation].facts if f.subject == subject)
    lines = item.context.split("\n")
    honest = replace(item, context="\n".join([ic_recall.pair_line(subject, fact.answer), *lines[1:]]))
    hit = [line for line in failures([honest, *items[1:]]) if line.startswith("ic_consistently_wrong:")]
    assert len(hit) == 1 and item.id in hit[0]


# Prompts.

@pytest.fixture(scope="module")
def loaded():
    return task_manager().load(list(TASKS))["tasks"]


@pytest.mark.parametrize("name", TASKS)
def test_prompt_snapshot(loaded, name):
    task = loaded[name]
    doc = task.test_docs()[0]
    rendered = task.doc_to_text(doc) + "\n--- target ---\n" + task.doc_to_target(doc)
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.write_text(rendered, encoding="utf-8")
    assert rendered == path.read_text(encoding="utf-8")


def test_sub_tasks_split_the_dataset_by_k(loaded):
    sizes = {name: len(loaded[name].test_docs()) for name in TASKS}
    assert sizes["ic_recall_k2"] == sizes["ic_recall_k4"] == sizes["ic_recall_k8"] == len(build("ic_recall")) // 3
    for k in ic_recall.K_VALUES:
        assert {ic_recall.pair_count(d["context"]) for d in loaded[f"ic_recall_k{k}"].test_docs()} == {k}
        assert loaded[f"ic_recall_cot_k{k}"].test_docs()[0] == loaded[f"ic_recall_k{k}"].test_docs()[0]
    for name, task in loaded.items():
        assert task.config.metadata["version"] >= 1.0, name


# Scoring hooks: cases as data.

DOC = {"relation": "country_capital", "counterfactual_answer": "Lima", "counterfactual_aliases": [],
       "parametric_answer": "Nairobi", "parametric_aliases": []}
IC_RECALL_CASES = [
    (" Nairobi\nEgypt: Cairo", {"answer_acc": 1.0, "copy_rate": 0.0}),
    ("\n\n Nairobi, of course", {"answer_acc": 1.0, "copy_rate": 0.0}),
    (" Lima\nEgypt: Nairobi", {"answer_acc": 0.0, "copy_rate": 1.0}),  # only the first line counts
    (" Nairobi or Lima", {"answer_acc": 1.0, "copy_rate": 1.0}),
    ("", {"answer_acc": 0.0, "copy_rate": 0.0}),
]
COT_CASES = [
    (" the capital of a country\nAnswer: Nairobi", {"relation_acc": 1.0, "answer_acc": 1.0}),
    (" capital cities\nanswer: Nairobbi\nKenya: Lima", {"relation_acc": 1.0, "answer_acc": 1.0}),  # a typo
    (" the largest city of a country\nAnswer: Nairobi", {"relation_acc": 0.0, "answer_acc": 1.0}),
    (" the capital and largest city\nAnswer: Lima", {"relation_acc": 0.0, "answer_acc": 0.0}),
    (" the capital. Nairobi", {"relation_acc": 1.0, "answer_acc": 0.0}),  # no "Answer:": no answer
]
RELATION_CASES = [
    ("birth_city", "the city where the person was born", True),
    ("birth_city", "birthplace", True),
    ("birth_city", "the year the person was born", False),
    ("death_city", "place of death", True),
    ("death_city", "the city where they were born and died", False),
    ("painting_museum", "the museum that displays the painting", True),
    ("painting_museum", "the artist who painted it", False),
    ("country_currency", "Money used in the country", True),
]


@pytest.mark.parametrize("generation,expected", IC_RECALL_CASES)
def test_ic_recall_scores_the_first_line(generation, expected):
    assert hooks.process_results(DOC, [generation]) == expected


@pytest.mark.parametrize("generation,expected", COT_CASES)
def test_cot_scores_relation_then_answer(generation, expected):
    assert hooks.process_results_cot(DOC, [generation]) == expected


@pytest.mark.parametrize("relation,text,expected", RELATION_CASES)
def test_names_relation(relation, text, expected):
    assert ic_recall.names_relation(text, relation) is expected


def test_cf_reuses_the_generation_metrics():
    doc = dict(DOC, counterfactual_answer="Lima")
    assert hooks.process_results_cf(doc, [" Lima\nPeru: Nairobi"])["counterfactual_acc"] == 1.0
    assert hooks.process_results_cf(doc, [" Lima\nPeru: Nairobi"])["parametric_acc"] == 0.0
    assert hooks.process_results_cf(doc, [" Nairobi"])["context_preference"] == "parametric"


# End to end.

@pytest.mark.slow
def test_lm_eval_cli_runs_the_ic_recall_tasks(tiny_model, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([
        LM_EVAL, "--model", "hf", "--model_args", f"pretrained={tiny_model},dtype=float32",
        "--tasks", "ic_recall,ic_recall_cot_k2,ic_recall_cf", "--include_path", str(task_yamls_path()),
        "--limit", "4", "--output_path", str(out), "--log_samples",
    ], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    raw = json.loads(next(out.rglob("results_*.json")).read_text())
    results = raw["results"]
    # The tidy rows `cf-tasks eval` and `cf-tasks sweep` write: one per task x metric, same names.
    rows = {(r["task"], r["metric"]): r for r in tidy_rows(raw)}
    assert {("ic_recall_k8", "answer_acc"), ("ic_recall", "copy_rate"), ("ic_recall_cot_k2", "relation_acc"),
            ("ic_recall_cf", "counterfactual_acc")} <= set(rows)
    assert rows[("ic_recall_k2", "answer_acc")]["version"] == float(dataset_builders.version("ic_recall"))
    for k in ic_recall.K_VALUES:
        for metric in hooks.IC_RECALL_METRICS:
            assert 0.0 <= results[f"ic_recall_k{k}"][f"{metric},none"] <= 1.0
    assert 0.0 <= results["ic_recall"]["answer_acc,none"] <= 1.0  # the group's aggregate
    for metric in hooks.COT_METRICS:
        assert 0.0 <= results["ic_recall_cot_k2"][f"{metric},none"] <= 1.0
    for metric in ("counterfactual_acc", "parametric_acc", "both_rate", "neither_rate"):
        assert 0.0 <= results["ic_recall_cf"][f"{metric},none"] <= 1.0
    # The reported rate is the mean of the per-item scores of the logged generations.
    samples = [json.loads(line) for line in next(out.rglob("samples_ic_recall_k4_*.jsonl")).open()]
    assert len(samples) == 4
    scores = [hooks.process_results(s["doc"], [s["filtered_resps"][0]])["answer_acc"] for s in samples]
    assert results["ic_recall_k4"]["answer_acc,none"] == pytest.approx(sum(scores) / 4)
    assert all(ic_recall.pair_count(s["doc"]["context"]) == 4 for s in samples)


@pytest.mark.slow
def test_smollm2_ic_recall_figures_per_k():
    """The bundled SmolLM2-135M-Instruct, raw prompts, on 20 items per k (20 of the 21 relations,
    the same queries for every k) and 20 of ``ic_recall_cf``."""
    from cf_tasks.default_model import default_model_path
    from cf_tasks.evaluate import run_lm_eval

    path = default_model_path()
    out = run_lm_eval("hf", ["ic_recall", "ic_recall_cf"], model_args=f"pretrained={path},dtype=float32,device=cpu",
                      limit=20)
    results = out["results"]
    figures = {k: {m: results[f"ic_recall_k{k}"][f"{m},none"] for m in hooks.IC_RECALL_METRICS}
               for k in ic_recall.K_VALUES}
    cf = {m: results["ic_recall_cf"][f"{m},none"] for m in ("counterfactual_acc", "parametric_acc")}
    for k, row in figures.items():
        print(f"SmolLM2 ic_recall_k{k}: " + ", ".join(f"{m}={v:.2f}" for m, v in row.items()))
    print("SmolLM2 ic_recall_cf: " + ", ".join(f"{m}={v:.2f}" for m, v in cf.items()))
    for row in [*figures.values(), cf]:
        assert all(0.0 <= v <= 1.0 for v in row.values())
    # A 135M model recalls some famous facts from the pattern alone, and more often than it copies
    # an in-context answer (seed 1234: answer_acc 0.25 / 0.30 / 0.20 and copy_rate 0.10 / 0.00 /
    # 0.05 for k = 2 / 4 / 8).
    assert figures[8]["answer_acc"] > 0.0
    mean = {m: sum(row[m] for row in figures.values()) / len(figures) for m in hooks.IC_RECALL_METRICS}
    assert mean["answer_acc"] > mean["copy_rate"]
