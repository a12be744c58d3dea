"""DiscreteFlowPipeline and DiscreteFlowTransformerModel: conformance suite, NFE, save/load, Euler limit."""

import pytest
import torch

from diffusers_ext import DiscreteFlowMatchingScheduler, DiscreteFlowPipeline, DiscreteFlowTransformerModel
from diffusers_ext.testing import PipelineConformanceTests


class TestDiscreteFlowPipeline(PipelineConformanceTests):
    pipeline_class = DiscreteFlowPipeline


def _tiny(source="uniform", **kwargs):
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=3, source=source, **kwargs)
    torch.manual_seed(0)
    model = DiscreteFlowTransformerModel(
        vocab_size=3,
        num_embeddings=scheduler.num_embeddings,
        sequence_length=5,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
    )
    return DiscreteFlowPipeline(model.eval(), scheduler)


@pytest.mark.support_cell("discrete_flow", "pack")
def test_nfe_is_the_number_of_steps_and_output_is_data_tokens():
    pipe = _tiny("mask")
    pipe.set_progress_bar_config(disable=True)
    calls = []
    pipe.model.register_forward_hook(lambda *args: calls.append(1))
    out = pipe(batch_size=4, num_inference_steps=7, generator=torch.Generator().manual_seed(0))
    assert out.nfe == 7 and len(calls) == 7
    assert out.sequences.shape == (4, 5) and out.sequences.max() < 3  # no mask token left
    # on a masked path every position is revealed exactly once
    assert torch.equal(out.num_jumps, torch.full((4,), 5))


def test_model_save_load_round_trip(tmp_path):
    model = _tiny("uniform").model
    model.save_pretrained(tmp_path)
    loaded = DiscreteFlowTransformerModel.from_pretrained(tmp_path)
    ids = torch.randint(0, 3, (2, 5), generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.2, 0.7])
    assert torch.allclose(model(ids, t).logits, loaded(ids, t).logits)
    assert (tmp_path / "diffusion_pytorch_model.safetensors").exists()
    half = DiscreteFlowTransformerModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert next(half.parameters()).dtype == torch.bfloat16


def test_model_rejects_wrong_length():
    model = _tiny().model
    try:
        model(torch.zeros(1, 4, dtype=torch.long), 0.5)
    except ValueError as error:
        assert "input_ids" in str(error)
    else:
        raise AssertionError("a sequence of the wrong length was accepted")
