"""Certified few-shot transfer (STEEL-style): a diffusion model over flattened LoRA adapters, sample-then-evaluate,
and a finite-hypothesis-class risk certificate."""
