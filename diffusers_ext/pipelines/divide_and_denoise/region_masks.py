"""Region prompting: the user says where each prompt goes, with one mask per prompt (MultiDiffusion's region masks).

Pass `masks=[...]` to [`DivideAndDenoisePipeline`] (or `allocator=MaskAllocator(masks)`): prompt `k` is responsible
for the pixels its mask covers, through the same sampler, models and guidance as the fair division, on SD 1.x / 2.x,
SDXL, SD3 and Flux alike. Masks are checked when built and against the call, before any model work.
"""

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F

from ...utils import public
from .baseline_allocators import FixedAllocator


def mask_to_tensor(mask, index: int) -> torch.Tensor:
    """One user mask as a float32 `(H, W)` tensor in [0, 1]: a PIL image (converted to grayscale, 255 is 1), a
    boolean, integer (`uint8`: 255 is 1) or float array or tensor. Raises a `ValueError` naming `masks[index]`."""
    name = f"`masks[{index}]`"
    if isinstance(mask, PIL.Image.Image):
        mask = np.asarray(mask.convert("L"), dtype=np.float32) / 255.0
    elif isinstance(mask, np.ndarray) and mask.dtype == np.uint8:
        mask = mask.astype(np.float32) / 255.0
    elif isinstance(mask, torch.Tensor) and mask.dtype == torch.uint8:
        mask = mask.float() / 255.0
    try:
        tensor = torch.as_tensor(mask).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{name} must be a PIL image, an array or a tensor, got {type(mask).__name__}.") from error
    if tensor.ndim == 3 and tensor.shape[0] == 1:  # a (1, H, W) mask
        tensor = tensor[0]
    if tensor.ndim != 2:
        raise ValueError(f"{name} must be a 2-d (height, width) mask, got shape {tuple(tensor.shape)}.")
    tensor = tensor.float()
    if not torch.isfinite(tensor).all() or tensor.min() < 0 or tensor.max() > 1:
        raise ValueError(
            f"{name} must hold values in [0, 1] (or be a boolean or uint8 mask), got values in "
            f"[{tensor.min().item():g}, {tensor.max().item():g}]."
        )
    return tensor


@public
class MaskAllocator(FixedAllocator):
    r"""
    Region prompting: prompt `k` is responsible for the positions its mask covers (MultiDiffusion's region masks,
    given by the user). Where masks overlap, their weights are normalised over the prompts.

    Masks are given at the image's resolution (or at the latent grid's) and averaged over each latent position's
    pixels. At construction they are checked: all of one size, none empty, and together covering every pixel (an
    uncovered pixel would have no prompt: add a background mask); the pipeline then checks that there is one mask per
    prompt and that their size is the image's, before any model work.

    Args:
        masks (`list` of `PIL.Image.Image`, `np.ndarray` or `torch.Tensor` of shape `(height, width)`, or a tensor
            `(K, height, width)`): one mask per prompt, values in [0, 1] (boolean and `uint8` masks are read as 0/1
            and 0-255).
    """

    def __init__(self, masks):
        if isinstance(masks, (torch.Tensor, np.ndarray)) and masks.ndim == 3:
            masks = list(masks)
        if not isinstance(masks, (list, tuple)) or not masks:
            raise ValueError(
                f"`masks` must be a non-empty list of masks (one per prompt), got {type(masks).__name__}."
            )
        tensors = [mask_to_tensor(mask, i) for i, mask in enumerate(masks)]
        for i, tensor in enumerate(tensors[1:], start=1):
            if tensor.shape != tensors[0].shape:
                raise ValueError(
                    f"`masks[{i}]` is {tuple(tensor.shape)} but `masks[0]` is {tuple(tensors[0].shape)}; every mask "
                    "must have the image's (height, width)."
                )
        for i, tensor in enumerate(tensors):
            if not tensor.any():
                raise ValueError(f"`masks[{i}]` is empty (all zeros): its prompt would have no region.")
        self.masks = torch.stack(tensors)  # (K, H, W)
        uncovered = (self.masks.sum(dim=0) == 0).nonzero()
        if len(uncovered):
            y, x = uncovered[0].tolist()
            raise ValueError(
                f"`masks` leave {len(uncovered)} of {self.masks[0].numel()} pixels uncovered (the first at row {y}, "
                f"column {x}); together they must cover the image (add a mask for the background)."
            )

    def check_image_size(self, height: int, width: int) -> None:
        """Raise a `ValueError` naming `masks` unless they are `height x width` (the image, in pixels)."""
        if tuple(self.masks.shape[1:]) != (height, width):
            raise ValueError(
                f"`masks` are {self.masks.shape[1]}x{self.masks.shape[2]} (height x width), but the image is "
                f"{height}x{width}; give masks of the image's size."
            )

    def check(self, num_agents: int, height: int, width: int) -> None:
        if len(self.masks) != num_agents:
            raise ValueError(
                f"`masks` has {len(self.masks)} masks for {num_agents} prompts (models); pass one mask per prompt."
            )
        mask_height, mask_width = self.masks.shape[1:]
        factor = mask_height // height
        if factor < 1 or (mask_height, mask_width) != (factor * height, factor * width):
            raise ValueError(
                f"`masks` are {mask_height}x{mask_width}, which is not the {height}x{width} latent grid scaled by a "
                "whole factor (the image's size); give masks of the image's size."
            )

    def weights(self, num_agents: int, height: int, width: int) -> torch.Tensor:
        self.check(num_agents, height, width)
        factor = self.masks.shape[1] // height
        masks = F.avg_pool2d(self.masks[None], factor)[0] if factor > 1 else self.masks  # each latent's pixels
        return masks / masks.sum(dim=0, keepdim=True)  # > 0 everywhere: the masks cover every pixel

    def __repr__(self) -> str:
        return f"MaskAllocator(masks={tuple(self.masks.shape)})"
