r"""Judging prompt-level concept erasure on the mosaic world: prompt sets, concept presence, retention.

A *concept* is a colour (`"red"`) or a shape (`"circle"`) of the world. A prompt *asks for* the concept when one of
its named objects has that colour or shape. Forgetting is read by the exact judge (`MosaicEvaluator.detect`): the
concept is *present* in an image when some detected object has the colour (or shape). Retention is the judge's
accuracy on prompts that do not ask for the concept. Fréchet distances are computed in the features of the mosaic
world's one independent feature network, [`~diffusers_ext.evaluation.mosaic.MosaicFeatureNet`].

    >>> prompts = concept_prompt_sets(MosaicConfig(), "red", {"train": 32, "val": 48}, seed=0)
    >>> images = sample_prompts(pipe, [p["caption"] for p in prompts["val"]["forget"]], seed=0)
    >>> concept_presence(judge, images, "red")  # (N,) bool
"""

import numpy as np
import torch

from ..data.mosaic import PALETTE, SHAPES, MosaicConfig, mosaic_records
from .mosaic import feature_net_input


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
        stream = mosaic_records(
            config, 200 * (want_forget + want_retain), seed=seed * 101 + index, split="train" if training else "test"
        )
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


@torch.no_grad()
def classifier_concept_presence(net, config: MosaicConfig, images, concept: str) -> np.ndarray:
    """`(N,)` bool: whether a trained [`MosaicFeatureNet`] (`train_feature_net`, multi-label colour x shape) names
    any pair with the colour (or shape) `concept` in each image (`(N, H, W, 3)` arrays in [0, 1] or PIL images): a
    second concept judge, learned from real renders, beside the exact judge's rule-based detections
    ([`concept_presence`])."""
    key = concept_kind(concept)
    pairs = [(c, s) for c in config.colours for s in config.shapes]
    columns = [i for i, pair in enumerate(pairs) if pair[0 if key == "colour" else 1] == concept]
    if not columns:
        raise ValueError(f"`concept` {concept!r} is not among the {key}s of `config`.")
    return (net(feature_net_input(images))[:, columns] > 0).any(dim=1).numpy()


def judge_accuracy(judge, images, prompts: list[dict]) -> dict[str, np.ndarray]:
    """Per-skill verdicts as `{skill: (N,) float array}` (NaN where a skill does not apply), and `"overall"`."""
    verdicts = judge.evaluate_batch(images, prompts)
    skills = sorted({k for v in verdicts for k in v})
    return {s: np.array([float(v[s]) if s in v else np.nan for v in verdicts]) for s in skills}
