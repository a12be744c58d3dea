"""Tokenizers built in code (no hub access): byte-level CLIP, T5-style Unigram and the byte-level tokenizer of the
masked diffusion LMs.

They are what the tiny components of [`~diffusers_ext.models.tiny_components`] and the zoo's small models use; the
test kit re-exports them as ``diffusers_ext.testing.get_tiny_*_tokenizer``.
"""

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import CLIPTokenizer, PreTrainedTokenizerFast, T5TokenizerFast


__all__ = ["get_tiny_clip_tokenizer", "get_tiny_lm_tokenizer", "get_tiny_t5_tokenizer"]


# Whole-word pieces of the tiny T5 vocabulary; every other word falls back to single characters.
_T5_WORDS = (
    "a an the of and in on with at to is are photo picture painting image cat dog bird car house tree red green "
    "blue white black small large sitting standing"
).split()


def _byte_alphabet() -> list[str]:
    """The 256 characters byte-level BPE uses to spell bytes, sorted by code point."""
    return sorted(pre_tokenizers.ByteLevel.alphabet())


def get_tiny_clip_tokenizer(model_max_length: int = 77) -> CLIPTokenizer:
    """Build a byte-level CLIP tokenizer in code: every byte, alone and word-final (`"x</w>"`), and no merges.

    It tokenizes any text (one token per byte, lowercased like CLIP), pads with `<|endoftext|>` and has 514 tokens:
    ids 0-511 are the bytes, 512 is `<|startoftext|>`, 513 is `<|endoftext|>`.

    Args:
        model_max_length (`int`, defaults to 77): the padded prompt length that diffusers pipelines use.
    """
    alphabet = _byte_alphabet()
    vocab = {char: i for i, char in enumerate(alphabet)}
    vocab.update({char + "</w>": len(alphabet) + i for i, char in enumerate(alphabet)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=model_max_length)


def get_tiny_t5_tokenizer(model_max_length: int = 256) -> T5TokenizerFast:
    """Build a T5-style Unigram tokenizer in code: a few dozen whole words plus every printable ASCII character.

    Case is kept and any ASCII text round-trips (`decode(encode(text), skip_special_tokens=True) == text` up to
    whitespace normalisation); other characters map to `<unk>`. Ids: `<pad>` 0, `</s>` 1, `<unk>` 2.

    Args:
        model_max_length (`int`, defaults to 256): the default maximum length.
    """
    pieces: dict[str, float] = {"<pad>": 0.0, "</s>": 0.0, "<unk>": 0.0, "\u2581": -2.0}
    for word in _T5_WORDS:
        pieces.setdefault("\u2581" + word, -3.0)
    for char in string.printable:
        if not char.isspace():
            pieces.setdefault(char, -5.0)
            pieces.setdefault("\u2581" + char, -5.5)
    return T5TokenizerFast(vocab=list(pieces.items()), extra_ids=0, model_max_length=model_max_length)


_LM_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def get_tiny_lm_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """Build the byte-level tokenizer of the tiny diffusion-LM stand-ins: one token per byte, no merges.

    Any text round-trips exactly. Special tokens come first: `<|pad|>` 0, `<|bos|>` 1, `<|eos|>` 2, `<|mask|>` 3,
    `<|im_start|>` 4, `<|im_end|>` 5, then the 256 bytes (262 tokens). Padding is on the left, as batched prompts
    for generation want. The chat template renders
    `<|bos|><|im_start|>user\\n{content}<|im_end|>\\n...<|im_start|>assistant\\n`.

    Args:
        model_max_length (`int`, defaults to 512): the default maximum length.
    """
    specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|mask|>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials + _byte_alphabet())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        mask_token="<|mask|>",
        extra_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=_LM_CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="left",
    )
