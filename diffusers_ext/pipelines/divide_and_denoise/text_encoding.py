"""The text condition of a [`DivideAndDenoisePipeline`] with text-conditioned denoisers: one prompt per agent.

SD 1.x / 2.x UNets read the token embeddings of one CLIP text encoder ([`encode_agent_prompts`]). SDXL, SD3 and
Flux encode prompts with their own pipeline's `encode_prompt` ([`family_text_pipeline`]: the family's diffusers
pipeline holding only its text encoders), so the embeddings, pooled embeddings and T5 sequences are the ones their
pipelines make.
"""

import torch
from diffusers import FluxPipeline, StableDiffusion3Pipeline, StableDiffusionXLPipeline

from ..pipeline_utils import encode_text


# The diffusers pipeline whose `encode_prompt` encodes each family's prompts, and the text components it takes.
FAMILY_PIPELINES = {"sdxl": StableDiffusionXLPipeline, "sd3": StableDiffusion3Pipeline, "flux": FluxPipeline}
FAMILY_TEXT_COMPONENTS = {
    "sd": ("text_encoder", "tokenizer"),
    "sdxl": ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"),
    "sd3": ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3", "tokenizer_3"),
    "flux": ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"),
}
# The T5 sequence length of each family's pipeline by default, and the most it accepts (`max_sequence_length`).
DEFAULT_MAX_SEQUENCE_LENGTH = {"sd3": 256, "flux": 512}
MAX_SEQUENCE_LENGTH_LIMIT = 512


def family_text_pipeline(family: str, components: dict, scheduler, force_zeros_for_empty_prompt: bool = True):
    """The family's diffusers pipeline (`StableDiffusionXLPipeline`, `StableDiffusion3Pipeline`, `FluxPipeline`)
    holding only the text `components` (no denoiser, no VAE), to call its own `encode_prompt`.

    Args:
        family (`str`): `"sdxl"`, `"sd3"` or `"flux"`.
        components (`dict`): at least the family's `FAMILY_TEXT_COMPONENTS`.
        scheduler: the sampler (the pipelines register one; `encode_prompt` does not read it).
        force_zeros_for_empty_prompt (`bool`): SDXL's config: an absent negative prompt is zero embeddings.
    """
    text = {name: components[name] for name in FAMILY_TEXT_COMPONENTS[family]}
    if family == "sdxl":
        return StableDiffusionXLPipeline(
            vae=None,
            unet=None,
            scheduler=scheduler,
            force_zeros_for_empty_prompt=force_zeros_for_empty_prompt,
            add_watermarker=False,
            **text,
        )
    return FAMILY_PIPELINES[family](vae=None, transformer=None, scheduler=scheduler, **text)


def family_prompt_token_positions(family: str, components: dict, prompts: list[str], max_sequence_length) -> list:
    """Per prompt, the positions of its word tokens in the embedding sequence the family's `encode_prompt` builds:
    after CLIP's start token for SDXL and SD3 (whose sequence starts with the CLIP tokens), from 0 in Flux's T5
    sequence (no start token; the end token is left out), truncated as the encoder truncates."""
    if family == "flux":
        ids = components["tokenizer_2"](prompts, max_length=max_sequence_length, truncation=True).input_ids
        return [list(range(len(row) - 1)) for row in ids]
    tokenizer = components["tokenizer"]
    ids = tokenizer(prompts, max_length=tokenizer.model_max_length, truncation=True).input_ids
    return [list(range(1, len(row) - 1)) for row in ids]


def family_num_tokens(family: str, components: dict, max_sequence_length) -> int:
    """The length of the embedding sequence the family's `encode_prompt` builds: CLIP's `model_max_length` (SD,
    SDXL), CLIP's followed by T5's `max_sequence_length` (SD3), or T5's alone (Flux)."""
    if family == "flux":
        return max_sequence_length
    clip = components["tokenizer"].model_max_length
    return clip + max_sequence_length if family == "sd3" else clip


def encode_family_prompts(
    text_pipeline, family: str, prompts: list[str], negative_prompt, guided: bool, max_sequence_length, device
) -> dict:
    """The `K` agents' prompts through the family's own `encode_prompt`: `prompt_embeds` `(K, L, D)`,
    `pooled_prompt_embeds` `(K, P)` and, with guidance (`guided`; never for Flux, whose guidance is distilled),
    `negative_prompt_embeds` `(1, L, D)` and `negative_pooled_prompt_embeds` `(1, P)` of the negative prompt (SD3:
    `""` when None; SDXL: zeros when None and its `force_zeros_for_empty_prompt`, as their pipelines do)."""
    if family == "flux":
        embeds, pooled, _ = text_pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, max_sequence_length=max_sequence_length
        )
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}
    # SD3's `encode_prompt` requires `prompt_2` / `prompt_3` (None: the prompt itself, as its pipeline)
    kwargs = (
        {"prompt_2": None, "prompt_3": None, "max_sequence_length": max_sequence_length} if family == "sd3" else {}
    )
    embeds, negative, pooled, negative_pooled = text_pipeline.encode_prompt(
        prompt=prompts, device=device, do_classifier_free_guidance=guided, negative_prompt=negative_prompt, **kwargs
    )
    encoded = {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}
    if guided:  # one negative row per prompt, all the same: keep one
        encoded |= {"negative_prompt_embeds": negative[:1], "negative_pooled_prompt_embeds": negative_pooled[:1]}
    return encoded


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


# The families' names in messages, and the pipeline whose `encode_prompt` makes their embeddings.
FAMILY_NAMES = {"sd": "SD 1.x / 2.x", "sdxl": "SDXL", "sd3": "SD3", "flux": "Flux"}


def check_pooled_embeds(
    family: str | None, prompt_embeds, pooled_prompt_embeds, negative_prompt_embeds, negative_pooled_prompt_embeds
) -> None:
    """Raise a `ValueError` naming the argument when the pooled embeddings do not fit the denoisers: SDXL, SD3 and
    Flux denoisers given `prompt_embeds` need `pooled_prompt_embeds` `(K, P)` with them (and the negative pair, `(1,
    L, D)` and `(1, P)`, which default to zeros); other denoisers take no pooled embeddings."""
    given = pooled_prompt_embeds is not None or negative_pooled_prompt_embeds is not None
    if family not in FAMILY_PIPELINES:
        if given:
            raise ValueError(
                "`pooled_prompt_embeds` only apply to SDXL, SD3 and Flux denoisers (which take pooled text "
                f"embeddings); these are {FAMILY_NAMES.get(family, 'not text-conditioned')} denoisers."
            )
        return
    name, source = FAMILY_NAMES[family], FAMILY_PIPELINES[family].__name__
    if prompt_embeds is None:
        if given:
            raise ValueError("`pooled_prompt_embeds` go with `prompt_embeds`, which were not given.")
        return
    if pooled_prompt_embeds is None:
        raise ValueError(
            f"{name} denoisers given `prompt_embeds` (K, L, D) need `pooled_prompt_embeds` (K, P) too, e.g. from "
            f"`{source}.encode_prompt`; got pooled_prompt_embeds=None."
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


def check_text_components(family: str, components: dict) -> None:
    """Raise a `ValueError` when the pipeline lacks the family's text encoders or tokenizers, which encoding a
    `prompt` needs (SDXL, SD3 and Flux compositions may be built without them, to take embeddings only)."""
    missing = [name for name in FAMILY_TEXT_COMPONENTS[family] if components.get(name) is None]
    if missing:
        raise ValueError(
            f"`prompt` needs the {FAMILY_NAMES[family]} text components {list(FAMILY_TEXT_COMPONENTS[family])}, but "
            f"{missing} are None; build the pipeline with them (`from_pipelines` takes them from the first pipeline) "
            "or pass `prompt_embeds` and `pooled_prompt_embeds`."
        )


def agent_text_condition(
    family: str,
    components: dict,
    text_pipeline,
    prompts,
    negative_prompt,
    embeddings: dict,
    token_indices,
    guided: bool,
    max_sequence_length,
    device,
    dtype,
) -> dict:
    """The text condition of every agent for [`agent_predictions.predict_agents`]: `prompt_embeds` `(K, L, D)`,
    `negative_embeds` `(1, L, D)`, `token_indices` and, for SDXL, SD3 and Flux, `pooled` `(K, P)` and
    `negative_pooled` `(1, P)`.

    Args:
        family (`str`): the denoisers' family ([`denoisers.denoiser_family`]).
        components (`dict`): the pipeline's text encoders and tokenizers, by component name.
        text_pipeline: the family's own pipeline holding them ([`family_text_pipeline`]; None for SD 1.x / 2.x).
        prompts (`list[str]`, *optional*): one per agent; None when `embeddings` holds `prompt_embeds`.
        negative_prompt (`str`, *optional*): the unconditional prompt.
        embeddings (`dict`): the call's `prompt_embeds`, `negative_prompt_embeds`, `pooled_prompt_embeds` and
            `negative_pooled_prompt_embeds` (each possibly None). Missing negatives default to zeros; SD3's own
            empty-prompt embeddings are not zeros, so pass `encode_prompt`'s negatives to guide exactly as
            `StableDiffusion3Pipeline` does.
        token_indices (`list[list[int]]`, *optional*): the concept tokens; every word token of each prompt by default.
        guided (`bool`): whether the unconditional branch runs (its negatives are encoded only then).
        max_sequence_length (`int`, *optional*): the T5 sequence length (SD3, Flux).
        device, dtype: where the embeddings go, in the denoisers' dtype.
    """
    cond, positions = {}, None
    prompt_embeds = embeddings.get("prompt_embeds")
    if family == "sd":
        embeds, negative, lengths = encode_agent_prompts(
            components["tokenizer"],
            components["text_encoder"],
            prompts if prompt_embeds is None else [],
            negative_prompt,
            device,
        )
        embeds = embeds if prompt_embeds is None else prompt_embeds.to(device)
        negative_embeds = embeddings.get("negative_prompt_embeds")
        negative = negative if negative_embeds is None else negative_embeds.to(device)
        if prompt_embeds is None:  # the tokens of precomputed embeddings are unknown
            if min(lengths) < 1:
                raise ValueError("every prompt needs at least one token for the cross-attention utility.")
            positions = [list(range(1, 1 + n)) for n in lengths]
    else:
        if prompt_embeds is None:
            embeddings = encode_family_prompts(
                text_pipeline, family, prompts, negative_prompt, guided, max_sequence_length, device
            )
            positions = family_prompt_token_positions(family, components, prompts, max_sequence_length)
            if min(len(p) for p in positions) < 1:
                raise ValueError("every prompt needs at least one token for the cross-attention utility.")
        embeds = embeddings["prompt_embeds"].to(device)
        negative = embeddings.get("negative_prompt_embeds")
        negative = torch.zeros_like(embeds[:1]) if negative is None else negative.to(device)
        pooled = embeddings["pooled_prompt_embeds"].to(device)
        negative_pooled = embeddings.get("negative_pooled_prompt_embeds")
        negative_pooled = torch.zeros_like(pooled[:1]) if negative_pooled is None else negative_pooled.to(device)
        cond["pooled"], cond["negative_pooled"] = pooled.to(dtype), negative_pooled.to(dtype)
    cond["prompt_embeds"], cond["negative_embeds"] = embeds.to(dtype), negative.to(dtype)
    # (given token indices are checked with the call's other arguments)
    cond["token_indices"] = positions if token_indices is None else token_indices
    return cond
