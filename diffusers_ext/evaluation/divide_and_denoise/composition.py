"""GenEval-style composition tests that run on a CPU (shared by the benchmark, the demo and the tests).

Two settings, each scored by a detector; success means every requested object is present exactly once:

1. **Conflicting position priors** with analytic experts: a "red" and a "blue" [`EmpiricalOptimalDenoiser`] over
   coloured discs on a 16x16 black canvas. Each expert only knows discs on one side (`conflict_experts`): the
   red one on the right, the blue one on the left, opposite to a fixed left/right split in agent order. The
   detector (`detect_discs`) thresholds colours and counts connected components of at least `min_area` pixels.
   Two reference variants: both experts centred (`centred_experts`), and a dominant expert whose large disc
   would cover a small one (`dominant_experts`).
2. **Digits on a wider canvas**: experts derived from the zoo digits DDPM, each a [`WindowedDenoiser`] painting one
   digit in one 8x8 slot of a 8x24 canvas (its position prior). `score_digit_slots` asks the zoo classifier what
   each slot shows, after an ink test says whether the slot holds a digit at all.
"""

import numpy as np
import torch

from .empirical_denoiser import EmpiricalOptimalDenoiser


CANVAS = 16
RED = (1.0, -1.0, -1.0)
BLUE = (-1.0, -1.0, 1.0)
BACKGROUND = -1.0


def disc_templates(
    color: tuple[float, float, float],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    num_templates: int = 200,
    radius_range: tuple[float, float] = (2.5, 3.5),
    size: int = CANVAS,
    seed: int = 0,
) -> torch.Tensor:
    """`(num_templates, 3, size, size)` images in [-1, 1]: one disc of `color` on black, centre uniform in the box."""
    generator = torch.Generator().manual_seed(seed)
    u = torch.rand(num_templates, 3, generator=generator, dtype=torch.float64)
    cx = x_range[0] + u[:, 0] * (x_range[1] - x_range[0])
    cy = y_range[0] + u[:, 1] * (y_range[1] - y_range[0])
    radius = radius_range[0] + u[:, 2] * (radius_range[1] - radius_range[0])
    coords = torch.arange(size, dtype=torch.float64) + 0.5
    inside = (coords.view(1, 1, -1) - cx.view(-1, 1, 1)) ** 2 + (coords.view(1, -1, 1) - cy.view(-1, 1, 1)) ** 2
    inside = inside <= radius.view(-1, 1, 1) ** 2
    images = torch.full((num_templates, 3, size, size), BACKGROUND)
    for channel, value in enumerate(color):
        images[:, channel][inside] = value
    return images.float()


def conflict_experts(num_templates: int = 200, seed: int = 0, **schedule) -> list[EmpiricalOptimalDenoiser]:
    """`[red, blue]` analytic experts: red discs centred on the right third, blue ones on the left third."""
    red = disc_templates(RED, (10.5, 13.0), (4.0, 12.0), num_templates, seed=seed)
    blue = disc_templates(BLUE, (3.0, 5.5), (4.0, 12.0), num_templates, seed=seed + 1)
    return [EmpiricalOptimalDenoiser.from_templates(t, **schedule).eval() for t in (red, blue)]


def centred_experts(num_templates: int = 200, seed: int = 0, **schedule) -> list[EmpiricalOptimalDenoiser]:
    """`[red, blue]` analytic experts that both prefer the centre (their discs would overlap)."""
    red = disc_templates(RED, (5.0, 11.0), (5.0, 11.0), num_templates, seed=seed)
    blue = disc_templates(BLUE, (5.0, 11.0), (5.0, 11.0), num_templates, seed=seed + 1)
    return [EmpiricalOptimalDenoiser.from_templates(t, **schedule).eval() for t in (red, blue)]


def dominant_experts(num_templates: int = 200, seed: int = 0, **schedule) -> list[EmpiricalOptimalDenoiser]:
    """`[red, blue]` analytic experts, both centred: the red one paints a large disc (radius 4.5-5.5) that would
    cover the canvas centre, the blue one a small disc (radius 2-2.5). The red one wants more of every contested
    position; a division that only maximises total utility hands it everything and loses the blue disc."""
    box = (5.0, 11.0)
    red = disc_templates(RED, box, box, num_templates, radius_range=(4.5, 5.5), seed=seed)
    blue = disc_templates(BLUE, box, box, num_templates, radius_range=(2.0, 2.5), seed=seed + 1)
    return [EmpiricalOptimalDenoiser.from_templates(t, **schedule).eval() for t in (red, blue)]


def detect_discs(
    images: torch.Tensor | np.ndarray, min_area: int = 8, min_intensity: float = 0.6
) -> dict[str, np.ndarray]:
    """Count red and blue blobs in `(N, 3, H, W)` images in [0, 1].

    A pixel is red when its red channel exceeds `min_intensity` and exceeds its blue channel by at least 0.25 (blue:
    the reverse); a blob is a 4-connected component of at least `min_area` such pixels. The default 0.6 asks for
    objects near full strength (the experts' discs are 1.0); a lenient 0.3 also counts faded, half-strength discs.
    Returns `{"red": (N,), "blue": (N,)}` counts.
    """
    from scipy import ndimage

    array = images.detach().cpu().float().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if array.ndim != 4 or array.shape[1] != 3:
        raise ValueError(f"`images` must have shape (N, 3, H, W), got {array.shape}.")
    counts = {"red": np.zeros(len(array), dtype=np.int64), "blue": np.zeros(len(array), dtype=np.int64)}
    for i, image in enumerate(array):
        masks = {
            "red": (image[0] > min_intensity) & (image[0] > image[2] + 0.25),
            "blue": (image[2] > min_intensity) & (image[2] > image[0] + 0.25),
        }
        for name, mask in masks.items():
            labels, num = ndimage.label(mask)
            if num:
                areas = np.bincount(labels.ravel())[1:]
                counts[name][i] = int((areas >= min_area).sum())
    return counts


def discs_success(images: torch.Tensor | np.ndarray, min_area: int = 8, min_intensity: float = 0.6) -> np.ndarray:
    """`(N,)` booleans: exactly one red and exactly one blue disc (see [`detect_discs`])."""
    counts = detect_discs(images, min_area, min_intensity)
    return (counts["red"] == 1) & (counts["blue"] == 1)


SLOT = 8


def score_digit_slots(
    classifier, images: torch.Tensor, ink_threshold: float = 0.0, min_ink_pixels: int = 5
) -> tuple[torch.Tensor, torch.Tensor]:
    """What each 8x8 slot of `(N, 1, 8, 8 * S)` images in [-1, 1] shows.

    Returns `(present, labels)`, both `(N, S)`: a slot holds a digit when at least `min_ink_pixels` pixels exceed
    `ink_threshold` (0: half of full white; a lenient -0.5 also counts faded digits), and `labels` is the
    classifier's verdict on every slot.
    """
    if images.ndim != 4 or images.shape[2] != SLOT or images.shape[3] % SLOT:
        raise ValueError(f"`images` must have shape (N, 1, 8, 8 * slots), got {tuple(images.shape)}.")
    slots = images.shape[3] // SLOT
    crops = torch.stack([images[..., s * SLOT : (s + 1) * SLOT] for s in range(slots)], dim=1)
    present = (crops > ink_threshold).flatten(2).sum(dim=2) >= min_ink_pixels
    with torch.no_grad():
        logits = classifier(crops.flatten(0, 1).to(classifier.device, classifier.dtype)).logits
    return present.cpu(), logits.argmax(dim=1).view(len(images), slots).cpu()


def digits_success(present: torch.Tensor, labels: torch.Tensor, requested: list[int]) -> np.ndarray:
    """`(N,)` booleans: the digits in the occupied slots are exactly the `requested` ones (as a multiset)."""
    wanted = sorted(requested)
    return np.array([sorted(labels[i][present[i]].tolist()) == wanted for i in range(len(labels))])
