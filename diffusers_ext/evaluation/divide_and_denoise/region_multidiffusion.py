"""MultiDiffusion's region-based generation for a `StableDiffusionPipeline`: a comparison-only baseline.

MultiDiffusion (Bar-Tal et al., 2023) composes prompts on one canvas by denoising one *view* per prompt and, after
every step, averaging the views' denoised latents over their masks. Its region-based mode adds *bootstrapping*:
during the first steps each view is shown the noised background outside its own mask, which pins the prompt's
content inside the mask. Without it, a prompt such as "a red circle" draws its object wherever the model's
position prior puts it, and the masked average keeps only fragments.

[`RegionMultiDiffusion`] is that procedure for the pack's composition benchmarks, given region masks (an oracle
layout, in the benchmarks: an upper reference, labelled as such). Masks here are boxes that need not cover the
canvas; a position no box covers is given to the nearest box's prompt, so that every position is denoised by
exactly one prompt at its box and the background between objects comes from the bootstrapped views.
"""

import numpy as np
import torch


def partition_masks(boxes: torch.Tensor) -> torch.Tensor:
    """Split the canvas among `K` boxes.

    Args:
        boxes (`torch.Tensor` of shape `(K, H, W)`): 1 inside box `k`, 0 outside; every box non-empty.

    Returns:
        `torch.Tensor` of shape `(K, H, W)`: weights summing to 1 at every position. A position inside one or more
        boxes is shared equally by them; any other position goes to the box nearest to it (Chebyshev distance to the
        box's pixels; ties to the lower index).
    """
    if boxes.ndim != 3:
        raise ValueError(f"`boxes` must be (K, H, W), got shape {tuple(boxes.shape)}.")
    inside = boxes > 0
    if not bool(inside.flatten(1).any(dim=1).all()):
        raise ValueError("`boxes` has an empty box: every box needs at least one position set to 1.")
    num_boxes, height, width = boxes.shape
    rows = torch.arange(height).view(height, 1, 1)
    cols = torch.arange(width).view(1, width, 1)
    distances = torch.empty(num_boxes, height, width)
    for k in range(num_boxes):
        r, c = inside[k].nonzero(as_tuple=True)
        distances[k] = torch.maximum((rows - r).abs(), (cols - c).abs()).min(dim=-1).values.float()
    nearest = torch.nn.functional.one_hot(distances.argmin(dim=0), num_boxes).permute(2, 0, 1).float()
    covered = inside.any(dim=0, keepdim=True)
    shared = inside.float() / inside.float().sum(dim=0, keepdim=True).clamp(min=1.0)
    return torch.where(covered, shared, nearest)


class RegionMultiDiffusion:
    """Region-based MultiDiffusion with bootstrapping on the components of a `StableDiffusionPipeline`.

    Args:
        pipe (`diffusers.StableDiffusionPipeline`): its `unet`, `vae`, text encoder and scheduler config are used
            (the scheduler is copied, so the pipeline's own is untouched).
        background (`torch.Tensor` of shape `(3, H, W)` in [-1, 1]): the image the bootstrapped views show outside
            their box, e.g. the world's empty canvas.
        bootstrap_fraction (`float`, defaults to 0.4): share of the first steps that bootstrap (MultiDiffusion's
            default is 20 of 50 steps).
    """

    def __init__(self, pipe, background: torch.Tensor, bootstrap_fraction: float = 0.4):
        if not 0.0 <= bootstrap_fraction <= 1.0:
            raise ValueError(f"`bootstrap_fraction` must be in [0, 1], got {bootstrap_fraction!r}.")
        if background.ndim != 3 or background.shape[0] != 3:
            raise ValueError(f"`background` must be an image (3, H, W), got shape {tuple(background.shape)}.")
        self.pipe = pipe
        self.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
        self.bootstrap_fraction = bootstrap_fraction
        vae = pipe.vae
        with torch.no_grad():
            image = background.unsqueeze(0).to(device=vae.device, dtype=vae.dtype)
            self.background_latents = vae.encode(image).latent_dist.mean * vae.config.scaling_factor

    @torch.no_grad()
    def __call__(
        self,
        prompts: list[str],
        boxes: torch.Tensor,
        latents: torch.Tensor,
        num_inference_steps: int = 25,
        guidance_scale: float = 5.0,
        generator: torch.Generator | None = None,
    ) -> np.ndarray:
        """One composed image.

        Args:
            prompts (`list[str]`): one prompt per region, `K` in all.
            boxes (`torch.Tensor` of shape `(K, h, w)`): each prompt's region at latent resolution (1 inside).
            latents (`torch.Tensor` of shape `(1, C, h, w)`): the initial noise (unit variance).
            num_inference_steps (`int`), guidance_scale (`float`): as in the pipeline.
            generator (`torch.Generator`, *optional*): draws the bootstrapping noise.

        Returns:
            `np.ndarray` of shape `(1, H, W, 3)` in [0, 1].
        """
        pipe, scheduler = self.pipe, self.scheduler
        num_regions = len(prompts)
        if boxes.shape != (num_regions, *latents.shape[-2:]):
            raise ValueError(
                f"`boxes` must be (len(prompts), h, w) = {(num_regions, *latents.shape[-2:])}, "
                f"got {tuple(boxes.shape)}."
            )
        if latents.ndim != 4 or latents.shape[0] != 1:
            raise ValueError(f"`latents` must be (1, C, h, w), got shape {tuple(latents.shape)}.")
        device, dtype = pipe.unet.device, pipe.unet.dtype
        weights = partition_masks(boxes.cpu()).to(device=device, dtype=dtype).unsqueeze(1)  # (K, 1, h, w)
        inside = (boxes > 0).to(device=device, dtype=dtype).unsqueeze(1)
        do_guidance = guidance_scale > 1.0
        cond, uncond = pipe.encode_prompt(prompts, device, 1, do_guidance, [""] * num_regions if do_guidance else None)
        embeddings = torch.cat([uncond, cond]) if do_guidance else cond

        scheduler.set_timesteps(num_inference_steps, device=device)
        latents = latents.to(device=device, dtype=dtype) * scheduler.init_noise_sigma
        num_bootstrap = round(self.bootstrap_fraction * len(scheduler.timesteps))
        background = self.background_latents.to(device=device, dtype=dtype)
        for index, t in enumerate(scheduler.timesteps):
            views = latents.expand(num_regions, -1, -1, -1)
            if index < num_bootstrap:
                noise = torch.randn(background.shape, generator=generator, dtype=dtype).to(device)
                noisy_background = scheduler.add_noise(background, noise, t.reshape(1))
                views = views * inside + noisy_background * (1.0 - inside)
            model_input = torch.cat([views] * 2) if do_guidance else views
            model_input = scheduler.scale_model_input(model_input, t)
            noise_pred = pipe.unet(model_input, t, encoder_hidden_states=embeddings).sample
            if do_guidance:
                noise_uncond, noise_text = noise_pred.chunk(2)
                noise_pred = noise_uncond + guidance_scale * (noise_text - noise_uncond)
            denoised = scheduler.step(noise_pred, t, views).prev_sample  # (K, C, h, w)
            latents = (denoised * weights).sum(dim=0, keepdim=True)

        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample
        return pipe.image_processor.postprocess(image, output_type="np")
