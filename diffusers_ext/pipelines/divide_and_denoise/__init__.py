"""Divide-and-Denoise: several diffusion models share one sample through a per-step fair division of its regions."""
