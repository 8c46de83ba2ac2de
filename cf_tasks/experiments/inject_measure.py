"""The measurements of the injection design, at phase A's gate and at every checkpoint of phase B.

``M_C`` (the paper's equation 14): the weight of the passage's answer against the model's own one,
from the log-likelihood of both under a fact's counterfactual passage (``answer_logprobs``), and
closed-book recall, one row per fact of the groups measured (``measure_facts``); and the loss of the
fixed probe points per kind of point (``loss_rows``). The rows' columns are those of ``measure.csv``
and ``loss.csv``.
"""

from __future__ import annotations

import math

from .inject_facts import GROUPS, closed_book, known_of
from .lm import generation_prompt, greedy_answers, mean_loss_by_kind

MEASURED = ("E", "N")  # the groups whose M_C is measured (T's counterfactual items are not the question)
MEASURE_COLUMNS = ("run", "step", "group", "fact_id", "mc", "logp_context", "logp_memory", "known", "answer")
LOSS_COLUMNS = ("run", "step", "split", "kind", "loss", "n")


def answer_logprobs(model, tokenizer, prompts: list[str], answers: list[list[str]]) -> list[list[float]]:
    """The summed log-probability of each of a prompt's answers after it (the prompt already
    rendered): one forward pass per prompt, its cache cut back after each answer."""
    import torch

    out: list[list[float]] = []
    for prompt, options in zip(prompts, answers):
        head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            first = model(input_ids=torch.tensor([head]), use_cache=True)
        cache, last = first.past_key_values, torch.log_softmax(first.logits[0, -1].float(), dim=-1)
        scores = []
        for answer in options:
            tail = tokenizer(answer if prompt.endswith((" ", "\n")) else " " + answer,
                             add_special_tokens=False)["input_ids"]
            total = float(last[tail[0]])
            if len(tail) > 1:
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([tail[:-1]]), past_key_values=cache, use_cache=True).logits
                logp = torch.log_softmax(logits[0].float(), dim=-1)
                total += float(logp[torch.arange(len(tail) - 1), torch.tensor(tail[1:])].sum())
                cache.crop(1 - len(tail))  # drop the answer's tokens: the prompt's cache serves the next answer
            scores.append(total)
        out.append(scores)
    return out


def measure_facts(model, tokenizer, groups: dict[str, list[dict]], run: str, step: int, max_new_tokens: int,
                  said: dict[str, str] | None = None, recall_groups: tuple[str, ...] = GROUPS,
                  mc_groups: tuple[str, ...] = MEASURED) -> list[dict]:
    """One row per fact of the groups measured: ``M_C`` under its counterfactual passage for the
    facts of ``mc_groups``, closed-book recall for those of ``recall_groups`` ("" where a figure is
    not measured; ``said``: the closed-book answers by fact id, when they are known already)."""
    model.eval()
    facts = [(g, p) for g in GROUPS if g in mc_groups or g in recall_groups for p in groups[g]]
    scored = [(g, p) for g, p in facts if g in mc_groups]
    prompts = [generation_prompt(tokenizer, {"input": p["cf_input"], "instruction": p["instruction"]})
               for _, p in scored]
    pairs = dict(zip((p["fact_id"] for _, p in scored),
                     answer_logprobs(model, tokenizer, prompts, [[p["cf_answer"], p["output"]] for _, p in scored])))
    if said is None:
        asked = [p for g, p in facts if g in recall_groups]
        said = dict(zip((p["fact_id"] for p in asked),
                        greedy_answers(model, tokenizer, [closed_book(p) for p in asked], log=lambda *a, **k: None,
                                       max_new_tokens=max_new_tokens)))
    rows = []
    for g, p in facts:
        a = said.get(p["fact_id"]) if g in recall_groups else None
        c, m = pairs.get(p["fact_id"], (None, None))
        rows.append({"run": run, "step": step, "group": g, "fact_id": p["fact_id"],
                     "mc": "" if c is None else round(1.0 / (1.0 + math.exp(m - c)), 6),
                     "logp_context": "" if c is None else round(c, 4), "logp_memory": "" if m is None else round(m, 4),
                     "known": "" if a is None else int(known_of(p, a)), "answer": "" if a is None else a.strip()})
    return rows


def loss_rows(model, tokenizer, probe: list[dict], run: str, step: int) -> list[dict]:
    model.eval()
    return [{"run": run, "step": step, "split": "probe", "kind": k, "loss": round(loss, 6), "n": n}
            for k, (loss, n) in sorted(mean_loss_by_kind(model, tokenizer, probe).items())]
