"""Training objectives shared by the training scripts, trainers and benchmarks (losses and the noising they need)."""
