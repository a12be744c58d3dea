import pytest
import torch
from transformers import Dinov2Config, Dinov2Model, Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from diffusers_ext.pipelines.semantic_nvs.semantic_features import semantic_feature_grid


def _tiny(config_class, model_class, **extra):
    torch.manual_seed(0)
    config = config_class(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        patch_size=4,
        image_size=16,
        **extra,
    )
    return model_class(config).eval()


def test_grid_shape_and_token_order():
    backbone = _tiny(Dinov2Config, Dinov2Model)
    images = torch.rand(2, 3, 16, 24, generator=torch.Generator().manual_seed(0))
    grid = semantic_feature_grid(backbone, images)
    assert grid.shape == (2, 16, 4, 6)
    # the grid is the backbone's patch tokens (CLS dropped), row-major
    pixels = (images - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)) / torch.tensor(
        [0.229, 0.224, 0.225]
    ).view(1, 3, 1, 1)
    tokens = backbone(pixel_values=pixels).last_hidden_state
    torch.testing.assert_close(grid[:, :, 1, 2], tokens[:, 1 + 1 * 6 + 2])


def test_register_tokens_are_dropped_and_resolution_resizes():
    backbone = _tiny(Dinov2WithRegistersConfig, Dinov2WithRegistersModel, num_register_tokens=2)
    grid = semantic_feature_grid(backbone, torch.rand(1, 3, 30, 30), resolution=(16, 16))
    assert grid.shape == (1, 16, 4, 4)


@pytest.mark.parametrize(
    "images, kwargs, message",
    [
        (torch.rand(1, 1, 16, 16), {}, "`images`"),
        (torch.rand(1, 3, 16, 16) * 2 - 1, {}, r"\[0, 1\]"),
        (torch.rand(1, 3, 16, 16), {"resolution": (10, 16)}, "`resolution`"),
    ],
)
def test_bad_input(images, kwargs, message):
    with pytest.raises(ValueError, match=message):
        semantic_feature_grid(_tiny(Dinov2Config, Dinov2Model), images, **kwargs)
