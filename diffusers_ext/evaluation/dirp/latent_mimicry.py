r"""
The downstream test of a protection on a latent text-to-image model: a LoRA mimic learns a subject from images.

The mimic fine-tunes LoRA adapters on the attention projections of a `StableDiffusionPipeline`'s UNet on a few
images of one subject, all captioned with the subject's prompt (DreamBooth's use, the one anti-mimicry protections
attack), then samples that prompt. The samples are scored by their Fréchet distance to held-out renders of the
subject, in the feature space of a small CNN trained separately on mosaic renders (not the UNet, the VAE or the text
encoder that protections and purifiers work through).
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ...data.mosaic import PALETTE, SHAPES, MosaicConfig, images_to_tensor, mosaic_records
from ...metrics import frechet_distance


class MosaicFeatureNet(nn.Module):
    r"""
    A small CNN on 32x32 RGB images in [-1, 1] that predicts which (colour, shape) pairs a mosaic scene holds
    (multi-label). `features(x)` `(B, feature_dim)` is the pooled last hidden layer, the space of the Fréchet
    distances.
    """

    def __init__(self, num_labels: int, feature_dim: int = 32):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.SiLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.SiLU(), nn.Conv2d(32, feature_dim, 3, padding=1), nn.SiLU(),
        )  # fmt: skip
        self.head = nn.Linear(feature_dim, num_labels)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images).mean(dim=(2, 3))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


def _scene_labels(rows: list, labels: list) -> torch.Tensor:
    target = torch.zeros(len(rows), len(labels))
    for i, row in enumerate(rows):
        for obj in row["objects"]:
            target[i, labels.index((obj["colour"], obj["shape"]))] = 1.0
    return target


def train_feature_network(
    num_train: int = 2000, num_test: int = 400, num_steps: int = 400, batch_size: int = 64, seed: int = 0
) -> tuple[MosaicFeatureNet, float, float]:
    r"""
    Train a [`MosaicFeatureNet`] on `num_train` mosaic renders (all tasks, default world; stream seed `1000 + seed`)
    and measure its exact-match accuracy (every (colour, shape) label right) on `num_test` renders of a separate
    stream. Returns `(network, exact_match, label_accuracy)` (`label_accuracy`: the share of the 18 (colour, shape)
    presence labels right); the network is frozen, in eval mode.
    """
    config = MosaicConfig()
    labels = [(c, s) for c in PALETTE for s in SHAPES]
    train_rows = list(mosaic_records(config, num_train, seed=1000 + seed))
    test_rows = list(mosaic_records(config, num_test, seed=2000 + seed, split="test"))
    x_train, y_train = images_to_tensor([r["image"] for r in train_rows]), _scene_labels(train_rows, labels)
    x_test, y_test = images_to_tensor([r["image"] for r in test_rows]), _scene_labels(test_rows, labels)
    torch.manual_seed(seed)
    net = MosaicFeatureNet(len(labels))
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(num_steps):
        idx = torch.randint(0, num_train, (batch_size,), generator=generator)
        loss = F.binary_cross_entropy_with_logits(net(x_train[idx]), y_train[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    net.eval().requires_grad_(False)
    with torch.no_grad():
        right = (net(x_test) > 0).float() == y_test
    return net, float(right.all(dim=1).float().mean()), float(right.float().mean())


def lora_finetune(
    sd_pipe,
    images: torch.Tensor,
    caption: str,
    num_steps: int = 150,
    batch_size: int = 8,
    rank: int | None = 4,
    learning_rate: float = 3e-3,
    seed: int = 0,
) -> torch.nn.Module:
    r"""
    Fine-tune LoRA adapters (`peft`, rank `rank`, on `to_q`, `to_k`, `to_v`, `to_out.0`) of a copy of `sd_pipe.unet`
    on `images` `(N, 3, H, W)` in [-1, 1], all captioned `caption`, with the epsilon-prediction loss; `rank=None`
    fine-tunes every UNet weight instead (DreamBooth-style). Returns the adapted UNet copy in eval mode; the
    pipeline's own UNet is untouched.
    """
    from peft import LoraConfig

    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"`images` must be a (N, 3, H, W) tensor in [-1, 1], got {getattr(images, 'shape', images)}.")
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"`num_steps` must be a positive int, got {num_steps!r}.")
    device = sd_pipe.unet.device
    torch.manual_seed(seed)
    unet = copy.deepcopy(sd_pipe.unet).requires_grad_(rank is None)
    if rank is not None:
        unet.add_adapter(
            LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian", target_modules=["to_q", "to_k", "to_v",
                                                                                                "to_out.0"])
        )  # fmt: skip
    unet.train()
    params = [p for p in unet.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
    vae, scheduler = sd_pipe.vae, sd_pipe.scheduler
    with torch.no_grad():
        latents = vae.encode(images.to(device)).latent_dist.mode() * vae.config.scaling_factor
        tokens = sd_pipe.tokenizer([caption], padding="max_length", max_length=sd_pipe.tokenizer.model_max_length,
                                   truncation=True, return_tensors="pt")  # fmt: skip
        embeds = sd_pipe.text_encoder(tokens.input_ids.to(device))[0]
    generator = torch.Generator().manual_seed(seed)
    num_train = scheduler.config.num_train_timesteps
    for _ in range(num_steps):
        idx = torch.randint(0, len(latents), (batch_size,), generator=generator)
        clean = latents[idx.to(device)]
        noise = torch.randn(clean.shape, generator=generator).to(device)
        t = torch.randint(0, num_train, (batch_size,), generator=generator).to(device)
        noisy = scheduler.add_noise(clean, noise, t)
        pred = unet(noisy, t, encoder_hidden_states=embeds.expand(batch_size, -1, -1)).sample
        loss = F.mse_loss(pred, noise)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return unet.eval().requires_grad_(False)


@torch.no_grad()
def sample_mimic(
    sd_pipe, unet, caption: str, num_samples: int = 32, num_inference_steps: int = 15, guidance_scale: float = 4.0,
    seed: int = 0,
) -> torch.Tensor:  # fmt: skip
    """Sample `caption` from `sd_pipe` with `unet` swapped in: `(num_samples, 3, H, W)` in [-1, 1]."""
    mimic = type(sd_pipe)(**{**sd_pipe.components, "unet": unet})
    mimic.set_progress_bar_config(disable=True)
    side = sd_pipe.unet.config.sample_size * 2 ** (len(sd_pipe.vae.config.block_out_channels) - 1)
    out = mimic(
        [caption] * num_samples, height=side, width=side, num_inference_steps=num_inference_steps,
        guidance_scale=guidance_scale, generator=torch.Generator().manual_seed(seed), output_type="pt",
    )  # fmt: skip
    return out.images.cpu() * 2 - 1


@torch.no_grad()
def mimic_frechet(
    sd_pipe,
    feature_net: MosaicFeatureNet,
    images: torch.Tensor,
    caption: str,
    reference: torch.Tensor,
    num_steps: int = 150,
    num_samples: int = 32,
    seed: int = 0,
    sample_kwargs: dict | None = None,
    **finetune_kwargs,
) -> tuple[float, torch.Tensor]:
    r"""
    Fine-tune a LoRA mimic on `images` (see [`lora_finetune`]), sample `num_samples` of `caption` and return the
    Fréchet distance of their features to those of `reference` `(M, 3, H, W)` (held-out renders of the subject),
    with the samples. `sample_kwargs` go to [`sample_mimic`] (`guidance_scale`, `num_inference_steps`).
    """
    with torch.enable_grad():
        unet = lora_finetune(sd_pipe, images, caption, num_steps=num_steps, seed=seed, **finetune_kwargs)
    samples = sample_mimic(sd_pipe, unet, caption, num_samples=num_samples, seed=seed + 7, **(sample_kwargs or {}))
    distance = frechet_distance(feature_net.features(samples).double(), feature_net.features(reference).double())
    return distance, samples
