"""EpiDiff: a spatio-temporal diffusion forecaster steered at inference towards a mechanistic forecast, with a
per-point strength set by that forecast's uncertainty; and the leak-free mechanistic forecast itself."""
