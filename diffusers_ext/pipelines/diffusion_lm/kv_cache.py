"""Fast-dLLM's block-wise key/value caches for masked diffusion LMs: the prefix cache and the dual cache.

A masked diffusion LM reruns the whole sequence at every step. Within a block of semi-autoregressive decoding,
the positions outside the block change little (the prompt and finished blocks not at all, the masked suffix stays
masked), so their keys and values can be computed once, when the block starts, and reused by every later step of
the block (Wu et al., 2025, "Fast-dLLM"):

- **prefix cache**: the keys and values of everything before the block are reused; each step runs the block and
  everything after it;
- **dual cache**: those of everything outside the block are reused (the prefix and the masked suffix); each step
  runs the block alone.

Both are approximate for a bidirectional model (the cached positions would have attended to the block's new
tokens) and exact for a block-causal one (LLaDA2: earlier blocks never see later ones).

The model side is `transformers`' own cache interface: a [`~transformers.Cache`] whose `update` returns the keys
and values of the whole sequence, given those of the positions the forward runs ([`BlockWindowLayer`]). Any model
whose attention calls `cache.update` takes it: the package's [`LLaDAModelLM`] and [`DreamModel`], and
`transformers`' decoders (Llama, Qwen2, ...).
"""

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .adapters import DiffusionLMAdapter, _forward_takes, model_logits


CACHE_MODES = ("prefix", "dual")


class BlockWindowLayer(DynamicLayer):
    """One attention layer's keys and values outside the window a forward runs.

    `update(keys, values)` receives the window's keys and values `(B, H, T, D)` and returns those of the whole
    sequence, `cat(before, window, after)` along the positions; nothing is stored, so every forward of a block
    sees the keys cached when the block started. Without `before` (a refresh forward), the layer records what it
    receives (`keys`, `values`) and returns it unchanged.

    Args:
        before (`tuple[torch.Tensor, torch.Tensor]`, *optional*): keys and values `(B, H, S, D)` of the positions
            before the window.
        after (`tuple[torch.Tensor, torch.Tensor]`, *optional*): those after it (the dual cache's suffix).
    """

    def __init__(self, before=None, after=None):
        super().__init__()
        self.before = before
        self.after = after

    def update(self, key_states, value_states, *args, **kwargs):
        if self.before is None:  # recording: the forward runs the whole sequence
            self.keys, self.values, self.is_initialized = key_states, value_states, True
            return key_states, value_states
        keys = [self.before[0], key_states] + ([self.after[0]] if self.after is not None else [])
        values = [self.before[1], value_states] + ([self.after[1]] if self.after is not None else [])
        return torch.cat(keys, dim=-2), torch.cat(values, dim=-2)

    def get_seq_length(self) -> int:
        # the window's first position: transformers' default position ids start here
        return 0 if self.before is None else self.before[0].shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        after = 0 if self.after is None else self.after[0].shape[-2]
        return self.get_seq_length() + query_length + after, 0


def model_cache_keyword(model) -> str | None:
    """The keyword `model`'s forward takes a [`~transformers.Cache`] under (`"cache"` in transformers >= 5.20,
    `"past_key_values"` before), or `None` when it takes none.

    A model running its own modeling code (LLaDA's and Dream's published files: `trust_remote_code`) is refused
    (`None`): their `past_key_values` is a list of tuples with Fast-dLLM's own conventions, not a `Cache`; the
    package's native [`LLaDAModelLM`] / [`DreamModel`] load the same checkpoints.
    """
    from .remote_code import is_remote_code_model

    if not isinstance(model, torch.nn.Module) or is_remote_code_model(model):
        return None
    for keyword in ("cache", "past_key_values"):
        if _forward_takes(type(model), keyword):
            return keyword
    return None


class DiffusionLMKVCache:
    """The prefix or dual cache of a [`DiffusionLMPipeline`] call: per row (beam), the keys and values of its
    sequence as they were when its current block started, and the block they were computed for.

    [`logits`] replaces the adapter's forward: rows that entered a new block run the whole sequence (their
    keys and values are recorded: the refresh), the others run their window with the cached keys and values, one
    forward per group of rows sharing a window. Beams are reordered with [`select`] after every step, so a child
    beam keeps its parent's cache.

    Args:
        mode (`str`): `"prefix"` or `"dual"`.
        cache_keyword (`str`): the keyword the model takes a cache under ([`model_cache_keyword`]).
        absolute_blocks (`bool`): the model is block-causal and runs up to the current block's end (LLaDA2): the
            window ends there and nothing after it is cached (the dual cache is then the prefix cache).
    """

    def __init__(self, mode: str, cache_keyword: str, absolute_blocks: bool = False):
        self.mode = mode
        self.cache_keyword = cache_keyword
        self.absolute_blocks = absolute_blocks
        self.keys: list[torch.Tensor] | None = None  # per layer (N, H, L, D)
        self.values: list[torch.Tensor] | None = None
        self.block: torch.LongTensor | None = None  # (N,) the block each row's cache was computed for, -1 none

    def select(self, index: torch.LongTensor) -> None:
        """Keep rows `index` `(N',)` (beam parents, unfinished prompts), in that order."""
        if self.block is None:
            return
        if len(index) == len(self.block) and bool((index == torch.arange(len(index), device=index.device)).all()):
            return  # every row keeps its own (no beams, nothing finished): no copy
        self.block = self.block[index]
        self.keys = [k[index] for k in self.keys]
        self.values = [v[index] for v in self.values]

    def _store(self, rows: torch.LongTensor, recorder: Cache, num_rows: int, length: int) -> None:
        layers = recorder.layers
        if self.keys is None:
            self.keys = [
                layer.keys.new_zeros(num_rows, layer.keys.shape[1], length, layer.keys.shape[3]) for layer in layers
            ]
            self.values = [
                layer.values.new_zeros(num_rows, layer.values.shape[1], length, layer.values.shape[3])
                for layer in layers
            ]
            self.block = torch.full((num_rows,), -1, dtype=torch.long, device=rows.device)
        for stored_k, stored_v, layer in zip(self.keys, self.values, layers):
            recorded = layer.keys.shape[-2]  # LLaDA2's window ends at the block's end
            stored_k[rows, :, :recorded] = layer.keys
            stored_v[rows, :, :recorded] = layer.values

    @torch.no_grad()
    def logits(
        self,
        adapter: DiffusionLMAdapter,
        model,
        input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor,
        current_block: torch.LongTensor,
        block_of: torch.LongTensor,
        block_end: int,
        positions: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        """The step's logits, aligned as the adapter aligns them.

        Args:
            input_ids (`torch.LongTensor` of shape `(N, L)`): the rows.
            attention_mask (`torch.LongTensor` of shape `(N, L)`): 1 for real tokens, 0 for left padding.
            current_block (`torch.LongTensor` of shape `(N,)`): each row's current block.
            block_of (`torch.LongTensor` of shape `(L,)`): the block of each position (-1 in the prompt).
            block_end (`int`): the end of the furthest current block (the window of block-causal models).
            positions (`torch.LongTensor` of shape `(K,)`, *optional*): the aligned positions wanted.

        Returns:
            `torch.Tensor` of shape `(N, L, V)` (or `(N, K, V)` at `positions`), with the logits of a row outside its
            window zero (they are never eligible: a row commits only in its current block).
        """
        num_rows, length = input_ids.shape
        stale = current_block != self.block if self.block is not None else torch.ones_like(current_block, dtype=bool)
        pieces = []  # (rows, logits (R, K or L, V))
        if bool(stale.any()):
            rows = stale.nonzero(as_tuple=True)[0]
            recorder = Cache(layer_class_to_replicate=BlockWindowLayer)
            logits = adapter(
                model,
                input_ids[rows],
                attention_mask[rows],
                block_end=block_end,
                positions=positions,
                model_kwargs={self.cache_keyword: recorder, "use_cache": True},
            )
            self._store(rows, recorder, num_rows, length)
            self.block[rows] = current_block[rows]
            pieces.append((rows, logits))
        fresh = ~stale
        for block in torch.unique(current_block[fresh]).tolist():
            rows = (fresh & (current_block == block)).nonzero(as_tuple=True)[0]
            pieces.append(
                (
                    rows,
                    self._window_logits(
                        adapter, model, input_ids, attention_mask, rows, block, block_of, block_end, positions
                    ),
                )
            )
        if len(pieces) == 1:  # one forward served every row, in order
            return pieces[0][1]
        vocab = pieces[0][1].shape[-1]
        out = pieces[0][1].new_zeros(num_rows, length if positions is None else positions.numel(), vocab)
        for rows, logits in pieces:
            out[rows] = logits
        return out

    def _window_logits(self, adapter, model, input_ids, attention_mask, rows, block, block_of, block_end, positions):
        """The aligned logits of `rows` (all in `block`) from a forward of their window with the cached keys."""
        length = input_ids.shape[1]
        in_block = (block_of == block).nonzero(as_tuple=True)[0]
        start, end = int(in_block[0]), int(in_block[-1]) + 1
        shift = 1 if adapter.shift_logits else 0
        # a shifted model predicts position p at p - 1: the window starts one earlier
        first = start - shift
        if self.absolute_blocks:
            last = block_end
        else:
            last = end if self.mode == "dual" else length
        if len(rows) == len(self.block):  # all rows: views, no copy
            keys, values = self.keys, self.values
        else:
            keys = [k[rows] for k in self.keys]
            values = [v[rows] for v in self.values]
        cache = Cache(
            layers=[
                BlockWindowLayer(
                    before=(k[:, :, :first], v[:, :, :first]),
                    after=(k[:, :, last:], v[:, :, last:]) if last < length and not self.absolute_blocks else None,
                )
                for k, v in zip(keys, values)
            ]
        )
        key_end = last if self.absolute_blocks else length
        kwargs = {self.cache_keyword: cache, "use_cache": True}
        kwargs.update(adapter.window_inputs(attention_mask[rows], first, last, key_end))
        window = input_ids[rows, first:last]
        # aligned position p of the window comes from model position p - shift
        aligned = torch.arange(first + shift, last, device=input_ids.device)
        if positions is None:
            logits = model_logits(model, window, None, **kwargs)
            out = logits.new_zeros(len(rows), length, logits.shape[-1])
            out[:, aligned] = logits[:, : last - first - shift]
            return out
        inside = (positions >= first + shift) & (positions < last)
        # (a row always has a masked position in its current block, so `inside` is never empty)
        logits = model_logits(model, window, positions[inside] - shift - first, **kwargs)
        out = logits.new_zeros(len(rows), positions.numel(), logits.shape[-1])
        out[:, inside] = logits
        return out
