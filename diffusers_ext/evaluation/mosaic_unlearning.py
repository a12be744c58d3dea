r"""Judging prompt-level concept erasure on the mosaic world: prompt sets, concept presence, retention, an independent
feature network for Fréchet distances.

A *concept* is a colour (`"red"`) or a shape (`"circle"`) of the world. A prompt *asks for* the concept when one of
its named objects has that colour or shape. Forgetting is read by the exact judge (`MosaicEvaluator.detect`): the
concept is *present* in an image when some detected object has the colour (or shape). Retention is the judge's
accuracy on prompts that do not ask for the concept. Fréchet distances are computed in the features of
[`MosaicFeatureNet`], a small CNN trained on real renders to name the colour x shape pairs a scene holds: it never
sees a generated image, the UNet, the VAE or the text encoder.

    >>> prompts = concept_prompt_sets(MosaicConfig(), "red", {"train": 32, "val": 48}, seed=0)
    >>> images = sample_prompts(pipe, [p["caption"] for p in prompts["val"]["forget"]], seed=0)
    >>> concept_presence(judge, images, "red")  # (N,) bool
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..data.mosaic import PALETTE, SHAPES, MosaicConfig, images_to_tensor, mosaic_records


def concept_kind(concept: str) -> str:
    """`"colour"` or `"shape"`: which attribute of an object `concept` names."""
    if concept in PALETTE:
        return "colour"
    if concept in SHAPES:
        return "shape"
    raise ValueError(f"`concept` must be a mosaic colour {tuple(PALETTE)} or shape {SHAPES}, got {concept!r}.")


def asks_for(prompt: dict, concept: str) -> bool:
    """Whether a prompt structure (`groups` of `{"colour", "shape", ...}`) names an object with `concept`."""
    key = concept_kind(concept)
    return any(group[key] == concept for group in prompt["groups"])


def concept_prompt_sets(config: MosaicConfig, concept: str, sizes: dict, seed: int = 0) -> dict:
    r"""
    Prompt sets that ask for `concept` (`"forget"`) and that do not (`"retain"`), one pair per entry of
    `sizes`.

    Args:
        config (`MosaicConfig`): the world; `concept` must be one of its colours or shapes.
        concept (`str`): the colour or shape.
        sizes (`dict[str, int | tuple[int, int]]`): set name (e.g. `"train"`, `"val"`, `"test"`) -> number of
            prompts of each kind (or `(forget, retain)`). A set named `"train"` draws distinct captions from the
            mosaic train split (the prompts an unlearning method is given); every other set draws i.i.d. scenes of
            the test split (the natural mix of tasks, repeats allowed), each set from its own stream.
        seed (`int`): stream seed.

    Returns:
        `dict[str, dict[str, list[dict]]]`: `{set: {"forget": [...], "retain": [...]}}`, each prompt a dict with
        `caption`, `task`, `groups`, `relation` and the scene's real render `image` (PIL).
    """
    kind = concept_kind(concept)
    if concept not in getattr(config, kind + "s"):
        raise ValueError(f"`concept` {concept!r} is not one of this world's {kind}s {getattr(config, kind + 's')}.")
    seen: set[str] = set()
    result = {}
    for index, (name, size) in enumerate(sizes.items()):
        want_forget, want_retain = (size, size) if isinstance(size, int) else size
        if want_forget < 1 or want_retain < 1:
            raise ValueError(f"`sizes[{name!r}]` must ask for at least one prompt of each kind, got {size!r}.")
        forget, retain = [], []
        training = name == "train"
        stream = mosaic_records(config, 200 * (want_forget + want_retain), seed=seed * 101 + index,
                                split="train" if training else "test")  # fmt: skip
        for row in stream:
            if len(forget) >= want_forget and len(retain) >= want_retain:
                break
            if training and row["caption"] in seen:
                continue
            bucket, want = (forget, want_forget) if asks_for(row, concept) else (retain, want_retain)
            if len(bucket) < want:
                seen.add(row["caption"])
                bucket.append({k: row[k] for k in ("caption", "task", "groups", "relation", "image")})
        if len(forget) < want_forget or len(retain) < want_retain:
            raise ValueError(
                f"set {name!r}: found only {len(forget)} / {len(retain)} prompts that ask / do not ask for "
                f"{concept!r}; ask for fewer."
            )
        result[name] = {"forget": forget, "retain": retain}
    return result


@torch.no_grad()
def sample_prompts(
    pipe, captions: list[str], seed: int, num_inference_steps: int = 10, guidance_scale: float = 4.0, batch_size=64
) -> np.ndarray:
    """`(N, H, W, 3)` float images in [0, 1] of a `StableDiffusionPipeline`, one per caption. The initial latents are
    a function of `(seed, index)` only, so two models sampled with one seed start every prompt from the same noise
    (paired comparisons)."""
    if not captions:
        raise ValueError("`captions` is empty.")
    unet = pipe.unet
    size = unet.config.sample_size
    shape = (len(captions), unet.config.in_channels, size, size)
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    height = size * pipe.vae_scale_factor
    images = []
    for start in range(0, len(captions), batch_size):
        chunk = captions[start : start + batch_size]
        out = pipe(
            chunk,
            height=height,
            width=height,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            latents=latents[start : start + len(chunk)].to(unet.device, unet.dtype),
            output_type="np",
        )
        images.append(out.images)
    return np.concatenate(images)


def concept_presence(judge, images, concept: str) -> np.ndarray:
    """`(N,)` bool: whether the judge detects an object of the colour (or shape) `concept` in each image."""
    key = concept_kind(concept)
    return np.array([any(getattr(d, key) == concept for d in judge.detect(image)) for image in images], dtype=bool)


def judge_accuracy(judge, images, prompts: list[dict]) -> dict[str, np.ndarray]:
    """Per-skill verdicts as `{skill: (N,) float array}` (NaN where a skill does not apply), and `"overall"`."""
    verdicts = judge.evaluate_batch(images, prompts)
    skills = sorted({k for v in verdicts for k in v})
    return {s: np.array([float(v[s]) if s in v else np.nan for v in verdicts]) for s in skills}


# ---------------------------------------------------------------------------------------------------------------------
# The independent feature network
# ---------------------------------------------------------------------------------------------------------------------


class MosaicFeatureNet(torch.nn.Module):
    r"""A small CNN on `(N, 3, 32, 32)` images in [-1, 1]: `features` gives `(N, feature_dim)`, `forward` the logits
    of which colour x shape pairs the scene holds (`(N, len(colours) * len(shapes))`, multi-label)."""

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
    import time

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
def image_features(net: MosaicFeatureNet, images) -> torch.Tensor:
    """`(N, feature_dim)` features of `(N, H, W, 3)` images in [0, 1] (arrays) or PIL images."""
    if isinstance(images, np.ndarray):
        tensor = torch.from_numpy(np.asarray(images, dtype=np.float32)).permute(0, 3, 1, 2) * 2 - 1
    else:
        tensor = images_to_tensor(images)
    return net.features(tensor)
