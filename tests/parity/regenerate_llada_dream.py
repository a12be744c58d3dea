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
import json

import torch
from diffusion_lm_cache_cases import CACHE_CASES, cache_prompt, run_package_cache
from diffusion_lm_parity_models import CONFIGS, build_native, fixed_inputs
from parity_utils import FIXTURES, reference_commit

from diffusers_ext.evaluation.fast_dllm_reference import CountedForwards, load_fast_dllm, published_model


FIXTURE = FIXTURES / "llada_dream_models.json"


def reference_model(fast_dllm, name: str, seed: int = 0, head_scale: float = 1.0):
    """`(published model, native model)` of `CONFIGS[name]`, both holding the same weights."""
    native = build_native(name, seed, head_scale=head_scale)
    return published_model(fast_dllm, CONFIGS[name]["family"], CONFIGS[name]["config"], native), native


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast_dllm_repo", required=True, help="a local checkout of NVlabs/Fast-dLLM")
    args = parser.parse_args()
    commit = reference_commit(args.fast_dllm_repo)
    fast_dllm = load_fast_dllm(args.fast_dllm_repo)
    models = {}
    for name in CONFIGS:
        model, native = reference_model(fast_dllm, name)
        ids = fixed_inputs(name)
        with torch.no_grad():
            logits = model(ids).logits
            ours = native(ids).logits
        models[name] = {"seed": 0, "inputs": ids.tolist(), "logits": logits.tolist()}
        print(f"{name}: max |native - reference| = {(ours - logits).abs().max().item():.3g}")

    caches = []
    for case in CACHE_CASES:
        model, _ = reference_model(fast_dllm, case["model"], case["seed"], case["head_scale"])
        counted = CountedForwards(model)
        prompt = cache_prompt(case)
        call = dict(case["call"])
        mask_id = CONFIGS[case["model"]]["config"]["mask_token_id"]
        with torch.no_grad():
            x, nfe = getattr(fast_dllm.generate, case["reference"])(counted, prompt, mask_id=mask_id, **call)
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
