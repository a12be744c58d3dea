"""Demo section: Divide-and-Denoise composing experts that each know one object, against its baselines."""

import random
from dataclasses import dataclass

import numpy as np
import torch

from .plots import save_image_grid
from .report import Figure, Section


@dataclass(frozen=True)
class DivideAndDenoiseDemoSettings:
    disc_images: int
    disc_templates: int
    disc_steps: int
    digit_prompts: int
    digit_images: int
    digit_steps: int


SETTINGS = {
    "quick": DivideAndDenoiseDemoSettings(
        disc_images=8, disc_templates=60, disc_steps=25, digit_prompts=2, digit_images=4, digit_steps=25
    ),
    "default": DivideAndDenoiseDemoSettings(
        disc_images=12, disc_templates=150, disc_steps=50, digit_prompts=4, digit_images=6, digit_steps=25
    ),
    "full": DivideAndDenoiseDemoSettings(
        disc_images=16, disc_templates=200, disc_steps=50, digit_prompts=6, digit_images=8, digit_steps=25
    ),
}
METHODS = ("divide_and_denoise", "averaging", "multidiffusion", "multidiffusion_oracle")


def method_kwargs(method: str, regions: torch.Tensor) -> dict:
    """The pipeline arguments of a method: the default fair division, or a baseline's fixed allocation.
    `multidiffusion_oracle` is told the hidden `(K, H, W)` expert `regions` (an upper reference; no other method
    gets them)."""
    from .. import AverageAllocator, RegionAllocator

    baselines = {
        "averaging": AverageAllocator(),
        "multidiffusion": RegionAllocator(),
        "multidiffusion_oracle": RegionAllocator(regions),
    }
    return {"allocator": baselines[method]} if method in baselines else {}


def calibrated_disc_threshold(experts, scheduler, settings, seed: int, device: str) -> float:
    """The detector threshold that finds 95% of the discs each expert paints when sampled alone (real objects,
    no composition method involved), as in `benchmarks/divide_and_denoise/divide_and_denoise.py`, for the disc
    judge ([`count_colour_discs`]: shape and size, then the peak's strength)."""
    from ..evaluation.divide_and_denoise.placements import solo_disc_scores
    from ..evaluation.protocol import calibrate_threshold

    seeds = [seed + 100 + k for k in range(len(experts))]
    scores = solo_disc_scores(experts, scheduler, settings.disc_images, settings.disc_steps, seeds, device, discs=True)
    return calibrate_threshold(scores, 0.95)


def allocation_pictures(allocations: torch.Tensor, num_frames: int = 5) -> np.ndarray:
    """`(num_frames, H, W, 3)` pictures of a two-agent allocation `(steps, 2, H, W)`: red = agent 0, blue = agent 1."""
    steps = np.linspace(0, len(allocations) - 1, num_frames).round().astype(int)
    frames = allocations[steps].numpy()
    pictures = np.zeros((num_frames, *frames.shape[2:], 3), dtype=np.float32)
    pictures[..., 0], pictures[..., 2] = frames[:, 0], frames[:, 1]
    return pictures


def divide_and_denoise_section(output_dir: str, mode: str, seed: int, device: str) -> Section:
    """Run two disc experts at a random placement no method is told, and the digits composition, with D&D,
    averaging, MultiDiffusion (its default strips) and MultiDiffusion told the layout (upper reference)."""
    from diffusers import DDIMScheduler

    from .. import DivideAndDenoisePipeline, MultiDenoiserModel, WindowedDenoiser, zoo
    from ..evaluation.divide_and_denoise.composition import digits_success, score_digit_slots
    from ..evaluation.divide_and_denoise.placements import (
        COLOURS,
        colour_disc_success,
        layout_experts,
        layout_regions,
        random_layout,
    )

    settings = SETTINGS[mode]
    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=False)
    centres = random_layout(2, seed)
    disc_experts = layout_experts(centres, num_templates=settings.disc_templates, seed=seed)
    threshold = calibrated_disc_threshold(disc_experts, scheduler, settings, seed, device)
    pipe = DivideAndDenoisePipeline(MultiDenoiserModel(disc_experts), scheduler).to(device)
    pipe.set_progress_bar_config(disable=True)
    disc_regions = layout_regions(centres)
    disc_rows, disc_scores, disc_allocation = [], {}, None
    for method in METHODS:
        out = pipe(
            num_inference_steps=settings.disc_steps,
            num_images_per_prompt=settings.disc_images,
            generator=torch.Generator().manual_seed(seed),
            output_type="pt",
            **method_kwargs(method, disc_regions),
        )
        disc_scores[method] = float(
            colour_disc_success(out.images.cpu(), list(COLOURS)[:2], min_intensity=threshold).mean()
        )
        disc_rows.append(out.images.cpu().permute(0, 2, 3, 1).numpy())
        if method == "divide_and_denoise":
            disc_allocation = out.allocations[:, 0]
    save_image_grid(
        np.concatenate(disc_rows), f"{output_dir}/dnd_discs.png", rows=len(METHODS), row_labels=list(METHODS)
    )
    save_image_grid(allocation_pictures(disc_allocation), f"{output_dir}/dnd_discs_allocation.png", rows=1)

    ddpm = zoo.load("digits-ddpm").to(device)
    classifier = zoo.load("digits-classifier").to(device).eval()
    schedule = {
        k: ddpm.scheduler.config[k] for k in ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule")
    }
    windows = [WindowedDenoiser.from_unet(ddpm.unet, (8, 24), (0, 8 * s), -1.0, **schedule) for s in range(3)]
    rng = random.Random(seed)
    digit_rows = {method: [] for method in METHODS}
    digit_hits = {method: [] for method in METHODS}
    digit_allocation, first_prompt = None, None
    for p in range(settings.digit_prompts):
        digits, slots = rng.sample(range(10), 2), rng.sample(range(3), 2)
        first_prompt = first_prompt or (digits, slots)
        composer = DivideAndDenoisePipeline(
            MultiDenoiserModel([windows[s] for s in slots]),
            ddpm.scheduler,
            null_class_label=ddpm.config.null_class_label,
        )
        composer.set_progress_bar_config(disable=True)
        regions = torch.zeros(2, 8, 24)
        for k, s in enumerate(slots):
            regions[k, :, 8 * s : 8 * (s + 1)] = 1.0
        for method in METHODS:
            out = composer(
                class_labels=digits,
                width=24,
                num_inference_steps=settings.digit_steps,
                num_images_per_prompt=settings.digit_images,
                output_type="pt",
                generator=torch.Generator().manual_seed(seed * 1000 + p),
                **method_kwargs(method, regions),
            )
            present, labels = score_digit_slots(classifier, out.images * 2 - 1)
            digit_hits[method].extend(digits_success(present, labels, digits).tolist())
            digit_rows[method].append(out.images[:2].cpu().permute(0, 2, 3, 1).numpy())
            if method == "divide_and_denoise" and p == 0:
                digit_allocation = out.allocations[:, 0]
    grid = np.concatenate([np.concatenate(digit_rows[m]) for m in METHODS])
    save_image_grid(grid, f"{output_dir}/dnd_digits.png", rows=len(METHODS), row_labels=list(METHODS))
    save_image_grid(allocation_pictures(digit_allocation), f"{output_dir}/dnd_digits_allocation.png", rows=1)
    digit_scores = {m: float(np.mean(v)) for m, v in digit_hits.items()}

    (d0, d1), (s0, s1) = first_prompt
    return Section(
        title="Divide-and-Denoise: fair division of one sample among several models",
        summary=(
            "Two experts share each sample; at every step a Nash-welfare fair division decides who denoises which "
            "position. No method is told where the experts paint, except MultiDiffusion + oracle layout (an upper "
            "reference). Discs: a red-disc and a blue-disc expert, each knowing discs in its own small box placed "
            "at random on a 16x16 canvas; success = exactly one red and one blue disc, a disc being a region of "
            "disc shape and size (radius 2-3 px, round, filled; slivers and partial discs are not) whose peak "
            f"reaches a strength calibrated on each expert's own samples ({threshold:.2f}). "
            f"D&D {disc_scores['divide_and_denoise']:.0%}, "
            f"averaging {disc_scores['averaging']:.0%}, MultiDiffusion {disc_scores['multidiffusion']:.0%}, "
            f"MultiDiffusion + oracle layout {disc_scores['multidiffusion_oracle']:.0%}. Digits: two experts derived "
            "from the zoo DDPM, each painting its digit in a random slot of a 8x24 canvas; success = the zoo "
            f"classifier finds exactly the two digits. D&D {digit_scores['divide_and_denoise']:.0%}, averaging "
            f"{digit_scores['averaging']:.0%}, MultiDiffusion {digit_scores['multidiffusion']:.0%}, MultiDiffusion "
            f"+ oracle layout {digit_scores['multidiffusion_oracle']:.0%}."
        ),
        figures=[
            Figure(
                "dnd_discs.png",
                "Discs: rows D&D, averaging (faded discs), MultiDiffusion (default strips), MultiDiffusion + oracle.",
            ),
            Figure(
                "dnd_discs_allocation.png",
                "Who painted what (first D&D sample), from the first to the last step: red = the red expert's share, "
                "blue = the blue expert's.",
            ),
            Figure(
                "dnd_digits.png",
                "Digits: rows D&D, averaging, MultiDiffusion, MultiDiffusion + oracle; two images per prompt.",
            ),
            Figure(
                "dnd_digits_allocation.png",
                f"Allocation of the first digits prompt (digit {d0} in slot {s0} = red, digit {d1} in slot {s1} = "
                "blue), first to last step.",
            ),
        ],
        table=[
            {"setting": "discs, random placement", **{m: f"{v:.0%}" for m, v in disc_scores.items()}},
            {"setting": "digits 8x24", **{m: f"{v:.0%}" for m, v in digit_scores.items()}},
        ],
        notes=[
            f"{settings.disc_images} disc images ({settings.disc_steps} DDIM steps), {settings.digit_prompts} digit "
            f"prompts x {settings.digit_images} images ({settings.digit_steps} steps). The full benchmark: "
            "python benchmarks/divide_and_denoise/divide_and_denoise.py",
        ],
    )
