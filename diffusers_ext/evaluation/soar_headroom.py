"""Headroom diagnostics for decoding-order search on a masked diffusion LM (benchmark use only).

Before a search decoder such as SOAR can beat greedy decoding on a task, two things must hold:

(a) some decoding order solves the problem: `oracle_order_search` looks for one. It decodes one token per step,
    committing at each step only positions whose proposed (argmax) token is right according to the answer key, and
    keeps up to `beam_size` distinct partial sequences (most confident first). A problem counts as solved when one
    of them completes; this is a lower bound on the fraction that some order solves (a larger beam finds more).
(b) the search objective prefers right answers: `score_search` runs position beam search with a wide beam under
    SOAR's own score (the sum of the committed tokens' probabilities), the closest tractable stand-in for an
    exhaustive search under that score. If its accuracy is not above greedy decoding's, a better search of that
    score cannot help.
"""

import torch


@torch.no_grad()
def oracle_order_search(
    logits_fn,
    prompts: torch.LongTensor,
    answers: torch.LongTensor,
    mask_token_id: int,
    beam_size: int = 4,
    batch_size: int = 256,
) -> torch.BoolTensor:
    """Whether an answer-guided decoding order reproduces each answer exactly (one token per step, argmax tokens).

    Args:
        logits_fn: `logits_fn(sequences (N, P + G)) -> (N, P + G, V)` aligned logits (no shift).
        prompts (`torch.LongTensor` of shape `(B, P)`): prompts (no padding).
        answers (`torch.LongTensor` of shape `(B, G)`): the right generated tokens.
        mask_token_id (`int`): the mask token.
        beam_size (`int`, defaults to 4): distinct partial sequences kept per problem.
        batch_size (`int`, defaults to 256): problems per forward batch.

    Returns:
        `torch.BoolTensor` of shape `(B,)`.
    """
    solved = []
    for start in range(0, len(prompts), batch_size):
        solved.append(
            _oracle_batch(
                logits_fn,
                prompts[start : start + batch_size],
                answers[start : start + batch_size],
                mask_token_id,
                beam_size,
            )
        )
    return torch.cat(solved)


def _oracle_batch(logits_fn, prompts, answers, mask_token_id, beam_size):
    num, prompt_length = prompts.shape
    gen_length = answers.shape[1]
    x = torch.cat([prompts, torch.full((num, gen_length), mask_token_id, dtype=torch.long)], 1)
    owner = torch.arange(num)
    solved = torch.zeros(num, dtype=torch.bool)
    for _ in range(gen_length):
        if len(x) == 0:
            break
        logits = logits_fn(x)[:, prompt_length:].float()
        probs = torch.softmax(logits, -1)
        conf, tokens = probs.max(-1)
        masked = x[:, prompt_length:] == mask_token_id
        good = masked & (tokens == answers[owner])
        conf = torch.where(good, conf, torch.full_like(conf, -1.0))
        children_x, children_owner, children_conf = [], [], []
        for problem in torch.unique(owner).tolist():
            rows = (owner == problem).nonzero(as_tuple=True)[0]
            candidates = []
            for row in rows.tolist():
                for position in torch.nonzero(conf[row] >= 0, as_tuple=True)[0].tolist():
                    candidates.append((float(conf[row, position]), row, position))
            candidates.sort(key=lambda c: -c[0])
            seen = set()
            for value, row, position in candidates:
                child = x[row].clone()
                child[prompt_length + position] = tokens[row, position]
                key = tuple(child.tolist())
                if key in seen:
                    continue
                seen.add(key)
                children_x.append(child)
                children_owner.append(problem)
                children_conf.append(value)
                if len(seen) == beam_size:
                    break
        if not children_x:
            break
        x = torch.stack(children_x)
        owner = torch.tensor(children_owner, dtype=torch.long)
        complete = ~(x[:, prompt_length:] == mask_token_id).any(1)
        solved[owner[complete]] = True
        keep = ~solved[owner]
        x, owner = x[keep], owner[keep]
    return solved
