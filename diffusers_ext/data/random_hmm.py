"""Sequences from a known random hidden Markov model (or Markov chain), a test bed with an exact likelihood."""

from dataclasses import dataclass

import numpy as np
import torch

from ..utils import check_positive_int


@dataclass(frozen=True)
class RandomHMM:
    """
    A hidden Markov model over `vocab_size` tokens with `num_states` hidden states.

    Attributes:
        initial (`np.ndarray` of shape `(H,)`): distribution of the first hidden state.
        transition (`np.ndarray` of shape `(H, H)`): `transition[a, b] = P(z_{i+1} = b | z_i = a)`.
        emission (`np.ndarray` of shape `(H, V)`): `emission[a, y] = P(x_i = y | z_i = a)`.
        length (`int`): sequence length `L`.
    """

    initial: np.ndarray
    transition: np.ndarray
    emission: np.ndarray
    length: int

    @property
    def num_states(self) -> int:
        return self.transition.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.emission.shape[1]

    @classmethod
    def random(
        cls,
        num_states: int,
        vocab_size: int,
        length: int,
        seed: int = 0,
        transition_concentration: float = 0.2,
        emission_concentration: float = 0.2,
    ) -> "RandomHMM":
        """Draw rows of the transition and emission matrices from symmetric Dirichlet distributions (small
        concentrations give peaked, strongly structured chains) and a uniform initial state."""
        for name, value in (("num_states", num_states), ("vocab_size", vocab_size), ("length", length)):
            if not isinstance(value, int) or value < (1 if name == "length" else 2):
                raise ValueError(f"`{name}` must be an int >= {1 if name == 'length' else 2}, got {value!r}.")
        for name, value in (
            ("transition_concentration", transition_concentration),
            ("emission_concentration", emission_concentration),
        ):
            if not value > 0:
                raise ValueError(f"`{name}` must be > 0, got {value!r}.")
        rng = np.random.default_rng(seed)
        transition = rng.dirichlet(np.full(num_states, transition_concentration), size=num_states)
        emission = rng.dirichlet(np.full(vocab_size, emission_concentration), size=num_states)
        return cls(np.full(num_states, 1.0 / num_states), transition, emission, length)

    @classmethod
    def random_markov_chain(
        cls, vocab_size: int, length: int, seed: int = 0, concentration: float = 0.2
    ) -> "RandomHMM":
        """A Markov chain over tokens (the hidden state is the token): Dirichlet rows, uniform first token."""
        hmm = cls.random(vocab_size, vocab_size, length, seed, concentration, 1.0)
        return cls(hmm.initial, hmm.transition, np.eye(vocab_size), length)

    def sample(self, num_samples: int, seed: int = 0) -> torch.LongTensor:
        """Draw `num_samples` sequences; returns a LongTensor of shape `(num_samples, length)`."""
        check_positive_int("num_samples", num_samples)
        rng = np.random.default_rng(seed)
        z = np.empty((num_samples, self.length), dtype=np.int64)
        z[:, 0] = rng.choice(self.num_states, size=num_samples, p=self.initial)
        cum_t = self.transition.cumsum(1)
        for i in range(1, self.length):
            u = rng.random(num_samples)[:, None]
            z[:, i] = np.minimum((u > cum_t[z[:, i - 1]]).sum(1), self.num_states - 1)
        cum_e = self.emission.cumsum(1)
        u = rng.random((num_samples, self.length))[..., None]
        x = np.minimum((u > cum_e[z]).sum(-1), self.vocab_size - 1)
        return torch.from_numpy(x.astype(np.int64))
