"""The per-step model work of a [`DivideAndDenoisePipeline`]: every agent's guided prediction, its clean-sample
estimate's noise level under the scheduler.

Denoisers are called the way their class expects: a `UNet2DModel`/`UNet2DConditionModel` as
`model(sample, timestep, class_labels=..., encoder_hidden_states=...)`, an `SD3Transformer2DModel` as
`model(hidden_states=..., timestep=..., encoder_hidden_states=..., pooled_projections=...)`.
"""

import torch

from ..pipeline_utils import NoiseLevels, scheduler_prediction_type
from ..pipeline_utils import is_flow_matching as is_flow_matching  # the pipeline's scheduler check reads it here
from .denoisers import is_joint_transformer, uncompiled
from .utilities import ConceptAttentionRecording, ConceptAttentionStore


def noise_levels(scheduler, t, step_index: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(signal, noise)` scales (0-d, in the device and dtype of `like`) of the model input at step `step_index`
    (timestep `t`): `x_t = signal x_0 + noise e` ([`pipeline_utils.NoiseLevels.coefficients`]).

    DDPM-family schedulers: `(sqrt(alpha_bar_t), sqrt(1 - alpha_bar_t))`; flow matching: `(1 - sigma, sigma)` with
    `sigma = scheduler.sigmas[step_index]`.
    """
    levels = NoiseLevels(scheduler)
    return levels.coefficients(t, device=like.device, dtype=like.dtype, step_index=step_index)


def prediction_type(scheduler) -> str:
    """`"flow"` (velocity `noise - x_0`) for flow-matching schedulers, else the scheduler's `prediction_type`."""
    return scheduler_prediction_type(scheduler)


def _call_denoiser(denoisers, index: int, model, model_input, timestep, kwargs) -> torch.Tensor:
    if is_joint_transformer(model):
        return denoisers(
            index,
            hidden_states=model_input,
            timestep=timestep,
            encoder_hidden_states=kwargs["encoder_hidden_states"],
            pooled_projections=kwargs["pooled_projections"],
        ).sample
    return denoisers(index, model_input, timestep, **kwargs).sample


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
        cond (`dict`): `prompt_embeds` `(K, L, D)`, `negative_embeds` `(1, L, D)` (and for SD3 `pooled`
            `(K, P)`, `negative_pooled` `(1, P)`), or `labels` `(K,)`; `token_indices` (per agent, its concept's
            token positions) with `recording`.
        guidance_scales (`list[float]`): the `K` agents' guidance scales (used with two branches).
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
        model = denoisers[index]
        n = len(agents)
        model_input = sample.repeat(branches * n, 1, 1, 1)
        kwargs = {}
        if conditioning == "text":
            embeds = cond["prompt_embeds"][agents].repeat_interleave(batch, dim=0)
            if branches == 2:
                embeds = torch.cat([cond["negative_embeds"].expand(n * batch, -1, -1), embeds])
            kwargs["encoder_hidden_states"] = embeds
            if "pooled" in cond:
                pooled = cond["pooled"][agents].repeat_interleave(batch, dim=0)
                if branches == 2:
                    pooled = torch.cat([cond["negative_pooled"].expand(n * batch, -1), pooled])
                kwargs["pooled_projections"] = pooled
        elif conditioning == "class":
            labels = cond["labels"][agents].repeat_interleave(batch)
            if branches == 2:
                labels = torch.cat([torch.full_like(labels, null_class_label), labels])
            kwargs["class_labels"] = labels
        timestep = t.expand(model_input.shape[0]) if isinstance(t, torch.Tensor) and t.ndim == 0 else t
        if recording is None:
            out = _call_denoiser(denoisers, index, model, model_input, timestep, kwargs)
        else:
            # only the conditional branch's maps are used (the last n * batch rows), and only at the concept tokens
            # of this call's agents
            tokens = sorted({i for k in agents for i in cond["token_indices"][k]})
            store = ConceptAttentionStore(
                sample.shape[-2:], first_row=(branches - 1) * n * batch, attn_res=attn_res, tokens=tokens
            )
            recording.store = store
            try:
                out = _call_denoiser(denoisers, index, model, model_input, timestep, kwargs)
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
