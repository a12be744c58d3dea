"""[`EpiDiffTrainer`]: train EpiDiff's spatio-temporal denoiser (epsilon-prediction DDPM on history + horizon windows).

[`epidiff_denoising_loss`] is the loss of one batch, [`build_epidiff_denoiser`] a fresh denoiser normalised by the
training windows and [`build_epidiff_schedulers`] the DDPM/DDIM pair of one schedule. `training/train_epidiff.py`
and `benchmarks/epidiff/epidiff.py` both train through the trainer. Batches and noise depend only on `(seed, step, rank)`,
so a resumed run continues exactly.
"""

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from ..models.spatiotemporal_denoiser import SpatioTemporalDenoiser
from ..pipelines.epidiff.pipeline_epidiff import EpiDiffForecastPipeline
from ..utils import public
from .base_trainer import DiffusionTrainer, dataset_arrays
from .epidiff_config import EpiDiffConfig


# the DDIM sampler's clip of the predicted clean window, in standard deviations of the training data
SAMPLE_CLIP = 5.0


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


def _check_windows(train_windows, history: int, name: str = "train_windows") -> np.ndarray:
    windows = np.asarray(train_windows, dtype=np.float32)
    if windows.ndim != 3 or windows.shape[0] < 1:
        raise ValueError(f"`{name}` must have shape (N >= 1, V, T), got {windows.shape}.")
    if not np.all(np.isfinite(windows)):
        raise ValueError(f"`{name}` must hold finite values.")
    if not 0 < history < windows.shape[-1]:
        raise ValueError(f"`history` must lie in 1 .. {windows.shape[-1] - 1} (the window length - 1), got {history}.")
    return windows


@public
def build_epidiff_denoiser(config: EpiDiffConfig, train_windows: np.ndarray) -> SpatioTemporalDenoiser:
    """A fresh denoiser (seeded by `config.seed`) for windows like `train_windows` `(N, V, T)`, normalised by their
    global mean and standard deviation (of `log1p` with `config.log_transform`)."""
    windows = _check_windows(train_windows, config.history)
    values = np.log1p(np.maximum(windows, 0)) if config.log_transform else windows
    torch.manual_seed(config.seed)
    return SpatioTemporalDenoiser(
        window_length=windows.shape[-1],
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
    observed: the whole window is noised and denoised, conditioned on the history (future zeroed) and its mask.

    `model` may be wrapped (DDP): its normalisation is read from the unwrapped module."""
    base = model.module if hasattr(model, "module") else model
    x0 = base.normalize(windows)
    batch, _, steps = x0.shape
    noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (batch,), generator=generator, device=x0.device)
    noisy = scheduler.add_noise(x0, noise, timesteps)
    mask = torch.zeros(steps, device=x0.device, dtype=x0.dtype)
    mask[:history] = 1
    condition = x0 * mask
    prediction = model(noisy, timesteps, condition, mask, adjacency).sample
    return torch.nn.functional.mse_loss(prediction.float(), noise.float())


@public
class EpiDiffTrainer(DiffusionTrainer):
    r"""
    Train a [`SpatioTemporalDenoiser`] on forecast windows of a graph signal (see [`EpiDiffConfig`]); the result is
    an [`EpiDiffForecastPipeline`] (`save_model` writes a folder that `EpiDiffForecastPipeline.from_pretrained`
    loads).

    Each step draws `per_device_train_batch_size` windows (with replacement) from a generator seeded by
    `(seed, step, rank)` and its noise and timesteps from another, so a run resumed from `checkpoint-<step>` (weights,
    optimizer and RNG states through `accelerator.save_state`) continues exactly.

    Args:
        model ([`SpatioTemporalDenoiser`]): the denoiser to train, e.g. from [`build_epidiff_denoiser`] (whose
            normalisation statistics come from the training windows); its `window_length` must be the windows'.
        args ([`EpiDiffConfig`], *optional*).
        train_dataset (`datasets.Dataset` or `list[dict]`): the training windows, one row each with a `"window"`
            of shape `(V, T)` in data units (history + horizon), e.g. `[{"window": w} for w in windows]` or
            `Dataset.from_dict({"window": windows})`.
        adjacency (`np.ndarray` or `torch.Tensor` of shape `(V, V)`): the graph (nonzero = an edge).
        noise_scheduler (`DDPMScheduler`, *optional*): default [`build_epidiff_schedulers`]`(num_train_timesteps,
            beta_end)` of the config.
        accelerator (`accelerate.Accelerator`, *optional*): default one built from the config.
    """

    config_class = EpiDiffConfig
    state_file = "epidiff_state.safetensors"

    def __init__(
        self,
        model: SpatioTemporalDenoiser,
        args: EpiDiffConfig | None = None,
        train_dataset=None,
        adjacency=None,
        noise_scheduler: DDPMScheduler | None = None,
        accelerator=None,
    ):
        super().__init__(args)
        if not isinstance(model, SpatioTemporalDenoiser):
            raise TypeError(f"`model` must be a SpatioTemporalDenoiser, got {type(model).__name__}.")
        windows = dataset_arrays(train_dataset, {"window": "an array of shape (V, T)"})["window"]
        if windows.ndim != 3:
            raise ValueError(f"`train_dataset` must hold windows of shape (V, T), got shape {windows.shape[1:]}.")
        windows = _check_windows(windows, self.args.history, "train_dataset")
        if windows.shape[-1] != model.config.window_length:
            raise ValueError(
                f"`train_dataset` must hold windows of the model's length {model.config.window_length}, got "
                f"windows of shape {windows.shape[1:]}."
            )
        if adjacency is None:
            raise ValueError("`adjacency` is required: an array of shape (V, V).")
        graph = torch.as_tensor(np.asarray(adjacency), dtype=torch.float32)
        if graph.shape != (windows.shape[1], windows.shape[1]):
            raise ValueError(
                f"`adjacency` must have shape ({windows.shape[1]}, {windows.shape[1]}) (one row per node of "
                f"`train_dataset`'s windows), got {tuple(graph.shape)}."
            )
        ddpm, self.sampling_scheduler = build_epidiff_schedulers(self.args.num_train_timesteps, self.args.beta_end)
        self.noise_scheduler = noise_scheduler if noise_scheduler is not None else ddpm
        self.create_accelerator(accelerator)
        device = self.accelerator.device
        self.windows = torch.from_numpy(windows).to(device)
        self.adjacency = graph.to(device)
        self.model, self.parameters = self.prepare_trained_model(model)

    def create_optimizer(self, parameters) -> torch.optim.Optimizer:
        """Adam with L2 weight decay (DiffSTG's optimiser), the config's rate, betas and epsilon."""
        args = self.args
        return torch.optim.Adam(
            parameters,
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
            weight_decay=args.weight_decay,
        )

    def batch_generators(self, step: int) -> tuple[torch.Generator, torch.Generator]:
        """`(batch generator (CPU), noise generator (on the device))` of `step` on this process."""
        seed, rank = self.args.seed, self.accelerator.process_index
        batch = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + step * 101 + rank)
        noise = torch.Generator(device=self.accelerator.device).manual_seed(seed * 7_919 + step * 31 + rank)
        return batch, noise

    def compute_loss(self, step: int) -> torch.Tensor:
        """The denoising loss of `step`'s batch (see [`epidiff_denoising_loss`])."""
        batch_generator, noise_generator = self.batch_generators(step)
        index = torch.randint(
            0, len(self.windows), (self.args.per_device_train_batch_size,), generator=batch_generator
        )
        batch = self.windows[index.to(self.windows.device)]
        return epidiff_denoising_loss(
            self.model, self.noise_scheduler, batch, self.args.history, self.adjacency, noise_generator
        )

    def training_step(self) -> dict[str, float]:
        accelerator = self.accelerator
        self.model.train()
        with accelerator.accumulate(self.model):
            loss = self.compute_loss(self.global_step)
            accelerator.backward(loss)
            if accelerator.sync_gradients and self.args.max_grad_norm > 0:
                self.clip_gradients(self.parameters, self.model)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return self.reduce_metrics({"loss": loss.detach()})

    def denoiser(self) -> SpatioTemporalDenoiser:
        """The trained denoiser (unwrapped)."""
        return self.accelerator.unwrap_model(self.model)

    def forecast_pipeline(self) -> EpiDiffForecastPipeline:
        """An [`EpiDiffForecastPipeline`] of the trained denoiser and the DDIM sampler of the training schedule."""
        return EpiDiffForecastPipeline(denoiser=self.denoiser(), scheduler=self.sampling_scheduler)

    def _save_weights(self, output_dir: str) -> None:
        if self.accelerator.is_main_process:
            self.forecast_pipeline().save_pretrained(output_dir)

    def _card_description(self) -> str:
        model = self.denoiser().config
        return (
            f"An EpiDiff spatio-temporal denoiser (window {model.window_length}, history {self.args.history}, "
            f"hidden {model.hidden_size}, {model.num_layers} blocks) trained by `EpiDiffTrainer` (diffusers-ext) for "
            f"{self.global_step} steps. Load it with `EpiDiffForecastPipeline.from_pretrained` and steer it with a "
            "mechanistic forecast (`mechanistic_forecast`) and its variance."
        )
