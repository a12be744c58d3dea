"""GraphFlowPipeline: the conformance suite, node counts, output types; GraphTransformerModel: symmetry,
permutation equivariance, masking and save/load."""

import pytest
import torch

from diffusers_ext import GraphDiscreteFlowScheduler, GraphFlowPipeline, GraphTransformerModel
from diffusers_ext.testing import PipelineConformanceTests, get_dummy_components


class TestGraphFlowPipelineConformance(PipelineConformanceTests):
    pipeline_class = GraphFlowPipeline


def _pipe():
    pipe = GraphFlowPipeline(**get_dummy_components(GraphFlowPipeline))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.support_cell("graph_flow", "pack")
def test_networkx_output_matches_dense_and_ragged_node_counts():
    pipe = _pipe()
    out = pipe(num_graphs=3, num_nodes=[4, 6, 5], num_inference_steps=3, generator=torch.Generator().manual_seed(0))
    assert [g.number_of_nodes() for g in out.graphs] == [4, 6, 5]
    assert out.node_mask.sum(1).tolist() == [4, 6, 5]
    for b, graph in enumerate(out.graphs):
        assert graph.number_of_edges() == int((out.edge_classes[b] > 0).sum()) // 2
    # padding stays empty
    assert int(out.edge_classes[0, 4:].sum()) == 0
    assert out.log_probs.shape == (3, 3) and bool((out.log_probs <= 0).all())


def test_node_counts_drawn_from_the_scheduler_distribution():
    components = get_dummy_components(GraphFlowPipeline)
    scheduler = GraphDiscreteFlowScheduler(edge_marginals=[0.7, 0.3], node_count_probs=[0, 0, 0, 0.5, 0.5])
    pipe = GraphFlowPipeline(model=components["model"], scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(num_graphs=20, num_inference_steps=1, generator=torch.Generator().manual_seed(0), output_type="dense")
    counts = set(out.node_mask.sum(1).tolist())
    assert counts == {3, 4}


def test_model_is_permutation_equivariant_symmetric_and_ignores_padding(tmp_path):
    torch.manual_seed(0)
    model = GraphTransformerModel.tiny(num_node_classes=2, num_edge_classes=3).eval()
    g = torch.Generator().manual_seed(1)
    X = torch.randint(0, 2, (2, 5), generator=g)
    E = torch.randint(0, 3, (2, 5, 5), generator=g).triu(1)
    E = E + E.transpose(1, 2)
    t = torch.tensor([0.2, 0.7])
    out = model(X, E, t)
    torch.testing.assert_close(out.edge_logits, out.edge_logits.transpose(1, 2))
    perm = torch.tensor([3, 0, 4, 1, 2])
    permuted = model(X[:, perm], E[:, perm][:, :, perm], t)
    torch.testing.assert_close(permuted.node_logits, out.node_logits[:, perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(permuted.edge_logits, out.edge_logits[:, perm][:, :, perm], atol=1e-5, rtol=1e-5)
    # a padded node changes nothing for the real ones
    Xp = torch.cat([X, torch.ones(2, 1, dtype=torch.long)], 1)
    Ep = torch.nn.functional.pad(E, (0, 1, 0, 1), value=1)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[:, -1] = False
    padded = model(Xp, Ep, t, mask)
    torch.testing.assert_close(padded.node_logits[:, :5], out.node_logits, atol=1e-5, rtol=1e-5)
    model.save_pretrained(tmp_path)
    loaded = GraphTransformerModel.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded(X, E, t).edge_logits, out.edge_logits)


@pytest.mark.parametrize(
    "kwargs,argument", [({"node_dim": 15}, "node_dim"), ({"num_edge_classes": 1}, "num_edge_classes")]
)
def test_model_bad_config(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        GraphTransformerModel(**{"num_heads": 2, **kwargs})
