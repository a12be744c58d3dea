"""Moved to `diffusers_ext.evaluation.digits`. This alias keeps `training/train_unlearning.py` working until it
imports the new path; remove it then."""

from ..evaluation.digits import DigitsGeneratorReport, evaluate_digits_generator, sample_digits


__all__ = ["DigitsGeneratorReport", "evaluate_digits_generator", "sample_digits"]
