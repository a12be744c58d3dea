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

Both can *resample* each step (RePaint's resampling, Lugmayr et al. 2022, with jumps of one step): the fused latents
are taken back to the step's noise level with fresh noise and the step is taken again. Replacement alone (the
bootstrapping) lets a small model keep drawing its object outside the box, where the background overwrites it;
resampling gives the views' content and the imposed background several passes to agree.

[`WindowMultiDiffusion`] is the same method with windows as its views (`F_i` a crop, as in MultiDiffusion's
panorama mode; a window as large as the canvas gives full-canvas views): each prompt owns its box and a margin
around it, and positions no view owns follow the known empty canvas. [`window_corners`] places the windows.
"""

import numpy as np
import torch

from ...pipelines.pipeline_utils import decode_vae_latents, encode_vae_latents, vp_coefficients
from ...utils import check_positive_int


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
        resampling (`int`, defaults to 1): times each step but the last is taken; between two passes the fused
            latents are re-noised to the step's level (1: no resampling, MultiDiffusion as published). Needs a
            scheduler with `alphas_cumprod` whose `step` keeps no state between calls (DDIM, DDPM).
    """

    def __init__(self, pipe, background: torch.Tensor, bootstrap_fraction: float = 0.4, resampling: int = 1):
        if not 0.0 <= bootstrap_fraction <= 1.0:
            raise ValueError(f"`bootstrap_fraction` must be in [0, 1], got {bootstrap_fraction!r}.")
        check_positive_int("resampling", resampling)
        if resampling > 1 and not hasattr(pipe.scheduler, "alphas_cumprod"):
            raise ValueError(
                f"`resampling` > 1 re-noises along `alphas_cumprod`, which {type(pipe.scheduler).__name__} lacks."
            )
        self.resampling = resampling
        if background.ndim != 3 or background.shape[0] != 3:
            raise ValueError(f"`background` must be an image (3, H, W), got shape {tuple(background.shape)}.")
        self.pipe = pipe
        self.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
        self.bootstrap_fraction = bootstrap_fraction
        with torch.no_grad():
            self.background_latents = encode_vae_latents(pipe.vae, background.unsqueeze(0).to(pipe.vae.device))

    def _prompt_embeddings(self, prompts: list[str], guidance_scale: float) -> torch.Tensor:
        """The views' text embeddings `(2V or V, L, D)`: unconditional ones first when guiding."""
        do_guidance = guidance_scale > 1.0
        negatives = [""] * len(prompts) if do_guidance else None
        cond, uncond = self.pipe.encode_prompt(prompts, self.pipe.unet.device, 1, do_guidance, negatives)
        return torch.cat([uncond, cond]) if do_guidance else cond

    def _denoise(self, views: torch.Tensor, t, embeddings: torch.Tensor, guidance_scale: float) -> torch.Tensor:
        """One guided scheduler step of every view `(V, C, h, w)`."""
        do_guidance = guidance_scale > 1.0
        model_input = torch.cat([views] * 2) if do_guidance else views
        model_input = self.scheduler.scale_model_input(model_input, t)
        noise_pred = self.pipe.unet(model_input, t, encoder_hidden_states=embeddings).sample
        if do_guidance:
            noise_uncond, noise_text = noise_pred.chunk(2)
            noise_pred = noise_uncond + guidance_scale * (noise_text - noise_uncond)
        return self.scheduler.step(noise_pred, t, views).prev_sample

    def _passes(self, index: int) -> int:
        """How many times step `index` is taken: `resampling`, except for the last step."""
        return self.resampling if index + 1 < len(self.scheduler.timesteps) else 1

    def _renoise(self, latents: torch.Tensor, index: int, generator: torch.Generator | None) -> torch.Tensor:
        """Latents at the noise level after step `index`, brought back to the level before it with fresh noise:
        `x_t = sqrt(a_t / a_s) x_s + sqrt(1 - a_t / a_s) z` (`a` the cumulative alphas, `s` the next timestep)."""
        timesteps, alphas = self.scheduler.timesteps, self.scheduler.alphas_cumprod
        ratio = (alphas[timesteps[index]] / alphas[timesteps[index + 1]]).to(latents.device, latents.dtype)
        noise = torch.randn(latents.shape, generator=generator, dtype=latents.dtype).to(latents.device)
        signal, sigma = vp_coefficients(ratio)
        return signal * latents + sigma * noise

    def _decode(self, latents: torch.Tensor) -> np.ndarray:
        image = decode_vae_latents(self.pipe.vae, latents)
        return self.pipe.image_processor.postprocess(image, output_type="np")

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
        embeddings = self._prompt_embeddings(prompts, guidance_scale)

        scheduler.set_timesteps(num_inference_steps, device=device)
        latents = latents.to(device=device, dtype=dtype) * scheduler.init_noise_sigma
        num_bootstrap = round(self.bootstrap_fraction * len(scheduler.timesteps))
        background = self.background_latents.to(device=device, dtype=dtype)
        for index, t in enumerate(scheduler.timesteps):
            passes = self._passes(index)
            for repeat in range(passes):
                if repeat:
                    latents = self._renoise(latents, index, generator)
                views = latents.expand(num_regions, -1, -1, -1)
                if index < num_bootstrap:
                    noise = torch.randn(background.shape, generator=generator, dtype=dtype).to(device)
                    noisy_background = scheduler.add_noise(background, noise, t.reshape(1))
                    views = views * inside + noisy_background * (1.0 - inside)
                denoised = self._denoise(views, t, embeddings, guidance_scale)  # (K, C, h, w)
                latents = (denoised * weights).sum(dim=0, keepdim=True)
        return self._decode(latents)


def window_corners(boxes: torch.Tensor, window_size: int) -> torch.Tensor:
    """Top-left corners of square windows of side `window_size` centred on each box, shifted to lie in the canvas.

    Args:
        boxes (`torch.Tensor` of shape `(..., K, h, w)`): 1 inside box `k`, 0 outside; every box non-empty.
        window_size (`int`): the window's side, at most `min(h, w)`.

    Returns:
        `torch.LongTensor` of shape `(..., K, 2)`: `(row, column)` of each window's top-left position.
    """
    height, width = boxes.shape[-2:]
    if not isinstance(window_size, int) or not 1 <= window_size <= min(height, width):
        raise ValueError(f"`window_size` must be an int in [1, {min(height, width)}], got {window_size!r}.")
    flat = boxes.reshape(-1, height, width) > 0
    if not bool(flat.flatten(1).any(dim=1).all()):
        raise ValueError("`boxes` has an empty box: every box needs at least one position set to 1.")
    corners = torch.empty(flat.shape[0], 2, dtype=torch.long)
    for index, box in enumerate(flat):
        for axis, size in ((0, height), (1, width)):
            used = box.any(dim=1 - axis).nonzero().flatten()
            centre = (used.min().item() + used.max().item() + 1) / 2
            corners[index, axis] = min(max(int(np.floor(centre - window_size / 2 + 0.5)), 0), size - window_size)
    return corners.reshape(*boxes.shape[:-2], 2)


class WindowMultiDiffusion(RegionMultiDiffusion):
    """MultiDiffusion with one cropped window per prompt (its panorama form), on a `StableDiffusionPipeline`.

    Each prompt's view is a square crop of the canvas latent around its box (`F_i` in Bar-Tal et al. 2023 is a
    crop): the model denoises a small canvas that holds only its object, at the scale it was trained on. After every
    step the views are put back and averaged with per-position weights `W_i`: a view owns its own box, positions in
    no box are shared by every window over them, and positions in another prompt's box are left to that prompt. A
    position that no window covers belongs to a background view whose denoiser knows the answer: the world's empty
    canvas, brought to each step's noise level along the initial noise (the deterministic path a perfect denoiser of
    that canvas takes under DDIM). With `bootstrap_fraction > 0` each view is shown the noised background outside its
    box during the first steps, as MultiDiffusion's region mode does.

    Given an oracle layout (the benchmarks), it is an upper reference, labelled as such.

    Args:
        pipe (`diffusers.StableDiffusionPipeline`): its `unet`, `vae`, text encoder and scheduler config are used.
        background (`torch.Tensor` of shape `(3, H, W)` in [-1, 1]): the empty canvas.
        window_size (`int`): each view's side at latent resolution.
        bootstrap_fraction (`float`, defaults to 0.0): share of the first steps that bootstrap.
        resampling (`int`, defaults to 1): passes of each step, as in [`RegionMultiDiffusion`].
    """

    def __init__(
        self,
        pipe,
        background: torch.Tensor,
        window_size: int,
        margin: int = 0,
        bootstrap_fraction: float = 0.0,
        resampling: int = 1,
    ):
        super().__init__(pipe, background, bootstrap_fraction, resampling)
        check_positive_int("margin", margin, minimum=0)
        self.margin = margin
        check_positive_int("window_size", window_size)
        if window_size > min(self.background_latents.shape[-2:]):
            raise ValueError(
                f"`window_size` {window_size} is larger than the latent canvas {tuple(self.background_latents.shape[-2:])}."
            )
        self.window_size = window_size

    @torch.no_grad()
    def __call__(
        self,
        prompts: list[list[str]],
        boxes: torch.Tensor,
        latents: torch.Tensor,
        num_inference_steps: int = 25,
        guidance_scale: float = 5.0,
        generator: torch.Generator | None = None,
    ) -> np.ndarray:
        """A batch of composed images, every image with the same number `K` of prompts.

        Args:
            prompts (`list[list[str]]`): `B` lists of `K` prompts, one per region.
            boxes (`torch.Tensor` of shape `(B, K, h, w)`): each prompt's region at latent resolution (1 inside).
            latents (`torch.Tensor` of shape `(B, C, h, w)`): the initial noise (unit variance).
            num_inference_steps (`int`), guidance_scale (`float`): as in the pipeline.
            generator (`torch.Generator`, *optional*): draws the bootstrapping noise.

        Returns:
            `np.ndarray` of shape `(B, H, W, 3)` in [0, 1].
        """
        pipe, scheduler, size = self.pipe, self.scheduler, self.window_size
        if latents.ndim != 4:
            raise ValueError(f"`latents` must be (B, C, h, w), got shape {tuple(latents.shape)}.")
        batch, num_regions = latents.shape[0], len(prompts[0]) if prompts else 0
        if len(prompts) != batch or any(len(p) != num_regions for p in prompts) or num_regions == 0:
            raise ValueError(f"`prompts` must be {batch} non-empty lists of equal length, got {prompts!r}.")
        if tuple(boxes.shape) != (batch, num_regions, *latents.shape[-2:]):
            raise ValueError(
                f"`boxes` must be (B, K, h, w) = {(batch, num_regions, *latents.shape[-2:])}, got {tuple(boxes.shape)}."
            )
        if latents.shape[-2:] != self.background_latents.shape[-2:]:
            raise ValueError(
                f"`latents` must match the background's latent size {tuple(self.background_latents.shape[-2:])}, "
                f"got {tuple(latents.shape[-2:])}."
            )
        corners = window_corners(boxes.cpu(), size).reshape(-1, 2).tolist()  # (B*K) windows, view v = b*K + k
        device, dtype = pipe.unet.device, pipe.unet.dtype
        inside = (boxes > 0).to(device=device, dtype=dtype)  # (B, K, h, w)
        m = self.margin
        region = torch.nn.functional.max_pool2d(inside, 2 * m + 1, 1, m) if m else inside  # box and its margin
        in_no_box = 1.0 - inside.amax(dim=1, keepdim=True)
        weights = (inside + region * in_no_box).reshape(-1, 1, *latents.shape[-2:])  # (B*K, 1, h, w) before the crop
        views_of = [v // num_regions for v in range(batch * num_regions)]

        def crop(x, v):
            r, c = corners[v]
            return x[..., r : r + size, c : c + size]

        embeddings = self._prompt_embeddings([p for group in prompts for p in group], guidance_scale)

        scheduler.set_timesteps(num_inference_steps, device=device)
        noise = latents.to(device=device, dtype=dtype)
        latents = noise * scheduler.init_noise_sigma
        num_bootstrap = round(self.bootstrap_fraction * len(scheduler.timesteps))
        background = self.background_latents.to(device=device, dtype=dtype)
        box_crops = torch.stack([crop(region[views_of[v], v % num_regions], v) for v in range(len(corners))])
        box_crops = box_crops.unsqueeze(1)  # (B*K, 1, S, S)
        weight_crops = torch.stack([crop(weights[v], v) for v in range(len(corners))])
        timesteps = scheduler.timesteps
        for index, t in enumerate(timesteps):
            for repeat in range(self._passes(index)):
                if repeat:
                    latents = self._renoise(latents, index, generator)
                views = torch.stack([crop(latents[views_of[v]], v) for v in range(len(corners))])
                if index < num_bootstrap:
                    fresh = torch.randn(background.shape, generator=generator, dtype=dtype).to(device)
                    noisy = scheduler.add_noise(background, fresh, t.reshape(1))[0]
                    noisy_crops = torch.stack([crop(noisy, v) for v in range(len(corners))])
                    views = views * box_crops + noisy_crops * (1.0 - box_crops)
                denoised = self._denoise(views, t, embeddings, guidance_scale)  # (B*K, C, S, S)
                if index + 1 < len(timesteps):
                    next_t = timesteps[index + 1].reshape(1)
                    latents = scheduler.add_noise(background.expand_as(noise), noise, next_t)
                else:
                    latents = background.expand_as(noise).clone()
                total = torch.zeros_like(latents)
                mass = torch.zeros(batch, 1, *latents.shape[-2:], device=device, dtype=dtype)
                for v in range(len(corners)):
                    crop(total[views_of[v]], v).add_(denoised[v] * weight_crops[v])
                    crop(mass[views_of[v]], v).add_(weight_crops[v])
                latents = torch.where(mass > 0, total / mass.clamp(min=1e-8), latents)
        return self._decode(latents)
