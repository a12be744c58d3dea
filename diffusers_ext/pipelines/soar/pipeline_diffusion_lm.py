"""DiffusionLMPipeline: decode masked diffusion language models (LLaDA, Dream, LLaDA2, any `.logits` model) with a
[`SOARScheduler`]: the standard decoders (low-confidence remasking, Fast-dLLM thresholds, position beam search) and
SOAR."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput, logging

from ...schedulers.scheduling_soar import SOARScheduler
from ...utils import public
from .adapters import DiffusionLMAdapter, get_diffusion_lm_adapter


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("text", "seq")
STEP_BUDGETS = ("per_block", "global")


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
            adapter instance; by default chosen from the model config. Not saved with the pipeline.
    """

    model_cpu_offload_seq = "model"
    _optional_components = ["tokenizer"]
    _callback_tensor_inputs = ["sequences", "transfer_index", "confidence", "beam_scores"]

    def __init__(
        self,
        model,
        scheduler: SOARScheduler,
        tokenizer=None,
        adapter: str | DiffusionLMAdapter | None = None,
    ):
        super().__init__()
        self.register_modules(model=model, scheduler=scheduler, tokenizer=tokenizer)
        self.adapter = get_diffusion_lm_adapter(model, adapter)

    @property
    def num_timesteps(self) -> int:
        """Denoising steps (model forwards) of the last call."""
        return self._num_timesteps

    # ---------------------------------------------------------------------------------------------------------------
    # inputs
    # ---------------------------------------------------------------------------------------------------------------

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

    def _encode_texts(self, texts: list[str]) -> tuple[torch.LongTensor, torch.LongTensor]:
        if self.tokenizer is None:
            raise ValueError("`prompt` and `messages` need a tokenizer; pass `input_ids` instead.")
        encoded = self.tokenizer(
            texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        )
        return encoded["input_ids"], encoded["attention_mask"]

    def _prepare_input_ids(
        self, prompt, messages, input_ids, attention_mask, add_generation_prompt: bool
    ) -> tuple[torch.LongTensor, torch.LongTensor]:
        inputs = {"prompt": prompt, "messages": messages, "input_ids": input_ids}
        given = [name for name, value in inputs.items() if value is not None]
        if len(given) != 1:
            raise ValueError(f"pass exactly one of `prompt`, `messages`, `input_ids`; got {given or 'none'}.")
        if prompt is not None:
            prompts = [prompt] if isinstance(prompt, str) else prompt
            if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
                raise TypeError(f"`prompt` must be a string or a list of strings, got {type(prompt).__name__}.")
            if not prompts or any(len(p) == 0 for p in prompts):
                raise ValueError(f"`prompt` must hold non-empty strings, got {prompt!r}.")
            ids, mask = self._encode_texts(list(prompts))
        elif messages is not None:
            if self.tokenizer is None:
                raise ValueError("`messages` need a tokenizer with a chat template.")
            conversations = messages if messages and isinstance(messages[0], (list, tuple)) else [messages]
            if not conversations or any(len(c) == 0 for c in conversations):
                raise ValueError(f"`messages` must hold non-empty conversations, got {messages!r}.")
            texts = [
                self.tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt, tokenize=False)
                for c in conversations
            ]
            ids, mask = self._encode_texts(texts)
        else:
            ids = torch.as_tensor(input_ids)
            if ids.ndim == 1:
                ids = ids.unsqueeze(0)
            if ids.ndim != 2 or ids.dtype not in (torch.int32, torch.int64):
                raise ValueError(
                    f"`input_ids` must be an integer tensor of shape (batch, length), got {tuple(ids.shape)} "
                    f"{ids.dtype}."
                )
            mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask)
            if mask.ndim == 1:
                mask = mask.unsqueeze(0)
            if tuple(mask.shape) != tuple(ids.shape):
                raise ValueError(
                    f"`attention_mask` shape {tuple(mask.shape)} must match `input_ids` shape {tuple(ids.shape)}."
                )
            ids = ids.long()
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"empty prompt: the prompt ids have shape {tuple(ids.shape)}.")
        if given[0] == "input_ids" and attention_mask is not None:
            if not bool(((mask == 0) | (mask == 1)).all()):
                raise ValueError("`attention_mask` must hold only 0 and 1.")
            if bool((mask[:, 1:] < mask[:, :-1]).any()):
                raise ValueError("`attention_mask` must be left-padded: no 0 may follow a 1 in a row.")
            if bool((mask.sum(1) == 0).any()):
                raise ValueError("`attention_mask` marks an empty prompt (a row of zeros).")
        return ids, mask.long()

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
    ):
        """Check the call's arguments before any model forward. `prompt_length` is given for adapters whose blocks
        are aligned to absolute positions (LLaDA2): the first block then ends at the next multiple of
        `block_length` and `gen_length` need not be a multiple of it."""
        if not isinstance(gen_length, int) or isinstance(gen_length, bool) or gen_length < 1:
            raise ValueError(f"`gen_length` must be a positive integer, got {gen_length!r}.")
        if not isinstance(block_length, int) or isinstance(block_length, bool) or block_length < 1:
            raise ValueError(f"`block_length` must be a positive integer, got {block_length!r}.")
        if step_budget not in STEP_BUDGETS:
            raise ValueError(f"`step_budget` must be one of {STEP_BUDGETS}, got {step_budget!r}.")
        if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
            raise ValueError(f"`top_p` must be a number in (0, 1], got {top_p!r}.")
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise ValueError(f"`top_k` must be a positive integer, got {top_k!r}.")
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
        if not isinstance(num_inference_steps, int) or isinstance(num_inference_steps, bool):
            raise ValueError(f"`num_inference_steps` must be an integer, got {num_inference_steps!r}.")
        if step_budget == "global":
            if num_inference_steps < 1:
                raise ValueError(f"`num_inference_steps` must be positive, got {num_inference_steps!r}.")
        elif num_inference_steps < num_blocks or num_inference_steps % num_blocks:
            raise ValueError(
                f"`num_inference_steps` {num_inference_steps} cannot cover the generated length: it must be a positive "
                f"multiple of the number of blocks ({gen_length} / {block_length} = {num_blocks}), the same number "
                "of steps per block."
            )
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"`temperature` must be a number >= 0, got {temperature!r}.")
        if not isinstance(guidance_scale, (int, float)) or guidance_scale < 0:
            raise ValueError(f"`guidance_scale` must be a number >= 0, got {guidance_scale!r}.")
        if isinstance(generator, (list, tuple)) and len(generator) != batch_size:
            raise ValueError(f"`generator` is a list of {len(generator)}, but the batch has {batch_size} prompts.")
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

    def _rescore_by_pll(
        self, x, groups, first, done, best, prompt_attention, prompt_length, mask_id, nfe, row_forwards
    ) -> torch.LongTensor:
        """`beam_score="pll"`: among the complete beams of each finishing prompt, keep the one with the highest
        pseudo-log-likelihood `sum_j log p(x_j | x without j)` over the generated positions.

        One batched forward scores all candidates (each masked at one generated position per row): it adds 1 to the
        prompt's NFE and `candidates * gen_length` to its row forwards. A prompt with one complete beam costs
        nothing. Returns `best` with the chosen beams' generated tokens.
        """
        gen_length = x.shape[1] - prompt_length
        finishing = groups[first][done]
        complete = ~(x[:, prompt_length:] == mask_id).any(1)
        candidates = torch.isin(groups, finishing) & complete
        counts = torch.bincount(groups[candidates], minlength=int(groups.max()) + 1)
        candidates &= counts[groups] > 1
        rows = candidates.nonzero(as_tuple=True)[0]
        if len(rows) == 0:
            return best
        probes = x[rows].repeat_interleave(gen_length, 0)
        position = torch.arange(gen_length, device=x.device).repeat(len(rows)) + prompt_length
        probes[torch.arange(len(probes), device=x.device), position] = mask_id
        attention = prompt_attention[groups[rows]].repeat_interleave(gen_length, 0)
        logits = self.adapter(self.model, probes, attention, block_end=x.shape[1])
        log_probs = torch.log_softmax(logits.float(), -1)
        picked = log_probs[torch.arange(len(probes), device=x.device), position]
        targets = x[rows].repeat_interleave(gen_length, 0)[torch.arange(len(probes), device=x.device), position]
        pll = picked.gather(-1, targets.unsqueeze(-1)).squeeze(-1).view(len(rows), gen_length).sum(1)
        rescored = torch.unique(groups[rows]).cpu()
        nfe[rescored] += 1
        row_forwards += gen_length * torch.bincount(groups[rows].cpu(), minlength=len(nfe))
        best = best.clone()
        for group in torch.unique(groups[rows]).tolist():
            members = rows[groups[rows] == group]
            scores = pll[groups[rows] == group]
            winner = members[int(torch.argmax(scores))]  # ties keep the earlier (path-best) beam
            best_index = (groups[first] == group).nonzero(as_tuple=True)[0]
            best[best_index] = x[winner, prompt_length:]
        return best

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
        guidance_scale: float = 0.0,
        step_budget: str = "per_block",
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
            guidance_scale (`float`, defaults to 0): LLaDA-style classifier-free guidance (0 disables it).
            step_budget (`str`, defaults to `"per_block"`): how `num_inference_steps` bounds the decoding.
                `"per_block"`: every block gets `num_inference_steps / num_blocks` steps and a per-step quota that
                finishes it in time (LLaDA's `generate`); all masks are always filled. `"global"`: the reference SOAR
                loop's semantics: a step commits at least one token (the search branch one, the accelerate branch
                more), blocks take as many steps as they need, and decoding stops after `num_inference_steps`
                forwards, **returning mask tokens** where nothing was committed.
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
                `beam_scores`.

        Returns:
            [`DiffusionLMPipelineOutput`], or its fields as a tuple (`texts` left out for `output_type="seq"`).
        """
        ids, mask = self._prepare_input_ids(prompt, messages, input_ids, attention_mask, add_generation_prompt)
        batch_size, prompt_length = ids.shape
        absolute = bool(getattr(self.adapter, "absolute_blocks", False))
        if block_length is None:
            configured = self.scheduler.config.block_length
            block_length = gen_length if configured is None else configured
            if isinstance(gen_length, int) and not absolute:
                block_length = min(block_length, gen_length)
        if num_inference_steps is None:
            num_inference_steps = gen_length
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
        global_budget = step_budget == "global"
        steps_per_block = num_inference_steps if global_budget else num_inference_steps // num_blocks
        self.scheduler.set_timesteps(steps_per_block, device=device, block_length=block_length)
        timesteps = self.scheduler.timesteps

        prompts = ids.to(device)
        prompt_attention = torch.cat(
            [mask.to(device), torch.ones(batch_size, gen_length, dtype=torch.long, device=device)], 1
        )
        is_prompt = positions < prompt_length

        # rows: every beam of every unfinished prompt
        x = torch.full((batch_size, total_length), mask_id, dtype=torch.long, device=device)
        x[:, :prompt_length] = prompts
        groups = torch.arange(batch_size, device=device)
        scores = torch.zeros(batch_size, dtype=torch.float64, device=device)
        lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        block_steps = torch.zeros(batch_size, dtype=torch.long, device=device)

        results = torch.full((batch_size, gen_length), mask_id, dtype=torch.long, device=device)
        nfe = torch.zeros(batch_size, dtype=torch.long)
        row_forwards = torch.zeros(batch_size, dtype=torch.long)
        branches = 2 if guidance_scale > 0 else 1
        max_steps = num_inference_steps if global_budget else num_blocks * steps_per_block
        pll = self.scheduler.config.beam_score == "pll" and self.scheduler.config.max_beam_size > 1
        step = 0
        progress = self.progress_bar(total=batch_size * gen_length)
        while x.shape[0] > 0:
            if step >= max_steps:
                if global_budget:
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
            logits = self.adapter(
                self.model,
                x,
                prompt_attention[groups],
                prompt_mask=is_prompt.expand_as(x),
                block_end=block_end,
                guidance_scale=guidance_scale,
                mask_token_id=mask_id,
            )
            active = torch.unique_consecutive(groups).cpu()
            nfe[active] += 1
            row_forwards += branches * torch.bincount(groups.cpu(), minlength=batch_size)

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
                top_p=top_p,
                top_k=top_k,
                suppress_token_ids=suppress,
                confidence_suppress_token_ids=confidence_suppress,
                num_transfer_tokens=torch.ones_like(groups) if global_budget else None,
                sample_offset=prompt_length,
            )
            parents = out.parent_index
            x, scores, lengths, groups = out.prev_sample, out.beam_scores, out.beam_lengths, out.beam_groups
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
                    best = self._rescore_by_pll(
                        x, groups, first, done, best, prompt_attention, prompt_length, mask_id, nfe, row_forwards
                    )
                results[done_groups] = best[done]
                keep = ~torch.isin(groups, done_groups)
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
