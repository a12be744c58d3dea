"""Regenerate `tests/parity/fixtures/llada_dream_models.json`: what LLaDA's and Dream's published modeling files
return on the weights of `diffusion_lm_parity_models.py`, for `test_llada_dream_reference_parity.py`.

The references are imported at run time from a local checkout of NVlabs/Fast-dLLM (its `llada/model` and
`dream/model` files are LLaDA's and Dream's modeling code with Fast-dLLM's cache arguments added; nothing of theirs
is stored here, only their outputs and the commit id):

    git clone https://github.com/NVlabs/Fast-dLLM REFS/Fast-dLLM
    python tests/parity/regenerate_llada_dream.py --fast_dllm_repo REFS/Fast-dLLM

Recorded, in float32:

- `models`: per config, the reference model's logits on fixed inputs (the package's native class must match them
  to 1e-5);
- `caches`: the tokens and forward counts of Fast-dLLM's `generate_with_prefix_cache` and
  `generate_with_dual_cache` (`llada/generate.py`) run on the reference LLaDA model, with step budgets and
  thresholds; the package's `DiffusionLMPipeline(cache="prefix" | "dual")` must give the same tokens.
"""

import argparse
import importlib.util
import json
import os
import sys
import types

import torch
from diffusion_lm_cache_cases import CACHE_CASES, cache_prompt, run_package_cache
from diffusion_lm_parity_models import CONFIGS, build_native, fixed_inputs
from parity_utils import FIXTURES, reference_commit

from diffusers_ext.pipelines.diffusion_lm.remote_code import bridge_transformers4_code


FIXTURE = FIXTURES / "llada_dream_models.json"


def load_package(folder: str, name: str) -> types.ModuleType:
    """Import the modeling files of `folder` as a package `name` (they import each other relatively)."""
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    return package


def load_module(path: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def reference_classes(fast_dllm: str):
    """`{family: (config class, model class)}` of the published modeling files, bridged to transformers 5 as the
    pack's remote-code loader does."""
    if importlib.util.find_spec("einops") is None:
        # imported by LLaDA's file for its block-diffusion variant only, which these runs never build
        sys.modules["einops"] = types.SimpleNamespace(rearrange=None)
    load_package(os.path.join(fast_dllm, "llada", "model"), "reference_llada")
    llada_config = load_module(
        os.path.join(fast_dllm, "llada", "model", "configuration_llada.py"), "reference_llada.configuration_llada"
    )
    llada = load_module(
        os.path.join(fast_dllm, "llada", "model", "modeling_llada.py"), "reference_llada.modeling_llada"
    )
    load_package(os.path.join(fast_dllm, "dream", "model"), "reference_dream")
    dream_config = load_module(
        os.path.join(fast_dllm, "dream", "model", "configuration_dream.py"), "reference_dream.configuration_dream"
    )
    # the modeling file imports its generation mixin, which these runs do not use
    load_module(os.path.join(fast_dllm, "dream", "model", "generation_utils.py"), "reference_dream.generation_utils")
    dream = load_module(
        os.path.join(fast_dllm, "dream", "model", "modeling_dream.py"), "reference_dream.modeling_dream"
    )
    bridge_transformers4_code(llada.LLaDAModelLM)
    bridge_transformers4_code(dream.DreamModel)
    return {
        "llada": (llada_config.LLaDAConfig, llada.LLaDAModelLM),
        "dream": (dream_config.DreamConfig, dream.DreamModel),
    }


def reference_model(classes, name: str, seed: int = 0):
    """The published model of `CONFIGS[name]` holding the native model's weights (loaded strictly by name)."""
    family = CONFIGS[name]["family"]
    config_class, model_class = classes[family]
    config = config_class(**{k: v for k, v in CONFIGS[name]["config"].items() if k != "model_type"})
    if family == "dream":
        config._attn_implementation = "sdpa"
    else:  # transformers 5 drops it from LLaDA's config; its forward reads it (as `load_remote_code_model` restores)
        config.use_cache = False
    model = model_class(config)
    native = build_native(name, seed)
    model.load_state_dict(native.state_dict(), strict=True)
    return model.float().eval(), native


class CountedForwards(torch.nn.Module):
    """The reference model as Fast-dLLM's `generate` functions call it (`model.device`), counting forwards."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.calls = 0

    @property
    def device(self):
        return torch.device("cpu")

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast_dllm_repo", required=True, help="a local checkout of NVlabs/Fast-dLLM")
    args = parser.parse_args()
    commit = reference_commit(args.fast_dllm_repo)
    classes = reference_classes(args.fast_dllm_repo)
    models = {}
    for name in CONFIGS:
        model, native = reference_model(classes, name)
        ids = fixed_inputs(name)
        with torch.no_grad():
            logits = model(ids).logits
            ours = native(ids).logits
        models[name] = {"seed": 0, "inputs": ids.tolist(), "logits": logits.tolist()}
        print(f"{name}: max |native - reference| = {(ours - logits).abs().max().item():.3g}")

    # generate.py imports its modeling file as the top-level package `model`: the one already loaded above
    sys.modules.setdefault("model", sys.modules["reference_llada"])
    sys.modules.setdefault("model.modeling_llada", sys.modules["reference_llada.modeling_llada"])
    generate = load_module(os.path.join(args.fast_dllm_repo, "llada", "generate.py"), "reference_fast_dllm")
    caches = []
    for case in CACHE_CASES:
        model, _ = reference_model(classes, case["model"], case["seed"])
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(case["head_scale"])
        counted = CountedForwards(model)
        prompt = cache_prompt(case)
        call = dict(case["call"])
        mask_id = CONFIGS[case["model"]]["config"]["mask_token_id"]
        with torch.no_grad():
            x, nfe = getattr(generate, case["reference"])(counted, prompt, mask_id=mask_id, **call)
        expected = {"sequences": x[:, prompt.shape[1] :].tolist(), "nfe": int(nfe), "forward_calls": counted.calls}
        caches.append({**case, "expected": expected})
        out = run_package_cache(case)
        same = out.sequences.tolist() == expected["sequences"]
        uncached = run_package_cache(case, cache=None)
        print(
            f"{case['id']}: tokens {'equal' if same else 'DIFFER'}, NFE {int(out.nfe[0])} (reference {int(nfe)}); "
            f"uncached decode agrees on {(uncached.sequences == out.sequences).float().mean().item():.2f}"
        )
    fixture = {
        "references": {"NVlabs/Fast-dLLM": commit},
        "files": ["llada/model/modeling_llada.py", "dream/model/modeling_dream.py", "llada/generate.py"],
        "models": models,
        "caches": caches,
    }
    FIXTURE.write_text(json.dumps(fixture) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
