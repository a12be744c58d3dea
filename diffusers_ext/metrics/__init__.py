"""Evaluation metrics shared by benchmarks and tests: PSNR, SSIM, Fréchet distance, classification accuracy, peak memory
and sample distances (MMD, sliced Wasserstein).

All accept torch tensors (numpy arrays too), work on any device and compute in float64 where precision matters.
"""

from .classification import accuracy, classifier_accuracy, classifier_predictions, per_class_accuracy
from .frechet import feature_statistics, frechet_distance, frechet_distance_from_statistics
from .graphs import graph_mmd, is_valid_planar, is_valid_tree, mmd_ratios, vun
from .memory import peak_memory_bytes
from .psnr import peak_signal_noise_ratio
from .sample_distances import median_bandwidth, mmd_squared, sliced_wasserstein
from .ssim import gaussian_window_1d, structural_similarity


__all__ = [
    "accuracy",
    "classifier_accuracy",
    "classifier_predictions",
    "feature_statistics",
    "frechet_distance",
    "frechet_distance_from_statistics",
    "gaussian_window_1d",
    "graph_mmd",
    "is_valid_planar",
    "is_valid_tree",
    "median_bandwidth",
    "mmd_ratios",
    "mmd_squared",
    "peak_memory_bytes",
    "peak_signal_noise_ratio",
    "per_class_accuracy",
    "sliced_wasserstein",
    "structural_similarity",
    "vun",
]
