"""What measures the brain-network flow: the raw upper-triangle baseline a user would pick, and the judges (validity,
kernel MMD to fresh draws of the known law, errors of the conditional mean and of the covariate trend).

The judges work on the matrices themselves (their strict upper triangle, in correlation units), not in either
method's coordinates: the flow trains in the codec's `atanh` partial-correlation coordinates and the baseline in the
raw entries, and neither is judged in its own space.
"""

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from ..metrics.sample_distances import median_bandwidth, mmd_squared
from ..utils import check_positive_int


class RawUpperTriangleCodec(ModelMixin, ConfigMixin):
    """The baseline's "codec": a correlation matrix's strict upper triangle as the vector (standardised per feature),
    decoded to the symmetric matrix with a unit diagonal. Nothing keeps a decoded matrix positive definite: that is
    what the baseline leaves to the model, and what [`validity`] measures. Same interface as
    [`CorrelationMatrixCodec`], so [`BrainNetworkFlowPipeline`] samples it unchanged."""

    @register_to_config
    def __init__(self, num_regions: int):
        super().__init__()
        check_positive_int("num_regions", num_regions)
        rows, cols = torch.triu_indices(num_regions, num_regions, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.register_buffer("mean", torch.zeros(len(rows), dtype=torch.float64))
        self.register_buffer("std", torch.ones(len(rows), dtype=torch.float64))

    @property
    def num_features(self) -> int:
        return int(self.mean.numel())

    def to_vectors(self, matrices) -> torch.Tensor:
        matrices = torch.as_tensor(matrices).to(torch.float64)
        return matrices[:, self.rows, self.cols]

    def fit(self, matrices, min_std: float = 1e-6) -> "RawUpperTriangleCodec":
        vectors = self.to_vectors(matrices)
        self.mean.copy_(vectors.mean(0))
        self.std.copy_(vectors.std(0).clamp_min(min_std))
        return self

    def encode(self, matrices) -> torch.Tensor:
        return (self.to_vectors(matrices) - self.mean) / self.std

    def decode(self, vectors: torch.Tensor) -> torch.Tensor:
        values = vectors.to(torch.float64) * self.std + self.mean
        n = self.config.num_regions
        matrices = torch.eye(n, dtype=torch.float64).repeat(len(values), 1, 1)
        matrices[:, self.rows, self.cols] = values
        matrices[:, self.cols, self.rows] = values
        return matrices


def upper_triangle(matrices: torch.Tensor) -> torch.Tensor:
    """`(batch, n, n)` -> `(batch, n (n - 1) / 2)`: the strict upper triangle, the judges' features."""
    n = matrices.shape[-1]
    rows, cols = torch.triu_indices(n, n, offset=1)
    return matrices[:, rows, cols].to(torch.float64)


def validity(matrices: torch.Tensor, atol: float = 1e-6) -> torch.Tensor:
    """`(batch,)` bool: symmetric (to `atol`), unit diagonal (to `atol`) and positive definite (a Cholesky factor
    exists)."""
    matrices = matrices.to(torch.float64)
    symmetric = (matrices - matrices.transpose(1, 2)).abs().flatten(1).amax(1) <= atol
    unit = (torch.diagonal(matrices, dim1=1, dim2=2) - 1).abs().amax(1) <= atol
    _, info = torch.linalg.cholesky_ex((matrices + matrices.transpose(1, 2)) / 2)
    return symmetric & unit & (info == 0)


def mmd_to_truth(
    samples: torch.Tensor, truth: torch.Tensor, bandwidth_scales=(0.5, 1.0, 2.0), bandwidth: float | None = None
) -> float:
    """Unbiased MMD^2 between `samples` and `truth` (`(batch, n, n)` each) on their upper triangles, with Gaussian
    kernels at `bandwidth_scales` x `bandwidth` (summed over the kernels); `bandwidth` defaults to the median pairwise
    distance of the truth draws (give a fixed one where the truth draws are not independent, e.g. overlapping
    windows of one run, whose median distance understates the spread)."""
    reference = upper_triangle(truth)
    base = median_bandwidth(reference) if bandwidth is None else bandwidth
    return mmd_squared(upper_triangle(samples), reference, [scale * base for scale in bandwidth_scales])


def mean_error(samples: torch.Tensor, true_mean: torch.Tensor) -> float:
    """Frobenius distance between the samples' mean matrix and the true conditional mean, over the off-diagonal
    entries (the diagonal is 1 for both)."""
    return float((upper_triangle(samples.mean(0, keepdim=True)) - upper_triangle(true_mean[None])).norm() * 2**0.5)


def trend_error(low: torch.Tensor, high: torch.Tensor, true_low: torch.Tensor, true_high: torch.Tensor) -> float:
    """Frobenius error of the covariate trend: the change of the samples' mean matrix from covariate `low` to `high`
    against the true conditional means' change (off-diagonal entries)."""
    change = upper_triangle(high.mean(0, keepdim=True)) - upper_triangle(low.mean(0, keepdim=True))
    true_change = upper_triangle(true_high[None]) - upper_triangle(true_low[None])
    return float((change - true_change).norm() * 2**0.5)


def codec_against_raw(units, trend_units, mmd_target: str, trend_target: str) -> dict:
    """The brain-network benchmarks' comparison of the codec flow with the raw upper-triangle flow.

    `units(method, key)` gives a method's per-unit values of `"validity"`, `"mmd2"` or `"mean_error"` and
    `trend_units(method)` its per-unit trend errors, the same units in the same order for both methods (paired).
    Returns `{"methods": {method: {key: mean_spread}}, "comparisons": {key: paired raw minus codec, without the
    values}, "targets": [validity of the codec flow = 1, raw minus codec MMD^2 and trend error minus 2 paired SE >= 0]}`
    with the two difference targets named `mmd_target` and `trend_target`.
    """
    from .protocol import mean_spread, paired_difference, target

    methods = {
        m: {
            "validity": mean_spread(units(m, "validity")),
            "mmd2": mean_spread(units(m, "mmd2")),
            "mean_error": mean_spread(units(m, "mean_error")),
            "trend_error": mean_spread(trend_units(m)),
        }
        for m in ("codec_flow", "raw_flow")
    }
    differences = {
        key: paired_difference(values("raw_flow"), values("codec_flow"))
        for key, values in (
            ("mmd2", lambda m: units(m, "mmd2")),
            ("trend_error", trend_units),
            ("mean_error", lambda m: units(m, "mean_error")),
        )
    }
    mmd, trend = differences["mmd2"], differences["trend_error"]
    targets = [
        target(
            "codec flow: validity (PD, unit diagonal) of every sample", methods["codec_flow"]["validity"]["mean"], 1.0
        ),
        target(mmd_target, mmd["difference"] - 2 * mmd["sem"], 0.0),
        target(trend_target, trend["difference"] - 2 * trend["sem"], 0.0),
    ]
    comparisons = {key: {k: v for k, v in d.items() if k != "values"} for key, d in differences.items()}
    return {"methods": methods, "comparisons": comparisons, "targets": targets}
