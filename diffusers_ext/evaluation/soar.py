"""A training-free "perfect" masked LM: exact conditional marginals of known Markov chains.

Decoding quality can be measured independently of training with it: the model is exact, so whatever a decoder loses
is the decoder's doing, and the joint log-likelihood of the decoded sequence under the chain scores it.
"""

from types import SimpleNamespace

import torch
from transformers.modeling_outputs import MaskedLMOutput


class MarkovChainOracleLM(torch.nn.Module):
    """Exact marginals `p(x_i | unmasked tokens)` of a batch of Markov chains, computed by forward-backward.

    Vocabulary: ids `0..K-1` are the chain states, `K..K+C-1` name the chain (one token per chain), `K+C` is the
    mask. A sequence is `[chain token, x_0, ..., x_{n-1}]`: position 0 picks the chain, masked positions get the
    log posterior of their state given every unmasked state (logits of other tokens are -1e4), unmasked positions
    a one-hot. No logit shift; `model(input_ids).logits` like a transformers model.

    Args:
        transitions (`torch.Tensor` of shape `(C, K, K)`): row-stochastic transition matrices.
        initial (`torch.Tensor` of shape `(C, K)`): initial state distributions.
    """

    def __init__(self, transitions: torch.Tensor, initial: torch.Tensor):
        super().__init__()
        if transitions.ndim != 3 or transitions.shape[1] != transitions.shape[2]:
            raise ValueError(f"`transitions` must have shape (C, K, K), got {tuple(transitions.shape)}.")
        if initial.shape != transitions.shape[:2]:
            raise ValueError(f"`initial` must have shape {tuple(transitions.shape[:2])}, got {tuple(initial.shape)}.")
        self.register_buffer("transitions", transitions.to(torch.float64))
        self.register_buffer("initial", initial.to(torch.float64))
        num_chains, num_states = initial.shape
        self.num_states, self.num_chains = num_states, num_chains
        self.config = SimpleNamespace(
            vocab_size=num_states + num_chains + 1,
            mask_token_id=num_states + num_chains,
            model_type="markov_chain_oracle",
            shift_logits=False,
            eos_token_id=None,
        )

    @property
    def device(self) -> torch.device:
        return self.transitions.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @classmethod
    def random(cls, num_chains: int, num_states: int, concentration: float = 1.0, seed: int = 0):
        """Chains with Dirichlet(`concentration`) transition rows and initial distributions, seeded."""
        generator = torch.Generator().manual_seed(seed)
        gamma = torch.distributions.Gamma(torch.tensor(float(concentration)), torch.tensor(1.0))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
            draws = gamma.sample((num_chains, num_states + 1, num_states)).to(torch.float64) + 1e-12
        draws = draws / draws.sum(-1, keepdim=True)
        return cls(draws[:, 1:], draws[:, 0])

    def chain_token(self, chain: torch.Tensor) -> torch.Tensor:
        return chain + self.num_states

    def _split(self, input_ids: torch.LongTensor):
        chain = input_ids[:, 0] - self.num_states
        if bool(((chain < 0) | (chain >= self.num_chains)).any()):
            raise ValueError("position 0 of every sequence must be a chain token.")
        return chain, input_ids[:, 1:]

    def forward(self, input_ids: torch.LongTensor, attention_mask=None, position_ids=None) -> MaskedLMOutput:
        chain, states = self._split(input_ids)
        batch, length = states.shape
        k = self.num_states
        transitions, initial = self.transitions[chain], self.initial[chain]
        masked = states == self.config.mask_token_id
        evidence = torch.nn.functional.one_hot(states.clamp(max=k - 1), k).to(torch.float64)
        evidence = torch.where(masked.unsqueeze(-1), torch.ones_like(evidence), evidence)

        alpha = torch.empty(batch, length, k, dtype=torch.float64, device=input_ids.device)
        current = initial * evidence[:, 0]
        alpha[:, 0] = current / current.sum(-1, keepdim=True)
        for i in range(1, length):
            current = torch.bmm(alpha[:, i - 1 : i], transitions).squeeze(1) * evidence[:, i]
            alpha[:, i] = current / current.sum(-1, keepdim=True)
        beta = torch.ones_like(alpha)
        for i in range(length - 2, -1, -1):
            current = torch.bmm(transitions, (evidence[:, i + 1] * beta[:, i + 1]).unsqueeze(-1)).squeeze(-1)
            beta[:, i] = current / current.sum(-1, keepdim=True)
        posterior = alpha * beta
        posterior = posterior / posterior.sum(-1, keepdim=True)

        logits = torch.full(
            (batch, length + 1, self.config.vocab_size), -1e4, dtype=torch.float32, device=input_ids.device
        )
        logits[:, 1:, :k] = torch.log(posterior.clamp_min(1e-300)).clamp_min(-1e4).to(torch.float32)
        logits[torch.arange(batch), 0, input_ids[:, 0]] = 0.0
        return MaskedLMOutput(logits=logits)

    def joint_log_likelihood(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """`log p(x_0, ..., x_{n-1})` of complete sequences `[chain token, x_0, ...]` under their chains."""
        chain, states = self._split(input_ids)
        if bool((states >= self.num_states).any()):
            raise ValueError("`input_ids` must be complete sequences of chain states (no mask).")
        transitions, initial = self.transitions[chain], self.initial[chain]
        rows = torch.arange(len(states), device=states.device)
        loglik = torch.log(initial[rows, states[:, 0]])
        for i in range(1, states.shape[1]):
            loglik = loglik + torch.log(transitions[rows, states[:, i - 1], states[:, i]])
        return loglik

    def viterbi(self, input_ids: torch.LongTensor) -> torch.LongTensor:
        """The most likely completion of each sequence (masked positions filled), for reference."""
        chain, states = self._split(input_ids)
        batch, length = states.shape
        k = self.num_states
        log_t, log_init = torch.log(self.transitions[chain]), torch.log(self.initial[chain])
        masked = states == self.config.mask_token_id
        evidence = torch.nn.functional.one_hot(states.clamp(max=k - 1), k).to(torch.float64)
        log_evidence = torch.where(masked.unsqueeze(-1), torch.zeros_like(evidence), torch.log(evidence))
        score = log_init + log_evidence[:, 0]
        back = []
        for i in range(1, length):
            candidates = score.unsqueeze(-1) + log_t
            score, arg = candidates.max(1)
            score = score + log_evidence[:, i]
            back.append(arg)
        path = [score.argmax(-1)]
        for arg in reversed(back):
            path.append(arg.gather(1, path[-1].unsqueeze(1)).squeeze(1))
        return torch.cat([input_ids[:, :1], torch.stack(path[::-1], dim=1)], dim=1)
