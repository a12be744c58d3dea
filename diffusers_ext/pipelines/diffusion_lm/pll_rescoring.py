"""Re-scoring of completed beams by pseudo-log-likelihood (`beam_score="pll"` of the SOAR scheduler)."""

import torch

from ...utils import check_positive_int


# probes (candidate x generated position) per forward of the rescoring, by default: the logits of one forward are
# `(chunk, L, V)` in the model's dtype (2 GiB at LLaDA-8B's vocabulary, 512 positions and bf16)
DEFAULT_PLL_CHUNK_SIZE = 16


def pseudo_log_likelihoods(
    adapter, model, sequences, attention, prompt_length, mask_id, chunk_size=DEFAULT_PLL_CHUNK_SIZE
) -> torch.Tensor:
    """The pseudo-log-likelihood `sum_j log p(x_j | x without j)` over the generated positions `j >= prompt_length`
    of each row of `sequences` `(R, L)`, shape `(R,)` in float32.

    The `R * (L - prompt_length)` probes (a row with one generated position masked) go through the model
    `chunk_size` at a time, and only the probed position's logits `(chunk, V)` are kept from each forward (then a
    float32 log-softmax over those): the peak is one chunk's logits, not the `(probes, L, V)` of all probes.
    """
    check_positive_int("pll_chunk_size", chunk_size)
    num_rows, length = sequences.shape
    gen_length = length - prompt_length
    device = sequences.device
    total = torch.zeros(num_rows * gen_length, dtype=torch.float32, device=device)
    for start in range(0, num_rows * gen_length, chunk_size):
        probe = torch.arange(start, min(start + chunk_size, num_rows * gen_length), device=device)
        row, position = torch.div(probe, gen_length, rounding_mode="floor"), probe % gen_length + prompt_length
        probes = sequences[row]
        targets = probes[torch.arange(len(probe), device=device), position]
        probes[torch.arange(len(probe), device=device), position] = mask_id
        logits = adapter(model, probes, attention[row], block_end=length)
        picked = logits[torch.arange(len(probe), device=device), position]  # (chunk, V)
        del logits
        log_probs = torch.log_softmax(picked.float(), -1)
        total[probe] = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return total.view(num_rows, gen_length).sum(1)


def rescore_by_pll(
    adapter,
    model,
    x,
    groups,
    first,
    done,
    best,
    prompt_attention,
    prompt_length,
    mask_id,
    nfe,
    row_forwards,
    chunk_size=DEFAULT_PLL_CHUNK_SIZE,
) -> torch.LongTensor:
    """`beam_score="pll"`: among the complete beams of each finishing prompt, keep the one with the highest
    pseudo-log-likelihood `sum_j log p(x_j | x without j)` over the generated positions (see
    [`pseudo_log_likelihoods`]; the probes go through the model `chunk_size` at a time).

    The rescoring is one batched evaluation of all candidates (each masked at one generated position per row),
    split into chunks for memory: it adds 1 to the prompt's NFE whatever `chunk_size`, and `candidates *
    gen_length` to its row forwards. A prompt with one complete beam costs nothing. Returns `best` with the chosen
    beams' generated tokens.
    """
    gen_length = x.shape[1] - prompt_length
    finishing = groups[first][done]
    complete = ~(x[:, prompt_length:] == mask_id).any(1)
    candidates = torch.isin(groups, finishing) & complete
    counts = torch.bincount(groups[candidates], minlength=int(groups.max()) + 1)
    candidates &= counts[groups] > 1
    rows = candidates.nonzero(as_tuple=True)[0]
    if len(rows) == 0:
        return best
    pll = pseudo_log_likelihoods(
        adapter, model, x[rows], prompt_attention[groups[rows]], prompt_length, mask_id, chunk_size
    )
    rescored = torch.unique(groups[rows]).cpu()
    nfe[rescored] += 1
    row_forwards += gen_length * torch.bincount(groups[rows].cpu(), minlength=len(nfe))
    best = best.clone()
    for group in torch.unique(groups[rows]).tolist():
        members = rows[groups[rows] == group]
        scores = pll[groups[rows] == group]
        winner = members[int(torch.argmax(scores))]  # ties keep the earlier (path-best) beam
        best_index = (groups[first] == group).nonzero(as_tuple=True)[0]
        best[best_index] = x[winner, prompt_length:]
    return best
