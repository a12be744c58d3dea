import pytest
import torch
from diffusers import UNet2DModel

from diffusers_ext import SemanticMultiViewUNetModel


TINY = {
    "sample_size": 8,
    "block_out_channels": (8, 16),
    "down_block_types": ("DownBlock2D", "AttnDownBlock2D"),
    "up_block_types": ("AttnUpBlock2D", "UpBlock2D"),
    "norm_num_groups": 4,
    "attention_head_dim": 4,
    "semantic_channels": 4,
}


def _model(**overrides):
    torch.manual_seed(0)
    return SemanticMultiViewUNetModel(**{**TINY, **overrides}).eval()


def _inputs(b=2, v=3, seed=0, semantic=4):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, v, dtype=torch.bool)
    mask[:, 0] = True
    return {
        "sample": torch.randn(b, v, 3, 8, 8, generator=g),
        "timestep": torch.tensor([10, 400])[:b],
        "plucker": torch.randn(b, v, 6, 8, 8, generator=g),
        "input_mask": mask,
        "input_images": torch.randn(b, v, 3, 8, 8, generator=g),
        "semantic_features": torch.randn(b, v, semantic, 8, 8, generator=g),
        "semantic_mask": torch.ones(b, v, 1, 8, 8),
    }


@torch.no_grad()
def test_views_of_a_scene_see_each_other_and_scenes_do_not():
    model = _model()
    inputs = _inputs()
    base = model(**inputs).sample
    assert base.shape == (2, 3, 3, 8, 8)
    changed = dict(inputs, sample=inputs["sample"].clone())
    changed["sample"][0, 0] += 1.0
    out = model(**changed).sample
    assert (out[0, 1] - base[0, 1]).abs().max() > 1e-4  # view 1 of scene 0 reacts to view 0
    torch.testing.assert_close(out[1], base[1])  # scene 1 does not


@torch.no_grad()
def test_semantic_inputs_matter_and_default_to_zero():
    model = _model()
    inputs = _inputs()
    with_features = model(**inputs).sample
    without = model(**{k: v for k, v in inputs.items() if not k.startswith("semantic")}).sample
    zeros = model(
        **dict(
            inputs,
            semantic_features=torch.zeros_like(inputs["semantic_features"]),
            semantic_mask=torch.zeros_like(inputs["semantic_mask"]),
        )
    ).sample
    torch.testing.assert_close(without, zeros)
    assert (with_features - without).abs().max() > 1e-4


@torch.no_grad()
def test_single_view_initialisation_reproduces_the_pretrained_unet():
    torch.manual_seed(1)
    unet = UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        block_out_channels=(8, 16),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        attention_head_dim=4,
    ).eval()
    model = SemanticMultiViewUNetModel.from_single_view_unet(unet, semantic_channels=4).eval()
    inputs = _inputs(b=2, v=1)
    expected = unet(inputs["sample"][:, 0], inputs["timestep"]).sample
    torch.testing.assert_close(model(**inputs).sample[:, 0], expected, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_save_and_load_keep_multiview_attention(tmp_path):
    model = _model()
    inputs = _inputs()
    model.save_pretrained(tmp_path)
    loaded = SemanticMultiViewUNetModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded(**inputs).sample, model(**inputs).sample)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"plucker": torch.zeros(2, 3, 5, 8, 8)}, "`plucker`"),
        ({"input_mask": torch.zeros(2, 2, dtype=torch.bool)}, "`input_mask`"),
        ({"semantic_features": torch.zeros(2, 3, 7, 8, 8)}, "`semantic_features`"),
        ({"sample": torch.zeros(2, 3, 1, 8, 8)}, "channels"),
        ({"timestep": torch.tensor([1, 2, 3])}, "`timestep`"),
    ],
)
def test_bad_input(overrides, message):
    with pytest.raises(ValueError, match=message):
        _model()(**{**_inputs(), **overrides})


def test_needs_an_attention_block():
    with pytest.raises(ValueError, match="attention block"):
        SemanticMultiViewUNetModel(
            **{
                **TINY,
                "down_block_types": ("DownBlock2D", "DownBlock2D"),
                "up_block_types": ("UpBlock2D", "UpBlock2D"),
            }
        )
