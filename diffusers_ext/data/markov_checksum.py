"""A known random Markov chain with checksum tokens: sequences whose exact likelihood is computable and whose best
generation order is not left to right.

A sequence has `num_blocks` blocks of `1 + block_size` tokens over `num_symbols` symbols. Each block starts with a
checksum and then holds `block_size` data tokens. The data tokens of all blocks form one Markov chain (a random
initial distribution and transition matrix, rows drawn from a Dirichlet). The checksum of a block is the sum of its
data tokens modulo `num_symbols` with probability `1 - noise`, else a uniform symbol. Generating a block's data first
and its checksum last needs only the chain's transitions and a sum; generating the checksum first forces every later
data token to satisfy a modular constraint. The exact log-likelihood lives in `diffusers_ext.evaluation.lomdm`.
"""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class MarkovChecksumSource:
    """The generative process (its parameters are a function of `seed`).

    Args:
        num_symbols (`int`, defaults to 8): symbols; the alphabet is the first `num_symbols` lowercase letters.
        block_size (`int`, defaults to 3): data tokens per block.
        num_blocks (`int`, defaults to 4): blocks per sequence.
        noise (`float`, defaults to 0.1): probability that a checksum is a uniform symbol instead of the sum.
        concentration (`float`, defaults to 0.3): Dirichlet concentration of the chain's rows (smaller: sparser).
        seed (`int`, defaults to 0): seed of the chain's parameters.
    """

    num_symbols: int = 8
    block_size: int = 3
    num_blocks: int = 4
    noise: float = 0.1
    concentration: float = 0.3
    seed: int = 0

    def __post_init__(self):
        if not 2 <= self.num_symbols <= 26:
            raise ValueError(f"`num_symbols` must lie in [2, 26], got {self.num_symbols}.")
        if self.block_size < 1 or self.num_blocks < 1:
            raise ValueError(f"`block_size` and `num_blocks` must be >= 1, got {self.block_size}, {self.num_blocks}.")
        if not 0.0 < self.noise <= 1.0:
            raise ValueError(f"`noise` must lie in (0, 1], got {self.noise}.")
        if self.concentration <= 0:
            raise ValueError(f"`concentration` must be > 0, got {self.concentration}.")
        rng = np.random.default_rng(self.seed)
        self.initial = rng.dirichlet(np.full(self.num_symbols, self.concentration))
        self.transition = rng.dirichlet(np.full(self.num_symbols, self.concentration), size=self.num_symbols)

    @property
    def alphabet(self) -> str:
        return "abcdefghijklmnopqrstuvwxyz"[: self.num_symbols]

    @property
    def length(self) -> int:
        return self.num_blocks * (1 + self.block_size)

    @property
    def checksum_positions(self) -> list[int]:
        return [b * (1 + self.block_size) for b in range(self.num_blocks)]

    @property
    def data_positions(self) -> list[int]:
        checksums = set(self.checksum_positions)
        return [i for i in range(self.length) if i not in checksums]

    def sample(self, num_sequences: int, seed: int) -> torch.LongTensor:
        """`num_sequences` sequences of symbol indices, shape `(num_sequences, length)`, from `seed`."""
        rng = np.random.default_rng(seed)
        n, v = num_sequences, self.num_symbols
        data = np.empty((n, self.num_blocks * self.block_size), dtype=np.int64)
        cumulative = np.cumsum(self.transition, axis=1)
        data[:, 0] = rng.choice(v, size=n, p=self.initial)
        for k in range(1, data.shape[1]):
            u = rng.random(n)[:, None]
            data[:, k] = np.minimum((u > cumulative[data[:, k - 1]]).sum(1), v - 1)
        blocks = data.reshape(n, self.num_blocks, self.block_size)
        checksum = blocks.sum(-1) % v
        noisy = rng.random((n, self.num_blocks)) < self.noise
        checksum = np.where(noisy, rng.integers(0, v, size=(n, self.num_blocks)), checksum)
        out = np.concatenate([checksum[..., None], blocks], axis=-1).reshape(n, self.length)
        return torch.from_numpy(out)

    def to_text(self, sequences: torch.LongTensor) -> list[str]:
        """Symbol indices `(N, length)` to strings over `alphabet`."""
        return ["".join(self.alphabet[int(i)] for i in row) for row in sequences]
