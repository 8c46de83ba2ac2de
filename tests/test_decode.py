"""Grouped generation that drops rows whose answer is fixed (cf_tasks/sweep/decode.py): the texts
lm-eval reads equal those of one uninterrupted ``generate`` call."""

from __future__ import annotations

import pytest

from tiny_model import WORDS, build_lora_adapter, build_tiny_model

torch = pytest.importorskip("torch")

from lm_eval.models.utils import postprocess_generated_text  # noqa: E402

from cf_tasks.sweep.decode import can_segment, generate_dropping_finished  # noqa: E402

PROMPTS = ["the capital of paris is", "who was born in rome and", "what", "write the quote of the year",
           "which city", "the name of the word that ends the quote is"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("decode")
    base = build_tiny_model(root / "base", [" ".join(WORDS)] * 4, seed=3)
    adapters = [build_lora_adapter(base, root / f"lora{k}", seed=20 + k) for k in range(2)]
    tokenizer = AutoTokenizer.from_pretrained(base, padding_side="left")
    plain = AutoModelForCausalLM.from_pretrained(base).eval()
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapters[0], adapter_name="a0")
    peft.load_adapter(adapters[1], adapter_name="a1")
    return tokenizer, plain, peft.eval()


def _texts(tokenizer, out, width, stop):
    return [postprocess_generated_text(tokenizer.decode(row[width:], skip_special_tokens=True), stop, None)
            for row in out.tolist()]


def _frequent_words(tokenizer, out, width, k=3):
    """Words the model writes often: stop sequences that fix rows at different steps."""
    from collections import Counter

    counts = Counter(w for row in out.tolist() for w in tokenizer.decode(row[width:], skip_special_tokens=True).split())
    return [w for w, _ in counts.most_common(k)]


@pytest.mark.slow
@pytest.mark.parametrize("grouped", [False, True], ids=["one model", "mixed LoRA batch"])
def test_dropping_finished_rows_gives_the_texts_of_one_call(tiny, grouped):
    tokenizer, plain, peft = tiny
    model = peft if grouped else plain
    enc = tokenizer(PROMPTS * (2 if grouped else 1), return_tensors="pt", padding=True)
    width, max_length = enc.input_ids.shape[1], enc.input_ids.shape[1] + 24
    names = ["a0"] * len(PROMPTS) + ["a1"] * len(PROMPTS) if grouped else None
    extra = {"adapter_names": names} if grouped else {}
    with torch.no_grad():
        whole = model.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask, max_length=max_length,
                               do_sample=False, pad_token_id=tokenizer.pad_token_id, **extra)
    if grouped:  # the two adapters answer differently, so rows given to the wrong adapter would show
        half = len(PROMPTS)
        assert whole[:half].tolist() != whole[half:].tolist()
    for stop in (_frequent_words(tokenizer, whole, width)[:1], _frequent_words(tokenizer, whole, width)[1:3],
                 ["never written", "</s>"]):
        stats: dict = {}
        with torch.no_grad():
            out = generate_dropping_finished(model, enc.input_ids, max_length, stop, tokenizer.decode,
                                             tokenizer.pad_token_id, adapter_names=names, stats=stats,
                                             attention_mask=enc.attention_mask, do_sample=False)
        assert out.shape[0] == whole.shape[0] and out[:, :width].tolist() == enc.input_ids.tolist()
        assert _texts(tokenizer, out, width, stop) == _texts(tokenizer, whole, width, stop), stop
        # Each row's tokens are the start of its tokens in the one call: the same greedy choices.
        pad = tokenizer.pad_token_id
        for mine, theirs in zip(out[:, width:].tolist(), whole[:, width:].tolist()):
            while mine and mine[-1] == pad:
                mine.pop()
            assert mine and theirs[:len(mine)] == mine
        # Rows were fixed at different steps (a stop word, or the end-of-sequence id): the batch
        # was generated in several segments.
        assert stats["segments"] > 1, stop


def test_what_cannot_be_segmented_goes_through_one_call(tiny):
    _, plain, _ = tiny
    assert can_segment(plain, {"do_sample": False, "attention_mask": None})
    assert not can_segment(plain, {"do_sample": True})
    assert not can_segment(plain, {"do_sample": False, "min_new_tokens": 3})  # counted from each call's input
    assert not can_segment(plain, {"max_new_tokens": 3})
    saved = plain.generation_config.min_new_tokens
    try:
        plain.generation_config.min_new_tokens = 2
        assert not can_segment(plain, {"do_sample": False})
    finally:
        plain.generation_config.min_new_tokens = saved


@pytest.mark.slow
def test_several_batches_decoded_together_give_each_batch_its_own_texts(tiny):
    """generate_batches: lm-eval batches of different prompt lengths, each for two adapters,
    prefilled apart and decoded together from left-padded caches."""
    from cf_tasks.sweep.decode import can_merge, generate_batches

    tokenizer, _, peft = tiny
    assert can_merge(peft)
    budget, names = 20, ["a0", "a1"]
    batches = []
    for prompts in (PROMPTS[:2], PROMPTS[2:3] + PROMPTS[4:5], PROMPTS[5:]):  # three prompt widths
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
        batches.append({"context": enc.input_ids, "attention_mask": enc.attention_mask,
                        "max_length": enc.input_ids.shape[1] + budget, "kwargs": {"do_sample": False}})
    assert len({b["context"].shape[1] for b in batches}) == 3
    with torch.no_grad():
        alone = [[peft.generate(input_ids=b["context"], attention_mask=b["attention_mask"], max_length=b["max_length"],
                                do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                adapter_names=[n] * b["context"].shape[0]) for n in names] for b in batches]
    for stop in (_frequent_words(tokenizer, torch.cat([a[:, -budget:] for row in alone for a in row]), 0)[:2],
                 ["never written"]):
        stats: dict = {}
        with torch.no_grad():
            together = generate_batches(peft, [{**b, "stop": stop} for b in batches], names, tokenizer.decode,
                                        tokenizer.pad_token_id, stats=stats)
        assert stats["merged_batches"] == 3
        for b, mine_row, their_row in zip(batches, together, alone):
            width = b["context"].shape[1]
            for mine, theirs in zip(mine_row, their_row):
                assert mine[:, :width].tolist() == b["context"].tolist()
                assert _texts(tokenizer, mine, width, stop) == _texts(tokenizer, theirs, width, stop), stop
                for m, t in zip(mine[:, width:].tolist(), theirs[:, width:].tolist()):
                    while m and m[-1] == tokenizer.pad_token_id:
                        m.pop()
                    assert m and t[:len(m)] == m
        # The two adapters answer differently, so rows handed to the wrong adapter would show.
        assert together[1][0].tolist() != together[1][1].tolist()
