"""[`OfflineOptimizationPipeline`]: SPADE's search for designs with a high acquisition under the surrogate."""

from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DDIMScheduler, DiffusionPipeline
from diffusers.utils import BaseOutput, logging

from ...data.offline_bbo import from_logits, to_logits
from ...losses.spade import support_transform as transform
from ...models.scalar_diffusion_surrogate import ScalarDiffusionSurrogate
from ...utils import check_finite, check_positive_int, public
from .pipeline_surrogate_predictive import as_designs
from .sampling import inference_timesteps, predictive_samples
from .search import ACQUISITIONS, EAConfig, acquisition, evolutionary_search
from .support import KnnSupport


logger = logging.get_logger(__name__)


@public
@dataclass
class OfflineOptimizationOutput(BaseOutput):
    """Output of [`OfflineOptimizationPipeline`].

    Args:
        candidates (`np.ndarray` of shape `(num_candidates, D)`): the final population, best acquisition first (data
            units; relaxed one-hot logits of decoded tokens for discrete designs).
        acquisition (`np.ndarray` of shape `(num_candidates,)`): their acquisition values (normalised units).
        mean (`np.ndarray` of shape `(num_candidates,)`): their predicted mean scores (data units).
        best (`np.ndarray` of shape `(D,)`): the best-scored design seen during the search.
    """

    candidates: np.ndarray
    acquisition: np.ndarray
    mean: np.ndarray
    best: np.ndarray


@public
class OfflineOptimizationPipeline(DiffusionPipeline):
    r"""
    Offline black-box optimisation with a SPADE surrogate: an evolutionary algorithm over the data's bounding box,
    maximising an acquisition (`"lcb"` `mu - beta sigma`, `"ei"`, or `"mvr"` `mu - lambda sigma^2`) of the
    surrogate's Monte-Carlo predictive samples, optionally after SPADE's kNN support transform.

    Users pass their own offline `x, y` (data units) and optionally `bounds`; for discrete designs in Design-Bench's
    logit relaxation pass `discrete_shape=(L, C)`: the final candidates are decoded by arg-max and re-encoded.

    Parameters:
        model ([`ScalarDiffusionSurrogate`]): a trained surrogate (stores the data's z-scoring).
        scheduler ([`DDIMScheduler`]): see [`SurrogatePredictivePipeline`].
    """

    model_cpu_offload_seq = "model"
    _optional_components = []

    def __init__(self, model: ScalarDiffusionSurrogate, scheduler: DDIMScheduler):
        super().__init__()
        self.register_modules(model=model, scheduler=scheduler)

    @torch.no_grad()
    def __call__(
        self,
        x: np.ndarray | torch.Tensor,
        y: np.ndarray | torch.Tensor,
        bounds: np.ndarray | None = None,
        num_candidates: int = 128,
        acquisition_function: str = "lcb",
        beta: float = 0.1,
        ei_xi: float = 0.0,
        mvr_lambda: float = 0.1,
        num_samples: int = 256,
        num_inference_steps: int = 50,
        ea: EAConfig | None = None,
        support_transform: bool = False,
        support_k: int = 10,
        tau_a: float = 0.02,
        sigma_a0: float = 0.02,
        sigma_a1: float = 0.005,
        discrete_shape: tuple[int, int] | None = None,
        generator: torch.Generator | None = None,
        seed: int = 0,
        return_dict: bool = True,
    ) -> OfflineOptimizationOutput | tuple:
        r"""
        Search for `num_candidates` designs.

        Args:
            x (`(N, D)` array or tensor), y (`(N,)`): the offline data (data units).
            bounds (`np.ndarray` of shape `(2, D)`, *optional*): the search box; default the data's per-dimension
                min and max (SPADE's).
            num_candidates (`int`, defaults to 128): population size (the returned batch).
            acquisition_function (`str`): `"lcb"`, `"ei"` or `"mvr"`. beta, ei_xi, mvr_lambda (`float`): its
                parameters.
            num_samples (`int`, defaults to 256), num_inference_steps (`int`, defaults to 50): the Monte-Carlo
                estimate of each design's predictive distribution (CPU: 32 and 10).
            ea ([`EAConfig`], *optional*): the search's settings (its `population_size` is `num_candidates`).
            support_transform (`bool`): apply SPADE's kNN support transform (`support_k`, `tau_a`, `sigma_a0`,
                `sigma_a1`) to the samples before the acquisition.
            discrete_shape (`(L, C)`, *optional*): designs are relaxed one-hot logits of `L` tokens over `C` classes.
            generator (`torch.Generator`, *optional*): draws the Monte-Carlo noise; `seed` seeds the EA. One
                generator, not a list: the candidates come from one evolving population, not from runs of their own.
            return_dict (`bool`): return an [`OfflineOptimizationOutput`] or a tuple.
        """
        model = self.model
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                "`generator` must be one torch.Generator or None, got "
                + (f"a list of {len(generator)}" if isinstance(generator, list) else type(generator).__name__)
                + ": the search evolves one population, whose candidates have no runs of their own to reproduce "
                "(`seed` seeds the search, `generator` its Monte-Carlo noise)."
            )
        x = as_designs(x, model.config.x_dim, self._execution_device, model.dtype)
        check_finite("y", y)
        y = torch.as_tensor(np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y), dtype=torch.float32).reshape(-1)
        if y.numel() != x.shape[0]:
            raise ValueError(f"`y` must have {x.shape[0]} entries (one per row of `x`), got {y.numel()}.")
        for name, value in (("beta", beta), ("ei_xi", ei_xi), ("mvr_lambda", mvr_lambda)):
            check_finite(name, value, minimum=0, scalar=True)
        if support_transform:
            for name, value in (("tau_a", tau_a), ("sigma_a0", sigma_a0), ("sigma_a1", sigma_a1)):
                check_finite(name, value, minimum=0, scalar=True)
        check_positive_int("num_candidates", num_candidates)
        check_positive_int("num_samples", num_samples)
        check_positive_int("num_inference_steps", num_inference_steps)
        if acquisition_function not in ACQUISITIONS:
            raise ValueError(f"`acquisition_function` must be one of {ACQUISITIONS}, got {acquisition_function!r}.")
        if bounds is not None:
            check_finite("bounds", bounds)
            bounds = np.asarray(bounds, dtype=np.float64)
            if bounds.shape != (2, x.shape[1]) or not (bounds[0] <= bounds[1]).all():
                raise ValueError(
                    f"`bounds` must have shape (2, {x.shape[1]}) with lower <= upper, got {bounds.shape}."
                )
        if discrete_shape is not None and (
            len(discrete_shape) != 2 or discrete_shape[0] * (discrete_shape[1] - 1) != x.shape[1]
        ):
            raise ValueError(f"`discrete_shape` must be (L, C) with L * (C - 1) = {x.shape[1]}, got {discrete_shape}.")
        if support_transform:
            check_positive_int("support_k", support_k)
        ea = EAConfig(population_size=num_candidates) if ea is None else ea
        if ea.population_size != num_candidates:
            raise ValueError(f"`ea.population_size` ({ea.population_size}) must equal `num_candidates`.")

        device, dtype = self._execution_device, model.dtype
        x_norm = model.normalize_x(x)
        y_norm = ((y.to(device) - model.y_mean) / model.y_std).cpu().numpy()
        bounds = np.stack([x.cpu().numpy().min(0), x.cpu().numpy().max(0)]) if bounds is None else bounds
        bounds_t = torch.as_tensor(bounds, dtype=dtype, device=device)
        bounds_norm = model.normalize_x(bounds_t).cpu().numpy().astype(np.float64)
        knn = KnnSupport(x_norm.cpu().numpy(), y_norm, k=support_k, cache=False) if support_transform else None
        steps = inference_timesteps(self.scheduler, num_inference_steps)
        y_best = float(y_norm.max())

        def samples_of(population: np.ndarray) -> torch.Tensor:
            designs = torch.as_tensor(population, dtype=dtype, device=device)
            latents = torch.randn((num_samples, len(population)), generator=generator, dtype=dtype).to(device)
            samples = predictive_samples(model, self.scheduler.alphas_cumprod, steps, designs, latents)
            if knn is not None:
                samples = transform(samples, knn.log_radius(population).to(samples), tau_a, sigma_a0, sigma_a1)
            return samples

        def score(population: np.ndarray) -> np.ndarray:
            samples = samples_of(population)
            values = acquisition(samples, acquisition_function, beta, y_best, ei_xi, mvr_lambda)
            return values.float().cpu().numpy()

        rng = np.random.default_rng(seed)
        population, _, best = evolutionary_search(score, x_norm.cpu().numpy(), y_norm, bounds_norm, ea, rng)
        to_data = lambda z: model.denormalize_x(torch.as_tensor(z, dtype=dtype, device=device))  # noqa: E731
        candidates, best = to_data(population), to_data(best[None])[0]
        if discrete_shape is not None:
            length, classes = discrete_shape
            snap = lambda z: torch.as_tensor(  # noqa: E731
                to_logits(from_logits(z.cpu().numpy(), length, classes), classes), dtype=dtype, device=device
            )
            candidates, best = snap(candidates), snap(best[None])[0]
        samples = samples_of(model.normalize_x(candidates).cpu().numpy())
        values = acquisition(samples, acquisition_function, beta, y_best, ei_xi, mvr_lambda).float().cpu().numpy()
        mean = model.denormalize_y(samples.mean(0)).float().cpu().numpy()
        order = np.argsort(-values, kind="stable")
        candidates = candidates.float().cpu().numpy()[order]
        out = (candidates, values[order], mean[order], best.float().cpu().numpy())
        self.maybe_free_model_hooks()
        if not return_dict:
            return out
        return OfflineOptimizationOutput(*out)
