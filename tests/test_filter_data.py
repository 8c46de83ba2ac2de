"""``cf-tasks filter-data`` (context-critical filtering) on the tiny model: losses, selection,
resumption, input formats and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest

from cf_tasks.cli import main
from cf_tasks.mitigations import filter as filt
from cf_tasks.mitigations import filter_input, filter_scoring

WORDS = "paris lyon rome london capital city born year quote answer question background".split()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_filter"), [" ".join(WORDS)])


def alpaca_rows(count: int = 10) -> list[dict]:
    rows = []
    for i in range(count):
        w = WORDS[i % len(WORDS)]
        v = WORDS[(3 * i + 1) % len(WORDS)]
        rows.append({"id": f"ex{i:02d}", "kind": "C" if i % 2 else "C+S",
                     "instruction": f"what is the capital of {w} ?",
                     "input": f"the capital of {w} is {v} . background {v} city" if i % 4 != 3 else "",
                     "output": f"{v} is the capital"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(data, model, out, *extra) -> int:
    return main(["filter-data", str(data), "--model", str(model), "--output_path", str(out), "--quiet", *extra])


def output_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if not p.name.startswith("scoring-")}


def direct_loss(model_dir: Path, prompt: str, target: str) -> float:
    """The mean target-token cross-entropy of one unpadded forward pass, written out independently."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt_ids = tok(prompt)["input_ids"]
    target_ids = tok(target, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + target_ids])
    with torch.no_grad():
        logp = torch.log_softmax(lm(input_ids=ids).logits[0].float(), dim=-1)
    picks = [-logp[len(prompt_ids) + k - 1, t].item() for k, t in enumerate(target_ids)]
    return sum(picks) / len(picks)


def test_losses_equal_single_example_forward_passes(model, tmp_path):
    rows = alpaca_rows(6)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    assert run(data, model, tmp_path / "out", "--batch_size", "3") == 0
    scores = pd.read_parquet(tmp_path / "out" / "scores.parquet").set_index("id")
    for row in rows[:2]:  # two examples of different lengths, padded in one batch
        with_ctx = direct_loss(model, filter_input.ALPACA_WITH.format(instruction=row["instruction"], input=row["input"]),
                               row["output"])
        without = direct_loss(model, filter_input.ALPACA_WITHOUT.format(instruction=row["instruction"]), row["output"])
        assert scores.loc[row["id"], "loss_with"] == pytest.approx(with_ctx, abs=1e-5)
        assert scores.loc[row["id"], "loss_without"] == pytest.approx(without, abs=1e-5)
        assert scores.loc[row["id"], "gap"] == pytest.approx(without - with_ctx, abs=1e-5)
    assert with_ctx != pytest.approx(without, abs=1e-4)  # the context does move the loss


def test_drop_share_counts_context_examples_and_keeps_lines_intact(model, tmp_path):
    rows = alpaca_rows(12)  # rows 3, 7, 11 have no context
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "out"
    assert run(data, model, out, "--drop", "0.25") == 0
    scores = pd.read_parquet(out / "scores.parquet")
    assert list(scores.columns) == ["id", "line", "loss_with", "loss_without", "gap", "kept"]
    assert len(scores) == 9 and (~scores.kept).sum() == 2  # round(0.25 * 9)
    dropped_ids = set(scores.loc[~scores.kept, "id"])
    # the paper's rule: the lowest loss without the context
    assert dropped_ids == set(scores.sort_values(["loss_without", "id"]).id[:2])
    lines = data.read_text().splitlines()
    kept = (out / "kept.jsonl").read_text().splitlines()
    dropped = (out / "dropped.jsonl").read_text().splitlines()
    assert sorted(kept + dropped) == sorted(lines)  # every line once, byte for byte, extra fields kept
    assert {json.loads(x)["id"] for x in dropped} == dropped_ids
    assert all(json.loads(x)["id"] in {"ex03", "ex07", "ex11"} or json.loads(x)["id"] not in dropped_ids
               for x in kept)
    report = (out / "report.md").read_text()
    assert "dropped 2 of the 9 context-bearing examples" in report
    assert (out / "gap_histogram.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_by_gap_and_context_only(model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", alpaca_rows(12))
    out = tmp_path / "out"
    assert run(data, model, out, "--drop", "0.5", "--by", "gap", "--context_only") == 0
    scores = pd.read_parquet(out / "scores.parquet")
    gaps = scores.assign(g=scores.loss_without - scores.loss_with)
    expected = set(gaps.sort_values(["g", "id"]).id[:5])  # round(0.5 * 9), half up
    assert set(scores.loc[~scores.kept, "id"]) == expected
    dropped = {json.loads(x)["id"] for x in (out / "dropped.jsonl").read_text().splitlines()}
    assert dropped == expected | {"ex03", "ex07", "ex11"}
    assert len((out / "kept.jsonl").read_text().splitlines()) == 4


def test_deterministic_across_runs(model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", alpaca_rows(10))
    assert run(data, model, tmp_path / "a") == 0
    assert run(data, model, tmp_path / "b") == 0
    assert output_bytes(tmp_path / "a") == output_bytes(tmp_path / "b")


def test_ties_go_by_id():
    rows = [("b", 1, 0.5, 1.0), ("a", 2, 0.5, 1.0), ("c", 3, 0.1, 2.0)]
    assert filter_scoring.select(rows, 0.34, "loss") == {"a"}
    assert filter_scoring.select(rows, 0.67, "loss") == {"a", "b"}
    assert filter_scoring.select(rows, 0.34, "gap") == {"a"}


def test_kill_during_scoring_then_rerun_equals_one_run(model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", alpaca_rows(12))
    assert run(data, model, tmp_path / "once", "--batch_size", "2") == 0

    real = filter_scoring.score_batch
    calls = []

    def dies_after_two(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    out = tmp_path / "resumed"
    with mock.patch.object(filter_scoring, "score_batch", autospec=True, side_effect=dies_after_two):
        assert run(data, model, out, "--batch_size", "2") == 130
    assert not (out / "scores.parquet").exists()
    logs = list(out.glob("scoring-*.jsonl"))
    assert len(logs) == 1 and len(logs[0].read_text().splitlines()) == 3  # identity + two batches
    with logs[0].open("ab") as fh:
        fh.write(b'{"batch": 2, "rows": [["ex0')  # a line torn by the kill
    with mock.patch.object(filter_scoring, "score_batch", autospec=True, side_effect=real) as scorer:
        assert run(data, model, out, "--batch_size", "2") == 0
    assert scorer.call_count == 3  # 9 context examples in batches of 2: 5 batches, 2 were done
    assert output_bytes(out) == output_bytes(tmp_path / "once")


def test_other_settings_start_another_scoring_log(model, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", alpaca_rows(6))
    out = tmp_path / "out"
    assert run(data, model, out, "--batch_size", "2") == 0
    assert run(data, model, out, "--batch_size", "3") == 0
    assert len(list(out.glob("scoring-*.jsonl"))) == 2
    with mock.patch.object(filter_scoring, "score_batch", autospec=True) as scorer:  # same settings: nothing to score
        assert run(data, model, out, "--batch_size", "2", "--drop", "0.5") == 0
    assert scorer.call_count == 0


def test_chat_messages_with_template(model, tmp_path):
    import shutil

    chat_model = tmp_path / "chat_model"
    shutil.copytree(model, chat_model)
    config = json.loads((chat_model / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
                               "{% if add_generation_prompt %}assistant : {% endif %}")
    (chat_model / "tokenizer_config.json").write_text(json.dumps(config))
    rows = [
        {"messages": [{"role": "user", "content": "background paris city\n\nwhat is the capital ?"},
                      {"role": "assistant", "content": "paris"}]},
        {"messages": [{"role": "user", "content": "what is the capital ?"},
                      {"role": "assistant", "content": "rome"}]},
        {"messages": [{"role": "system", "content": "answer"},
                      {"role": "user", "content": "the capital is lyon\n\nwhat is the capital ?"},
                      {"role": "assistant", "content": "lyon"}]},
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "out"
    assert run(data, chat_model, out, "--drop", "0.5") == 0
    scores = pd.read_parquet(out / "scores.parquet")
    assert list(scores.id) == ["1", "3"]  # line numbers: the second example has no context
    want = direct_loss(chat_model, "user : what is the capital ? </s> assistant : ", "paris")
    got = scores.set_index("id").loc["1", "loss_without"]
    assert got == pytest.approx(want, abs=1e-5)
    kept = (out / "kept.jsonl").read_text().splitlines()
    assert json.loads(kept[0]) == rows[1] or json.loads(kept[1]) == rows[1]


def test_datasets_folder_input(model, tmp_path):
    import datasets

    folder = tmp_path / "ds"
    datasets.Dataset.from_list(alpaca_rows(8)).save_to_disk(str(folder))
    out = tmp_path / "out"
    assert run(folder, model, out, "--drop", "0.5") == 0
    kept, dropped = datasets.load_from_disk(str(out / "kept")), datasets.load_from_disk(str(out / "dropped"))
    assert len(kept) + len(dropped) == 8 and len(dropped) == 3  # round(0.5 * 6 context examples)
    assert set(dropped["id"]) == set(pd.read_parquet(out / "scores.parquet").query("~kept").id)


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("\n\n", "has no examples"),
    ('{"instruction": "a", "input": "b", "output": "c"}\n{"instruction": "a", "input": \n', "line 2: not valid JSON"),
    ('[1, 2]\n', "line 1: a JSON list, not an object"),
    ('{"instruction": "a", "output": "c"}\n', "no example has a 'input' field; name the context field"),
    ('{"instruction": "a", "input": "", "output": "c"}\n', "no example carries a context"),
    ('{"prompt": "a"}\n', "line 1: neither a 'messages' list nor"),
    ('{"id": 1, "instruction": "a", "input": "b", "output": "c"}\n{"id": 1, "instruction": "a", "input": "b", '
     '"output": "c"}\n', "line 2: id '1' is also on 1"),
    ('{"instruction": "a", "input": "b", "output": "' + "paris " * 600 + '"}\n',
     "line 1: the example is 6"),
])
def test_bad_input_is_one_line_exit_2(model, tmp_path, capsys, content, message):
    data = tmp_path / "bad.jsonl"
    data.write_text(content)
    with mock.patch.object(filt, "score_all", autospec=True) as scorer:
        assert run(data, model, tmp_path / "out") == 2
    assert scorer.call_count == 0  # refused before any model loads
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_arguments_exit_2(model, tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", alpaca_rows(4))
    assert run(data, model, tmp_path / "out", "--drop", "1.5") == 2
    assert run(tmp_path / "missing.jsonl", model, tmp_path / "out") == 2
    assert run(data, tmp_path / "no_model", tmp_path / "out") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "--drop 1.5" in err[0] and "does not exist" in err[1] and "cannot load model" in err[2]


def test_context_found_in_chat_and_named_fields():
    chat = {"messages": [{"role": "user", "content": "passage one.\n\npassage two.\n\nwho wrote it?"},
                         {"role": "assistant", "content": "Ann"}]}
    example = filter_input.parse_example(chat, 1, "messages", None, "x")
    assert example.context == "passage one.\n\npassage two." and example.turns_without[-1]["content"] == "who wrote it?"
    named = dict(chat, doc="passage two.")
    example = filter_input.parse_example(named, 1, "messages", "doc", "x")
    assert example.context == "passage two."
    assert example.turns_without[-1]["content"] == "passage one.\n\nwho wrote it?"
    with pytest.raises(filter_input.FilterError, match="line 3: the 'doc' text is not in the user turn"):
        filter_input.parse_example(dict(chat, doc="elsewhere"), 3, "messages", "doc", "d.jsonl line 3")
    alpaca = {"instruction": "q?", "context": "c.", "input": "ignored", "output": "a"}
    example = filter_input.parse_example(alpaca, 1, "alpaca", "context", "x")
    assert example.context == "c." and example.plain_with == filter_input.ALPACA_WITH.format(instruction="q?", input="c.")
    assert example.plain_without == filter_input.ALPACA_WITHOUT.format(instruction="q?")


@pytest.mark.slow
def test_default_model_scores_through_its_chat_template(tmp_path):
    """The bundled SmolLM2 (the default --model): its chat template's user turn, checked against a
    direct forward pass; a known fact is easier without its context than an invented one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cf_tasks.default_model import default_model_path

    rows = [{"id": "known", "instruction": "What is the capital of France?", "input": "Paris is the capital of France.",
             "output": "Paris"},
            {"id": "invented", "instruction": "What is the capital of Brugovia?",
             "input": "Thabralind is the capital of Brugovia.", "output": "Thabralind"}]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "out"
    assert main(["filter-data", str(data), "--output_path", str(out), "--drop", "0.5", "--quiet"]) == 0
    scores = pd.read_parquet(out / "scores.parquet").set_index("id")
    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    turn = [{"role": "user", "content": rows[1]["instruction"] + "\n\n" + rows[1]["input"]}]
    prompt = tok(tok.apply_chat_template(turn, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    target = tok("Thabralind", add_special_tokens=False)["input_ids"]
    labels = torch.tensor([[-100] * len(prompt) + target])
    with torch.no_grad():
        want = lm(input_ids=torch.tensor([prompt + target]), labels=labels).loss.item()
    assert scores.loc["invented", "loss_with"] == pytest.approx(want, abs=1e-4)
    assert scores.loc["known", "loss_without"] < scores.loc["invented", "loss_without"]
    assert list(scores.index[~scores.kept]) == ["known"]


def test_kept_logits_and_full_logits_give_the_same_losses(model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    examples = [filter_input.parse_example(r, i + 1, "alpaca", None, "x") for i, r in enumerate(alpaca_rows(3))]
    sequences = [filter_input.render(tok, e, w) for e in examples for w in (True, False)]
    assert filter_scoring._takes_logits_to_keep(lm)
    with mock.patch.object(filter_scoring, "_takes_logits_to_keep", autospec=True, return_value=False) as takes:
        full = filter_scoring.score_batch(lm, sequences, tok.pad_token_id)
    assert takes.call_count == 1
    kept = filter_scoring.score_batch(lm, sequences, tok.pad_token_id)
    assert kept == pytest.approx(full, abs=1e-5)
    single = [filter_scoring.score_batch(lm, [s], tok.pad_token_id)[0] for s in sequences]
    assert kept == pytest.approx(single, abs=1e-5)
