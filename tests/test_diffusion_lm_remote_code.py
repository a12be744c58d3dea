"""A DiffusionLMPipeline holding a remote-code model (laid out as LLaDA / Dream checkpoints are: `config.json` with
an `auto_map`, the modeling files beside the weights) saves and loads again; a model whose modeling code was written
for transformers 4 (as LLaDA's and Dream's are) loads, decodes, rescores and round-trips under transformers 5."""

import json

import pytest
import safetensors.torch
import torch
from transformers import AutoConfig, AutoModel, Qwen2Config
from transformers.dynamic_module_utils import get_class_from_dynamic_module
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

from diffusers_ext import DiffusionLMPipeline, SOARScheduler, load_pipeline, load_remote_code_model
from diffusers_ext.pipelines.diffusion_lm.remote_code import bridge_transformers4_code, default_rope_parameters
from diffusers_ext.testing import get_tiny_llada_like_lm, get_tiny_lm_tokenizer


CONFIGURATION = """from transformers import LlamaConfig


class TinyLLaDAConfig(LlamaConfig):
    model_type = "tiny_llada"
"""
MODELING = """from transformers import LlamaForCausalLM

from .configuration_tiny_llada import TinyLLaDAConfig


class TinyLLaDAModelLM(LlamaForCausalLM):
    config_class = TinyLLaDAConfig
"""


# A masked diffusion LM written against transformers 4, with each pattern of LLaDA's and Dream's published files that
# transformers 5 breaks: the config hands `use_cache` to `PretrainedConfig.__init__` among its keyword arguments (which
# drop it) and the forward reads `config.use_cache` when called without one; `__init__` never calls `post_init()`;
# `tie_weights()` and `GenerationConfig.validate(is_init=False)` keep transformers 4's signatures; `_tied_weights_keys`
# is a list; the rotary frequencies come from `ROPE_INIT_FUNCTIONS["default"]`; `from_pretrained` is overridden to
# load its own generation config.
TRANSFORMERS4_CONFIGURATION = """from transformers import PretrainedConfig


class TinyMDMConfig(PretrainedConfig):
    model_type = "tiny_mdm"

    def __init__(
        self,
        vocab_size=262,
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        rope_theta=10000.0,
        mask_token_id=3,
        use_cache=False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.rope_theta = rope_theta
        self.mask_token_id = mask_token_id
        kwargs["use_cache"] = use_cache
        super().__init__(**kwargs)
"""
TRANSFORMERS4_MODELING = """import os

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .configuration_tiny_mdm import TinyMDMConfig


class TinyMDMGenerationConfig(GenerationConfig):
    def validate(self, is_init=False):
        pass


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class TinyMDMLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        width = config.hidden_size
        self.heads = config.num_attention_heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        inv_freq, _ = ROPE_INIT_FUNCTIONS["default"](config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, hidden, mask, position_ids):
        batch, length, width = hidden.shape
        qkv = self.qkv(self.norm1(hidden)).view(batch, length, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        angles = position_ids[:, None, :, None].float() * self.inv_freq
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
        attended = nn.functional.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, mask)
        hidden = hidden + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        return hidden + self.mlp(self.norm2(hidden))


class TinyMDMModelLM(PreTrainedModel):
    config_class = TinyMDMConfig
    _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TinyMDMLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        if os.path.isfile(os.path.join(pretrained_model_name_or_path, "generation_config.json")):
            model.generation_config = TinyMDMGenerationConfig.from_pretrained(pretrained_model_name_or_path)
        return model

    def get_input_embeddings(self):
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def tie_weights(self):
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None, return_dict=None):
        if use_cache is None:
            use_cache = self.config.use_cache
        if use_cache:
            raise ValueError("TinyMDMModelLM keeps no cache")
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        mask = attention_mask
        if mask is not None and mask.dim() == 2:
            mask = mask.bool()[:, None, None, :]
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, mask, position_ids)
        return CausalLMOutputWithPast(logits=self.lm_head(self.norm(hidden)))
"""


def _write_remote_code_checkpoint(folder, files: dict[str, str], config: dict) -> None:
    """Put modeling `files` (`{file name: source}`) beside the weights in `folder` and merge `config` into its
    `config.json` (written if absent), as a hub checkpoint with its own code is laid out."""
    for name, source in files.items():
        (folder / name).write_text(source)
    path = folder / "config.json"
    path.write_text(json.dumps({**(json.loads(path.read_text()) if path.is_file() else {}), **config}))


@pytest.fixture()
def remote_code_checkpoint(tmp_path):
    """A local checkpoint folder whose model class lives in its own `modeling_tiny_llada.py`."""
    model, tokenizer = get_tiny_llada_like_lm(seed=0)
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _write_remote_code_checkpoint(
        folder,
        {"configuration_tiny_llada.py": CONFIGURATION, "modeling_tiny_llada.py": MODELING},
        {
            "model_type": "tiny_llada",
            "architectures": ["TinyLLaDAModelLM"],
            "auto_map": {
                "AutoConfig": "configuration_tiny_llada.TinyLLaDAConfig",
                "AutoModel": "modeling_tiny_llada.TinyLLaDAModelLM",
            },
        },
    )
    return folder, tokenizer


def _tiny_mdm_weights(seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights for `TRANSFORMERS4_MODELING` at its config's defaults, built from the same torch layers (the
    checkpoint is made without the code under test)."""

    def layer():
        mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
        norms = {"norm1": torch.nn.LayerNorm(32), "norm2": torch.nn.LayerNorm(32)}
        return torch.nn.ModuleDict(
            {**norms, "qkv": torch.nn.Linear(32, 96), "out": torch.nn.Linear(32, 32), "mlp": mlp}
        )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tree = torch.nn.ModuleDict(
            {
                "embed_tokens": torch.nn.Embedding(262, 32),
                "layers": torch.nn.ModuleList([layer(), layer()]),
                "norm": torch.nn.LayerNorm(32),
                "lm_head": torch.nn.Linear(32, 262, bias=False),
            }
        )
        for norm in [tree["norm"]] + [layer[name] for layer in tree["layers"] for name in ("norm1", "norm2")]:
            torch.nn.init.normal_(norm.weight, 1.0, 0.1)  # not the identity, so the norms' weights count
    return {name: tensor.contiguous() for name, tensor in tree.state_dict().items()}


@pytest.fixture()
def transformers4_checkpoint(tmp_path):
    """A local checkpoint folder whose own modeling code is written for transformers 4 (`TRANSFORMERS4_MODELING`),
    with a generation config, and its tokenizer."""
    folder = tmp_path / "transformers4_checkpoint"
    folder.mkdir()
    safetensors.torch.save_file(_tiny_mdm_weights(seed=0), folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "generation_config.json").write_text(json.dumps({"mask_token_id": 3, "eos_token_id": 2}))
    tokenizer = get_tiny_lm_tokenizer()
    tokenizer.save_pretrained(folder)
    _write_remote_code_checkpoint(
        folder,
        {"configuration_tiny_mdm.py": TRANSFORMERS4_CONFIGURATION, "modeling_tiny_mdm.py": TRANSFORMERS4_MODELING},
        {
            "model_type": "tiny_mdm",
            "architectures": ["TinyMDMModelLM"],
            "auto_map": {
                "AutoConfig": "configuration_tiny_mdm.TinyMDMConfig",
                "AutoModel": "modeling_tiny_mdm.TinyMDMModelLM",
            },
            "use_cache": False,
            "tie_word_embeddings": False,
            "pad_token_id": 0,
            "eos_token_id": 2,
            "transformers_version": "4.46.2",
        },
    )
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


@pytest.mark.parametrize("adapter", ["llada", "dream"])
def test_a_transformers4_remote_code_model_loads_decodes_rescores_and_round_trips(
    transformers4_checkpoint, tmp_path, adapter
):
    folder, tokenizer = transformers4_checkpoint
    model = load_remote_code_model(folder, trust_remote_code=True).eval()
    assert type(model).__name__ == "TinyMDMModelLM" and type(model).__module__.startswith("transformers_modules")
    saved = safetensors.torch.load_file(folder / "model.safetensors")
    assert model.state_dict().keys() == saved.keys()
    for name, tensor in saved.items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    assert model.config.use_cache is False  # dropped by transformers 5, put back from config.json
    assert type(model.generation_config).__name__ == "TinyMDMGenerationConfig"
    assert model._tied_weights_keys == {"lm_head.weight": "embed_tokens.weight"}
    # non-persistent, so built on the meta device and left uninitialised by transformers 5 unless recomputed
    for layer in model.layers:
        torch.testing.assert_close(layer.inv_freq, default_rope_parameters(model.config)[0], rtol=0, atol=0)

    pipe = DiffusionLMPipeline(model, SOARScheduler(block_length=8), tokenizer, adapter=adapter)
    pipe.set_progress_bar_config(disable=True)
    prompt = torch.randint(6, 262, (2, 5), generator=torch.Generator().manual_seed(0))
    expected = _decode(pipe, prompt).sequences
    assert expected.shape == (2, 8) and not bool((expected == 3).any())
    padded = pipe(prompt=["ab", "hello there"], gen_length=8, num_inference_steps=8, output_type="seq")
    assert padded.sequences.shape == (2, 8)

    soar = DiffusionLMPipeline(model, SOARScheduler.from_preset(f"soar-{adapter}"), tokenizer, adapter=adapter)
    soar.set_progress_bar_config(disable=True)
    assert not bool((_decode(soar, prompt).sequences == 3).any())
    # sampled, so that each prompt ends with two different complete beams (greedy beams of a random model converge)
    sampled = {"temperature": 1.0, "eos_early_stop": False, "output_type": "seq"}
    soar.scheduler = SOARScheduler(block_length=8, max_beam_size=2)
    path = soar(input_ids=prompt, gen_length=8, generator=torch.Generator().manual_seed(0), **sampled)
    soar.scheduler = SOARScheduler(block_length=8, max_beam_size=2, beam_score="pll")
    pll = soar(input_ids=prompt, gen_length=8, generator=torch.Generator().manual_seed(0), **sampled)
    assert not bool((pll.sequences == 3).any())
    assert pll.nfe.tolist() == (path.nfe + 1).tolist()  # each prompt's complete beams were rescored

    pipe.save_pretrained(tmp_path / "pipe")
    assert (tmp_path / "pipe" / "model" / "modeling_tiny_mdm.py").is_file()
    for loader in (DiffusionLMPipeline.from_pretrained, load_pipeline):
        loaded = loader(tmp_path / "pipe", trust_remote_code=True)
        loaded.set_progress_bar_config(disable=True)
        assert type(loaded.model).__name__ == "TinyMDMModelLM" and loaded.adapter.name == adapter
        torch.testing.assert_close(_decode(loaded, prompt).sequences, expected)


def test_a_model_built_from_a_transformers4_config_decodes_though_its_config_lost_use_cache(transformers4_checkpoint):
    # built, not loaded: nothing puts `use_cache` back, and the forward reads it unless the adapter passes one
    folder, tokenizer = transformers4_checkpoint
    bridge_transformers4_code(get_class_from_dynamic_module("modeling_tiny_mdm.TinyMDMModelLM", folder))
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    assert not hasattr(config, "use_cache")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModel.from_config(config, trust_remote_code=True).eval()
    for preset in ("llada", "soar-llada"):
        pipe = DiffusionLMPipeline(model, SOARScheduler.from_preset(preset, block_length=8), tokenizer)
        pipe.set_progress_bar_config(disable=True)
        prompt = torch.randint(6, 262, (1, 5), generator=torch.Generator().manual_seed(0))
        assert not bool((_decode(pipe, prompt).sequences == 3).any())


def test_bridging_transformers4_code_twice_changes_nothing(transformers4_checkpoint):
    folder, _ = transformers4_checkpoint
    model_class = get_class_from_dynamic_module("modeling_tiny_mdm.TinyMDMModelLM", folder)
    bridge_transformers4_code(model_class)
    bridged = {name: vars(model_class)[name] for name in ("__init__", "tie_weights", "_tied_weights_keys")}
    bridge_transformers4_code(model_class)
    assert {name: vars(model_class)[name] for name in bridged} == bridged


def test_default_rope_parameters_are_transformers_plain_rope():
    config = Qwen2Config(hidden_size=64, num_attention_heads=4, rope_theta=500000.0)
    inv_freq, scaling = default_rope_parameters(config, torch.device("cpu"))
    expected, expected_scaling = Qwen2RotaryEmbedding.compute_default_rope_parameters(config)
    torch.testing.assert_close(inv_freq, expected)
    assert scaling == expected_scaling == 1.0
    torch.testing.assert_close(default_rope_parameters(base=500000.0, dim=16)[0], expected)


def test_load_remote_code_model_refuses_untrusted_code_and_checkpoints_without_their_own(
    transformers4_checkpoint, tmp_path
):
    folder, _ = transformers4_checkpoint
    with pytest.raises(ValueError, match=r"`trust_remote_code` must be True .*got False"):
        load_remote_code_model(folder)
    model, _ = get_tiny_llada_like_lm(seed=0)
    model.save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match=r"`pretrained_model_name_or_path` .* must name its model class"):
        load_remote_code_model(tmp_path / "plain", trust_remote_code=True)


def _fill_hub_cache(cache_dir, repo_id: str, folder, commit: str = "0123456789abcdef0123456789abcdef01234567"):
    """Put a saved pipeline `folder` into `cache_dir` as `huggingface_hub` lays a downloaded repository out:
    `models--{owner}--{name}/snapshots/{commit}/...`, `refs/main` naming the commit, the files in `blobs/` by their
    hash and linked from the snapshot."""
    import hashlib
    import os

    repo = cache_dir / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)


def test_a_saved_remote_code_pipeline_reloads_from_a_hub_repository_offline(
    remote_code_checkpoint, tmp_path, monkeypatch
):
    import huggingface_hub

    folder, tokenizer = remote_code_checkpoint
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    pipe = DiffusionLMPipeline(model, SOARScheduler(block_length=8), tokenizer, adapter="llada")
    pipe.set_progress_bar_config(disable=True)
    prompt = torch.randint(6, 262, (1, 5), generator=torch.Generator().manual_seed(0))
    expected = _decode(pipe, prompt).sequences
    pipe.save_pretrained(tmp_path / "pipe")
    cache_dir = tmp_path / "hub"
    _fill_hub_cache(cache_dir, "someone/tiny-llada-pipeline", tmp_path / "pipe")

    # no network: the repository resolves from the cache alone
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        DiffusionLMPipeline.from_pretrained("someone/tiny-llada-pipeline", cache_dir=cache_dir)
    loaded = DiffusionLMPipeline.from_pretrained(
        "someone/tiny-llada-pipeline", cache_dir=cache_dir, trust_remote_code=True
    )
    loaded.set_progress_bar_config(disable=True)
    assert type(loaded.model).__name__ == "TinyLLaDAModelLM" and loaded.adapter.name == "llada"
    assert str(cache_dir) in str(loaded.model.name_or_path)
    torch.testing.assert_close(_decode(loaded, prompt).sequences, expected)
    # a repository that is not in the cache goes to diffusers' loader, which says so
    with pytest.raises(OSError):
        DiffusionLMPipeline.from_pretrained("someone/absent", cache_dir=cache_dir, trust_remote_code=True)
