"""Multi-digit addition with the answer written most-significant digit first: a task where decoding order matters.

A problem is `"<a>+<b>="` with both operands zero-padded to `num_digits` digits; the answer is the sum, zero-padded
to `num_digits + 1` digits, most-significant digit first, followed by end-of-sequence tokens up to the generation
length. Written this way the first answer digit depends on every carry, so a left-to-right decoder must guess it;
a masked diffusion LM does best by committing the low digits first.

The split is fixed by a hash of the operand pair: about 1% of all pairs are test pairs, never seen in training.
"""

import torch


_HASH_MULTIPLIER = 2654435761  # Knuth's multiplicative hash
TEST_FRACTION_PER_MILLE = 10


def _is_test_pair(a: torch.Tensor, b: torch.Tensor, num_digits: int) -> torch.Tensor:
    index = a.to(torch.int64) * 10**num_digits + b.to(torch.int64)
    return (index * _HASH_MULTIPLIER) % (2**32) < (2**32 * TEST_FRACTION_PER_MILLE) // 1000


def addition_pairs(split: str, num_digits: int = 3) -> torch.LongTensor:
    """All operand pairs `(a, b)` of a split, shape `(n, 2)`, in a fixed order.

    Args:
        split (`str`): `"train"` or `"test"`.
        num_digits (`int`, defaults to 3): digits per operand (at most 4: the split enumerates all pairs).
    """
    if split not in ("train", "test"):
        raise ValueError(f"`split` must be 'train' or 'test', got {split!r}.")
    if not 1 <= num_digits <= 4:
        raise ValueError(f"`num_digits` must lie in [1, 4], got {num_digits!r}.")
    n = 10**num_digits
    a = torch.arange(n).repeat_interleave(n)
    b = torch.arange(n).repeat(n)
    test = _is_test_pair(a, b, num_digits)
    keep = test if split == "test" else ~test
    return torch.stack([a[keep], b[keep]], dim=1)


def draw_test_problems(num_problems: int, num_digits: int = 3, seed: int = 0) -> torch.LongTensor:
    """`num_problems` test pairs drawn without replacement by a seeded permutation, shape `(num_problems, 2)`."""
    pairs = addition_pairs("test", num_digits)
    if not 1 <= num_problems <= len(pairs):
        raise ValueError(f"`num_problems` must lie in [1, {len(pairs)}], got {num_problems!r}.")
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))
    return pairs[order[:num_problems]]


class AdditionTokens:
    """Token-id encoding of addition problems for a tokenizer that spells each digit, `+` and `=` as one token.

    Args:
        tokenizer: a tokenizer with `bos_token_id` and `eos_token_id` (e.g. `get_tiny_lm_tokenizer()`).
        num_digits (`int`, defaults to 3): digits per operand.
        gen_length (`int`, *optional*): answer length in tokens including the trailing EOS tokens
            (defaults to `num_digits + 1 + 4`).
    """

    def __init__(self, tokenizer, num_digits: int = 3, gen_length: int | None = None):
        self.num_digits = num_digits
        self.answer_digits = num_digits + 1
        self.gen_length = gen_length if gen_length is not None else self.answer_digits + 4
        if self.gen_length < self.answer_digits:
            raise ValueError(f"`gen_length` must be at least {self.answer_digits}, got {self.gen_length}.")
        ids = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789+="]
        if any(i is None or i == tokenizer.unk_token_id for i in ids):
            raise ValueError("the tokenizer must have single tokens for the digits, '+' and '='.")
        self.digit_ids = torch.tensor(ids[:10])
        self.plus_id, self.equals_id = ids[10], ids[11]
        self.bos_id, self.eos_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        self.prompt_length = 1 + 2 * num_digits + 2

    def _digits(self, values: torch.Tensor, width: int) -> torch.Tensor:
        powers = 10 ** torch.arange(width - 1, -1, -1)
        return self.digit_ids[(values.unsqueeze(1) // powers) % 10]

    def prompts(self, pairs: torch.LongTensor) -> torch.LongTensor:
        """Prompt ids `<bos> a + b =`, shape `(n, prompt_length)`."""
        n = len(pairs)
        return torch.cat(
            [
                torch.full((n, 1), self.bos_id),
                self._digits(pairs[:, 0], self.num_digits),
                torch.full((n, 1), self.plus_id),
                self._digits(pairs[:, 1], self.num_digits),
                torch.full((n, 1), self.equals_id),
            ],
            dim=1,
        )

    def answers(self, pairs: torch.LongTensor) -> torch.LongTensor:
        """Answer ids: the sum's digits, most significant first, then EOS; shape `(n, gen_length)`."""
        digits = self._digits(pairs[:, 0] + pairs[:, 1], self.answer_digits)
        eos = torch.full((len(pairs), self.gen_length - self.answer_digits), self.eos_id)
        return torch.cat([digits, eos], dim=1)
