"""Built-in reward functions: JPEG, brightness, colour, zoo-classifier confidence, CLIP score from a local folder."""

import numpy as np
import PIL.Image
import pytest
import torch

from diffusers_ext import zoo
from diffusers_ext.data.digits import load_digits_images
from diffusers_ext.rewards import (
    BrightnessReward,
    ClassifierReward,
    CLIPScoreReward,
    ColorReward,
    images_to_tensor,
    jpeg_compressibility,
    jpeg_incompressibility,
)


def test_image_formats_agree():
    tensor = torch.rand(2, 3, 8, 8)
    array = tensor.permute(0, 2, 3, 1).numpy()
    pil = [PIL.Image.fromarray((a * 255).round().astype(np.uint8)) for a in array]
    torch.testing.assert_close(images_to_tensor(array), tensor)
    torch.testing.assert_close(images_to_tensor(pil), tensor, atol=1 / 255, rtol=0)
    with pytest.raises(TypeError, match="a list of PIL images"):
        images_to_tensor("image.png")


def test_jpeg_rewards_prefer_flat_or_busy_images():
    flat = torch.full((1, 3, 32, 32), 0.5)
    noisy = torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(0))
    images = torch.cat([flat, noisy])
    compress = jpeg_compressibility(["a", "b"], images)
    assert compress[0] > compress[1]
    assert jpeg_incompressibility(["a", "b"], images) == [-v for v in compress]


def test_brightness_and_color_targets():
    dark, bright = torch.zeros(1, 3, 4, 4), torch.ones(1, 3, 4, 4)
    assert BrightnessReward(0.9)(["a", "b"], torch.cat([dark, bright])) == pytest.approx([-0.9, -0.1])
    red = torch.zeros(1, 3, 4, 4)
    red[:, 0] = 1
    assert ColorReward((1, 0, 0))(["a", "b"], torch.cat([red, dark])) == pytest.approx([0.0, -1.0])
    with pytest.raises(ValueError, match="target"):
        BrightnessReward(2.0)
    with pytest.raises(ValueError, match="RGB"):
        ColorReward((1, 0))


def test_classifier_reward_scores_the_prompted_digit():
    classifier = zoo.load("digits-classifier")
    images, labels = load_digits_images("heldout", resolution=8)
    images, labels = images[:20], labels[:20]
    rgb = ((images + 1) / 2).expand(-1, 3, -1, -1)
    prompts = [f"digit {int(y)}" for y in labels]
    right = ClassifierReward(classifier)(prompts, rgb, label=labels.tolist())
    wrong = ClassifierReward(classifier)(prompts, rgb, label=((labels + 1) % 10).tolist())
    assert min(right) > 0.5 and max(wrong) < 0.5
    correct = ClassifierReward(classifier, mode="correct")(prompts, rgb, label=labels.tolist())
    assert set(correct) <= {0.0, 1.0} and sum(correct) >= 19
    # Larger images are resized to the classifier's 8x8.
    big = torch.nn.functional.interpolate(rgb, size=(16, 16), mode="nearest")
    assert ClassifierReward(classifier, mode="correct")(prompts, big, label=labels.tolist()) == correct
    with pytest.raises(ValueError, match="dataset column 'label'"):
        ClassifierReward(classifier)(prompts, rgb)


def test_clip_score_reward_loads_a_local_clip_model(tmp_path):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from diffusers_ext.testing import get_tiny_clip_tokenizer

    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "vocab_size": 514,
            "max_position_embeddings": 77,
            "bos_token_id": 512,
            "eos_token_id": 513,
            "pad_token_id": 513,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 16,
            "patch_size": 8,
        },
        projection_dim=8,
    )
    CLIPModel(config).save_pretrained(tmp_path)
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}),
        tokenizer=get_tiny_clip_tokenizer(),
    )
    processor.save_pretrained(tmp_path)
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    pick = CLIPScoreReward(str(tmp_path))(["a cat", "a dog"], images)
    clip = CLIPScoreReward(str(tmp_path), scale="clip_score")(["a cat", "a dog"], images)
    assert len(pick) == 2 and all(np.isfinite(pick)) and pick[0] != pick[1]
    assert all(0 <= v <= 100 for v in clip)
    with pytest.raises(ValueError, match="scale"):
        CLIPScoreReward(str(tmp_path), scale="cosine")
