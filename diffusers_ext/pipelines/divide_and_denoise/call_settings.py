"""The arguments of a [`DivideAndDenoisePipeline`] call: their checks, and the typed settings they resolve to."""

from dataclasses import dataclass

import torch

from .baseline_allocators import FixedAllocator
from .fair_division import FairDivisionAllocator
from .utilities import UTILITIES


OUTPUT_TYPES = ("pil", "np", "pt", "latent")


@dataclass(frozen=True)
class DivideAndDenoiseCallSettings:
    """The arguments of one [`DivideAndDenoisePipeline`] call once checked and resolved: what the sampling loop reads.

    Args:
        num_agents (`int`): `K`, the number of agents (models, or prompts/classes of one shared model).
        prompts (`list[str]`, *optional*): text denoisers: one prompt per agent.
        class_labels (`torch.Tensor` of shape `(K,)`, *optional*): class-conditional denoisers: one class per agent.
        guidance_scales (`list[float]`): the classifier-free guidance scale of each agent.
        utility (`str`): the utility map, `"auto"` resolved (see `utilities.UTILITIES`).
        needs_unconditional (`bool`): whether the unconditional branch runs (guidance, or guidance-delta utilities).
        latent_shape (`tuple[int, int, int, int]`): `(num_images, channels, latent_height, latent_width)`.
        allocator ([`FairDivisionAllocator`] or [`FixedAllocator`]): who is responsible for which position.
    """

    num_agents: int
    prompts: list[str] | None
    class_labels: torch.Tensor | None
    guidance_scales: list[float]
    utility: str
    needs_unconditional: bool
    latent_shape: tuple[int, int, int, int]
    allocator: FairDivisionAllocator | FixedAllocator

    @property
    def fair(self) -> bool:
        """Whether the allocation is divided at every step from utilities (the method), not fixed (a baseline)."""
        return not isinstance(self.allocator, FixedAllocator)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _as_prompt_list(prompt):
    return [prompt] if isinstance(prompt, str) else prompt


def _as_label_list(class_labels):
    return [class_labels] if isinstance(class_labels, int) and not isinstance(class_labels, bool) else class_labels


def _guidance_scales(guidance_scale, num_agents: int) -> list[float] | None:
    """One float per agent from a number or a list of numbers; `None` for anything else."""
    if is_number(guidance_scale):
        return [float(guidance_scale)] * num_agents
    if isinstance(guidance_scale, (list, tuple)) and all(is_number(g) for g in guidance_scale):
        return [float(g) for g in guidance_scale]
    return None


def _resolve_utility(utility: str, conditioning: str) -> str:
    if utility == "auto":
        return "cross_attention" if conditioning == "text" else "x0_saliency"
    return utility


def _needs_unconditional(scales: list[float], utility: str, allocator) -> bool:
    """Guidance needs the unconditional branch; so does the guidance-delta utility, when utilities are computed."""
    return any(g > 1 for g in scales) or (utility == "guidance_delta" and not isinstance(allocator, FixedAllocator))


def check_conditioning(kind: str, prompt, class_labels, negative_prompt, num_agents: int, num_classes) -> None:
    """Check `prompt`/`negative_prompt` (text denoisers) or `class_labels` (class denoisers with `num_classes`
    classes, null class included) against the denoisers' conditioning `kind` and the `num_agents` agents."""
    if kind == "text":
        if class_labels is not None:
            raise ValueError("`class_labels` were given, but the denoisers are text-conditioned; pass `prompt`.")
        prompts = _as_prompt_list(prompt)
        if not isinstance(prompts, (list, tuple)) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"`prompt` must be a string or a list of strings (one per model), got {prompt!r}.")
        if len(prompts) != num_agents:
            raise ValueError(f"`prompt` has {len(prompts)} entries for {num_agents} models; pass one per model.")
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            raise ValueError(f"`negative_prompt` must be a string or None, got {negative_prompt!r}.")
    elif prompt is not None or negative_prompt is not None:
        raise ValueError(f"`prompt` was given, but the denoisers are not text-conditioned ({kind}).")
    elif kind == "class":
        if class_labels is None:
            raise ValueError("`class_labels` are required: the denoisers are class-conditional.")
        labels = torch.as_tensor(_as_label_list(class_labels))
        if labels.ndim != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
            raise ValueError(f"`class_labels` must be a list of ints (one per model), got {class_labels!r}.")
        if labels.numel() != num_agents:
            raise ValueError(
                f"`class_labels` has {labels.numel()} entries for {num_agents} models; pass one per model."
            )
        if ((labels < 0) | (labels >= num_classes)).any():
            raise ValueError(f"`class_labels` must lie in [0, {num_classes - 1}], got {labels.tolist()}.")
    elif class_labels is not None:
        raise ValueError("`class_labels` were given, but the denoisers are unconditional.")


def check_guidance(
    kind: str, guidance_scale, utility: str, allocator, token_indices, num_agents: int, null_class_label
) -> None:
    """Check `guidance_scale` (one number, or one per agent), `utility` and `token_indices`, and that what they ask
    of the denoisers (an unconditional branch, cross-attention) exists."""
    scales = _guidance_scales(guidance_scale, num_agents)
    if scales is None:
        raise TypeError(f"`guidance_scale` must be a number or a list of numbers, got {guidance_scale!r}.")
    if len(scales) != num_agents:
        raise ValueError(f"`guidance_scale` has {len(scales)} entries for {num_agents} models.")
    utility = _resolve_utility(utility, kind)
    if utility not in UTILITIES:
        raise ValueError(f"`utility` must be 'auto' or one of {UTILITIES}, got {utility!r}.")
    if utility == "cross_attention" and kind != "text":
        raise ValueError("`utility` 'cross_attention' needs text-conditioned denoisers with cross-attention.")
    if _needs_unconditional(scales, utility, allocator):
        if kind == "none":
            raise ValueError(
                f"`guidance_scale` {guidance_scale!r} > 1 or `utility` 'guidance_delta' need conditional models; "
                "these denoisers are unconditional."
            )
        if kind == "class" and null_class_label is None:
            raise ValueError(
                f"`guidance_scale` {guidance_scale!r} > 1 or `utility` 'guidance_delta' need a null class, but "
                "`null_class_label` is None."
            )
    if token_indices is not None:
        if utility != "cross_attention":
            raise ValueError("`token_indices` only apply to `utility='cross_attention'`.")
        if (
            not isinstance(token_indices, (list, tuple))
            or len(token_indices) != num_agents
            or not all(isinstance(t, (list, tuple)) and t and all(isinstance(i, int) for i in t)
                       for t in token_indices)
        ):  # fmt: skip
            raise ValueError(f"`token_indices` must be one non-empty list of ints per model, got {token_indices!r}.")


def resolve_call_settings(
    kind: str, num_agents: int, prompt, class_labels, guidance_scale, utility: str, allocator, latent_shape
) -> DivideAndDenoiseCallSettings:
    """The settings of a call whose arguments passed the checks (see `DivideAndDenoisePipeline.check_inputs`)."""
    scales = _guidance_scales(guidance_scale, num_agents)
    utility = _resolve_utility(utility, kind)
    return DivideAndDenoiseCallSettings(
        num_agents=num_agents,
        prompts=list(_as_prompt_list(prompt)) if kind == "text" else None,
        class_labels=torch.as_tensor(_as_label_list(class_labels)).long() if kind == "class" else None,
        guidance_scales=scales,
        utility=utility,
        needs_unconditional=_needs_unconditional(scales, utility, allocator),
        latent_shape=tuple(latent_shape),
        allocator=allocator,
    )


def check_call_scalars(
    num_inference_steps,
    output_type,
    num_images_per_prompt,
    allocator,
    utility_momentum,
    alignment_scale,
    max_iter_to_align,
) -> None:
    """Check the scalar arguments of a [`DivideAndDenoisePipeline`] call; raise naming the first bad one."""
    if not is_positive_int(num_inference_steps):
        raise ValueError(f"`num_inference_steps` must be a positive int, got {num_inference_steps!r}.")
    if output_type not in OUTPUT_TYPES:
        raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
    if not is_positive_int(num_images_per_prompt):
        raise ValueError(f"`num_images_per_prompt` must be a positive int, got {num_images_per_prompt!r}.")
    if allocator is not None and not isinstance(allocator, (FairDivisionAllocator, FixedAllocator)):
        raise TypeError(
            "`allocator` must be a FairDivisionAllocator or a baseline (AverageAllocator, RegionAllocator), got "
            f"{type(allocator).__name__}."
        )
    if not is_number(utility_momentum) or not 0 <= utility_momentum < 1:
        raise ValueError(f"`utility_momentum` must be a number in [0, 1), got {utility_momentum!r}.")
    if not is_number(alignment_scale) or alignment_scale < 0:
        raise ValueError(f"`alignment_scale` must be a number >= 0, got {alignment_scale!r}.")
    if not isinstance(max_iter_to_align, int) or isinstance(max_iter_to_align, bool) or max_iter_to_align < 0:
        raise ValueError(f"`max_iter_to_align` must be an int >= 0, got {max_iter_to_align!r}.")
