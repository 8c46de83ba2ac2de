"""The mitigations of "Context-Parametric Inversion" (Goyal et al., ICLR 2025) as tools for trainers:
context-critical filtering of instruction data (``filter``, section 4.3) and QK-only fine-tuning
(``qk``, section 6)."""
