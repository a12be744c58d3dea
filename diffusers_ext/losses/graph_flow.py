"""The DeFoG training loss of a discrete graph flow model: cross-entropy on nodes plus `lambda_edges` times
cross-entropy on the free edge pairs, at times drawn from the scheduler's training distribution."""

import torch


def graph_flow_loss(
    model,
    scheduler,
    node_classes: torch.LongTensor,
    edge_classes: torch.LongTensor,
    node_mask: torch.BoolTensor,
    generator: torch.Generator | None = None,
    lambda_edges: float = 5.0,
) -> torch.Tensor:
    """Noise clean graphs `(B, N)`, `(B, N, N)` (mask `(B, N)`) to `G_t` with `scheduler.add_noise` and score the
    model's prediction of the clean classes: mean node CE over real nodes + `lambda_edges` * mean edge CE over the
    pairs `i < j` of real nodes. Returns a scalar."""
    B, N = node_classes.shape
    t = scheduler.sample_training_times(B, generator, node_classes.device)
    X_t, E_t = scheduler.add_noise(node_classes, edge_classes, t, node_mask, generator)
    out = model(X_t, E_t, t, node_mask)
    node_loss = torch.nn.functional.cross_entropy(out.node_logits[node_mask].float(), node_classes[node_mask])
    upper = torch.ones(N, N, dtype=torch.bool, device=node_mask.device).triu(1)
    pairs = node_mask.unsqueeze(1) & node_mask.unsqueeze(2) & upper
    edge_loss = torch.nn.functional.cross_entropy(out.edge_logits[pairs].float(), edge_classes[pairs])
    return node_loss + lambda_edges * edge_loss
