"""The registry of dummy pipeline setups: how to build a tiny working setup of each pipeline class, and its calls.

Every pipeline class of the package registers itself in ``diffusers_ext/testing/dummies/<method>.py`` with
[`register_dummy_pipeline`]; those modules are imported on the first registry miss, so a lookup also works in a
fresh interpreter.
"""

import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from diffusers import DiffusionPipeline


# The package whose modules register the package's pipelines (one module per method).
DUMMIES_PACKAGE = "diffusers_ext.testing.dummies"

IMAGE_OUTPUT_TYPES = ("pil", "np", "pt", "latent")
# Text pipelines return token ids (`"seq"`, compared like arrays) and optionally decoded strings (`"text"`).
TEXT_OUTPUT_TYPES = ("seq", "text")
# Graph pipelines return dense class tensors (`"dense"`, compared like arrays) and optionally networkx graphs.
GRAPH_OUTPUT_TYPES = ("dense", "networkx")


class BadInput(NamedTuple):
    """A bad call for [`PipelineConformanceTests`]: `overrides` replace dummy inputs, and the pipeline must raise a
    `ValueError` or `TypeError` whose message contains `argument`, before any model forward."""

    overrides: dict[str, Any]
    argument: str


@dataclass(frozen=True)
class DummyPipelineSpec:
    """How to build a tiny working setup of one pipeline class; made by [`register_dummy_pipeline`].

    Attributes:
        pipeline_class (`type`): the registered `DiffusionPipeline` subclass.
        components_fn (`Callable[[int], dict]`): `components_fn(seed)` gives the constructor's keyword arguments.
        inputs_fn (`Callable[[int], dict]`): `inputs_fn(seed)` gives one call's keyword arguments (one image).
        batch_params (`tuple[str, ...]`): per-image arguments, concatenated to make a batch.
        output_types (`tuple[str, ...]`): supported `output_type` values: image types among `"pil"`, `"np"`, `"pt"`,
            `"latent"`, or token types among `"seq"`, `"text"` (a text pipeline); never both kinds.
        bad_inputs (`tuple[BadInput, ...]`): bad calls and the argument each error message must name.
        callback_edit_tensor (`str`): the callback tensor whose replacement must change the output.
        batch_size_param (`str`, *optional*): an int argument that sets the number of images (e.g.
            `num_images_per_prompt`), for pipelines whose per-image arguments are not lists; 1 in single inputs.
        module (`str`): the module that registered the entry; a fresh interpreter imports it before lookups.
        ragged_inputs_fn (`Callable[[int], dict]`, *optional*): like `inputs_fn`, but the per-image arguments of
            different seeds differ in size (prompts of different lengths, scenes with different view counts),
            given as one-element lists so that a batch joins them.
    """

    pipeline_class: type[DiffusionPipeline]
    components_fn: Callable[[int], dict[str, Any]]
    inputs_fn: Callable[[int], dict[str, Any]]
    batch_params: tuple[str, ...] = ()
    output_types: tuple[str, ...] = ("pil", "np", "pt", "latent")
    bad_inputs: tuple[BadInput, ...] = ()
    callback_edit_tensor: str = "latents"
    batch_size_param: str | None = None
    module: str = ""
    ragged_inputs_fn: Callable[[int], dict[str, Any]] | None = None

    @property
    def is_text(self) -> bool:
        """Whether the pipeline generates token sequences (its output types are `"seq"`/`"text"`)."""
        return set(self.output_types) <= set(TEXT_OUTPUT_TYPES)

    @property
    def is_graph(self) -> bool:
        """Whether the pipeline generates graphs (its output types are `"dense"`/`"networkx"`)."""
        return set(self.output_types) <= set(GRAPH_OUTPUT_TYPES)

    @property
    def comparison_output_type(self) -> str:
        """The `output_type` of the dummy inputs: `"np"` for image pipelines, `"seq"` for text pipelines, `"dense"`
        for graph pipelines."""
        return "seq" if self.is_text else "dense" if self.is_graph else "np"


_REGISTRY: dict[type, DummyPipelineSpec] = {}
_discovered = False


def register_dummy_pipeline(
    pipeline_class: type[DiffusionPipeline],
    components_fn: Callable[[int], dict[str, Any]],
    inputs_fn: Callable[[int], dict[str, Any]],
    *,
    batch_params: Sequence[str] = (),
    output_types: Sequence[str] = ("pil", "np", "pt", "latent"),
    bad_inputs: Sequence[BadInput | tuple[dict[str, Any], str]] = (),
    callback_edit_tensor: str = "latents",
    batch_size_param: str | None = None,
    ragged_inputs_fn: Callable[[int], dict[str, Any]] | None = None,
) -> DummyPipelineSpec:
    """Register how to build a tiny, fast setup of `pipeline_class` for tests and the conformance suite.

    Call it at import time of the method's ``diffusers_ext/testing/dummies/<method>.py`` (imported automatically on
    the first lookup of an unregistered class, in this process or a fresh one). Registering a class again replaces
    its entry.

    Args:
        pipeline_class (`type`): a `DiffusionPipeline` subclass.
        components_fn (`Callable[[int], dict]`): `components_fn(seed)` returns the keyword arguments of
            `pipeline_class(...)`, with weights seeded by `seed`.
        inputs_fn (`Callable[[int], dict]`): `inputs_fn(seed)` returns the keyword arguments of one call making ONE
            image (or sample), with `generator=torch.Generator("cpu").manual_seed(seed)`, `output_type="np"` (a text
            pipeline: `output_type="seq"`, whose first output is the token ids) and a small `num_inference_steps`.
        batch_params (`Sequence[str]`, defaults to `()`): the per-image arguments. A batch of two is made from the
            inputs for two seeds: these arguments are concatenated (tensors along dim 0, lists joined, other values
            listed), `generator` becomes the list of both generators, and every other argument must be equal.
        output_types (`Sequence[str]`, defaults to all four image types): the `output_type` values the pipeline
            supports: among `"pil"`, `"np"`, `"pt"` and `"latent"` for an image pipeline, or among `"seq"` (token
            ids first) and `"text"` (token ids and decoded strings) for a text pipeline, which must support `"seq"`.
        bad_inputs (`Sequence[BadInput]`): bad calls, each an `(overrides, argument)` pair: the pipeline must raise a
            `ValueError`/`TypeError` naming `argument` before any model forward.
        callback_edit_tensor (`str`, defaults to `"latents"`): a name in `_callback_tensor_inputs` that a
            `callback_on_step_end` may replace; replacing it with zeros at the last step must change the output.
        batch_size_param (`str`, *optional*): for pipelines whose batch is a count rather than a list of per-image
            arguments (every image composes the same prompts, say): the int argument giving the number of images,
            e.g. `"num_images_per_prompt"`. Single inputs must set it to 1; a batch of `n` seeds sets it to `n`.
        ragged_inputs_fn (`Callable[[int], dict]`, *optional*): `ragged_inputs_fn(seed)` gives one call like
            `inputs_fn`, whose `batch_params` are one-element lists whose item differs in size across seeds (a prompt
            of another length, a scene with another number of views): a batch of them must equal the single runs.

    Returns:
        [`DummyPipelineSpec`]: the registered entry.
    """
    if not (isinstance(pipeline_class, type) and issubclass(pipeline_class, DiffusionPipeline)):
        raise TypeError(f"`pipeline_class` must be a DiffusionPipeline subclass, got {pipeline_class!r}.")
    for name, fn in (("components_fn", components_fn), ("inputs_fn", inputs_fn)):
        if not callable(fn):
            raise TypeError(f"`{name}` must be callable as {name}(seed), got {fn!r}.")
    if isinstance(batch_params, str) or not all(isinstance(p, str) for p in batch_params):
        raise TypeError(f"`batch_params` must be a sequence of argument names, got {batch_params!r}.")
    unknown = set(output_types) - set(IMAGE_OUTPUT_TYPES) - set(TEXT_OUTPUT_TYPES) - set(GRAPH_OUTPUT_TYPES)
    if unknown:
        raise ValueError(
            f"`output_types` must be among {IMAGE_OUTPUT_TYPES}, {TEXT_OUTPUT_TYPES} or {GRAPH_OUTPUT_TYPES}; got "
            f"unknown {sorted(unknown)}."
        )
    if set(output_types) & set(GRAPH_OUTPUT_TYPES):
        if not set(output_types) <= set(GRAPH_OUTPUT_TYPES):
            raise ValueError(f"`output_types` mixes graph and other types: {sorted(output_types)}.")
        if "dense" not in output_types:
            raise ValueError(
                "a graph pipeline's `output_types` must include 'dense' (class tensors, compared as arrays)."
            )
    if not output_types:
        raise ValueError("`output_types` must not be empty.")
    if set(output_types) & set(TEXT_OUTPUT_TYPES):
        if set(output_types) & set(IMAGE_OUTPUT_TYPES):
            raise ValueError(f"`output_types` mixes image and text types: {sorted(output_types)}.")
        if "seq" not in output_types:
            raise ValueError("a text pipeline's `output_types` must include 'seq' (token ids, compared as arrays).")
    checked_bad_inputs = []
    for entry in bad_inputs:
        if not (
            isinstance(entry, (tuple, list))
            and len(entry) == 2
            and isinstance(entry[0], dict)
            and isinstance(entry[1], str)
        ):
            raise TypeError(f"each of `bad_inputs` must be an (overrides dict, argument name) pair, got {entry!r}.")
        checked_bad_inputs.append(BadInput(*entry))
    spec = DummyPipelineSpec(
        pipeline_class=pipeline_class,
        components_fn=components_fn,
        inputs_fn=inputs_fn,
        batch_params=tuple(batch_params),
        output_types=tuple(output_types),
        bad_inputs=tuple(checked_bad_inputs),
        callback_edit_tensor=callback_edit_tensor,
        batch_size_param=batch_size_param,
        ragged_inputs_fn=ragged_inputs_fn,
        # the registering module: a fresh interpreter imports it to find this entry
        module=sys._getframe(1).f_globals.get("__name__", ""),
    )
    _REGISTRY[pipeline_class] = spec
    return spec


def _import_dummies_modules() -> None:
    """Import every ``diffusers_ext.testing.dummies.<method>`` module, which registers that method's pipeline."""
    global _discovered
    if _discovered:
        return
    package = importlib.import_module(DUMMIES_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{DUMMIES_PACKAGE}.{info.name}")
    _discovered = True


def get_dummy_spec(pipeline_class: type[DiffusionPipeline]) -> DummyPipelineSpec:
    """Return the registered [`DummyPipelineSpec`] of `pipeline_class`; raise a `ValueError` naming it if none."""
    if pipeline_class not in _REGISTRY:
        _import_dummies_modules()
    if pipeline_class not in _REGISTRY:
        name = getattr(pipeline_class, "__name__", repr(pipeline_class))
        raise ValueError(
            f"No dummy setup is registered for pipeline class {name!r}. Register one with "
            f"`diffusers_ext.testing.register_dummy_pipeline({name}, components_fn, inputs_fn, ...)`, conventionally "
            "in diffusers_ext/testing/dummies/<method>.py."
        )
    return _REGISTRY[pipeline_class]


def registered_pipelines() -> tuple[type[DiffusionPipeline], ...]:
    """All pipeline classes with a registered dummy setup (after importing every method's `dummies` module)."""
    _import_dummies_modules()
    return tuple(_REGISTRY)


def get_dummy_components(pipeline_class: type[DiffusionPipeline], seed: int = 0) -> dict[str, Any]:
    """Tiny components for `pipeline_class(**components)`, with weights seeded by `seed`."""
    return get_dummy_spec(pipeline_class).components_fn(seed)


def get_dummy_inputs(pipeline_class: type[DiffusionPipeline], seed: int = 0) -> dict[str, Any]:
    """Call arguments for one image: `generator=torch.Generator("cpu").manual_seed(seed)`, `output_type="np"`."""
    return get_dummy_spec(pipeline_class).inputs_fn(seed)


def _concat_batch_values(name: str, values: list[Any]) -> Any:
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.cat(values, dim=0)
    if all(isinstance(v, (list, tuple)) for v in values):
        return [item for v in values for item in v]
    if any(isinstance(v, (torch.Tensor, list, tuple)) for v in values):
        raise TypeError(f"batch parameter `{name}` mixes tensors, sequences and scalars across seeds: {values!r}.")
    return list(values)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return type(a) is type(b) and a == b


def get_dummy_batch_inputs(
    pipeline_class: type[DiffusionPipeline], seeds: Sequence[int] = (0, 1), ragged: bool = False
) -> dict[str, Any]:
    """Call arguments for a batch with one image per seed, equal image by image to the single-seed runs.

    Built from `get_dummy_inputs(pipeline_class, seed)` for each seed: the registered `batch_params` are
    concatenated, `generator` becomes the list of the per-seed generators, a registered `batch_size_param` becomes
    the number of seeds, and every other argument must agree across seeds (otherwise a `ValueError` says which one
    belongs in `batch_params`). With `ragged=True` the per-seed inputs come from the registered `ragged_inputs_fn`.
    """
    spec = get_dummy_spec(pipeline_class)
    inputs_fn = spec.ragged_inputs_fn if ragged else spec.inputs_fn
    if inputs_fn is None:
        raise ValueError(f"{pipeline_class.__name__} registers no `ragged_inputs_fn`.")
    singles = [inputs_fn(seed) for seed in seeds]
    batch: dict[str, Any] = {}
    for key in singles[0]:
        values = [single.get(key) for single in singles]
        if key == "generator":
            batch[key] = values
        elif key == spec.batch_size_param:
            if any(v != 1 for v in values):
                raise ValueError(
                    f"dummy inputs of {pipeline_class.__name__} set `{key}` (the `batch_size_param`) to {values}; "
                    "single inputs must set it to 1."
                )
            batch[key] = len(singles)
        elif key in spec.batch_params:
            batch[key] = _concat_batch_values(key, values)
        elif all(_same_value(values[0], v) for v in values[1:]):
            batch[key] = values[0]
        else:
            raise ValueError(
                f"dummy inputs of {pipeline_class.__name__} differ across seeds in `{key}`, which is not in "
                f"`batch_params` {spec.batch_params}; add it there if it is a per-image argument."
            )
    return batch
