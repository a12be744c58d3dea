"""Peak signal-to-noise ratio (PSNR) between two image batches."""

import numpy as np
import torch

from ._validation import check_ndim, check_positive_real, check_same_shape, to_tensors


def peak_signal_noise_ratio(
    pred: torch.Tensor | np.ndarray, target: torch.Tensor | np.ndarray, data_range: float = 1.0
) -> torch.Tensor:
    r"""
    Per-image PSNR in decibels: `10 * log10(data_range**2 / MSE)`, the MSE taken over channels and pixels.

    Args:
        pred (`torch.Tensor` or `np.ndarray` of shape `(batch_size, channels, height, width)`): images.
        target (`torch.Tensor` or `np.ndarray` of the same shape): reference images.
        data_range (`float`, defaults to 1.0): the span of the value range, `max - min` (1 for [0, 1],
            2 for [-1, 1], 255 for uint8).

    Returns:
        `torch.Tensor` of shape `(batch_size,)`, float64, on the inputs' device: one PSNR per image; `inf` where the
        two images are identical. Computed in float64 and differentiable with respect to both inputs.
    """
    pred, target = to_tensors(pred=pred, target=target)
    check_ndim(pred, "pred", 4, "batch of images (batch_size, channels, height, width)")
    check_same_shape(pred, target, "pred", "target")
    if pred.shape[1:].numel() == 0:
        raise ValueError(f"`pred` has shape {tuple(pred.shape)}; expected images with at least one pixel and channel.")
    data_range = check_positive_real(data_range, "data_range")

    mse = (pred.to(torch.float64) - target.to(torch.float64)).pow(2).mean(dim=(1, 2, 3))
    # data_range**2 / 0 is +inf, so identical images give inf (not NaN).
    return 10.0 * torch.log10(data_range**2 / mse)
