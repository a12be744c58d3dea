"""SPADE (offline black-box optimisation with a calibrated diffusion surrogate): the surrogate's Monte-Carlo
predictive distribution, the kNN support helper and the evolutionary search on an acquisition."""
