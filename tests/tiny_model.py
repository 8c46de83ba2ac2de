"""A tiny random Llama model with a word-level tokenizer, built offline in a test's tmp folder."""

from __future__ import annotations

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
