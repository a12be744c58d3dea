"""The text condition of a [`DivideAndDenoisePipeline`] with text-conditioned denoisers: one prompt per agent."""

import torch

from ..pipeline_utils import encode_text


def encode_agent_prompts(tokenizer, text_encoder, prompts: list[str], negative_prompt: str | None, device) -> tuple:
    """Embeddings `(K, L, D)` of the `K` agents' prompts and `(1, L, D)` of the negative prompt (`""` if None), plus
    each prompt's token count (without start and end tokens), for the cross-attention utility's token positions."""
    embeds, attention_mask = encode_text(tokenizer, text_encoder, prompts + [negative_prompt or ""], device)
    lengths = attention_mask.sum(dim=1)[:-1] - 2
    return embeds[:-1], embeds[-1:], lengths.tolist()


def encode_prompt(
    tokenizer,
    text_encoder,
    prompt,
    device,
    num_images_per_prompt: int = 1,
    do_classifier_free_guidance: bool = True,
    negative_prompt: str | None = None,
    prompt_embeds: torch.Tensor | None = None,
    negative_prompt_embeds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """diffusers' `encode_prompt`: `prompt_embeds` `(K * num_images_per_prompt, L, D)` of the `K` prompts and, with
    guidance, `negative_prompt_embeds` `(num_images_per_prompt, L, D)` of the negative prompt (`""` if None).
    Precomputed embeddings are passed through (repeated `num_images_per_prompt` times)."""
    prompts = [] if prompt_embeds is not None else ([prompt] if isinstance(prompt, str) else list(prompt))
    embeds, negative, _ = encode_agent_prompts(tokenizer, text_encoder, prompts, negative_prompt, device)
    embeds = embeds if prompt_embeds is None else prompt_embeds.to(device)
    negative = negative if negative_prompt_embeds is None else negative_prompt_embeds.to(device)
    negative = negative.repeat_interleave(num_images_per_prompt, 0) if do_classifier_free_guidance else None
    return embeds.repeat_interleave(num_images_per_prompt, 0), negative


def check_prompt_embeds(kind: str, prompt, prompt_embeds, negative_prompt_embeds) -> None:
    """Raise a `ValueError` naming the argument when precomputed embeddings cannot condition the denoisers: not
    text-conditioned, given with `prompt`, or not `(K, L, D)` / `(1, L, D)`. (The `token_indices` the cross-attention
    utility then needs are checked with the call's other arguments, `DivideAndDenoisePipeline.check_inputs`.)"""
    if kind != "text":
        raise ValueError(f"`prompt_embeds` was given, but the denoisers are not text-conditioned ({kind}).")
    if prompt is not None:
        raise ValueError("Pass either `prompt` or `prompt_embeds`, not both.")
    if not isinstance(prompt_embeds, torch.Tensor) or prompt_embeds.ndim != 3:
        raise ValueError(f"`prompt_embeds` must be a (models, L, D) tensor, got {type(prompt_embeds).__name__}.")
    if negative_prompt_embeds is not None and (
        not isinstance(negative_prompt_embeds, torch.Tensor)
        or negative_prompt_embeds.ndim != 3
        or negative_prompt_embeds.shape[0] != 1
        or negative_prompt_embeds.shape[1:] != prompt_embeds.shape[1:]
    ):
        raise ValueError(
            f"`negative_prompt_embeds` must be a (1, L, D) tensor matching `prompt_embeds` {tuple(prompt_embeds.shape)}."
        )


def check_pooled_embeds(
    joint: bool, prompt_embeds, pooled_prompt_embeds, negative_prompt_embeds, negative_pooled_prompt_embeds
) -> None:
    """Raise a `ValueError` naming the argument when the pooled embeddings do not fit the denoisers: joint
    transformers (SD3) need `prompt_embeds` with `pooled_prompt_embeds` `(K, P)` (and the negative pair, `(1, L, D)`
    and `(1, P)`, which default to zeros); other denoisers take no pooled embeddings."""
    if not joint:
        if pooled_prompt_embeds is not None or negative_pooled_prompt_embeds is not None:
            raise ValueError("`pooled_prompt_embeds` only apply to joint-attention transformers (SD3).")
        return
    if prompt_embeds is None or pooled_prompt_embeds is None:
        raise ValueError(
            "SD3 transformer denoisers need `prompt_embeds` (K, L, D) and `pooled_prompt_embeds` (K, P), e.g. from "
            "`StableDiffusion3Pipeline.encode_prompt`; got "
            f"prompt_embeds={type(prompt_embeds).__name__}, pooled_prompt_embeds={type(pooled_prompt_embeds).__name__}."
        )
    if (
        not isinstance(pooled_prompt_embeds, torch.Tensor)
        or pooled_prompt_embeds.ndim != 2
        or (pooled_prompt_embeds.shape[0] != prompt_embeds.shape[0])
    ):
        raise ValueError(
            f"`pooled_prompt_embeds` must be a ({prompt_embeds.shape[0]}, P) tensor, one row per model, got "
            f"{getattr(pooled_prompt_embeds, 'shape', pooled_prompt_embeds)}."
        )
    if negative_pooled_prompt_embeds is not None and (
        not isinstance(negative_pooled_prompt_embeds, torch.Tensor)
        or tuple(negative_pooled_prompt_embeds.shape) != (1, pooled_prompt_embeds.shape[1])
    ):
        raise ValueError(
            f"`negative_pooled_prompt_embeds` must be a (1, {pooled_prompt_embeds.shape[1]}) tensor, got "
            f"{getattr(negative_pooled_prompt_embeds, 'shape', negative_pooled_prompt_embeds)}."
        )


def agent_text_condition(
    tokenizer,
    text_encoder,
    prompts,
    negative_prompt,
    prompt_embeds,
    negative_prompt_embeds,
    pooled_prompt_embeds,
    negative_pooled_prompt_embeds,
    token_indices,
    device,
    dtype,
) -> dict:
    """The text condition of every agent for [`agent_predictions.predict_agents`]: `prompt_embeds` `(K, L, D)`,
    `negative_embeds` `(1, L, D)`, `token_indices` and, for joint transformers, `pooled` `(K, P)` and
    `negative_pooled` `(1, P)`. Missing SD3 negatives default to zeros; SD3's own empty-prompt embeddings are not
    zeros, so pass `encode_prompt`'s negatives to guide exactly as `StableDiffusion3Pipeline` does."""
    cond = {}
    if pooled_prompt_embeds is not None:
        embeds = prompt_embeds.to(device)
        negative = (
            torch.zeros_like(embeds[:1]) if negative_prompt_embeds is None else negative_prompt_embeds.to(device)
        )
        pooled = pooled_prompt_embeds.to(device)
        negative_pooled = (
            torch.zeros_like(pooled[:1]) if negative_pooled_prompt_embeds is None else negative_pooled_prompt_embeds
        )
        cond["pooled"], cond["negative_pooled"] = pooled.to(dtype), negative_pooled.to(device=device, dtype=dtype)
        lengths = None
    else:
        embeds, negative, lengths = encode_agent_prompts(
            tokenizer, text_encoder, prompts if prompt_embeds is None else [], negative_prompt, device
        )
        embeds = embeds if prompt_embeds is None else prompt_embeds.to(device)
        negative = negative if negative_prompt_embeds is None else negative_prompt_embeds.to(device)
        lengths = lengths if prompt_embeds is None else None  # the tokens of precomputed embeddings are unknown
    cond["prompt_embeds"], cond["negative_embeds"] = embeds.to(dtype), negative.to(dtype)
    if token_indices is None and lengths is not None:  # (given ones are checked with the call's other arguments)
        if min(lengths) < 1:
            raise ValueError("every prompt needs at least one token for the cross-attention utility.")
        token_indices = [list(range(1, 1 + n)) for n in lengths]
    cond["token_indices"] = token_indices
    return cond
