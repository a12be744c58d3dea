"""The downstream test of a protection or a purification on the digits zoo: how well does a mimic learn from images?

A mimic fine-tunes the zoo DDPM, unconditionally (its null class), on a small set of images of one digit class, then
samples. The zoo classifier judges the samples: the share of them drawn as the class, and their Fréchet distance (in
the classifier's feature space) to held-out real digits of the class. A protection works if a mimic learns worse from
protected images than from clean ones; a purification undoes it if the mimic learns from the purified images about
as well as from the clean ones.
"""

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...data.digits import load_digits_images
from ...metrics import classifier_predictions, frechet_distance


@dataclass
class MimicryReport:
    r"""
    Args:
        class_share (`float`): share of the mimic's samples that the classifier assigns to the target class.
        frechet (`float`): Fréchet distance of the samples to real digits of the class that the mimic did not see
            (classifier features).
        images (`torch.Tensor` of shape `(num_samples, 1, 8, 8)`): the samples in [-1, 1].
    """

    class_share: float
    frechet: float
    images: torch.Tensor


def finetune_unconditional(
    ddpm_pipe,
    images: torch.Tensor,
    num_steps: int = 300,
    batch_size: int = 32,
    learning_rate: float = 2e-4,
    seed: int = 0,
) -> torch.nn.Module:
    r"""
    Fine-tune a copy of a class-conditional DDPM's UNet on `images` `(N, 1, H, W)` in [-1, 1] with its null class
    (the standard noise-prediction loss, Adam). The pipeline's own UNet is unchanged; returns the fine-tuned copy.
    """
    unet = copy.deepcopy(ddpm_pipe.unet).train().requires_grad_(True)
    scheduler = ddpm_pipe.scheduler
    null = ddpm_pipe.config.null_class_label
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(unet.parameters(), lr=learning_rate)
    device = unet.device
    images = images.to(device)
    for _ in range(num_steps):
        idx = torch.randint(0, len(images), (batch_size,), generator=generator)
        clean = images[idx.to(device)]
        noise = torch.randn(clean.shape, generator=generator).to(device)
        t = torch.randint(0, scheduler.config.num_train_timesteps, (batch_size,), generator=generator).to(device)
        noisy = scheduler.add_noise(clean, noise, t)
        labels = torch.full((batch_size,), null, device=device)
        loss = F.mse_loss(unet(noisy, t, class_labels=labels).sample, noise)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return unet.eval().requires_grad_(False)


@torch.no_grad()
def evaluate_mimicry(
    ddpm_pipe,
    classifier,
    images: torch.Tensor,
    target_class: int,
    num_steps: int = 300,
    num_samples: int = 200,
    num_inference_steps: int = 25,
    reference_images: torch.Tensor | None = None,
    seed: int = 0,
) -> MimicryReport:
    r"""
    Fine-tune the zoo DDPM on `images` (see [`finetune_unconditional`]), sample `num_samples` unconditionally and
    score them against `reference_images` `(M, 1, H, W)` (default: the held-out digits of `target_class`).
    """
    with torch.enable_grad():
        unet = finetune_unconditional(ddpm_pipe, images, num_steps=num_steps, seed=seed)
    mimic = type(ddpm_pipe)(
        unet=unet, scheduler=ddpm_pipe.scheduler, null_class_label=ddpm_pipe.config.null_class_label
    )
    mimic.set_progress_bar_config(disable=True)
    samples = (
        mimic(
            batch_size=num_samples,
            num_inference_steps=num_inference_steps,
            generator=torch.Generator().manual_seed(seed + 1),
            output_type="pt",
        ).images.cpu()
        * 2
        - 1
    )
    predictions, features = classifier_predictions(classifier, samples)
    if reference_images is None:
        real, labels = load_digits_images("heldout", resolution=samples.shape[-1])
        reference_images = real[labels == target_class]
    _, real_features = classifier_predictions(classifier, reference_images)
    return MimicryReport(
        class_share=float((predictions.cpu() == target_class).float().mean()),
        frechet=frechet_distance(features, real_features),
        images=samples,
    )
