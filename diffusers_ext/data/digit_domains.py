"""Domain shifts of the 8x8 digits for few-shot transfer proxies: rotation, shear, stroke thickness, noise and
inversion, with upstream and held-out (downstream) parameter ranges."""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class DigitDomain:
    """One domain of digit images (images in [-1, 1], ink at +1).

    Args:
        rotation (`float`): degrees, counter-clockwise.
        shear (`float`): horizontal shear factor.
        thickness (`float`): in `[-1, 1]`; > 0 blends towards a 3x3 dilation (thicker strokes), < 0 towards an
            erosion (thinner).
        noise (`float`): standard deviation of added Gaussian pixel noise.
        inversion (`float`): in `[0, 1]`; the image becomes `(1 - 2 inversion) x` (1: ink and background swapped).
    """

    rotation: float = 0.0
    shear: float = 0.0
    thickness: float = 0.0
    noise: float = 0.0
    inversion: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


# Upstream draws each parameter from the even bins of its range, downstream from the odd bins: held-out values.
_RANGES = {"rotation": (-45.0, 45.0), "shear": (-0.5, 0.5), "thickness": (-0.8, 0.8), "noise": (0.0, 0.3)}
NUM_BINS = 6


def sample_domain(generator: torch.Generator, split: str = "upstream") -> DigitDomain:
    """A random domain; `split="upstream"` draws every parameter from the even bins of its range and
    `"downstream"` from the odd bins, so downstream parameters are never seen upstream. Inversion is 0 or 1
    (probability 0.3), blended by up to 0.15 (upstream) or between 0.15 and 0.3 (downstream)."""
    if split not in ("upstream", "downstream"):
        raise ValueError(f"`split` must be 'upstream' or 'downstream', got {split!r}.")
    offset = 0 if split == "upstream" else 1
    values = {}
    for name, (low, high) in _RANGES.items():
        width = (high - low) / NUM_BINS
        bin_index = 2 * int(torch.randint(NUM_BINS // 2, (1,), generator=generator)) + offset
        values[name] = low + width * (bin_index + float(torch.rand((), generator=generator)))
    flipped = float(torch.rand((), generator=generator)) < 0.3
    blend = 0.15 * (offset + float(torch.rand((), generator=generator)))
    values["inversion"] = 1.0 - blend if flipped else blend
    return DigitDomain(**values)


def apply_domain(images: torch.Tensor, domain: DigitDomain, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift `images` of shape `(N, 1, H, W)` in [-1, 1] into `domain` (the noise drawn from `generator`)."""
    if images.ndim != 4 or images.shape[1] != 1:
        raise ValueError(f"`images` must have shape (N, 1, H, W), got {tuple(images.shape)}.")
    x = images.float()
    angle = math.radians(domain.rotation)
    cos, sin = math.cos(angle), math.sin(angle)
    theta = torch.tensor([[cos, -sin + domain.shear, 0.0], [sin, cos, 0.0]], dtype=x.dtype)
    grid = F.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape), align_corners=False)
    x = F.grid_sample(x + 1.0, grid, mode="bilinear", padding_mode="zeros", align_corners=False) - 1.0
    if domain.thickness > 0:
        x = x + domain.thickness * (F.max_pool2d(x, 3, stride=1, padding=1) - x)
    elif domain.thickness < 0:
        x = x + (-domain.thickness) * (-F.max_pool2d(-x, 3, stride=1, padding=1) - x)
    if domain.noise > 0:
        x = x + domain.noise * torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return ((1.0 - 2.0 * domain.inversion) * x).clamp(-1.5, 1.5)
