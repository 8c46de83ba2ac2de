"""The QK-only LoRA recipe: its module names exist in tiny models of each architecture, and on
GPT-NeoX's fused projection training changes the q and k rows only."""

from __future__ import annotations

import pytest
import torch

from cf_tasks.mitigations.qk import QK_TARGETS, QKError, qk_only_lora_config, qk_only_model

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def tiny_model(model_type: str):
    import transformers

    configs = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
               "smollm3": "SmolLM3Config", "gpt_neox": "GPTNeoXConfig"}
    extra = {"num_key_value_heads": 2} if model_type != "gpt_neox" else {}
    if model_type == "qwen3":
        extra["head_dim"] = 8
    config = getattr(transformers, configs[model_type])(**TINY, **extra)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("model_type", sorted(QK_TARGETS))
def test_targets_are_the_attention_query_and_key_modules(model_type):
    model = tiny_model(model_type)
    assert model.config.model_type == model_type
    targets = qk_only_lora_config(model).target_modules
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    assert set(targets) <= names
    peft_model = qk_only_model(model, r=2)
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in peft_model.named_parameters() if ".lora_A" in n}
    assert adapted == set(targets)
    assert "v_proj" not in adapted and "o_proj" not in adapted
    assert sum(".lora_A" in n for n, _ in peft_model.named_parameters()) == 2 * len(targets)  # two layers


def test_smollm2_is_a_llama_model():
    from transformers import AutoConfig

    from cf_tasks.default_model import default_model_path

    try:
        path = default_model_path()
    except Exception as err:  # the embedded model is optional
        pytest.skip(str(err))
    assert qk_only_lora_config(AutoConfig.from_pretrained(path)).target_modules == {"q_proj", "k_proj"}


def test_gpt_neox_fused_projection_keeps_value_rows():
    model = tiny_model("gpt_neox")
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "query_key_value.weight" in n}
    peft_model = qk_only_model(model, r=2)
    optim = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=0.05)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
    merged = peft_model.merge_and_unload()
    head = TINY["hidden_size"] // TINY["num_attention_heads"]
    role = torch.arange(3 * TINY["hidden_size"]) % (3 * head) // head  # 0 q, 1 k, 2 v per head
    for name, before in base.items():
        delta = (dict(merged.named_parameters())[name] - before).abs().sum(dim=1)
        assert torch.all(delta[role == 2] == 0)
        assert torch.all(delta[role == 0] > 0) and torch.all(delta[role == 1] > 0)


def test_unknown_model_type_is_refused():
    with pytest.raises(QKError, match="no QK-only recipe for model type 'gpt2'"):
        qk_only_lora_config("gpt2")
