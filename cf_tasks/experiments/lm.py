"""A causal language model on training points, shared by both designs of ``cf-tasks experiment inversion``.

A point (the Alpaca fields of ``dataset_builders.training``: ``instruction``, ``input``, ``output``,
``kind``) is rendered with the sweep's own prompts and the model's chat template; here are its
encoding with labels on the answer only, the per-point and per-kind loss, the training batches,
loading a model, greedy closed-book answers as the sweep generates them, and whether an answer
states the fact (the project's scorer, as the knowledge probe scores it).
"""

from __future__ import annotations

import random
from pathlib import Path

KINDS = ("C", "CS", "S", "CF")


def task_yaml(name: str) -> dict:
    """A file of ``task_yamls`` as data (lm-eval's ``!function`` tags read as None)."""
    import yaml

    import task_yamls

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    return yaml.load((Path(task_yamls.__file__).parent / name).read_text(encoding="utf-8"), Loader=Loader)


def _as_format(jinja: str) -> str:
    """A task's ``doc_to_text`` as a format string over a training point's fields."""
    return jinja.replace("{{context}}", "{input}").replace("{{question}}", "{instruction}")


# The sweep's prompts (task_yamls/_prompts/qa_default_yaml and qa_closedbook_yaml): training on the
# evaluation's format, so that the only thing that differs between the two is the facts.
_GENERATION = task_yaml("_generation_yaml")["generation_kwargs"]
CONTEXT_PROMPT = _as_format(task_yaml("_prompts/qa_default_yaml")["doc_to_text"])
CLOSED_BOOK_PROMPT = _as_format(task_yaml("_prompts/qa_closedbook_yaml")["doc_to_text"])
STOP = tuple(_GENERATION["until"])
MAX_NEW_TOKENS = _GENERATION["max_gen_toks"]


# ------------------------------------------------------------------------------------------- text

def prompt_text(point: dict) -> str:
    """The user turn of a training point: the sweep's context prompt, or its closed-book one."""
    template = CONTEXT_PROMPT if point.get("input") else CLOSED_BOOK_PROMPT
    return template.format(input=point.get("input", ""), instruction=point["instruction"])


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode(tokenizer, point: dict) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one training point: the prompt as lm-eval renders it (the chat
    template's user turn and generation prompt, or the plain prompt for a model without one), then
    the answer and the end of the turn; labels are -100 on the prompt."""
    prompt = prompt_text(point)
    if has_chat_template(tokenizer):
        user = [{"role": "user", "content": prompt}]
        head = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": point["output"]}], tokenize=False)
        tail = full[len(head):] if full.startswith(head) else point["output"] + (tokenizer.eos_token or "")
        tail = tail.rstrip("\n")  # the template's newline after the end-of-turn token is not the answer
    else:
        head, tail = prompt, " " + point["output"] + (tokenizer.eos_token or "")
    ids_head = tokenizer(head, add_special_tokens=False)["input_ids"]
    ids_tail = tokenizer(tail, add_special_tokens=False)["input_ids"]
    return ids_head + ids_tail, [-100] * len(ids_head) + ids_tail


def generation_prompt(tokenizer, point: dict) -> str:
    user = prompt_text(point)
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True)
    return user


def per_example_loss(model, tokenizer, points: list[dict]):
    """The mean cross-entropy over each point's answer tokens: a tensor with one value per point."""
    import torch

    encoded = [encode(tokenizer, p) for p in points]
    width = max(len(ids) for ids, _ in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(points), width), pad, dtype=torch.long)
    labels = torch.full((len(points), width), -100, dtype=torch.long)
    mask = torch.zeros((len(points), width), dtype=torch.long)
    for i, (x, y) in enumerate(encoded):
        ids[i, :len(x)] = torch.tensor(x)
        labels[i, :len(y)] = torch.tensor(y)
        mask[i, :len(x)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    target = labels[:, 1:]
    token_loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=-100, reduction="none")
    counts = (target != -100).sum(dim=1).clamp(min=1)
    return token_loss.sum(dim=1) / counts


def mean_loss_by_kind(model, tokenizer, points: list[dict], batch_size: int = 8) -> dict[str, tuple[float, int]]:
    """kind -> (mean per-point loss, points) over ``points``, without gradients."""
    import torch

    sums: dict[str, list[float]] = {}
    with torch.no_grad():
        for i in range(0, len(points), batch_size):
            chunk = points[i:i + batch_size]
            for p, loss in zip(chunk, per_example_loss(model, tokenizer, chunk).tolist()):
                sums.setdefault(p["kind"], []).append(loss)
    return {k: (sum(v) / len(v), len(v)) for k, v in sums.items()}


# --------------------------------------------------------------------------------- answers, points

def is_known(answer: str, point: dict) -> bool:
    """A closed-book answer states the fact: scored parametric-correct by the project's scorer, as
    the knowledge probe scores a ``<dataset>_closedbook`` answer."""
    from ..scoring import score

    return score(answer, point.get("counterfactual_answer") or "", point["output"],
                 point.get("counterfactual_aliases") or (), point.get("answer_aliases") or (),
                 person=point.get("relation") == "person_name").parametric


def greedy_answers(model, tokenizer, points: list[dict], batch_size: int = 16, log=print,
                   max_new_tokens: int = MAX_NEW_TOKENS) -> list[str]:
    """Greedy closed-book answers, as the sweep generates them (chat template, at most 32 new
    tokens, cut at the tasks' stop sequences)."""
    import torch

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    out = []
    for i in range(0, len(points), batch_size):
        prompts = [generation_prompt(tokenizer, p) for p in points[i:i + batch_size]]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        for row in tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True):
            for stop in STOP:
                row = row.split(stop)[0]
            out.append(row)
        log(f"  closed-book answers: {len(out)}/{len(points)}")
    return out


def kind_counts(points: list[dict]) -> dict[str, int]:
    return {k: sum(1 for p in points if p["kind"] == k) for k in KINDS if any(p["kind"] == k for p in points)}


# ------------------------------------------------------------------------------------- training

def load_model(path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def batches(points: list[dict], steps: int, batch_size: int, seed: int) -> list[list[dict]]:
    """The training batches: one seeded shuffle of the points per epoch, cut into batches."""
    order: list[dict] = []
    epoch = 0
    while len(order) < steps * batch_size:
        shuffled = list(points)
        random.Random(f"{seed}:{epoch}").shuffle(shuffled)
        order += shuffled
        epoch += 1
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(steps)]
