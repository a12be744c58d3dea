"""Composition prompts of the mosaic world and their oracle layouts, shared by the benchmarks that compose on it.

- [`make_prompts`]: prompts naming one object of each given shape in distinct colours, with one sub-prompt per
  object (what a per-object method such as MultiDiffusion or Divide-and-Denoise is given).
- [`oracle_regions`]: each object's box from a real mosaic placement of the prompt's objects, at latent resolution:
  the layout an oracle would give MultiDiffusion (an upper reference, since it is told where objects go).
"""

import random

import numpy as np
import torch

from ...data.mosaic import MosaicConfig, caption_of, place_objects


def make_prompts(shapes: tuple[str, ...], count: int, seed: int, colours: tuple[str, ...]) -> list[dict]:
    """`count` compositional prompts, one object of each of `shapes` in distinct colours, caption order shuffled.

    Each prompt is a dict the mosaic judge reads (`task` `"pair"`, `groups`, `relation`, `caption`) plus
    `sub_prompts` (one caption per object, in `shapes` order) and `agent_groups` (the objects in that order).
    """
    rng = random.Random(f"latent-dnd-{seed}")
    prompts = []
    for _ in range(count):
        chosen = rng.sample(colours, len(shapes))
        groups = [{"colour": c, "shape": s, "count": 1, "size": ""} for c, s in zip(chosen, shapes)]
        caption_groups = groups[:]
        rng.shuffle(caption_groups)
        prompts.append(
            {
                "task": "pair",
                "groups": caption_groups,
                "relation": "",
                "caption": caption_of("pair", caption_groups),
                "sub_prompts": [caption_of("single", [g]) for g in groups],
                "agent_groups": groups,
            }
        )
    return prompts


def oracle_regions(prompt: dict, seed: int, latent_size: int, resolution: int) -> torch.Tensor:
    """Each object's box `(K, latent_size, latent_size)` (1 inside, 0 outside) from a real mosaic placement of
    `prompt["agent_groups"]` at `resolution` pixels, drawn with `seed`; positions no box covers are left to the
    allocator to share."""
    config = MosaicConfig(resolution=resolution)
    rng = random.Random(f"latent-dnd-layout-{seed}")
    objects = None
    while objects is None:
        objects = place_objects(config, rng, [dict(g) for g in prompt["agent_groups"]], "")
    scale = latent_size / resolution
    regions = torch.zeros(len(objects), latent_size, latent_size)
    for obj in objects:
        x0, x1 = (obj["x"] - obj["half_extent"]) * scale, (obj["x"] + obj["half_extent"]) * scale
        y0, y1 = (obj["y"] - obj["half_extent"]) * scale, (obj["y"] + obj["half_extent"]) * scale
        cols = slice(int(np.floor(x0)), int(np.ceil(x1)))
        rows = slice(int(np.floor(y0)), int(np.ceil(y1)))
        regions[obj["group"], rows, cols] = 1.0
    return regions
