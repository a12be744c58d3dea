"""scikit-learn's 8x8 digits as binary sequences of 64 pixels (train / validation / test splits)."""

import torch

from .digits import load_digits_images


SPLITS = ("train", "validation", "test")


def load_binarized_digits(split: str = "train", threshold: float = 0.5, seed: int = 0) -> torch.LongTensor:
    """
    The 1,797 digits at 8x8, pixels `>= threshold` (intensity in [0, 1]) set to 1, flattened row-major.

    `"train"` is the 80% train split of `diffusers_ext.data.digits`; its held-out 20% is cut into `"validation"`
    and `"test"` halves (fixed by `seed`).

    Returns:
        `torch.LongTensor` of shape `(N, 64)` with values in {0, 1}.
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"`threshold` must lie in (0, 1), got {threshold!r}.")
    images, _ = load_digits_images("train" if split == "train" else "heldout", resolution=8, seed=seed)
    binary = ((images + 1.0) / 2.0 >= threshold).long().flatten(1)
    if split == "train":
        return binary
    order = torch.randperm(len(binary), generator=torch.Generator().manual_seed(seed))
    half = len(binary) // 2
    return binary[order[:half]] if split == "validation" else binary[order[half:]]
