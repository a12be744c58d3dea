"""Sampling graphs from a discrete graph flow model (DeFoG) by CTMC steps."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from diffusers import DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, logging

from ...data.graphs import dense_to_graphs
from ...schedulers.scheduling_discrete_flow_matching import _rand
from ...schedulers.scheduling_graph_discrete_flow import GraphDiscreteFlowScheduler
from ...utils import check_positive_int, is_int, public
from ..pipeline_utils import check_callback_tensor_inputs


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("networkx", "dense")


@public
@dataclass
class GraphFlowPipelineOutput(BaseOutput):
    """
    Output of [`GraphFlowPipeline`]. `B` graphs padded to `N` node slots.

    Args:
        graphs (`list[networkx.Graph]`, or `torch.LongTensor` of shape `(B, N, N)` with `output_type="dense"`): the
            generated graphs (node and edge attribute `"label"` = class), or their edge classes.
        node_classes (`torch.LongTensor` of shape `(B, N)`): node classes (0 on padding).
        edge_classes (`torch.LongTensor` of shape `(B, N, N)`): symmetric edge classes (0 = no edge).
        node_mask (`torch.BoolTensor` of shape `(B, N)`): real nodes.
        log_probs (`torch.Tensor` of shape `(B, num_inference_steps)`): the log-probability of every step taken.
    """

    graphs: Any
    node_classes: torch.LongTensor
    edge_classes: torch.LongTensor
    node_mask: torch.BoolTensor
    log_probs: torch.Tensor


@public
class GraphFlowPipeline(DiffusionPipeline):
    r"""
    Pipeline for unconditional graph generation with a discrete graph flow model (DeFoG / Graph-GRPO).

    This model inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    Parameters:
        model ([`GraphTransformerModel`]): predicts the clean classes; any module with
            `forward(node_classes, edge_classes, timestep, node_mask)` returning `.node_logits` `(B, N, S_X)` and
            `.edge_logits` `(B, N, N, S_E)`.
        scheduler ([`GraphDiscreteFlowScheduler`]): the noise, path, rate and time grid.
    """

    model_cpu_offload_seq = "model"
    _optional_components = []
    _callback_tensor_inputs = ["node_classes", "edge_classes", "node_logits", "edge_logits"]

    def __init__(self, model, scheduler: GraphDiscreteFlowScheduler):
        super().__init__()
        self.register_modules(model=model, scheduler=scheduler)

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def check_inputs(self, num_graphs, num_nodes, num_inference_steps, generator, output_type, tensor_inputs):
        """Validate the call before any model work; return the node counts as a list."""
        check_positive_int("num_graphs", num_graphs)
        check_positive_int("num_inference_steps", num_inference_steps)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, tensor_inputs)
        if isinstance(generator, list) and len(generator) != num_graphs:
            raise ValueError(f"`generator` is a list of {len(generator)}, but `num_graphs` is {num_graphs}.")
        if num_nodes is None:
            if self.scheduler.node_count_probs is None:
                raise ValueError(
                    "`num_nodes` is required: the scheduler has no `node_count_probs` to draw node counts from."
                )
            return None
        counts = [num_nodes] * num_graphs if is_int(num_nodes) else num_nodes
        if (
            not isinstance(counts, (list, tuple))
            or len(counts) != num_graphs
            or not all(is_int(n) and n >= 1 for n in counts)
        ):
            raise ValueError(
                f"`num_nodes` must be a positive int or a list of {num_graphs} positive ints, got {num_nodes!r}."
            )
        for name, ours, theirs in (
            ("num_node_classes", self.scheduler.config.num_node_classes, "num_node_classes"),
            ("num_edge_classes", self.scheduler.config.num_edge_classes, "num_edge_classes"),
        ):
            model_value = getattr(self.model.config, theirs, ours)
            if model_value != ours:
                raise ValueError(f"the model's `{name}` is {model_value} but the scheduler's is {ours}.")
        return list(counts)

    def _draw_node_counts(self, num_graphs, generator, device) -> list[int]:
        probs = self.scheduler.node_count_probs.double()
        cdf = probs.cumsum(0)
        u = _rand((num_graphs, 1), generator, "cpu").double().squeeze(-1) * cdf[-1]
        counts = torch.searchsorted(cdf, u).clamp(min=1, max=len(probs) - 1)
        return counts.tolist()

    @torch.no_grad()
    def __call__(
        self,
        num_graphs: int = 1,
        num_nodes: int | list[int] | None = None,
        num_inference_steps: int = 50,
        generator: torch.Generator | list[torch.Generator] | None = None,
        output_type: str = "networkx",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> GraphFlowPipelineOutput | tuple:
        r"""
        Generate graphs.

        Args:
            num_graphs (`int`, defaults to 1): number of graphs.
            num_nodes (`int` or `list[int]`, *optional*): node count of every graph (or one per graph); drawn from
                the scheduler's `node_count_probs` if not given.
            num_inference_steps (`int`, defaults to 50): CTMC steps; each is one model evaluation.
            generator (`torch.Generator` or a list of `num_graphs`, *optional*): randomness; with a list, graph `b`
                depends on `generator[b]` only (for a fixed padded size).
            output_type (`str`, defaults to `"networkx"`): `"networkx"` (a list of `networkx.Graph`; needs the
                `graphs` extra) or `"dense"` (the edge-class tensor).
            return_dict (`bool`, defaults to `True`): return a [`GraphFlowPipelineOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after
                every step; it may return replacements for `node_classes` and `edge_classes`.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): names among `_callback_tensor_inputs`
                passed to the callback (default `["node_classes", "edge_classes"]`).

        Returns:
            [`GraphFlowPipelineOutput`] or `(graphs, node_classes, edge_classes, node_mask, log_probs)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if callback_on_step_end_tensor_inputs is None:
            callback_on_step_end_tensor_inputs = ["node_classes", "edge_classes"]
        counts = self.check_inputs(
            num_graphs, num_nodes, num_inference_steps, generator, output_type, callback_on_step_end_tensor_inputs
        )
        if output_type == "networkx":
            from ...data.graphs import require_networkx

            require_networkx("output_type='networkx'")
        device = self._execution_device
        if counts is None:
            counts = self._draw_node_counts(num_graphs, generator, device)
        n_max = max(counts)
        node_mask = torch.arange(n_max, device=device).unsqueeze(0) < torch.tensor(counts, device=device).unsqueeze(1)
        X, E = self.scheduler.sample_noise(node_mask, generator)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        timesteps = self.scheduler.timesteps
        self._num_timesteps = len(timesteps)
        self._interrupt = False
        log_probs = torch.zeros(num_graphs, len(timesteps), device=device)
        with self.progress_bar(total=len(timesteps)) as progress_bar:
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    continue
                out = self.model(X, E, t.expand(num_graphs), node_mask)
                step = self.scheduler.step(out.node_logits, out.edge_logits, t, X, E, node_mask, generator)
                X, E = step.prev_node_classes, step.prev_edge_classes
                log_probs[:, i] = step.log_prob
                if callback_on_step_end is not None:
                    local_vars = {
                        "node_classes": X,
                        "edge_classes": E,
                        "node_logits": out.node_logits,
                        "edge_logits": out.edge_logits,
                    }
                    callback_kwargs = {k: local_vars[k] for k in callback_on_step_end_tensor_inputs}
                    callback_outputs = callback_on_step_end(self, i, t, callback_kwargs) or {}
                    X = callback_outputs.pop("node_classes", X)
                    E = callback_outputs.pop("edge_classes", E)
                progress_bar.update()

        self.maybe_free_model_hooks()
        graphs = dense_to_graphs(X, E, node_mask) if output_type == "networkx" else E
        if not return_dict:
            return (graphs, X, E, node_mask, log_probs)
        return GraphFlowPipelineOutput(
            graphs=graphs, node_classes=X, edge_classes=E, node_mask=node_mask, log_probs=log_probs
        )
