"""[`SchedulerConformanceTests`]: the pytest mixin that checks the diffusers scheduler contract."""

import inspect
import json
from typing import Any

import torch
from diffusers.utils import BaseOutput


def _config_items(config) -> dict[str, Any]:
    """A scheduler config without private keys, with tuples as lists (as JSON stores them)."""

    def normalise(value):
        if isinstance(value, (list, tuple)):
            return [normalise(v) for v in value]
        return value

    return {k: normalise(v) for k, v in dict(config).items() if not k.startswith("_")}


def _assert_configs_equal(actual, expected, what: str) -> None:
    actual, expected = _config_items(actual), _config_items(expected)
    differing = {
        key: (actual.get(key, "<missing>"), expected.get(key, "<missing>"))
        for key in sorted(actual.keys() | expected.keys())
        if actual.get(key, "<missing>") != expected.get(key, "<missing>")
    }
    assert not differing, f"{what}: config entries differ as (got, expected): {differing}"


class SchedulerConformanceTests:
    """pytest mixin checking the diffusers scheduler contract.

    Subclass it in a test module with a `Test` name and set `scheduler_class` (and `scheduler_config` for the
    constructor's keyword arguments). The denoising loop uses a stand-in model output `0.1 * scaled_sample` on
    samples of `sample_shape`; stochastic `step`s get a seeded `generator`.

    Attributes:
        scheduler_class (`type`): the scheduler under test.
        scheduler_config (`dict`, defaults to `{}`): constructor arguments.
        num_inference_steps (`int`, defaults to 10): steps for `set_timesteps`.
        sample_shape (`tuple`, defaults to `(2, 3, 8, 8)`): shape of the sample `(batch, channels, height, width)`.
        step_kwargs (`dict`, defaults to `{}`): extra keyword arguments of every `step` call (e.g. the mask token
            of a discrete scheduler).
        sample_shaped_outputs (`tuple[str, ...]`, *optional*): the `step` output fields that have the sample's
            shape; the other tensor fields must be per-sample (leading dimension = batch). `None`: every tensor
            field has the sample's shape, as in continuous schedulers.
    """

    scheduler_class: type | None = None
    scheduler_config: dict[str, Any] = {}
    num_inference_steps: int = 10
    sample_shape: tuple[int, ...] = (2, 3, 8, 8)
    step_kwargs: dict[str, Any] = {}
    sample_shaped_outputs: tuple[str, ...] | None = None

    def get_scheduler(self, **overrides):
        if self.scheduler_class is None:
            raise ValueError(f"{type(self).__name__} must set `scheduler_class`.")
        return self.scheduler_class(**{**self.scheduler_config, **overrides})

    def get_sample(self, seed: int = 0) -> torch.Tensor:
        return torch.randn(self.sample_shape, generator=torch.Generator("cpu").manual_seed(seed))

    def model_output(self, scaled_sample: torch.Tensor, timestep) -> torch.Tensor:
        """The stand-in denoiser; override for schedulers that need a specific prediction."""
        return 0.1 * scaled_sample

    def run_denoising_loop(self, return_dict: bool = True) -> list[Any]:
        """Run every step of a fresh scheduler; return the raw `step` outputs."""
        scheduler = self.get_scheduler()
        scheduler.set_timesteps(self.num_inference_steps)
        # Flow-matching and discrete schedulers have neither `init_noise_sigma` nor `scale_model_input`; both are
        # optional (and a discrete sample must keep its integer dtype).
        sample = self.get_sample()
        if hasattr(scheduler, "init_noise_sigma"):
            sample = sample * scheduler.init_noise_sigma
        step_kwargs = {**self.step_kwargs, "return_dict": return_dict}
        if "generator" in inspect.signature(scheduler.step).parameters:
            step_kwargs["generator"] = torch.Generator("cpu").manual_seed(0)
        outputs = []
        for t in scheduler.timesteps:
            scaled = scheduler.scale_model_input(sample, t) if hasattr(scheduler, "scale_model_input") else sample
            model_output = self.model_output(scaled, t)
            output = scheduler.step(model_output, t, sample, **step_kwargs)
            outputs.append(output)
            sample = output.prev_sample if return_dict else output[0]
        return outputs

    def test_save_pretrained_from_pretrained_round_trip(self, tmp_path):
        scheduler = self.get_scheduler()
        scheduler.save_pretrained(tmp_path)
        with open(tmp_path / self.scheduler_class.config_name, encoding="utf-8") as f:
            saved = json.load(f)
        assert saved["_class_name"] == self.scheduler_class.__name__, f"saved `_class_name` {saved['_class_name']!r}"
        loaded = self.scheduler_class.from_pretrained(tmp_path)
        assert type(loaded) is self.scheduler_class, f"from_pretrained gave a {type(loaded).__name__}"
        _assert_configs_equal(loaded.config, scheduler.config, "from_pretrained(save_pretrained(...))")

    def test_from_config_round_trip(self):
        scheduler = self.get_scheduler()
        rebuilt = self.scheduler_class.from_config(scheduler.config)
        assert type(rebuilt) is self.scheduler_class, f"from_config gave a {type(rebuilt).__name__}"
        _assert_configs_equal(rebuilt.config, scheduler.config, "from_config(scheduler.config)")

    def test_config_types_survive_save_load(self, tmp_path):
        # JSON has no tuples: a config entry documented as a tuple must come back as one, not as a list
        scheduler = self.get_scheduler()
        scheduler.save_pretrained(tmp_path)
        loaded = self.scheduler_class.from_pretrained(tmp_path)
        changed = {
            key: (type(loaded.config.get(key)).__name__, type(value).__name__)
            for key, value in scheduler.config.items()
            if not key.startswith("_") and type(loaded.config.get(key)) is not type(value)
        }
        assert not changed, (
            f"config entries whose type changed in a save/load round trip as (got, expected): {changed}"
        )

    def test_compatibles_resolve_and_round_trip(self):
        # diffusers' contract: `from_config(scheduler.config)` swaps any listed compatible scheduler in, and back
        from diffusers_ext import compatible_schedulers
        from diffusers_ext.schedulers.compatibility import resolve_scheduler_class

        unresolved = [name for name in self.scheduler_class._compatibles if resolve_scheduler_class(name) is None]
        assert not unresolved, f"`_compatibles` names no scheduler class in diffusers or diffusers_ext: {unresolved}"
        compatibles = compatible_schedulers(self.scheduler_class)
        assert self.scheduler_class in compatibles, "compatible_schedulers(cls) must include cls itself"
        scheduler = self.get_scheduler()
        for other_class in compatibles:
            other = other_class.from_config(scheduler.config)
            back = self.scheduler_class.from_config(other.config)
            assert type(back) is self.scheduler_class, f"from_config via {other_class.__name__} gave {type(back)}"
            ours = {c.__module__.split(".")[0] for c in (self.scheduler_class, other_class)} != {"diffusers"}
            # symmetry is ours to keep: diffusers' own lists are not symmetric (DDIM lists EDMEuler, not back)
            if ours and other_class is not self.scheduler_class:
                assert self.scheduler_class in compatible_schedulers(other_class), (
                    f"{self.scheduler_class.__name__} lists {other_class.__name__} as compatible, but not the reverse"
                )

    def test_set_timesteps_gives_requested_length(self):
        for num_steps in sorted({1, 2, self.num_inference_steps}):
            scheduler = self.get_scheduler()
            scheduler.set_timesteps(num_steps)
            timesteps = scheduler.timesteps
            assert isinstance(timesteps, torch.Tensor) and timesteps.ndim == 1, "`timesteps` must be a 1-D tensor"
            assert len(timesteps) == num_steps, f"set_timesteps({num_steps}) gave {len(timesteps)} timesteps"

    def test_step_output_shapes_match_sample(self):
        outputs = self.run_denoising_loop()
        assert len(outputs) == self.num_inference_steps, (
            f"{len(outputs)} steps for {self.num_inference_steps} timesteps"
        )
        for i, output in enumerate(outputs):
            assert isinstance(output, BaseOutput), f"step {i} returned {type(output).__name__}, not a BaseOutput"
            assert "prev_sample" in output, f"step {i} output has no `prev_sample`"
            if self.sample_shaped_outputs is not None:
                missing = set(self.sample_shaped_outputs) - set(output.keys())
                assert not missing, f"step {i}: output has no fields {sorted(missing)}"
            for name, value in output.items():
                if isinstance(value, torch.Tensor):
                    if self.sample_shaped_outputs is None or name in self.sample_shaped_outputs:
                        assert tuple(value.shape) == self.sample_shape, (
                            f"step {i}: `{name}` has shape {tuple(value.shape)}"
                        )
                    else:
                        assert value.ndim >= 1 and value.shape[0] == self.sample_shape[0], (
                            f"step {i}: per-sample field `{name}` has shape {tuple(value.shape)}"
                        )
                    assert torch.isfinite(value).all(), f"step {i}: `{name}` is not finite"

    def test_step_return_dict_false_matches_output_fields(self):
        as_outputs = self.run_denoising_loop(return_dict=True)
        as_tuples = self.run_denoising_loop(return_dict=False)
        for i, (output, as_tuple) in enumerate(zip(as_outputs, as_tuples)):
            assert isinstance(as_tuple, tuple), f"step {i} with return_dict=False gave {type(as_tuple).__name__}"
            fields = output.to_tuple()
            assert len(as_tuple) == len(fields), f"step {i}: tuple of {len(as_tuple)}, output has {len(fields)} fields"
            for j, (a, b) in enumerate(zip(as_tuple, fields)):
                assert torch.equal(a, b), f"step {i}: tuple element {j} differs from the output field"
