"""Per-image perceptual distances for the purification budget: SSIM, L2 or any callable (LPIPS, for instance).

Every distance takes two image batches in [-1, 1] of shape `(B, C, H, W)` and returns a differentiable `(B,)` tensor,
0 for identical images.
"""

from collections.abc import Callable

import torch

from ...metrics import structural_similarity


PerceptualDistance = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

BUILT_IN = ("ssim", "l2")


def ssim_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`1 - SSIM(x, y)` per image, with an 11-pixel Gaussian window, or the largest odd window that fits."""
    side = min(x.shape[-2:])
    window = max(3, min(11, side if side % 2 else side - 1))
    return (1.0 - structural_similarity(x, y, data_range=2.0, window_size=window)).to(x.dtype)


def l2_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Root-mean-square difference per image, in [-1, 1] units; the `1e-12` keeps its gradient finite at 0."""
    return ((x - y).pow(2).flatten(1).mean(1) + 1e-12).sqrt()


def get_perceptual_distance(perceptual: str | PerceptualDistance) -> PerceptualDistance:
    """Resolve `perceptual` (a name in `BUILT_IN` or a callable `(x, y) -> (B,)`) to a distance; errors name it."""
    if callable(perceptual):
        return perceptual
    if perceptual == "ssim":
        return ssim_distance
    if perceptual == "l2":
        return l2_distance
    raise ValueError(f"`perceptual` must be one of {BUILT_IN} or a callable `(x, y) -> (batch,)`, got {perceptual!r}.")
