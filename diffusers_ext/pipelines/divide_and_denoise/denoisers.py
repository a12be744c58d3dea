"""The models a [`DivideAndDenoisePipeline`] coordinates.

- [`MultiDenoiserModel`] holds the list of denoisers (like diffusers' `MultiControlNetModel`) and saves each one in
  its own subfolder, so a pipeline of several pretrained models round-trips through `save_pretrained`.
- [`WindowedDenoiser`] places a pixel `UNet2DModel` at a fixed window of a larger canvas: inside the window the
  model denoises its crop, outside it predicts a constant background. It is the exact denoiser of "the model's
  images pasted at that window on a blank canvas", i.e. an expert with a position prior.

Every denoiser is called like a `UNet2DModel`: `model(sample, timestep, class_labels=None).sample` (or, for a
`UNet2DConditionModel`, with `encoder_hidden_states`, and for an SDXL-style one also `added_cond_kwargs`); an
`SD3Transformer2DModel` (joint attention over image and text tokens) is called with `hidden_states`,
`encoder_hidden_states` and `pooled_projections`, a `FluxTransformer2DModel` with packed latents, token ids and its
guidance input ([`agent_predictions`]). [`denoiser_family`] names which of these a text denoiser is.
"""

import os

import torch
from diffusers import (
    DDPMScheduler,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    UNet2DConditionModel,
    UNet2DModel,
)
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.models.unets.unet_2d import UNet2DOutput
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import logging

from ...loading import resolve_model_class
from ...utils import is_int, public
from ..pipeline_utils import PREDICTION_TYPES, prediction_to_epsilon, vp_coefficients
from ..pipeline_utils import alpha_bar_at as _alpha_bar_at


logger = logging.get_logger(__name__)

_LIBRARIES = ("diffusers", "diffusers_ext")
# The text-to-image families a text denoiser can belong to (see `denoiser_family`).
TEXT_FAMILIES = ("sd", "sdxl", "sd3", "flux")
# FluxPipeline's `default_sample_size`: Flux transformers record no sample size, and their pipeline makes 1024 px
# images (128 x 128 latents) by default.
FLUX_DEFAULT_SAMPLE_SIZE = 128
# Noise-schedule entries that must agree for models to share one sampler.
_SCHEDULE_KEYS = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "trained_betas", "prediction_type")


def as_pair(value, name: str) -> tuple[int, int]:
    """`value` (an int or a pair of ints) as `(height, width)`; a `ValueError` names the argument `name` otherwise."""
    if is_int(value):
        return (value, value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"`{name}` must be an int or a pair of ints, got {value!r}.")


def schedule_alphas_cumprod(
    num_train_timesteps: int, beta_start: float, beta_end: float, beta_schedule: str
) -> torch.Tensor:
    """The `(num_train_timesteps,)` cumulative products of `1 - beta` of a `DDPMScheduler` noise schedule."""
    return DDPMScheduler(
        num_train_timesteps=num_train_timesteps, beta_start=beta_start, beta_end=beta_end, beta_schedule=beta_schedule
    ).alphas_cumprod.clone()


def alpha_bar_at(alphas_cumprod: torch.Tensor, timestep, batch: int, sample: torch.Tensor) -> torch.Tensor:
    """`alphas_cumprod` at `timestep` (a number, a 0-d or a `(batch,)` tensor), shaped `(batch, 1, 1, 1)` in the
    device and dtype of `sample` ([`pipeline_utils.alpha_bar_at`])."""
    alpha_bar = _alpha_bar_at(alphas_cumprod, timestep, device=sample.device, dtype=sample.dtype)
    return (alpha_bar.expand(batch) if alpha_bar.ndim == 0 else alpha_bar).view(batch, 1, 1, 1)


@public
class MultiDenoiserModel(ModelMixin, ConfigMixin):
    r"""
    A list of denoisers that share one sample space, for [`DivideAndDenoisePipeline`].

    Saved as `config.json` (the library and class of each denoiser) plus one subfolder `denoiser_{i}` per denoiser;
    `from_pretrained` loads each with its own class (only classes of `diffusers` and `diffusers_ext` are resolved).

    Args:
        denoisers (`list[ModelMixin]`): the denoisers, e.g. several `UNet2DConditionModel`s fine-tuned from one base
            model, or `UNet2DModel`s. One denoiser can serve several prompts or classes.
    """

    def __init__(self, denoisers: list[torch.nn.Module]):
        super().__init__()
        if isinstance(denoisers, torch.nn.Module) or not isinstance(denoisers, (list, tuple, torch.nn.ModuleList)):
            raise TypeError(f"`denoisers` must be a list of models, got {type(denoisers).__name__}.")
        if len(denoisers) == 0:
            raise ValueError("`denoisers` must hold at least one model, got an empty list.")
        for i, model in enumerate(denoisers):
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"`denoisers[{i}]` must be a torch.nn.Module, got {type(model).__name__}.")
            check_divide_and_denoise_denoiser(uncompiled(model), f"denoisers[{i}]")
        self.denoisers = torch.nn.ModuleList(denoisers)
        classes = [[type(m).__module__.split(".")[0], type(m).__name__] for m in map(uncompiled, denoisers)]
        self.register_to_config(denoiser_classes=classes)

    def __len__(self) -> int:
        return len(self.denoisers)

    def __getitem__(self, index: int) -> torch.nn.Module:
        return self.denoisers[index]

    def __iter__(self):
        return iter(self.denoisers)

    def forward(self, index: int, *args, **kwargs):
        """Run denoiser `index` (so that `count_module_forwards` and offload hooks see the call)."""
        return self.denoisers[index](*args, **kwargs)

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        safe_serialization: bool = True,
        variant: str | None = None,
        **kwargs,
    ) -> None:
        """Write `config.json` and each denoiser's own `save_pretrained` folder `denoiser_{i}`.

        `safe_serialization` and `variant` are named (diffusers' `DiffusionPipeline.save_pretrained` passes them only
        to loaders whose signature names them) and given to every denoiser, with the other `kwargs`.
        """
        models = [uncompiled(model) for model in self.denoisers]  # a compiled denoiser saves its own module
        for i, model in enumerate(models):
            if not isinstance(model, ModelMixin) or type(model).__module__.split(".")[0] not in _LIBRARIES:
                raise ValueError(
                    f"denoiser {i} is a {type(model).__name__}; only diffusers or diffusers_ext ModelMixin classes can "
                    "be saved."
                )
        os.makedirs(save_directory, exist_ok=True)
        self.save_config(save_directory)
        for i, model in enumerate(models):
            model.save_pretrained(
                os.path.join(save_directory, f"denoiser_{i}"),
                safe_serialization=safe_serialization,
                variant=variant,
                **kwargs,
            )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> "MultiDenoiserModel":
        """Load a folder written by `save_pretrained`; `kwargs` (e.g. `dtype`) go to each denoiser's loader."""
        subfolder = kwargs.pop("subfolder", None)
        folder = os.path.join(pretrained_model_name_or_path, subfolder) if subfolder else pretrained_model_name_or_path
        if not os.path.isdir(folder):
            raise ValueError(f"`pretrained_model_name_or_path` {str(folder)!r} is not a local folder.")
        config = cls.load_config(folder)
        denoisers = []
        for i, (library, class_name) in enumerate(config["denoiser_classes"]):
            if library not in _LIBRARIES:
                raise ValueError(f"denoiser {i} names library {library!r}; expected one of {_LIBRARIES}.")
            model_class = resolve_model_class(library, class_name)
            denoisers.append(model_class.from_pretrained(os.path.join(folder, f"denoiser_{i}"), **kwargs))
        return cls(denoisers)


@public
class WindowedDenoiser(ModelMixin, ConfigMixin):
    r"""
    A pixel [`UNet2DModel`] placed at a fixed window of a larger canvas, with a constant background elsewhere.

    Inside the window it runs the UNet on the crop; outside it returns the noise prediction of a clean constant
    `background`, `(x_t - sqrt(a) background) / sqrt(1 - a)`. This is the exact denoiser of the UNet's images pasted
    at the window of a blank canvas: an expert that paints its object at one place. Class labels are passed to the
    UNet.

    Args:
        denoiser_config (`dict`): the `UNet2DModel` config (use [`~WindowedDenoiser.from_unet`] to copy a model).
        canvas_size (`int` or `(height, width)`): the canvas.
        window_offset (`(top, left)`): where the UNet's `sample_size` window sits on the canvas.
        background (`float`, defaults to -1.0): the clean value outside the window (-1 is black in [-1, 1] images).
        num_train_timesteps, beta_start, beta_end, beta_schedule: the noise schedule of the UNet's training.
    """

    @register_to_config
    def __init__(
        self,
        denoiser_config: dict,
        canvas_size: int | tuple[int, int] = 16,
        window_offset: tuple[int, int] = (0, 0),
        background: float = -1.0,
        num_train_timesteps: int = 1000,
        beta_start: float = 0.0001,
        beta_end: float = 0.02,
        beta_schedule: str = "linear",
    ):
        super().__init__()
        self.denoiser = UNet2DModel.from_config(denoiser_config)
        height, width = as_pair(canvas_size, "canvas_size")
        win_h, win_w = as_pair(self.denoiser.config.sample_size, "denoiser_config.sample_size")
        top, left = as_pair(tuple(window_offset), "window_offset")
        if top < 0 or left < 0 or top + win_h > height or left + win_w > width:
            raise ValueError(
                f"`window_offset` {window_offset!r} puts the {win_h}x{win_w} window outside the {height}x{width} canvas."
            )
        self.window = (top, left, win_h, win_w)
        self.register_buffer(
            "alphas_cumprod",
            schedule_alphas_cumprod(num_train_timesteps, beta_start, beta_end, beta_schedule),
            persistent=False,
        )

    @classmethod
    def from_unet(
        cls, unet: UNet2DModel, canvas_size, window_offset, background: float = -1.0, scheduler=None, **schedule
    ) -> "WindowedDenoiser":
        """Wrap a copy of `unet`'s weights at `window_offset` of a `canvas_size` canvas.

        The noise schedule comes from `scheduler` (the UNet's own scheduler) or from the `schedule` keywords.
        """
        if scheduler is not None:
            keys = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule")
            schedule = {k: scheduler.config[k] for k in keys} | schedule
        model = cls(dict(unet.config), canvas_size, tuple(window_offset), background, **schedule)
        model.denoiser.load_state_dict(unet.state_dict())
        model = model.to(unet.device)
        return (model if model.dtype == unet.dtype else model.to(dtype=unet.dtype)).eval()

    @property
    def num_class_embeds(self) -> int | None:
        return self.denoiser.config.num_class_embeds

    def forward(self, sample: torch.Tensor, timestep, class_labels=None, return_dict: bool = True):
        batch = sample.shape[0]
        signal, noise = vp_coefficients(alpha_bar_at(self.alphas_cumprod, timestep, batch, sample))
        # outside the window the exact denoiser's clean sample is the background
        eps = prediction_to_epsilon(self.config.background, sample, signal, noise, "sample", PREDICTION_TYPES)
        top, left, win_h, win_w = self.window
        crop = sample[:, :, top : top + win_h, left : left + win_w]
        inner = self.denoiser(crop, timestep, class_labels=class_labels).sample
        eps = eps.clone()
        eps[:, :, top : top + win_h, left : left + win_w] = inner
        return UNet2DOutput(sample=eps) if return_dict else (eps,)


# What the pipeline needs to know about a denoiser, whatever its class --------------------------------------------


def uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module a `torch.compile` wrapper holds (`_orig_mod`), or `model` itself: what a denoiser *is*."""
    return getattr(model, "_orig_mod", model)


def check_divide_and_denoise_denoiser(model: torch.nn.Module, argument: str) -> None:
    """Raise a `ValueError` naming `argument` for a UNet whose added conditioning Divide-and-Denoise does not feed:
    `addition_embed_type` other than SDXL's `"text_time"` (pooled text embeddings and size/crop time ids), e.g.
    Kandinsky's image embeddings."""
    addition = getattr(getattr(model, "config", None), "addition_embed_type", None)
    if isinstance(model, UNet2DConditionModel) and addition not in (None, "text_time"):
        raise ValueError(
            f"`{argument}` is a UNet with `addition_embed_type={addition!r}`, which Divide-and-Denoise does not "
            "support; it runs SD 1.x / 2.x UNets, SDXL-style UNets (`addition_embed_type='text_time'`), SD3 and Flux "
            "transformers."
        )


def denoiser_family(model: torch.nn.Module) -> str | None:
    """The text-to-image family of a text denoiser (a `torch.compile`d one is classified by the module it compiles),
    which says how it is conditioned and called:

    - `"sd"`: an SD 1.x / 2.x `UNet2DConditionModel` (prompt token embeddings through cross-attention);
    - `"sdxl"`: a `UNet2DConditionModel` with `addition_embed_type="text_time"` (also pooled text embeddings and
      size/crop time ids);
    - `"sd3"`: an `SD3Transformer2DModel` (joint attention; text and pooled embeddings);
    - `"flux"`: a `FluxTransformer2DModel` (joint attention over packed 2x2 latent patches; text and pooled
      embeddings, token ids, and a distilled guidance input);

    `None` for denoisers that take no text (pixel or class-conditional models).
    """
    model = uncompiled(model)
    if isinstance(model, FluxTransformer2DModel):
        return "flux"
    if isinstance(model, SD3Transformer2DModel):
        return "sd3"
    if isinstance(model, UNet2DConditionModel):
        return "sdxl" if model.config.addition_embed_type == "text_time" else "sd"
    return None


def denoiser_conditioning(model: torch.nn.Module) -> str:
    """`"text"` (cross- or joint attention), `"class"` (class embedding) or `"none"`; a `torch.compile`d denoiser
    is classified by the module it compiles."""
    if denoiser_family(model) is not None:
        return "text"
    return "class" if denoiser_num_class_embeds(uncompiled(model)) is not None else "none"


def denoiser_num_class_embeds(model: torch.nn.Module) -> int | None:
    """The size of a class-conditional denoiser's class table (null class included), else `None`."""
    model = uncompiled(model)
    if isinstance(model, WindowedDenoiser):
        return model.num_class_embeds
    return getattr(getattr(model, "config", None), "num_class_embeds", None)


def denoiser_sample_size(model: torch.nn.Module) -> tuple[int, int] | None:
    """The denoiser's native latent size `(height, width)` (a windowed denoiser's canvas), if it has one."""
    if denoiser_family(model) == "flux":
        return (FLUX_DEFAULT_SAMPLE_SIZE, FLUX_DEFAULT_SAMPLE_SIZE)
    config = getattr(model, "config", None)
    size = getattr(config, "canvas_size", None) or getattr(config, "sample_size", None)
    if size is None:
        return None
    return (size, size) if isinstance(size, int) else tuple(size)


def denoiser_in_channels(model: torch.nn.Module) -> int:
    """The channels of the (unpacked) latents the denoiser takes: a Flux transformer's `in_channels` count the 2x2
    patches its latents are packed into, so its latents have a quarter of them."""
    model = uncompiled(model)
    if denoiser_family(model) == "flux":
        return model.config.in_channels // 4
    return (model.denoiser if isinstance(model, WindowedDenoiser) else model).config.in_channels


def denoiser_latent_constraint(model: torch.nn.Module) -> tuple[int, bool]:
    """`(multiple, fixed)`: latent sides must be multiples of `multiple`; `fixed` models only take their own size."""
    model = uncompiled(model)
    if denoiser_family(model) == "flux":
        return 2, False  # latents are packed into 2x2 patches
    if denoiser_family(model) == "sd3":
        return model.config.patch_size, False
    if isinstance(model, WindowedDenoiser) or not hasattr(getattr(model, "config", None), "block_out_channels"):
        return 1, True
    return 2 ** (len(model.config.block_out_channels) - 1), False


def check_compatible_schedulers(schedulers: list[SchedulerMixin]) -> None:
    """Raise a `ValueError` unless every scheduler has the same noise schedule and prediction type."""
    reference = schedulers[0].config
    for i, scheduler in enumerate(schedulers[1:], start=1):
        differing = {
            key: (reference.get(key), scheduler.config.get(key))
            for key in _SCHEDULE_KEYS
            if reference.get(key) != scheduler.config.get(key)
        }
        if differing:
            raise ValueError(
                f"the scheduler of model {i} has a different noise schedule than model 0's as (model 0, model {i}): "
                f"{differing}; Divide-and-Denoise needs models trained with one schedule and prediction type."
            )


def pipeline_denoiser(pipe) -> torch.nn.Module | None:
    """The denoiser of a loaded pipeline: its `unet` (SD 1.x / 2.x, SDXL, class-conditional) or its `transformer`
    (SD3, Flux); `None` when it has neither."""
    for name in ("unet", "transformer"):
        model = getattr(pipe, name, None)
        if isinstance(model, torch.nn.Module):
            return model
    return None


# The text components a composition takes from its first pipeline; the others' are not used.
TEXT_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3")


def check_pipelines_share_a_space(pipelines: list) -> None:
    """Raise a `ValueError` when loaded pipelines differ in model family, noise schedule, latent shape or autoencoder
    (their denoisers cannot be composed); warn when they have different text encoders (the first one's are used)."""
    first = pipelines[0]
    for i, pipe in enumerate(pipelines[1:], start=1):
        families = [denoiser_family(pipeline_denoiser(p)) or "non-text" for p in (first, pipe)]
        if families[0] != families[1]:
            raise ValueError(
                f"`pipelines[{i}]` is a {families[1]} model and `pipelines[0]` a {families[0]} model; the pipelines "
                "mix model families, and Divide-and-Denoise composes models of one family."
            )
    check_compatible_schedulers([pipe.scheduler for pipe in pipelines])
    for i, pipe in enumerate(pipelines[1:], start=1):
        shapes = [
            (denoiser_in_channels(pipeline_denoiser(p)), denoiser_sample_size(pipeline_denoiser(p)))
            for p in (first, pipe)
        ]
        if shapes[0] != shapes[1]:
            raise ValueError(
                f"`pipelines[{i}]` has latents (channels, size) {shapes[1]}; `pipelines[0]` has {shapes[0]}."
            )
        vaes = [getattr(p, "vae", None) for p in (first, pipe)]
        if (vaes[0] is None) != (vaes[1] is None) or (
            vaes[0] is not None and dict(vaes[0].config) != dict(vaes[1].config)
        ):
            raise ValueError(f"`pipelines[{i}]` has a different autoencoder than `pipelines[0]`; latents differ.")
        for name in TEXT_ENCODERS:
            encoders = [getattr(p, name, None) for p in (first, pipe)]
            if encoders[0] is not None and encoders[1] is not None and encoders[0] is not encoders[1]:
                a, b = encoders[0].state_dict(), encoders[1].state_dict()
                if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
                    logger.warning(
                        f"`pipelines[{i}]` has its own {name.replace('_', ' ')}; every model is conditioned through "
                        f"the `{name}` of `pipelines[0]`."
                    )
