"""DiffusionLMPipeline: decode masked diffusion language models (LLaDA, Dream, LLaDA2, any `.logits` model) with a
[`SOARScheduler`]: the standard decoders (low-confidence remasking, Fast-dLLM thresholds, position beam search) and
SOAR."""

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput, logging

from ...schedulers.scheduling_soar import STEP_BUDGETS, SOARScheduler
from ...utils import check_positive_int, exact_dtype, is_int, is_number, public
from .adapters import ADAPTERS, DiffusionLMAdapter, HFLogitsAdapter, get_diffusion_lm_adapter
from .kv_cache import CACHE_MODES, DiffusionLMKVCache, model_cache_keyword
from .pll_rescoring import DEFAULT_PLL_CHUNK_SIZE, rescore_by_pll
from .prompt_inputs import declared_options, prepare_input_ids
from .remote_code import (
    is_remote_code_model,
    load_saved_remote_code_model,
    record_remote_code_model,
    remote_code_auto_class,
    remote_code_pipeline_snapshot,
    saved_remote_code_auto_class,
)


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("text", "seq")


@public
@dataclass
class DiffusionLMPipelineOutput(BaseOutput):
    """Output of [`DiffusionLMPipeline`].

    Args:
        sequences (`torch.LongTensor` of shape `(batch_size, gen_length)`): the generated tokens of each prompt (the
            best beam), EOS-filled after the first EOS when `eos_early_stop` stopped it.
        texts (`list[str]`, *optional*): the decoded `sequences` (special tokens skipped); `None` for
            `output_type="seq"`.
        nfe (`torch.LongTensor` of shape `(batch_size,)`): model forward calls made while each prompt was being
            decoded (one batched call serves all beams of all prompts; guidance does not add calls).
        row_forwards (`torch.LongTensor` of shape `(batch_size,)`): sequences each prompt ran through the model,
            counting every beam (and both guidance branches).
    """

    sequences: torch.LongTensor
    texts: list[str] | None
    nfe: torch.LongTensor
    row_forwards: torch.LongTensor


@public
class DiffusionLMPipeline(DiffusionPipeline):
    """Generate text with a masked diffusion language model and a [`SOARScheduler`].

    The generated region is decoded in semi-autoregressive blocks of `block_length` tokens. At every step all beams
    of all unfinished prompts go through **one** batched model forward; the scheduler then commits tokens and keeps
    the best beams of each prompt. The model's calling convention (logit shift, attention mask form, block-causal
    window) is handled by an adapter chosen from the model config ([`get_diffusion_lm_adapter`]); pass `adapter`
    to override it.

    Args:
        model: a masked diffusion LM (`transformers` model or any module returning an object with `.logits`).
        scheduler ([`SOARScheduler`]): the decoding rule.
        tokenizer (*optional*): the model's tokenizer; needed for `prompt`/`messages` and text output.
        adapter (`str` or [`DiffusionLMAdapter`], *optional*): `"llada"`, `"dream"`, `"llada2"`, `"hf"` or an
            adapter instance; by default chosen from the model config. Saved with the pipeline (its name, mask token
            and logit shift) when it is one of those families.

    Classifier-free guidance follows the diffusers convention: `guidance_scale=1` (the default) disables it and
    `guidance_scale > 1` enables it. LLaDA's `cfg_scale` w (0 = off, logits `u + (w + 1)(c - u)`) is
    `guidance_scale = w + 1`; values below 1 are rejected so that LLaDA-style values cannot pass silently.
    """

    model_cpu_offload_seq = "model"
    _optional_components = ["tokenizer"]
    _callback_tensor_inputs = ["sequences", "transfer_index", "confidence", "beam_scores"]

    def __init__(
        self,
        model,
        scheduler: SOARScheduler,
        tokenizer=None,
        adapter: str | DiffusionLMAdapter | dict | None = None,
    ):
        super().__init__()
        self.register_modules(model=model, scheduler=scheduler, tokenizer=tokenizer)
        saved = adapter if isinstance(adapter, dict) else None
        if saved is not None:  # as written in model_index.json by a previous save
            adapter = get_diffusion_lm_adapter(model, saved.get("name"))
            adapter.mask_token_id, adapter.shift_logits = saved.get("mask_token_id"), bool(saved.get("shift_logits"))
        self.adapter = get_diffusion_lm_adapter(model, adapter)
        if self.config.adapter is None:
            logger.warning(f"adapter {type(self.adapter).__name__} is not a known family: it will not be saved.")

    def save_pretrained(self, save_directory, **kwargs):
        """diffusers' `save_pretrained`. A model with its own modeling code (LLaDA, Dream through
        `trust_remote_code`) is saved with its modeling files and `auto_map`, so that `from_pretrained` loads the folder
        again when the caller allows that code to run (`trust_remote_code`)."""
        remote_code = is_remote_code_model(self.model)
        if remote_code:
            remote_code_auto_class(self.model)  # an error now, before anything is written, if it has none
        super().save_pretrained(save_directory, **kwargs)
        if remote_code:
            record_remote_code_model(save_directory)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs) -> "DiffusionLMPipeline":
        """diffusers' `from_pretrained`. A saved model with its own modeling code runs only if the caller passes
        `trust_remote_code` (as in transformers; otherwise a `ValueError` names its modeling files); it is loaded
        through the auto class its `auto_map` names for its architecture, by [`load_remote_code_model`] (which also
        runs LLaDA's and Dream's modeling files, written for transformers 4). From a local folder or a Hub
        repository id: such a repository is fetched whole through `huggingface_hub` ([`remote_code_pipeline_snapshot`],
        which honours `HF_HUB_OFFLINE` and the local cache)."""
        folder = pretrained_model_name_or_path
        if not os.path.isdir(folder):  # a Hub repository: its snapshot when it holds a remote-code model
            folder = remote_code_pipeline_snapshot(folder, **kwargs) or folder
        auto_class = saved_remote_code_auto_class(folder) if os.path.isdir(folder) else None
        if auto_class is not None and kwargs.get("model") is None:
            model_kwargs = {k: kwargs[k] for k in ("torch_dtype", "dtype") if k in kwargs}
            kwargs["model"] = load_saved_remote_code_model(
                folder, auto_class, kwargs.get("trust_remote_code", False), **model_kwargs
            )
        return super().from_pretrained(folder, **kwargs)

    @property
    def adapter(self) -> DiffusionLMAdapter:
        """How the model is called (mask token, logit shift, attention); saved in `model_index.json` when its class
        is one of the known families."""
        return self._adapter

    @adapter.setter
    def adapter(self, adapter: DiffusionLMAdapter) -> None:
        # a property, so that the saved config always describes the adapter in use (diffusers' own attribute
        # syncing would write the adapter object itself into the config, which is not JSON)
        self._adapter = adapter
        known = type(adapter) in (*ADAPTERS.values(), HFLogitsAdapter)
        saved = {"name": adapter.name, "mask_token_id": adapter.mask_token_id, "shift_logits": adapter.shift_logits}
        self.register_to_config(adapter=saved if known else None)

    @property
    def num_timesteps(self) -> int:
        """The step budget while a call runs (so a callback can read it); after the call, the steps it took."""
        return self._num_timesteps

    @property
    def guidance_scale(self) -> float:
        """The diffusers-convention guidance scale of the running call (1 = off); a callback may set
        `pipe._guidance_scale`, read at every step."""
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale > 1.0

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    # ---------------------------------------------------------------------------------------------------------------
    # inputs
    # ---------------------------------------------------------------------------------------------------------------

    @staticmethod
    def _sequences_per_prompt(num_return_sequences, num_images_per_prompt) -> int:
        """The per-prompt count: `num_return_sequences`, or its alias `num_images_per_prompt` when given; a
        `ValueError` names the argument when the value is not a positive int or the two disagree."""
        name, count = "num_return_sequences", num_return_sequences
        if num_images_per_prompt is not None:
            if num_return_sequences not in (1, num_images_per_prompt):
                raise ValueError(
                    f"`num_return_sequences` {num_return_sequences!r} and its alias `num_images_per_prompt` "
                    f"{num_images_per_prompt!r} disagree; pass one of them."
                )
            name, count = "num_images_per_prompt", num_images_per_prompt
        check_positive_int(name, count)
        return count

    def step_inputs(self, sequences: torch.LongTensor, prompt_mask: torch.BoolTensor) -> dict:
        """Extra keyword inputs of the scheduler's `step` computed from the current sequences `(N, L)` (with the
        prompt positions `prompt_mask` `(N, L)`), each one of the scheduler's declared `step_options`. None here;
        [`LoMDMPipeline`] passes its learned `exponents`."""
        return {}

    def resolve_mask_token_id(self, mask_token_id: int | None = None) -> int:
        """The mask token: the argument, else the adapter's, the model config's, the tokenizer's, the family default.

        Raises a `ValueError` naming `mask_token_id` when none is known or it lies outside the vocabulary.
        """
        config = getattr(self.model, "config", None)
        candidates = (
            mask_token_id,
            self.adapter.mask_token_id,
            getattr(config, "mask_token_id", None),
            getattr(self.tokenizer, "mask_token_id", None) if self.tokenizer is not None else None,
            self.adapter.default_mask_token_id,
        )
        resolved = next((c for c in candidates if c is not None), None)
        if resolved is None:
            raise ValueError(
                "`mask_token_id` is unknown: pass it, or use a model config / tokenizer that defines one."
            )
        vocab_size = getattr(config, "vocab_size", None)
        if not isinstance(resolved, int) or resolved < 0 or (vocab_size is not None and resolved >= vocab_size):
            raise ValueError(
                f"`mask_token_id` {resolved!r} is not a token of the model's vocabulary (size {vocab_size})."
            )
        return resolved

    def _max_positions(self) -> tuple[str, int] | None:
        """`(config attribute, value)` of the most positions the model takes, or None when its config says none."""
        config = getattr(self.model, "config", None)
        for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(config, name, None)
            if is_int(value) and value > 0:
                return name, value
        return None

    def check_cache(self, cache, guidance_scale=1.0) -> None:
        """A `ValueError` naming `cache` when it is not `None`, `"prefix"` or `"dual"`, when the model cannot take a
        key/value cache (its forward takes no transformers `Cache`, or it runs its own modeling code), when the adapter
        does not pass keywords to the model, or with classifier-free guidance (whose unconditional branch would need a
        cache of its own)."""
        if cache is None:
            return
        if cache not in CACHE_MODES:
            raise ValueError(f"`cache` must be None or one of {CACHE_MODES}, got {cache!r}.")
        if model_cache_keyword(self.model) is None:
            raise ValueError(
                f"`cache={cache!r}` needs a model whose forward takes a transformers `Cache` (`cache` or "
                f"`past_key_values`), but {type(self.model).__name__} takes none, or runs its own modeling code (LLaDA's "
                "and Dream's published files: load the checkpoint with the package's `LLaDAModelLM` / `DreamModel`)."
            )
        if not self.adapter.takes_model_kwargs():
            raise ValueError(
                f"`cache={cache!r}` needs an adapter whose `forward_logits` passes keywords to the model (`**model_kwargs`); "
                f"{type(self.adapter).__name__}'s does not."
            )
        if is_number(guidance_scale) and guidance_scale > 1:
            raise ValueError(
                f"`cache={cache!r}` does not support classifier-free guidance (`guidance_scale` {guidance_scale}); "
                "pass `cache=None` or `guidance_scale=1`."
            )

    def check_inputs(
        self,
        batch_size,
        gen_length,
        block_length,
        num_inference_steps,
        temperature,
        guidance_scale,
        generator,
        output_type,
        callback_on_step_end_tensor_inputs,
        prompt_length=None,
        step_budget="per_block",
        top_p=None,
        top_k=None,
        pll_chunk_size=DEFAULT_PLL_CHUNK_SIZE,
        num_prompt_tokens=None,
        cache=None,
    ):
        """Check the call's arguments before any model forward. `prompt_length` is given for adapters whose blocks
        are aligned to absolute positions (LLaDA2): the first block then ends at the next multiple of
        `block_length` and `gen_length` need not be a multiple of it. `num_prompt_tokens` (the padded prompt
        length) plus `gen_length` must fit the model's positions (`max_position_embeddings` or the like)."""
        check_positive_int("gen_length", gen_length)
        self.check_cache(cache, guidance_scale)
        limit = self._max_positions()
        if limit is not None and num_prompt_tokens is not None and num_prompt_tokens + gen_length > limit[1]:
            raise ValueError(
                f"the prompt ({num_prompt_tokens} tokens) plus `gen_length` {gen_length} need "
                f"{num_prompt_tokens + gen_length} positions, but the model has {limit[1]} (`{limit[0]}` in its "
                "config); shorten the prompt or lower `gen_length`."
            )
        check_positive_int("block_length", block_length)
        if step_budget not in STEP_BUDGETS:
            raise ValueError(f"`step_budget` must be one of {STEP_BUDGETS}, got {step_budget!r}.")
        if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
            raise ValueError(f"`top_p` must be a number in (0, 1], got {top_p!r}.")
        if top_k is not None:
            check_positive_int("top_k", top_k)
        check_positive_int("pll_chunk_size", pll_chunk_size)
        if prompt_length is not None:
            first = prompt_length // block_length
            num_blocks = -(-(prompt_length + gen_length) // block_length) - first
        else:
            if gen_length % block_length:
                raise ValueError(
                    f"`gen_length` {gen_length} must be divisible by `block_length` {block_length} "
                    "(semi-autoregressive blocks of equal length)."
                )
            num_blocks = gen_length // block_length
        if not is_int(num_inference_steps):
            raise ValueError(f"`num_inference_steps` must be an integer, got {num_inference_steps!r}.")
        if step_budget in ("global", "unbounded"):
            if num_inference_steps < 1:
                raise ValueError(f"`num_inference_steps` must be positive, got {num_inference_steps!r}.")
        elif num_inference_steps < num_blocks or num_inference_steps % num_blocks:
            raise ValueError(
                f"`num_inference_steps` {num_inference_steps} cannot cover the generated length: it must be a positive "
                f"multiple of the number of blocks ({gen_length} / {block_length} = {num_blocks}), the same number "
                "of steps per block."
            )
        if not is_number(temperature) or not temperature >= 0:
            raise ValueError(f"`temperature` must be a number >= 0, got {temperature!r}.")
        if not is_number(guidance_scale) or not guidance_scale >= 1:  # `not >=` also refuses NaN
            raise ValueError(
                f"`guidance_scale` must be a number >= 1 (diffusers convention: 1 disables guidance), got "
                f"{guidance_scale!r}. LLaDA's cfg_scale w corresponds to guidance_scale = w + 1."
            )
        if isinstance(generator, (list, tuple)) and len(generator) != batch_size:
            raise ValueError(
                f"`generator` is a list of {len(generator)}, but the batch has {batch_size} sequences (prompts x "
                "`num_return_sequences`)."
            )
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        if output_type == "text" and self.tokenizer is None:
            raise ValueError("`output_type='text'` needs a tokenizer; use `output_type='seq'`.")
        unknown = [k for k in callback_on_step_end_tensor_inputs or () if k not in self._callback_tensor_inputs]
        if unknown:
            raise ValueError(
                f"`callback_on_step_end_tensor_inputs` {unknown} are not among {self._callback_tensor_inputs}."
            )

    # ---------------------------------------------------------------------------------------------------------------
    # decoding
    # ---------------------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str] | None = None,
        messages: list[dict] | list[list[dict]] | None = None,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.LongTensor | None = None,
        add_generation_prompt: bool = True,
        gen_length: int = 128,
        block_length: int | None = None,
        num_inference_steps: int | None = None,
        temperature: float = 0.0,
        top_p: float | None = None,
        top_k: int | None = None,
        guidance_scale: float = 1.0,
        num_return_sequences: int = 1,
        latents: torch.LongTensor | None = None,
        step_budget: str | None = None,
        logits_eos_inf: bool = False,
        confidence_eos_eot_inf: bool = False,
        eos_early_stop: bool = True,
        eos_token_id: int | None = None,
        eot_token_id: int | None = None,
        mask_token_id: int | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        output_type: str = "text",
        return_dict: bool = True,
        callback_on_step_end: Callable[..., dict[str, Any]] | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
        num_images_per_prompt: int | None = None,
        pll_chunk_size: int = DEFAULT_PLL_CHUNK_SIZE,
        cache: str | None = None,
    ) -> DiffusionLMPipelineOutput | tuple:
        """Generate `gen_length` tokens after each prompt.

        Args:
            prompt (`str` or `list[str]`, *optional*): prompt text(s), tokenized without added special tokens.
            messages (`list[dict]` or a list of them, *optional*): chat conversation(s), rendered with the
                tokenizer's chat template.
            input_ids (`torch.LongTensor` of shape `(batch, length)`, *optional*): prompt ids, left-padded.
            attention_mask (`torch.LongTensor`, *optional*): 1 for real tokens, 0 for left padding (with
                `input_ids`).
            add_generation_prompt (`bool`, defaults to `True`): end chat prompts with the assistant header.
            gen_length (`int`, defaults to 128): tokens to generate per prompt.
            block_length (`int`, *optional*): semi-autoregressive block length (default: the scheduler's, or
                `gen_length` if that is larger); must divide `gen_length`.
            num_inference_steps (`int`, *optional*): the step budget over all blocks (default `gen_length`, one
                token per step); a multiple of the number of blocks. Threshold and SOAR decoding finish early when
                confident.
            temperature (`float`, defaults to 0): 0 decodes greedily; above 0, Gumbel-max sampling. The mask token
                is never proposed.
            top_p (`float`, *optional*): nucleus filtering of the logits before proposing (Dream's `top_p`; it
                also renormalises the confidences, at any temperature, as in Dream).
            top_k (`int`, *optional*): top-k filtering of the logits before proposing (Dream's `top_k`).
            guidance_scale (`float`, defaults to 1): classifier-free guidance in the diffusers convention: 1 disables
                it, `g > 1` gives LLaDA's guided logits `u + g (c - u)` (LLaDA's `cfg_scale` w is `g = w + 1`);
                values below 1 raise. A callback may change it through `pipe._guidance_scale`.
            num_return_sequences (`int`, defaults to 1): sequences generated per prompt, one after the other in the
                output (`batch * num_return_sequences` rows; a generator list has one generator per row).
            latents (`torch.LongTensor` of shape `(batch * num_return_sequences, gen_length)`, *optional*): the
                initial generated region: the mask token where the model decodes, fixed tokens elsewhere (kept as
                given, e.g. to infill). All masks by default.
            step_budget (`str`, *optional*): how `num_inference_steps` bounds the decoding; by default the
                scheduler's `step_budget` config (`"per_block"` for schedulers without one; each preset of
                [`SOARScheduler.from_preset`] sets its reference's).
                `"per_block"`: every block gets `num_inference_steps / num_blocks` steps and a per-step quota that
                finishes it in time (LLaDA's `generate`); all masks are always filled. `"global"`: the reference SOAR
                loop's semantics: a step commits at least one token (the search branch one, the accelerate branch
                more), blocks take as many steps as they need, and decoding stops after `num_inference_steps`
                forwards, **returning mask tokens** where nothing was committed. `"unbounded"`: as `"global"`
                without the cap (Fast-dLLM's threshold loop, SOAR's Dream loop): decoding runs until no mask is left,
                at most `gen_length` steps, and `num_inference_steps` is not used.
            logits_eos_inf (`bool`, defaults to `False`): never propose the EOS token (LLaDA's `logits_eos_inf`).
            confidence_eos_eot_inf (`bool`, defaults to `False`): LLaDA's `confidence_eos_eot_inf`: after the tokens
                are chosen, the EoT token (`eot_token_id`) is removed from the softmax that gives the confidences, so
                a proposed EoT gets confidence 0 and is committed last. (The reference also assigns -inf to the EOS
                logit of a tensor it no longer reads; that has no effect and is not reproduced.)
            eot_token_id (`int`, *optional*): the end-of-turn token for `confidence_eos_eot_inf` (LLaDA: 126348;
                defaults to the adapter's).
            eos_early_stop (`bool`, defaults to `True`): stop a prompt once its best beam has an EOS with no mask
                before it (the rest is filled with EOS).
            eos_token_id (`int`, *optional*): defaults to the tokenizer's, then the model config's.
            mask_token_id (`int`, *optional*): overrides the mask token (see `resolve_mask_token_id`).
            generator (`torch.Generator` or a list of one per prompt, *optional*): the noise of `temperature > 0`,
                random remasking and Dream's random transfer rules. One generator draws over all rows at once, the
                way the references do (a prompt's draws then depend on the rest of the batch); a list gives every
                prompt its own stream over its generated positions only, so each prompt of a batch gets exactly
                what it gets alone with its generator.
            output_type (`str`, defaults to `"text"`): `"text"` (sequences and decoded texts) or `"seq"`.
            return_dict (`bool`, defaults to `True`): return a [`DiffusionLMPipelineOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after
                every step; it may return replacements for the tensors it was given.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): tensors passed to the callback, among
                `sequences` (all rows, `(N, prompt + gen_length)`), `transfer_index`, `confidence` and
                `beam_scores`. Asking for `confidence` makes a [`SOARScheduler`] measure it at every position
                (`proposal_positions="all"`: a full-vocabulary pass over the whole sequence per step); otherwise it
                proposes only at the masked positions of the current block, and a model whose forward takes
                `logits_to_keep` (transformers' causal LMs) runs its output head there alone (not when a forward
                hook sits on the model or its output head: a hook is given the full logits).
            num_images_per_prompt (`int`, *optional*): the diffusers name of `num_return_sequences`, accepted as an
                alias (the conformance suites of image pipelines pass it).
            pll_chunk_size (`int`, defaults to 16): with `beam_score="pll"`, the probes (a complete beam with one
                generated position masked) per forward of the rescoring: its peak memory is one chunk's logits
                `(pll_chunk_size, L, V)` in the model's dtype. The result does not depend on it.
            cache (`str`, *optional*): Fast-dLLM's block-wise key/value cache ([`DiffusionLMKVCache`]):
                `"prefix"` reuses the keys and values of everything before the current block, computed at the block's
                first step, and runs the block and what follows it; `"dual"` also reuses those of the masked suffix
                and runs the block alone. Approximate for bidirectional models (the cached positions do not see the
                block's new tokens; `docs/soar.md` says by how much), exact for block-causal ones (LLaDA2). Needs a
                model whose forward takes a transformers `Cache` (the package's [`LLaDAModelLM`] and [`DreamModel`],
                transformers' decoders) and no guidance. Each step stays one step (`nfe` counts it once) but runs one
                forward per group of rows in the same block (rows whose block just started run the whole sequence).
                A callback reading `confidence` sees zeros outside each row's window.

        Returns:
            [`DiffusionLMPipelineOutput`], or its fields as a tuple (`texts` left out for `output_type="seq"`).
        """
        ids, mask = prepare_input_ids(
            self.tokenizer, prompt, messages, input_ids, attention_mask, add_generation_prompt
        )
        count = self._sequences_per_prompt(num_return_sequences, num_images_per_prompt)
        ids, mask = ids.repeat_interleave(count, 0), mask.repeat_interleave(count, 0)
        batch_size, prompt_length = ids.shape
        absolute = bool(getattr(self.adapter, "absolute_blocks", False))
        if block_length is None:
            configured = self.scheduler.config.block_length
            block_length = gen_length if configured is None else configured
            if isinstance(gen_length, int) and not absolute:
                block_length = min(block_length, gen_length)
        if num_inference_steps is None:
            num_inference_steps = gen_length
        if step_budget is None:
            step_budget = self.scheduler.config.get("step_budget", None) or "per_block"
        self.check_inputs(
            batch_size,
            gen_length,
            block_length,
            num_inference_steps,
            temperature,
            guidance_scale,
            generator,
            output_type,
            callback_on_step_end_tensor_inputs,
            prompt_length=prompt_length if absolute else None,
            step_budget=step_budget,
            top_p=top_p,
            top_k=top_k,
            pll_chunk_size=pll_chunk_size,
            num_prompt_tokens=prompt_length,
            cache=cache,
        )
        mask_id = self.resolve_mask_token_id(mask_token_id)
        if eos_token_id is None and self.tokenizer is not None:
            eos_token_id = self.tokenizer.eos_token_id
        if eos_token_id is None:
            eos_token_id = getattr(getattr(self.model, "config", None), "eos_token_id", None)
        if isinstance(eos_token_id, (list, tuple)):
            eos_token_id = eos_token_id[0] if eos_token_id else None
        if (eos_early_stop or logits_eos_inf) and eos_token_id is None:
            raise ValueError(
                "`eos_early_stop=True` and `logits_eos_inf=True` need an `eos_token_id` (none on the tokenizer or model)."
            )
        if confidence_eos_eot_inf:
            eot_token_id = eot_token_id if eot_token_id is not None else self.adapter.default_eot_token_id
            if eot_token_id is None:
                raise ValueError("`confidence_eos_eot_inf=True` needs an `eot_token_id` (the end-of-turn token).")
        suppress = (eos_token_id,) if logits_eos_inf else ()
        confidence_suppress = (eot_token_id,) if confidence_eos_eot_inf else ()
        if latents is not None:
            vocab_size = getattr(getattr(self.model, "config", None), "vocab_size", None)
            if (
                not isinstance(latents, torch.Tensor)
                or latents.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool)
                or tuple(latents.shape) != (batch_size, gen_length)
            ):
                raise ValueError(
                    f"`latents` must be an integer tensor of shape {(batch_size, gen_length)} (sequences x "
                    f"`gen_length`), got {getattr(latents, 'dtype', type(latents).__name__)} "
                    f"{tuple(getattr(latents, 'shape', ()))}."
                )
            if latents.min() < 0 or (vocab_size is not None and latents.max() >= vocab_size):
                raise ValueError(f"`latents` holds ids outside the vocabulary [0, {vocab_size}).")
        self._guidance_scale = float(guidance_scale)
        self._interrupt = False

        device = self._execution_device
        total_length = prompt_length + gen_length
        positions = torch.arange(total_length, device=device)
        if absolute:
            # LLaDA2: blocks are aligned to absolute positions; the first generated block may be partial
            first_block = prompt_length // block_length
            block_of = torch.div(positions, block_length, rounding_mode="floor") - first_block
        else:
            block_of = torch.div(positions - prompt_length, block_length, rounding_mode="floor")
        block_of = torch.where(positions >= prompt_length, block_of, -1)
        num_blocks = int(block_of.max()) + 1
        global_budget = step_budget in ("global", "unbounded")
        # the decoding options only some schedulers declare (SOAR's); asking another scheduler for one raises
        step_options = declared_options(
            self.scheduler,
            "step_options",
            top_p=top_p,
            top_k=top_k,
            suppress_token_ids=suppress,
            confidence_suppress_token_ids=confidence_suppress,
            # the reference SOAR loop's global budget: every step commits one token per row (more when it accelerates)
            num_transfer_tokens=1 if global_budget else None,
            sample_offset=prompt_length,
            # the scheduler proposes only where it can commit, unless a callback reads the confidence everywhere
            proposal_positions="all" if "confidence" in (callback_on_step_end_tensor_inputs or ()) else None,
        )
        # the model's output head runs only at the positions a step can commit, when the scheduler takes logits there
        keep_eligible_logits = (
            "logits_positions" in getattr(self.scheduler, "step_options", ())
            and step_options.get("proposal_positions") != "all"
        )
        steps_per_block = num_inference_steps if global_budget else num_inference_steps // num_blocks
        set_timesteps_options = declared_options(self.scheduler, "set_timesteps_options", block_length=block_length)
        self.scheduler.set_timesteps(steps_per_block, device=device, **set_timesteps_options)
        timesteps = self.scheduler.timesteps

        prompts = ids.to(device)
        prompt_attention = torch.cat(
            [mask.to(device), torch.ones(batch_size, gen_length, dtype=torch.long, device=device)], 1
        )
        is_prompt = positions < prompt_length

        # rows: every beam of every unfinished prompt
        x = torch.full((batch_size, total_length), mask_id, dtype=torch.long, device=device)
        x[:, :prompt_length] = prompts
        if latents is not None:
            x[:, prompt_length:] = latents.to(device)
        groups = torch.arange(batch_size, device=device)
        scores = torch.zeros(batch_size, dtype=exact_dtype(device), device=device)
        lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        block_steps = torch.zeros(batch_size, dtype=torch.long, device=device)

        results = torch.full((batch_size, gen_length), mask_id, dtype=torch.long, device=device)
        nfe = torch.zeros(batch_size, dtype=torch.long)
        row_forwards = torch.zeros(batch_size, dtype=torch.long)
        if step_budget == "unbounded":  # every step commits a token or more in every row: at most gen_length steps
            max_steps = gen_length
        else:
            max_steps = num_inference_steps if global_budget else num_blocks * steps_per_block
        self._num_timesteps = max_steps
        config = self.scheduler.config
        pll = config.get("beam_score") == "pll" and config.get("max_beam_size", 1) > 1
        kv_cache = None
        if cache is not None:
            kv_cache = DiffusionLMKVCache(cache, model_cache_keyword(self.model), absolute_blocks=absolute)
        step = 0
        progress = self.progress_bar(total=batch_size * gen_length)
        while x.shape[0] > 0:
            if self.interrupt:  # a callback stopped the call: unfinished prompts keep their best beam as it is
                first = torch.ones_like(groups, dtype=torch.bool)
                first[1:] = groups[1:] != groups[:-1]
                results[groups[first]] = x[first, prompt_length:]
                break
            if step >= max_steps:
                if step_budget == "global":
                    break
                raise RuntimeError(
                    f"decoding did not finish within {max_steps} steps: a callback re-masked committed tokens."
                )
            masked = x == mask_id
            current_block = torch.where(masked & ~is_prompt, block_of, num_blocks).min(1).values
            transfer_mask = block_of.unsqueeze(0) == current_block.unsqueeze(1)
            block_end = prompt_length + int(
                (block_of.unsqueeze(0) <= current_block.max()).logical_and(~is_prompt).sum()
            )
            logits_options = {}
            if keep_eligible_logits:
                # every position some row may commit now (the masked positions of its current block), increasing
                kept = (masked & transfer_mask).any(0).nonzero(as_tuple=True)[0]
                logits_options = {"positions": kept}
            if kv_cache is not None:  # one forward per group of rows sharing a window: still one step
                logits = kv_cache.logits(
                    self.adapter,
                    self.model,
                    x,
                    prompt_attention[groups],
                    current_block,
                    block_of,
                    block_end,
                    positions=logits_options.get("positions"),
                )
            else:
                logits = self.adapter(
                    self.model,
                    x,
                    prompt_attention[groups],
                    prompt_mask=is_prompt.expand_as(x),
                    block_end=block_end,
                    guidance_scale=self.guidance_scale,
                    mask_token_id=mask_id,
                    **logits_options,
                )
            active = torch.unique_consecutive(groups).cpu()
            nfe[active] += 1
            row_forwards += (2 if self.do_classifier_free_guidance else 1) * torch.bincount(
                groups.cpu(), minlength=batch_size
            )

            step_timesteps = timesteps[block_steps.clamp(max=steps_per_block - 1)]
            out = self.scheduler.step(
                logits,
                step_timesteps,
                x,
                mask_token_id=mask_id,
                transfer_mask=transfer_mask,
                beam_scores=scores,
                beam_lengths=lengths,
                beam_groups=groups,
                temperature=temperature,
                generator=generator,
                **step_options,
                **({"logits_positions": logits_options["positions"]} if logits_options else {}),
                **self.step_inputs(x, is_prompt.expand_as(x)),
            )
            parents = out.parent_index
            x, scores, lengths, groups = out.prev_sample, out.beam_scores, out.beam_lengths, out.beam_groups
            if kv_cache is not None:  # a child beam keeps its parent's cache
                kv_cache.select(parents)
            new_block = torch.where((x == mask_id) & ~is_prompt, block_of, num_blocks).min(1).values
            block_steps = torch.where(new_block == current_block[parents], block_steps[parents] + 1, 0)

            if callback_on_step_end is not None:
                available = {
                    "sequences": x,
                    "transfer_index": out.transfer_index,
                    "confidence": out.confidence,
                    "beam_scores": scores,
                }
                callback_kwargs = {k: available[k] for k in callback_on_step_end_tensor_inputs or ()}
                callback_outputs = callback_on_step_end(self, step, step_timesteps, callback_kwargs) or {}
                x = callback_outputs.get("sequences", x)
                scores = callback_outputs.get("beam_scores", scores)

            # finish prompts whose best beam (the first row of its group) is complete
            first = torch.ones_like(groups, dtype=torch.bool)
            first[1:] = groups[1:] != groups[:-1]
            best = x[first, prompt_length:]
            if eos_early_stop:
                is_eos = best == eos_token_id
                before_eos = torch.cumsum(is_eos.long(), 1) == 0
                stop = is_eos.any(1) & ~((best == mask_id) & before_eos).any(1)
                after = torch.cumsum(is_eos.long(), 1) > 0
                best = torch.where(stop.unsqueeze(1) & after, eos_token_id, best)
            else:
                stop = torch.zeros(best.shape[0], dtype=torch.bool, device=device)
            done = stop | ~(best == mask_id).any(1)
            done_groups = groups[first][done]
            if len(done_groups):
                if pll:
                    best = rescore_by_pll(
                        self.adapter,
                        self.model,
                        x,
                        groups,
                        first,
                        done,
                        best,
                        prompt_attention,
                        prompt_length,
                        mask_id,
                        nfe,
                        row_forwards,
                        chunk_size=pll_chunk_size,
                    )
                results[done_groups] = best[done]
                keep = ~torch.isin(groups, done_groups)
                if kv_cache is not None:
                    kv_cache.select(keep.nonzero(as_tuple=True)[0])
                x, scores, lengths, groups, block_steps = (
                    x[keep],
                    scores[keep],
                    lengths[keep],
                    groups[keep],
                    block_steps[keep],
                )
            filled = (results != mask_id).sum()
            if x.shape[0]:
                first = torch.ones_like(groups, dtype=torch.bool)
                first[1:] = groups[1:] != groups[:-1]
                filled = filled + (x[first, prompt_length:] != mask_id).sum()
            progress.update(int(filled) - progress.n)
            step += 1
        if x.shape[0]:  # the global step budget ran out: the best beams keep their masks
            first = torch.ones_like(groups, dtype=torch.bool)
            first[1:] = groups[1:] != groups[:-1]
            results[groups[first]] = x[first, prompt_length:]
        progress.close()
        self._num_timesteps = step
        self.maybe_free_model_hooks()

        texts = None
        if output_type == "text":
            texts = self.tokenizer.batch_decode(results.cpu(), skip_special_tokens=True)
        output = DiffusionLMPipelineOutput(sequences=results, texts=texts, nfe=nfe, row_forwards=row_forwards)
        # like every diffusers output, the tuple leaves out fields that are None (`texts` for "seq")
        return output if return_dict else output.to_tuple()
