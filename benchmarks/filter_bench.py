"""The speed of `cf-tasks filter-data`'s scoring: its padded batches against a plain loop of
single-example forward passes, and against transformers' `Trainer.evaluate` on the same sequences,
side by side in one run on the same loaded model.

Each example is scored twice (target loss with and without its context), so every arm runs the
same 2 x N sequences: the batched scorer (`score_batch`, `--batch_size` examples a pass, i.e. twice
as many sequences, projecting only the target-predicting positions onto the vocabulary), the plain loop (one unpadded sequence a pass, loss from `labels=`) and
`Trainer.evaluate` (padded batches of the same size; it returns only one mean loss, each batch's
token mean averaged over the sequences, so it is compared on speed and on that one number). The
batched arm runs first and last and its time is the mean of the two, against load changes on a
shared machine. The examples are knowledge-conflict items of
the project's datasets written as Alpaca examples (instruction = question, input = passage,
output = the passage's answer). The per-example losses of the batched scorer and the loop are
compared (largest difference), and the whole command's wall time is given too (model load,
scan, scoring, outputs).

    python benchmarks/filter_bench.py [--model PATH] [--examples 64] [--batch_size 8] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def alpaca_examples(count: int) -> list[dict]:
    import dataset_builders

    rows = []
    names = ["cf_bio", "cf_world_facts", "cf_capitals", "cf_quotes"]
    pools = [dataset_builders.build(n) for n in names]
    for i in range(count):
        item = pools[i % len(pools)][i // len(pools)]
        rows.append({"id": item.id, "instruction": item.question, "input": item.context,
                     "output": item.counterfactual_answer})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer,
                              TrainingArguments)

    from cf_tasks.cli import main as cli_main
    from cf_tasks.default_model import default_model_path
    from cf_tasks.mitigations import filter_input, filter_scoring

    model_path = args.model or str(default_model_path())
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = filter_scoring.resolve_dtype("auto", device)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = alpaca_examples(args.examples)
    examples = [filter_input.parse_example(r, i + 1, "alpaca", None, "bench") for i, r in enumerate(rows)]
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    sequences = [filter_input.render(tok, e, w) for e in examples for w in (True, False)]
    tokens = sum(len(ids) for ids, _ in sequences)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    filter_scoring.score_batch(model, sequences[:2], pad_id)  # warm-up
    step = 2 * args.batch_size

    def run_batched() -> tuple[float, list[float]]:
        sync()
        start = time.perf_counter()
        losses = []
        for i in range(0, len(sequences), step):
            losses += filter_scoring.score_batch(model, sequences[i: i + step], pad_id)
        sync()
        return time.perf_counter() - start, losses

    t_first, batched = run_batched()  # first and last (A B C A), so that a load change hits both sides

    start = time.perf_counter()
    loop = []
    with torch.no_grad():
        for ids, prompt_len in sequences:
            input_ids = torch.tensor([ids], device=device)
            labels = input_ids.clone()
            labels[0, :prompt_len] = -100
            loop.append(model(input_ids=input_ids, labels=labels).loss.float().item())
    sync()
    t_loop = time.perf_counter() - start
    diff = max(abs(a - b) for a, b in zip(batched, loop))

    data = Dataset.from_list([{"input_ids": ids, "attention_mask": [1] * len(ids),
                               "labels": [-100] * p + ids[p:]} for ids, p in sequences])
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(output_dir=tmp, per_device_eval_batch_size=step, report_to=[],
                                  use_cpu=device == "cpu", bf16=dtype == torch.bfloat16, disable_tqdm=True)
        trainer = Trainer(model=model, args=targs, eval_dataset=data,
                          data_collator=DataCollatorForSeq2Seq(tok, padding=True))
        start = time.perf_counter()
        metrics = trainer.evaluate()
        sync()
        t_trainer = time.perf_counter() - start
    t_last, _ = run_batched()
    t_batched = (t_first + t_last) / 2
    # Trainer.evaluate's eval_loss: each batch's mean over its target tokens, averaged over the
    # sequences (a batch counts as many times as it has sequences).
    target_tokens = [len(ids) - p for ids, p in sequences]
    batch_means = []
    for i in range(0, len(sequences), step):
        part = list(zip(batched[i: i + step], target_tokens[i: i + step]))
        batch_means += [sum(l * n for l, n in part) / sum(n for _, n in part)] * len(part)
    trainer_view = sum(batch_means) / len(batch_means)

    with tempfile.TemporaryDirectory() as tmp:
        data_file = Path(tmp) / "bench.jsonl"
        data_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
        start = time.perf_counter()
        code = cli_main(["filter-data", str(data_file), "--model", model_path, "--output_path", str(Path(tmp) / "out"),
                         "--batch_size", str(args.batch_size), "--device", device, "--quiet"])
        t_command = time.perf_counter() - start
        assert code == 0

    n = len(examples)
    print(f"model {Path(model_path).name}, {device}, {dtype}, {n} examples = {len(sequences)} sequences, "
          f"{tokens} tokens, batch {args.batch_size} examples ({step} sequences); torch threads "
          f"{torch.get_num_threads()}")
    print(f"{'arm':34s} {'seconds':>8s} {'examples/s':>11s} {'vs loop':>8s}")
    for name, sec in (("filter-data scoring (batched)", t_batched), ("plain loop, one sequence a pass", t_loop),
                      ("Trainer.evaluate (same batches)", t_trainer)):
        print(f"{name:34s} {sec:8.2f} {n / sec:11.2f} {t_loop / sec:7.2f}x")
    print(f"{'whole command (load+scan+write)':34s} {t_command:8.2f} {n / t_command:11.2f}")
    print(f"largest |batched - loop| per-example loss: {diff:.2e} nats/token")
    print(f"batched scoring: {t_first:.2f} s first, {t_last:.2f} s last (the table gives their mean)")
    print(f"eval_loss as Trainer.evaluate averages it: from the batched losses {trainer_view:.5f}, "
          f"Trainer.evaluate {metrics['eval_loss']:.5f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
