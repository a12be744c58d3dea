"""DIRP: DDIM-inversion reconstruction purification (its test bed lives in `diffusers_ext.evaluation.dirp`)."""
