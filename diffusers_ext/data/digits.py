"""scikit-learn's bundled 8x8 handwritten digits as a tiny image dataset (no download needed)."""

import torch
import torch.nn.functional as F

from ..utils import check_positive_int


SPLITS = ("train", "heldout", "all")
NUM_CLASSES = 10


def load_digits_images(
    split: str = "train", resolution: int = 16, heldout_fraction: float = 0.2, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    Load scikit-learn's 1,797 handwritten digits as images in [-1, 1].

    The split is stratified by class and fixed by `seed`, so `"train"` and `"heldout"` are disjoint and together
    make `"all"`.

    Args:
        split (`str`, defaults to `"train"`): `"train"`, `"heldout"` or `"all"`.
        resolution (`int`, defaults to 16): side of the returned images; the 8x8 originals are resized
            bilinearly (antialiased when shrinking).
        heldout_fraction (`float`, defaults to 0.2): share of each class kept out of `"train"`.
        seed (`int`, defaults to 0): seed of the split.

    Returns:
        `(images, labels)`: `images` of shape `(N, 1, resolution, resolution)` (float32 in [-1, 1]) and `labels`
        of shape `(N,)` (int64 in [0, 9]).
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    check_positive_int("resolution", resolution, minimum=4)
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"`heldout_fraction` must lie in (0, 1), got {heldout_fraction!r}.")

    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.from_numpy(digits.images).float().div(16.0).unsqueeze(1)  # (N, 1, 8, 8) in [0, 1]
    labels = torch.from_numpy(digits.target).long()
    if resolution != images.shape[-1]:
        images = F.interpolate(
            images, size=(resolution, resolution), mode="bilinear", align_corners=False, antialias=True
        ).clamp(0.0, 1.0)
    images = images * 2.0 - 1.0

    if split == "all":
        return images, labels
    train_idx, heldout_idx = train_test_split(
        torch.arange(len(labels)).numpy(), test_size=heldout_fraction, stratify=labels.numpy(), random_state=seed
    )
    idx = torch.from_numpy(train_idx if split == "train" else heldout_idx)
    return images[idx], labels[idx]
