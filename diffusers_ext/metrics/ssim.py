"""Structural similarity (SSIM, Wang et al. 2004) between two image batches, differentiable."""

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import check_ndim, check_positive_int, check_positive_real, check_same_shape, to_tensors


def gaussian_window_1d(window_size: int, sigma: float, dtype=torch.float64, device=None) -> torch.Tensor:
    r"""
    The normalised 1-D Gaussian weights `g` of shape `(window_size,)`, centred on the window's middle; the 2-D SSIM
    window is their outer product `g[:, None] * g[None, :]`.
    """
    coords = torch.arange(window_size, dtype=dtype, device=device) - (window_size - 1) / 2
    weights = torch.exp(-coords.pow(2) / (2 * sigma**2))
    return weights / weights.sum()


def structural_similarity(
    pred: torch.Tensor | np.ndarray,
    target: torch.Tensor | np.ndarray,
    data_range: float = 1.0,
    window_size: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> torch.Tensor:
    r"""
    Per-image mean SSIM with a Gaussian window, as defined by Wang et al. (2004).

    For every window position in the valid region (no padding: the window lies fully inside the image), with
    Gaussian-weighted means `mu_x, mu_y`, variances `s_x, s_y` and covariance `s_xy` (weighted population moments,
    no `N / (N - 1)` correction, as in the paper's reference code):

        SSIM = (2 mu_x mu_y + C1) (2 s_xy + C2) / ((mu_x^2 + mu_y^2 + C1) (s_x + s_y + C2)),
        C1 = (k1 * data_range)^2,  C2 = (k2 * data_range)^2.

    The map is averaged over positions and channels (each channel is treated as a grey image).

    Args:
        pred (`torch.Tensor` or `np.ndarray` of shape `(batch_size, channels, height, width)`): images.
        target (`torch.Tensor` or `np.ndarray` of the same shape): reference images.
        data_range (`float`, defaults to 1.0): the span of the value range, `max - min` (1 for [0, 1],
            2 for [-1, 1], 255 for uint8).
        window_size (`int`, defaults to 11): side of the square window; at most `min(height, width)`. For 8x8 or
            16x16 images use a smaller window, e.g. 7.
        sigma (`float`, defaults to 1.5): standard deviation of the Gaussian window in pixels. A very large sigma
            gives uniform weights.
        k1 (`float`, defaults to 0.01), k2 (`float`, defaults to 0.03): the stabilising constants.

    Returns:
        `torch.Tensor` of shape `(batch_size,)`, float64, on the inputs' device: the mean SSIM of each image pair, in
        [-1, 1], 1 for identical images. Built from differentiable torch operations only (computed in float64), so it
        can serve as a loss or constraint; gradients flow back to float32 inputs.
    """
    pred, target = to_tensors(pred=pred, target=target)
    check_ndim(pred, "pred", 4, "batch of images (batch_size, channels, height, width)")
    check_same_shape(pred, target, "pred", "target")
    data_range = check_positive_real(data_range, "data_range")
    window_size = check_positive_int(window_size, "window_size")
    sigma = check_positive_real(sigma, "sigma")
    k1 = check_positive_real(k1, "k1")
    k2 = check_positive_real(k2, "k2")
    batch_size, channels, height, width = pred.shape
    if window_size > min(height, width):
        raise ValueError(
            f"`window_size` is {window_size} but the images are {height}x{width}; expected a window no larger than "
            f"the image (window_size <= {min(height, width)})."
        )
    if batch_size == 0 or channels == 0:
        raise ValueError(f"`pred` has shape {tuple(pred.shape)}; expected at least one image and one channel.")

    x = pred.to(torch.float64).reshape(batch_size * channels, 1, height, width)
    y = target.to(torch.float64).reshape(batch_size * channels, 1, height, width)
    g = gaussian_window_1d(window_size, sigma, dtype=torch.float64, device=x.device)

    # One separable Gaussian filtering pass over the five maps whose local means SSIM needs.
    stacked = torch.cat([x, y, x * x, y * y, x * y], dim=0)
    filtered = F.conv2d(F.conv2d(stacked, g.view(1, 1, 1, -1)), g.view(1, 1, -1, 1))
    mu_x, mu_y, e_xx, e_yy, e_xy = filtered.chunk(5, dim=0)
    var_x = e_xx - mu_x * mu_x
    var_y = e_yy - mu_y * mu_y
    cov_xy = e_xy - mu_x * mu_y

    c1 = (k1 * data_range) ** 2
    c2 = (k2 * data_range) ** 2
    numerator = (2 * mu_x * mu_y + c1) * (2 * cov_xy + c2)
    denominator = (mu_x * mu_x + mu_y * mu_y + c1) * (var_x + var_y + c2)
    ssim_map = numerator / denominator  # (batch_size * channels, 1, height', width')
    return ssim_map.reshape(batch_size, -1).mean(dim=1)
