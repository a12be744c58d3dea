"""The reduced-width LLaDA and Dream models of the native-class and KV-cache parity fixtures.

Shared by `regenerate_llada_dream.py` (which copies these weights into LLaDA's and Dream's published modeling files
and records their outputs) and the tests (which rebuild the package's side): both sides see the same weights,
config keys and inputs. Each config is the published checkpoint's `config.json` (LLaDA-8B, Dream-7B) with the
same layer structure (MHA / GQA, untied head, LLaDA's larger embedding table in one case) at a reduced width.
"""

import torch

from diffusers_ext.models.dream import DreamConfig, DreamModel
from diffusers_ext.models.llada import LLaDAConfig, LLaDAModelLM


# LLaDA-8B's config.json at a reduced width (the keys that select a structure as published)
LLADA_8B_STRUCTURE = {
    "activation_type": "silu",
    "alibi": False,
    "attention_dropout": 0.0,
    "attention_layer_norm": False,
    "block_group_size": 1,
    "block_type": "llama",
    "embedding_dropout": 0.0,
    "flash_attention": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "input_emb_norm": False,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "residual_dropout": 0.0,
    "rms_norm_eps": 1e-05,
    "rope": True,
    "rope_full_precision": True,
    "rope_theta": 500000.0,
    "scale_logits": False,
    "weight_tying": False,
    "init_device": "cpu",
    "model_type": "llada",
    "architectures": ["LLaDAModelLM"],
}

CONFIGS = {
    # LLaDA-8B: 32 heads of 128, MHA, untied head, embedding_size == vocab_size
    "llada-8b": {
        "family": "llada",
        "config": {
            **LLADA_8B_STRUCTURE,
            "d_model": 64,
            "n_heads": 4,
            "n_kv_heads": 4,
            "n_layers": 2,
            "mlp_hidden_size": 96,
            "mlp_ratio": 4,
            "vocab_size": 128,
            "embedding_size": 128,
            "max_sequence_length": 256,
            "mask_token_id": 127,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
    },
    # the same with grouped-query attention and an embedding table larger than the vocabulary
    "llada-gqa": {
        "family": "llada",
        "config": {
            **LLADA_8B_STRUCTURE,
            "d_model": 64,
            "n_heads": 4,
            "n_kv_heads": 2,
            "n_layers": 3,
            "mlp_hidden_size": 80,
            "mlp_ratio": 4,
            "vocab_size": 120,
            "embedding_size": 128,
            "max_sequence_length": 256,
            "mask_token_id": 119,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
    },
    # Dream-7B: Qwen2.5-7B's 28 heads on 4 key/value heads (7:1), biased q/k/v, untied head, rope_theta 1e6
    "dream-7b": {
        "family": "dream",
        "config": {
            "architectures": ["DreamModel"],
            "model_type": "Dream",
            "hidden_act": "silu",
            "hidden_size": 56,
            "intermediate_size": 96,
            "num_attention_heads": 7,
            "num_key_value_heads": 1,
            "num_hidden_layers": 2,
            "max_position_embeddings": 256,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 2,
            "attention_dropout": 0.0,
            "vocab_size": 128,
            "mask_token_id": 127,
            "pad_token_id": 1,
            "bos_token_id": 1,
            "eos_token_id": 1,
        },
    },
}

NATIVE = {"llada": (LLaDAConfig, LLaDAModelLM), "dream": (DreamConfig, DreamModel)}


def native_config(name: str):
    """The package's config class built from the checkpoint-style config dict of `CONFIGS[name]`."""
    config_class, _ = NATIVE[CONFIGS[name]["family"]]
    return config_class(**CONFIGS[name]["config"])


def seeded_state_dict(model: torch.nn.Module, seed: int, std: float = 0.2) -> dict[str, torch.Tensor]:
    """Weights drawn from `seed` in the order of `model.state_dict()` (persistent tensors, by name): normal with
    `std`, norm weights `1 + std * normal`. Independent of the model's own initialisation."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * std
        state[name] = (1 + noise) if "norm" in name else noise
    return state


def build_native(name: str, seed: int = 0, dtype: torch.dtype = torch.float32, head_scale: float = 1.0):
    """The package's native model of `CONFIGS[name]` with [`seeded_state_dict`] weights, in eval mode; its output
    head multiplied by `head_scale` (sharper distributions, so that confidence thresholds are crossed)."""
    _, model_class = NATIVE[CONFIGS[name]["family"]]
    model = model_class(native_config(name))
    model.load_state_dict(seeded_state_dict(model, seed))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    return model.to(dtype).eval()


def fixed_inputs(name: str, batch: int = 2, length: int = 12, seed: int = 0) -> torch.LongTensor:
    """Token ids `(batch, length)` from `seed`, a quarter of them the config's mask token."""
    config = CONFIGS[name]["config"]
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, config["vocab_size"] - 1, (batch, length), generator=generator)
    masked = torch.rand(batch, length, generator=generator) < 0.25
    return ids.masked_fill(masked, config["mask_token_id"])
