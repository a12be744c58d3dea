"""Training losses shared by the training scripts, trainers, evaluations and benchmarks: the masked-diffusion NELBO
(MDLM and LoMDM), the discrete flow matching losses, bounds and minibatch couplings, the consistency-training
objectives and the distances they use (pseudo-Huber, manifold feature distance)."""
