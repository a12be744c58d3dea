"""Input preparation of [`DiffusionLMPipeline`]: prompts (text, chat messages or ids) to left-padded ids, and the
decoding options a scheduler declares (see `schedulers.scheduling_utils.DiffusionLMSchedulerMixin`)."""

import torch


# options a scheduler may ignore without changing what a caller asked for: the noise layout, the block length (the
# pipeline itself confines each step to the current block), and where a scheduler computes its proposals (a cost
# choice: the commits are the same)
IGNORABLE_OPTIONS = ("sample_offset", "block_length", "proposal_positions")


def declared_options(scheduler, declared: str, **options) -> dict:
    """The `options` the scheduler declares in its class attribute `declared` (`"step_options"` or
    `"set_timesteps_options"`). An option it does not declare raises a `ValueError` naming it when the caller set it
    (not `None`, empty or `False`), so a decoding option is never dropped silently; `IGNORABLE_OPTIONS` are dropped."""
    accepted = getattr(scheduler, declared, ())
    unsupported = [
        name
        for name, value in options.items()
        if name not in accepted and name not in IGNORABLE_OPTIONS and value not in (None, (), False)
    ]
    if unsupported:
        raise ValueError(
            f"{type(scheduler).__name__} does not support the decoding option(s) {unsupported}; use a SOARScheduler."
        )
    return {name: value for name, value in options.items() if name in accepted}


def _characters_outside_vocabulary(tokenizer, texts: list[str]) -> list[str]:
    """The characters of `texts` (outside the tokenizer's added tokens, e.g. `<|bos|>`) that the tokenizer cannot
    encode on their own, in order of first appearance."""
    added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    unknown = []
    for text in texts:
        for token in added:
            text = text.replace(token, "")
        for character in dict.fromkeys(text):
            if character in unknown:
                continue
            try:
                tokenizer(character, add_special_tokens=False)
            except Exception:  # the `tokenizers` backend raises a plain Exception (WordLevel without [UNK])
                unknown.append(character)
    return unknown


def encode_texts(tokenizer, texts: list[str], name: str = "prompt") -> tuple[torch.LongTensor, torch.LongTensor]:
    """Left-padded ids and attention mask `(batch, length)` of `texts` (the argument `name` of the call); a
    character the tokenizer's vocabulary lacks (a character-level tokenizer without an unknown token) raises a
    `ValueError` naming it."""
    if tokenizer is None:
        raise ValueError("`prompt` and `messages` need a tokenizer; pass `input_ids` instead.")
    try:
        encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    except Exception as error:  # `tokenizers` raises a plain Exception for text outside a vocabulary without [UNK]
        unknown = _characters_outside_vocabulary(tokenizer, texts)
        if not unknown:
            raise
        raise ValueError(
            f"`{name}` holds the character(s) {unknown}, which the tokenizer's vocabulary does not contain (and it "
            "has no unknown token); use only characters of the model's alphabet."
        ) from error
    return encoded["input_ids"], encoded["attention_mask"]


def prepare_input_ids(
    tokenizer, prompt, messages, input_ids, attention_mask, add_generation_prompt: bool
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """The left-padded prompt ids `(batch, length)` and attention mask from exactly one of `prompt` (text),
    `messages` (chat, rendered with the tokenizer's template) or `input_ids` (with an optional mask); errors name
    the argument."""
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
        ids, mask = encode_texts(tokenizer, list(prompts))
    elif messages is not None:
        if tokenizer is None:
            raise ValueError("`messages` need a tokenizer with a chat template.")
        conversations = messages if messages and isinstance(messages[0], (list, tuple)) else [messages]
        if not conversations or any(len(c) == 0 for c in conversations):
            raise ValueError(f"`messages` must hold non-empty conversations, got {messages!r}.")
        texts = [
            tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt, tokenize=False)
            for c in conversations
        ]
        ids, mask = encode_texts(tokenizer, texts, "messages")
    else:
        ids = torch.as_tensor(input_ids)
        if ids.ndim == 1:
            ids = ids.unsqueeze(0)
        if ids.ndim != 2 or ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"`input_ids` must be an integer tensor of shape (batch, length), got {tuple(ids.shape)} {ids.dtype}."
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
