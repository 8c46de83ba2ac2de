"""The knowledge probe: ``<task>_known`` tasks, the probe of ``cf-tasks eval`` and
``sweep``, and the agreeing twins the sweep runs beside each knowledge-conflict task.

Every conditioned metric is checked against a hand computation from the samples of the task and
its ``_closedbook`` task, run separately."""

import json
import math
import shutil
import statistics
from pathlib import Path
from unittest import mock

import lm_eval
import pandas as pd
import pytest
from lm_eval.api.model import LM

from cf_tasks.cli import main
from cf_tasks.evaluate import knowledge_probe, run_lm_eval
from cf_tasks.known import KC_DATASETS, KC_TASKS, KNOWN_METRICS, agree_twin, closedbook_of, probe_for
from cf_tasks.registry import task_manager
from tiny_model import build_full_checkpoint

LIMIT = 4
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def hand_computed(task_samples: list[dict], closed_samples: list[dict]) -> dict[str, tuple[float, float | None]]:
    """(value, stderr) of each conditioned metric from the two prompts' samples: an item is known
    when its closed-book answer is parametric-correct; stderr = sample stdev / sqrt(n)."""
    closed = {s["doc"]["id"]: s["parametric_acc"] == 1.0 for s in closed_samples}
    groups: dict[str, list[float]] = {m: [] for m in KNOWN_METRICS}
    for s in task_samples:
        known = closed[s["doc"]["id"]]
        groups["known_rate"].append(float(known))
        if known:
            groups["known_counterfactual_acc"].append(s["counterfactual_acc"])
            groups["known_parametric_acc"].append(s["parametric_acc"])
        else:
            groups["unknown_counterfactual_acc"].append(s["counterfactual_acc"])
    return {m: (statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None)
            for m, xs in groups.items() if xs}


def reported(entry: dict) -> dict[str, tuple[float, float | None]]:
    out = {}
    for metric in KNOWN_METRICS:
        if f"{metric},none" in entry:
            stderr = entry[f"{metric}_stderr,none"]
            out[metric] = (entry[f"{metric},none"], None if stderr == "N/A" else stderr)
    return out


def assert_same(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for metric, (value, stderr) in expected.items():
        assert got[metric][0] == pytest.approx(value, abs=1e-12), metric
        assert got[metric][1] == pytest.approx(stderr, abs=1e-12), metric


class ScriptedLM(LM):
    """Answers from the item: closed-book, the parametric answer on every third item and a refusal
    on the others; with the passage, the counterfactual answer on the first seven items and the
    parametric one after. So every conditioned metric has items, and known and unknown items differ
    (4 of 12 known: 3/4 of them answered from the passage, 4/8 of the others)."""

    def generate_until(self, requests, disable_tqdm: bool = False):
        answers = []
        for r in requests:
            doc, prompt = r.doc, r.args[0]
            if doc["context"] not in prompt:  # the closed-book prompt
                answers.append(doc["parametric_answer"] if r.doc_id % 3 == 0 else "I am not sure.")
            else:
                answers.append(doc["counterfactual_answer"] if r.doc_id < 7 else doc["parametric_answer"])
        return answers

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError


@pytest.fixture(scope="module")
def chat_tiny(tiny_model, tmp_path_factory):
    """The tiny model with a chat template."""
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("chat_tiny") / "model"
    shutil.copytree(tiny_model, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return HFLM(pretrained=str(folder), dtype="float32", device="cpu", batch_size=4)


# ---------------------------------------------------------------- names
def test_every_knowledge_conflict_task_has_a_known_task_and_a_closedbook_task():
    index = set(task_manager().all_tasks)
    assert len(KC_TASKS) == 24
    for task in KC_TASKS:
        assert f"{task}_known" in index and closedbook_of(task) in index, task
    for other in ("cf_bio_closedbook", "cf_bio_mc", "ic_recall", "cf_bio_known", "arc_easy"):
        assert closedbook_of(other) is None
    assert agree_twin("cf_bio_alpaca", {"cf_bio_agree"}) == "cf_bio_agree"
    assert agree_twin("cf_bio_alpaca", {"cf_bio_agree", "cf_bio_alpaca_agree"}) == "cf_bio_alpaca_agree"
    assert agree_twin("cf_bio_alpaca", set()) is None and agree_twin("cf_bio_mc", {"cf_bio_agree"}) is None


def test_the_probe_of_a_group_adds_only_the_closedbook_tasks_not_already_in_the_pass():
    tm = task_manager()
    probe = knowledge_probe(["cf_suite", "cf_capitals_closedbook", "cf_capitals_mc"], tm)
    assert probe.pairs == {d: f"{d}_closedbook" for d in ("cf_bio", "cf_capitals", "cf_quotes", "cf_world_facts")}
    assert probe.extra == ("cf_bio_closedbook", "cf_quotes_closedbook", "cf_world_facts_closedbook")
    assert knowledge_probe(["cf_capitals_mc", "cf_capitals_known"], tm) is None


def test_known_tasks_render_the_task_prompt_and_the_closedbook_prompt_of_the_plain_tasks():
    tm = task_manager()
    for dataset in KC_DATASETS:
        names = [f"{dataset}_tulu", f"{dataset}_closedbook", f"{dataset}_tulu_known"]
        loaded = tm.load(names)["tasks"]
        for task in loaded.values():
            task.build_all_requests(limit=2, system_instruction="Answer briefly.")
        known = loaded[f"{dataset}_tulu_known"]
        assert [(i.doc_id, i.idx) for i in known.instances] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert [i.args[0] for i in known.instances if i.idx == 0] == [i.args[0] for i in loaded[names[0]].instances]
        assert [i.args[0] for i in known.instances if i.idx == 1] == [i.args[0] for i in loaded[names[1]].instances]
        assert [i.args[1] for i in known.instances if i.idx == 1] == [i.args[1] for i in loaded[names[1]].instances]
        assert all(i.args[0].startswith("Answer briefly.") for i in known.instances)


# ---------------------------------------------------------------- the conditioned metrics
@pytest.mark.parametrize("task", ["cf_capitals", "cf_bio_adhere"])
def test_known_task_equals_a_hand_computation_from_the_two_prompts_run_separately(task):
    closedbook = closedbook_of(task)
    apart = run_lm_eval(ScriptedLM(), [task, closedbook], limit=12, log_samples=True)
    expected = hand_computed(apart["samples"][task], apart["samples"][closedbook])
    assert expected.keys() == KNOWN_METRICS.keys()  # the script gives every condition items
    assert expected["known_rate"][0] == pytest.approx(4 / 12)
    assert expected["known_counterfactual_acc"][0] != expected["unknown_counterfactual_acc"][0]
    known = run_lm_eval(ScriptedLM(), [f"{task}_known"], limit=12)["results"][f"{task}_known"]
    assert_same(reported(known), expected)
    for metric in ("counterfactual_acc", "parametric_acc", "both_rate", "neither_rate", "context_preference"):
        assert known[f"{metric},none"] == apart["results"][task][f"{metric},none"]
    # The probe of cf-tasks eval / sweep gives the same numbers in the task's own results.
    probed = run_lm_eval(ScriptedLM(), [task], limit=12, knowledge=probe_for([task]))
    assert_same(reported(probed["results"][task]), expected)
    assert set(probed["results"]) == {task} and "samples" not in probed


def test_known_task_with_the_tiny_model_under_limit_and_chat_template(chat_tiny):
    task = "cf_quotes"
    apart = run_lm_eval(chat_tiny, [task, f"{task}_closedbook"], limit=LIMIT, log_samples=True,
                        apply_chat_template=True)
    known = run_lm_eval(chat_tiny, [f"{task}_known"], limit=LIMIT, log_samples=True, apply_chat_template=True)
    samples = known["samples"][f"{task}_known"]
    assert len(samples) == LIMIT and known["n-samples"][f"{task}_known"]["effective"] == LIMIT
    # Both prompts got the chat template exactly as the plain tasks did, and the same answers.
    for s, own, closed in zip(samples, apart["samples"][task], apart["samples"][f"{task}_closedbook"]):
        assert s["arguments"][0][0] == own["arguments"][0][0] and s["arguments"][1][0] == closed["arguments"][0][0]
        assert s["arguments"][0][0].startswith("<|user|>") and s["arguments"][1][0].endswith("<|assistant|> ")
        assert s["filtered_resps"] == [own["filtered_resps"][0], closed["filtered_resps"][0]]
    expected = hand_computed(apart["samples"][task], apart["samples"][f"{task}_closedbook"])
    assert_same(reported(known["results"][f"{task}_known"]), expected)


# ---------------------------------------------------------------- cf-tasks eval
@pytest.fixture
def simple_evaluate_calls():
    """lm_eval.simple_evaluate, recorded (and run)."""
    with mock.patch.object(lm_eval, "simple_evaluate", autospec=True, side_effect=lm_eval.simple_evaluate) as spy:
        yield spy.call_args_list


def test_eval_adds_the_knowledge_metrics_in_one_pass_on_the_same_items(tiny_model, tmp_path, simple_evaluate_calls):
    out = tmp_path / "out"
    assert main(["eval", "--model_args", f"pretrained={tiny_model},dtype=float32", "--tasks", "cf_capitals",
                 "--limit", str(LIMIT), "--device", "cpu", "--output_path", str(out)]) == 0
    (call,) = simple_evaluate_calls
    assert call.kwargs["tasks"] == ["cf_capitals", "cf_capitals_closedbook"] and call.kwargs["limit"] == LIMIT
    results = json.loads((out / "results.json").read_text())
    assert set(results["results"]) == {"cf_capitals"}  # the closed-book pass is the probe's, not a result
    assert not list(out.glob("samples_cf_capitals_closedbook*"))
    samples = [json.loads(line) for line in (out / "samples_cf_capitals.jsonl").read_text().splitlines()]
    assert len(samples) == LIMIT and all(s["known_rate"] in (0.0, 1.0) for s in samples)
    assert results["higher_is_better"]["cf_capitals"]["known_parametric_acc"] is False

    apart = run_lm_eval("hf", ["cf_capitals", "cf_capitals_closedbook"], limit=LIMIT, log_samples=True,
                        model_args=f"pretrained={tiny_model},dtype=float32,device=cpu")
    expected = hand_computed(apart["samples"]["cf_capitals"], apart["samples"]["cf_capitals_closedbook"])
    assert "known_rate" in expected
    assert_same(reported(results["results"]["cf_capitals"]), expected)
    csv = pd.read_csv(out / "results.csv")
    assert set(expected) <= set(csv["metric"])


def test_eval_no_knowledge_runs_the_task_alone(tiny_model, tmp_path, simple_evaluate_calls):
    out = tmp_path / "out"
    assert main(["eval", "--model_args", f"pretrained={tiny_model},dtype=float32", "--tasks", "cf_capitals",
                 "--limit", "2", "--device", "cpu", "--output_path", str(out), "--no_knowledge"]) == 0
    (call,) = simple_evaluate_calls
    assert call.kwargs["tasks"] == ["cf_capitals"]
    entry = json.loads((out / "results.json").read_text())["results"]["cf_capitals"]
    assert "counterfactual_acc,none" in entry and not any(k.startswith(tuple(KNOWN_METRICS)) for k in entry)


# ---------------------------------------------------------------- cf-tasks sweep
AGREE_YAML = """include: {base}
task: cf_capitals_agree
tag: []
process_results: !function agree_utils.agree_results
metric_list:
  - metric: agree_acc
    aggregation: mean
    higher_is_better: true
"""
AGREE_UTILS = '''from cf_tasks.tasks import score_doc


def agree_results(doc, results):
    return {"agree_acc": float(score_doc(doc, results[0]).parametric)}
'''


@pytest.fixture
def with_agree_twin(tmp_path, monkeypatch):
    """A stand-in ``cf_capitals_agree`` task (the agree branch makes the real ones) in an extra
    task folder that the sweep's task manager indexes."""
    import cf_tasks.registry as registry
    from lm_eval.tasks import TaskManager

    folder = tmp_path / "agree_tasks"
    folder.mkdir()
    (folder / "cf_capitals_agree.yaml").write_text(
        AGREE_YAML.format(base=registry.task_yamls_path() / "cf_capitals" / "cf_capitals.yaml"))
    (folder / "agree_utils.py").write_text(AGREE_UTILS)
    monkeypatch.setattr(registry, "task_manager", lambda include_defaults=False, metadata=None: TaskManager(
        include_path=[str(registry.task_yamls_path()), str(folder)], include_defaults=False, metadata=metadata))


def test_sweep_rows_gain_the_knowledge_metrics_and_the_agree_twin(tiny_model, tmp_path, with_agree_twin):
    from matplotlib.axes import Axes

    from cf_tasks.sweep import SweepConfig, run_sweep

    run = tmp_path / "run"
    for step in (1, 2):
        build_full_checkpoint(tiny_model, run / f"checkpoint-{step}", seed=step)
    out = tmp_path / "out"
    with mock.patch.object(Axes, "errorbar", autospec=True, side_effect=Axes.errorbar) as drawn:
        assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, limit=LIMIT, device="cpu"),
                         log=lambda *a, **k: None) == 0
    frame = pd.read_csv(out / "sweep.csv")
    assert set(frame["task"]) == {"cf_capitals", "cf_capitals_agree"}
    assert set(frame[frame.task == "cf_capitals_agree"]["metric"]) == {"agree_acc"}
    # checkpoint-2 (its weights swapped into checkpoint-1's model) against a fresh run of the two prompts
    rows = frame[(frame.task == "cf_capitals") & (frame.step == 2)].set_index("metric")
    apart = run_lm_eval("hf", ["cf_capitals", "cf_capitals_closedbook"], limit=LIMIT, log_samples=True,
                        model_args=f"pretrained={run / 'checkpoint-2'},dtype=float32,device=cpu")
    expected = hand_computed(apart["samples"]["cf_capitals"], apart["samples"]["cf_capitals_closedbook"])
    got = {m: (rows.loc[m, "value"], None if pd.isna(rows.loc[m, "stderr"]) else rows.loc[m, "stderr"])
           for m in KNOWN_METRICS if m in rows.index}
    assert_same(got, expected)
    assert rows.loc["counterfactual_acc", "value"] == pytest.approx(apart["results"]["cf_capitals"]["counterfactual_acc,none"])
    assert set(frame[frame.task == "cf_capitals"].groupby("step")["metric"].apply(frozenset)) == {frozenset(rows.index)}
    records = [json.loads(p.read_text()) for p in out.glob("store/*/cf_capitals/*/record.json")]
    assert {json.dumps(r["settings"]["knowledge"]) for r in records} == {'{"cf_capitals": "cf_capitals_closedbook"}'}
    samples = [json.loads(line) for f in out.glob("checkpoints/checkpoint-1/samples_cf_capitals.jsonl")
               for line in f.read_text().splitlines()]
    assert len(samples) == LIMIT and all("known_rate" in s for s in samples)
    # The plot: known items in their own line style, the twin's agree_acc as its own line.
    # (each label ends with its n: "counterfactual_acc (n=3)")
    styles = {c.kwargs["label"].split(" (n=")[0]: c.kwargs.get("linestyle", "-") for c in drawn.call_args_list}
    assert all(c.kwargs["label"].endswith(")") and " (n=" in c.kwargs["label"] for c in drawn.call_args_list)
    assert styles["counterfactual_acc"] == styles["parametric_acc"] == "-"
    conditioned = {m: styles[m] for m in KNOWN_METRICS if m in styles}
    assert conditioned and all(style != "-" for style in conditioned.values())
    assert "cf_capitals_agree agree_acc" in styles

    # --no_knowledge --no_agree into the same folder: other settings, kept apart, none of the four.
    assert run_sweep(SweepConfig(run_dir=run, tasks=["cf_capitals"], output_path=out, limit=LIMIT, device="cpu",
                                 knowledge=False, agree=False), log=lambda *a, **k: None) == 0
    frame = pd.read_csv(out / "sweep.csv")
    by_settings = {s: set(g["metric"]) for s, g in frame[frame.task == "cf_capitals"].groupby("settings")}
    assert len(by_settings) == 2
    plain = [m for m in by_settings.values() if not m & set(KNOWN_METRICS)]
    assert len(plain) == 1 and "counterfactual_acc" in plain[0]


def test_settings_without_the_probe_keep_the_hash_of_earlier_stores():
    from cf_tasks.sweep import SweepConfig, task_settings

    tm = task_manager()
    cfg = SweepConfig(run_dir=Path("."), tasks=["cf_capitals", "cf_capitals_mc"], output_path=Path("o"), limit=3)
    on = task_settings(cfg, tm)
    off = task_settings(SweepConfig(**{**cfg.__dict__, "knowledge": False}), tm)
    assert on["cf_capitals"]["knowledge"] == {"cf_capitals": "cf_capitals_closedbook"}
    # Earlier stores wrote these very keys: a result without the probe keeps its hash.
    assert off["cf_capitals"] == {k: v for k, v in on["cf_capitals"].items() if k != "knowledge"}
    assert "knowledge" not in on["cf_capitals_mc"] and on["cf_capitals_mc"] == off["cf_capitals_mc"]
    # The agreeing twin runs beside its knowledge-conflict task, without the probe.
    assert set(on) == {"cf_capitals", "cf_capitals_mc", "cf_capitals_agree"} and "knowledge" not in on["cf_capitals_agree"]
    no_twin = task_settings(SweepConfig(**{**cfg.__dict__, "agree": False}), tm)
    assert set(no_twin) == {"cf_capitals", "cf_capitals_mc"}


def test_the_knowledge_conflict_family_is_the_datasets_with_an_agreeing_twin():
    from cf_tasks.registry import KC_DATASETS, twin_name
    from dataset_builders import AGREE_TWINS

    assert set(KC_DATASETS) == set(AGREE_TWINS)
    assert all(AGREE_TWINS[d] == twin_name(d) for d in KC_DATASETS)
