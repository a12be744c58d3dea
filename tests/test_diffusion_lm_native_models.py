"""The native [`LLaDAModelLM`] and [`DreamModel`] in a [`DiffusionLMPipeline`]: the adapter is chosen from their
config, and a pipeline holding one saves and loads again without remote code (their parity with the published
modeling files is in `tests/parity/test_llada_dream_reference_parity.py`)."""

import json
import sys
from pathlib import Path

import pytest
import torch

from diffusers_ext import DiffusionLMPipeline, DreamAdapter, LLaDAAdapter, SOARScheduler, load_pipeline


sys.path.insert(0, str(Path(__file__).parent / "parity"))
from diffusion_lm_parity_models import build_native  # noqa: E402


@pytest.mark.parametrize("name, adapter_class", [("llada-8b", LLaDAAdapter), ("dream-7b", DreamAdapter)])
def test_a_pipeline_holding_a_native_class_picks_its_adapter_saves_and_loads(tmp_path, name, adapter_class):
    model = build_native(name, head_scale=6.0)
    pipe = DiffusionLMPipeline(model, SOARScheduler.from_preset("fast-dllm", block_length=4))
    pipe.set_progress_bar_config(disable=True)
    assert type(pipe.adapter) is adapter_class
    call = {"gen_length": 8, "num_inference_steps": 8, "mask_token_id": 127, "output_type": "seq", "cache": "dual"}
    ids = torch.randint(2, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    expected = pipe(input_ids=ids, eos_early_stop=False, **call).sequences
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["model"] == ["diffusers_ext", type(model).__name__]
    for loader in (load_pipeline, DiffusionLMPipeline.from_pretrained):
        loaded = loader(tmp_path)
        loaded.set_progress_bar_config(disable=True)
        assert type(loaded.model) is type(model) and type(loaded.adapter) is adapter_class
        assert torch.equal(loaded(input_ids=ids, eos_early_stop=False, **call).sequences, expected)


def test_a_tied_llada_head_is_the_input_embedding(tmp_path):
    from diffusers_ext import LLaDAConfig, LLaDAModelLM

    config = LLaDAConfig(
        d_model=32, n_heads=4, n_layers=1, mlp_hidden_size=48, vocab_size=60, embedding_size=64, weight_tying=True
    )
    torch.manual_seed(0)
    model = LLaDAModelLM(config).eval()
    assert "model.transformer.ff_out.weight" not in model.state_dict()
    assert model.get_output_embeddings() is model.get_input_embeddings()
    ids = torch.randint(0, 60, (1, 5))
    model.save_pretrained(tmp_path)
    loaded = LLaDAModelLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        logits = model(ids).logits
        torch.testing.assert_close(loaded(ids).logits, logits)
        # changing the embedding changes the head: they are one matrix
        model.get_input_embeddings().weight[7].add_(1.0)
        assert not torch.equal(model(ids).logits[..., 7], logits[..., 7])
    assert logits.shape == (1, 5, 64)


@pytest.mark.parametrize("name", ["llada-8b", "dream-7b"])
def test_native_classes_decode_with_a_cache_in_bfloat16(name):
    model = build_native(name, head_scale=6.0, dtype=torch.bfloat16)
    pipe = DiffusionLMPipeline(model, SOARScheduler.from_preset("soar-llada", block_length=4))
    pipe.set_progress_bar_config(disable=True)
    ids = torch.randint(2, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    for cache in ("prefix", "dual"):
        out = pipe(
            input_ids=ids, gen_length=8, num_inference_steps=8, mask_token_id=127, output_type="seq", cache=cache
        )
        assert out.sequences.shape == (2, 8) and not bool((out.sequences == 127).any())
