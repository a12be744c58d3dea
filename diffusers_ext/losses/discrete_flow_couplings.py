"""Minibatch couplings of source and data sequences for discrete flow matching.

An optimal-transport coupling pairs each data sequence `x1` of a minibatch with a source sequence `x0` of the same
minibatch so that the total cost `sum_b c(x0_b, x1_b)` is smallest. On mixture paths the expected number of jumps is
proportional to this cost when `c` is the Hamming distance, so OT pairs need fewer jumps (arXiv:2411.00759).
The assignment is solved exactly with scipy's `linear_sum_assignment`; the source marginal is unchanged (the
minibatch's sources are only permuted).
"""

import torch


COUPLINGS = ("independent", "hamming_ot", "embedding_ot")


def coupling_cost(
    x0: torch.LongTensor, x1: torch.LongTensor, coupling: str, embedding_weight: torch.Tensor | None = None
) -> torch.Tensor:
    """
    The cost matrix `C[b, a] = c(x0_a, x1_b)` of shape `(B, B)`.

    Args:
        x0 (`torch.LongTensor` of shape `(B, L)`): source sequences.
        x1 (`torch.LongTensor` of shape `(B, L)`): data sequences.
        coupling (`str`): `"hamming_ot"` (number of differing positions) or `"embedding_ot"` (sum over positions
            of squared L2 distances between token embeddings).
        embedding_weight (`torch.Tensor` of shape `(num_embeddings, D)`, *optional*): the token embeddings,
            required by `"embedding_ot"` (e.g. the model's input embedding table).
    """
    if x0.shape != x1.shape or x0.ndim != 2:
        raise ValueError(f"`x0` and `x1` must both have shape (B, L); got {tuple(x0.shape)} and {tuple(x1.shape)}.")
    if coupling == "hamming_ot":
        # L minus the number of agreeing positions, counted by one matrix product of one-hot codes
        num_classes = int(max(x0.max(), x1.max())) + 1
        h0 = torch.nn.functional.one_hot(x0, num_classes).flatten(1).float()
        h1 = torch.nn.functional.one_hot(x1, num_classes).flatten(1).float()
        return x0.shape[1] - h1 @ h0.T
    if coupling == "embedding_ot":
        if embedding_weight is None:
            raise ValueError("`embedding_weight` is required for coupling 'embedding_ot'.")
        weight = embedding_weight.detach().float()
        e0 = weight[x0].reshape(x0.shape[0], -1)
        e1 = weight[x1].reshape(x1.shape[0], -1)
        return torch.cdist(e1, e0).pow(2)
    raise ValueError(f"`coupling` must be 'hamming_ot' or 'embedding_ot' for a cost, got {coupling!r}.")


def couple(
    x0: torch.LongTensor,
    x1: torch.LongTensor,
    coupling: str = "independent",
    embedding_weight: torch.Tensor | None = None,
) -> torch.LongTensor:
    """
    Reorder the sources `x0` (shape `(B, L)`) so that row `b` is paired with `x1[b]` under `coupling`.

    `"independent"` returns `x0` unchanged; `"hamming_ot"` and `"embedding_ot"` solve the minibatch assignment
    problem for [`coupling_cost`].
    """
    if coupling not in COUPLINGS:
        raise ValueError(f"`coupling` must be one of {COUPLINGS}, got {coupling!r}.")
    if coupling == "independent":
        return x0
    from scipy.optimize import linear_sum_assignment

    cost = coupling_cost(x0, x1, coupling, embedding_weight)
    _, columns = linear_sum_assignment(cost.cpu().numpy())
    return x0[torch.as_tensor(columns, device=x0.device)]
