"""The text condition of a [`DivideAndDenoisePipeline`] with text-conditioned denoisers: one prompt per agent."""


def encode_agent_prompts(tokenizer, text_encoder, prompts: list[str], negative_prompt: str | None, device) -> tuple:
    """Embeddings `(K, L, D)` of the `K` agents' prompts and `(1, L, D)` of the negative prompt (`""` if None), plus
    each prompt's token count (without start and end tokens), for the cross-attention utility's token positions."""
    texts = prompts + [negative_prompt or ""]
    tokens = tokenizer(
        texts, padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    )
    embeds = text_encoder(tokens.input_ids.to(device))[0]
    lengths = tokens.attention_mask.sum(dim=1)[:-1] - 2
    return embeds[:-1], embeds[-1:], lengths.tolist()
