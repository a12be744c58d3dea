"""The arguments of a [`DivideAndDenoisePipeline`] call, checked and resolved once into the settings the loop reads."""

from dataclasses import dataclass

import torch

from ...utils import check_positive_int, is_int, is_number
from .baseline_allocators import FixedAllocator
from .fair_division import FairDivisionAllocator
from .utilities import UTILITIES


OUTPUT_TYPES = ("pil", "np", "pt", "latent")


def agent_guidance_scales(guidance_scale, num_agents: int) -> list[float]:
    """One classifier-free guidance scale per agent from `guidance_scale` (one number for all, or one per agent).

    Raises a `TypeError` for anything but a number or a list of numbers, a `ValueError` for a list of the wrong length.
    The pipeline reads it at every step, so a callback may change `pipe._guidance_scale` mid-call.
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


def num_agents_of_call(conditioning: str, num_denoisers: int, prompt, class_labels) -> int:
    """`K`: one agent per denoiser, or, with one shared denoiser, one per prompt (text) or class (class-conditional)."""
    if num_denoisers > 1:
        return num_denoisers
    if conditioning == "text" and isinstance(prompt, (list, tuple)):
        return len(prompt)
    if conditioning == "class" and isinstance(class_labels, (list, tuple, torch.Tensor)):
        return len(class_labels)
    return 1


def _check_scalars(
    num_inference_steps,
    output_type,
    num_images_per_prompt,
    allocator,
    utility_momentum,
    alignment_scale,
    max_iter_to_align,
) -> None:
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


def _text_prompts(prompt, class_labels, negative_prompt, num_agents: int) -> list[str]:
    if class_labels is not None:
        raise ValueError("`class_labels` were given, but the denoisers are text-conditioned; pass `prompt`.")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"`prompt` must be a string or a list of strings (one per model), got {prompt!r}.")
    if len(prompts) != num_agents:
        raise ValueError(f"`prompt` has {len(prompts)} entries for {num_agents} models; pass one per model.")
    if negative_prompt is not None and not isinstance(negative_prompt, str):
        raise ValueError(f"`negative_prompt` must be a string or None, got {negative_prompt!r}.")
    return list(prompts)


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


def _check_token_indices(token_indices, utility: str, num_agents: int, prompt_from_embeds: bool) -> None:
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


def _check_attn_res(attn_res, utility: str, fair: bool, latent_shape) -> tuple[int, int] | None:
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

    Build it with [`~DivideAndDenoiseCallSettings.from_call`], which raises on the first bad argument. The guidance
    scale is not among them: the loop reads it from the pipeline at every step (a callback may change it).

    Args:
        num_agents (`int`): `K`, the number of agents (models, or prompts/classes of one shared model).
        prompts (`list[str]`, *optional*): text denoisers: one prompt per agent.
        class_labels (`torch.Tensor` of shape `(K,)`, *optional*): class-conditional denoisers: one class per agent.
        utility (`str`): the utility map, `"auto"` resolved (see `utilities.UTILITIES`).
        needs_unconditional (`bool`): whether the unconditional branch runs (guidance, or guidance-delta utilities).
        latent_shape (`tuple[int, int, int, int]`): `(num_images, channels, latent_height, latent_width)`.
        allocator ([`FairDivisionAllocator`] or [`FixedAllocator`]): who is responsible for which position.
        utility_momentum (`float`): temporal smoothing of the utility maps.
        alignment_scale (`float`): strength of the alignment step (`0` disables it).
        max_iter_to_align (`int`): the alignment step runs on the first `max_iter_to_align` steps.
        attn_res (`tuple[int, int]`, *optional*): the attention grid the cross-attention utility reads; None reads
            every text-attention layer.
    """

    num_agents: int
    prompts: list[str] | None
    class_labels: torch.Tensor | None
    utility: str
    needs_unconditional: bool
    latent_shape: tuple[int, int, int, int]
    allocator: FairDivisionAllocator | FixedAllocator
    utility_momentum: float
    alignment_scale: float
    max_iter_to_align: int
    attn_res: tuple[int, int] | None = None

    @property
    def fair(self) -> bool:
        """Whether the allocation is divided at every step from utilities (the method), not fixed (a baseline)."""
        return not isinstance(self.allocator, FixedAllocator)

    @property
    def aligns(self) -> bool:
        """Whether the alignment step runs at all (the fair division with `alignment_scale > 0`)."""
        return self.fair and self.alignment_scale > 0

    @classmethod
    def from_call(
        cls,
        *,
        conditioning: str,
        num_denoisers: int,
        num_classes: int | None,
        null_class_label: int | None,
        latent_shape: tuple[int, int, int, int],
        default_allocator: FairDivisionAllocator,
        prompt,
        class_labels,
        negative_prompt,
        num_inference_steps,
        guidance_scale,
        num_images_per_prompt,
        output_type,
        allocator,
        utility,
        utility_momentum,
        token_indices,
        alignment_scale,
        max_iter_to_align,
        prompt_from_embeds: bool = False,
        attn_res=None,
    ) -> "DivideAndDenoiseCallSettings":
        """Check the arguments of a call and resolve them; raise a `ValueError`/`TypeError` naming the first bad one.

        Args:
            conditioning (`str`): how the denoisers are conditioned, `"text"`, `"class"` or `"none"`.
            num_denoisers (`int`): how many denoisers the pipeline holds (one is shared by every agent).
            num_classes (`int`, *optional*): class-conditional denoisers: their classes, the null class included.
            null_class_label (`int`, *optional*): the null class of class-conditional guidance.
            latent_shape (`tuple[int, int, int, int]`): `(num_images, channels, latent_height, latent_width)`.
            default_allocator ([`FairDivisionAllocator`]): the allocator when `allocator` is None.
            prompt_from_embeds (`bool`): the prompts are placeholders for `prompt_embeds` (their tokens are unknown).
            The other arguments are those of [`DivideAndDenoisePipeline.__call__`].
        """
        _check_scalars(
            num_inference_steps,
            output_type,
            num_images_per_prompt,
            allocator,
            utility_momentum,
            alignment_scale,
            max_iter_to_align,
        )
        num_agents = num_agents_of_call(conditioning, num_denoisers, prompt, class_labels)
        prompts = labels = None
        if conditioning == "text":
            prompts = _text_prompts(prompt, class_labels, negative_prompt, num_agents)
        elif prompt is not None or negative_prompt is not None:
            raise ValueError(f"`prompt` was given, but the denoisers are not text-conditioned ({conditioning}).")
        elif conditioning == "class":
            labels = _class_labels(class_labels, num_agents, num_classes)
        elif class_labels is not None:
            raise ValueError("`class_labels` were given, but the denoisers are unconditional.")

        scales = agent_guidance_scales(guidance_scale, num_agents)
        utility = resolve_utility(utility, conditioning)
        allocator = default_allocator if allocator is None else allocator
        fair = not isinstance(allocator, FixedAllocator)
        needs_unconditional = any(g > 1 for g in scales) or (utility == "guidance_delta" and fair)
        if needs_unconditional and conditioning == "none":
            raise ValueError(
                f"`guidance_scale` {guidance_scale!r} > 1 or `utility` 'guidance_delta' need conditional models; "
                "these denoisers are unconditional."
            )
        if needs_unconditional and conditioning == "class" and null_class_label is None:
            raise ValueError(
                f"`guidance_scale` {guidance_scale!r} > 1 or `utility` 'guidance_delta' need a null class, but "
                "`null_class_label` is None."
            )
        _check_token_indices(token_indices, utility, num_agents, prompt_from_embeds)
        attn_res = _check_attn_res(attn_res, utility, fair, latent_shape)
        return cls(
            num_agents=num_agents,
            prompts=prompts,
            class_labels=labels,
            utility=utility,
            needs_unconditional=needs_unconditional,
            latent_shape=tuple(latent_shape),
            allocator=allocator,
            utility_momentum=utility_momentum,
            alignment_scale=alignment_scale,
            max_iter_to_align=max_iter_to_align,
            attn_res=attn_res,
        )
