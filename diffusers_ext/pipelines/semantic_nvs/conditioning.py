"""The semantic conditioning of the target views, shared by [`SemanticNVSPipeline`] and the training script.

Training must see the iterative features exactly as inference makes them: the same estimate of the clean views, the
same extractor and the same normalisation, and the same way of combining them with the warped features. Both sides
call these functions.
"""

import torch

from ..pipeline_utils import NoiseLevels, prediction_to_x0
from .semantic_features import semantic_feature_map


SEMANTIC_MODES = ("none", "warped", "iterative", "warped+iterative")
SUPPORTED_PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")


def x0_estimate(scheduler, model_output: torch.Tensor, sample: torch.Tensor, timesteps) -> torch.Tensor:
    r"""
    The model's estimate of the clean sample, for any DDPM/DDIM-family scheduler with `alphas_cumprod` and a
    `prediction_type` of `"epsilon"`, `"v_prediction"` or `"sample"` (`pipeline_utils.NoiseLevels`: the cumulative
    alpha at the nearest training timestep).

    Args:
        scheduler: the noise scheduler (its `alphas_cumprod` and `config.prediction_type` are read).
        model_output (`torch.Tensor` of shape `(N, ...)`): the model's prediction.
        sample (`torch.Tensor` of shape `(N, ...)`): the noisy sample the prediction was made from.
        timesteps (`int`, 0-d `torch.Tensor` or `torch.Tensor` of shape `(N,)`): the timestep of each sample.

    Returns:
        `torch.Tensor` of shape `(N, ...)`: the estimate of the clean sample (not clamped).
    """
    if model_output.shape != sample.shape:
        raise ValueError(
            f"`model_output` has shape {tuple(model_output.shape)} but `sample` has {tuple(sample.shape)}."
        )
    timesteps = torch.as_tensor(timesteps, device=sample.device)
    if timesteps.ndim > 1 or (timesteps.ndim == 1 and timesteps.shape[0] != sample.shape[0]):
        raise ValueError(
            f"`timesteps` must be a number or of shape ({sample.shape[0]},), got {tuple(timesteps.shape)}."
        )
    levels = NoiseLevels(scheduler, supported=SUPPORTED_PREDICTION_TYPES)
    signal, noise = levels.coefficients(timesteps, device=sample.device, dtype=sample.dtype)
    if timesteps.ndim:
        signal, noise = (c.reshape(-1, *([1] * (sample.ndim - 1))) for c in (signal, noise))
    return prediction_to_x0(model_output, sample, signal, noise, levels.prediction_type, SUPPORTED_PREDICTION_TYPES)


def estimate_to_images(x0: torch.Tensor) -> torch.Tensor:
    """An estimate of the clean views in the model's [-1, 1] range, clamped and mapped to [0, 1] float images (the
    semantic extractor's input range); any shape."""
    return (x0.float().clamp(-1, 1) + 1) / 2


def iterative_semantics(encoder, x0: torch.Tensor) -> torch.Tensor:
    """Iterative semantic features: the encoder's feature map ([`semantic_feature_map`]) of an estimate
    `(N, 3, H, W)` of the clean views in [-1, 1] ([`estimate_to_images`]), as a `(N, S, H, W)` float tensor."""
    if x0.ndim != 4:
        raise ValueError(f"`x0` must be (N, 3, H, W), got {tuple(x0.shape)}.")
    return semantic_feature_map(encoder, estimate_to_images(x0))


def target_semantics(
    mode: str, warped: torch.Tensor, coverage: torch.Tensor, iterative: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    The target views' semantic features and their validity mask for a `semantic_mode`.

    Args:
        mode (`str`): one of `"none"`, `"warped"`, `"iterative"`, `"warped+iterative"`.
        warped (`torch.Tensor` of shape `(..., S, H, W)`): input-view features warped to the targets.
        coverage (`torch.Tensor` of shape `(..., 1, H, W)`, bool): where the warped features landed.
        iterative (`torch.Tensor` of shape `(..., S, H, W)`, *optional*): features of the current estimate of the
            clean targets; `None` before there is one (the first denoising step), when the iterative modes fall back
            to the warped features (`"warped+iterative"`) or to nothing (`"iterative"`).

    Returns:
        `(features, mask)` of shapes `(..., S, H, W)` and `(..., 1, H, W)`, in `warped`'s dtype.
    """
    if mode not in SEMANTIC_MODES:
        raise ValueError(f"`mode` must be one of {SEMANTIC_MODES}, got {mode!r}.")
    coverage = coverage.bool()
    zeros = torch.zeros_like(warped)
    no_mask = torch.zeros(coverage.shape, dtype=warped.dtype, device=warped.device)
    if mode == "none":
        return zeros, no_mask
    if mode == "warped":
        return warped, coverage.to(warped.dtype)
    if iterative is None:
        return (warped, coverage.to(warped.dtype)) if mode == "warped+iterative" else (zeros, no_mask)
    iterative = iterative.to(warped.dtype)
    if mode == "iterative":
        return iterative, torch.ones_like(no_mask)
    return torch.where(coverage, warped, iterative), torch.ones_like(no_mask)


def unconditional_target_semantics(
    mode: str, warped: torch.Tensor, coverage: torch.Tensor, iterative: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    The target views' semantic features and mask in the unconditional branch of classifier-free guidance.

    The unconditional branch drops what comes from the input views (their images and the warped features) but keeps
    the iterative features: they describe the sample being denoised, not the condition (as in self-conditioning), so
    guidance does not amplify the model's own, possibly wrong, estimate. Arguments and shapes as in
    [`target_semantics`]; in the non-iterative modes the features are all zero.
    """
    return target_semantics("iterative" if "iterative" in mode else "none", warped, coverage, iterative)
