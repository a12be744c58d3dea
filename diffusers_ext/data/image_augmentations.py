"""Random grey-scale image augmentations that report their own parameters (the labels of an augmentation regressor).

The manifold feature distance of AYT is measured in the feature space of a network trained to tell which
augmentations were applied to an image and how strongly. For grey-scale images the colour augmentations of the
paper have no meaning, so this set keeps the geometric, blur, mixup and noise ones. Every augmentation is applied
independently with probability `p`; a skipped one has label 0, which is also the label of its identity setting.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


AUGMENTATION_LABELS = (
    "log_scale",
    "rotation_sin",
    "rotation_cos_minus_one",
    "log_aspect",
    "translate_x",
    "translate_y",
    "blur_sigma",
    "mixup_weight",
    "noise_std",
)


@dataclass(frozen=True)
class GreyscaleAugmentationConfig:
    r"""
    Strengths of the augmentations of [`augment_with_labels`].

    Args:
        p (`float`, defaults to 0.15): probability of applying each augmentation (independently).
        scale_std (`float`, defaults to 0.2): standard deviation of the log isotropic scale.
        rotate_max (`float`, defaults to 1.0): rotation angles are uniform in `[-rotate_max * pi, rotate_max * pi]`.
        aspect_std (`float`, defaults to 0.2): standard deviation of the log aspect ratio.
        translate_std (`float`, defaults to 0.125): standard deviation of the shift, as a fraction of the side.
        blur_sigma_max (`float`, defaults to 1.0): Gaussian blur widths are uniform in `[0, blur_sigma_max]` pixels;
            the label is `sigma / blur_sigma_max`.
        mixup_max (`float`, defaults to 0.5): the weight of the other image in a mixup is uniform in `[0, mixup_max]`.
        noise_std_max (`float`, defaults to 0.5): additive Gaussian noise levels are uniform in `[0, noise_std_max]`.
    """

    p: float = 0.15
    scale_std: float = 0.2
    rotate_max: float = 1.0
    aspect_std: float = 0.2
    translate_std: float = 0.125
    blur_sigma_max: float = 1.0
    mixup_max: float = 0.5
    noise_std_max: float = 0.5

    def __post_init__(self):
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"`p` must lie in [0, 1], got {self.p}.")
        for name in (
            "scale_std",
            "rotate_max",
            "aspect_std",
            "translate_std",
            "blur_sigma_max",
            "mixup_max",
            "noise_std_max",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}.")


def _gaussian_blur(images: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Blur each image of `(B, C, H, W)` with its own width `sigma` of shape `(B,)` (0 leaves it unchanged)."""
    radius = max(1, math.ceil(3 * float(sigma.max()))) if sigma.numel() else 1
    offsets = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    safe = sigma.clamp(min=1e-3)[:, None]
    kernel = torch.exp(-0.5 * (offsets[None] / safe) ** 2)
    kernel = kernel / kernel.sum(dim=1, keepdim=True)  # (B, K)
    b, c, h, w = images.shape
    padded = F.pad(images + 1.0, [radius] * 4)  # the background is -1; pad with it
    # Separable blur with a different kernel per image: fold the batch into channels, one group per image.
    flat = padded.reshape(1, b * c, h + 2 * radius, w + 2 * radius)
    k = kernel.repeat_interleave(c, dim=0)
    flat = F.conv2d(flat, k[:, None, None, :], groups=b * c)
    flat = F.conv2d(flat, k[:, None, :, None], groups=b * c)
    blurred = flat.reshape(b, c, h, w) - 1.0
    return torch.where((sigma > 0)[:, None, None, None], blurred, images)


def augment_with_labels(
    images: torch.Tensor, generator: torch.Generator | None = None, config: GreyscaleAugmentationConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    Apply random augmentations to grey-scale images and return what was applied.

    Args:
        images (`torch.Tensor` of shape `(batch_size, channels, height, width)`): images in [-1, 1] on a -1
            background (the digits convention).
        generator (`torch.Generator`, *optional*): the source of every random draw (on the CPU).
        config ([`GreyscaleAugmentationConfig`], *optional*): the strengths; the defaults if omitted.

    Returns:
        `tuple(torch.Tensor, torch.Tensor)`: the augmented images (same shape) and the labels of shape
        `(batch_size, len(AUGMENTATION_LABELS))`, in the order of `AUGMENTATION_LABELS`.
    """
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(
            f"`images` must be a tensor of shape (batch_size, channels, height, width), got "
            f"{getattr(images, 'shape', type(images))}."
        )
    config = config or GreyscaleAugmentationConfig()
    b = images.shape[0]
    device, dtype = images.device, images.dtype

    def draw(*shape):
        return torch.rand(*shape, generator=generator).to(device=device, dtype=dtype)

    def normal(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    apply = draw(b, 7) < config.p  # geometric (4 groups), blur, mixup, noise
    log_scale = normal(b) * config.scale_std * apply[:, 0]
    angle = (draw(b) * 2 - 1) * math.pi * config.rotate_max * apply[:, 1]
    log_aspect = normal(b) * config.aspect_std * apply[:, 2]
    shift = normal(b, 2) * config.translate_std * apply[:, 3:4]
    blur = draw(b) * config.blur_sigma_max * apply[:, 4]
    mix = draw(b) * config.mixup_max * apply[:, 5]
    noise_std = draw(b) * config.noise_std_max * apply[:, 6]
    partner = torch.randint(0, b, (b,), generator=generator).to(device)
    noise = normal(*images.shape)

    # Output-to-input affine map of grid_sample: inverse of (scale, aspect, rotation), then the shift.
    sx, sy = torch.exp(log_scale + log_aspect / 2), torch.exp(log_scale - log_aspect / 2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack(
        [
            torch.stack([cos / sx, sin / sx, -2 * shift[:, 0]], dim=1),
            torch.stack([-sin / sy, cos / sy, -2 * shift[:, 1]], dim=1),
        ],
        dim=1,
    )
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    out = F.grid_sample(images + 1.0, grid, mode="bilinear", padding_mode="zeros", align_corners=False) - 1.0
    out = _gaussian_blur(out, blur)
    out = (1 - mix)[:, None, None, None] * out + mix[:, None, None, None] * out[partner]
    out = out + noise_std[:, None, None, None] * noise

    labels = torch.stack(
        [
            log_scale,
            torch.sin(angle),
            torch.cos(angle) - 1,
            log_aspect,
            shift[:, 0],
            shift[:, 1],
            blur / max(config.blur_sigma_max, 1e-12),
            mix,
            noise_std,
        ],
        dim=1,
    )
    return out, labels
