"""A character-level tokenizer (one token per character of a fixed alphabet) built locally, no download."""

from transformers import PreTrainedTokenizerFast


CHAR_SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|mask|>")


def build_char_tokenizer(alphabet: str, model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """A `PreTrainedTokenizerFast` with `<|pad|>` 0, `<|bos|>` 1, `<|eos|>` 2, `<|mask|>` 3, then one token per
    character of `alphabet` in order; decoding concatenates characters. Padding is on the left (batched prompts).

    Args:
        alphabet (`str`): the characters, each once.
        model_max_length (`int`, defaults to 512): the default maximum length.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"`alphabet` must be a non-empty string, got {alphabet!r}.")
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"`alphabet` must not repeat characters, got {alphabet!r}.")
    vocab = {token: i for i, token in enumerate([*CHAR_SPECIAL_TOKENS, *alphabet])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    pad, bos, eos, mask = CHAR_SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        bos_token=bos,
        eos_token=eos,
        mask_token=mask,
        model_max_length=model_max_length,
        padding_side="left",
    )
