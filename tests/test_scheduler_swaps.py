"""Every diffusers scheduler that an image pipeline's model type supports swaps in ("swap schedulers as usual").

Each pipeline samples with each scheduler from the zoo's trained models and is judged by quality, not shapes: the
zoo digits classifier for the class-conditional DDPM and for Divide-and-Denoise's digit slots, the distance to the
rendered ground truth for SemanticNVS. A call must not depend on the step count of the call before it (sigma
schedulers compute `init_noise_sigma` in `set_timesteps`), and `generator`/`eta` reach only the schedulers whose
`step` takes them.
"""

import importlib.util

import diffusers
import pytest
import torch

from diffusers_ext import (
    ClassConditionalDDPMPipeline,
    DIRPPipeline,
    DivideAndDenoisePipeline,
    MultiDenoiserModel,
    SemanticNVSPipeline,
    WindowedDenoiser,
    zoo,
)
from diffusers_ext.data.digits import load_digits_images
from diffusers_ext.data.procedural_scenes import sample_scene_batch
from diffusers_ext.evaluation.divide_and_denoise.composition import digits_success, score_digit_slots
from diffusers_ext.metrics import classifier_accuracy
from diffusers_ext.pipelines.pipeline_utils import check_eta, prepare_extra_step_kwargs


# The schedulers of DDPM-family (epsilon-prediction, discrete-timestep) models, with the config a user would set.
SCHEDULERS = {
    "DDPMScheduler": {},
    "DDIMScheduler": {},
    "PNDMScheduler": {},
    "LMSDiscreteScheduler": {},
    "EulerDiscreteScheduler": {},
    "EulerAncestralDiscreteScheduler": {},
    "HeunDiscreteScheduler": {},
    "KDPM2DiscreteScheduler": {},
    "KDPM2AncestralDiscreteScheduler": {},
    "DPMSolverMultistepScheduler": {},
    # A plain swap: the zoo's saved config carries DPM-Solver's `lambda_min_clipped` for its cosine schedule
    # (`schedulers.compatibility.swap_ready_scheduler_config`), which Singlestep needs: it starts at t=999 whatever
    # `timestep_spacing` says, where alpha_bar is 2e-9.
    "DPMSolverSinglestepScheduler": {},
    "DPMSolverSDEScheduler": {},
    "DEISMultistepScheduler": {},
    "UniPCMultistepScheduler": {},
    "SASolverScheduler": {},
}
# Listed as compatible by diffusers, but not for these models.
NOT_FOR_THESE_MODELS = {
    "EDMEulerScheduler": "EDM-preconditioned models only (c_in/c_out scalings, log-sigma timesteps)",
}
STEPS, OTHER_STEPS = 8, 4  # PNDM needs at least 4 steps (its Runge-Kutta warm-up)


def _scheduler(name: str, config):
    if name == "DPMSolverSDEScheduler" and importlib.util.find_spec("torchsde") is None:
        pytest.skip("DPMSolverSDEScheduler needs the optional torchsde package")
    return getattr(diffusers, name).from_config(config, **SCHEDULERS[name])


def _equal_after_another_step_count(name, call, reference):
    """`call(steps)` on the same scheduler after a call of another step count gives `reference` again."""
    call(OTHER_STEPS)
    again = call(STEPS)
    torch.testing.assert_close(again, reference, rtol=0, atol=0, msg=f"{name}: depends on the previous call")


def test_the_list_covers_every_compatible_scheduler():
    compatible = {cls.__name__ for cls in diffusers.DDIMScheduler().compatibles}
    assert compatible <= set(SCHEDULERS) | set(NOT_FOR_THESE_MODELS), compatible - set(SCHEDULERS)


@pytest.fixture(scope="module")
def classifier():
    return zoo.load("digits-classifier").eval()


@pytest.fixture(scope="module")
def ddpm():
    pipe = zoo.load("digits-ddpm")
    pipe.set_progress_bar_config(disable=True)
    return pipe, pipe.scheduler.config


# ---------------------------------------------------------------------------------------------------------------------
# ClassConditionalDDPMPipeline
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_class_conditional_samples_its_classes_with_every_scheduler(name, ddpm, classifier):
    pipe, config = ddpm
    pipe = ClassConditionalDDPMPipeline(pipe.unet, _scheduler(name, config), null_class_label=10)
    pipe.set_progress_bar_config(disable=True)
    labels = torch.arange(10).repeat(2)

    def call(steps):
        generator = torch.Generator().manual_seed(0)
        return pipe(class_labels=labels, num_inference_steps=steps, generator=generator, output_type="pt").images

    images = call(STEPS)  # a fresh scheduler, as swapped in
    accuracy = classifier_accuracy(classifier, images * 2 - 1, labels)
    assert accuracy >= 0.9, (name, accuracy)
    _equal_after_another_step_count(name, call, images)


def test_eta_reaches_ddim_only_and_is_checked(ddpm):
    pipe, config = ddpm
    pipe = ClassConditionalDDPMPipeline(pipe.unet, diffusers.DDIMScheduler.from_config(config), null_class_label=10)
    pipe.set_progress_bar_config(disable=True)

    def call(eta, scheduler_name="DDIMScheduler"):
        pipe.scheduler = getattr(diffusers, scheduler_name).from_config(config)
        generator = torch.Generator().manual_seed(0)
        return pipe(class_labels=[1, 2], num_inference_steps=4, eta=eta, generator=generator, output_type="pt").images

    assert not torch.equal(call(0.0), call(1.0))  # DDIM's noise weight
    torch.testing.assert_close(call(0.0, "EulerDiscreteScheduler"), call(1.0, "EulerDiscreteScheduler"))
    with pytest.raises(ValueError, match="`eta` must be a finite number >= 0"):
        call(-0.5)
    with pytest.raises(TypeError, match="`eta` must be a number"):
        call("1")
    check_eta(0)
    assert prepare_extra_step_kwargs(diffusers.DDIMScheduler(), "g", 0.5) == {"eta": 0.5, "generator": "g"}
    assert prepare_extra_step_kwargs(diffusers.EulerAncestralDiscreteScheduler(), "g", 0.5) == {"generator": "g"}
    assert prepare_extra_step_kwargs(diffusers.UniPCMultistepScheduler(), "g", 0.5) == {}


# ---------------------------------------------------------------------------------------------------------------------
# DivideAndDenoisePipeline: two windowed copies of the zoo DDPM share a 8x24 canvas, one digit each
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def composer(ddpm):
    pipe, config = ddpm
    experts = [WindowedDenoiser.from_unet(pipe.unet, (8, 24), (0, left), scheduler=pipe.scheduler) for left in (0, 16)]
    composer = DivideAndDenoisePipeline(MultiDenoiserModel(experts), pipe.scheduler, null_class_label=10)
    composer.set_progress_bar_config(disable=True)
    return composer, config


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_divide_and_denoise_composes_the_digits_with_every_scheduler(name, composer, classifier):
    pipe, config = composer
    pipe.scheduler = _scheduler(name, config)

    def call(steps):
        generator = torch.Generator().manual_seed(0)
        return pipe(
            class_labels=[3, 7],
            width=24,
            num_inference_steps=steps,
            num_images_per_prompt=8,
            generator=generator,
            output_type="pt",
        ).images

    images = call(STEPS)
    present, labels = score_digit_slots(classifier, images * 2 - 1)
    success = digits_success(present, labels, [3, 7]).mean()
    assert success >= 0.75, (name, success)
    _equal_after_another_step_count(name, call, images)


# ---------------------------------------------------------------------------------------------------------------------
# SemanticNVSPipeline: the zoo model renders two target views of held-out procedural scenes
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nvs():
    pipe = SemanticNVSPipeline.from_pretrained(zoo.path("procedural-nvs"))
    pipe.set_progress_bar_config(disable=True)
    size = pipe.unet.config.sample_size
    scenes = sample_scene_batch(torch.Generator().manual_seed(10**9), 2, 3, size, azimuth_offsets_deg=[0, 30, -30])
    config = pipe.scheduler.config

    def call(steps):
        return pipe(
            images=scenes["images"][:, :1],
            input_intrinsics=scenes["intrinsics"][:, :1],
            input_c2w=scenes["c2w"][:, :1],
            target_intrinsics=scenes["intrinsics"][:, 1:],
            target_c2w=scenes["c2w"][:, 1:],
            depths=scenes["depths"][:, :1],
            num_inference_steps=steps,
            generator=torch.Generator().manual_seed(0),
            output_type="pt",
        ).images

    def error(images):
        return float((images - scenes["images"][:, 1:]).pow(2).mean())

    pipe.scheduler = diffusers.DDIMScheduler.from_config(config)
    return pipe, config, call, error, error(call(STEPS))


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_semantic_nvs_renders_the_scenes_with_every_scheduler(name, nvs):
    pipe, config, call, error, ddim_error = nvs
    pipe.scheduler = _scheduler(name, config)
    images = call(STEPS)
    # The zoo's DDIM sampler: mean squared error 0.04 to the ground truth; a mis-scaled start saturates (0.17).
    assert error(images) <= 1.5 * ddim_error, (name, error(images), ddim_error)
    _equal_after_another_step_count(name, call, images)


# ---------------------------------------------------------------------------------------------------------------------
# DIRPPipeline: DDIM inversion reads only the scheduler's noise schedule
# ---------------------------------------------------------------------------------------------------------------------


def test_dirp_inverts_with_the_schedule_of_every_scheduler(ddpm):
    pipe, config = ddpm
    images = load_digits_images("heldout", resolution=8)[0][:4]
    errors = {}
    for name in SCHEDULERS:
        if name == "DPMSolverSDEScheduler" and importlib.util.find_spec("torchsde") is None:
            continue
        dirp = DIRPPipeline(pipe.unet, _scheduler(name, config), null_class_label=10)
        errors[name] = dirp.reconstruction_error(images, num_inversion_steps=4)
    for name, value in errors.items():
        torch.testing.assert_close(value, errors["DDIMScheduler"], msg=name)
    flow = DIRPPipeline(pipe.unet, diffusers.FlowMatchEulerDiscreteScheduler(), null_class_label=10)
    with pytest.raises(TypeError, match="FlowMatchEulerDiscreteScheduler has none"):
        flow.reconstruction_error(images, num_inversion_steps=4)


def test_the_zoo_configs_of_the_cosine_schedule_carry_dpm_solvers_clip():
    from diffusers_ext.schedulers.compatibility import COSINE_LAMBDA_MIN_CLIPPED, swap_ready_scheduler_config

    for name in ("digits-ddpm", "procedural-nvs", "procedural-nvs-baseline"):
        config = zoo.load(name).scheduler.config
        assert config["beta_schedule"] == "squaredcos_cap_v2"
        assert config["lambda_min_clipped"] == COSINE_LAMBDA_MIN_CLIPPED, name
        swapped = diffusers.DPMSolverSinglestepScheduler.from_config(config)  # what a user's plain swap gets
        assert swapped.config.lambda_min_clipped == COSINE_LAMBDA_MIN_CLIPPED
    linear = swap_ready_scheduler_config({"beta_schedule": "linear"})
    assert "lambda_min_clipped" not in linear  # only the cosine schedule needs it
    assert swap_ready_scheduler_config({"beta_schedule": "squaredcos_cap_v2", "lambda_min_clipped": -3.0}) == {
        "beta_schedule": "squaredcos_cap_v2",
        "lambda_min_clipped": -3.0,
    }
