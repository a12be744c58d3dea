"""The arguments of a [`DivideAndDenoisePipeline`] call, checked and resolved once into the settings the loop reads.

`DivideAndDenoisePipeline.check_inputs` builds a call's [`DivideAndDenoiseCallSettings`] from its arguments with the
checks below; each raises a `ValueError`/`TypeError` naming the argument, what was given and what was expected,
before any model work.
"""

from dataclasses import dataclass

import torch

from ...utils import check_positive_int, is_int, is_number
from .baseline_allocators import FixedAllocator
from .fair_division import FairDivisionAllocator
from .text_encoding import DEFAULT_MAX_SEQUENCE_LENGTH, MAX_SEQUENCE_LENGTH_LIMIT
from .utilities import UTILITIES


OUTPUT_TYPES = ("pil", "np", "pt", "latent")


def agent_guidance_scales(guidance_scale, num_agents: int) -> list[float]:
    """One classifier-free guidance scale per agent from `guidance_scale` (one number for all, or one per agent).

    Raises a `TypeError` for anything but a number or a list of numbers, a `ValueError` for a list of the wrong length.
    The pipeline resolves it once per call, and again after a `callback_on_step_end` that changed
    `pipe._guidance_scale` (diffusers' convention).
    """
    if is_number(guidance_scale):
        return [float(guidance_scale)] * num_agents
    if not isinstance(guidance_scale, (list, tuple)) or not all(is_number(g) for g in guidance_scale):
        raise TypeError(f"`guidance_scale` must be a number or a list of numbers, got {guidance_scale!r}.")
    if len(guidance_scale) != num_agents:
        raise ValueError(f"`guidance_scale` has {len(guidance_scale)} entries for {num_agents} models.")
    return [float(g) for g in guidance_scale]


def resolve_utility(utility: str, conditioning: str) -> str:
    """`utility` with `"auto"` resolved: cross-attention for text models, x0 saliency otherwise. Raises a
    `ValueError` for an unknown utility or one the denoisers cannot give (cross-attention without text)."""
    if utility == "auto":
        utility = "cross_attention" if conditioning == "text" else "x0_saliency"
    if utility not in UTILITIES:
        raise ValueError(f"`utility` must be 'auto' or one of {UTILITIES}, got {utility!r}.")
    if utility == "cross_attention" and conditioning != "text":
        raise ValueError("`utility` 'cross_attention' needs text-conditioned denoisers with cross-attention.")
    return utility


def check_scalars(
    num_inference_steps,
    output_type,
    num_images_per_prompt,
    allocator,
    utility_momentum,
    alignment_scale,
    max_iter_to_align,
) -> None:
    """Raise unless the call's numbers, output type and allocator are of the kinds and ranges the loop takes."""
    check_positive_int("num_inference_steps", num_inference_steps)
    if output_type not in OUTPUT_TYPES:
        raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
    check_positive_int("num_images_per_prompt", num_images_per_prompt)
    if allocator is not None and not isinstance(allocator, (FairDivisionAllocator, FixedAllocator)):
        raise TypeError(
            "`allocator` must be a FairDivisionAllocator or a baseline (AverageAllocator, RegionAllocator), got "
            f"{type(allocator).__name__}."
        )
    if not is_number(utility_momentum) or not 0 <= utility_momentum < 1:
        raise ValueError(f"`utility_momentum` must be a number in [0, 1), got {utility_momentum!r}.")
    if not is_number(alignment_scale) or alignment_scale < 0:
        raise ValueError(f"`alignment_scale` must be a number >= 0, got {alignment_scale!r}.")
    check_positive_int("max_iter_to_align", max_iter_to_align, minimum=0)


def _class_labels(class_labels, num_agents: int, num_classes: int) -> torch.Tensor:
    if class_labels is None:
        raise ValueError("`class_labels` are required: the denoisers are class-conditional.")
    labels = torch.as_tensor([class_labels] if is_int(class_labels) else class_labels)
    if labels.ndim != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"`class_labels` must be a list of ints (one per model), got {class_labels!r}.")
    if labels.numel() != num_agents:
        raise ValueError(f"`class_labels` has {labels.numel()} entries for {num_agents} models; pass one per model.")
    if ((labels < 0) | (labels >= num_classes)).any():
        raise ValueError(f"`class_labels` must lie in [0, {num_classes - 1}], got {labels.tolist()}.")
    return labels.long()


def agent_conditions(
    conditioning: str,
    num_denoisers: int,
    num_classes: int | None,
    prompt,
    class_labels,
    negative_prompt,
    prompt_embeds,
) -> tuple[int, list[str] | None, torch.Tensor | None]:
    """`(K, prompts, class_labels)` of a call: `K` agents, one per denoiser or, with one shared denoiser, one per
    prompt (or row of `prompt_embeds`, whose prompts are then None) or class; checked against the denoisers'
    conditioning `"text"`, `"class"` or `"none"`."""
    if conditioning == "text":
        if class_labels is not None:
            raise ValueError("`class_labels` were given, but the denoisers are text-conditioned; pass `prompt`.")
        if prompt_embeds is not None:
            num_agents = num_denoisers if num_denoisers > 1 else len(prompt_embeds)
            if len(prompt_embeds) != num_agents:
                raise ValueError(
                    f"`prompt_embeds` has {len(prompt_embeds)} rows for {num_agents} models; pass one per model."
                )
            prompts = None
        else:
            prompts = [prompt] if isinstance(prompt, str) else prompt
            if not isinstance(prompts, (list, tuple)) or not prompts or not all(isinstance(p, str) for p in prompts):
                raise ValueError(f"`prompt` must be a string or a list of strings (one per model), got {prompt!r}.")
            num_agents = num_denoisers if num_denoisers > 1 else len(prompts)
            if len(prompts) != num_agents:
                raise ValueError(f"`prompt` has {len(prompts)} entries for {num_agents} models; pass one per model.")
            prompts = list(prompts)
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            raise ValueError(f"`negative_prompt` must be a string or None, got {negative_prompt!r}.")
        return num_agents, prompts, None
    if prompt is not None or negative_prompt is not None:
        raise ValueError(f"`prompt` was given, but the denoisers are not text-conditioned ({conditioning}).")
    num_agents = num_denoisers
    if num_denoisers == 1 and conditioning == "class" and isinstance(class_labels, (list, tuple, torch.Tensor)):
        num_agents = len(class_labels)
    if conditioning == "class":
        return num_agents, None, _class_labels(class_labels, num_agents, num_classes)
    if class_labels is not None:
        raise ValueError("`class_labels` were given, but the denoisers are unconditional.")
    return num_agents, None, None


def needs_unconditional_branch(
    conditioning: str,
    null_class_label: int | None,
    guidance_scale,
    guidance_scales: list[float],
    utility,
    fair,
    family: str | None = None,
) -> bool:
    """Whether the unconditional branch runs: classifier-free guidance (a scale > 1) or the fair division's
    guidance-delta utility; raises when the denoisers have no unconditional prediction to give. Flux's guidance is
    distilled into the model (its scale is an input), so a Flux composition never runs one and refuses the
    guidance-delta utility."""
    if family == "flux":
        if utility == "guidance_delta" and fair:
            raise ValueError(
                "`utility` 'guidance_delta' needs an unconditional branch, which Flux denoisers do not run (their "
                "guidance is distilled: `guidance_scale` is a model input); use 'cross_attention' or 'x0_saliency'."
            )
        return False
    needed = any(g > 1 for g in guidance_scales) or (utility == "guidance_delta" and fair)
    if needed and conditioning == "none":
        raise ValueError(
            f"`guidance_scale` {guidance_scale!r} > 1 or `utility` 'guidance_delta' need conditional models; "
            "these denoisers are unconditional."
        )
    if needed and conditioning == "class" and null_class_label is None:
        raise ValueError(
            f"`guidance_scale` {guidance_scale!r} > 1 or `utility` 'guidance_delta' need a null class, but "
            "`null_class_label` is None."
        )
    return needed


def resolve_max_sequence_length(max_sequence_length, family: str | None) -> int | None:
    """The T5 sequence length of SD3 and Flux prompts: `max_sequence_length`, or the family pipeline's default (256
    for SD3, 512 for Flux); a positive int up to 512. Other families have no T5 encoder: it must be None."""
    if family not in DEFAULT_MAX_SEQUENCE_LENGTH:
        if max_sequence_length is not None:
            raise ValueError(
                f"`max_sequence_length` {max_sequence_length!r} applies only to SD3 and Flux denoisers (T5 prompts)."
            )
        return None
    if max_sequence_length is None:
        return DEFAULT_MAX_SEQUENCE_LENGTH[family]
    check_positive_int("max_sequence_length", max_sequence_length)
    if max_sequence_length > MAX_SEQUENCE_LENGTH_LIMIT:
        raise ValueError(
            f"`max_sequence_length` must be at most {MAX_SEQUENCE_LENGTH_LIMIT}, got {max_sequence_length!r}."
        )
    return max_sequence_length


def check_token_indices(
    token_indices, utility: str, num_agents: int, prompt_from_embeds: bool, num_tokens: int | None = None
) -> None:
    """Raise unless `token_indices` fit the call: only with the cross-attention utility (which needs them with
    `prompt_embeds`), one non-empty list of ints per agent, each a position among the `num_tokens` prompt tokens."""
    if token_indices is None:
        if prompt_from_embeds and utility == "cross_attention":
            raise ValueError(
                "`prompt_embeds` with the cross-attention utility needs `token_indices` (the concept token positions "
                "of each model's prompt), or another `utility`."
            )
        return
    if utility != "cross_attention":
        raise ValueError("`token_indices` only apply to `utility='cross_attention'`.")
    if (
        not isinstance(token_indices, (list, tuple))
        or len(token_indices) != num_agents
        or not all(isinstance(t, (list, tuple)) and t and all(isinstance(i, int) for i in t) for t in token_indices)
    ):
        raise ValueError(f"`token_indices` must be one non-empty list of ints per model, got {token_indices!r}.")
    outside = [i for indices in token_indices for i in indices if num_tokens is not None and not 0 <= i < num_tokens]
    if outside:
        raise ValueError(
            f"`token_indices` {token_indices!r} name positions {outside} outside the {num_tokens} prompt tokens."
        )


def check_attn_res(attn_res, utility: str, fair: bool, latent_shape) -> tuple[int, int] | None:
    """`attn_res` as a tuple, checked: two positive ints, a grid that tiles the latent (the same downsampling factor
    on both sides), and only with the fair division's cross-attention utility, the one that reads attention."""
    if attn_res is None:
        return None
    if (
        not isinstance(attn_res, (list, tuple))
        or len(attn_res) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in attn_res)
    ):
        raise ValueError(f"`attn_res` must be two positive ints `(height, width)`, got {attn_res!r}.")
    if utility != "cross_attention" or not fair:
        raise ValueError(
            f"`attn_res` {tuple(attn_res)} only applies to the fair division's `utility='cross_attention'` (got "
            f"utility {utility!r}{'' if fair else ' with a fixed allocator'})."
        )
    height, width = latent_shape[2:]
    h, w = attn_res
    if height % h or width % w or height // h != width // w:
        raise ValueError(
            f"`attn_res` {tuple(attn_res)} is not an attention grid of the {height}x{width} latents: expected the "
            "latent size divided by one downsampling factor, e.g. (16, 16) for 64x64 latents."
        )
    return (h, w)


@dataclass(frozen=True)
class DivideAndDenoiseCallSettings:
    """The arguments of one [`DivideAndDenoisePipeline`] call once checked and resolved: what the sampling loop reads.

    `DivideAndDenoisePipeline.check_inputs` builds it from the call's arguments, once, and raises on the first bad
    one.

    Args:
        num_agents (`int`): `K`, the number of agents (models, or prompts/classes of one shared model).
        prompts (`list[str]`, *optional*): text denoisers: one prompt per agent (None with `prompt_embeds`).
        class_labels (`torch.Tensor` of shape `(K,)`, *optional*): class-conditional denoisers: one class per agent.
        guidance_scales (`list[float]`): one classifier-free guidance scale per agent; the loop resolves
            `pipe._guidance_scale` again only after a callback changed it.
        utility (`str`): the utility map, `"auto"` resolved (see `utilities.UTILITIES`).
        needs_unconditional (`bool`): whether the unconditional branch runs (guidance, or guidance-delta utilities).
        latent_shape (`tuple[int, int, int, int]`): `(num_images, channels, latent_height, latent_width)`.
        allocator ([`FairDivisionAllocator`] or [`FixedAllocator`]): who is responsible for which position.
        utility_momentum (`float`): temporal smoothing of the utility maps.
        alignment_scale (`float`): strength of the alignment step (`0` disables it).
        max_iter_to_align (`int`): the alignment step runs on the first `max_iter_to_align` steps.
        attn_res (`tuple[int, int]`, *optional*): the attention grid the cross-attention utility reads; None reads
            every text-attention layer.
        max_sequence_length (`int`, *optional*): the T5 sequence length of SD3 and Flux prompts (their pipelines'
            default when not given); None for the other families.
    """

    num_agents: int
    prompts: list[str] | None
    class_labels: torch.Tensor | None
    guidance_scales: list[float]
    utility: str
    needs_unconditional: bool
    latent_shape: tuple[int, int, int, int]
    allocator: FairDivisionAllocator | FixedAllocator
    utility_momentum: float
    alignment_scale: float
    max_iter_to_align: int
    attn_res: tuple[int, int] | None = None
    max_sequence_length: int | None = None

    @property
    def fair(self) -> bool:
        """Whether the allocation is divided at every step from utilities (the method), not fixed (a baseline)."""
        return not isinstance(self.allocator, FixedAllocator)

    @property
    def aligns(self) -> bool:
        """Whether the alignment step runs at all (the fair division with `alignment_scale > 0`)."""
        return self.fair and self.alignment_scale > 0
