"""Masked diffusion language models (LLaDA, Dream, LLaDA2, ...) as a diffusers pipeline, with one adapter per family."""
