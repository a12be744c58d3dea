"""Doob h-transform guidance (reconstructed): [`DoobGuidance`] for DDPM / DDIM / flow-matching loops and the
trajectory planner `DoobGuidedPlannerPipeline`."""
