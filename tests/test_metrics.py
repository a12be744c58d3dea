"""Tests for diffusers_ext.metrics: every expected value is worked out by hand in the test, not by the code under test."""

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.ndimage
import torch

from diffusers_ext.metrics import (
    accuracy,
    classifier_accuracy,
    classifier_predictions,
    feature_statistics,
    frechet_distance,
    frechet_distance_from_statistics,
    peak_signal_noise_ratio,
    per_class_accuracy,
    structural_similarity,
)
from diffusers_ext.models.conv_image_classifier import ConvImageClassifier


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------------------- PSNR


def test_psnr_constant_offset_is_20_db():
    target = torch.rand(2, 3, 5, 5, generator=_generator()) * 0.9
    pred = target + 0.1
    # MSE = 0.1^2 = 0.01, so PSNR = 10 * log10(1 / 0.01) = 20 dB for every image.
    psnr = peak_signal_noise_ratio(pred, target)
    assert psnr.shape == (2,)
    assert psnr.dtype == torch.float64
    torch.testing.assert_close(psnr, torch.full((2,), 20.0, dtype=torch.float64))


def test_psnr_data_range_scaling():
    target = torch.rand(2, 1, 4, 4, generator=_generator(1)) * 0.9
    pred = target + 0.1
    # Scaling the images and data_range together leaves PSNR unchanged: 10 * log10(255^2 / (25.5^2)) = 20 dB.
    torch.testing.assert_close(
        peak_signal_noise_ratio(pred * 255, target * 255, data_range=255.0),
        torch.full((2,), 20.0, dtype=torch.float64),
    )
    # data_range 2 with MSE 0.01: 10 * log10(4 / 0.01) = 10 * log10(400).
    expected = 10 * math.log10(4 / 0.01)
    assert expected == pytest.approx(26.0206, abs=1e-4)
    torch.testing.assert_close(
        peak_signal_noise_ratio(pred, target, data_range=2.0), torch.full((2,), expected, dtype=torch.float64)
    )


def test_psnr_per_image_and_identical_images_give_inf():
    target = torch.zeros(2, 1, 2, 2)
    pred = torch.zeros(2, 1, 2, 2)
    pred[0, 0, 0, 0] = 0.5  # image 0: one of 4 pixels off by 0.5 -> MSE = 0.25 / 4 = 0.0625
    psnr = peak_signal_noise_ratio(pred, target)
    assert psnr[0].item() == pytest.approx(10 * math.log10(1 / 0.0625))  # = 10 * log10(16) ~ 12.04 dB
    assert psnr[1].item() == math.inf


def test_psnr_accepts_numpy_and_integer_images():
    target = np.full((1, 1, 3, 3), 100, dtype=np.uint8)
    pred = np.full((1, 1, 3, 3), 110, dtype=np.uint8)
    # uint8 arithmetic would wrap; in float64 the MSE is 10^2 = 100 and PSNR = 10 * log10(255^2 / 100).
    psnr = peak_signal_noise_ratio(pred, target, data_range=255)
    assert psnr.item() == pytest.approx(10 * math.log10(255**2 / 100))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"pred": torch.zeros(1, 1, 4, 4), "target": torch.zeros(1, 1, 4, 5)}, ValueError, "`pred` has shape"),
        ({"pred": torch.zeros(1, 4, 4), "target": torch.zeros(1, 4, 4)}, ValueError, "`pred` has shape"),
        ({"data_range": 0.0}, ValueError, "`data_range` is 0.0"),
        ({"data_range": -1.0}, ValueError, "`data_range` is -1.0"),
        ({"data_range": float("nan")}, ValueError, "`data_range` is nan"),
        ({"data_range": True}, TypeError, "`data_range` must be a real number"),
        ({"pred": [[0.0]]}, TypeError, "`pred` must be a torch.Tensor or a numpy.ndarray"),
        ({"target": torch.zeros(1, 1, 4, 4, dtype=torch.bool)}, TypeError, "`target` has dtype torch.bool"),
        ({"pred": torch.zeros(1, 0, 4, 4), "target": torch.zeros(1, 0, 4, 4)}, ValueError, "at least one pixel"),
        ({"target": torch.zeros(1, 1, 4, 4, device="meta")}, ValueError, "`target` on meta"),
    ],
)
def test_psnr_errors_name_the_argument(kwargs, error, match):
    arguments = {"pred": torch.zeros(1, 1, 4, 4), "target": torch.zeros(1, 1, 4, 4), **kwargs}
    with pytest.raises(error, match=match):
        peak_signal_noise_ratio(**arguments)


# ----------------------------------------------------------------------------------------------------------- SSIM


def test_ssim_identical_images_is_one():
    images = torch.rand(3, 2, 16, 16, generator=_generator(2))
    ssim = structural_similarity(images, images.clone(), window_size=7)
    assert ssim.shape == (3,)
    assert ssim.dtype == torch.float64
    torch.testing.assert_close(ssim, torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("data_range", [1.0, 2.0])
def test_ssim_of_constant_images_by_hand(data_range):
    a, b = 0.2, 0.6
    pred = torch.full((1, 1, 8, 8), a)
    target = torch.full((1, 1, 8, 8), b)
    # Every window has mu_x = a, mu_y = b and zero (co)variances, so the contrast-structure factor is C2 / C2 = 1 and
    # SSIM = (2 a b + C1) / (a^2 + b^2 + C1) with C1 = (0.01 * data_range)^2.
    c1 = (0.01 * data_range) ** 2
    expected = (2 * 0.2 * 0.6 + c1) / (0.2**2 + 0.6**2 + c1)  # data_range 1: 0.2401 / 0.4001
    ssim = structural_similarity(pred, target, data_range=data_range, window_size=5)
    assert ssim.item() == pytest.approx(expected, rel=1e-6)
    if data_range == 1.0:
        assert ssim.item() == pytest.approx(0.2401 / 0.4001, rel=1e-6)


def test_ssim_single_uniform_window_matches_hand_computation():
    x = torch.rand(2, 1, 8, 8, generator=_generator(3), dtype=torch.float64)
    y = (x + 0.2 * torch.rand(2, 1, 8, 8, generator=_generator(4), dtype=torch.float64)).clamp(0, 1)
    # window_size = image size -> one window; a huge sigma makes its weights uniform (1/64 each), so the weighted
    # moments are plain population moments of the whole image.
    ssim = structural_similarity(x, y, window_size=8, sigma=1e6)
    c1, c2 = 0.01**2, 0.03**2
    for i in range(2):
        xs, ys = x[i].flatten().tolist(), y[i].flatten().tolist()
        n = len(xs)
        mu_x, mu_y = sum(xs) / n, sum(ys) / n
        var_x = sum((v - mu_x) ** 2 for v in xs) / n
        var_y = sum((v - mu_y) ** 2 for v in ys) / n
        cov = sum((u - mu_x) * (v - mu_y) for u, v in zip(xs, ys)) / n
        expected = (2 * mu_x * mu_y + c1) * (2 * cov + c2) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
        assert ssim[i].item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("window_size", "size"), [(11, (16, 16)), (7, (8, 8)), (7, (9, 12))])
def test_ssim_matches_scipy_gaussian_filter_reference(window_size, size):
    # Independent reference: scipy's Gaussian filter (radius = window_size // 2), then crop the border where the
    # window would leave the image (the valid region), then the SSIM formula in numpy, averaged over channels.
    rng = np.random.default_rng(5)
    x = rng.random((2, 3, *size))
    y = np.clip(x + 0.15 * rng.standard_normal(x.shape), 0, 1)
    radius = window_size // 2
    sigma = 1.5

    def local_mean(image):
        filtered = scipy.ndimage.gaussian_filter(image, sigma=sigma, truncate=radius / sigma)
        return filtered[radius:-radius, radius:-radius]

    c1, c2 = 0.01**2, 0.03**2
    expected = np.zeros(2)
    for b in range(2):
        per_channel = []
        for c in range(3):
            xi, yi = x[b, c], y[b, c]
            mu_x, mu_y = local_mean(xi), local_mean(yi)
            var_x = local_mean(xi * xi) - mu_x**2
            var_y = local_mean(yi * yi) - mu_y**2
            cov = local_mean(xi * yi) - mu_x * mu_y
            ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
            per_channel.append(ssim_map.mean())
        expected[b] = np.mean(per_channel)
    ssim = structural_similarity(torch.from_numpy(x).float(), torch.from_numpy(y).float(), window_size=window_size)
    np.testing.assert_allclose(ssim.numpy(), expected, rtol=1e-6)


def test_ssim_orders_distortions_and_is_symmetric():
    rng = np.random.default_rng(6)
    # A smooth image with structure: a 2-D sinusoid plus a little texture, in [0, 1].
    grid = np.linspace(0, 2 * np.pi, 16)
    image = 0.5 + 0.35 * np.sin(grid)[:, None] * np.cos(grid)[None, :] + 0.05 * rng.standard_normal((16, 16))
    image = torch.from_numpy(np.clip(image, 0, 1))[None, None]
    noisy = (image + 0.02 * torch.randn(image.shape, generator=_generator(7), dtype=torch.float64)).clamp(0, 1)
    negated = 1 - image
    shifted = torch.roll(image, shifts=(4, 4), dims=(2, 3))
    ssim_noisy = structural_similarity(image, noisy, window_size=7).item()
    assert ssim_noisy > 0.9
    assert structural_similarity(image, negated, window_size=7).item() < ssim_noisy - 0.5
    assert structural_similarity(image, shifted, window_size=7).item() < ssim_noisy - 0.5
    assert structural_similarity(noisy, image, window_size=7).item() == pytest.approx(ssim_noisy, rel=1e-12)


def test_ssim_is_differentiable():
    x = torch.rand(1, 2, 5, 6, generator=_generator(8), dtype=torch.float64, requires_grad=True)
    y = torch.rand(1, 2, 5, 6, generator=_generator(9), dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a: structural_similarity(a, y, window_size=3), (x,))

    # float32 inputs get float32 gradients, and gradient ascent on SSIM moves an image towards its target.
    pred = torch.rand(1, 1, 8, 8, generator=_generator(10), requires_grad=True)
    target = torch.rand(1, 1, 8, 8, generator=_generator(11))
    before = structural_similarity(pred, target, window_size=5)
    before.sum().backward()
    assert pred.grad is not None and pred.grad.dtype == torch.float32
    with torch.no_grad():
        after = structural_similarity(pred + 0.01 * pred.grad / pred.grad.abs().max(), target, window_size=5)
    assert after.item() > before.item()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"window_size": 11}, ValueError, "`window_size` is 11 but the images are 8x8"),
        ({"window_size": 0}, ValueError, "`window_size` is 0"),
        ({"window_size": 7.0}, TypeError, "`window_size` must be an integer"),
        ({"sigma": 0.0}, ValueError, "`sigma` is 0.0"),
        ({"k1": -0.01}, ValueError, "`k1` is -0.01"),
        ({"k2": 0}, ValueError, "`k2` is 0"),
        ({"data_range": -2.0}, ValueError, "`data_range` is -2.0"),
        ({"target": torch.zeros(2, 1, 8, 8)}, ValueError, r"`pred` has shape \(1, 1, 8, 8\) but `target` has shape"),
        ({"pred": torch.zeros(8, 8), "target": torch.zeros(8, 8)}, ValueError, "`pred` has shape"),
        ({"pred": torch.zeros(0, 1, 8, 8), "target": torch.zeros(0, 1, 8, 8)}, ValueError, "at least one image"),
    ],
)
def test_ssim_errors_name_the_argument(kwargs, error, match):
    arguments = {"pred": torch.zeros(1, 1, 8, 8), "target": torch.zeros(1, 1, 8, 8), "window_size": 7, **kwargs}
    with pytest.raises(error, match=match):
        structural_similarity(**arguments)


# ------------------------------------------------------------------------------------------------------- Fréchet


def _moments(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def test_feature_statistics_by_hand():
    features = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 7.0]])
    # mean = (9/3, 15/3) = (3, 5); deviations (-2,-3), (0,1), (2,2); covariance = sum of outer products / (3 - 1):
    # [[4+0+4, 6+0+4], [6+0+4, 9+1+4]] / 2 = [[4, 5], [5, 7]].
    mean, covariance = feature_statistics(features)
    assert mean.dtype == covariance.dtype == torch.float64
    torch.testing.assert_close(mean, torch.tensor([3.0, 5.0], dtype=torch.float64))
    torch.testing.assert_close(covariance, torch.tensor([[4.0, 5.0], [5.0, 7.0]], dtype=torch.float64))


def test_frechet_distance_of_1d_gaussian_samples():
    a = torch.randn(50, 1, generator=_generator(12)) * 2 + 1
    b = torch.randn(40, 1, generator=_generator(13)) * 0.5 - 1
    m1, s1 = _moments(a.double().flatten().tolist())
    m2, s2 = _moments(b.double().flatten().tolist())
    expected = (m1 - m2) ** 2 + s1 + s2 - 2 * math.sqrt(s1 * s2)
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-10)


def test_frechet_distance_of_diagonal_covariance_sets_is_the_per_dimension_sum():
    # Columns 1.. of a Hadamard matrix are +-1, sum to 0 and are mutually orthogonal, so sets built from them have an
    # exactly diagonal sample covariance: scale^2 * n / (n - 1) per dimension.
    n = 16
    hadamard = scipy.linalg.hadamard(n).astype(np.float64)
    scales_a, means_a = np.array([1.0, 2.0, 0.5]), np.array([0.0, 1.0, -2.0])
    scales_b, means_b = np.array([3.0, 0.25, 0.5]), np.array([1.0, 1.0, 0.5])
    a = hadamard[:, 1:4] * scales_a + means_a
    b = hadamard[:, 5:8] * scales_b + means_b
    expected = 0.0
    for d in range(3):
        s1 = scales_a[d] ** 2 * n / (n - 1)
        s2 = scales_b[d] ** 2 * n / (n - 1)
        expected += (means_a[d] - means_b[d]) ** 2 + s1 + s2 - 2 * math.sqrt(s1 * s2)
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-10)
    assert frechet_distance(torch.from_numpy(a), torch.from_numpy(b)) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize(("num_samples", "dim"), [(200, 16), (20, 64)])  # full-rank and rank-deficient covariances
def test_frechet_distance_identity_symmetry_and_shift(num_samples, dim):
    a = torch.randn(num_samples, dim, generator=_generator(14)) * 3 + 1
    b = torch.randn(num_samples + 7, dim, generator=_generator(15)) * 2
    assert frechet_distance(a, a.clone()) == pytest.approx(0.0, abs=1e-6)
    assert frechet_distance(a, b) == pytest.approx(frechet_distance(b, a), rel=1e-9)
    # Shifting every sample by delta moves the mean by delta and leaves the covariance unchanged:
    # d = ||delta||^2 + tr(S) + tr(S) - 2 tr(S) = ||delta||^2.
    delta = torch.linspace(-1, 1, dim, dtype=torch.float64)
    expected = sum(v * v for v in delta.tolist())
    assert frechet_distance(a.double(), a.double() + delta) == pytest.approx(expected, rel=1e-8)


def test_frechet_distance_matches_scipy_sqrtm_reference():
    mixing = torch.randn(8, 8, generator=_generator(17), dtype=torch.float64)
    a = torch.randn(300, 8, generator=_generator(16), dtype=torch.float64) @ mixing  # correlated features
    b = torch.randn(250, 8, generator=_generator(18), dtype=torch.float64) * 1.5 + 0.3
    xa, xb = a.numpy(), b.numpy()
    mu1, mu2 = xa.mean(axis=0), xb.mean(axis=0)
    sigma1, sigma2 = np.cov(xa, rowvar=False), np.cov(xb, rowvar=False)
    expected = (
        np.sum((mu1 - mu2) ** 2)
        + np.trace(sigma1)
        + np.trace(sigma2)
        - 2 * np.trace(scipy.linalg.sqrtm(sigma1 @ sigma2)).real
    )
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-9)
    # The same from statistics given as numpy arrays (as loaded from a saved reference file).
    assert frechet_distance_from_statistics(mu1, sigma1, mu2, sigma2) == pytest.approx(expected, rel=1e-9)


def test_frechet_distance_from_statistics_by_hand():
    # Two Gaussians with commuting (diagonal) covariances: tr((S1 S2)^(1/2)) = sum sqrt(s1_i s2_i).
    mu1, mu2 = torch.tensor([0.0, 0.0]), torch.tensor([3.0, 4.0])
    sigma1, sigma2 = torch.diag(torch.tensor([4.0, 9.0])), torch.diag(torch.tensor([1.0, 1.0]))
    expected = (3**2 + 4**2) + (4 + 9) + (1 + 1) - 2 * (math.sqrt(4 * 1) + math.sqrt(9 * 1))  # 25 + 13 + 2 - 10
    assert expected == 30
    assert frechet_distance_from_statistics(mu1, sigma1, mu2, sigma2) == pytest.approx(30.0, rel=1e-12)


def test_frechet_distance_clamps_round_off_only(monkeypatch):
    mu = torch.zeros(3, dtype=torch.float64)
    sigma = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    true_svdvals = torch.linalg.svdvals
    # A trace term too large by 1e-12 relative (round-off) gives a tiny negative distance, returned as 0 ...
    monkeypatch.setattr(torch.linalg, "svdvals", lambda m: true_svdvals(m) * (1 + 1e-12))
    assert frechet_distance_from_statistics(mu, sigma, mu, sigma) == 0.0
    # ... but a clearly negative one is an error, not silently clamped.
    monkeypatch.setattr(torch.linalg, "svdvals", lambda m: true_svdvals(m) * 1.01)
    with pytest.raises(RuntimeError, match="negative beyond round-off"):
        frechet_distance_from_statistics(mu, sigma, mu, sigma)


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        (torch.zeros(5), torch.zeros(5, 2), "`features_a` has shape"),
        (torch.zeros(5, 2), torch.zeros(1, 2), r"`features_b` has shape \(1, 2\): 1 sample\(s\); expected at least 2"),
        (torch.zeros(5, 2), torch.zeros(5, 3), "expected the same feature_dim"),
        (torch.zeros(5, 0), torch.zeros(5, 0), "expected feature_dim >= 1"),
        (torch.tensor([[0.0], [float("nan")]]), torch.zeros(5, 1), r"`features_a` must hold finite .* index \(1, 0\)"),
        (torch.zeros(5, 2), torch.zeros(5, 2, device="meta"), "`features_b` on meta"),
    ],
)
def test_frechet_distance_errors_name_the_argument(a, b, match):
    with pytest.raises(ValueError, match=match):
        frechet_distance(a, b)


def test_feature_statistics_errors():
    with pytest.raises(ValueError, match="`features` has shape"):
        feature_statistics(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="expected at least 2 samples"):
        feature_statistics(np.zeros((1, 4)))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"mu1": torch.zeros(2, 2)}, "`mu1` has shape"),
        ({"sigma2": torch.eye(3)}, r"`sigma2` has shape \(3, 3\) but `mu2` has shape \(2,\)"),
        ({"mu2": torch.zeros(3), "sigma2": torch.eye(3)}, "`mu1` has shape .* but `mu2` has shape"),
        ({"sigma1": torch.tensor([[1.0, 0.5], [0.0, 1.0]])}, "`sigma1` is not symmetric"),
        ({"sigma2": torch.tensor([[1.0, 0.0], [0.0, -1.0]])}, "`sigma2` is not positive semi-definite"),
        ({"mu1": torch.tensor([0.0, float("inf")])}, "`mu1` must hold finite numbers, got inf at index 1"),
        (
            {"sigma1": torch.full((2, 2), float("nan"))},
            "`sigma1` must hold finite numbers, got nan at index \\(0, 0\\)",
        ),
    ],
)
def test_frechet_distance_from_statistics_errors_name_the_argument(overrides, match):
    arguments = {"mu1": torch.zeros(2), "sigma1": torch.eye(2), "mu2": torch.ones(2), "sigma2": torch.eye(2)}
    arguments.update(overrides)
    with pytest.raises(ValueError, match=match):
        frechet_distance_from_statistics(**arguments)


# ------------------------------------------------------------------------------------------------ classification


def test_accuracy_from_logits_and_predictions():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.5, 0.2, 0.9], [1.0, 0.0, 0.1]])
    labels = torch.tensor([0, 1, 1, 0])
    # argmax per row: 0, 1, 2, 0 -> correct, correct, wrong, correct = 3 / 4.
    assert accuracy(logits, labels) == 0.75
    assert accuracy(np.array([0, 1, 2, 2, 1]), np.array([0, 1, 1, 2, 0])) == pytest.approx(3 / 5)


def test_per_class_accuracy_by_hand():
    predictions = torch.tensor([0, 1, 1, 1, 0, 2])
    labels = torch.tensor([0, 0, 1, 1, 1, 2])
    # class 0: 1 of 2 right; class 1: 2 of 3; class 2: 1 of 1; class 3: no samples -> NaN.
    result = per_class_accuracy(predictions, labels, num_classes=4)
    assert result.shape == (4,) and result.dtype == torch.float64
    torch.testing.assert_close(result[:3], torch.tensor([1 / 2, 2 / 3, 1.0], dtype=torch.float64))
    assert math.isnan(result[3].item())
    # Logits of shape (N, num_classes) are reduced by argmax.
    logits = torch.nn.functional.one_hot(predictions, 4).float()
    torch.testing.assert_close(per_class_accuracy(logits, labels, 4), result, equal_nan=True)


@pytest.mark.parametrize(
    ("predictions", "labels", "error", "match"),
    [
        (torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), TypeError, "`logits_or_predictions` is 1-D with dtype"),
        (torch.tensor([0, 1]), torch.tensor([0.0, 1.0]), TypeError, "`labels` has dtype torch.float32"),
        (torch.tensor([0, 1, 1]), torch.tensor([0, 1]), ValueError, "`labels` has 2 entries but"),
        (torch.zeros(2, 3, 4), torch.tensor([0, 1]), ValueError, "`logits_or_predictions` has shape"),
        (torch.zeros(2, 3), torch.zeros(2, 1, dtype=torch.int64), ValueError, "`labels` has shape"),
        (torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64), ValueError, "`labels` is empty"),
    ],
)
def test_accuracy_errors_name_the_argument(predictions, labels, error, match):
    with pytest.raises(error, match=match):
        accuracy(predictions, labels)


@pytest.mark.parametrize(
    ("predictions", "labels", "num_classes", "error", "match"),
    [
        (torch.tensor([0, 1]), torch.tensor([0, 1]), 0, ValueError, "`num_classes` is 0"),
        (torch.tensor([0, 1]), torch.tensor([0, 1]), 2.0, TypeError, "`num_classes` must be an integer"),
        (torch.tensor([0, 1]), torch.tensor([0, 3]), 3, ValueError, r"`labels` holds class indices from 0 to 3"),
        (torch.tensor([-1, 1]), torch.tensor([0, 1]), 3, ValueError, r"`predictions` holds class indices from -1"),
        (torch.zeros(2, 4), torch.tensor([0, 1]), 3, ValueError, r"`predictions` are logits of shape \(2, 4\)"),
    ],
)
def test_per_class_accuracy_errors_name_the_argument(predictions, labels, num_classes, error, match):
    with pytest.raises(error, match=match):
        per_class_accuracy(predictions, labels, num_classes)


def _tiny_classifier() -> ConvImageClassifier:
    torch.manual_seed(0)
    return ConvImageClassifier(in_channels=1, num_classes=4, sample_size=8, block_out_channels=(4, 8), feature_dim=6)


def test_classifier_predictions_batching_and_mode():
    classifier = _tiny_classifier()
    classifier.train()
    images = torch.rand(10, 1, 8, 8, generator=_generator(19)) * 2 - 1
    predictions_1, features_1 = classifier_predictions(classifier, images, batch_size=1)
    predictions_256, features_256 = classifier_predictions(classifier, images, batch_size=256)
    predictions_3, features_3 = classifier_predictions(classifier, images.numpy(), batch_size=3)
    assert classifier.training  # the previous mode is restored
    assert predictions_1.shape == (10,) and predictions_1.dtype == torch.int64
    assert features_1.shape == (10, 6) and not features_1.requires_grad
    torch.testing.assert_close(predictions_1, predictions_256, rtol=0, atol=0)
    torch.testing.assert_close(predictions_3, predictions_256, rtol=0, atol=0)
    torch.testing.assert_close(features_1, features_256, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(features_3, features_256, rtol=1e-5, atol=1e-6)
    # The same as one forward pass in eval mode (no dropout).
    classifier.eval()
    with torch.no_grad():
        output = classifier(images)
    torch.testing.assert_close(predictions_256, output.logits.argmax(dim=1), rtol=0, atol=0)
    torch.testing.assert_close(features_256, output.features, rtol=1e-5, atol=1e-6)


def test_classifier_predictions_output_kinds():
    images = torch.arange(6, dtype=torch.float32).reshape(6, 1)

    def as_logits(batch):  # class = image value mod 3
        return torch.nn.functional.one_hot(batch[:, 0].long() % 3, 3).float()

    predictions, features = classifier_predictions(as_logits, images, batch_size=4)
    torch.testing.assert_close(predictions, torch.tensor([0, 1, 2, 0, 1, 2]))
    assert features is None
    predictions, features = classifier_predictions(lambda batch: (as_logits(batch), batch * 2), images, batch_size=4)
    torch.testing.assert_close(predictions, torch.tensor([0, 1, 2, 0, 1, 2]))
    torch.testing.assert_close(features, images * 2)


def test_classifier_accuracy_by_hand():
    images = torch.arange(6, dtype=torch.float32).reshape(6, 1)

    def classifier(batch):  # predicts class = value mod 3: 0, 1, 2, 0, 1, 2
        return torch.nn.functional.one_hot(batch[:, 0].long() % 3, 3).float()

    labels = torch.tensor([0, 1, 2, 1, 1, 0])  # right at positions 0, 1, 2, 4 -> 4 / 6
    assert classifier_accuracy(classifier, images, labels, batch_size=4) == pytest.approx(4 / 6)
    assert classifier_accuracy(_tiny_classifier(), torch.zeros(3, 1, 8, 8), np.zeros(3, dtype=np.int64)) in (
        0.0,
        1.0,
    )


def _never_called(batch):
    raise AssertionError("the classifier must not run when the inputs are invalid")


@pytest.mark.parametrize(
    ("classifier", "images", "batch_size", "error", "match"),
    [
        (_never_called, torch.zeros(4, 1), 0, ValueError, "`batch_size` is 0"),
        (_never_called, torch.zeros(4), 2, ValueError, "`images` has shape"),
        (_never_called, torch.zeros(0, 1, 8, 8), 2, ValueError, "expected at least one image"),
        ("not a model", torch.zeros(4, 1), 2, TypeError, "`classifier` must be callable"),
        (lambda batch: torch.zeros(batch.shape[0]), torch.zeros(4, 1), 2, ValueError, "`classifier` returned logits"),
        (lambda batch: "logits", torch.zeros(4, 1), 2, TypeError, "`classifier` returned str"),
        (
            lambda batch: (torch.zeros(batch.shape[0], 2), torch.zeros(1, 3)),
            torch.zeros(4, 1),
            2,
            ValueError,
            "`classifier` returned features of shape",
        ),
    ],
)
def test_classifier_predictions_errors_name_the_argument(classifier, images, batch_size, error, match):
    with pytest.raises(error, match=match):
        classifier_predictions(classifier, images, batch_size=batch_size)


def test_classifier_accuracy_checks_labels_before_running():
    with pytest.raises(ValueError, match="`labels` has 3 entries but `images` has 4 samples"):
        classifier_accuracy(_never_called, torch.zeros(4, 1), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="`labels` has dtype torch.float32"):
        classifier_accuracy(_never_called, torch.zeros(4, 1), torch.zeros(4))
