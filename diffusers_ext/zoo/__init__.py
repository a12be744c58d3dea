"""Small trained checkpoints bundled with the package, in Hugging Face folder format.

Each entry is a folder next to this file with a model card (`README.md`) that states the exact command that
rebuilt it and its measured quality (see `benchmarks/zoo/results/zoo.json`).

    >>> from diffusers_ext import zoo
    >>> zoo.names()
    ['addition-mdm', 'digits-classifier', 'digits-ddpm', 'digits-sd3', ...]
    >>> pipe = zoo.load("digits-ddpm")

Every entry loads in float32 unless `torch_dtype` (or `dtype`) says otherwise: some store their weights in float16 to
keep the package small, and a pipeline whose components disagree in dtype does not run.
"""

import os
from dataclasses import dataclass


DEFAULT_DTYPE = "float32"


@dataclass(frozen=True)
class ZooEntry:
    """One bundled checkpoint: its folder name, what it is, and the public class (of `library`) that loads it."""

    name: str
    description: str
    class_name: str
    library: str = "diffusers_ext"


ENTRIES = {
    entry.name: entry
    for entry in (
        ZooEntry(
            "digits-ddpm",
            "Class-conditional pixel DDPM on scikit-learn's 8x8 digits, null class 10 for guidance.",
            "ClassConditionalDDPMPipeline",
        ),
        ZooEntry(
            "addition-mdm",
            "Masked diffusion LM (bidirectional Llama, 1.1M parameters) for 3-digit addition, answer most-significant "
            "digit first; SOAR's documented negative case (its path score prefers wrong answers).",
            "DiffusionLMPipeline",
        ),
        ZooEntry(
            "sudoku-mdm",
            "Masked diffusion LM (bidirectional Llama, 0.28M parameters, float16 weights) for 6x6 sudoku completion; "
            "the test bed of SOAR decoding.",
            "DiffusionLMPipeline",
        ),
        ZooEntry(
            "digits-classifier",
            "ConvImageClassifier for 8x8 digits; the judge of the digits generators (accuracy, Fréchet features).",
            "ConvImageClassifier",
        ),
        ZooEntry(
            "digits-sd3",
            "Tiny StableDiffusion3Pipeline drawing the 8x8 digit its prompt names; the policy of the GRPO/E2PO "
            "benchmark (use max_sequence_length=8, height=width=8).",
            "StableDiffusion3Pipeline",
            library="diffusers",
        ),
        ZooEntry(
            "digits-augmentation-regressor",
            "AugmentationRegressor for 8x8 digits: regresses grey-scale augmentation parameters; its features define "
            "the manifold feature distance (AYT) of consistency training.",
            "AugmentationRegressor",
        ),
        ZooEntry(
            "digits-cm",
            "Unconditional consistency model (UNet2DModel, 164k parameters) on 8x8 digits, easy consistency training "
            "with the manifold feature distance; 1- or 2-step sampling.",
            "ConsistencyModelPipeline",
            library="diffusers",
        ),
        ZooEntry(
            "procedural-semantic-encoder",
            "Tiny Dinov2Model whose patch features recognise the object classes of procedural scenes (stands in for "
            "DINOv2).",
            "Dinov2Model",
            "transformers",
        ),
        ZooEntry(
            "procedural-nvs",
            "SemanticNVSPipeline for 16x16 procedural scenes with the procedural semantic encoder.",
            "SemanticNVSPipeline",
        ),
        ZooEntry(
            "lomdm-markov",
            "LoMDM masked diffusion LM (bidirectional Llama + learned forward and reverse schedulers) on the "
            "Markov-checksum test bed; samples with its learned generation order.",
            "LoMDMPipeline",
        ),
        ZooEntry(
            "procedural-nvs-baseline",
            "The same multi-view denoiser trained with the same budget but without semantic conditioning.",
            "SemanticNVSPipeline",
        ),
        ZooEntry(
            "mosaic-sd3-64",
            "The 64x64 mosaic world as a StableDiffusion3Pipeline (rectified flow, SD3Transformer2DModel on the "
            "mosaic-t2i-64 autoencoder's 16x16x4 latents, the pack's tiny text encoders): the model GRPO / E2PO run "
            "on; float16 weights, loaded in float32; sample at height=width=64 with max_sequence_length=8.",
            "StableDiffusion3Pipeline",
            library="diffusers",
        ),
        ZooEntry(
            "mosaic-t2i-64",
            "Latent text-to-image StableDiffusionPipeline of 64x64 mosaic scenes (16x16x4 latents, 6.6M-parameter "
            "UNet); the world with room for composition; float16 weights, loaded in float32; sample at height=width=64.",
            "StableDiffusionPipeline",
            library="diffusers",
        ),
        ZooEntry(
            "mosaic-t2i",
            "Small latent text-to-image StableDiffusionPipeline of 32x32 mosaic scenes (shapes, colours, counts, "
            "relations); float16 weights, loaded in float32; judged by diffusers_ext.evaluation.mosaic.",
            "StableDiffusionPipeline",
            library="diffusers",
        ),
        ZooEntry(
            "navigation-planner",
            "Diffuser-style UNet1DModel DDPM over 32 2-D waypoints (Navigation2D demonstrations, float16 weights); "
            "the test bed of Doob h-transform guidance.",
            "DoobGuidedPlannerPipeline",
        ),
        ZooEntry(
            "graph-flow-tree16",
            "Discrete graph flow model (DeFoG-style GraphTransformerModel, 4 layers, + GraphDiscreteFlowScheduler) "
            "pretrained on SPECTRE random trees of 16 nodes; the pretrained model of the Graph-GRPO tree-16 benchmark "
            "(sample with num_nodes=16, num_inference_steps=50).",
            "GraphFlowPipeline",
        ),
    )
}

ZOO_DIR = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
    """The names of the bundled checkpoints, sorted."""
    return sorted(ENTRIES)


def _entry(name: str) -> ZooEntry:
    if name not in ENTRIES:
        raise ValueError(f"unknown zoo name {name!r}; expected one of {names()}.")
    return ENTRIES[name]


def path(name: str) -> str:
    """The local folder of the bundled checkpoint `name`."""
    _entry(name)
    folder = os.path.join(ZOO_DIR, name)
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"zoo entry {name!r} is registered but its folder {folder} is missing from this install."
        )
    return folder


def load(name: str, **kwargs):
    """Load the bundled checkpoint `name` with its class's `from_pretrained` (`kwargs` are passed on).

    Every component loads in float32 (the stored weights of some entries are float16) unless `torch_dtype` (or
    `dtype`) is given, so the result runs as loaded. A dtype name (`"float16"`) is converted; anything that is not
    a torch dtype is refused.
    """
    import importlib

    import torch

    entry = _entry(name)
    for key in ("torch_dtype", "dtype"):
        if key in kwargs:
            kwargs[key] = _check_dtype(key, kwargs[key])
    cls = getattr(importlib.import_module(entry.library), entry.class_name)
    if "torch_dtype" not in kwargs and "dtype" not in kwargs:
        kwargs["dtype"] = getattr(torch, DEFAULT_DTYPE)  # `torch_dtype` is deprecated in diffusers and transformers
    return cls.from_pretrained(path(name), **kwargs)


def _check_dtype(key: str, value):
    """`value` as a `torch.dtype` (a name such as `"float16"` or `"torch.bfloat16"` is converted; a dict maps
    components to dtypes, as diffusers takes it), or a `ValueError` naming `key`: `from_pretrained` ignores a string
    it does not know, so `torch_dtype="float17"` would silently load in the stored dtype."""
    import torch

    if isinstance(value, dict):
        return {component: _check_dtype(f"{key}[{component!r}]", v) for component, v in value.items()}
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        dtype = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(dtype, torch.dtype):
            return dtype
    raise ValueError(
        f"`{key}` must be a torch.dtype or its name (e.g. torch.float32, 'float16', 'bfloat16'), got {value!r}."
    )
