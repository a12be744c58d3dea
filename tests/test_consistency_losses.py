"""Consistency training pieces: augmentations, the AYT feature network, the manifold feature distance, ECT losses."""

import pytest
import torch
from diffusers import CMStochasticIterativeScheduler, ConsistencyModelPipeline, UNet2DModel

from diffusers_ext import AugmentationRegressor, ManifoldFeatureDistance
from diffusers_ext.data.image_augmentations import (
    AUGMENTATION_LABELS,
    GreyscaleAugmentationConfig,
    augment_with_labels,
)
from diffusers_ext.losses.consistency import (
    EasyConsistencySchedule,
    consistency_model_output,
    consistency_training_loss,
    pseudo_huber_constant,
)
from diffusers_ext.losses.manifold_feature_distance import normalized_distance_gradient


def _images(n=6, seed=0):
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _regressor(seed=0):
    torch.manual_seed(seed)
    return AugmentationRegressor(sample_size=8, block_out_channels=(4, 8), layers_per_block=1)


def _unet(seed=0):
    torch.manual_seed(seed)
    return UNet2DModel(
        sample_size=8,
        in_channels=1,
        out_channels=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D",) * 2,
        up_block_types=("UpBlock2D",) * 2,
        layers_per_block=1,
        norm_num_groups=4,
    )


def test_augmentations_report_what_they_did():
    images = _images(64)
    same, labels = augment_with_labels(images, torch.Generator().manual_seed(0), GreyscaleAugmentationConfig(p=0.0))
    torch.testing.assert_close(same, images, atol=1e-5, rtol=0)
    assert labels.shape == (64, len(AUGMENTATION_LABELS)) and torch.all(labels == 0)

    out, labels = augment_with_labels(images, torch.Generator().manual_seed(0), GreyscaleAugmentationConfig(p=1.0))
    assert out.shape == images.shape and not torch.allclose(out, images)
    assert (labels != 0).float().mean() > 0.9
    # At the default p each augmentation is rare, and images that drew none come back unchanged.
    config = GreyscaleAugmentationConfig(p=0.15)
    out, labels = augment_with_labels(images, torch.Generator().manual_seed(1), config)
    applied = labels != 0
    assert 0.05 < applied.float().mean() < 0.3
    untouched = ~applied.any(dim=1)
    torch.testing.assert_close(out[untouched], images[untouched], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="`images` must be a tensor"):
        augment_with_labels(torch.rand(8, 8))
    with pytest.raises(ValueError, match="`p` must lie in"):
        GreyscaleAugmentationConfig(p=1.5)


def test_augmentation_regressor_round_trip_and_maps(tmp_path):
    model = _regressor()
    out = model(_images(3))
    assert out.predictions.shape == (3, len(AUGMENTATION_LABELS))
    assert [tuple(m.shape) for m in out.feature_maps] == [(3, 4, 4, 4), (3, 8, 2, 2), (3, 9, 1, 1)]
    model.save_pretrained(tmp_path)
    loaded = AugmentationRegressor.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded(_images(3)).predictions, out.predictions)
    with pytest.raises(ValueError, match=r"expected \(batch_size, 1, 8, 8\)"):
        model(torch.zeros(2, 1, 16, 16))
    assert type(model).__module__ == "diffusers_ext"


def test_manifold_feature_distance_is_a_per_sample_pseudo_huber_over_channel_maps():
    network = _regressor()
    distance = ManifoldFeatureDistance(network, epsilon=1e-3)
    x, y = _images(4, 0), _images(4, 1)
    values = distance(x, y)
    assert values.shape == (4,) and torch.all(values > 0)
    torch.testing.assert_close(distance(x, x), torch.zeros(4), atol=1e-6, rtol=0)
    torch.testing.assert_close(distance(x, y), distance(y, x))
    manual = torch.zeros(4)
    for a, b in zip(network(x).feature_maps, network(y).feature_maps):
        manual += (((a - b) ** 2).sum(dim=(2, 3)) + 1e-6).sqrt().sub(1e-3).sum(dim=1)
    torch.testing.assert_close(values, manual, rtol=1e-5, atol=1e-5)
    # One sample's distance does not depend on the others in the batch.
    torch.testing.assert_close(distance(x[:1], y[:1]), values[:1], rtol=1e-5, atol=1e-6)
    # The feature network is frozen and stays in eval mode.
    distance.train()
    assert not network.training and not any(p.requires_grad for p in network.parameters())
    with pytest.raises(ValueError, match="one shape"):
        distance(x, y[:2])
    with pytest.raises(ValueError, match="`layer_weights` has 2 entries"):
        ManifoldFeatureDistance(network, layer_weights=[1.0, 2.0])(x, y)


def test_normalized_gradient_update_moves_each_sample_one_unit_along_the_distance_gradient():
    distance = ManifoldFeatureDistance(_regressor())
    prediction = _images(5, 2).requires_grad_(True)
    target = _images(5, 3)
    direction = normalized_distance_gradient(distance, prediction, target)
    torch.testing.assert_close(direction.flatten(1).norm(dim=1), torch.ones(5), rtol=1e-5, atol=1e-5)
    # The direction of sample 0 equals the normalised gradient of sample 0's own distance.
    single = prediction[:1].detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(distance(single, target[:1]).sum(), single)
    torch.testing.assert_close(direction[:1], grad / grad.norm(), rtol=1e-4, atol=1e-6)
    # The loss's gradient with respect to the prediction is w * direction / batch (mean over the batch).
    t, r = torch.full((5,), 2.0), torch.full((5,), 1.5)
    loss = consistency_training_loss(prediction, target, t, r, "normalized_gradient", distance=distance).mean()
    (grad_prediction,) = torch.autograd.grad(loss, prediction)
    torch.testing.assert_close(grad_prediction, direction * (1 / 0.5) / 5, rtol=1e-5, atol=1e-7)
    # A step against it lowers every sample's distance.
    stepped = prediction.detach() - 1e-2 * direction
    assert torch.all(distance(stepped, target) < distance(prediction.detach(), target))


def test_pseudo_huber_and_l2_losses():
    prediction, target = _images(3, 0), _images(3, 1)
    t, r = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0.0, 1.0, 3.0])
    squared = ((prediction - target) ** 2).flatten(1).sum(1)
    torch.testing.assert_close(consistency_training_loss(prediction, target, t, r, "l2"), squared / (t - r))
    c = pseudo_huber_constant((1, 8, 8))
    assert c == pytest.approx(0.00054 * 8)
    expected = ((squared + c**2).sqrt() - c) / (t - r)
    torch.testing.assert_close(consistency_training_loss(prediction, target, t, r), expected)
    with pytest.raises(ValueError, match="`loss_type` must be one of"):
        consistency_training_loss(prediction, target, t, r, "lpips")
    with pytest.raises(ValueError, match="needs a `distance`"):
        consistency_training_loss(prediction, target, t, r, "normalized_gradient")


def test_ect_schedule_starts_with_denoising_and_shrinks_the_gap():
    schedule = EasyConsistencySchedule(total_steps=400, num_stages=4)
    assert [schedule.stage(s) for s in (0, 99, 100, 250, 399, 500)] == [0, 0, 1, 2, 3, 3]
    t, r = schedule.sample(4096, 0, torch.Generator().manual_seed(0))
    assert torch.all(r == 0) and t.min() >= 0.004 and t.max() <= 80
    gaps = []
    for step in (100, 200, 300):
        t, r = schedule.sample(4096, step, torch.Generator().manual_seed(0))
        assert torch.all((r == 0) | ((r >= 0.002) & (r < t)))
        large = t > 5  # n(t) ~ 1 there: the gap is t / q^stage
        gaps.append(((t - r) / t)[large].mean().item())
    assert gaps[0] == pytest.approx(0.5, abs=0.01) and gaps[1] == pytest.approx(0.25, abs=0.01)
    assert gaps[2] == pytest.approx(0.125, abs=0.01)
    with pytest.raises(ValueError, match="`num_stages` must lie in"):
        EasyConsistencySchedule(total_steps=3, num_stages=4)
    with pytest.raises(ValueError, match="`q` must be > 1"):
        EasyConsistencySchedule(total_steps=10, q=1.0)


def test_consistency_function_is_what_diffusers_consistency_pipeline_computes():
    unet = _unet().eval()
    scheduler = CMStochasticIterativeScheduler(clip_denoised=False)
    pipe = ConsistencyModelPipeline(unet=unet, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    # (The pipeline's `latents=` check assumes 3 channels; draw the same latents from the same generator instead.)
    latents = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    images = pipe(
        batch_size=3, num_inference_steps=1, generator=torch.Generator().manual_seed(0), output_type="pt"
    ).images
    with torch.no_grad():
        ours = consistency_model_output(unet, latents * 80.0, torch.full((3,), 80.0))
    torch.testing.assert_close(images, (ours / 2 + 0.5).clamp(0, 1), rtol=1e-4, atol=1e-5)
    # The boundary condition: at sigma_min the function returns its input.
    x = _images(2)
    with torch.no_grad():
        torch.testing.assert_close(consistency_model_output(unet, x, torch.full((2,), 0.002)), x)


def test_zoo_consistency_model_samples_digits_in_one_step_with_diffusers_pipeline():
    from diffusers_ext import zoo
    from diffusers_ext.data.digits import load_digits_images
    from diffusers_ext.metrics import classifier_predictions, frechet_distance

    pipe = zoo.load("digits-cm")
    assert isinstance(pipe, ConsistencyModelPipeline) and isinstance(pipe.scheduler, CMStochasticIterativeScheduler)
    pipe.set_progress_bar_config(disable=True)
    images = (
        pipe(
            batch_size=200, num_inference_steps=1, generator=torch.Generator().manual_seed(0), output_type="pt"
        ).images
        * 2
        - 1
    )
    classifier = zoo.load("digits-classifier")
    predictions, features = classifier_predictions(classifier, images)
    _, real = classifier_predictions(classifier, load_digits_images("heldout", resolution=8)[0])
    noise = torch.rand(200, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    _, noise_features = classifier_predictions(classifier, noise)
    # Measured 17 (300 samples; the real-vs-real reference is 2.4); uniform noise is far off.
    assert frechet_distance(features, real) < 30 < frechet_distance(noise_features, real)
    assert len(torch.unique(predictions)) >= 8
