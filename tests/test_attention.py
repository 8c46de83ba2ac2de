"""`--attention`: the attention of the position that predicts the first answer token on the context
passage (cf_tasks/attention.py), checked against a direct ``output_attentions=True`` computation
done here by hand, with and without a chat template; generation is untouched; vLLM refuses it."""

import csv
import json
import shutil

import pytest

from cf_tasks.attention import context_span, span_mask
from cf_tasks.cli import main
from cf_tasks.evaluate import run_lm_eval
from cf_tasks.sweep import SweepConfig, run_sweep
from tiny_model import build_lora_adapter

QUIET = {"log": lambda *a, **k: None}
CHAT_TEMPLATE = ("{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
                 "{% if add_generation_prompt %}<s> assistant : {% endif %}")


def _samples(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _prompt(sample):
    return sample["arguments"][0][0]


def _direct(model_path, prompt, context, adapter=None):
    """Per layer: the last position's attention on the context tokens, summed, averaged over heads.
    The span by hand: the word-level tokenizer splits at spaces and punctuation, so the context's
    tokens are those of the text up to its end, less those of the text before it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    start = prompt.index(context)
    special = {"add_special_tokens": not prompt.startswith(tok.bos_token)}
    ids = tok(prompt, **special)["input_ids"]
    first = len(tok(prompt[:start], **special)["input_ids"])
    last = len(tok(prompt[:start + len(context)], **special)["input_ids"])
    assert ids[:last] == tok(prompt[:start + len(context)], **special)["input_ids"]
    assert 0 < first < last < len(ids)
    model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="eager", dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    with torch.no_grad():
        attentions = model(torch.tensor([ids]), output_attentions=True).attentions
    return [float(a[0, :, -1, first:last].sum(-1).mean()) for a in attentions], first


def test_span_mask_takes_the_tokens_that_overlap_the_context():
    prompt = "Background: Lyon is big.\nQuestion: x"
    span = context_span(prompt, "Lyon is big.")
    assert span == (12, 24)
    # special token (0, 0); "Background:"; " Lyon" with its space; "is"; "big."; "\nQuestion"
    offsets = [(0, 0), (0, 11), (11, 16), (17, 19), (20, 24), (24, 33)]
    assert span_mask(offsets, span) == [False, False, True, True, True, False]
    assert context_span(prompt, "Paris") is None


@pytest.mark.slow
def test_eval_attention_equals_a_direct_computation_and_lies_in_unit_interval(tiny_model, tmp_path):
    out = tmp_path / "out"
    assert main(["eval", "--model_args", f"pretrained={tiny_model},dtype=float32", "--device", "cpu",
                 "--tasks", "cf_suite", "--limit", "2", "--output_path", str(out), "--attention"]) == 0
    results = json.loads((out / "results.json").read_text())
    every = []
    for task in ("cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes"):
        samples = _samples(out / f"samples_{task}.jsonl")
        assert len(samples) == 2
        values = [s["context_attention"] for s in samples]
        every += values
        for s in samples:
            assert all(0.0 <= x <= 1.0 for x in s["context_attention_per_layer"])
            assert s["context_attention"] == pytest.approx(sum(s["context_attention_per_layer"]) / 2)
        assert results["results"][task]["context_attention,none"] == pytest.approx(sum(values) / 2)
        assert 0.0 < results["results"][task]["context_attention,none"] < 1.0
        assert results["attention"][task]["layers"] == 2 and results["attention"][task]["n"] == 2
    assert results["results"]["cf_suite"]["context_attention,none"] == pytest.approx(sum(every) / len(every))
    rows = {(r["task"], r["metric"]) for r in csv.DictReader((out / "results.csv").open())}
    assert ("cf_capitals", "context_attention") in rows

    sample = _samples(out / "samples_cf_capitals.jsonl")[1]
    doc = sample["doc"]
    assert _prompt(sample) == f"Background: {doc['context']}\nQuestion: {doc['question']}\nAnswer:"
    direct, _ = _direct(tiny_model, _prompt(sample), doc["context"])
    assert sample["context_attention_per_layer"] == pytest.approx(direct, abs=1e-5)


@pytest.fixture(scope="module")
def chat_model(tiny_model, tmp_path_factory):
    """The tiny model with a chat template whose text starts with the BOS token."""
    folder = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_chat_template_span_equals_a_direct_computation(chat_model, tiny_model):
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    from cf_tasks.attention import encode

    results = run_lm_eval("hf", ["cf_capitals"], model_args=f"pretrained={chat_model},dtype=float32,device=cpu",
                          limit=2, apply_chat_template=True, log_samples=True, attention=True)
    sample = results["samples"]["cf_capitals"][0]
    doc = sample["doc"]
    text = f"Background: {doc['context']}\nQuestion: {doc['question']}\nAnswer:"
    tok = AutoTokenizer.from_pretrained(chat_model)
    by_hand = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    assert _prompt(sample) == by_hand and by_hand.startswith("<s> user : Background:")
    direct, first = _direct(chat_model, by_hand, doc["context"])
    assert sample["context_attention_per_layer"] == pytest.approx(direct, abs=1e-5)
    _, plain_first = _direct(tiny_model, text, doc["context"])
    assert first == plain_first + 3  # "<s> user :" moved the span; the BOS was not added twice
    # The probe reads the token ids lm-eval generates from.
    lm = HFLM(pretrained=str(chat_model), device="cpu", dtype="float32")
    ids, _ = encode(lm, by_hand)
    assert ids == lm.tok_batch_encode([by_hand])[0][0].tolist()


def _answers(results):
    return {t: [s["resps"] for s in samples] for t, samples in results["samples"].items()}


@pytest.mark.slow
def test_generation_is_unchanged_and_sdpa_restored(tiny_model):
    from lm_eval.models.huggingface import HFLM

    args = {"limit": 3, "batch_size": 2, "log_samples": True}
    tasks = ["cf_capitals", "cf_quotes"]
    plain = run_lm_eval("hf", tasks, model_args=f"pretrained={tiny_model},dtype=float32,device=cpu", **args)
    lm = HFLM(pretrained=str(tiny_model), device="cpu", dtype="float32", batch_size=2)
    before = lm.model.config._attn_implementation
    assert before != "eager"  # else the switch would not be tested
    probed = run_lm_eval(lm, tasks, attention=True, **args)
    assert lm.model.config._attn_implementation == before
    after = run_lm_eval(lm, tasks, **args)
    assert _answers(plain) == _answers(probed) == _answers(after)
    assert "context_attention,none" in probed["results"]["cf_quotes"]
    assert "context_attention,none" not in after["results"]["cf_quotes"]


@pytest.mark.slow
def test_sweep_attention_is_a_setting_and_follows_the_adapter(tiny_model, tmp_path):
    run = tmp_path / "run"
    for step, seed in ((10, 11), (20, 12)):
        build_lora_adapter(tiny_model, run / f"step_{step}", seed)
    out = tmp_path / "out"
    tasks = ["cf_capitals", "cf_capitals_mc"]
    common = {"run_dir": run, "tasks": tasks, "output_path": out, "backend": "hf", "limit": 2, "device": "cpu",
              "batch_size": 2}
    assert run_sweep(SweepConfig(**common, attention=True), **QUIET) == 0
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    values = {r["checkpoint"]: float(r["value"]) for r in rows
              if r["task"] == "cf_capitals" and r["metric"] == "context_attention"}
    assert set(values) == {"step_10", "step_20"} and all(0 <= v <= 1 for v in values.values())
    assert values["step_10"] != values["step_20"]  # the adapters (on q_proj) move the attention
    assert not [r for r in rows if r["task"] == "cf_capitals_mc" and r["metric"] == "context_attention"]
    records = {r["task"]: r for r in (json.loads(p.read_text()) for p in (out / "store").glob("*/*/*/record.json"))}
    assert records["cf_capitals"]["settings"]["attention"]["metric"] == "context_attention"
    assert "attention" not in records["cf_capitals_mc"]["settings"]
    # The second adapter (scored from the group's shared batches): its own attention, by hand.
    view = out / "checkpoints" / "step_20"
    sample = _samples(view / "samples_cf_capitals.jsonl")[0]
    direct, _ = _direct(tiny_model, _prompt(sample), sample["doc"]["context"], adapter=run / "step_20")
    assert sample["context_attention_per_layer"] == pytest.approx(direct, abs=1e-5)
    per_layer = json.loads((view / "results.json").read_text())["attention"]["cf_capitals"]["per_layer"]
    assert len(per_layer) == 2

    # Without --attention into the same folder: a result of its own for cf_capitals, none for the _mc task.
    before = set((out / "store").glob("*/*/*/record.json"))
    assert run_sweep(SweepConfig(**common), **QUIET) == 0
    added = set((out / "store").glob("*/*/*/record.json")) - before
    assert sorted(p.parent.parent.name for p in added) == ["cf_capitals", "cf_capitals"]
    with_attention = {p.parent.parent.parent.name: p.parent for p in before if p.parent.parent.name == "cf_capitals"}
    for p in added:
        plain = [s["resps"] for s in _samples(p.parent / "samples_cf_capitals.jsonl")]
        probed = [s["resps"] for s in _samples(with_attention[p.parent.parent.parent.name] / "samples_cf_capitals.jsonl")]
        assert plain == probed


def test_vllm_refuses_attention_before_any_model_loads(tiny_model, tmp_path, capsys, made_backends, monkeypatch):
    import cf_tasks.evaluate as evaluate

    run = tmp_path / "run"
    shutil.copytree(tiny_model, run / "checkpoint-1")
    assert main(["sweep", str(run), "--output_path", str(tmp_path / "o"), "--backend", "vllm", "--attention"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--attention is unavailable with --backend vllm" in err[0] and "--backend hf" in err[0]
    assert made_backends == [] and not (tmp_path / "o").exists()

    calls = []
    monkeypatch.setattr(evaluate, "run_lm_eval", lambda *a, **k: calls.append(a))
    assert main(["eval", "--model", "vllm", "--model_args", f"pretrained={tiny_model}", "--attention"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--attention is unavailable with --model vllm" in err[0]
    assert calls == []


@pytest.mark.slow
def test_attention_is_a_setting_only_of_the_tasks_it_measures(tmp_path):
    from cf_tasks.registry import task_manager
    from cf_tasks.sweep import task_settings
    from cf_tasks.sweep.store import settings_hash

    tm = task_manager()
    tasks = ["cf_capitals", "cf_capitals_closedbook", "cf_suite"]
    plain, probed = ({t: settings_hash(s) for t, s in task_settings(
        SweepConfig(run_dir=tmp_path, tasks=tasks, output_path=tmp_path, limit=2, attention=a), tm).items()}
        for a in (False, True))
    assert plain["cf_capitals_closedbook"] == probed["cf_capitals_closedbook"]
    assert plain["cf_capitals"] != probed["cf_capitals"] and plain["cf_suite"] != probed["cf_suite"]
    # Without --attention the settings are what they were before it existed: stored results stay valid.
    assert "attention" not in task_settings(SweepConfig(run_dir=tmp_path, tasks=tasks, output_path=tmp_path,
                                                         limit=2), tm)["cf_suite"]
