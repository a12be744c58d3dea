"""Patch features of a transformers vision backbone (DINOv2 by default), returned on a spatial grid."""

import torch
import torch.nn.functional as F


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _num_prefix_tokens(backbone) -> int:
    """CLS token plus any register tokens (DINOv2-with-registers) that precede the patch tokens."""
    config = backbone.config
    return 1 + int(getattr(config, "num_register_tokens", 0) or 0)


def semantic_feature_grid(
    backbone,
    images: torch.Tensor,
    resolution: tuple[int, int] | None = None,
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
) -> torch.Tensor:
    r"""
    Run a ViT-style backbone (`transformers` `Dinov2Model`, `Dinov2WithRegistersModel`, `ViTModel`, ...) and return
    its last-layer patch tokens as a feature map.

    The whole image is resized (no crop) so that features stay aligned with pixels, normalised with `mean`/`std`,
    and the CLS and register tokens are dropped. Differentiable (wrap it in `torch.no_grad()` for inference).

    Args:
        backbone: a transformers vision model whose output has `last_hidden_state` `(B, prefix + h * w, C)` and
            whose config has `patch_size` (and optionally `num_register_tokens`).
        images (`torch.Tensor` of shape `(B, 3, H, W)`): RGB in [0, 1].
        resolution (`tuple[int, int]`, *optional*): `(height, width)` fed to the backbone, multiples of the patch
            size; defaults to `(H, W)` rounded down to multiples of the patch size.
        mean, std (`tuple[float, ...]`): per-channel normalisation (ImageNet statistics for DINOv2).

    Returns:
        `torch.Tensor` of shape `(B, C, height / patch_size, width / patch_size)`.
    """
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(
            f"`images` must be a (batch, 3, height, width) tensor, got {getattr(images, 'shape', images)}."
        )
    if images.min() < -1e-3 or images.max() > 1 + 1e-3:
        raise ValueError(
            f"`images` must lie in [0, 1]; got values in [{float(images.min()):.3g}, {float(images.max()):.3g}]."
        )
    patch = int(backbone.config.patch_size)
    if resolution is None:
        resolution = (images.shape[-2] // patch * patch, images.shape[-1] // patch * patch)
    height, width = resolution
    if height < patch or width < patch or height % patch or width % patch:
        raise ValueError(f"`resolution` {resolution} must be positive multiples of the patch size {patch}.")
    parameter = next(backbone.parameters())
    pixels = images.to(device=parameter.device, dtype=torch.float32)
    if tuple(pixels.shape[-2:]) != (height, width):
        pixels = F.interpolate(pixels, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    mean_t = torch.tensor(mean, device=pixels.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, device=pixels.device).view(1, -1, 1, 1)
    pixels = ((pixels - mean_t) / std_t).to(parameter.dtype)
    tokens = backbone(pixel_values=pixels).last_hidden_state[:, _num_prefix_tokens(backbone) :]
    grid_h, grid_w = height // patch, width // patch
    if tokens.shape[1] != grid_h * grid_w:
        raise ValueError(
            f"the backbone returned {tokens.shape[1]} patch tokens for a {grid_h}x{grid_w} grid; is its "
            "`num_register_tokens` set in the config?"
        )
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], grid_h, grid_w)


def semantic_feature_map(backbone, images: torch.Tensor) -> torch.Tensor:
    """Semantic features of `(N, 3, H, W)` images in [0, 1] as a `(N, C, H, W)` map: the images are resized to the
    backbone's `config.image_size` (its training resolution), and the patch grid upsampled bilinearly back."""
    image_size = getattr(backbone.config, "image_size", None)
    patch = int(backbone.config.patch_size)
    resolution = (image_size // patch * patch,) * 2 if isinstance(image_size, int) else None
    grid = semantic_feature_grid(backbone, images.clamp(0, 1), resolution=resolution)
    return F.interpolate(grid.float(), size=images.shape[-2:], mode="bilinear", align_corners=False)
