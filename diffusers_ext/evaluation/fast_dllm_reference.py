"""Run Fast-dLLM's published code (LLaDA's and Dream's modeling files, its cached `generate` functions) from a local
checkout, beside the package's native classes and on their weights: for the parity fixtures
(`tests/parity/regenerate_llada_dream.py`) and the cache benchmark (`benchmarks/diffusion_lm_cache/`).

Nothing of Fast-dLLM is stored in the package: the files are imported from the checkout the caller names
(`git clone https://github.com/NVlabs/Fast-dLLM`), and bridged to transformers 5 as the package's remote-code
loader bridges them ([`bridge_transformers4_code`]).
"""

import importlib.util
import os
import sys
import types
from dataclasses import dataclass

import torch

from ..pipelines.diffusion_lm.remote_code import bridge_transformers4_code


@dataclass
class FastDLLM:
    """The classes and functions of a Fast-dLLM checkout.

    Attributes:
        llada_config, llada_model: LLaDA's `LLaDAConfig` and `LLaDAModelLM` (`llada/model/`).
        dream_config, dream_model: Dream's `DreamConfig` and `DreamModel` (`dream/model/`).
        generate: `llada/generate.py` (`generate`, `generate_with_prefix_cache`, `generate_with_dual_cache`).
    """

    llada_config: type
    llada_model: type
    dream_config: type
    dream_model: type
    generate: types.ModuleType


def _package(folder: str, name: str) -> None:
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    sys.modules[name] = importlib.util.module_from_spec(spec)


def _module(path: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_fast_dllm(repo: str | os.PathLike) -> FastDLLM:
    """Import the checkout `repo`'s LLaDA and Dream modeling files and LLaDA's `generate.py` (once per process).

    Raises a `ValueError` naming `repo` when it holds no `llada/model/modeling_llada.py`.
    """
    repo = os.fspath(repo)
    llada_dir, dream_dir = os.path.join(repo, "llada", "model"), os.path.join(repo, "dream", "model")
    if not os.path.isfile(os.path.join(llada_dir, "modeling_llada.py")):
        raise ValueError(f"`repo` {repo!r} is not a Fast-dLLM checkout (no llada/model/modeling_llada.py).")
    if importlib.util.find_spec("einops") is None:
        # imported by LLaDA's file for its block-diffusion variant only, which is never built here
        sys.modules["einops"] = types.SimpleNamespace(rearrange=None)
    if "fast_dllm_llada.modeling_llada" not in sys.modules:
        _package(llada_dir, "fast_dllm_llada")
        _module(os.path.join(llada_dir, "configuration_llada.py"), "fast_dllm_llada.configuration_llada")
        _module(os.path.join(llada_dir, "modeling_llada.py"), "fast_dllm_llada.modeling_llada")
        _package(dream_dir, "fast_dllm_dream")
        _module(os.path.join(dream_dir, "configuration_dream.py"), "fast_dllm_dream.configuration_dream")
        _module(os.path.join(dream_dir, "generation_utils.py"), "fast_dllm_dream.generation_utils")
        _module(os.path.join(dream_dir, "modeling_dream.py"), "fast_dllm_dream.modeling_dream")
        # generate.py imports its modeling file as the top-level package `model`: the one loaded above
        sys.modules.setdefault("model", sys.modules["fast_dllm_llada"])
        sys.modules.setdefault("model.modeling_llada", sys.modules["fast_dllm_llada.modeling_llada"])
        _module(os.path.join(repo, "llada", "generate.py"), "fast_dllm_generate")
    llada = sys.modules["fast_dllm_llada.modeling_llada"]
    dream = sys.modules["fast_dllm_dream.modeling_dream"]
    bridge_transformers4_code(llada.LLaDAModelLM)
    bridge_transformers4_code(dream.DreamModel)
    return FastDLLM(
        llada_config=sys.modules["fast_dllm_llada.configuration_llada"].LLaDAConfig,
        llada_model=llada.LLaDAModelLM,
        dream_config=sys.modules["fast_dllm_dream.configuration_dream"].DreamConfig,
        dream_model=dream.DreamModel,
        generate=sys.modules["fast_dllm_generate"],
    )


def published_model(fast_dllm: FastDLLM, family: str, config: dict, native: torch.nn.Module) -> torch.nn.Module:
    """The published model of `family` (`"llada"` or `"dream"`) built from the checkpoint-style `config` dict,
    holding `native`'s weights (loaded strictly by name: the native classes keep the published names), in eval
    mode and `native`'s dtype."""
    config_class, model_class = {
        "llada": (fast_dllm.llada_config, fast_dllm.llada_model),
        "dream": (fast_dllm.dream_config, fast_dllm.dream_model),
    }[family]
    built = config_class(**{k: v for k, v in config.items() if k != "model_type"})
    if family == "dream":
        built._attn_implementation = "sdpa"
    else:  # transformers 5 drops it from LLaDA's config; its forward reads it (as `load_remote_code_model` restores)
        built.use_cache = False
    model = model_class(built)
    model.load_state_dict(native.state_dict(), strict=True)
    return model.to(next(native.parameters()).dtype).eval()


class CountedForwards(torch.nn.Module):
    """A model as Fast-dLLM's `generate` functions call it (`model.device`, `model(x, ...)`), counting forwards."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.calls = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)
