"""A bidirectional `transformers` Llama, the denoiser of the pack's small masked diffusion LMs."""


def build_bidirectional_llama(
    tokenizer,
    max_length: int,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 512,
    vocab_size: int | None = None,
    tie_word_embeddings: bool = True,
):
    """A `LlamaForCausalLM` with causal masking off (`is_causal=False`) whose logits are read without a shift
    (`shift_logits=False`), like LLaDA; the special token ids come from `tokenizer`, which must define a mask token.

    Args:
        tokenizer: the tokenizer (its length is the vocabulary).
        max_length (`int`): the longest sequence (prompt included).
        hidden_size, num_layers, num_heads, intermediate_size (`int`): the transformer's size.
        vocab_size (`int`, *optional*): the embedding and output size; `len(tokenizer)` by default (a larger one
            sizes a model as a real checkpoint's, e.g. for cost measurements, with the tokenizer's special ids).
        tie_word_embeddings (`bool`, defaults to True): share the input embedding with the output head.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if tokenizer.mask_token_id is None:
        raise ValueError("`tokenizer` must define a mask token for a masked diffusion LM.")
    if hidden_size % num_heads:
        raise ValueError(f"`hidden_size` {hidden_size} must be divisible by `num_heads` {num_heads}.")
    config = LlamaConfig(
        vocab_size=len(tokenizer) if vocab_size is None else vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_length,
        tie_word_embeddings=tie_word_embeddings,
        use_cache=False,
        is_causal=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id,
        shift_logits=False,
    )
    return LlamaForCausalLM(config)
