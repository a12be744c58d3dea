r"""
Subjects for DreamBooth-style tests on mosaic: a fixed arrangement of mosaic shapes, redrawn at random positions and
scales, captioned with a word the zoo model never saw in training.

A subject is a list of parts `(colour, shape, dx, dy, scale)`: offsets and half extents in units of the subject's
size. Each image places the subject at a random centre and size (like photographs of one object from different
distances), so a mimic must learn the arrangement, not one picture. Parts are the mosaic world's flat colours and
shapes, which the zoo model's VAE reconstructs well (about 27 dB); textures the world never drew (outlines, stripes)
come back at about 17 dB, so a mimic of them would be capped by the VAE rather than by any protection.

The caption binds the subject to an unused word of the vocabulary: the zoo model `mosaic-t2i` was trained on red,
green, blue and yellow only, so the tokens `"cyan"` and `"magenta"` exist in its tokenizer but their embeddings were
never trained (DreamBooth's rare identifier).
"""

import random
from dataclasses import dataclass

from ..utils import check_positive_int
from .mosaic import PALETTE, SHAPES, MosaicConfig, images_to_tensor, render_objects


@dataclass(frozen=True)
class MosaicSubject:
    r"""
    Args:
        name (`str`): a label for results.
        caption (`str`): the prompt that names the subject.
        parts (`tuple`): `(colour, shape, dx, dy, scale)` per part: colour a key of `PALETTE`, shape one of `SHAPES`,
            the part's centre offset and half extent in units of the subject's half size.
    """

    name: str
    caption: str
    parts: tuple

    def __post_init__(self):
        if not self.parts:
            raise ValueError(f"`parts` of subject {self.name!r} is empty; expected at least one part.")
        for part in self.parts:
            if len(part) != 5 or part[0] not in PALETTE or part[1] not in SHAPES or part[4] <= 0:
                raise ValueError(
                    f"subject {self.name!r}: part {part!r} must be (colour in {tuple(PALETTE)}, shape in {SHAPES}, "
                    "dx, dy, scale > 0)."
                )


SUBJECTS = {
    # a yellow circle sitting on a blue square, a small red square to its right
    "tower": MosaicSubject(
        "tower",
        "a cyan square",
        (
            ("blue", "square", 0.0, 0.45, 0.55),
            ("yellow", "circle", 0.0, -0.55, 0.42),
            ("red", "square", 0.85, 0.75, 0.22),
        ),
    ),
    # a green triangle on a red square, a yellow circle at its top left
    "rocket": MosaicSubject(
        "rocket",
        "a magenta triangle",
        (
            ("red", "square", 0.0, 0.55, 0.42),
            ("green", "triangle", 0.0, -0.35, 0.55),
            ("yellow", "circle", -0.75, -0.75, 0.22),
        ),
    ),
}


def subject_images(subject: MosaicSubject | str, num_images: int, seed: int = 0, resolution: int = 32):
    r"""
    Render `num_images` pictures of `subject` (a `MosaicSubject` or a key of `SUBJECTS`), image `i` a function of
    `(subject, seed, i)` alone.

    Returns:
        `torch.Tensor` of shape `(num_images, 3, resolution, resolution)` in [-1, 1].
    """
    if isinstance(subject, str):
        if subject not in SUBJECTS:
            raise ValueError(f"`subject` must be a MosaicSubject or one of {sorted(SUBJECTS)}, got {subject!r}.")
        subject = SUBJECTS[subject]
    check_positive_int("num_images", num_images)
    config = MosaicConfig(resolution=resolution)
    images = []
    for index in range(num_images):
        rng = random.Random(f"subject-{subject.name}-{seed}-{index}")
        half = rng.uniform(0.22, 0.32) * resolution
        reach = half * max(max(abs(dx), abs(dy)) + s for _, _, dx, dy, s in subject.parts)
        cx = rng.uniform(reach + 0.5, resolution - reach - 0.5)
        cy = rng.uniform(reach + 0.5, resolution - reach - 0.5)
        objects = [
            {"colour": c, "shape": s, "x": cx + dx * half, "y": cy + dy * half, "half_extent": scale * half}
            for c, s, dx, dy, scale in subject.parts
        ]
        images.append(render_objects(config, objects))
    return images_to_tensor(images)
