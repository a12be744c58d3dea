"""Random expert placements for the Divide-and-Denoise benchmark: layouts no method is told about.

A layout gives each of `K` analytic disc experts (red, blue, green) its own small box of disc centres, drawn at
random on the canvas with the boxes kept apart, so where each expert wants to paint is independent of any
method's defaults (MultiDiffusion's strips included). `layout_regions` turns a layout into the masks that an
oracle-informed MultiDiffusion receives (the upper reference), and `count_colour_blobs` / `colour_object_scores`
are the detector and its calibration statistic. `count_colour_discs` / `colour_disc_scores` judge discs by shape and
size instead (the demo's detector): a blob counter counts any sliver of saturated pixels as an object.
"""

import numpy as np
import torch

from .composition import CANVAS, disc_templates
from .empirical_denoiser import EmpiricalOptimalDenoiser


COLOURS = {"red": (1.0, -1.0, -1.0), "blue": (-1.0, -1.0, 1.0), "green": (-1.0, 1.0, -1.0)}
RADIUS_RANGE = (2.0, 3.0)
BOX_HALF_WIDTH = 0.75


def random_layout(
    num_experts: int, seed: int, size: int = CANVAS, min_distance: float = 8.0, margin: float = 3.5
) -> list[tuple[float, float]]:
    """`num_experts` disc-centre positions `(x, y)`, uniform in `[margin, size - margin]^2`, pairwise at least
    `min_distance` apart (rejection sampling with a `numpy` generator seeded by `seed`)."""
    if num_experts not in (1, 2, 3):
        raise ValueError(f"`num_experts` must be 1, 2 or 3 (one colour each), got {num_experts!r}.")
    rng = np.random.default_rng(seed)
    for _ in range(100_000):
        centres = rng.uniform(margin, size - margin, size=(num_experts, 2))
        gaps = [np.hypot(*(centres[i] - centres[j])) for i in range(num_experts) for j in range(i)]
        if all(g >= min_distance for g in gaps):
            return [tuple(float(v) for v in c) for c in centres]
    raise ValueError(f"no layout of {num_experts} centres {min_distance} apart fits a {size}x{size} canvas.")


def colour_expert(
    centre: tuple[float, float], colour: str, num_templates: int = 200, seed: int = 0, **schedule
) -> EmpiricalOptimalDenoiser:
    """An analytic expert whose `colour` discs (radius 2-3) are centred in a box of half-width 0.75 around
    `centre`; `schedule` as in [`EmpiricalOptimalDenoiser`]."""
    if colour not in COLOURS:
        raise ValueError(f"`colour` must be one of {list(COLOURS)}, got {colour!r}.")
    (cx, cy), h = centre, BOX_HALF_WIDTH
    templates = disc_templates(
        COLOURS[colour], (cx - h, cx + h), (cy - h, cy + h), num_templates, RADIUS_RANGE, seed=seed
    )
    return EmpiricalOptimalDenoiser.from_templates(templates, **schedule).eval()


def layout_experts(
    centres: list[tuple[float, float]], num_templates: int = 200, seed: int = 0, **schedule
) -> list[EmpiricalOptimalDenoiser]:
    """One [`colour_expert`] per centre, in colour order red, blue, green (template seeds `seed + k`)."""
    return [
        colour_expert(centre, colour, num_templates, seed + k, **schedule)
        for k, (centre, colour) in enumerate(zip(centres, COLOURS))
    ]


def layout_regions(centres: list[tuple[float, float]], size: int = CANVAS) -> torch.Tensor:
    """`(K, size, size)` oracle masks: the pixels any of expert `k`'s discs can cover (its box grown by the largest
    radius). Given to `RegionAllocator(regions)`, this is MultiDiffusion told the hidden layout."""
    coords = torch.arange(size, dtype=torch.float64) + 0.5
    masks = []
    for cx, cy in centres:
        dx = ((coords - cx).abs() - BOX_HALF_WIDTH).clamp_min(0).view(1, -1)
        dy = ((coords - cy).abs() - BOX_HALF_WIDTH).clamp_min(0).view(-1, 1)
        masks.append((dx**2 + dy**2 <= RADIUS_RANGE[1] ** 2).float())
    return torch.stack(masks)


def _colour_masks(image: np.ndarray, colour: str, min_intensity: float) -> np.ndarray:
    channel = int(np.argmax(COLOURS[colour]))
    others = [c for c in range(3) if c != channel]
    return (image[channel] > min_intensity) & np.all(image[channel] > image[others] + 0.25, axis=0)


def count_colour_blobs(
    images: torch.Tensor | np.ndarray, colours: list[str], min_area: int = 8, min_intensity: float = 0.6
) -> np.ndarray:
    """`(N, len(colours))` counts of blobs of each colour in `(N, 3, H, W)` images in [0, 1].

    A pixel has a colour when that channel exceeds `min_intensity` and exceeds both other channels by 0.25; a blob
    is a 4-connected component of at least `min_area` such pixels.
    """
    from scipy import ndimage

    array = images.detach().cpu().float().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if array.ndim != 4 or array.shape[1] != 3:
        raise ValueError(f"`images` must have shape (N, 3, H, W), got {array.shape}.")
    unknown = [c for c in colours if c not in COLOURS]
    if unknown:
        raise ValueError(f"`colours` must be among {list(COLOURS)}, got {unknown}.")
    counts = np.zeros((len(array), len(colours)), dtype=np.int64)
    for i, image in enumerate(array):
        for j, colour in enumerate(colours):
            labels, num = ndimage.label(_colour_masks(image, colour, min_intensity))
            if num:
                counts[i, j] = int((np.bincount(labels.ravel())[1:] >= min_area).sum())
    return counts


def colour_success(images, colours: list[str], min_area: int = 8, min_intensity: float = 0.6) -> np.ndarray:
    """`(N,)` booleans: exactly one blob of every requested colour."""
    return (count_colour_blobs(images, colours, min_area, min_intensity) == 1).all(axis=1)


def colour_object_scores(images, colour: str, min_area: int = 8, grid: np.ndarray | None = None) -> np.ndarray:
    """For `(N, 3, H, W)` images that each hold one real `colour` object: the largest detector threshold on `grid`
    (default 0.05, 0.06, ..., 0.99) at which the object is still found; 0 when it is never found. The calibration
    statistic of [`diffusers_ext.evaluation.protocol.calibrate_threshold`]."""
    grid = np.round(np.arange(0.05, 1.0, 0.01), 2) if grid is None else np.sort(np.asarray(grid))
    scores = np.zeros(len(images))
    for t in grid:
        found = count_colour_blobs(images, [colour], min_area, float(t))[:, 0] >= 1
        scores[found] = t
    return scores


# The disc judge: what a disc of radius RADIUS_RANGE looks like at the pixel scale of the canvas. Rendered discs
# (every centre, radius 2-3) cover 11-30 pixels, with axis ratios <= 1.33 and IoU >= 0.83 against the disc of
# their own area at their centroid; half discs pass 0.6% of the time, slivers never (tests/test_input_checks.py).
DISC_AREA_SLACK = (0.8, 1.25)
DISC_MAX_AXIS_RATIO = 1.35
DISC_MIN_IOU = 0.7
DISC_LEVEL = 0.5


def is_disc(mask: np.ndarray, radius_range: tuple[float, float] = RADIUS_RANGE) -> bool:
    """Whether the pixels of `mask` (`(H, W)` bool, one connected component) are a disc of radius in
    `radius_range`: an area within `DISC_AREA_SLACK` of the discs' `pi r^2` range, round (the axis ratio of its
    second moments at most `DISC_MAX_AXIS_RATIO`; a half disc's is 1.9, a sliver's >= 2) and filled (IoU at least
    `DISC_MIN_IOU` with the disc of its own area at its centroid; a crescent or a ring is not)."""
    ys, xs = np.nonzero(mask)
    area = len(xs)
    low, high = radius_range
    if not DISC_AREA_SLACK[0] * np.pi * low**2 <= area <= DISC_AREA_SLACK[1] * np.pi * high**2:
        return False
    cx, cy = xs.mean(), ys.mean()
    eigenvalues = np.linalg.eigvalsh(np.cov(np.stack([xs, ys]), bias=True) + np.eye(2) / 12)  # + a pixel's extent
    if np.sqrt(eigenvalues[1] / eigenvalues[0]) > DISC_MAX_AXIS_RATIO:
        return False
    yy, xx = np.mgrid[0 : mask.shape[0], 0 : mask.shape[1]]
    fitted = (xx - cx) ** 2 + (yy - cy) ** 2 <= area / np.pi
    return (fitted & mask).sum() / (fitted | mask).sum() >= DISC_MIN_IOU


def _disc_peaks(image: np.ndarray, colour: str, radius_range, level: float = DISC_LEVEL) -> list[float]:
    """The peak intensities of the `colour` discs of one `(3, H, W)` image: the components of its mask at `level`
    (default half strength; the channel dominant by 0.25) that [`is_disc`] accepts."""
    from scipy import ndimage

    channel = int(np.argmax(COLOURS[colour]))
    labels, num = ndimage.label(_colour_masks(image, colour, level))
    peaks = []
    for k in range(1, num + 1):
        component = labels == k
        if is_disc(component, radius_range):
            peaks.append(float(image[channel][component].max()))
    return peaks


def count_colour_discs(
    images: torch.Tensor | np.ndarray,
    colours: list[str],
    min_intensity: float = 0.6,
    radius_range: tuple[float, float] = RADIUS_RANGE,
) -> np.ndarray:
    """`(N, len(colours))` counts of the discs of each colour in `(N, 3, H, W)` images in [0, 1], judged by shape
    and size, not by pixel counts: a disc is a half-strength region of that colour (the channel above
    `DISC_LEVEL`, or `min_intensity` if lower, and above both others by 0.25) of disc shape and size ([`is_disc`])
    whose peak exceeds `min_intensity` (the calibrated strength). A sliver or a partial disc along a region boundary is no disc,
    whatever its pixels' strength; a clean disc whose rim is a little below full strength still is one."""
    array = images.detach().cpu().float().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if array.ndim != 4 or array.shape[1] != 3:
        raise ValueError(f"`images` must have shape (N, 3, H, W), got {array.shape}.")
    unknown = [c for c in colours if c not in COLOURS]
    if unknown:
        raise ValueError(f"`colours` must be among {list(COLOURS)}, got {unknown}.")
    counts = np.zeros((len(array), len(colours)), dtype=np.int64)
    for i, image in enumerate(array):
        for j, colour in enumerate(colours):
            peaks = _disc_peaks(image, colour, radius_range, min(DISC_LEVEL, min_intensity))
            counts[i, j] = sum(peak > min_intensity for peak in peaks)
    return counts


def colour_disc_success(images, colours: list[str], min_intensity: float = 0.6) -> np.ndarray:
    """`(N,)` booleans: exactly one disc of every requested colour ([`count_colour_discs`])."""
    return (count_colour_discs(images, colours, min_intensity) == 1).all(axis=1)


def colour_disc_scores(images, colour: str, grid: np.ndarray | None = None) -> np.ndarray:
    """[`colour_object_scores`] for the disc judge: for images that each hold one real `colour` disc, the largest
    threshold on `grid` (default 0.05 ... 0.99) below its peak, 0 when no disc is found."""
    grid = np.round(np.arange(0.05, 1.0, 0.01), 2) if grid is None else np.sort(np.asarray(grid))
    array = images.detach().cpu().float().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    scores = np.zeros(len(array))
    for i, image in enumerate(array):
        peaks = _disc_peaks(image, colour, RADIUS_RANGE)
        below = grid[grid < max(peaks)] if peaks else []
        scores[i] = below[-1] if len(below) else 0.0
    return scores


def solo_disc_scores(
    experts,
    scheduler,
    num_images: int,
    num_inference_steps: int,
    seeds: list[int],
    device: str = "cpu",
    discs: bool = False,
) -> list[float]:
    """The detector's calibration statistic on real objects: each disc expert `k` (colours in `COLOURS` order)
    sampled alone, `num_images` images from seed `seeds[k]`, scored by [`colour_object_scores`]. No composition
    method is involved; [`diffusers_ext.evaluation.protocol.calibrate_threshold`] turns the scores into a
    threshold. With `discs`, the statistic of the disc judge ([`colour_disc_scores`]) instead of the blob counter's."""
    from ... import AverageAllocator, DivideAndDenoisePipeline, MultiDenoiserModel

    if not 1 <= len(experts) <= len(COLOURS) or len(seeds) != len(experts):
        raise ValueError(f"need 1 to {len(COLOURS)} experts and one seed each, got {len(experts)} and {len(seeds)}.")
    scores = []
    for expert, colour, seed in zip(experts, COLOURS, seeds):
        alone = DivideAndDenoisePipeline(MultiDenoiserModel([expert]), scheduler).to(device)
        alone.set_progress_bar_config(disable=True)
        out = alone(
            num_inference_steps=num_inference_steps,
            num_images_per_prompt=num_images,
            generator=torch.Generator().manual_seed(seed),
            output_type="pt",
            allocator=AverageAllocator(),
        )
        statistic = colour_disc_scores if discs else colour_object_scores
        scores.extend(statistic(out.images.cpu(), colour).tolist())
    return scores
