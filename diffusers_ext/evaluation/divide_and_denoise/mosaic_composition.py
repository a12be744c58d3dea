"""Composition prompts of the mosaic world and their oracle layouts, shared by the benchmarks that compose on it.

- [`make_prompts`]: prompts naming one object of each given shape in distinct colours, with one sub-prompt per
  object (what a per-object method such as MultiDiffusion or Divide-and-Denoise is given).
- [`oracle_regions`]: each object's box from a real mosaic placement of the prompt's objects, at latent resolution:
  the layout an oracle would give MultiDiffusion (an upper reference, since it is told where objects go).
- [`strip_regions`]: MultiDiffusion's default layout, equal vertical strips.
- [`CompositionSampler`]: the prompts through one mosaic pipeline by every composition method, from paired latents.
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


def parse_oracle_config(text: str) -> dict:
    """`"window,margin,bootstrap[,resampling]"` -> the oracle sampler's settings `{"window", "margin", "bootstrap",
    "resampling"}` (an int, an int, a fraction in [0, 1], an int; resampling 1 when not given), for the benchmarks'
    command lines."""
    parts = text.split(",")
    if len(parts) not in (3, 4):
        raise ValueError(f"expected `window,margin,bootstrap[,resampling]`, got {text!r}.")
    config = {"window": int(parts[0]), "margin": int(parts[1]), "bootstrap": float(parts[2])}
    config["resampling"] = int(parts[3]) if len(parts) == 4 else 1
    if config["window"] < 1 or config["margin"] < 0 or not 0 <= config["bootstrap"] <= 1 or config["resampling"] < 1:
        raise ValueError(f"expected window >= 1, margin >= 0, bootstrap in [0, 1], resampling >= 1, got {text!r}.")
    return config


def strip_regions(num_objects: int, latent_size: int) -> torch.Tensor:
    """Equal vertical strips `(K, latent_size, latent_size)`, left to right in object order: MultiDiffusion's layout
    when no one says where the objects go (the same strips as [`RegionAllocator`]'s default)."""
    if not 1 <= num_objects <= latent_size:
        raise ValueError(f"`num_objects` must be in [1, latent_size={latent_size}], got {num_objects}.")
    edges = np.linspace(0, latent_size, num_objects + 1).round().astype(int)
    regions = torch.zeros(num_objects, latent_size, latent_size)
    for k in range(num_objects):
        regions[k, :, edges[k] : edges[k + 1]] = 1.0
    return regions


class CompositionSampler:
    """Composition prompts ([`make_prompts`]) through one `StableDiffusionPipeline` of the mosaic world, every method
    from the same initial latents (a function of the split's seed and the prompt's index only, so methods are paired).

    Methods, each returning images `(N, H, W, 3)` in [0, 1] for a list of prompts:

    - [`single_prompt`]: the pipeline on the whole caption.
    - [`region_multidiffusion`]: region-based MultiDiffusion ([`RegionMultiDiffusion`], bootstrapping and optional
      resampling) on the default strips ([`strip_regions`]), one sub-prompt per strip.
    - [`oracle_layout`]: [`WindowMultiDiffusion`] given each object's box from a real mosaic placement
      ([`oracle_regions`]): an upper reference, since it is told where the objects go.
    - [`divide_and_denoise`]: [`DivideAndDenoisePipeline`] with the pipeline's UNet as every agent, one sub-prompt per
      agent; its `allocator` makes it composable diffusion ([`AverageAllocator`]) or the fair division.

    Args:
        pipe (`diffusers.StableDiffusionPipeline`): the mosaic model (its scheduler is copied, never changed).
        config ([`MosaicConfig`]): the world at the pipeline's resolution (its background is the empty canvas).
        split_seeds (`dict[str, int]`): per split, the seed of its prompts' initial latents (`seed * 1000 + index`).
        num_inference_steps (`int`): sampling steps of every method.
        batch_size (`int`, defaults to 50): prompts per call of the methods that batch (the whole prompt).
    """

    def __init__(self, pipe, config: MosaicConfig, split_seeds: dict, num_inference_steps: int, batch_size: int = 50):
        self.pipe, self.config, self.split_seeds = pipe, config, split_seeds
        self.num_inference_steps, self.batch_size = num_inference_steps, batch_size
        self.latent_size = config.resolution // pipe.vae_scale_factor
        # Bootstrapped views, and positions no window covers, show the world's empty canvas.
        background = torch.tensor(config.background, dtype=torch.float32).view(3, 1, 1) / 127.5 - 1.0
        self.background = background.expand(3, config.resolution, config.resolution)
        self._composite = None

    def seed(self, index: int, split: str) -> int:
        """The seed of prompt `index`'s initial latents (and bootstrapping noise) on `split`."""
        return self.split_seeds[split] * 1000 + index

    def latents(self, index: int, split: str) -> torch.Tensor:
        """Prompt `index`'s initial latents `(1, C, h, w)` on `split`."""
        shape = (1, self.pipe.unet.config.in_channels, self.latent_size, self.latent_size)
        return torch.randn(shape, generator=torch.Generator().manual_seed(self.seed(index, split)))

    def single_prompt(self, prompts: list[dict], guidance: float, split: str) -> np.ndarray:
        """The pipeline on each prompt's whole caption."""
        images = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            latents = torch.cat([self.latents(start + i, split) for i in range(len(chunk))])
            images.append(
                self.pipe(
                    [p["caption"] for p in chunk],
                    height=self.config.resolution,
                    width=self.config.resolution,
                    num_inference_steps=self.num_inference_steps,
                    guidance_scale=guidance,
                    latents=latents.to(self.pipe.unet.dtype),
                    output_type="np",
                ).images
            )
        return np.concatenate(images)

    def _per_prompt(self, prompts: list[dict], split: str, sample, first: int = 0) -> np.ndarray:
        """`sample(index, prompt, latents)` -> `(1, H, W, 3)` for every prompt (numbered from `first`), concatenated."""
        return np.concatenate(
            [
                sample(first + i, p, self.latents(first + i, split).to(self.pipe.unet.dtype))
                for i, p in enumerate(prompts)
            ]
        )

    def region_multidiffusion(
        self, prompts: list[dict], guidance: float, bootstrap: float, resampling: int, split: str
    ) -> np.ndarray:
        """Region-based MultiDiffusion on the default strips (no layout information)."""
        from .region_multidiffusion import RegionMultiDiffusion

        sampler = RegionMultiDiffusion(self.pipe, self.background, bootstrap, resampling)

        def sample(index, prompt, latents):
            regions = strip_regions(len(prompt["sub_prompts"]), self.latent_size)
            generator = torch.Generator().manual_seed(self.seed(index, split))
            return sampler(
                prompt["sub_prompts"], regions, latents, self.num_inference_steps, guidance, generator=generator
            )

        return self._per_prompt(prompts, split, sample)

    def oracle_layout(self, prompts: list[dict], candidate: dict, split: str) -> np.ndarray:
        """[`WindowMultiDiffusion`] told each object's box; `candidate` holds `guidance`, `window`, `margin`,
        `bootstrap` and optionally `resampling`."""
        from .region_multidiffusion import WindowMultiDiffusion

        sampler = WindowMultiDiffusion(
            self.pipe,
            self.background,
            candidate["window"],
            candidate["margin"],
            candidate["bootstrap"],
            candidate.get("resampling", 1),
        )
        images = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            seeds = [self.seed(start + i, split) for i in range(len(chunk))]
            boxes = torch.stack(
                [oracle_regions(p, seed, self.latent_size, self.config.resolution) for p, seed in zip(chunk, seeds)]
            )
            latents = torch.cat([self.latents(start + i, split) for i in range(len(chunk))])
            images.append(
                sampler(
                    [p["sub_prompts"] for p in chunk],
                    boxes,
                    latents.to(self.pipe.unet.dtype),
                    num_inference_steps=self.num_inference_steps,
                    guidance_scale=candidate["guidance"],
                    generator=torch.Generator().manual_seed(seeds[0]),
                )
            )
        return np.concatenate(images)

    def divide_and_denoise(
        self, prompts: list[dict], guidance: float, split: str, index: int = 0, **call_kwargs
    ) -> np.ndarray:
        """[`DivideAndDenoisePipeline`] with the pipeline's UNet as every agent and one sub-prompt per agent;
        `call_kwargs` go to its call (`allocator`, `utility`, `alignment_scale`, ...). `prompts` are the split's
        prompts from number `index` on (a call per prompt when the call settings depend on the prompt)."""
        if self._composite is None:
            from ...pipelines.divide_and_denoise.denoisers import MultiDenoiserModel
            from ...pipelines.divide_and_denoise.pipeline_divide_and_denoise import DivideAndDenoisePipeline

            pipe = self.pipe
            scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
            self._composite = DivideAndDenoisePipeline(
                MultiDenoiserModel([pipe.unet]),
                scheduler,
                vae=pipe.vae,
                text_encoder=pipe.text_encoder,
                tokenizer=pipe.tokenizer,
            )
            self._composite.set_progress_bar_config(disable=True)

        def sample(index, prompt, latents):
            return self._composite(
                prompt=prompt["sub_prompts"],
                height=self.config.resolution,
                width=self.config.resolution,
                num_inference_steps=self.num_inference_steps,
                guidance_scale=guidance,
                latents=latents,
                output_type="np",
                **call_kwargs,
            ).images

        return self._per_prompt(prompts, split, sample, first=index)
