r"""mosaic: controlled multi-object text-to-image data (Multi-Object Spatial relations, AttrIbution, Counting).

Scenes of flat shapes (circle, square, triangle) with a colour and a size on a plain background, rendered at a
chosen resolution, each with a templated caption and exact ground truth: the caption's structure (which objects,
how many, which relation) and every drawn object's shape, colour, size, centre and extent in pixels.

Four kinds of prompts, the skills of GenEval:

- `"single"`: one object, `"a red circle"`.
- `"pair"`: two different objects, `"a red circle and a blue square"` (colour binding).
- `"count"`: several copies of one object, `"three green triangles"`.
- `"relation"`: two objects in a spatial relation, `"a red circle to the left of a blue square"`.

The knobs of the study:

- complexity: `extra_objects` more objects in every scene, named in the caption (`"..., and a yellow square"`);
- imbalance: a Zipf law of exponent `zipf_exponent` over the colour x shape concepts (rank order fixed by
  `split_seed`);
- compositional split: a share `heldout_fraction` of the colour x shape, count x shape and shape x relation x shape
  combinations never appears in `"train"`/`"test"` scenes; the `"heldout"` split holds only scenes that use them.

Everything is a function of the config and the sample's seed and index: `mosaic_dataset(config, 1000, seed=0)` is
the same on every machine, and sample `i` does not depend on how many samples are drawn.

    >>> from diffusers_ext.data.mosaic import MosaicConfig, mosaic_dataset
    >>> data = mosaic_dataset(MosaicConfig(resolution=32), num_samples=8, seed=0)
    >>> data[0]["caption"], data[0]["image"].size
    ('two blue circles', (32, 32))

From the command line (a `datasets.Dataset.save_to_disk` folder, reloaded with `datasets.load_from_disk`):

    python -m diffusers_ext.data.mosaic --output_dir mosaic-train --num_samples 20000 --split train
"""

import argparse
import os
import random
from dataclasses import asdict, dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from ..utils import check_positive_int


SHAPES = ("circle", "square", "triangle")
PALETTE = {
    "red": (220, 45, 40),
    "green": (40, 175, 60),
    "blue": (45, 90, 235),
    "yellow": (240, 205, 35),
    "magenta": (205, 50, 205),
    "cyan": (40, 200, 215),
}
SIZES = {"small": 0.11, "large": 0.17}  # half extent of an object as a share of the image side
RELATIONS = ("left of", "right of", "above", "below")
TASKS = ("single", "pair", "count", "relation")
SPLITS = ("train", "test", "heldout")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_SUPERSAMPLE = 4  # shapes are drawn 4x larger and box-filtered down: anti-aliased edges


@dataclass(frozen=True)
class MosaicConfig:
    r"""
    What a mosaic world holds and how its scenes are drawn. Frozen: a config names one dataset.

    Args:
        resolution (`int`, defaults to 32): image side in pixels (>= 16).
        shapes (`tuple[str]`): object shapes, a subset of `SHAPES`.
        colours (`tuple[str]`): colour names, keys of `PALETTE`.
        sizes (`tuple[str]`): size names, keys of `SIZES`.
        relations (`tuple[str]`): spatial relations, a subset of `RELATIONS`.
        tasks (`tuple[str]`): prompt kinds to draw, a subset of `TASKS`.
        task_weights (`tuple[float]`, *optional*): relative frequency of each task (default: equal).
        max_count (`int`, defaults to 4): largest count of `"count"` prompts (counts are 2..max_count).
        extra_objects (`int`, defaults to 0): further single objects in every scene, named in the caption
            (scene complexity).
        zipf_exponent (`float`, defaults to 0.0): Zipf exponent `s` of the colour x shape concept frequencies,
            `p(rank r) ~ r^-s` (0 is uniform).
        heldout_fraction (`float`, defaults to 0.0): share of each combination family (colour x shape,
            count x shape, shape x relation x shape) held out of `"train"`/`"test"`, in [0, 0.75].
        describe_size (`bool`, defaults to False): name the size in captions (`"a small red circle"`).
        background (`tuple[int]`, defaults to black): background RGB.
        split_seed (`int`, defaults to 0): seed of the held-out combinations and of the Zipf rank order.
    """

    resolution: int = 32
    shapes: tuple = SHAPES
    colours: tuple = ("red", "green", "blue", "yellow")
    sizes: tuple = ("small", "large")
    relations: tuple = RELATIONS
    tasks: tuple = TASKS
    task_weights: tuple | None = None
    max_count: int = 4
    extra_objects: int = 0
    zipf_exponent: float = 0.0
    heldout_fraction: float = 0.0
    describe_size: bool = False
    background: tuple = (0, 0, 0)
    split_seed: int = 0

    def __post_init__(self):
        for name in ("shapes", "colours", "sizes", "relations", "tasks", "background"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.task_weights is not None:
            object.__setattr__(self, "task_weights", tuple(float(w) for w in self.task_weights))
        check_positive_int("resolution", self.resolution, minimum=16)
        for name, allowed in (
            ("shapes", SHAPES),
            ("colours", tuple(PALETTE)),
            ("sizes", tuple(SIZES)),
            ("relations", RELATIONS),
            ("tasks", TASKS),
        ):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values) or any(v not in allowed for v in values):
                raise ValueError(f"`{name}` must be distinct values from {allowed}, got {values}.")
        if len(self.shapes) * len(self.colours) < 2 + self.extra_objects:
            raise ValueError(
                f"{len(self.shapes)} shapes x {len(self.colours)} colours cannot fill scenes of "
                f"{2 + self.extra_objects} distinct objects (`extra_objects`={self.extra_objects})."
            )
        if self.task_weights is not None and (
            len(self.task_weights) != len(self.tasks) or min(self.task_weights) < 0 or sum(self.task_weights) <= 0
        ):
            raise ValueError(
                f"`task_weights` must be {len(self.tasks)} non-negative numbers with a positive sum (one per task "
                f"of {self.tasks}), got {self.task_weights}."
            )
        if not isinstance(self.max_count, int) or not 2 <= self.max_count <= 9:
            raise ValueError(f"`max_count` must be an int in [2, 9], got {self.max_count!r}.")
        if not isinstance(self.extra_objects, int) or not 0 <= self.extra_objects <= 6:
            raise ValueError(f"`extra_objects` must be an int in [0, 6], got {self.extra_objects!r}.")
        if not self.zipf_exponent >= 0:
            raise ValueError(f"`zipf_exponent` must be >= 0, got {self.zipf_exponent}.")
        if not 0 <= self.heldout_fraction <= 0.75:
            raise ValueError(f"`heldout_fraction` must lie in [0, 0.75], got {self.heldout_fraction}.")
        if len(self.background) != 3 or any(not 0 <= int(c) <= 255 for c in self.background):
            raise ValueError(f"`background` must be an RGB triple of ints in [0, 255], got {self.background}.")

    @property
    def counts(self) -> tuple[int, ...]:
        """The counts of `"count"` prompts."""
        return tuple(range(2, self.max_count + 1))

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------------------
# Concepts, held-out combinations, Zipf weights
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MosaicSplit:
    r"""
    The combinations a config holds out and the concept weights, derived from `config.split_seed`.

    Attributes:
        concepts (`list[tuple[str, str]]`): all `(colour, shape)` pairs.
        concept_weights (`dict`): Zipf probability of each concept (sums to 1).
        heldout_concepts (`frozenset`): held-out `(colour, shape)` pairs.
        heldout_counts (`frozenset`): held-out `(count, shape)` pairs.
        heldout_relations (`frozenset`): held-out `(shape, relation, shape)` triples.
    """

    concepts: list
    concept_weights: dict
    heldout_concepts: frozenset
    heldout_counts: frozenset
    heldout_relations: frozenset


def _hold_out(items: list, fraction: float, rng: random.Random, keys) -> frozenset:
    """Hold out `round(fraction * len(items))` items at random while every value of every `key(item)` slot keeps at
    least one item in training (so held-out combinations are new combinations of seen parts)."""
    target = round(fraction * len(items))
    order = items[:]
    rng.shuffle(order)
    remaining = {}
    for item in items:
        for slot, value in enumerate(keys(item)):
            remaining[slot, value] = remaining.get((slot, value), 0) + 1
    held = []
    for item in order:
        if len(held) == target:
            break
        parts = list(enumerate(keys(item)))
        if all(remaining[slot, value] > 1 for slot, value in parts):
            held.append(item)
            for slot, value in parts:
                remaining[slot, value] -= 1
    return frozenset(held)


def mosaic_split(config: MosaicConfig) -> MosaicSplit:
    """The held-out combinations and concept weights of `config` (a function of `config` alone)."""
    rng = random.Random(f"mosaic-split-{config.split_seed}")
    concepts = [(c, s) for c in config.colours for s in config.shapes]
    ranked = concepts[:]
    rng.shuffle(ranked)
    raw = {concept: (rank + 1) ** -config.zipf_exponent for rank, concept in enumerate(ranked)}
    total = sum(raw.values())
    weights = {concept: raw[concept] / total for concept in concepts}
    f = config.heldout_fraction
    held_concepts = _hold_out(concepts, f, rng, lambda item: item)
    held_counts = _hold_out([(n, s) for n in config.counts for s in config.shapes], f, rng, lambda item: item)
    triples = [(a, r, b) for a in config.shapes for r in config.relations for b in config.shapes]
    held_relations = _hold_out(triples, f, rng, lambda item: item)
    return MosaicSplit(concepts, weights, held_concepts, held_counts, held_relations)


# ---------------------------------------------------------------------------------------------------------------------
# Scenes
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class MosaicScene:
    r"""
    One scene: what the caption asks for (`groups`, `relation`) and what is drawn (`objects`).

    Attributes:
        task (`str`): one of `TASKS`.
        groups (`list[dict]`): the objects the caption names, in caption order: `{"colour", "shape", "count",
            "size"}` (`size` is the drawn size, or `""` when the copies differ).
        relation (`str`): the relation of group 0 to group 1 for `"relation"` scenes, else `""`.
        objects (`list[dict]`): every drawn object: `{"group", "colour", "shape", "size", "x", "y", "half_extent"}`
            with the centre `(x, y)` and half extent in pixels (`x` to the right, `y` down, pixel centres at
            `i + 0.5`).
        caption (`str`): the templated caption.
        heldout (`bool`): whether the scene uses a held-out combination.
    """

    task: str
    groups: list
    relation: str
    objects: list = field(default_factory=list)
    caption: str = ""
    heldout: bool = False


def _noun(group: dict, describe_size: bool) -> str:
    size = f"{group['size']} " if describe_size and group["size"] else ""
    if group["count"] == 1:
        return f"a {size}{group['colour']} {group['shape']}"
    return f"{NUMBER_WORDS[group['count']]} {size}{group['colour']} {group['shape']}s"


def caption_of(task: str, groups: list, relation: str = "", describe_size: bool = False) -> str:
    """The templated caption of a scene's structure (see the module docstring for the templates)."""
    nouns = [_noun(g, describe_size) for g in groups]
    if task != "relation":
        return _join(nouns)
    relation_phrase = f"to the {relation}" if relation in ("left of", "right of") else relation
    head = f"{nouns[0]} {relation_phrase} {nouns[1]}"
    return f"{head}, with {_join(nouns[2:])}" if len(nouns) > 2 else head


def _join(nouns: list) -> str:
    if len(nouns) <= 2:
        return " and ".join(nouns)
    return ", ".join(nouns[:-1]) + f", and {nouns[-1]}"


def scene_uses_heldout(task: str, groups: list, relation: str, split: MosaicSplit) -> bool:
    """Whether a scene's structure uses a held-out combination of the family its task tests (or, for any task, a
    held-out colour x shape concept)."""
    if any((g["colour"], g["shape"]) in split.heldout_concepts for g in groups):
        return True
    if task == "count" and (groups[0]["count"], groups[0]["shape"]) in split.heldout_counts:
        return True
    return task == "relation" and (groups[0]["shape"], relation, groups[1]["shape"]) in split.heldout_relations


def _draw_concepts(rng, pool: list, weights: dict, k: int) -> list:
    chosen = []
    for _ in range(k):
        candidates = [c for c in pool if c not in chosen]
        chosen.append(rng.choices(candidates, weights=[weights[c] for c in candidates])[0])
    return chosen


def _sample_structure(config: MosaicConfig, split: MosaicSplit, rng: random.Random, want_heldout: bool):
    """Draw `(task, groups, relation)` whose held-out status is `want_heldout`, by rejection."""
    weights = config.task_weights or (1.0,) * len(config.tasks)
    tasks = [t for t, w in zip(config.tasks, weights) if w > 0]
    task_weights = [w for w in weights if w > 0]
    for _ in range(2000):
        task = rng.choices(tasks, weights=task_weights)[0]
        n_named = {"single": 1, "count": 1, "pair": 2, "relation": 2}[task]
        concepts = _draw_concepts(rng, split.concepts, split.concept_weights, n_named + config.extra_objects)
        groups = [{"colour": c, "shape": s, "count": 1, "size": ""} for c, s in concepts]
        relation = ""
        if task == "count":
            groups[0]["count"] = rng.choice(config.counts)
        elif task == "relation":
            relation = rng.choice(config.relations)
        if scene_uses_heldout(task, groups, relation, split) == want_heldout:
            return task, groups, relation
    kind = "held-out" if want_heldout else "training"
    raise ValueError(
        f"could not draw a scene of {kind} combinations from {config} in 2000 tries; with heldout_fraction="
        f"{config.heldout_fraction} the {'held-out' if want_heldout else 'remaining'} combinations are too rare."
    )


def relation_holds(relation: str, a: tuple, b: tuple, margin: float, ratio: float = 0.5) -> bool:
    """Whether centre `a` is `relation` centre `b` (image axes: y grows downwards) by at least `margin` pixels along
    the relation's axis, with the offset along that axis at least `ratio` times the offset across it."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    along, across = {"left of": (dx, dy), "right of": (-dx, dy), "above": (dy, dx), "below": (-dy, dx)}[relation]
    return along >= margin and along >= ratio * abs(across)


def place_objects(config: MosaicConfig, rng: random.Random, groups: list, relation: str) -> list | None:
    """Centres and sizes of every object of `groups` (for a `relation` scene, the two named objects in that
    relation), their boxes >= 2 px apart at 32x32, drawn with `rng`; `None` if placement fails (draw again)."""
    res = config.resolution
    gap = 2.0 * res / 32
    objects = []
    for index, group in enumerate(groups):
        size = rng.choice(config.sizes)
        for _ in range(group["count"]):
            objects.append({"group": index, "colour": group["colour"], "shape": group["shape"], "size": size})
    for _ in range(200):
        placed = []
        for obj in objects:
            half = SIZES[obj["size"]] * res
            for _ in range(50):
                x, y = rng.uniform(half + 1, res - 1 - half), rng.uniform(half + 1, res - 1 - half)
                # every shape lies inside its box: boxes `gap` apart along one axis never touch
                if all(max(abs(x - p["x"]), abs(y - p["y"])) >= half + p["half_extent"] + gap for p in placed):
                    placed.append({**obj, "x": x, "y": y, "half_extent": half})
                    break
            else:
                break
        if len(placed) < len(objects):
            continue
        if relation:
            a, b = placed[0], placed[1]
            # drawn with twice the evaluator's default slack (ratio 1 instead of 0.5): unambiguous scenes
            margin = a["half_extent"] + b["half_extent"]
            if not relation_holds(relation, (a["x"], a["y"]), (b["x"], b["y"]), margin, ratio=1.0):
                continue
        return placed
    return None


def render_objects(config: MosaicConfig, objects: list) -> Image.Image:
    """Draw `objects` (dicts with `shape`, `colour`, `x`, `y`, `half_extent` in pixels) as an RGB `PIL.Image`."""
    s, res = _SUPERSAMPLE, config.resolution
    canvas = Image.new("RGB", (res * s, res * s), tuple(int(c) for c in config.background))
    draw = ImageDraw.Draw(canvas)
    for obj in objects:
        x, y, h = obj["x"] * s, obj["y"] * s, obj["half_extent"] * s
        fill = PALETTE[obj["colour"]]
        if obj["shape"] == "circle":
            draw.ellipse((x - h, y - h, x + h, y + h), fill=fill)
        elif obj["shape"] == "square":
            draw.rectangle((x - h, y - h, x + h, y + h), fill=fill)
        elif obj["shape"] == "triangle":
            draw.polygon([(x, y - h), (x + h, y + h), (x - h, y + h)], fill=fill)
        else:
            raise ValueError(f"unknown shape {obj['shape']!r}; expected one of {SHAPES}.")
    return canvas.resize((res, res), Image.Resampling.BOX)


def sample_scene(config: MosaicConfig, seed: int, index: int, split: str = "train") -> tuple[MosaicScene, Image.Image]:
    r"""
    Draw scene `index` of the `(config, seed, split)` stream and render it.

    Args:
        config (`MosaicConfig`): the world.
        seed (`int`): the stream's seed.
        index (`int`): the sample's index; scene `i` does not depend on other indices.
        split (`str`, defaults to `"train"`): `"train"` and `"test"` avoid held-out combinations, `"heldout"`
            uses them. Use different seeds for train and test streams.

    Returns:
        `(scene, image)`: a `MosaicScene` and its RGB `PIL.Image` of side `config.resolution`.
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    mosaic = mosaic_split(config)
    if split == "heldout" and not (mosaic.heldout_concepts or mosaic.heldout_counts or mosaic.heldout_relations):
        raise ValueError(f"split 'heldout' needs `heldout_fraction` > 0, got {config.heldout_fraction}.")
    return _sample_scene(config, mosaic, seed, index, split)


def _sample_scene(config, mosaic, seed, index, split):
    rng = random.Random(f"mosaic-{split}-{seed}-{index}")
    for _ in range(100):
        task, groups, relation = _sample_structure(config, mosaic, rng, want_heldout=split == "heldout")
        objects = place_objects(config, rng, groups, relation)
        if objects is not None:
            break
    else:
        raise ValueError(
            f"could not place the objects of scene {index} without overlaps at resolution {config.resolution}; "
            f"lower `extra_objects` ({config.extra_objects}) or `max_count` ({config.max_count})."
        )
    for index_group, group in enumerate(groups):
        sizes = {o["size"] for o in objects if o["group"] == index_group}
        group["size"] = sizes.pop() if len(sizes) == 1 else ""
    caption = caption_of(task, groups, relation, config.describe_size)
    scene = MosaicScene(task, groups, relation, objects, caption, heldout=split == "heldout")
    return scene, render_objects(config, objects)


# ---------------------------------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------------------------------


def mosaic_features():
    """The `datasets.Features` of a mosaic dataset."""
    from datasets import Features, Value
    from datasets import Image as ImageFeature

    group = {"colour": Value("string"), "shape": Value("string"), "count": Value("int32"), "size": Value("string")}
    obj = {
        "group": Value("int32"),
        "colour": Value("string"),
        "shape": Value("string"),
        "size": Value("string"),
        "x": Value("float32"),
        "y": Value("float32"),
        "half_extent": Value("float32"),
    }
    return Features(
        {
            "image": ImageFeature(),
            "caption": Value("string"),
            "task": Value("string"),
            "groups": [group],
            "relation": Value("string"),
            "objects": [obj],
            "heldout": Value("bool"),
        }
    )


def mosaic_records(config: MosaicConfig, num_samples: int, seed: int = 0, split: str = "train"):
    """Yield `num_samples` dataset rows (`image` as a `PIL.Image`, caption, structure and objects)."""
    check_positive_int("num_samples", num_samples)
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    mosaic = mosaic_split(config)
    if split == "heldout" and not (mosaic.heldout_concepts or mosaic.heldout_counts or mosaic.heldout_relations):
        raise ValueError(f"split 'heldout' needs `heldout_fraction` > 0, got {config.heldout_fraction}.")
    for index in range(num_samples):
        scene, image = _sample_scene(config, mosaic, seed, index, split)
        yield {
            "image": image,
            "caption": scene.caption,
            "task": scene.task,
            "groups": scene.groups,
            "relation": scene.relation,
            "objects": scene.objects,
            "heldout": scene.heldout,
        }


def mosaic_dataset(config: MosaicConfig | None = None, num_samples: int = 1000, seed: int = 0, split: str = "train"):
    r"""
    A mosaic dataset as a `datasets.Dataset` with columns `image` (PIL), `caption`, `task`, `groups`, `relation`,
    `objects` and `heldout` (see `MosaicScene`), plus the config in `dataset.info.description` (JSON).

    Args:
        config (`MosaicConfig`, *optional*): the world (default `MosaicConfig()`).
        num_samples (`int`, defaults to 1000): rows.
        seed (`int`, defaults to 0): seed of the stream; give `"train"` and `"test"` different seeds.
        split (`str`, defaults to `"train"`): `"train"`, `"test"` or `"heldout"`.
    """
    import json

    from datasets import Dataset, DatasetInfo

    config = config or MosaicConfig()
    rows = list(mosaic_records(config, num_samples, seed, split))
    columns = {key: [row[key] for row in rows] for key in rows[0]}
    features = mosaic_features()
    description = json.dumps({"mosaic_config": config.to_dict(), "seed": seed, "split": split})
    return Dataset.from_dict(columns, features=features, info=DatasetInfo(description=description, features=features))


def images_to_tensor(images: list) -> "torch.Tensor":  # noqa: F821
    """PIL images (or HxWx3 uint8 arrays) to a float tensor of shape `(N, 3, H, W)` in [-1, 1]."""
    import torch

    array = np.stack([np.asarray(image.convert("RGB") if hasattr(image, "convert") else image) for image in images])
    return torch.from_numpy(array).permute(0, 3, 1, 2).float() / 127.5 - 1


TOKENIZER_SPECIALS = ("<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|unk|>")


def mosaic_vocabulary() -> list[str]:
    """Every word the caption templates can write (for every shape, colour, size, count and relation), sorted."""
    words = {"a", "and", "to", "the", "with", ","}
    for phrase in RELATIONS:
        words.update(phrase.split())
    words.update(NUMBER_WORDS[2:])
    words.update(PALETTE)
    words.update(SIZES)
    words.update(SHAPES)
    words.update(f"{shape}s" for shape in SHAPES)
    return sorted(words)


def mosaic_tokenizer(model_max_length: int = 16):
    r"""
    A word-level tokenizer of mosaic captions, built in code: a `transformers.PreTrainedTokenizerFast` with ids
    `<|pad|>` 0, `<|startoftext|>` 1, `<|endoftext|>` 2, `<|unk|>` 3, then `mosaic_vocabulary()`. Every encoding is
    `[start, words..., end]`, padded with `<|pad|>` (the empty prompt is `[start, end, pad, ...]`). Lowercases;
    commas are tokens. It saves and loads with `save_pretrained` / `from_pretrained` (and with a pipeline).

    Args:
        model_max_length (`int`, defaults to 16): padded length; the text encoder's `max_position_embeddings`.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    check_positive_int("model_max_length", model_max_length, minimum=3)
    vocab = {token: i for i, token in enumerate([*TOKENIZER_SPECIALS, *mosaic_vocabulary()])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", 1), ("<|endoftext|>", 2)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|pad|>",
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|unk|>",
        model_max_length=model_max_length,
    )


def save_mosaic(
    output_dir: str, config: MosaicConfig | None = None, num_samples: int = 1000, seed: int = 0, split: str = "train"
) -> str:
    """Write `mosaic_dataset(config, num_samples, seed, split)` with `save_to_disk`; return `output_dir`."""
    mosaic_dataset(config, num_samples, seed, split).save_to_disk(output_dir)
    return output_dir


def config_from_dataset(dataset) -> MosaicConfig:
    """The `MosaicConfig` a dataset made by `mosaic_dataset` was drawn from."""
    import json

    try:
        meta = json.loads(dataset.info.description or "")["mosaic_config"]
    except (ValueError, KeyError) as error:
        raise ValueError("the dataset carries no mosaic config; was it made by `mosaic_dataset`?") from error
    return MosaicConfig(**meta)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write a mosaic dataset to disk (datasets.save_to_disk format).")
    parser.add_argument("--output_dir", required=True, help="Folder to write.")
    parser.add_argument("--num_samples", type=int, default=1000, help="Rows.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the sample stream.")
    parser.add_argument("--split", choices=SPLITS, default="train", help="Which combinations the scenes use.")
    parser.add_argument("--resolution", type=int, default=32, help="Image side in pixels.")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), help=f"Prompt kinds, from {TASKS}.")
    parser.add_argument("--max_count", type=int, default=4, help="Largest count of count prompts.")
    parser.add_argument("--extra_objects", type=int, default=0, help="Extra named objects per scene (complexity).")
    parser.add_argument("--zipf_exponent", type=float, default=0.0, help="Zipf exponent of concept frequencies.")
    parser.add_argument("--heldout_fraction", type=float, default=0.0, help="Held-out share of each combination.")
    parser.add_argument("--describe_size", action="store_true", help="Name sizes in captions.")
    parser.add_argument("--split_seed", type=int, default=0, help="Seed of the held-out combinations.")
    args = parser.parse_args(argv)
    try:
        config = MosaicConfig(
            resolution=args.resolution,
            tasks=tuple(args.tasks),
            max_count=args.max_count,
            extra_objects=args.extra_objects,
            zipf_exponent=args.zipf_exponent,
            heldout_fraction=args.heldout_fraction,
            describe_size=args.describe_size,
            split_seed=args.split_seed,
        )
        save_mosaic(args.output_dir, config, args.num_samples, args.seed, args.split)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {args.num_samples} {args.split} scenes to {args.output_dir}")


# ---------------------------------------------------------------------------------------------------------------------
# Training scripts' data options: mosaic scenes drawn on the fly, or a `datasets.save_to_disk` folder (the data
# options of `training/train_text_to_image_from_scratch.py` and `training/train_text_to_image_sd3.py`).


def add_mosaic_data_arguments(parser) -> None:
    """`--train_data_dir`, `--resolution`, `--num_train_samples` and the `--mosaic_*` world options, on `parser` (an
    `argparse.ArgumentParser` or an argument group); read back with [`mosaic_config_from_args`] and
    [`load_text_image_data`], checked with [`check_mosaic_data_arguments`]."""
    parser.add_argument(
        "--train_data_dir",
        type=str,
        default=None,
        help="A datasets.save_to_disk folder with 'image' and 'caption' columns. Default: draw mosaic.",
    )
    parser.add_argument("--resolution", type=int, default=32, help="Image side (multiple of 4).")
    parser.add_argument("--num_train_samples", type=int, default=20000, help="Mosaic scenes to draw.")
    parser.add_argument("--mosaic_seed", type=int, default=0, help="Seed of the mosaic train stream.")
    parser.add_argument(
        "--mosaic_tasks", nargs="+", default=["single", "pair", "count", "relation"], help="Mosaic prompt kinds."
    )
    parser.add_argument("--mosaic_max_count", type=int, default=4, help="Largest count of count prompts.")
    parser.add_argument("--mosaic_extra_objects", type=int, default=0, help="Extra named objects per scene.")
    parser.add_argument("--mosaic_zipf_exponent", type=float, default=0.0, help="Zipf exponent over concepts.")
    parser.add_argument("--mosaic_heldout_fraction", type=float, default=0.0, help="Held-out combination share.")
    parser.add_argument("--mosaic_split_seed", type=int, default=0, help="Seed of the held-out combinations.")


SAVE_TO_DISK_EXAMPLE = (
    "e.g. `datasets.Dataset.from_dict({'image': paths, 'caption': texts}).cast_column('image', datasets.Image())"
    ".save_to_disk(folder)`"
)


def check_text_image_folder(path: str) -> None:
    """Raise a `ValueError` naming `--train_data_dir` unless `path` is a `datasets.save_to_disk` folder of one
    `Dataset` (its `state.json`; the columns are checked when it loads): a plain image folder, without the captions
    the text-to-image scripts train on, is refused here, before any model loads."""
    if not os.path.isdir(path):
        raise ValueError(f"--train_data_dir {path!r} is not a folder.")
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        raise ValueError(
            f"--train_data_dir {path!r} holds a DatasetDict (several splits); save the training split alone "
            "(`dataset_dict['train'].save_to_disk(folder)`)."
        )
    if os.path.isfile(os.path.join(path, "state.json")):
        return
    files = os.listdir(path)
    images = [f for f in files if f.lower().endswith((".png", ".jpg", ".jpeg", ".webp", ".bmp"))]
    if images or any(os.path.isdir(os.path.join(path, f)) for f in files):
        captions = [f for f in files if f in ("metadata.jsonl", "metadata.csv")]
        hint = (
            f"; its {captions[0]} can be turned into one with `datasets.load_dataset('imagefolder', data_dir=folder, "
            "split='train')`, a `caption` column, then `.save_to_disk(...)`"
            if captions
            else ", giving each image its caption"
        )
        raise ValueError(
            f"--train_data_dir {path!r} is a plain image folder ({len(images)} image file(s) at its top level), not a "
            f"datasets.save_to_disk folder with 'image' and 'caption' columns: this script trains on captions{hint} "
            f"({SAVE_TO_DISK_EXAMPLE})."
        )
    raise ValueError(
        f"--train_data_dir {path!r} is not a datasets.save_to_disk folder (no state.json); expected one with 'image' "
        f"and 'caption' columns ({SAVE_TO_DISK_EXAMPLE})."
    )


def check_mosaic_data_arguments(args, parser) -> None:
    """`parser.error` (exit code 2, one line) on data options that cannot work."""
    if args.train_data_dir is not None:
        try:
            check_text_image_folder(args.train_data_dir)
        except ValueError as error:
            parser.error(str(error))
    if args.num_train_samples < 1:
        parser.error(f"--num_train_samples must be >= 1, got {args.num_train_samples}.")


def mosaic_config_from_args(args):
    """The `MosaicConfig` the `--resolution` / `--mosaic_*` options describe."""
    return MosaicConfig(
        resolution=args.resolution,
        tasks=tuple(args.mosaic_tasks),
        max_count=args.mosaic_max_count,
        extra_objects=args.mosaic_extra_objects,
        zipf_exponent=args.mosaic_zipf_exponent,
        heldout_fraction=args.mosaic_heldout_fraction,
        split_seed=args.mosaic_split_seed,
    )


def load_text_image_data(args) -> tuple:
    """`(images uint8 (N, 3, R, R), captions list[str])`: `--num_train_samples` mosaic scenes of the train split
    (seed `--mosaic_seed`), or the `image` / `caption` columns of `--train_data_dir` (images of side
    `--resolution`; a `ValueError` names what is missing or mis-sized)."""
    import torch

    if args.train_data_dir is None:
        rows = mosaic_records(mosaic_config_from_args(args), args.num_train_samples, args.mosaic_seed, "train")
        images, captions = zip(*((np.asarray(r["image"]), r["caption"]) for r in rows))
    else:
        from datasets import load_from_disk

        data = load_from_disk(args.train_data_dir)
        missing = {"image", "caption"} - set(data.column_names)
        if missing:
            raise ValueError(f"--train_data_dir {args.train_data_dir!r} lacks the columns {sorted(missing)}.")
        images, captions = [], list(data["caption"])
        for image in data["image"]:
            if image.size != (args.resolution, args.resolution):
                raise ValueError(
                    f"--train_data_dir holds {image.size[0]}x{image.size[1]} images; expected --resolution "
                    f"{args.resolution}."
                )
            images.append(np.asarray(image.convert("RGB")))
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous(), list(captions)


if __name__ == "__main__":
    main()
