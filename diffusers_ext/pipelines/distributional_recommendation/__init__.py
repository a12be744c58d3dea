"""Distributional recommendation: user embeddings drawn from a conditional diffusion model, scores aggregated."""
