"""Discrete flow matching: the sampling pipeline, minibatch couplings and perplexity bounds."""
