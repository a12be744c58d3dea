"""Risk certificates for a hypothesis picked from a finite class fixed before the data are seen.

For a class of `H` hypotheses chosen independently of a sample of `n` i.i.d. examples, and a 0-1 loss, with
probability at least `1 - delta` over the sample, *every* hypothesis `h` of the class satisfies

- Hoeffding + union bound: `R(h) <= r(h) + sqrt((ln H + ln(1 / delta)) / (2 n))`;
- kl (Chernoff) + union bound (Langford's Occam bound): `R(h) <= kl^-1(r(h), (ln H + ln(1 / delta)) / n)`, where
  `kl^-1(q, c) = max {p in [q, 1] : kl(q || p) <= c}` and `kl` is the Bernoulli relative entropy.

`r(h)` is the empirical risk on the sample. Because the bound holds for every member at once, it holds for the one
with the lowest empirical risk. By Pinsker's inequality `kl(q || p) >= 2 (p - q)^2`, so the kl bound is never looser
than the Hoeffding bound at the same `H`, `n`, `delta` (and much tighter near `r = 0`).

The kl form used here has the confidence term `ln(1 / delta)` of the one-sided binomial (Chernoff) tail; Maurer's
`ln(2 sqrt(n) / delta)` is needed for PAC-Bayes over continuous posteriors, not for a finite class, and would make
the kl bound looser than Hoeffding's at large empirical risk.
"""

import math

import torch

from ...utils import check_finite, check_positive_int, is_number


CERTIFICATE_KINDS = ("hoeffding", "kl")


def _check_certificate_arguments(num_samples, num_hypotheses, delta, kind) -> None:
    check_positive_int("num_samples", num_samples, expected="a positive int (the support size n)")
    check_positive_int("num_hypotheses", num_hypotheses, expected="a positive int (the class size |Theta|)")
    if not is_number(delta) or not 0 < delta < 1:
        raise ValueError(f"`delta` must be a number in (0, 1), got {delta!r}.")
    if kind not in CERTIFICATE_KINDS:
        raise ValueError(f"`kind` must be one of {CERTIFICATE_KINDS}, got {kind!r}.")


def complexity_term(num_samples: int, num_hypotheses: int, delta: float = 0.05) -> float:
    """The Hoeffding + union bound complexity `sqrt((ln H + ln(1 / delta)) / (2 n))` (0.284 at n = 80, H = 20,000,
    delta = 0.05)."""
    _check_certificate_arguments(num_samples, num_hypotheses, delta, "hoeffding")
    return math.sqrt((math.log(num_hypotheses) + math.log(1.0 / delta)) / (2.0 * num_samples))


def bernoulli_kl(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`kl(q || p) = q ln(q / p) + (1 - q) ln((1 - q) / (1 - p))` elementwise, with `0 ln 0 = 0` (float64)."""
    q = torch.as_tensor(q, dtype=torch.float64)
    p = torch.as_tensor(p, dtype=torch.float64).clamp(1e-300, 1 - 1e-16)
    first = torch.where(q > 0, q * torch.log(q / p), torch.zeros_like(q))
    second = torch.where(q < 1, (1 - q) * torch.log((1 - q) / (1 - p)), torch.zeros_like(q))
    return first + second


def kl_inverse(empirical_risk, budget: float, num_iterations: int = 100) -> torch.Tensor:
    """`kl^-1(q, c) = max {p in [q, 1] : kl(q || p) <= c}` by bisection (float64, any shape of `q`).

    Args:
        empirical_risk (`float` or `torch.Tensor`): `q` in `[0, 1]`.
        budget (`float` or `torch.Tensor` broadcastable with `q`): `c >= 0`.
    """
    q = torch.as_tensor(empirical_risk, dtype=torch.float64)
    if isinstance(budget, torch.Tensor):
        if torch.isnan(budget).any() or (budget < 0).any():
            raise ValueError("`budget` must be >= 0 everywhere.")
        q, budget = torch.broadcast_tensors(q, budget.to(torch.float64))
    elif not is_number(budget) or budget < 0:
        raise ValueError(f"`budget` must be a number >= 0, got {budget!r}.")
    low, high = q.clone(), torch.ones_like(q)
    for _ in range(num_iterations):
        mid = (low + high) / 2
        inside = bernoulli_kl(q, mid) <= budget
        low = torch.where(inside, mid, low)
        high = torch.where(inside, high, mid)
    return low


def finite_class_certificate(
    empirical_risk, num_samples: int, num_hypotheses: int, delta: float = 0.05, kind: str = "hoeffding"
):
    r"""
    Upper bound on the true risk of any member of a finite hypothesis class fixed before the sample was drawn.

    Args:
        empirical_risk (`float` or `torch.Tensor` of any shape): 0-1 empirical risks in `[0, 1]` on `num_samples`
            i.i.d. examples.
        num_samples (`int`): the sample size `n`.
        num_hypotheses (`int`): the class size `|Theta|` (every hypothesis that was or could have been picked).
        delta (`float`, defaults to 0.05): the bound fails with probability at most `delta`.
        kind (`str`, defaults to `"hoeffding"`): `"hoeffding"` (`r + sqrt((ln H + ln 1/delta) / 2n)`) or `"kl"`
            (`kl^-1(r, (ln H + ln 1/delta) / n)`, never looser).

    Returns:
        A `float` for a float input, else a float64 tensor of the input's shape. Hoeffding values may exceed 1 (a
        vacuous certificate); kl values never do.
    """
    _check_certificate_arguments(num_samples, num_hypotheses, delta, kind)
    is_scalar = not isinstance(empirical_risk, torch.Tensor)
    check_finite("empirical_risk", empirical_risk, minimum=0, maximum=1)
    risk = torch.as_tensor(empirical_risk, dtype=torch.float64)
    log_term = math.log(num_hypotheses) + math.log(1.0 / delta)
    if kind == "hoeffding":
        bound = risk + math.sqrt(log_term / (2.0 * num_samples))
    else:
        bound = kl_inverse(risk, log_term / num_samples)
    return float(bound) if is_scalar else bound
