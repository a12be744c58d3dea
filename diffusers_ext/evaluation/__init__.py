"""Evaluation-only code: judges, oracles, exact likelihoods and comparison baselines, one module per method."""
