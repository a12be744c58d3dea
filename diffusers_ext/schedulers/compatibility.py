"""Scheduler compatibility across diffusers and diffusers_ext: the `compatibles` list in both directions.

diffusers resolves the names in a scheduler's `_compatibles` inside the `diffusers` module only, so a diffusers
scheduler cannot list a third-party one, and a diffusers_ext scheduler's own `compatibles` would miss itself.
[`compatible_schedulers`] resolves names in both packages and adds, for a diffusers scheduler, every diffusers_ext
scheduler that declares it compatible: what a user can pass `pipe.scheduler.config` to with `from_config`.
"""

import importlib

from diffusers.utils import DummyObject

from ..utils import public


# diffusers_ext schedulers that declare diffusers schedulers in their `_compatibles` (resolved lazily).
_OUR_SCHEDULERS = ("FlowMatchSDEScheduler", "SOARScheduler")


def resolve_scheduler_class(name: str) -> type | None:
    """The scheduler class called `name` in `diffusers` or, failing that, in `diffusers_ext`; `None` if neither."""
    for package in ("diffusers", "diffusers_ext"):
        module = importlib.import_module(package)
        try:
            return getattr(module, name)
        except AttributeError:
            continue
    return None


@public
def compatible_schedulers(scheduler) -> list[type]:
    """Every scheduler class that `from_config(scheduler.config)` can build in place of `scheduler`.

    Unlike diffusers' `scheduler.compatibles`, the list includes diffusers_ext schedulers: for a
    `FlowMatchEulerDiscreteScheduler` it holds [`FlowMatchSDEScheduler`], and for a `FlowMatchSDEScheduler` it holds
    the class itself and `FlowMatchEulerDiscreteScheduler`.

    Args:
        scheduler (`SchedulerMixin` or its class): a diffusers or diffusers_ext scheduler.

    Returns:
        `list[type]`: the compatible classes, sorted by name, the scheduler's own class included; classes whose
            optional dependency is missing (diffusers' placeholders) are left out.
    """
    cls = scheduler if isinstance(scheduler, type) else type(scheduler)
    if not hasattr(cls, "_compatibles"):
        raise TypeError(f"`scheduler` must be a scheduler or scheduler class, got {scheduler!r}.")
    names = {cls.__name__, *cls._compatibles}
    for our_name in _OUR_SCHEDULERS:
        ours = resolve_scheduler_class(our_name)
        if ours is not None and cls.__name__ in ours._compatibles:
            names.add(our_name)
            names.update(ours._compatibles)
    # classes whose optional backend is missing (DPMSolverSDEScheduler without torchsde) are placeholders
    found = {
        c
        for c in (resolve_scheduler_class(name) for name in names)
        if c is not None and not isinstance(c, DummyObject)
    }
    found.add(cls)
    return sorted(found, key=lambda c: c.__name__)


class CompatiblesMixin:
    """Give a diffusers_ext scheduler diffusers' `compatibles` contract (the list holds at least the class itself):
    its `_compatibles` names resolve in `diffusers_ext` as well as `diffusers` (see [`compatible_schedulers`]). List
    it before `SchedulerMixin` among the bases."""

    @classmethod
    def _get_compatibles(cls) -> list[type]:
        return compatible_schedulers(cls)


# DPM-Solver's floor on lambda(t) = log(alpha_t / sigma_t) for the cosine schedule. At t = 999 its alpha_bar is 2e-9
# (lambda = -10), and DPMSolverSinglestepScheduler starts there whatever `timestep_spacing` says: a first step from
# there that the zoo's small models never recover from (digits: 0.73 of samples their class, against 1.0). diffusers'
# documentation suggests -5.1 for this schedule; that is enough for the digits model but not for the procedural NVS
# model (mean squared error 0.17 to the true views at 8 steps, against the DDIM sampler's 0.034). -2.0 starts the
# solver near t = 910, about where the DDIM sampler's leading spacing starts at 8 steps (t = 875), and serves both
# (tests/test_scheduler_swaps.py).
COSINE_LAMBDA_MIN_CLIPPED = -2.0


def swap_ready_scheduler_config(config) -> dict:
    """`config` (a scheduler's config) with what a plain `OtherScheduler.from_config(pipe.scheduler.config)` swap
    needs to sample well from a model of this noise schedule, kept in the config the pipeline saves.

    For the cosine schedule (`beta_schedule="squaredcos_cap_v2"`) that is DPM-Solver's `lambda_min_clipped`
    ([`COSINE_LAMBDA_MIN_CLIPPED`]): diffusers keeps a key a scheduler does not take in its config (DDIM ignores
    it), so it reaches `DPMSolverSinglestepScheduler` / `DPMSolverMultistepScheduler` through `from_config`. A key
    already in `config` is left as it is."""
    config = dict(config)
    if config.get("beta_schedule") == "squaredcos_cap_v2":
        config.setdefault("lambda_min_clipped", COSINE_LAMBDA_MIN_CLIPPED)
    return config
