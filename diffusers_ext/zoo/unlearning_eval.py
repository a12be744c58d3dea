"""Moved to `diffusers_ext.evaluation.unlearning`. This alias keeps `training/train_unlearning.py` working until it
imports the new path; remove it then."""

from ..evaluation.unlearning import (
    ConceptUnlearningReport,
    denoising_losses,
    evaluate_concept_unlearning,
    membership_summary,
)


__all__ = ["ConceptUnlearningReport", "denoising_losses", "evaluate_concept_unlearning", "membership_summary"]
