"""LLaDA as a native `transformers` model: loads a LLaDA checkpoint folder (LLaDA-8B-Base / -Instruct: their
`config.json` keys and weight names) without running its own modeling code.

LLaDA is a Llama-shaped transformer (RMSNorm, SwiGLU, rotary positions, no biases) that attends bidirectionally and
reads a masked position's prediction where it stands (no logit shift). Its published checkpoint keeps the OLMo-style
names (`model.transformer.blocks.N.q_proj`, `ff_proj`/`up_proj`/`ff_out`, `attn_norm`/`ff_norm`), which the modules
here reproduce so that the weights load by name. The layers are built from `transformers`' own pieces: its RMSNorm,
rotary embedding, attention functions and key/value [`~transformers.Cache`] interface, so that
a `cache` works as for any `transformers` decoder (the prefix and dual caches of [`DiffusionLMPipeline`]
use it).
"""

import torch
from torch import nn
from transformers import Cache, PreTrainedConfig, PreTrainedModel
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from ..utils import public


# the structure this class implements: the value of each LLaDA config key that selects a variant of the published
# code (OLMo's options), as every released LLaDA checkpoint sets it
SUPPORTED_STRUCTURE = {
    "block_type": "llama",
    "activation_type": "silu",
    "layer_norm_type": "rms",
    "rope": True,
    "alibi": False,
    "attention_layer_norm": False,
    "block_group_size": 1,
    "layer_norm_with_affine": True,
}


@public
class LLaDAConfig(PreTrainedConfig):
    """Configuration of [`LLaDAModelLM`], with the keys of LLaDA's published `config.json` (defaults: LLaDA-8B).

    A checkpoint's `config.json` (`"model_type": "llada"`) loads into it as it is; the `model_type` here is
    `"llada-native"`, so that it never replaces the checkpoint's own class where its remote code is registered.

    Args:
        d_model (`int`, defaults to 4096): hidden size.
        n_heads (`int`, defaults to 32): attention heads.
        n_kv_heads (`int`, *optional*): key/value heads (grouped-query attention); `n_heads` by default.
        n_layers (`int`, defaults to 32): transformer blocks.
        mlp_hidden_size (`int`, *optional*): the SwiGLU width; `mlp_ratio * d_model` by default.
        mlp_ratio (`int`, defaults to 4): see `mlp_hidden_size`.
        vocab_size (`int`, defaults to 126464): the tokenizer's vocabulary.
        embedding_size (`int`, *optional*): rows of the embedding and output head (>= `vocab_size`); `vocab_size`
            by default.
        max_sequence_length (`int`, defaults to 4096): the most positions (prompt plus generation).
        rope_theta (`float`, defaults to 500000): the rotary base.
        rms_norm_eps (`float`, defaults to 1e-5): the RMSNorm epsilon.
        weight_tying (`bool`, defaults to False): the output head shares the input embedding.
        include_bias (`bool`, defaults to False): biases on every linear layer.
        include_qkv_bias (`bool`, defaults to False): biases on the query, key and value projections.
        input_emb_norm (`bool`, defaults to False): scale the input embeddings by `sqrt(d_model)`.
        scale_logits (`bool`, defaults to False): divide the logits by `sqrt(d_model)`.
        mask_token_id (`int`, defaults to 126336): the `[MASK]` token.
        kwargs: the other keys of the published config (`block_type`, `activation_type`, ...): those that select a
            structure must hold the value every LLaDA checkpoint uses (`SUPPORTED_STRUCTURE`), otherwise a
            `ValueError` names the key; the rest (initialisation, dropout, precision) are kept and unused.
    """

    model_type = "llada-native"
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
        "max_position_embeddings": "max_sequence_length",
    }

    def __init__(
        self,
        d_model: int = 4096,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        n_layers: int = 32,
        mlp_hidden_size: int | None = 12288,
        mlp_ratio: int = 4,
        vocab_size: int = 126464,
        embedding_size: int | None = 126464,
        max_sequence_length: int = 4096,
        rope_theta: float = 500000.0,
        rms_norm_eps: float = 1e-5,
        weight_tying: bool = False,
        include_bias: bool = False,
        include_qkv_bias: bool = False,
        input_emb_norm: bool = False,
        scale_logits: bool = False,
        mask_token_id: int = 126336,
        pad_token_id: int = 126081,
        eos_token_id: int = 126081,
        **kwargs,
    ):
        for key, supported in SUPPORTED_STRUCTURE.items():
            value = kwargs.get(key, supported)
            if value is None and key == "block_group_size":
                value = 1
            if value != supported:
                raise ValueError(
                    f"LLaDAConfig: `{key}` {value!r} is not supported; LLaDAModelLM implements LLaDA's released "
                    f"structure ({key}={supported!r})."
                )
        if d_model % n_heads:
            raise ValueError(f"LLaDAConfig: `d_model` {d_model} must be divisible by `n_heads` {n_heads}.")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"LLaDAConfig: `n_heads` {n_heads} must be a multiple of `n_kv_heads` {n_kv_heads}.")
        if embedding_size is not None and embedding_size < vocab_size:
            raise ValueError(
                f"LLaDAConfig: `embedding_size` {embedding_size} must be at least `vocab_size` {vocab_size}."
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.n_layers = n_layers
        self.mlp_ratio = mlp_ratio
        self.mlp_hidden_size = mlp_hidden_size if mlp_hidden_size is not None else mlp_ratio * d_model
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.max_sequence_length = max_sequence_length
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.weight_tying = weight_tying
        self.include_bias = include_bias
        self.include_qkv_bias = include_qkv_bias
        self.input_emb_norm = input_emb_norm
        self.scale_logits = scale_logits
        self.mask_token_id = mask_token_id
        # what transformers' rotary embedding and attention functions read
        self.head_dim = d_model // n_heads
        self.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
        self.attention_dropout = 0.0
        self.is_causal = False
        kwargs.pop("use_cache", None)  # LLaDA's config carries `use_cache: false`; a diffusion forward takes none
        kwargs.setdefault("tie_word_embeddings", weight_tying)
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, **kwargs)


class LLaDABlock(nn.Module):
    """One LLaDA block (the published `LLaDALlamaBlock`): `x + attn_out(Attention(attn_norm(x)))`, then
    `x + ff_out(silu(ff_proj(h)) * up_proj(h))` with `h = ff_norm(x)`; bidirectional attention with rotary
    positions. Module names as in LLaDA's checkpoints."""

    def __init__(self, config: LLaDAConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.n_heads // config.n_kv_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        qkv_bias = config.include_bias or config.include_qkv_bias
        self.attn_norm = LlamaRMSNorm(config.d_model, eps=config.rms_norm_eps)
        self.q_proj = nn.Linear(config.d_model, config.d_model, bias=qkv_bias)
        self.k_proj = nn.Linear(config.d_model, config.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(config.d_model, config.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.attn_out = nn.Linear(config.d_model, config.d_model, bias=config.include_bias)
        self.ff_norm = LlamaRMSNorm(config.d_model, eps=config.rms_norm_eps)
        self.ff_proj = nn.Linear(config.d_model, config.mlp_hidden_size, bias=config.include_bias)
        self.up_proj = nn.Linear(config.d_model, config.mlp_hidden_size, bias=config.include_bias)
        self.ff_out = nn.Linear(config.mlp_hidden_size, config.d_model, bias=config.include_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
    ) -> torch.Tensor:
        """`hidden_states` `(B, T, d_model)` -> `(B, T, d_model)`; `cache.update` supplies the keys and
        values of the positions outside the `T` given (all positions attend to all)."""
        batch, length, _ = hidden_states.shape
        h = self.attn_norm(hidden_states)
        query = self.q_proj(h).view(batch, length, -1, self.head_dim).transpose(1, 2)
        key = self.k_proj(h).view(batch, length, -1, self.head_dim).transpose(1, 2)
        value = self.v_proj(h).view(batch, length, -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, _ = attention(self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling, is_causal=False)
        hidden_states = hidden_states + self.attn_out(out.reshape(batch, length, -1))
        h = self.ff_norm(hidden_states)
        return hidden_states + self.ff_out(nn.functional.silu(self.ff_proj(h)) * self.up_proj(h))


class LLaDATransformer(nn.Module):
    """The published `LLaDAModel`'s module tree: `transformer.{wte, blocks, ln_f, ff_out}`."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        rows = config.embedding_size or config.vocab_size
        modules = {
            "wte": nn.Embedding(rows, config.d_model),
            "blocks": nn.ModuleList(LLaDABlock(config, i) for i in range(config.n_layers)),
            "ln_f": LlamaRMSNorm(config.d_model, eps=config.rms_norm_eps),
        }
        if not config.weight_tying:
            modules["ff_out"] = nn.Linear(config.d_model, rows, bias=config.include_bias)
        self.transformer = nn.ModuleDict(modules)


@public
class LLaDAModelLM(PreTrainedModel):
    """LLaDA, the masked diffusion LM of Nie et al. (2025), as a native `transformers` model.

    `LLaDAModelLM.from_pretrained("GSAI-ML/LLaDA-8B-Instruct")` (or a local copy) loads the checkpoint's weights
    by their published names, with no `trust_remote_code`. Its logits equal those of LLaDA's published modeling file
    (`tests/parity/fixtures/llada_dream_models.json`: max abs difference <= 1e-5 in float32).

    Differences from the published file, all additions: `logits_to_keep` (the output head at some positions only),
    `cache` (a `transformers` [`~transformers.Cache`]: keys and values of positions not in `input_ids`),
    `position_ids`, and an `attention_mask` that is honoured (LLaDA's file ignores it: its padded positions are
    attended to). The output head is computed over `embedding_size` rows as published.
    """

    config_class = LLaDAConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDABlock"]
    _supports_sdpa = True
    _supports_attention_backend = True
    # a tied head (`weight_tying`) is the embedding itself, used as a linear map: there is no `ff_out` to tie
    _tied_weights_keys = {}

    def __init__(self, config: LLaDAConfig):
        super().__init__(config)
        self.model = LLaDATransformer(config)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.transformer.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.transformer.wte = value

    def get_output_embeddings(self) -> nn.Module:
        transformer = self.model.transformer
        return transformer.wte if self.config.weight_tying else transformer.ff_out

    def _init_weights(self, module):
        # LLaDA's own initialisation (normal, std 0.02) for built-from-config models; checkpoints overwrite it
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, LlamaRMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, LlamaRotaryEmbedding):
            inv_freq, _ = module.compute_default_rope_parameters(module.config)
            module.inv_freq.copy_(inv_freq)
            module.original_inv_freq.copy_(inv_freq)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.LongTensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits `(B, T, embedding_size)` of `input_ids` `(B, T)` (or `inputs_embeds` `(B, T, d_model)`).

        Args:
            attention_mask (`torch.Tensor`, *optional*): `(B, S)` with 1 for the keys to attend to and 0 for
                padding, where `S` counts the cached positions too; or a 4-D `(B, 1, T, S)` boolean mask.
            position_ids (`torch.LongTensor`, *optional*): `(B, T)` or `(1, T)`; by default the `T` positions after
                the cache's `get_seq_length()`.
            cache ([`~transformers.Cache`], *optional*): supplies the keys and values of the positions outside
                `input_ids` through `update` (which also receives those of `input_ids`); `past_key_values`, its
                name before transformers 5.20, is accepted too.
            use_cache (`bool`, *optional*): accepted for the `transformers` calling convention; the cache is used
                when given, whatever its value.
            logits_to_keep (`int` or `torch.LongTensor`): `0` for every position, `k > 0` for the last `k`, or a
                1-D tensor of the positions whose logits are computed (the output head runs there alone).
        """
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("LLaDAModelLM: pass exactly one of `input_ids` and `inputs_embeds`.")
        transformer = self.model.transformer
        hidden = transformer.wte(input_ids) if inputs_embeds is None else inputs_embeds
        if self.config.input_emb_norm:
            hidden = hidden * self.config.d_model**0.5
        if position_ids is None:
            start = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(start, start + hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden, attention_mask=attention_mask, cache=cache
        )
        position_embeddings = self.rotary_emb(hidden, position_ids)
        for block in transformer.blocks:
            hidden = block(hidden, position_embeddings, mask, cache)
        if isinstance(logits_to_keep, int):
            hidden = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        else:
            hidden = hidden[:, logits_to_keep]
        hidden = transformer.ln_f(hidden)
        if self.config.weight_tying:  # the embedding matrix as the output head
            logits = nn.functional.linear(hidden, transformer.wte.weight)
        else:
            logits = transformer.ff_out(hidden)
        if self.config.scale_logits:
            logits = logits / self.config.d_model**0.5
        return CausalLMOutputWithPast(logits=logits, cache=cache)
