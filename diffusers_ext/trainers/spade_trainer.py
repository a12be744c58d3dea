"""[`SpadeTrainer`]: train a SPADE surrogate on offline `(x, y)` data (denoising + calibration + support losses)."""

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from ..losses.spade import calibration_loss, denoising_loss, support_loss
from ..models.scalar_diffusion_surrogate import ScalarDiffusionSurrogate
from ..pipelines.spade.pipeline_surrogate_predictive import SurrogatePredictivePipeline
from ..pipelines.spade.sampling import inference_timesteps, predictive_samples
from ..pipelines.spade.support import KnnSupport
from ..training_utils import step_generator
from ..utils import public
from .base_trainer import DiffusionTrainer, dataset_arrays
from .spade_config import SpadeConfig


def spade_schedulers(num_train_timesteps: int = 100) -> tuple[DDPMScheduler, DDIMScheduler]:
    """SPADE's training and sampling schedulers: linear betas from 1e-4 to 2e-2, "linspace" DDIM timesteps."""
    config = {"num_train_timesteps": num_train_timesteps, "beta_schedule": "linear", "beta_start": 1e-4}
    config["beta_end"] = 2e-2
    return DDPMScheduler(**config), DDIMScheduler(**config, timestep_spacing="linspace", clip_sample=False)


@public
class SpadeTrainer(DiffusionTrainer):
    r"""
    Train a [`ScalarDiffusionSurrogate`] on offline data with SPADE's three losses (see [`SpadeConfig`]).

    The data are z-scored (the statistics are stored in the model, so the pipelines take data units), the kNN
    statistics of every training point are cached once, and each step draws its mini-batch from a permutation seeded
    by `(seed, epoch)` and its noise from `(seed, step, rank)`, so a resumed run continues exactly.

    Args:
        model ([`ScalarDiffusionSurrogate`]): the surrogate to train (`x_dim` = the designs' dimension).
        args ([`SpadeConfig`], *optional*).
        train_dataset (`datasets.Dataset` or `list[dict]`): the offline data, one row per point with its design
            `"x"` (shape `(D,)`) and its score `"y"` (a number), e.g. `Dataset.from_dict({"x": x, "y": y})`.
        noise_scheduler ([`DDPMScheduler`], *optional*): default SPADE's (`spade_schedulers`).
        accelerator (`accelerate.Accelerator`, *optional*).
    """

    config_class = SpadeConfig
    state_file = "spade_state.safetensors"

    def __init__(
        self,
        model: ScalarDiffusionSurrogate,
        args: SpadeConfig | None = None,
        train_dataset=None,
        noise_scheduler: DDPMScheduler | None = None,
        accelerator=None,
    ):
        super().__init__(args)
        if not isinstance(model, ScalarDiffusionSurrogate):
            raise TypeError(f"`model` must be a ScalarDiffusionSurrogate, got {type(model).__name__}.")
        dim = model.config.x_dim
        data = dataset_arrays(train_dataset, {"x": f"a design of shape ({dim},)", "y": "a number"})
        x, y = data["x"], data["y"]
        if x.ndim != 2 or x.shape[1] != dim:
            raise ValueError(
                f"`train_dataset` column 'x' must hold designs of shape ({dim},) (the model's `x_dim`), got "
                f"{x.shape[1:]}."
            )
        if y.size != len(y):
            raise ValueError(
                f"`train_dataset` column 'y' must hold one number per row, got entries of shape {y.shape[1:]}."
            )
        y = y.reshape(-1)
        if x.shape[0] < 2:
            raise ValueError(f"`train_dataset` must have at least 2 rows, got {x.shape[0]}.")
        if self.args.support_weight > 0 and self.args.support_k > x.shape[0]:
            raise ValueError(f"`support_k` ({self.args.support_k}) must be <= the number of points ({x.shape[0]}).")
        x_std = x.std(0)
        x_std = np.where(x_std > 1e-8, x_std, 1.0)
        y_std = float(y.std()) if y.std() > 1e-8 else 1.0
        model.set_normalization(x.mean(0), x_std, float(y.mean()), y_std)
        self.x = torch.from_numpy((x - x.mean(0)) / x_std)
        self.y = torch.from_numpy((y - y.mean()) / y_std)
        default_train, self.sampling_scheduler = spade_schedulers(model.config.num_train_timesteps)
        self.noise_scheduler = noise_scheduler or default_train
        self.knn = (
            KnnSupport(self.x.numpy(), self.y.numpy(), k=self.args.support_k) if self.args.support_weight > 0 else None
        )
        self.calibration_timesteps = inference_timesteps(
            self.sampling_scheduler, self.args.calibration_num_inference_steps
        )
        self.create_accelerator(accelerator)
        self.model, self.parameters = self.prepare_trained_model(model)

    @property
    def batches_per_epoch(self) -> int:
        return int(np.ceil(len(self.x) / self.args.per_device_train_batch_size))

    def batch_indices(self, step: int) -> torch.Tensor:
        """The training rows of `step`: a slice of the permutation of its epoch (seeded by `(seed, epoch)`)."""
        epoch, position = divmod(step, self.batches_per_epoch)
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.args.seed * 7919 + epoch))
        size = self.args.per_device_train_batch_size
        rows = order[position * size : (position + 1) * size]
        accelerator = self.accelerator
        return rows.tensor_split(accelerator.num_processes)[accelerator.process_index]

    def compute_loss(self, rows: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The three losses on the training rows `rows` (noise from `generator`); `"loss"` is their weighted sum."""
        args, device = self.args, self.accelerator.device
        x, y = self.x[rows].to(device), self.y[rows].to(device).reshape(-1, 1)
        timesteps = torch.randint(
            0, self.noise_scheduler.config.num_train_timesteps, (len(rows),), generator=generator
        )
        noise = torch.randn(len(rows), 1, generator=generator)
        model = self.model
        losses = {"denoising": denoising_loss(model, self.noise_scheduler.alphas_cumprod, x, y, timesteps, noise)}
        total = losses["denoising"]
        if args.calibration_weight > 0 or args.support_weight > 0:
            latents = torch.randn(args.calibration_num_samples, len(rows), generator=generator).to(device)
            unwrapped = self.accelerator.unwrap_model(model)
            samples = predictive_samples(
                unwrapped, self.sampling_scheduler.alphas_cumprod, self.calibration_timesteps, x, latents
            )
            mean, std = samples.mean(0), samples.std(0, unbiased=False)
            if args.calibration_weight > 0:
                losses["calibration"] = calibration_loss(
                    mean, y, args.num_ranking_pairs, args.ranking_temperature, generator
                )
                total = total + args.calibration_weight * losses["calibration"]
            if args.support_weight > 0:
                neighbour_mean, radius = self.knn.query(x, indices=rows)
                losses["support"] = support_loss(
                    mean, std, neighbour_mean.to(device), radius.to(device), args.tau_a, args.sigma_a0, args.sigma_a1
                )
                total = total + args.support_weight * losses["support"]
        losses["loss"] = total
        return losses

    def training_step(self) -> dict[str, float]:
        accelerator = self.accelerator
        self.model.train()
        generator = step_generator(self.args.seed, self.global_step, accelerator.process_index)
        with accelerator.accumulate(self.model):
            losses = self.compute_loss(self.batch_indices(self.global_step), generator)
            accelerator.backward(losses["loss"])
            if accelerator.sync_gradients:
                self.clip_gradients(self.parameters, self.model)
            self.optimizer.step()
            self.optimizer.zero_grad()
        self.model.eval()
        return self.reduce_metrics({name: value.detach() for name, value in losses.items()})

    def surrogate(self) -> ScalarDiffusionSurrogate:
        """The trained model (unwrapped)."""
        return self.accelerator.unwrap_model(self.model)

    def _save_weights(self, output_dir: str) -> None:
        if self.accelerator.is_main_process:
            pipeline = SurrogatePredictivePipeline(model=self.surrogate(), scheduler=self.sampling_scheduler)
            pipeline.save_pretrained(output_dir)
