r"""An exact, rule-based judge of mosaic images: GenEval's skills (object, colour binding, count, relation).

The world is known (palette, background, shapes), so no detector has to be trained:

1. colour segmentation: a pixel is foreground when it differs from the background by more than
   `foreground_threshold` (in [0, 1] units, max over channels), and takes the palette colour whose direction from
   the background is closest in angle (cosine >= `min_cosine`, else it is dropped);
2. connected components of each colour: objects are the 4-connected components of the pixels whose coverage (the
   projection of the pixel onto its colour) is at least `core_threshold`, grown by the colour's other pixels within
   2 px (a faint bridge of blur does not merge two objects); a component's soft area is the sum of its pixels'
   coverage, and components smaller than `min_area` are noise (fringes
   where two colours meet, speckles); the coverage is then rescaled so that the component's 75th percentile
   is 1 (a dim object keeps its size);
3. shape: the component's coverage map is compared with a circle, a square and an upright triangle of the same area
   and centroid (soft IoU of 4x supersampled templates); the best fit wins.

A prompt's structure (`task`, `groups`, `relation`, as in `diffusers_ext.data.mosaic`) is then checked per skill:

- `object`: each named shape is present (any colour);
- `colour`: each named object is present with its colour;
- `count` (count prompts): the number of objects of the named colour and shape is exactly the count;
- `relation` (relation prompts): some object of group 0 and some object of group 1 stand in the relation (centroids,
  by at least `relation_margin` pixels along the relation's axis and by at least half the offset across it);
- `overall`: every skill that applies holds.

    >>> from diffusers_ext.evaluation.mosaic import MosaicEvaluator
    >>> judge = MosaicEvaluator(config)
    >>> judge.evaluate(image, row)  # row: a mosaic dataset row (or any dict with task/groups/relation)
    {'object': True, 'colour': True, 'count': True, 'overall': True}

[`evaluate_text_to_image`] applies the judge to a text-to-image pipeline's samples of mosaic prompts.

The world's one independent feature network, [`MosaicFeatureNet`] (trained by [`train_feature_net`] on real renders
only), gives the feature space of every Fréchet distance measured on mosaic images (mimicry, unlearning): it never
sees a generated image, the UNet, the VAE or the text encoder that the methods work through.
"""

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from ..data.mosaic import PALETTE, SIZES, MosaicConfig, images_to_tensor, mosaic_records, relation_holds


SKILLS = ("object", "colour", "count", "relation")
_SUB = 4  # template supersampling


@dataclass
class MosaicDetection:
    """One detected object: its shape and colour names, soft area (pixels), centroid `(x, y)` in pixels."""

    shape: str
    colour: str
    area: float
    x: float
    y: float
    fit: float  # soft IoU of the winning template


def _template(shape: str, area: float, cx: float, cy: float, height: int, width: int) -> np.ndarray:
    """Coverage in [0, 1] of a `shape` of `area` pixels with centroid `(cx, cy)` on a `(height, width)` grid."""
    ys = (np.arange(height * _SUB) + 0.5) / _SUB
    xs = (np.arange(width * _SUB) + 0.5) / _SUB
    x, y = np.meshgrid(xs, ys)
    if shape == "circle":
        inside = (x - cx) ** 2 + (y - cy) ** 2 <= area / np.pi
    elif shape == "square":
        h = np.sqrt(area) / 2
        inside = (np.abs(x - cx) <= h) & (np.abs(y - cy) <= h)
    else:  # upright triangle with apex (0, -h), base from (-h, h) to (h, h) around its box centre; area 2 h^2
        h = np.sqrt(area / 2)
        by = cy - h / 3  # the centroid lies h/3 below the box centre
        t = (y - (by - h)) / (2 * h)  # 0 at the apex, 1 at the base
        inside = (t >= 0) & (t <= 1) & (np.abs(x - cx) <= t * h)
    return inside.reshape(height, _SUB, width, _SUB).mean(axis=(1, 3))


class MosaicEvaluator:
    r"""
    Rule-based detector and per-skill judge for images of a mosaic world.

    Args:
        config (`MosaicConfig`, *optional*): the world (palette, background, shapes, resolution); default
            `MosaicConfig()`.
        foreground_threshold (`float`, defaults to 0.2): minimum max-channel difference from the background, in
            [0, 1] units.
        min_cosine (`float`, defaults to 0.9): minimum cosine between a pixel's and its colour's direction from
            the background.
        min_area (`float`, *optional*): minimum soft area of an object in pixels; default 35% of the smallest
            object the world draws (a small triangle).
        relation_margin (`float`, *optional*): minimum centroid offset along a relation's axis, in pixels;
            default `resolution / 32`.
        core_threshold (`float`, defaults to 0.5): coverage of the pixels that separate objects (see `detect`).
    """

    def __init__(
        self,
        config: MosaicConfig | None = None,
        foreground_threshold: float = 0.2,
        min_cosine: float = 0.9,
        min_area: float | None = None,
        relation_margin: float | None = None,
        core_threshold: float = 0.5,
    ):
        self.config = config or MosaicConfig()
        if not 0 < foreground_threshold < 1:
            raise ValueError(f"`foreground_threshold` must lie in (0, 1), got {foreground_threshold}.")
        if not -1 <= min_cosine < 1:
            raise ValueError(f"`min_cosine` must lie in [-1, 1), got {min_cosine}.")
        res = self.config.resolution
        smallest = min(SIZES[s] for s in self.config.sizes) * res
        self.min_area = 0.35 * 2 * smallest**2 if min_area is None else float(min_area)
        self.relation_margin = res / 32 if relation_margin is None else float(relation_margin)
        if self.min_area <= 0 or self.relation_margin < 0:
            raise ValueError(
                f"`min_area` must be > 0 and `relation_margin` >= 0, got {self.min_area} and {self.relation_margin}."
            )
        if not 0 < core_threshold < 1:
            raise ValueError(f"`core_threshold` must lie in (0, 1), got {core_threshold}.")
        self.core_threshold = core_threshold
        self.foreground_threshold = foreground_threshold
        self.min_cosine = min_cosine
        self.background = np.asarray(self.config.background, dtype=np.float64) / 255
        self.colour_names = list(self.config.colours)
        directions = np.array([PALETTE[c] for c in self.colour_names], dtype=np.float64) / 255 - self.background
        self.colour_lengths = np.linalg.norm(directions, axis=1)
        self.colour_directions = directions / self.colour_lengths[:, None]

    # -----------------------------------------------------------------------------------------------------------------

    def _to_array(self, image) -> np.ndarray:
        """A PIL image, an `(H, W, 3)` array (uint8, or float in [0, 1]) or a `(3, H, W)` tensor in [0, 1] ->
        float64 `(H, W, 3)` in [0, 1]."""
        if hasattr(image, "convert"):
            image = np.asarray(image.convert("RGB"))
        elif hasattr(image, "detach"):
            image = image.detach().cpu().float().numpy()
            if image.ndim == 3 and image.shape[0] == 3:
                image = image.transpose(1, 2, 0)
        array = np.asarray(image)
        if array.ndim != 3 or array.shape[2] != 3:
            raise ValueError(f"`image` must be RGB of shape (H, W, 3) (or a (3, H, W) tensor), got {array.shape}.")
        if array.dtype == np.uint8:
            return array.astype(np.float64) / 255
        return np.clip(array.astype(np.float64), 0, 1)

    def detect(self, image) -> list[MosaicDetection]:
        """The objects in `image` (see the module docstring), sorted by area, largest first."""
        pixels = self._to_array(image) - self.background
        height, width = pixels.shape[:2]
        foreground = np.abs(pixels).max(axis=2) > self.foreground_threshold
        norms = np.linalg.norm(pixels, axis=2) + 1e-12
        cosines = pixels @ self.colour_directions.T / norms[..., None]
        label = cosines.argmax(axis=2)
        foreground &= cosines.max(axis=2) >= self.min_cosine
        detections = []
        for index, colour in enumerate(self.colour_names):
            mask = foreground & (label == index)
            if not mask.any():
                continue
            coverage = np.clip(pixels @ self.colour_directions[index] / self.colour_lengths[index], 0, 1)
            # objects are separated on their cores (coverage >= core_threshold, 4-connected), so that a faint
            # bridge of blur between two objects of one colour does not merge them; then every other pixel of the
            # mask joins the nearest core within 2 pixels
            core = mask & (coverage >= self.core_threshold)
            components, count = ndimage.label(core)
            if count:
                distance, (iy, ix) = ndimage.distance_transform_edt(components == 0, return_indices=True)
                nearest = components[iy, ix]
                components = np.where(core, components, np.where(mask & (distance <= 2), nearest, 0))
            for component in range(1, count + 1):
                alpha = np.where(components == component, coverage, 0.0)
                if alpha.sum() < self.min_area:
                    continue
                # a dim or faded object still has its full extent: rescale its coverage so that its core is 1
                alpha = np.clip(alpha / max(np.percentile(alpha[alpha > 0], 75), 0.5), 0, 1)
                area = float(alpha.sum())
                ys, xs = np.nonzero(alpha)
                weights = alpha[ys, xs]
                cx, cy = float((weights * (xs + 0.5)).sum() / area), float((weights * (ys + 0.5)).sum() / area)
                best, best_fit = None, -1.0
                for shape in self.config.shapes:
                    template = _template(shape, area, cx, cy, height, width)
                    fit = float(np.minimum(alpha, template).sum() / np.maximum(alpha, template).sum())
                    if fit > best_fit:
                        best, best_fit = shape, fit
                detections.append(MosaicDetection(best, colour, area, cx, cy, best_fit))
        return sorted(detections, key=lambda d: -d.area)

    def evaluate(self, image, prompt: dict) -> dict[str, bool]:
        r"""
        Judge one image against one prompt structure.

        Args:
            image: a PIL image, an `(H, W, 3)` array or a `(3, H, W)` tensor in [0, 1].
            prompt (`dict`): `task`, `groups` (`[{"colour", "shape", "count"}, ...]`) and `relation` (a mosaic
                dataset row works as is).

        Returns:
            `dict[str, bool]`: the skills that apply to the prompt, and `"overall"`.
        """
        self._check_prompt(prompt)
        return self.judge(self.detect(image), prompt)

    def judge(self, detections: list[MosaicDetection], prompt: dict) -> dict[str, bool]:
        """Per-skill verdicts of `prompt` given already detected objects."""
        groups, task = prompt["groups"], prompt["task"]

        def matches(group):
            return [d for d in detections if d.shape == group["shape"] and d.colour == group["colour"]]

        result = {
            "object": all(any(d.shape == g["shape"] for d in detections) for g in groups),
            "colour": all(len(matches(g)) > 0 for g in groups),
        }
        if task == "count":
            result["count"] = len(matches(groups[0])) == groups[0]["count"]
        if task == "relation":
            result["relation"] = any(
                relation_holds(prompt["relation"], (a.x, a.y), (b.x, b.y), self.relation_margin)
                for a in matches(groups[0])
                for b in matches(groups[1])
            )
        result["overall"] = all(result.values())
        return result

    def evaluate_batch(self, images, prompts: list) -> list[dict[str, bool]]:
        """`evaluate` over paired lists (or a `(N, 3, H, W)` tensor / `(N, H, W, 3)` array of images)."""
        if len(images) != len(prompts):
            raise ValueError(f"got {len(images)} images but {len(prompts)} prompts; pass one prompt per image.")
        for prompt in prompts:
            self._check_prompt(prompt)
        return [self.evaluate(image, prompt) for image, prompt in zip(images, prompts)]

    def _check_prompt(self, prompt: dict) -> None:
        if not isinstance(prompt, dict) or not {"task", "groups"} <= set(prompt):
            raise ValueError(f"`prompt` must be a dict with 'task', 'groups' (and 'relation'), got {prompt!r}.")
        if prompt["task"] == "relation" and (len(prompt["groups"]) < 2 or not prompt.get("relation")):
            raise ValueError(f"a relation prompt needs two groups and a 'relation', got {prompt!r}.")
        for group in prompt["groups"]:
            if group["shape"] not in self.config.shapes or group["colour"] not in self.colour_names:
                raise ValueError(
                    f"group {group!r} names a shape or colour outside the world ({self.config.shapes}, "
                    f"{tuple(self.colour_names)})."
                )


def summarize(results: list[dict[str, bool]], prompts: list | None = None) -> dict:
    r"""
    Accuracy per skill (over the prompts it applies to), `overall`, the number of prompts per skill, and, when
    `prompts` are given, `overall` per task.
    """
    if not results:
        raise ValueError("`results` is empty.")
    summary = {"overall": float(np.mean([r["overall"] for r in results])), "n": len(results)}
    for skill in SKILLS:
        values = [r[skill] for r in results if skill in r]
        if values:
            summary[skill] = float(np.mean(values))
            summary[f"n_{skill}"] = len(values)
    if prompts is not None:
        by_task: dict[str, list] = {}
        for r, p in zip(results, prompts):
            by_task.setdefault(p["task"], []).append(r["overall"])
        summary["by_task"] = {task: float(np.mean(v)) for task, v in sorted(by_task.items())}
    return summary


def corrupt_prompt(prompt: dict, skill: str, config: MosaicConfig, rng) -> dict | None:
    r"""
    A copy of `prompt` that the image no longer satisfies in `skill` (and only there, as far as possible), for
    measuring the judge's specificity: `object` swaps a named shape for an absent one, `colour` swaps a colour for
    one no object of that shape has, `count` moves the count by one, `relation` flips the relation. Returns None
    when the skill cannot be corrupted for this prompt (e.g. `count` of a single-object prompt).

    `rng` is a `random.Random`.
    """
    import copy

    groups = prompt["groups"]
    out = copy.deepcopy({k: prompt[k] for k in ("task", "groups", "relation")})
    present_shapes = {o["shape"] for o in prompt.get("objects", [])} or {g["shape"] for g in groups}
    if skill == "object":
        absent = [s for s in config.shapes if s not in present_shapes]
        if not absent:
            return None
        out["groups"][rng.randrange(len(groups))]["shape"] = rng.choice(absent)
    elif skill == "colour":
        i = rng.randrange(len(groups))
        used = {o["colour"] for o in prompt.get("objects", []) if o["shape"] == groups[i]["shape"]}
        used |= {g["colour"] for g in groups if g["shape"] == groups[i]["shape"]}
        others = [c for c in config.colours if c not in used]
        if not others:
            return None
        out["groups"][i]["colour"] = rng.choice(others)
    elif skill == "count":
        if prompt["task"] != "count":
            return None
        n = groups[0]["count"]
        out["groups"][0]["count"] = n + 1 if n == 2 or rng.random() < 0.5 else n - 1
    elif skill == "relation":
        if prompt["task"] != "relation":
            return None
        opposite = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
        out["relation"] = opposite[prompt["relation"]]
    else:
        raise ValueError(f"`skill` must be one of {SKILLS}, got {skill!r}.")
    return out


@torch.no_grad()
def evaluate_text_to_image(
    pipe,
    config: MosaicConfig,
    num_prompts: int,
    seed: int,
    guidance_scale: float,
    num_inference_steps: int,
    split: str = "test",
    batch_size: int = 50,
    pipeline_kwargs: dict | None = None,
) -> dict:
    r"""
    Per-skill judge accuracy ([`summarize`]) of a text-to-image pipeline on `num_prompts` mosaic prompts.

    Args:
        pipe: a `StableDiffusionPipeline`-like pipeline that takes a list of prompts, `height`, `width`,
            `num_inference_steps`, `guidance_scale`, `generator` and `output_type="np"`.
        config (`MosaicConfig`): the world; its `resolution` is the sampled size.
        num_prompts (`int`): prompts drawn from the mosaic stream of `split` with seed `seed`.
        seed (`int`): the prompt stream's seed; batch `k` (starting at prompt `start`) samples with
            `torch.Generator().manual_seed(seed * 1000 + start)`.
        guidance_scale (`float`), num_inference_steps (`int`): passed to `pipe`.
        split (`str`, defaults to `"test"`): the mosaic split the prompts come from.
        batch_size (`int`, defaults to 50): prompts per pipeline call.
        pipeline_kwargs (`dict`, *optional*): more arguments of every call (an SD3 pipeline's
            `max_sequence_length`, say).
    """
    rows = list(mosaic_records(config, num_prompts, seed, split))
    judge = MosaicEvaluator(config)
    results = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        images = pipe(
            [r["caption"] for r in chunk],
            height=config.resolution,
            width=config.resolution,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            generator=torch.Generator().manual_seed(seed * 1000 + start),
            output_type="np",
            **(pipeline_kwargs or {}),
        ).images
        results += [judge.evaluate(image, row) for image, row in zip(images, chunk)]
    return summarize(results, rows)


def capability_on_validation(
    pipe,
    config: MosaicConfig,
    num_prompts: int,
    guidance_grid: list[float],
    num_inference_steps: int,
    split_seeds: dict[str, int],
    validation_fraction: float = 0.5,
    batch_size: int = 50,
    pipeline_kwargs: dict | None = None,
) -> dict:
    r"""
    [`evaluate_text_to_image`] at every guidance scale of `guidance_grid` on validation prompts, the best (by
    `overall`) measured once on test: the `choose_on_validation` record of the headroom benchmarks.

    Args:
        num_prompts (`int`): test prompts; validation uses `round(num_prompts * validation_fraction)` (at least 1).
        split_seeds (`dict[str, int]`): the mosaic test split's prompt-stream seed of `"validation"` and `"test"`.
        The others are [`evaluate_text_to_image`]'s.
    """
    from .reporting import choose_on_validation

    def measure(guidance, split):
        count = max(1, round(num_prompts * validation_fraction)) if split == "validation" else num_prompts
        return evaluate_text_to_image(
            pipe,
            config,
            count,
            split_seeds[split],
            guidance,
            num_inference_steps,
            split="test",
            batch_size=batch_size,
            pipeline_kwargs=pipeline_kwargs,
        )

    return choose_on_validation(
        list(guidance_grid), measure, score=lambda m: m["overall"], names=lambda g: f"guidance {g}"
    )


# ---------------------------------------------------------------------------------------------------------------------
# The independent feature network
# ---------------------------------------------------------------------------------------------------------------------


class MosaicFeatureNet(torch.nn.Module):
    r"""A small CNN on `(N, 3, H, W)` images in [-1, 1] (any size: the last pooling is global): `features` gives
    `(N, feature_dim)`, `forward` the logits of which colour x shape pairs the scene holds
    (`(N, len(colours) * len(shapes))`, multi-label)."""

    def __init__(self, num_labels: int, feature_dim: int = 16, width: int = 16):
        super().__init__()
        # max-pooling reads "is there an object like this anywhere", which is what the labels ask
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, width, 3, padding=1),
            torch.nn.SiLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(width, width * 2, 3, padding=1),
            torch.nn.SiLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(width * 2, width * 4, 3, padding=1),
            torch.nn.SiLU(),
            torch.nn.AdaptiveMaxPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(width * 4, feature_dim),
            torch.nn.SiLU(),
        )
        self.head = torch.nn.Linear(feature_dim, num_labels)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(images))


@dataclass
class FeatureNetReport:
    """What the feature network learned: exact-set accuracy and per-label accuracy on held-out real renders."""

    exact_accuracy: float
    label_accuracy: float
    num_heldout: int
    seconds: float


def _labels(rows: list[dict], config: MosaicConfig) -> torch.Tensor:
    pairs = [(c, s) for c in config.colours for s in config.shapes]
    labels = torch.zeros(len(rows), len(pairs))
    for i, row in enumerate(rows):
        for obj in row["objects"]:
            labels[i, pairs.index((obj["colour"], obj["shape"]))] = 1.0
    return labels


def train_feature_net(
    config: MosaicConfig, num_train: int = 2000, num_heldout: int = 500, steps: int = 800, seed: int = 0
) -> tuple[MosaicFeatureNet, FeatureNetReport]:
    """Train [`MosaicFeatureNet`] on real renders of `config` (train split, its own seed) to name the colour x shape
    pairs of each scene; report its accuracy on held-out renders (test split)."""
    start = time.perf_counter()
    torch.manual_seed(seed)
    train_rows = list(mosaic_records(config, num_train, seed=seed + 7_000, split="train"))
    heldout_rows = list(mosaic_records(config, num_heldout, seed=seed + 7_001, split="test"))
    x_train, y_train = images_to_tensor([r["image"] for r in train_rows]), _labels(train_rows, config)
    x_held, y_held = images_to_tensor([r["image"] for r in heldout_rows]), _labels(heldout_rows, config)
    net = MosaicFeatureNet(y_train.shape[1])
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        index = torch.randint(0, len(x_train), (64,), generator=generator)
        loss = F.binary_cross_entropy_with_logits(net(x_train[index]), y_train[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    net.eval().requires_grad_(False)
    with torch.no_grad():
        predicted = net(x_held) > 0
    correct = predicted == y_held.bool()
    report = FeatureNetReport(
        exact_accuracy=float(correct.all(1).float().mean()),
        label_accuracy=float(correct.float().mean()),
        num_heldout=num_heldout,
        seconds=time.perf_counter() - start,
    )
    return net, report


@torch.no_grad()
def feature_net_input(images) -> torch.Tensor:
    """[`MosaicFeatureNet`]'s input `(N, 3, H, W)` in [-1, 1] from `(N, H, W, 3)` images in [0, 1] (an array) or a
    list of PIL images."""
    if isinstance(images, np.ndarray):
        return torch.from_numpy(np.asarray(images, dtype=np.float32)).permute(0, 3, 1, 2) * 2 - 1
    return images_to_tensor(images)


def image_features(net: MosaicFeatureNet, images) -> torch.Tensor:
    """`(N, feature_dim)` features of `(N, H, W, 3)` images in [0, 1] (arrays) or PIL images."""
    return net.features(feature_net_input(images))
