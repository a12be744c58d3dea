"""The KV-cache parity cases: Fast-dLLM's `generate_with_prefix_cache` / `generate_with_dual_cache` against
`DiffusionLMPipeline(cache="prefix" | "dual")` on the same native-class weights and prompts.

Shared by `regenerate_llada_dream.py` (which runs the references on LLaDA's published modeling file holding these
weights) and `test_llada_dream_reference_parity.py` (which runs the package on [`LLaDAModelLM`]).
"""

import itertools

import torch
from diffusion_lm_parity_models import CONFIGS, build_native


REFERENCES = {"prefix": "generate_with_prefix_cache", "dual": "generate_with_dual_cache"}
# (preset, its overrides, the reference call): low-confidence remasking with a step budget (1 and 2 tokens per
# step), and Fast-dLLM's threshold decoding (0.9, its default, and 0.5)
DECODERS = [
    ("llada", {}, {"gen_length": 32, "block_length": 8, "steps": 32}),
    ("llada", {}, {"gen_length": 32, "block_length": 16, "steps": 16}),
    ("llada", {}, {"gen_length": 24, "block_length": 8, "steps": 12}),
    ("fast-dllm", {}, {"gen_length": 32, "block_length": 8, "steps": 32, "threshold": 0.9}),
    (
        "fast-dllm",
        {"confidence_threshold": 0.5},
        {"gen_length": 32, "block_length": 16, "steps": 32, "threshold": 0.5},
    ),
]
MODELS = [("llada-8b", 0), ("llada-gqa", 1)]
HEAD_SCALE = 6.0


def _cases() -> list[dict]:
    cases = []
    for cache, (model, seed), (preset, overrides, call) in itertools.product(REFERENCES, MODELS, DECODERS):
        threshold = call.get("threshold")
        cases.append(
            {
                "id": f"{cache}-{model}-{preset}-g{call['gen_length']}-b{call['block_length']}-s{call['steps']}"
                + (f"-t{threshold}" if threshold is not None else ""),
                "cache": cache,
                "reference": REFERENCES[cache],
                "model": model,
                "seed": seed,
                "head_scale": HEAD_SCALE,
                "preset": preset,
                "overrides": overrides,
                "call": {"temperature": 0.0, "remasking": "low_confidence", "threshold": threshold, **call},
                "prompt": {"length": 10, "seed": seed + 7},
            }
        )
    return cases


CACHE_CASES = _cases()


def cache_prompt(case: dict) -> torch.LongTensor:
    """The case's prompt `(1, length)`: ordinary tokens (neither the mask token nor EOS)."""
    config = CONFIGS[case["model"]]["config"]
    generator = torch.Generator().manual_seed(case["prompt"]["seed"])
    return torch.randint(2, config["vocab_size"] - 1, (1, case["prompt"]["length"]), generator=generator)


def case_model(case: dict):
    """The package's native model of the case (the reference runs on the same weights)."""
    return build_native(case["model"], case["seed"], head_scale=case["head_scale"])


def run_package_cache(case: dict, model=None, cache: str | None = "from_case"):
    """The package's side: `SOARScheduler.from_preset(case["preset"], **case["overrides"])` in a
    [`DiffusionLMPipeline`] on the native model, called with the reference call's arguments and the case's cache
    (`cache` overrides it: `None` decodes without one). Returns the pipeline output."""
    from diffusers_ext import DiffusionLMPipeline, SOARScheduler

    model = case_model(case) if model is None else model
    call = case["call"]
    pipe = DiffusionLMPipeline(model, SOARScheduler.from_preset(case["preset"], **case["overrides"]))
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(
            input_ids=cache_prompt(case),
            gen_length=call["gen_length"],
            block_length=call["block_length"],
            num_inference_steps=call["steps"],
            temperature=call["temperature"],
            mask_token_id=CONFIGS[case["model"]]["config"]["mask_token_id"],
            eos_early_stop=False,
            output_type="seq",
            cache=case["cache"] if cache == "from_case" else cache,
        )
