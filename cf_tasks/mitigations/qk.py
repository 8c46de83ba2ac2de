"""QK-only fine-tuning as a peft LoRA recipe.

Goyal et al., "Context-Parametric Inversion" (ICLR 2025), section 6: the value matrices learning
facts from the fine-tuning data can push attention further towards parametric answers, so one
mitigation is to update only the query and key projections ("QK fine-tuning"). The paper reports
gains on some knowledge-conflict tasks (CF_World_Facts) and none on others (CF_Bio, CF_Quotes), at
some cost in standard benchmarks.

Here that is LoRA on the query and key projections only. The module names per architecture are
checked by the tests against tiny models built from transformers' own configs:

- Llama (and the SmolLM / SmolLM2 family, which are Llama models), Mistral, Qwen2, Qwen3, SmolLM3:
  separate ``q_proj`` and ``k_proj`` linears; the LoRA targets exactly those.
- GPT-NeoX (Pythia): one fused ``query_key_value`` linear whose output rows are, for each head h,
  q (``head_size`` rows), then k, then v. A LoRA target is a whole module, so targeting
  ``query_key_value`` alone would update v too. ``qk_only_model`` therefore also masks the LoRA B
  matrix's value rows: they start at zero (peft's default init) and their gradient is zeroed, so
  the learnt update ``B @ A`` never touches v, and the v rows stay exactly the base model's. The
  mask is a gradient hook, not part of the saved adapter config: build GPT-NeoX models with
  ``qk_only_model``, not with the bare config.
"""

from __future__ import annotations
from ..errors import CFTasksError

# model_type -> (LoRA target module names, fused q/k/v layout or None)
QK_TARGETS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "llama": (("q_proj", "k_proj"), None),  # also SmolLM and SmolLM2
    "mistral": (("q_proj", "k_proj"), None),
    "qwen2": (("q_proj", "k_proj"), None),
    "qwen3": (("q_proj", "k_proj"), None),
    "smollm3": (("q_proj", "k_proj"), None),
    "gpt_neox": (("query_key_value",), "per_head_qkv"),
}


class QKError(CFTasksError, ValueError):
    """A model type with no QK-only recipe (one line, exit 2)."""

    exit_code = 2


def _model_type(model_or_type) -> str:
    if isinstance(model_or_type, str):
        return model_or_type
    config = getattr(model_or_type, "config", model_or_type)
    return getattr(config, "model_type", type(model_or_type).__name__)


def qk_targets(model_or_type) -> tuple[tuple[str, ...], str | None]:
    """(target module names, fused layout) for a model, its config or its ``model_type``."""
    kind = _model_type(model_or_type)
    if kind not in QK_TARGETS:
        raise QKError(f"no QK-only recipe for model type {kind!r}; known: {', '.join(sorted(QK_TARGETS))}")
    return QK_TARGETS[kind]


def qk_only_lora_config(model_or_type, r: int = 8, lora_alpha: int = 16, lora_dropout: float = 0.0, **kwargs):
    """A peft ``LoraConfig`` on the query and key projections of ``model_or_type`` (a model, a
    config or a ``model_type`` string). For GPT-NeoX it targets the fused ``query_key_value``:
    use ``qk_only_model`` there, which also keeps the value rows fixed."""
    from peft import LoraConfig

    targets, _ = qk_targets(model_or_type)
    return LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=list(targets),
                      bias="none", task_type="CAUSAL_LM", **kwargs)


def value_row_mask(module, head_size: int):
    """A (out_features, 1) float mask of a fused per-head q/k/v linear: 0 on the value rows."""
    import torch

    rows = torch.arange(module.out_features) % (3 * head_size)
    return (rows < 2 * head_size).float().unsqueeze(1)


def qk_only_model(model, r: int = 8, lora_alpha: int = 16, lora_dropout: float = 0.0, **kwargs):
    """``model`` wrapped by peft with QK-only LoRA adapters; for a fused q/k/v projection the
    adapter's value rows are held at zero."""
    import torch
    from peft import get_peft_model

    config = qk_only_lora_config(model, r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, **kwargs)
    _, fused = qk_targets(model)
    peft_model = get_peft_model(model, config)
    if fused == "per_head_qkv":
        head_size = model.config.hidden_size // model.config.num_attention_heads
        for name, module in peft_model.named_modules():
            if name.endswith("query_key_value") and hasattr(module, "lora_B"):
                for linear in module.lora_B.values():
                    mask = value_row_mask(linear, head_size).to(linear.weight.device, linear.weight.dtype)
                    with torch.no_grad():
                        linear.weight.mul_(mask)
                    linear.weight.register_hook(lambda grad, mask=mask: grad * mask)
    return peft_model
