"""Instruction fine-tuning with LoRA, saving an adapter checkpoint every 50 steps: the recipe of
*Context-Parametric Inversion* (Goyal et al., ICLR 2025), appendix A.2, for ``cf-tasks sweep``.

    python examples/paper_scale/train.py --model meta-llama/Llama-2-7b-hf --data alpaca.jsonl --output_dir run

``--data`` is a JSON Lines file (or, with ``--hf_dataset``, a Hugging Face dataset name) of
Alpaca records (``instruction``, ``input``, ``output``) or of chat records (``messages``: a list
of ``{"role", "content"}``, as Tulu v2). Alpaca records are rendered with Alpaca's template, chat
records with the Tulu template (``<|user|>`` / ``<|assistant|>``), the templates the cf-tasks
``_alpaca`` and ``_tulu`` tasks use at evaluation. The loss is on the response tokens only.

Uses TRL's ``SFTTrainer`` when TRL is installed, else transformers' ``Trainer`` with peft; both
write ``checkpoint-<step>/`` folders holding the LoRA adapter, which ``cf-tasks sweep --watch``
scores as they appear.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ALPACA_PROMPT = ("Below is an instruction that describes a task{paired}. Write a response that appropriately "
                 "completes the request.\n\n### Instruction:\n{instruction}\n\n{input_block}### Response:\n")
TULU_TURN = "<|{role}|>\n{content}\n"


def render(record: dict) -> tuple[str, str]:
    """(prompt, response) of one Alpaca or chat record; the loss covers the response only."""
    if "messages" in record:
        msgs = record["messages"]
        if not msgs or msgs[-1].get("role") != "assistant":
            raise ValueError("a chat record must end with an assistant message")
        prompt = "".join(TULU_TURN.format(**m) for m in msgs[:-1]) + "<|assistant|>\n"
        return prompt, msgs[-1]["content"]
    if "instruction" in record and "output" in record:
        extra = record.get("input") or ""
        prompt = ALPACA_PROMPT.format(
            paired=", paired with an input that provides further context" if extra else "",
            instruction=record["instruction"], input_block=f"### Input:\n{extra}\n\n" if extra else "")
        return prompt, record["output"]
    raise ValueError("a record needs 'instruction' and 'output' (Alpaca) or 'messages' (chat)")


def load_records(args) -> list[dict]:
    if args.hf_dataset:
        from datasets import load_dataset

        return list(load_dataset(args.data, split="train"))
    path = Path(args.data)
    if not path.is_file():
        sys.exit(f"train.py: error: --data {path} is not a file; pass a JSON Lines file or --hf_dataset NAME")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tokenize(tokenizer, records, max_length: int) -> list[dict]:
    rows = []
    for record in records:
        prompt, response = render(record)
        p_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        r_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = (p_ids + r_ids)[:max_length]
        labels = ([-100] * len(p_ids) + r_ids)[:max_length]
        rows.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels})
    return rows


def lora_config(args):
    from peft import LoraConfig

    return LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                      target_modules="all-linear", task_type="CAUSAL_LM")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="base model folder or Hub name (e.g. meta-llama/Llama-2-7b-hf)")
    parser.add_argument("--data", required=True, help="JSON Lines file of Alpaca or chat records")
    parser.add_argument("--hf_dataset", action="store_true", help="--data names a Hugging Face dataset (split train)")
    parser.add_argument("--output_dir", required=True, help="run folder: checkpoint-<step>/ sub-folders appear here")
    parser.add_argument("--learning_rate", type=float, default=1e-4, help="the paper picks 1e-4 or 1e-5 (default 1e-4)")
    parser.add_argument("--lora_rank", type=int, default=128, help="the paper's LoRA rank (default 128)")
    parser.add_argument("--lora_alpha", type=float, default=16.0, help="not given in the paper; default 16")
    parser.add_argument("--lora_dropout", type=float, default=0.1)
    parser.add_argument("--save_steps", type=int, default=50, help="a checkpoint every N steps (the paper: 50)")
    parser.add_argument("--per_device_batch_size", type=int, default=8)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=16, help="default: 8 x 16 = 128 per step")
    parser.add_argument("--num_epochs", type=float, default=1.0)
    parser.add_argument("--max_steps", type=int, default=-1, help="stop after N steps (default: the epochs)")
    parser.add_argument("--max_length", type=int, default=1024, help="tokens per example (longer ones are cut)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no_trl", action="store_true", help="use transformers' Trainer even when TRL is installed")
    parser.add_argument("--report_to", default="none",
                        help="the trainer's trackers, comma-separated (tensorboard, wandb, mlflow, trackio; default none)")
    parser.add_argument("--cf_tasks", default=None,
                        help="score each checkpoint on these cf-tasks tasks while training (CFTasksCallback, a "
                             "separate process) and report the curves to --report_to at its step")
    parser.add_argument("--cf_limit", type=float, default=None, help="items per task for --cf_tasks")
    parser.add_argument("--cf_sweep_args", default="",
                        help="more cf-tasks sweep flags for --cf_tasks, e.g. '--device cuda:1 --backend vllm'")
    args = parser.parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer,
                              TrainingArguments)

    records = load_records(args)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16 if bf16 else torch.float32)
    train = Dataset.from_list(tokenize(tokenizer, records, args.max_length))
    common = dict(
        output_dir=args.output_dir, learning_rate=args.learning_rate, num_train_epochs=args.num_epochs,
        max_steps=args.max_steps, per_device_train_batch_size=args.per_device_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps, save_strategy="steps",
        save_steps=args.save_steps, save_total_limit=None, logging_steps=10, lr_scheduler_type="linear",
        bf16=bf16, seed=args.seed, remove_unused_columns=False,
        report_to=[t for t in args.report_to.split(",") if t and t != "none"],
    )
    # a 3 % warmup (open-instruct's); transformers 5 takes a fraction as warmup_steps, 4.x as warmup_ratio
    import inspect

    warmup = "warmup_ratio" if "warmup_ratio" in inspect.signature(TrainingArguments).parameters else "warmup_steps"
    common[warmup] = 0.03
    collator = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
    try:
        if args.no_trl:
            raise ImportError
        from trl import SFTConfig, SFTTrainer
    except ImportError:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(args))
        trainer = Trainer(model=model, args=TrainingArguments(**common), train_dataset=train,
                          data_collator=collator, processing_class=tokenizer)
    else:
        # the data is tokenized with its labels already: TRL trains on it as given
        trainer = SFTTrainer(model=model, args=SFTConfig(**common, dataset_kwargs={"skip_prepare_dataset": True}),
                             train_dataset=train, data_collator=collator, processing_class=tokenizer,
                             peft_config=lora_config(args))
    if args.cf_tasks:
        import shlex

        from cf_tasks.integrations import CFTasksCallback

        extra = shlex.split(args.cf_sweep_args)
        backend = extra[extra.index("--backend") + 1] if "--backend" in extra else "hf"
        extra = [a for i, a in enumerate(extra) if a != "--backend" and (i == 0 or extra[i - 1] != "--backend")]
        CFTasksCallback.attach(trainer, tasks=args.cf_tasks, limit=args.cf_limit, sweep_args=extra, backend=backend)
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
