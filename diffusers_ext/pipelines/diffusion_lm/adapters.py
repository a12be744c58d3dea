"""Model adapters: one calling convention per masked diffusion LM family, behind one interface.

An adapter turns `(model, sequences, attention mask)` into logits aligned with the sequences (`logits[:, i]`
predicts token `i`), whatever the family's convention: LLaDA reads a masked position where it stands, Dream keeps
its autoregressive head (the prediction for position `i` sits at `i - 1`) and wants a 4-D mask with position ids for
padded batches, LLaDA2 attends block-causally and runs on the window up to the current block.
"""

import functools
import inspect
from abc import ABC, abstractmethod

import torch

from ...utils import public


LLADA_MASK_TOKEN_ID = 126336
LLADA_EOT_TOKEN_ID = 126348
DREAM_MASK_TOKEN_ID = 151666


@functools.cache
def _parameters(function) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # not inspectable
        return ()


def _forward_takes(model_class: type, name: str) -> bool:
    return name in _parameters(getattr(model_class, "forward", None))


def can_keep_logits(model) -> bool:
    """Whether `model` can run its output head at some positions only: its forward takes transformers'
    `logits_to_keep` (an index tensor of positions), and no forward hook sits on it or on its output head (a hook may
    read or edit the logits by position, so it is given the full logits). Models without it get full logits, which
    are indexed after the forward."""
    if not isinstance(model, torch.nn.Module) or not _forward_takes(type(model), "logits_to_keep"):
        return False
    if torch.nn.modules.module._global_forward_hooks or model._forward_hooks:
        return False
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return not (isinstance(head, torch.nn.Module) and head._forward_hooks)


def model_logits(model, input_ids: torch.LongTensor, positions: torch.LongTensor | None = None, **kwargs):
    """`model(input_ids, **kwargs).logits` `(N, L, V)`, or with `positions` `(K,)` the logits at those positions of
    the model's output only `(N, K, V)`: computed there alone through `logits_to_keep` when the model allows it
    ([`can_keep_logits`]), otherwise indexed from the full logits (the same values either way).

    A model whose forward takes `use_cache` gets `use_cache=False` unless `kwargs` say otherwise: a denoising forward
    reads the whole sequence each time and never reuses keys and values. It also matters to LLaDA's modeling file,
    whose forward reads `config.use_cache` when the caller passes none: transformers 5 drops `use_cache` from that
    config (generation parameters given to `PreTrainedConfig.__init__` are discarded), so the read would fail.
    """
    if "use_cache" not in kwargs and isinstance(model, torch.nn.Module) and _forward_takes(type(model), "use_cache"):
        kwargs["use_cache"] = False
    if positions is None:
        return model(input_ids, **kwargs).logits
    if can_keep_logits(model):
        logits = model(input_ids, logits_to_keep=positions, **kwargs).logits
        if logits.shape[1] == positions.numel():
            return logits
    else:
        logits = model(input_ids, **kwargs).logits
    return logits[:, positions]


@public
class DiffusionLMAdapter(ABC):
    """Base adapter: the calling convention of a masked diffusion LM.

    Subclasses implement `forward_logits`. Calling the adapter adds classifier-free guidance (LLaDA's
    unsupervised form: the unconditional branch replaces the prompt by mask tokens, both branches run in one
    batched forward, and `logits = u + g * (c - u)` for `guidance_scale` g > 1, diffusers' convention; LLaDA's
    `cfg_scale` w is `g = w + 1`).

    Args:
        mask_token_id (`int`, *optional*): the mask token; by default the model config's `mask_token_id`, then the
            tokenizer's, then the family default (if any).
        shift_logits (`bool`, defaults to `False`): the model's logits at position `i` predict token `i + 1` (they
            are shifted right by one before use).
    """

    default_mask_token_id: int | None = None
    default_eot_token_id: int | None = None
    # blocks aligned to absolute positions (the first generated block ends at the next multiple of the block length)
    absolute_blocks = False
    # in a padded batch the model is given position ids that count real tokens (else positions count the padding)
    padding_position_ids = True
    name = "base"

    def __init__(self, mask_token_id: int | None = None, shift_logits: bool = False):
        self.mask_token_id = mask_token_id
        self.shift_logits = shift_logits

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mask_token_id={self.mask_token_id}, shift_logits={self.shift_logits})"

    @staticmethod
    def _padding_position_ids(attention_mask: torch.Tensor) -> torch.LongTensor:
        position_ids = attention_mask.long().cumsum(-1) - 1
        return position_ids.masked_fill(attention_mask == 0, 1)

    @abstractmethod
    def forward_logits(self, model, input_ids, attention_mask, block_end) -> torch.Tensor:
        """The model's logits `(B, L, V)` as the model returns them (before `shift_logits` realigns them); each
        family implements it. An implementation may take a keyword `positions` `(K,)`: the positions of the model's
        output wanted, returning `(B, K, V)` (the built-in adapters run the output head there alone); and further
        keywords, passed to the model as they are (the built-in adapters take them: a key/value cache)."""

    def window_inputs(self, attention_mask: torch.LongTensor, first: int, last: int, key_end: int) -> dict:
        """The model's keyword inputs for a forward of positions `[first, last)` whose keys and values cover
        `[0, key_end)` (the rest from a cache): position ids `(B or 1, last - first)`, and for a padded batch the
        attention mask as this adapter gives it to a full forward, restricted to those queries and keys.

        Args:
            attention_mask (`torch.LongTensor` of shape `(B, L)`): 1 for real tokens, 0 for left padding.
        """
        position_ids = torch.arange(first, last, device=attention_mask.device).unsqueeze(0)
        if not bool((attention_mask == 0).any()):
            return {"position_ids": position_ids}
        if self.padding_position_ids:
            position_ids = self._padding_position_ids(attention_mask)[:, first:last]
        return {"attention_mask": attention_mask[:, :key_end], "position_ids": position_ids}

    def takes_model_kwargs(self) -> bool:
        """Whether `forward_logits` passes extra keywords to the model (needed by the prefix and dual caches)."""
        parameters = inspect.signature(type(self).forward_logits).parameters.values()
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)

    def _forward_logits_at(self, model, input_ids, attention_mask, block_end, positions, **model_kwargs):
        """The model's own logits at `positions` `(K,)`, `(B, K, V)`: through `forward_logits(..., positions=)` when
        the adapter takes it, else indexed from its full logits."""
        if "positions" in _parameters(type(self).forward_logits):
            return self.forward_logits(
                model, input_ids, attention_mask, block_end, positions=positions, **model_kwargs
            )
        return self.forward_logits(model, input_ids, attention_mask, block_end, **model_kwargs)[:, positions]

    def _align(self, logits: torch.Tensor) -> torch.Tensor:
        if self.shift_logits:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits

    def __call__(
        self,
        model,
        input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor,
        *,
        prompt_mask: torch.BoolTensor | None = None,
        block_end: int | None = None,
        guidance_scale: float = 1.0,
        mask_token_id: int | None = None,
        positions: torch.LongTensor | None = None,
        model_kwargs: dict | None = None,
    ) -> torch.Tensor:
        """Logits of shape `(N, L, V)` aligned with `input_ids` `(N, L)`, or `(N, K, V)` at `positions` only.

        Args:
            model: the transformers / diffusers model.
            input_ids (`torch.LongTensor` of shape `(N, L)`): sequences, mask tokens where undecided.
            attention_mask (`torch.LongTensor` of shape `(N, L)`): 1 for real tokens, 0 for (left) padding.
            prompt_mask (`torch.BoolTensor` of shape `(N, L)`, *optional*): prompt positions (for guidance).
            block_end (`int`, *optional*): the end of the furthest current block (block-causal models).
            guidance_scale (`float`, defaults to 1): classifier-free guidance scale, diffusers' convention: 1 (or
                less) disables it.
            mask_token_id (`int`, *optional*): the mask token for the unconditional branch.
            positions (`torch.LongTensor` of shape `(K,)`, *optional*): the aligned positions wanted; the logits
                `(N, K, V)` are those of the full call at these positions (`logits[:, j]` predicts token
                `positions[j]`), the model's output head running there alone when it allows it (with
                `shift_logits`, at the position before each).
            model_kwargs (`dict`, *optional*): passed to the model's forward (e.g. a key/value cache to record
                into); the adapter must take them ([`takes_model_kwargs`]).
        """
        model_kwargs = model_kwargs or {}
        if positions is None:

            def forward(model, input_ids, attention_mask, block_end):
                return self.forward_logits(model, input_ids, attention_mask, block_end, **model_kwargs)

        else:
            # aligned position i is the model's i - 1 with a shift (position 0 keeps its own, as `_align` does)
            model_positions = (positions - 1).clamp(min=0) if self.shift_logits else positions

            def forward(model, input_ids, attention_mask, block_end):
                return self._forward_logits_at(
                    model, input_ids, attention_mask, block_end, model_positions, **model_kwargs
                )

        if guidance_scale > 1:
            if prompt_mask is None or mask_token_id is None:
                raise ValueError("classifier-free guidance needs `prompt_mask` and `mask_token_id`.")
            unconditional = input_ids.masked_fill(prompt_mask, mask_token_id)
            both = forward(
                model,
                torch.cat([input_ids, unconditional]),
                torch.cat([attention_mask, attention_mask]),
                block_end,
            )
            conditional, unconditional = both.chunk(2)
            logits = unconditional + guidance_scale * (conditional - unconditional)
        else:
            logits = forward(model, input_ids, attention_mask, block_end)
        return logits if positions is not None else self._align(logits)


@public
class LLaDAAdapter(DiffusionLMAdapter):
    """LLaDA: `model(x, attention_mask=...).logits`, no shift, mask token 126336 by default.

    The attention mask is passed only when the batch is padded (LLaDA's model takes no position ids).
    """

    default_mask_token_id = LLADA_MASK_TOKEN_ID
    default_eot_token_id = LLADA_EOT_TOKEN_ID
    name = "llada"
    padding_position_ids = False

    def __init__(self, mask_token_id: int | None = None):
        super().__init__(mask_token_id=mask_token_id, shift_logits=False)

    def forward_logits(self, model, input_ids, attention_mask, block_end, positions=None, **model_kwargs):
        if bool((attention_mask == 0).any()):
            return model_logits(model, input_ids, positions, attention_mask=attention_mask, **model_kwargs)
        return model_logits(model, input_ids, positions, **model_kwargs)


@public
class DreamAdapter(DiffusionLMAdapter):
    """Dream: logits shifted right by one; padded batches get a 4-D boolean mask and position ids.

    As in Dream's sampler: without padding the model attends fully (no mask, no position ids); with padding the
    mask is `(N, 1, L, L)` with `mask[i, j] = real_i and real_j` and the position ids count real tokens (padding
    gets position 1). Mask token 151666 by default.
    """

    default_mask_token_id = DREAM_MASK_TOKEN_ID
    name = "dream"

    def __init__(self, mask_token_id: int | None = None):
        super().__init__(mask_token_id=mask_token_id, shift_logits=True)

    def forward_logits(self, model, input_ids, attention_mask, block_end, positions=None, **model_kwargs):
        if not bool((attention_mask == 0).any()):
            return model_logits(model, input_ids, positions, **model_kwargs)
        real = attention_mask.bool()
        four_d = real[:, None, None, :] & real[:, None, :, None]
        position_ids = self._padding_position_ids(attention_mask)
        return model_logits(
            model, input_ids, positions, attention_mask=four_d, position_ids=position_ids, **model_kwargs
        )

    def window_inputs(self, attention_mask, first, last, key_end):
        inputs = super().window_inputs(attention_mask, first, last, key_end)
        if "attention_mask" in inputs:  # Dream's 4-D form: the window's queries against every key
            real = attention_mask.bool()
            inputs["attention_mask"] = real[:, None, first:last, None] & real[:, None, None, :key_end]
        return inputs


@public
class LLaDA2Adapter(DiffusionLMAdapter):
    """LLaDA2: block-causal attention; the model runs on the window up to the current block's end.

    Called like diffusers' `LLaDA2Pipeline` calls it: `model(x[:, :end], attention_mask=mask[:, :end],
    position_ids=positions[:, :end]).logits`, the block-causal structure being the model's own. Blocks are aligned
    to absolute positions as in `LLaDA2Pipeline` (block k covers positions `[k * block_length, (k + 1) *
    block_length)`, so the first generated block ends at the next multiple of the block length). Positions past the
    window get zero logits (they are never eligible: they lie in later blocks). No shift.
    """

    absolute_blocks = True
    name = "llada2"

    def __init__(self, mask_token_id: int | None = None):
        super().__init__(mask_token_id=mask_token_id, shift_logits=False)

    def forward_logits(self, model, input_ids, attention_mask, block_end, positions=None, **model_kwargs):
        length = input_ids.shape[1]
        end = length if block_end is None else int(block_end)
        position_ids = self._padding_position_ids(attention_mask)[:, :end]
        window = None if positions is None else positions.clamp(max=end - 1)
        logits = model_logits(
            model,
            input_ids[:, :end],
            window,
            attention_mask=attention_mask[:, :end],
            position_ids=position_ids,
            **model_kwargs,
        )
        if positions is not None:
            past = positions >= end  # past the window: zero logits, as over the full length
            return logits.masked_fill(past[None, :, None], 0.0) if bool(past.any()) else logits
        if end < length:
            logits = torch.cat([logits, logits.new_zeros(logits.shape[0], length - end, logits.shape[2])], dim=1)
        return logits


@public
class HFLogitsAdapter(DiffusionLMAdapter):
    """Any Hugging Face model returning `.logits`; `shift_logits` says whether they are shifted by one.

    Padded batches pass the 2-D attention mask and position ids that count real tokens, so a left-padded prompt
    sees the same positions as on its own.
    """

    name = "hf"

    def forward_logits(self, model, input_ids, attention_mask, block_end, positions=None, **model_kwargs):
        if not bool((attention_mask == 0).any()):
            return model_logits(model, input_ids, positions, **model_kwargs)
        position_ids = self._padding_position_ids(attention_mask)
        return model_logits(
            model, input_ids, positions, attention_mask=attention_mask, position_ids=position_ids, **model_kwargs
        )


ADAPTERS = {cls.name: cls for cls in (LLaDAAdapter, DreamAdapter, LLaDA2Adapter)}
# the package's native classes ([`LLaDAModelLM`], [`DreamModel`]) have model types of their own
NATIVE_MODEL_TYPES = {"llada-native": "llada", "dream-native": "dream"}


@public
def get_diffusion_lm_adapter(model, adapter: "str | DiffusionLMAdapter | None" = None) -> DiffusionLMAdapter:
    """Choose the adapter of `model`: an adapter instance is used as is, a name (`"llada"`, `"dream"`,
    `"llada2"`, `"hf"`) builds that adapter, and `None` reads the model config.

    From the config: `model_type` `"llada"` (or `"llada-native"`, [`LLaDAModelLM`]) gives [`LLaDAAdapter`],
    `"dream"` (or `"dream-native"`, [`DreamModel`]) [`DreamAdapter`], a name starting with
    `"llada2"` [`LLaDA2Adapter`]; anything else gets [`HFLogitsAdapter`] with the config's `shift_logits`
    (default `False`).
    """
    if isinstance(adapter, DiffusionLMAdapter):
        return adapter
    config = getattr(model, "config", None)
    if adapter is not None:
        if adapter == "hf":
            return HFLogitsAdapter(shift_logits=bool(getattr(config, "shift_logits", False)))
        if adapter not in ADAPTERS:
            raise ValueError(
                f"`adapter` must be a DiffusionLMAdapter or one of {sorted([*ADAPTERS, 'hf'])}, got {adapter!r}."
            )
        return ADAPTERS[adapter]()
    model_type = str(getattr(config, "model_type", "")).lower()
    model_type = NATIVE_MODEL_TYPES.get(model_type, model_type)
    if model_type.startswith("llada2"):
        return LLaDA2Adapter()
    if model_type in ADAPTERS:
        return ADAPTERS[model_type]()
    return HFLogitsAdapter(shift_logits=bool(getattr(config, "shift_logits", False)))
