"""The scheduler conformance suite applied to diffusers' own schedulers (ours subclass it the same way)."""

from diffusers import DDIMScheduler, DDPMScheduler, FlowMatchEulerDiscreteScheduler

from diffusers_ext.testing import SchedulerConformanceTests


class TestDDIMSchedulerConformance(SchedulerConformanceTests):
    scheduler_class = DDIMScheduler
    scheduler_config = {"num_train_timesteps": 1000, "beta_schedule": "scaled_linear", "clip_sample": False}


class TestDDPMSchedulerConformance(SchedulerConformanceTests):
    scheduler_class = DDPMScheduler
    scheduler_config = {"num_train_timesteps": 1000, "variance_type": "fixed_small", "clip_sample": True}


class TestFlowMatchEulerDiscreteSchedulerConformance(SchedulerConformanceTests):
    scheduler_class = FlowMatchEulerDiscreteScheduler
    scheduler_config = {"num_train_timesteps": 1000, "shift": 3.0}
