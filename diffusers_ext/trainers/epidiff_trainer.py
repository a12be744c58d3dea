"""Training of EpiDiff's spatio-temporal denoiser: epsilon-prediction DDPM on history + horizon windows.

[`epidiff_denoising_loss`] is the loss of one batch; [`train_epidiff_denoiser`] the loop both
`training/train_epidiff.py` (through accelerate, with checkpoints) and `benchmarks/epidiff.py` run. Batches and noise
depend only on `(seed, step)`, so a resumed run continues exactly.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from ..models.spatiotemporal_denoiser import SpatioTemporalDenoiser
from ..utils import check_positive_int, is_number, public


# the DDIM sampler's clip of the predicted clean window, in standard deviations of the training data
SAMPLE_CLIP = 5.0


@public
@dataclass
class EpiDiffTrainingConfig:
    """Settings of [`train_epidiff_denoiser`] (DiffSTG's: hidden 32, 4 heads, 200 steps, `beta_end` 0.1, Adam 2e-3).

    Args:
        history (`int`): history steps of each window (the rest is the horizon).
        hidden_size (`int`), num_heads (`int`), num_layers (`int`), dropout (`float`): the denoiser.
        log_transform (`bool`): model `log1p` of the data.
        num_train_timesteps (`int`), beta_end (`float`): the `"scaled_linear"` DDPM schedule.
        learning_rate (`float`), weight_decay (`float`), batch_size (`int`), max_train_steps (`int`): the optimiser.
        seed (`int`): initialisation, batches and noise.
    """

    history: int = field(default=14, metadata={"help": "History steps of each window (the rest is the horizon)."})
    hidden_size: int = field(default=32, metadata={"help": "Width of the denoiser."})
    num_heads: int = field(default=4, metadata={"help": "Attention heads."})
    num_layers: int = field(default=2, metadata={"help": "Temporal + graph attention blocks."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout."})
    log_transform: bool = field(default=True, metadata={"help": "Model log1p of the data."})
    num_train_timesteps: int = field(default=200, metadata={"help": "DDPM steps."})
    beta_end: float = field(default=0.1, metadata={"help": "Last beta of the scaled_linear schedule."})
    learning_rate: float = field(default=2e-3, metadata={"help": "Adam learning rate."})
    weight_decay: float = field(default=1e-5, metadata={"help": "Adam weight decay."})
    batch_size: int = field(default=8, metadata={"help": "Windows per batch."})
    max_train_steps: int = field(default=1000, metadata={"help": "Optimiser steps."})
    seed: int = field(default=0, metadata={"help": "Seed of initialisation, batches and noise."})

    def __post_init__(self):
        for name in ("history", "hidden_size", "num_heads", "num_layers", "num_train_timesteps", "batch_size"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("max_train_steps", self.max_train_steps, minimum=0)
        for name in ("beta_end", "learning_rate"):
            if not is_number(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be a positive number, got {getattr(self, name)!r}.")


@public
def build_epidiff_schedulers(num_train_timesteps: int = 200, beta_end: float = 0.1) -> tuple:
    """`(DDPMScheduler, DDIMScheduler)` of the same `"scaled_linear"` schedule (DiffSTG's "quad" betas); the DDIM
    sampler clips its predicted clean window to +-`SAMPLE_CLIP` (in the model's standardised space), so an
    undertrained model cannot produce overflowing incidence after `expm1`."""
    ddpm = DDPMScheduler(
        num_train_timesteps=num_train_timesteps,
        beta_start=1e-4,
        beta_end=beta_end,
        beta_schedule="scaled_linear",
        clip_sample=False,
    )
    ddim = DDIMScheduler.from_config(
        ddpm.config, set_alpha_to_one=False, clip_sample=True, clip_sample_range=SAMPLE_CLIP
    )
    return ddpm, ddim


@public
def build_epidiff_denoiser(config: EpiDiffTrainingConfig, train_windows: np.ndarray) -> SpatioTemporalDenoiser:
    """A fresh denoiser for windows like `train_windows` `(N, V, T)`, normalised by their global mean and std."""
    values = np.log1p(np.maximum(train_windows, 0)) if config.log_transform else np.asarray(train_windows)
    torch.manual_seed(config.seed)
    return SpatioTemporalDenoiser(
        window_length=train_windows.shape[-1],
        hidden_size=config.hidden_size,
        num_heads=config.num_heads,
        num_layers=config.num_layers,
        dropout=config.dropout,
        data_mean=float(values.mean()),
        data_std=float(values.std() + 1e-8),
        log_transform=config.log_transform,
    )


@public
def epidiff_denoising_loss(
    model: SpatioTemporalDenoiser,
    scheduler: DDPMScheduler,
    windows: torch.Tensor,
    history: int,
    adjacency: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The epsilon-prediction MSE of a batch of windows `(B, V, T)` (data units) whose first `history` steps are
    observed: the whole window is noised and denoised, conditioned on the history (future zeroed) and its mask."""
    x0 = model.normalize(windows)
    batch, _, steps = x0.shape
    noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (batch,), generator=generator, device=x0.device)
    noisy = scheduler.add_noise(x0, noise, timesteps)
    mask = torch.zeros(steps, device=x0.device, dtype=x0.dtype)
    mask[:history] = 1
    condition = x0 * mask
    prediction = model(noisy, timesteps, condition, mask, adjacency).sample
    return torch.nn.functional.mse_loss(prediction, noise)


@public
def train_epidiff_denoiser(
    model: SpatioTemporalDenoiser,
    scheduler: DDPMScheduler,
    train_windows: np.ndarray,
    adjacency: np.ndarray,
    config: EpiDiffTrainingConfig,
    accelerator=None,
    start_step: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    on_step_end: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train `model` for `config.max_train_steps` steps (from `start_step`); returns the per-step losses.

    Args:
        model ([`SpatioTemporalDenoiser`]), scheduler (`DDPMScheduler`): what to train and its noise schedule.
        train_windows (`np.ndarray` of shape `(N, V, T)`): training windows (data units).
        adjacency (`np.ndarray` of shape `(V, V)`): the graph.
        config ([`EpiDiffTrainingConfig`]): the settings.
        accelerator (`accelerate.Accelerator`, *optional*): when given, `model` and `optimizer` must be prepared by
            it; backward and gradient accumulation go through it.
        start_step (`int`, defaults to 0): the step to resume at.
        optimizer (`torch.optim.Optimizer`, *optional*): default Adam with the config's rate and weight decay.
        on_step_end (`Callable[[step, loss], None]`, *optional*): called after every step (checkpoints, logging).
    """
    windows = np.asarray(train_windows, dtype=np.float32)
    if windows.ndim != 3 or windows.shape[-1] != model.config.window_length:
        raise ValueError(f"`train_windows` must have shape (N, V, {model.config.window_length}), got {windows.shape}.")
    if not 0 < config.history < windows.shape[-1]:
        raise ValueError(f"`config.history` must lie in 1 .. {windows.shape[-1] - 1}, got {config.history}.")
    device = accelerator.device if accelerator is not None else model.device
    data = torch.from_numpy(windows).to(device)
    graph = torch.as_tensor(adjacency, dtype=torch.float32, device=device)
    if optimizer is None:
        optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    rank = accelerator.process_index if accelerator is not None else 0
    model.train()
    losses = []
    for step in range(start_step, config.max_train_steps):
        generator = torch.Generator(device="cpu").manual_seed(config.seed * 1_000_003 + step * 101 + rank)
        index = torch.randint(0, len(data), (config.batch_size,), generator=generator)
        batch = data[index.to(device)]
        noise_generator = torch.Generator(device=device).manual_seed(config.seed * 7_919 + step * 31 + rank)
        if accelerator is not None:
            with accelerator.accumulate(model):
                loss = epidiff_denoising_loss(model, scheduler, batch, config.history, graph, noise_generator)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        else:
            loss = epidiff_denoising_loss(model, scheduler, batch, config.history, graph, noise_generator)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if on_step_end is not None:
            on_step_end(step + 1, losses[-1])
    model.eval()
    return losses
