"""The tiny models and prompts of the SOAR reference-parity fixtures, rebuilt from the recipe a fixture records.

Shared by `regenerate_soar.py` (which runs the reference implementations) and `test_soar_reference_parity.py`
(which runs the package), so that both sides see the same weights, the same forward hook and the same prompts.
"""

import json
import math

import torch

from diffusers_ext.testing import get_tiny_dream_like_lm, get_tiny_llada_like_lm


FAMILIES = {"llada": get_tiny_llada_like_lm, "dream": get_tiny_dream_like_lm}


def _boost_hook(modulus: int, strength: float):
    """A forward hook making a few positions confident, which ones depending on the sequence's content (a random
    tiny model alone is never confident enough for the 0.9 / 0.95 thresholds of the references)."""

    def hook(module, args, kwargs, output):
        x = args[0] if args else kwargs["input_ids"]
        key = x.sum(-1, keepdim=True)
        position = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        chosen = ((position + key) % modulus == 0).to(output.logits.dtype)
        token = (position * 7 + key) % 200 + 6
        output.logits.scatter_add_(-1, token.unsqueeze(-1), strength * chosen.unsqueeze(-1))
        return output

    return hook


_BUILT: dict = {}


def build_model(recipe: dict, dtype: str = "float32"):
    """`(model, tokenizer)` from a recipe `{"family", "seed", "head_scale", "boost"}`: the tiny stand-in of the
    family with its output head scaled by `head_scale` (sharper distributions) and, when `boost` is
    `{"modulus", "strength"}`, the content-dependent confidence hook. Built once per recipe and dtype (the models
    are only read)."""
    key = json.dumps([recipe, dtype], sort_keys=True)
    if key not in _BUILT:
        _BUILT[key] = _build_model(recipe, dtype)
    return _BUILT[key]


def _build_model(recipe: dict, dtype: str):
    model, tokenizer = FAMILIES[recipe["family"]](seed=recipe["seed"])
    with torch.no_grad():
        model.lm_head.weight.mul_(recipe["head_scale"])
    if recipe.get("boost"):
        model.register_forward_hook(_boost_hook(**recipe["boost"]), with_kwargs=True)
    return model.to(getattr(torch, dtype)), tokenizer


def make_prompt(batch: int, length: int, seed: int) -> torch.LongTensor:
    """Prompt ids `(batch, length)` drawn from the ordinary byte tokens (6..261) with their own generator."""
    return torch.randint(6, 262, (batch, length), generator=torch.Generator().manual_seed(seed))


def position_counts(sequences: torch.LongTensor) -> list[dict[str, int]]:
    """Per generated position, `{token id (str): count}` over the rows of `sequences` `(n, gen_length)`."""
    counts = []
    for column in sequences.T:
        values, numbers = torch.unique(column, return_counts=True)
        counts.append({str(int(v)): int(c) for v, c in zip(values, numbers)})
    return counts


def tv_tolerance(reference: dict[str, int], ours: dict[str, int], num_tests: int, delta: float = 1e-6) -> float:
    """The largest total-variation distance between two empirical distributions of the same law that sampling
    error explains, at one position: `n_a` and `n_b` draws, categories `k`, pooled frequencies `p_k`.

    - Mean: `E TV = 1/2 sum_k E|a_k - b_k| <= 1/2 sum_k sqrt(p_k (1 - p_k) (1/n_a + 1/n_b))` (Jensen: the two
      frequencies of category `k` are independent with mean `p_k`, so `a_k - b_k` has mean 0 and that variance;
      `p_k` is estimated by the pooled counts).
    - Deviation: one draw moves TV by at most `1/n`, so McDiarmid gives
      `P(TV - E TV >= t) <= exp(-2 t^2 / (1/n_a + 1/n_b))`; `t = sqrt((1/n_a + 1/n_b) log(num_tests / delta) / 2)`
      holds for all `num_tests` positions at once except with probability `delta`.
    """
    n_a, n_b = sum(reference.values()), sum(ours.values())
    pooled = {k: (reference.get(k, 0) + ours.get(k, 0)) / (n_a + n_b) for k in set(reference) | set(ours)}
    bias = 0.5 * sum(math.sqrt(p * (1 - p)) for p in pooled.values()) * math.sqrt(1 / n_a + 1 / n_b)
    deviation = math.sqrt((1 / n_a + 1 / n_b) * math.log(num_tests / delta) / 2)
    return bias + deviation


def total_variation(reference: dict[str, int], ours: dict[str, int]) -> float:
    """Total-variation distance between two count tables `{token: count}`."""
    n_a, n_b = sum(reference.values()), sum(ours.values())
    keys = set(reference) | set(ours)
    return 0.5 * sum(abs(reference.get(k, 0) / n_a - ours.get(k, 0) / n_b) for k in keys)


def run_package(case: dict, num_samples: int | None = None):
    """The package's side of a fixture case: `SOARScheduler.from_preset(case["preset"], **case["overrides"])` in a
    [`DiffusionLMPipeline`] called with the reference call's own arguments (`gen_length`, `block_length`, `steps`
    as `num_inference_steps`, `temperature`) and nothing else but `eos_early_stop=False` (the references decode past
    EOS). With `num_samples`, the prompt is decoded `num_samples` times in one batch, row `i` with its own generator
    seeded `i`. Returns the pipeline output."""
    from diffusers_ext import DiffusionLMPipeline, SOARScheduler

    model, tokenizer = build_model(case["model"], case.get("dtype", "float32"))
    scheduler = SOARScheduler.from_preset(case["preset"], **case.get("overrides", {}))
    pipe = DiffusionLMPipeline(model, scheduler, tokenizer, adapter=case["model"]["family"])
    pipe.set_progress_bar_config(disable=True)
    call = case["call"]
    kwargs = {"gen_length": call["gen_length"], "temperature": call.get("temperature", 0.0)}
    if call.get("block_length") is not None:
        kwargs["block_length"] = call["block_length"]
    if call.get("steps") is not None:
        kwargs["num_inference_steps"] = call["steps"]
    input_ids = torch.tensor(case["prompt"])
    attention_mask = torch.tensor(case["attention_mask"]) if case.get("attention_mask") is not None else None
    if num_samples is not None:
        kwargs["num_return_sequences"] = num_samples
        kwargs["generator"] = [torch.Generator().manual_seed(i) for i in range(num_samples)]
    with torch.no_grad():
        return pipe(
            input_ids=input_ids,
            attention_mask=attention_mask,
            eos_early_stop=False,
            output_type="seq",
            **kwargs,
        )
