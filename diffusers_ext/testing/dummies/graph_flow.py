"""Dummy setup of [`GraphFlowPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A tiny random graph transformer over unlabelled graphs (1 node class, 2 edge classes), 6 nodes, 4 CTMC steps.
"""

import torch

from ...models.graph_transformer import GraphTransformerModel
from ...pipelines.graph_flow.pipeline_graph_flow import GraphFlowPipeline
from ...schedulers.scheduling_graph_discrete_flow import GraphDiscreteFlowScheduler
from ..registry import BadInput, register_dummy_pipeline


def get_components(seed: int = 0) -> dict:
    """A seeded tiny `GraphTransformerModel` and a `GraphDiscreteFlowScheduler` with tree-like edge marginals."""
    scheduler = GraphDiscreteFlowScheduler(num_node_classes=1, num_edge_classes=2, edge_marginals=[0.7, 0.3])
    torch.manual_seed(seed)
    model = GraphTransformerModel.tiny(num_node_classes=1, num_edge_classes=2)
    return {"model": model.eval(), "scheduler": scheduler}


def get_inputs(seed: int = 0) -> dict:
    """One graph of 6 nodes in 4 steps, seeded generator, `"dense"` output."""
    return {
        "num_graphs": 1,
        "num_nodes": 6,
        "num_inference_steps": 4,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "dense",
    }


BAD_INPUTS = [
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"num_graphs": 0}, "num_graphs"),
    BadInput({"num_nodes": 0}, "num_nodes"),
    BadInput({"num_nodes": None}, "num_nodes"),
    BadInput({"num_nodes": [3, 4]}, "num_nodes"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["model"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    GraphFlowPipeline,
    get_components,
    get_inputs,
    output_types=("dense", "networkx"),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="edge_classes",
    batch_size_param="num_graphs",
)
