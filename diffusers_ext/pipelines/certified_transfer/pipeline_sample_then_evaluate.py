"""SampleThenEvaluatePipeline: draw a finite class of adapters from a parameter diffusion model, then pick and
certify the one with the lowest support risk."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler, DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor

from ...models.parameter_diffusion import ParameterDiffusionModel
from ...utils import check_finite, check_positive_int, is_number, public
from ..pipeline_utils import check_callback_tensor_inputs, check_generator
from .adapter_vectorizer import AdapterVectorizer
from .certificate import CERTIFICATE_KINDS, finite_class_certificate


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pt", "np")


@public
@dataclass
class SampleThenEvaluateOutput(BaseOutput):
    """Output of [`SampleThenEvaluatePipeline`].

    Args:
        best_adapter (`torch.Tensor` or `np.ndarray` of shape `(vector_dim,)`): the raw (de-standardised) adapter
            vector with the lowest empirical support risk (the first one on ties).
        empirical_risk (`float`): its empirical risk on the support set.
        certificate (`float`): the upper bound on its true risk, holding with probability `>= 1 - delta`.
        risks (`torch.Tensor` or `np.ndarray` of shape `(num_hypotheses,)`): every hypothesis' empirical risk.
        hypotheses (`torch.Tensor` or `np.ndarray` of shape `(num_hypotheses, vector_dim)`): the raw vectors of the
            whole finite class, in draw order.
        best_index (`int`): the index of `best_adapter` in `hypotheses`.

    When `evaluate_fn` returns risks of shape `(num_tasks, num_hypotheses)` (one fixed class evaluated on several
    support sets), `best_adapter` is `(num_tasks, vector_dim)`, `empirical_risk`, `certificate` and `best_index` are
    tensors of shape `(num_tasks,)` and `risks` is `(num_tasks, num_hypotheses)`.
    """

    best_adapter: torch.Tensor | np.ndarray
    empirical_risk: float | torch.Tensor
    certificate: float | torch.Tensor
    risks: torch.Tensor | np.ndarray
    hypotheses: torch.Tensor | np.ndarray
    best_index: int | torch.Tensor


@public
class SampleThenEvaluatePipeline(DiffusionPipeline):
    r"""
    Certified few-shot transfer by sample-then-evaluate (STEEL-style).

    1. Draw `num_hypotheses` adapter vectors from the parameter diffusion model (reverse diffusion with the
       scheduler), **all of them before the support data are touched**.
    2. Call `evaluate_fn(hypotheses)` once, which returns each hypothesis' empirical 0-1 risk on the `num_support`
       support examples, and pick the argmin.
    3. Certify it with [`finite_class_certificate`] over the class of `num_hypotheses` members.

    Why the order matters: the certificate is a union bound over a *finite class fixed in advance*. It holds because
    the class is drawn independently of the support set, so each member's support risk is an unbiased, i.i.d.
    estimate of its true risk, and the bound holds for all members at once, hence for the one picked. If the class
    depended on the support data (sampling guided by the support loss, resampling after looking at risks, drawing
    more hypotheses until one looks good), the union bound would no longer cover the picked adapter. Conditioning on
    anything data-independent is fine; conditioning on the support set needs a split of it.

    This pipeline inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    Parameters:
        model ([`ParameterDiffusionModel`]): the denoiser over standardised adapter vectors (it stores the
            vectoriser's layout and standardisation).
        scheduler ([`DDPMScheduler`] or [`DDIMScheduler`]): the reverse diffusion.
    """

    model_cpu_offload_seq = "model"
    _optional_components = []
    _callback_tensor_inputs = ["latents"]

    def __init__(self, model: ParameterDiffusionModel, scheduler: DDPMScheduler | DDIMScheduler):
        super().__init__()
        self.register_modules(model=model, scheduler=scheduler)

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    @property
    def vectorizer(self) -> AdapterVectorizer:
        """The [`AdapterVectorizer`] stored with the model (its layout and standardisation)."""
        config = self.model.config
        if config.parameter_names is None:
            raise ValueError("the model stores no adapter layout (`parameter_names` is None in its config).")
        return AdapterVectorizer(
            config.parameter_names,
            config.parameter_shapes,
            mean=self.model.vector_mean.detach().cpu(),
            std=self.model.vector_std.detach().cpu(),
        )

    def check_inputs(
        self,
        num_hypotheses,
        evaluate_fn,
        num_support,
        delta,
        bound,
        generator,
        num_inference_steps,
        sampling_batch_size,
        latents,
        output_type,
        tensor_inputs,
    ) -> None:
        """Validate a call before any model work."""
        check_positive_int("num_hypotheses", num_hypotheses)
        if not callable(evaluate_fn):
            raise TypeError(f"`evaluate_fn` must be callable, got {type(evaluate_fn).__name__}.")
        check_positive_int("num_support", num_support)
        if not is_number(delta) or not 0 < delta < 1:
            raise ValueError(f"`delta` must be a number in (0, 1), got {delta!r}.")
        if bound not in CERTIFICATE_KINDS:
            raise ValueError(f"`bound` must be one of {CERTIFICATE_KINDS}, got {bound!r}.")
        check_generator(generator, num_hypotheses, batch="`num_hypotheses`")
        check_positive_int("num_inference_steps", num_inference_steps)
        check_positive_int("sampling_batch_size", sampling_batch_size, optional=True)
        dim = self.model.config.vector_dim
        if latents is not None and (
            not isinstance(latents, torch.Tensor)
            or not latents.is_floating_point()
            or tuple(latents.shape) != (num_hypotheses, dim)
        ):
            raise ValueError(
                f"`latents` must be a float tensor of shape (num_hypotheses, {dim}) = {(num_hypotheses, dim)}, got "
                f"{getattr(latents, 'shape', type(latents).__name__)}."
            )
        if latents is not None:
            check_finite("latents", latents)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, tensor_inputs)

    def _check_risks(self, risks, num_hypotheses) -> torch.Tensor:
        if not isinstance(risks, (torch.Tensor, np.ndarray)):
            raise TypeError(f"`evaluate_fn` must return a tensor or array of risks, got {type(risks).__name__}.")
        risks = torch.as_tensor(risks, dtype=torch.float64).cpu()
        if risks.ndim not in (1, 2) or risks.shape[-1] != num_hypotheses or risks.numel() == 0:
            raise ValueError(
                f"`evaluate_fn` returned risks of shape {tuple(risks.shape)}; expected (num_hypotheses,) = "
                f"({num_hypotheses},) or (num_tasks, {num_hypotheses})."
            )
        check_finite("evaluate_fn(hypotheses)", risks, minimum=0, maximum=1, expected="0-1 risks in [0, 1]")
        return risks

    @torch.no_grad()
    def sample_hypotheses(
        self,
        latents: torch.Tensor,
        generator: torch.Generator | list[torch.Generator] | None,
        sampling_batch_size: int | None,
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs=("latents",),
    ) -> torch.Tensor:
        """Reverse-diffuse standardised `latents` of shape `(num_hypotheses, vector_dim)` in chunks of
        `sampling_batch_size`; returns the raw (de-standardised) vectors, same shape. With a list of generators (one
        per hypothesis), each chunk steps with its own hypotheses' generators."""
        chunk = latents.shape[0] if sampling_batch_size is None else sampling_batch_size
        outputs = []
        with self.progress_bar(total=self._num_timesteps * ((latents.shape[0] + chunk - 1) // chunk)) as bar:
            for start in range(0, latents.shape[0], chunk):
                sample = latents[start : start + chunk]
                chunk_generator = generator[start : start + chunk] if isinstance(generator, list) else generator
                for i, t in enumerate(self.scheduler.timesteps):
                    if self.interrupt:
                        break
                    model_input = self.scheduler.scale_model_input(sample, t)
                    noise = self.model(model_input, t).sample
                    sample = self.scheduler.step(noise, t, sample, generator=chunk_generator, return_dict=False)[0]
                    if callback_on_step_end is not None:
                        local_vars = {"latents": sample}
                        callback_kwargs = {k: local_vars[k] for k in callback_on_step_end_tensor_inputs}
                        outputs_ = callback_on_step_end(self, i, t, callback_kwargs) or {}
                        sample = outputs_.pop("latents", sample)
                    bar.update()
                outputs.append(sample)
        standardised = torch.cat(outputs)
        return standardised * self.model.vector_std.to(standardised) + self.model.vector_mean.to(standardised)

    @torch.no_grad()
    def __call__(
        self,
        num_hypotheses: int,
        evaluate_fn: Callable[[torch.Tensor], torch.Tensor],
        num_support: int,
        delta: float = 0.05,
        bound: str = "hoeffding",
        generator: torch.Generator | list[torch.Generator] | None = None,
        num_inference_steps: int = 50,
        sampling_batch_size: int | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pt",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> SampleThenEvaluateOutput | tuple:
        r"""
        Draw a finite class of adapters, evaluate it on the support set once, return the best one and its certificate.

        Every hypothesis is drawn before `evaluate_fn` is called, and `evaluate_fn` is called exactly once, with the
        whole class: the union bound behind the certificate needs the class fixed before the support data are seen
        (see the class docstring).

        Args:
            num_hypotheses (`int`): the class size `|Theta|`.
            evaluate_fn (`Callable`): `evaluate_fn(hypotheses)` with `hypotheses` a float tensor of shape
                `(num_hypotheses, vector_dim)` (raw adapter vectors) returns their empirical 0-1 risks on the support
                set, shape `(num_hypotheses,)`, in `[0, 1]`.
            num_support (`int`): the number `n` of i.i.d. support examples `evaluate_fn` measures risks on.
            delta (`float`, defaults to 0.05): the certificate fails with probability at most `delta`.
            bound (`str`, defaults to `"hoeffding"`): `"hoeffding"` or `"kl"` (never looser), see
                [`finite_class_certificate`].
            generator (`torch.Generator` or a list of `num_hypotheses`, *optional*): draws the initial noise and the
                DDPM noise; with a list, hypothesis `i` draws from `generator[i]` alone (it then equals a call with
                one hypothesis and that generator, whatever `sampling_batch_size`).
            num_inference_steps (`int`, defaults to 50): reverse diffusion steps.
            sampling_batch_size (`int`, *optional*): sample in chunks of this many hypotheses (default: all at once);
                with a DDPM scheduler the chunking changes which noise goes to which hypothesis.
            latents (`torch.Tensor` of shape `(num_hypotheses, vector_dim)`, *optional*): initial standardised noise.
            output_type (`str`, defaults to `"pt"`): `"pt"` (tensors) or `"np"` (arrays).
            return_dict (`bool`, defaults to `True`): return a [`SampleThenEvaluateOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after
                every denoising step (of every chunk); it may return new `latents`.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): names among `_callback_tensor_inputs`.

        Returns:
            [`SampleThenEvaluateOutput`] or `(best_adapter, empirical_risk, certificate, risks, hypotheses,
            best_index)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if callback_on_step_end_tensor_inputs is None:
            callback_on_step_end_tensor_inputs = ["latents"]
        self.check_inputs(
            num_hypotheses,
            evaluate_fn,
            num_support,
            delta,
            bound,
            generator,
            num_inference_steps,
            sampling_batch_size,
            latents,
            output_type,
            callback_on_step_end_tensor_inputs,
        )
        device, dtype = self._execution_device, self.model.dtype
        shape = (num_hypotheses, self.model.config.vector_dim)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        else:
            latents = latents.to(device=device, dtype=dtype)
        latents = latents * self.scheduler.init_noise_sigma
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        self._num_timesteps = len(self.scheduler.timesteps)
        self._interrupt = False

        # 1. the whole finite class, before any support data are seen
        hypotheses = self.sample_hypotheses(
            latents, generator, sampling_batch_size, callback_on_step_end, callback_on_step_end_tensor_inputs
        )
        self.maybe_free_model_hooks()
        # 2. one evaluation of the fixed class on the support set
        risks = self._check_risks(evaluate_fn(hypotheses), num_hypotheses)
        if risks.ndim == 1:
            best_index = int(torch.argmin(risks))
            empirical_risk = float(risks[best_index])
        else:  # one fixed class, several support sets of `num_support` examples each
            best_index = torch.argmin(risks, dim=1)
            empirical_risk = risks.gather(1, best_index[:, None])[:, 0]
        # 3. the certificate over the class of `num_hypotheses`
        certificate = finite_class_certificate(empirical_risk, num_support, num_hypotheses, delta, bound)
        best = hypotheses[best_index]
        risks = risks.to(torch.float32)
        if output_type == "np":
            best, risks, hypotheses = best.float().cpu().numpy(), risks.numpy(), hypotheses.float().cpu().numpy()
        if not return_dict:
            return (best, empirical_risk, certificate, risks, hypotheses, best_index)
        return SampleThenEvaluateOutput(
            best_adapter=best,
            empirical_risk=empirical_risk,
            certificate=certificate,
            risks=risks,
            hypotheses=hypotheses,
            best_index=best_index,
        )
