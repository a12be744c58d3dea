"""Parity of the native [`LLaDAModelLM`] and [`DreamModel`] with LLaDA's and Dream's published modeling files.

`fixtures/llada_dream_models.json` holds the logits the published files (NVlabs/Fast-dLLM's copies, commit
recorded) returned on the weights and inputs of `diffusion_lm_parity_models.py`; `regenerate_llada_dream.py`
rebuilds it from a local checkout. Here the package's classes load the same weights from a folder laid out as the
published checkpoints are (their `config.json` keys, `model_type` and `auto_map`, their weight names), with no
remote code, and must return those logits to 1e-5 in float32.
"""

import json
import re

import pytest
import torch
from diffusion_lm_parity_models import CONFIGS, build_native
from parity_utils import load_fixture
from safetensors.torch import save_file

from diffusers_ext.models.dream import DreamModel
from diffusers_ext.models.llada import LLaDAConfig, LLaDAModelLM


FIXTURE = load_fixture("llada_dream_models")
NATIVE_CLASSES = {"llada": LLaDAModelLM, "dream": DreamModel}
AUTO_MAPS = {
    "llada": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM"},
    "dream": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
}


def write_published_checkpoint(folder, name: str, seed: int = 0) -> None:
    """A checkpoint folder as LLaDA / Dream publish it: `config.json` with their keys, `model_type` and
    `auto_map` (the modeling files themselves are left out: they must not be needed), and `model.safetensors`."""
    family = CONFIGS[name]["family"]
    config = {**CONFIGS[name]["config"], "auto_map": AUTO_MAPS[family], "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in build_native(name, seed).state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_the_fixture_records_the_reference_commit_and_every_config():
    assert re.fullmatch(r"[0-9a-f]{40}", FIXTURE["references"]["NVlabs/Fast-dLLM"])
    assert set(FIXTURE["models"]) == set(CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_native_class_loads_the_published_checkpoint_layout_and_matches_its_logits(tmp_path, name):
    write_published_checkpoint(tmp_path, name)
    family = CONFIGS[name]["family"]
    model = NATIVE_CLASSES[family].from_pretrained(tmp_path).eval()
    assert type(model) is NATIVE_CLASSES[family]
    assert model.dtype == torch.float32
    recorded = FIXTURE["models"][name]
    ids = torch.tensor(recorded["inputs"])
    expected = torch.tensor(recorded["logits"])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == expected.shape
    assert (logits - expected).abs().max().item() <= 1e-5
    # the comparison can fail: another seed's weights are far from the reference's logits
    with torch.no_grad():
        other = build_native(name, seed=1)(ids).logits
    assert (other - expected).abs().max().item() > 0.1


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_to_keep_runs_the_head_at_the_given_positions(name):
    model = build_native(name)
    ids = torch.tensor(FIXTURE["models"][name]["inputs"])
    positions = torch.tensor([0, 3, 7, 11])
    with torch.no_grad():
        full = model(ids).logits
        kept = model(ids, logits_to_keep=positions).logits
        last = model(ids, logits_to_keep=2).logits
    assert kept.shape == (ids.shape[0], 4, full.shape[-1])
    torch.testing.assert_close(kept, full[:, positions], rtol=0, atol=1e-6)
    torch.testing.assert_close(last, full[:, -2:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_attention_is_bidirectional(name):
    model = build_native(name)
    ids = torch.tensor(FIXTURE["models"][name]["inputs"])
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 64 + 2
    with torch.no_grad():
        first = model(ids).logits[:, 0]
        first_changed = model(changed).logits[:, 0]
    assert (first - first_changed).abs().max().item() > 1e-4


def test_llada_config_refuses_a_structure_it_does_not_implement():
    with pytest.raises(ValueError, match="block_type"):
        LLaDAConfig(block_type="sequential")
    with pytest.raises(ValueError, match="activation_type"):
        LLaDAConfig(activation_type="swiglu")
    with pytest.raises(ValueError, match="n_heads"):
        LLaDAConfig(d_model=30, n_heads=4)


def test_the_native_model_types_do_not_clash_with_the_published_ones():
    from diffusers_ext.models.dream import DreamConfig

    assert LLaDAConfig.model_type != "llada" and DreamConfig.model_type != "Dream"


# ---------------------------------------------------------------------------------------------------------------------
# prefix and dual caches against Fast-dLLM's generate_with_prefix_cache / generate_with_dual_cache
# ---------------------------------------------------------------------------------------------------------------------

CACHES = FIXTURE["caches"]


def test_the_cache_fixture_covers_both_caches_both_decoders_and_both_attention_layouts():
    assert {case["reference"] for case in CACHES} == {"generate_with_prefix_cache", "generate_with_dual_cache"}
    assert {case["preset"] for case in CACHES} == {"llada", "fast-dllm"}
    assert {case["model"] for case in CACHES} == {"llada-8b", "llada-gqa"}
    # thresholds were crossed: some block committed several tokens in one step
    assert any(case["expected"]["nfe"] < case["call"]["steps"] for case in CACHES)


@pytest.mark.parametrize("case", CACHES, ids=[case["id"] for case in CACHES])
def test_cached_decoding_matches_fast_dllm_token_for_token(case):
    from diffusion_lm_cache_cases import run_package_cache

    out = run_package_cache(case)
    expected = case["expected"]
    assert out.sequences.tolist() == expected["sequences"]
    assert out.nfe.tolist() == [expected["nfe"]] == [expected["forward_calls"]]


def test_the_cache_parity_can_fail():
    # decoding the same cases without a cache gives other tokens in most of them (the cache is an approximation on
    # a bidirectional model), so the token comparison above tells a cached decode from an uncached one
    from diffusion_lm_cache_cases import run_package_cache

    differ = sum(
        run_package_cache(case, cache=None).sequences.tolist() != case["expected"]["sequences"] for case in CACHES
    )
    assert differ >= len(CACHES) // 2
