"""A DiffusionLMPipeline holding a remote-code model (laid out as LLaDA / Dream checkpoints are: `config.json` with
an `auto_map`, the modeling files beside the weights) saves and loads again."""

import json

import pytest
import torch
from transformers import AutoModel

from diffusers_ext import DiffusionLMPipeline, SOARScheduler, load_pipeline
from diffusers_ext.testing import get_tiny_llada_like_lm


CONFIGURATION = """from transformers import LlamaConfig


class TinyLLaDAConfig(LlamaConfig):
    model_type = "tiny_llada"
"""
MODELING = """from transformers import LlamaForCausalLM

from .configuration_tiny_llada import TinyLLaDAConfig


class TinyLLaDAModelLM(LlamaForCausalLM):
    config_class = TinyLLaDAConfig
"""


@pytest.fixture()
def remote_code_checkpoint(tmp_path):
    """A local checkpoint folder whose model class lives in its own `modeling_tiny_llada.py`."""
    model, tokenizer = get_tiny_llada_like_lm(seed=0)
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "configuration_tiny_llada.py").write_text(CONFIGURATION)
    (folder / "modeling_tiny_llada.py").write_text(MODELING)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="tiny_llada",
        architectures=["TinyLLaDAModelLM"],
        auto_map={
            "AutoConfig": "configuration_tiny_llada.TinyLLaDAConfig",
            "AutoModel": "modeling_tiny_llada.TinyLLaDAModelLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder, tokenizer


def _decode(pipe, prompt):
    return pipe(input_ids=prompt, gen_length=8, num_inference_steps=8, eos_early_stop=False, output_type="seq")


def test_a_remote_code_model_saves_and_loads_again(remote_code_checkpoint, tmp_path):
    folder, tokenizer = remote_code_checkpoint
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules")
    pipe = DiffusionLMPipeline(model, SOARScheduler(block_length=8), tokenizer, adapter="llada")
    pipe.set_progress_bar_config(disable=True)
    prompt = torch.randint(6, 262, (1, 5), generator=torch.Generator().manual_seed(0))
    expected = _decode(pipe, prompt).sequences

    pipe.save_pretrained(tmp_path / "pipe")
    index = json.loads((tmp_path / "pipe" / "model_index.json").read_text())
    assert index["model"] == ["transformers", "PreTrainedModel"]
    assert (tmp_path / "pipe" / "model" / "modeling_tiny_llada.py").is_file()

    with pytest.raises(
        ValueError, match=r"runs its own modeling code \(.*modeling_tiny_llada.py.*trust_remote_code=True"
    ):
        DiffusionLMPipeline.from_pretrained(tmp_path / "pipe")
    for loader in (DiffusionLMPipeline.from_pretrained, load_pipeline):
        loaded = loader(tmp_path / "pipe", trust_remote_code=True)
        loaded.set_progress_bar_config(disable=True)
        assert (
            type(loaded.model).__name__ == "TinyLLaDAModelLM"
            and type(loaded.adapter).__name__ == type(pipe.adapter).__name__
        )
        torch.testing.assert_close(_decode(loaded, prompt).sequences, expected)


def test_a_remote_code_model_without_an_auto_class_is_refused_before_saving(remote_code_checkpoint, tmp_path):
    folder, tokenizer = remote_code_checkpoint
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    model.config.auto_map = {"AutoConfig": "configuration_tiny_llada.TinyLLaDAConfig"}
    pipe = DiffusionLMPipeline(model, SOARScheduler(block_length=8), tokenizer, adapter="llada")
    with pytest.raises(ValueError, match="names no auto class for it"):
        pipe.save_pretrained(tmp_path / "pipe")
    assert not (tmp_path / "pipe").exists()
