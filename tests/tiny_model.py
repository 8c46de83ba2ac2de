"""A tiny random Llama model with a word-level tokenizer, built offline in a test's tmp folder.

Also a command for CI jobs outside pytest: the model (its vocabulary covers the datasets' text) and,
with ``--run``, a run folder of two full checkpoints and two LoRA adapters for ``cf-tasks sweep``:

    python tests/tiny_model.py OUT [--run RUN_DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

WORDS = (
    "the of and in is was a to what which who name capital city born year write quote ends word "
    "background question answer known for paris lyon rome london"
).split()


def build_tiny_model(folder: Path, corpus: list[str] | None = None, seed: int = 0, hidden_size: int = 32,
                     num_heads: int = 2) -> Path:
    """Save a ~1M-parameter LlamaForCausalLM and its tokenizer to ``folder``; returns it."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    trainer = trainers.WordLevelTrainer(vocab_size=30000, special_tokens=["<unk>", "<s>", "</s>", "<pad>"])
    tok.train_from_iterator(list(corpus or []) + [" ".join(WORDS)] * 2, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=fast.vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=num_heads, num_key_value_heads=num_heads, max_position_embeddings=512,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def dataset_corpus() -> list[str]:
    """The datasets' text, so that the word-level vocabulary covers the prompts."""
    import dataset_builders

    corpus = []
    for name in dataset_builders.DATASETS:
        for item in dataset_builders.build(name):
            corpus += [item.context, item.question, item.counterfactual_answer, item.parametric_answer]
    return corpus


def build_full_checkpoint(base: Path, dest: Path, seed: int) -> Path:
    """A full checkpoint: ``base``'s config and tokenizer with re-randomised weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base)
    torch.manual_seed(seed)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(base).save_pretrained(dest)
    return dest


def build_lora_adapter(base: Path, dest: Path, seed: int, r: int = 4) -> Path:
    """A LoRA adapter on ``base`` (q_proj, v_proj) with random weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=r, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(seed)
    for name, p in model.named_parameters():
        if "lora_" in name:
            torch.nn.init.normal_(p, std=1.0)
    model.save_pretrained(dest)
    cfg = json.loads((dest / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(Path(base).resolve())
    (dest / "adapter_config.json").write_text(json.dumps(cfg))
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="folder for the tiny model")
    parser.add_argument("--run", help="also write RUN/full/checkpoint-{1,2} and RUN/lora/step_{1,2}")
    args = parser.parse_args()
    model = build_tiny_model(Path(args.out), dataset_corpus())
    print(model)
    if args.run:
        run = Path(args.run)
        shutil.rmtree(run, ignore_errors=True)
        for step in (1, 2):
            print(build_full_checkpoint(model, run / "full" / f"checkpoint-{step}", seed=step))
            print(build_lora_adapter(model, run / "lora" / f"step_{step}", seed=10 + step))


if __name__ == "__main__":
    main()
