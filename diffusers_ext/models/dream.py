"""Dream as a native `transformers` model: loads a Dream checkpoint folder (Dream-v0-Base-7B / -Instruct-7B: their
`config.json` keys and weight names) without running its own modeling code.

Dream is Qwen2.5 (grouped-query attention with biased query/key/value projections, RMSNorm, SwiGLU, rotary
positions) trained as a masked diffusion LM: it attends bidirectionally and keeps the autoregressive head it was
initialised from, so the logits at position `i` predict token `i + 1`. Its checkpoints use Qwen2's weight names, so
`transformers`' own Qwen2 layers load them as they are; the attention here is bidirectional (`is_causal=False`).
"""

from transformers import Qwen2Config, Qwen2ForCausalLM

from ..utils import public


@public
class DreamConfig(Qwen2Config):
    """Configuration of [`DreamModel`]: [`~transformers.Qwen2Config`] with Dream's defaults (Dream-7B) and its
    `mask_token_id`; a Dream checkpoint's `config.json` (`"model_type": "Dream"`) loads into it as it is.

    The `model_type` is `"dream-native"`, so that it never replaces the checkpoint's own class where its remote code
    is registered. `is_causal` is False (bidirectional attention) and `shift_logits` True (the prediction for
    position `j` is read at `j - 1`), which [`get_diffusion_lm_adapter`] reads.
    """

    model_type = "dream-native"

    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int | None = 4
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-6
    use_cache: bool = False
    mask_token_id: int = 151666
    pad_token_id: int | None = 151643
    bos_token_id: int | None = 151643
    eos_token_id: int | list[int] | None = 151643
    is_causal: bool = False
    shift_logits: bool = True

    def __post_init__(self, **kwargs):
        if self.rope_parameters is None:
            # Dream's config.json has the legacy `rope_theta` (1e6 for Dream-7B) and no `rope_parameters`
            theta = kwargs.pop("rope_theta", None) or getattr(self, "rope_theta", None) or 1000000.0
            self.rope_parameters = {"rope_type": "default", "rope_theta": float(theta)}
        super().__post_init__(**kwargs)


@public
class DreamModel(Qwen2ForCausalLM):
    """Dream, the masked diffusion LM of Ye et al. (2025), as a native `transformers` model.

    `DreamModel.from_pretrained("Dream-org/Dream-v0-Instruct-7B")` (or a local copy) loads the checkpoint's weights
    by their published names, with no `trust_remote_code`. Its logits equal those of Dream's published modeling file
    (`tests/parity/fixtures/llada_dream_models.json`: max abs difference <= 1e-5 in float32).

    It is [`~transformers.Qwen2ForCausalLM`] with bidirectional attention, so it has `transformers`'
    `logits_to_keep`, `past_key_values` ([`~transformers.Cache`]) and `attention_mask` handling (a 2-D padding mask,
    or Dream's 4-D boolean one).
    """

    config_class = DreamConfig
