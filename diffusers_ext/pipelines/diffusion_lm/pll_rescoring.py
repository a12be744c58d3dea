"""Re-scoring of completed beams by pseudo-log-likelihood (`beam_score="pll"` of the SOAR scheduler)."""

import torch


def rescore_by_pll(
    adapter, model, x, groups, first, done, best, prompt_attention, prompt_length, mask_id, nfe, row_forwards
) -> torch.LongTensor:
    """`beam_score="pll"`: among the complete beams of each finishing prompt, keep the one with the highest
    pseudo-log-likelihood `sum_j log p(x_j | x without j)` over the generated positions.

    One batched forward scores all candidates (each masked at one generated position per row): it adds 1 to the
    prompt's NFE and `candidates * gen_length` to its row forwards. A prompt with one complete beam costs
    nothing. Returns `best` with the chosen beams' generated tokens.
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
    probes = x[rows].repeat_interleave(gen_length, 0)
    position = torch.arange(gen_length, device=x.device).repeat(len(rows)) + prompt_length
    probes[torch.arange(len(probes), device=x.device), position] = mask_id
    attention = prompt_attention[groups[rows]].repeat_interleave(gen_length, 0)
    logits = adapter(model, probes, attention, block_end=x.shape[1])
    log_probs = torch.log_softmax(logits.float(), -1)
    picked = log_probs[torch.arange(len(probes), device=x.device), position]
    targets = x[rows].repeat_interleave(gen_length, 0)[torch.arange(len(probes), device=x.device), position]
    pll = picked.gather(-1, targets.unsqueeze(-1)).squeeze(-1).view(len(rows), gen_length).sum(1)
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
