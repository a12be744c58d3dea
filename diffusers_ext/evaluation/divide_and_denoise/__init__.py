"""Divide-and-Denoise's test bed: analytic experts with known behaviour and GenEval-style composition tests."""
