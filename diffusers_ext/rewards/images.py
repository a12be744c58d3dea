"""The image formats every reward accepts, as one float tensor `(batch, channels, height, width)` in [0, 1]."""

from collections.abc import Sequence

import numpy as np
import PIL.Image
import torch


def images_to_tensor(images) -> torch.Tensor:
    """Images as a float tensor `(batch, channels, height, width)` in [0, 1] (from a tensor, array or PIL list)."""
    if isinstance(images, torch.Tensor):
        tensor = images
    elif isinstance(images, np.ndarray):
        tensor = torch.from_numpy(images).permute(0, 3, 1, 2)
    elif isinstance(images, Sequence) and all(isinstance(i, PIL.Image.Image) for i in images):
        tensor = torch.stack(
            [torch.from_numpy(np.asarray(i.convert("RGB"), dtype=np.float32) / 255.0) for i in images]
        ).permute(0, 3, 1, 2)
    else:
        raise TypeError(
            f"`images` must be a tensor (B, C, H, W), an array (B, H, W, C) or a list of PIL images, got "
            f"{type(images).__name__}."
        )
    if tensor.ndim != 4:
        raise ValueError(f"`images` must have 4 dimensions, got shape {tuple(tensor.shape)}.")
    return tensor.detach().float().cpu()
