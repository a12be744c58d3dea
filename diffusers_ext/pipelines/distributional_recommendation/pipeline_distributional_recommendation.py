"""DistributionalRecommendationPipeline: recommend from a distribution of user embeddings. For each user, draw K
embeddings from a [`UserEmbeddingDenoiser`] conditioned on the user's interactions, score the items with each, and
rank by the scores averaged over the draws."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler, DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor

from ...models.item_scoring import ItemScoringModel
from ...models.user_embedding_denoiser import UserEmbeddingDenoiser
from ...utils import check_finite, check_positive_int, public
from ..pipeline_utils import check_callback_tensor_inputs, check_generator, prepare_initial_noise


OUTPUT_TYPES = ("pt", "np", "latent")
# The score of an excluded (already interacted) item: below every probability, so never recommended, and finite, so
# scores compare and average without NaN.
EXCLUDED = -1.0


logger = logging.get_logger(__name__)


@public
@dataclass
class DistributionalRecommendationOutput(BaseOutput):
    """Output of [`DistributionalRecommendationPipeline`].

    Args:
        scores (`torch.Tensor` or `np.ndarray` of shape `(batch, num_items)` or `(batch, m)`): each item's probability of
            interaction averaged over the draws, `mean_k sigmoid(u_k . e_i + b_i)` (for `candidates` given: their
            `m` items); interacted items score -1 (below every probability) when `exclude_interacted`.
        top_items (`torch.Tensor` of shape `(batch, top_k)`, long): the best items by `scores` (indices into the
            catalogue, or into `candidates`' rows when given).
        embeddings (`torch.Tensor` of shape `(batch, num_samples, embedding_dim)`): the drawn user embeddings.
    """

    scores: torch.Tensor | np.ndarray
    top_items: torch.Tensor | np.ndarray
    embeddings: torch.Tensor | np.ndarray


@public
class DistributionalRecommendationPipeline(DiffusionPipeline):
    r"""
    Recommendation with a distribution of user embeddings per user.

    For each user, `num_samples` embeddings are drawn by the denoiser (a DDPM or DDIM sampler) conditioned on the
    mean embedding of the user's interacted items; each scores every item (`sigmoid(u . e_i + b_i)` of the
    [`ItemScoringModel`]); the scores are averaged over the draws and the `top_k` best items returned. A user whose
    feedback mixes several tastes gets draws near each, where one embedding would fall between them.

    This pipeline inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    Parameters:
        denoiser ([`UserEmbeddingDenoiser`]): the conditional denoiser over user embeddings.
        item_model ([`ItemScoringModel`]): the item embeddings and biases.
        scheduler ([`DDPMScheduler`] or [`DDIMScheduler`]): the sampler.
    """

    model_cpu_offload_seq = "denoiser"
    _optional_components = []
    _callback_tensor_inputs = ["latents"]

    def __init__(
        self,
        denoiser: UserEmbeddingDenoiser,
        item_model: ItemScoringModel,
        scheduler: DDPMScheduler | DDIMScheduler,
    ):
        super().__init__()
        if denoiser.config.embedding_dim != item_model.config.embedding_dim:
            raise ValueError(
                f"`denoiser` draws {denoiser.config.embedding_dim}-dim embeddings but `item_model` scores "
                f"{item_model.config.embedding_dim}-dim ones."
            )
        self.register_modules(denoiser=denoiser, item_model=item_model, scheduler=scheduler)

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def check_inputs(
        self,
        interacted,
        num_samples,
        top_k,
        num_inference_steps,
        generator,
        candidates,
        latents=None,
        output_type="pt",
        tensor_inputs=None,
    ) -> None:
        """Validate a call before any model work."""
        if not isinstance(interacted, (list, tuple)) or not interacted:
            raise ValueError("`interacted` must be a non-empty list with one list of item indices per user.")
        for index, items in enumerate(interacted):
            items = self.item_model.check_items(items, f"interacted[{index}]")
            if items.numel() == 0:
                raise ValueError(f"`interacted[{index}]` is empty; each user needs at least one interacted item.")
        check_positive_int("num_samples", num_samples)
        check_positive_int("num_inference_steps", num_inference_steps)
        check_generator(generator, len(interacted), "`interacted`")
        width = self.item_model.config.num_items
        if candidates is not None:
            candidates = self.item_model.check_items(candidates, "candidates")
            if candidates.ndim != 2 or len(candidates) != len(interacted):
                raise ValueError(
                    f"`candidates` must have shape (batch, m) with one row per user ({len(interacted)}), got "
                    f"{tuple(candidates.shape)}."
                )
            width = candidates.shape[1]
        check_positive_int("top_k", top_k)
        if top_k > width:
            raise ValueError(f"`top_k` is {top_k} but only {width} items are scored.")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, tensor_inputs)
        shape = (len(interacted) * num_samples, self.denoiser.config.embedding_dim)
        if latents is not None:
            if not isinstance(latents, torch.Tensor) or tuple(latents.shape) != shape:
                got = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
                raise ValueError(
                    f"`latents` must be a tensor of shape (batch * num_samples, embedding_dim) = {shape}, got {got}."
                )
            check_finite("latents", latents)

    @torch.no_grad()
    def __call__(
        self,
        interacted: list,
        num_samples: int = 8,
        top_k: int = 10,
        num_inference_steps: int = 50,
        generator: torch.Generator | list[torch.Generator] | None = None,
        candidates: torch.Tensor | None = None,
        exclude_interacted: bool = True,
        latents: torch.Tensor | None = None,
        output_type: str = "pt",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> DistributionalRecommendationOutput | tuple:
        r"""
        Recommend `top_k` items to each user.

        Args:
            interacted (`list`): one list (or 1-D tensor) of interacted item indices per user.
            num_samples (`int`, defaults to 8): embeddings drawn per user (K).
            top_k (`int`, defaults to 10): items returned per user.
            num_inference_steps (`int`, defaults to 50): sampler steps.
            generator (`torch.Generator` or a list of one per user, *optional*): draws the noise; with a list, user
                `b`'s draws depend on `generator[b]` only.
            candidates (`torch.Tensor` of shape `(batch, m)`, *optional*): score only these items per user (e.g. a
                held-out item and its sampled negatives); `top_items` then index the rows of `candidates`.
            exclude_interacted (`bool`, defaults to `True`): give interacted items the score -1, so they are never
                recommended (when scoring the whole catalogue).
            latents (`torch.Tensor` of shape `(batch * num_samples, embedding_dim)`, *optional*): the initial noise,
                user-major (user `b`'s draws are rows `b K .. b K + K - 1`).
            output_type (`str`, defaults to `"pt"`): `"pt"` (tensors) or `"np"` (arrays); `"latent"` is `"pt"` (a
                recommendation has nothing to decode).
            return_dict (`bool`, defaults to `True`): a [`DistributionalRecommendationOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after
                every step; it may return new `latents`.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): names among `_callback_tensor_inputs`
                (default `["latents"]`).

        Returns:
            [`DistributionalRecommendationOutput`] or `(scores, top_items, embeddings)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if callback_on_step_end_tensor_inputs is None:
            callback_on_step_end_tensor_inputs = ["latents"]
        self.check_inputs(
            interacted,
            num_samples,
            top_k,
            num_inference_steps,
            generator,
            candidates,
            latents,
            output_type,
            callback_on_step_end_tensor_inputs,
        )
        device = self._execution_device
        dtype = self.denoiser.dtype
        batch, d = len(interacted), self.denoiser.config.embedding_dim
        summary = self.item_model.summary(interacted).to(device=device, dtype=dtype)
        summary = summary.repeat_interleave(num_samples, dim=0)  # (batch * K, d), user-major
        if latents is not None:
            latents = latents.to(device=device, dtype=dtype)
        elif isinstance(generator, list):
            latents = torch.cat(
                [randn_tensor((num_samples, d), generator=g, device=device, dtype=dtype) for g in generator]
            )
        else:
            latents = randn_tensor((batch * num_samples, d), generator=generator, device=device, dtype=dtype)
        latents, timesteps = prepare_initial_noise(self.scheduler, num_inference_steps, latents, device)
        self._num_timesteps = len(timesteps)
        self._interrupt = False
        for i, t in enumerate(self.progress_bar(timesteps)):
            if self.interrupt:
                break
            noise = self.denoiser(latents, t, summary).sample
            if isinstance(generator, list):  # each user's step noise from its own generator: a batch = its singles
                latents = torch.cat(
                    [
                        self.scheduler.step(n, t, x, generator=g).prev_sample
                        for n, x, g in zip(noise.split(num_samples), latents.split(num_samples), generator)
                    ]
                )
            else:
                latents = self.scheduler.step(noise, t, latents, generator=generator).prev_sample
            if callback_on_step_end is not None:
                local_vars = {"latents": latents}
                callback_kwargs = {k: local_vars[k] for k in callback_on_step_end_tensor_inputs}
                outputs = callback_on_step_end(self, i, t, callback_kwargs) or {}
                latents = outputs.pop("latents", latents)
        embeddings = latents.reshape(batch, num_samples, d)
        if candidates is None:
            scores = torch.sigmoid(self.item_model.scores(embeddings.float())).mean(1)  # (batch, num_items)
            if exclude_interacted:
                for index, items in enumerate(interacted):
                    scores[index, torch.as_tensor(items, dtype=torch.long, device=scores.device)] = EXCLUDED
        else:
            rows = torch.as_tensor(candidates, dtype=torch.long, device=device)[:, None].expand(-1, num_samples, -1)
            scores = torch.sigmoid(self.item_model.scores(embeddings.float(), rows)).mean(1)  # (batch, m)
        top_items = scores.topk(top_k, dim=1).indices
        self.maybe_free_model_hooks()
        if output_type == "np":
            scores, top_items, embeddings = (x.cpu().float().numpy() if x.is_floating_point() else x.cpu().numpy()
                                             for x in (scores, top_items, embeddings))  # fmt: skip
        if not return_dict:
            return (scores, top_items, embeddings)
        return DistributionalRecommendationOutput(scores=scores, top_items=top_items, embeddings=embeddings)
