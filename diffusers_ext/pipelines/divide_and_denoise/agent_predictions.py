"""The per-step model work of a [`DivideAndDenoisePipeline`]: every agent's guided prediction, its clean-sample
estimate's noise level under the scheduler.

Denoisers are called the way their family expects ([`denoisers.denoiser_family`]): a `UNet2DModel` /
`UNet2DConditionModel` as `model(sample, timestep, class_labels=..., encoder_hidden_states=...)` (SDXL-style UNets
also with `added_cond_kwargs`: the pooled embeddings and the size/crop time ids), an `SD3Transformer2DModel` as
`model(hidden_states=..., timestep=..., encoder_hidden_states=..., pooled_projections=...)`, a
`FluxTransformer2DModel` with its latents packed into 2x2 patches, their position ids, the timestep divided by 1000
and its distilled guidance input (as `FluxPipeline` calls it).
"""

import inspect

import numpy as np
import torch
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

from ..pipeline_utils import NoiseLevels, scheduler_prediction_type
from ..pipeline_utils import is_flow_matching as is_flow_matching  # the pipeline's scheduler check reads it here
from .denoisers import denoiser_family, uncompiled
from .flux_latents import latent_image_ids, pack_latents, unpack_latents
from .utilities import ConceptAttentionRecording, ConceptAttentionStore


def noise_levels(scheduler, t, step_index: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(signal, noise)` scales (0-d, in the device and dtype of `like`) of the model input at step `step_index`
    (timestep `t`): `x_t = signal x_0 + noise e` ([`pipeline_utils.NoiseLevels.coefficients`]).

    DDPM-family schedulers: `(sqrt(alpha_bar_t), sqrt(1 - alpha_bar_t))`; flow matching: `(1 - sigma, sigma)` with
    `sigma = scheduler.sigmas[step_index]`.
    """
    levels = NoiseLevels(scheduler)
    return levels.coefficients(t, device=like.device, dtype=like.dtype, step_index=step_index)


def family_timestep_options(family: str | None, scheduler, num_inference_steps: int, latent_size, patch_size) -> dict:
    """The keyword arguments of `scheduler.set_timesteps` that the family's own pipeline passes, so that one agent
    samples exactly as that pipeline does: Flux's `sigmas` `linspace(1, 1 / steps, steps)` (unless the scheduler
    uses flow sigmas) and its shift `mu` of the image's token count; SD3's `mu` under a dynamically shifted schedule
    (`use_dynamic_shifting`). `mu` is `calculate_shift` of `(latent_height / patch) * (latent_width / patch)` tokens
    with the scheduler's `base_shift` / `max_shift` (defaults 0.5 / 1.15 as `FluxPipeline`, 0.5 / 1.16 as
    `StableDiffusion3Pipeline`). Other families: none."""
    config = scheduler.config
    options = {}
    if family == "flux" and not config.get("use_flow_sigmas", False):
        options["sigmas"] = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
    if family == "flux" or (family == "sd3" and config.get("use_dynamic_shifting", False)):
        height, width = latent_size
        options["mu"] = calculate_shift(
            (height // patch_size) * (width // patch_size),
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15 if family == "flux" else 1.16),
        )
    # a swapped-in sampler whose `set_timesteps` takes no such option samples its own way
    accepted = inspect.signature(scheduler.set_timesteps).parameters
    return {key: value for key, value in options.items() if key in accepted}


def prediction_type(scheduler) -> str:
    """`"flow"` (velocity `noise - x_0`) for flow-matching schedulers, else the scheduler's `prediction_type`."""
    return scheduler_prediction_type(scheduler)


def call_denoiser(denoisers, index: int, model_input: torch.Tensor, timestep, kwargs: dict) -> torch.Tensor:
    """Denoiser `index`'s output `(rows, C, H, W)` for the unpacked `model_input` `(rows, C, H, W)`.

    `kwargs` holds the rows' conditions: `encoder_hidden_states` `(rows, L, D)`, `pooled` `(rows, P)` (SDXL, SD3,
    Flux), `time_ids` `(rows, 6)` (SDXL), `guidance` `(rows,)` (Flux with a guidance embedding) or `class_labels`
    `(rows,)`.
    """
    family = denoiser_family(denoisers[index])
    if family == "flux":
        height, width = model_input.shape[-2:]
        embeds = kwargs["encoder_hidden_states"]
        packed = denoisers(
            index,
            hidden_states=pack_latents(model_input),
            timestep=timestep.to(model_input.dtype) / 1000,  # FluxPipeline's timestep: in the latents' dtype, / 1000
            guidance=kwargs.get("guidance"),
            pooled_projections=kwargs["pooled"],
            encoder_hidden_states=embeds,
            txt_ids=torch.zeros(embeds.shape[1], 3, device=embeds.device, dtype=embeds.dtype),
            img_ids=latent_image_ids(height, width, model_input.device, model_input.dtype),
        ).sample
        return unpack_latents(packed, height, width)
    if family == "sd3":
        return denoisers(
            index,
            hidden_states=model_input,
            timestep=timestep,
            encoder_hidden_states=kwargs["encoder_hidden_states"],
            pooled_projections=kwargs["pooled"],
        ).sample
    if family == "sdxl":
        added = {"text_embeds": kwargs["pooled"], "time_ids": kwargs["time_ids"]}
        return denoisers(
            index,
            model_input,
            timestep,
            encoder_hidden_states=kwargs["encoder_hidden_states"],
            added_cond_kwargs=added,
        ).sample
    return denoisers(index, model_input, timestep, **kwargs).sample


def _text_kwargs(cond: dict, agents: list[int], batch: int, branches: int, guidance_scales: list[float]) -> dict:
    """The text conditions of one model call's rows: the unconditional branch's rows first (with two branches), then
    agent by agent, `batch` rows each (see [`call_denoiser`] for the keys)."""
    n = len(agents)

    def rows(key: str, negative_key: str | None) -> torch.Tensor:
        value = cond[key][agents].repeat_interleave(batch, dim=0)
        if branches == 2:
            negative = cond[negative_key]
            value = torch.cat([negative.expand(n * batch, *negative.shape[1:]), value])
        return value

    kwargs = {"encoder_hidden_states": rows("prompt_embeds", "negative_embeds")}
    if "pooled" in cond:
        kwargs["pooled"] = rows("pooled", "negative_pooled")
    if "time_ids" in cond:  # SDXL: one size/crop condition for every row
        kwargs["time_ids"] = cond["time_ids"].expand(branches * n * batch, -1)
    if cond.get("guidance_embeds"):  # Flux: the distilled guidance, each agent's own scale (float32, as FluxPipeline)
        scales = torch.tensor([guidance_scales[k] for k in agents], device=kwargs["pooled"].device)
        kwargs["guidance"] = scales.repeat_interleave(batch)
    return kwargs


def agent_groups(denoisers, num_agents: int) -> list[list[int]]:
    """The agents each model call serves: all of them in one call when one denoiser serves every agent, else one
    call per agent (its own denoiser)."""
    return [list(range(num_agents))] if len(denoisers) == 1 else [[k] for k in range(num_agents)]


def concept_attention_recording(denoisers) -> ConceptAttentionRecording:
    """Recording processors on every denoiser (one shared by the agents, or one per agent), to install once around a
    sampling loop and hand to [`predict_agents`]."""
    return ConceptAttentionRecording([uncompiled(model) for model in denoisers])


def predict_agents(
    denoisers,
    conditioning: str,
    sample: torch.Tensor,
    t,
    cond: dict,
    guidance_scales: list[float],
    branches: int,
    null_class_label: int | None = None,
    recording: ConceptAttentionRecording | None = None,
    attn_res: tuple[int, int] | None = None,
):
    """Every agent's guided prediction `(B, K, C, H, W)`, its conditional and unconditional predictions (the latter
    `None` with one branch) and, with `recording`, its conditional attention to its concept tokens `(B, K, H, W)`
    (averaged over the tokens `cond["token_indices"][k]`).

    Args:
        denoisers ([`MultiDenoiserModel`]): one denoiser shared by every agent, or one per agent.
        conditioning (`str`): `"text"`, `"class"` or `"none"`.
        sample (`torch.Tensor` of shape `(B, C, H, W)`): the scaled model input.
        t: the timestep.
        cond (`dict`): `prompt_embeds` `(K, L, D)`, `negative_embeds` `(1, L, D)` (and for SDXL, SD3 and Flux
            `pooled` `(K, P)`, `negative_pooled` `(1, P)`; for SDXL `time_ids` `(1, 6)`; for Flux `guidance_embeds`,
            whether the transformer takes the guidance scale as an input), or `labels` `(K,)`; `token_indices` (per
            agent, its concept's token positions) with `recording`.
        guidance_scales (`list[float]`): the `K` agents' guidance scales (classifier-free guidance with two branches;
            Flux's distilled guidance input).
        branches (`int`): 2 to run the unconditional branch too, else 1.
        null_class_label (`int`, *optional*): the unconditional class of class-conditional denoisers.
        recording ([`ConceptAttentionRecording`], *optional*): installed on the denoisers (see
            [`concept_attention_recording`]); records the concept-token attention (the cross-attention utility).
        attn_res (`tuple[int, int]`, *optional*): record only the layers at this attention grid (see
            [`ConceptAttentionStore`]); every text-attention layer by default.
    """
    batch, num_agents = sample.shape[0], len(guidance_scales)
    cond_out, uncond_out, attention = [None] * num_agents, [None] * num_agents, [None] * num_agents
    for agents in agent_groups(denoisers, num_agents):
        index = 0 if len(denoisers) == 1 else agents[0]
        n = len(agents)
        model_input = sample.repeat(branches * n, 1, 1, 1)
        kwargs = {}
        if conditioning == "text":
            kwargs = _text_kwargs(cond, agents, batch, branches, guidance_scales)
        elif conditioning == "class":
            labels = cond["labels"][agents].repeat_interleave(batch)
            if branches == 2:
                labels = torch.cat([torch.full_like(labels, null_class_label), labels])
            kwargs["class_labels"] = labels
        timestep = t.expand(model_input.shape[0]) if isinstance(t, torch.Tensor) and t.ndim == 0 else t
        if recording is None:
            out = call_denoiser(denoisers, index, model_input, timestep, kwargs)
        else:
            # only the conditional branch's maps are used (the last n * batch rows), and only at the concept tokens
            # of this call's agents
            tokens = sorted({i for k in agents for i in cond["token_indices"][k]})
            store = ConceptAttentionStore(
                sample.shape[-2:], first_row=(branches - 1) * n * batch, attn_res=attn_res, tokens=tokens
            )
            recording.store = store
            try:
                out = call_denoiser(denoisers, index, model_input, timestep, kwargs)
            finally:
                recording.store = None
            maps = store.maps.view(n, batch, *sample.shape[-2:], len(tokens))  # (n, B, H, W, tokens)
            for j, k in enumerate(agents):
                columns = [tokens.index(i) for i in cond["token_indices"][k]]
                attention[k] = maps[j][..., columns].mean(dim=-1)
        out = out.view(branches, n, batch, *out.shape[1:])
        for j, k in enumerate(agents):
            cond_out[k] = out[-1, j]
            uncond_out[k] = out[0, j] if branches == 2 else None
    cond_out = torch.stack(cond_out, dim=1)
    uncond_out = torch.stack(uncond_out, dim=1) if branches == 2 else None
    guided = cond_out
    if uncond_out is not None:
        scales = torch.tensor(guidance_scales, dtype=cond_out.dtype, device=cond_out.device)
        guided = uncond_out + scales.view(1, -1, 1, 1, 1) * (cond_out - uncond_out)
    attention = torch.stack(attention, dim=1) if recording is not None else None
    return guided, cond_out, uncond_out, attention
