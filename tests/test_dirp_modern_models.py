"""DIRP on SDXL (DDIM inversion with pooled embeddings and time ids), SD3 and Flux (the Euler inversion of the flow
ODE on the pipeline's own noise levels), with tiny real components in float32 and in the dtype users run them in.
The tests parametrized by `modern_pipelines.dtype_cases` carry the `support_cell` markers of docs/support.md."""

import pytest
import torch
from modern_pipelines import dtype_cases, resolution, tiny_pipeline

from diffusers_ext import DIRPPipeline
from diffusers_ext.pipelines.dirp.flow_inversion import flow_inversion_sigmas, flow_invert, flow_round_trip


def _dirp(family, dtype=torch.float32):
    return DIRPPipeline.from_pipe(tiny_pipeline(family, dtype), dtype=dtype)


def _images(family, n=2, seed=0):
    side = resolution(family)
    return torch.rand(n, 3, side, side, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family, dtype", dtype_cases("dirp"))
def test_dirp_purifies_with_a_callback_batches_like_singles_and_round_trips_through_a_folder(family, dtype, tmp_path):
    pipe = _dirp(family, dtype)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.model_family == family and pipe.denoiser.dtype == dtype
    images = _images(family)
    seen = []

    def callback(pipeline, step, timestep, tensors):
        assert torch.isfinite(tensors["images"]).all() and torch.isfinite(tensors["reconstruction"]).all()
        seen.append(step)
        return {}

    out = pipe(
        images,
        num_inversion_steps=2,
        num_iterations=3,
        learning_rate=0.01,
        perceptual="l2",
        perceptual_budget=0.05,
        output_type="pt",
        callback_on_step_end=callback,
        callback_on_step_end_tensor_inputs=["images", "reconstruction"],
    )
    assert seen == [0, 1, 2]
    assert out.images.shape == images.shape and 0 <= out.images.min() and out.images.max() <= 1
    for value in (out.recon_error_before, out.recon_error_after, out.perceptual_distance, out.loss_history):
        assert torch.isfinite(value).all()
    if dtype == torch.float32:  # three Adam steps lower the reconstruction error of random images
        assert (out.recon_error_after < out.recon_error_before).all()

    tolerance = {"atol": 1e-6, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-3, "rtol": 5e-2}
    batched = pipe.reconstruction_error(images, num_inversion_steps=2)
    singles = torch.cat([pipe.reconstruction_error(images[i : i + 1], num_inversion_steps=2) for i in range(2)])
    torch.testing.assert_close(batched, singles, **tolerance)

    pipe.save_pretrained(tmp_path)
    loaded = DIRPPipeline.from_pretrained(tmp_path, dtype=dtype)
    assert type(loaded.denoiser) is type(pipe.denoiser) and loaded.model_family == family
    torch.testing.assert_close(loaded.reconstruction_error(images, num_inversion_steps=2), batched, atol=0, rtol=0)


@pytest.mark.parametrize("family, pipeline_kwargs", [("sd3", {}), ("flux", {"max_sequence_length": 8})])
def test_flow_inversion_runs_on_the_levels_the_pipeline_samples_with(family, pipeline_kwargs):
    pipe = tiny_pipeline(family)
    side, steps = resolution(family), 4
    pipe("a", num_inference_steps=steps, height=side, width=side, output_type="latent", **pipeline_kwargs)
    used = pipe.scheduler.sigmas.double().flip(0)  # the text-to-image call's levels, ascending with the final 0
    dirp = DIRPPipeline.from_pipe(pipe)
    latents = torch.zeros(1, dirp.denoiser.config.in_channels // (4 if family == "flux" else 1), side, side)
    sigmas = flow_inversion_sigmas(
        dirp.scheduler, steps, 1.0, dirp.image_seq_len(latents), flux_levels=family == "flux"
    )
    torch.testing.assert_close(sigmas, used, atol=1e-6, rtol=0)
    assert sigmas[-1] == 1.0 and sigmas[0] == 0.0
    half = flow_inversion_sigmas(dirp.scheduler, 2, 0.5, dirp.image_seq_len(latents), flux_levels=family == "flux")
    assert len(half) == 3 and 0 < half[-1] < 1  # partial inversion stops short of pure noise


def test_flow_round_trip_is_exact_with_agreeing_velocities_and_not_otherwise():
    sigmas = torch.tensor([0.0, 0.2, 0.5, 1.0], dtype=torch.float64)
    z0 = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(0))

    def level_only(z, sigma):  # the same velocity at a level wherever it is asked
        return torch.full_like(z, float(sigma)) + torch.arange(z.numel()).view_as(z) * 0.01

    inverted = flow_invert(level_only, z0, sigmas)
    assert (inverted - z0).abs().max() > 0.1
    torch.testing.assert_close(flow_round_trip(level_only, z0, sigmas), z0, atol=1e-6, rtol=0)

    def state_dependent(z, sigma):  # a model: the estimate moves between z_k and z_{k+1}
        return torch.tanh(z) * float(sigma)

    z = z0.clone().requires_grad_(True)
    error = (flow_round_trip(state_dependent, z, sigmas, use_checkpoint=True) - z).pow(2).sum()
    assert error > 1e-4
    error.backward()
    assert z.grad.abs().max() > 0  # the gradient flows through every model call (checkpointed)


def test_prompts_reach_sdxl_pooled_embeddings_and_time_ids():
    pipe = _dirp("sdxl")
    family = pipe.denoiser_family()
    cond = family.encode_prompts(["a photo of a cat", ""], "prompt", (16, 24))
    assert cond.tensors["time_ids"].tolist() == [[16, 24, 0, 0, 16, 24]] * 2
    assert (cond.tensors["text_embeds"][0] - cond.tensors["text_embeds"][1]).abs().max() > 0
    images = _images("sdxl", n=1)
    cat = pipe.reconstruction_error(images, num_inversion_steps=2, prompt="a photo of a cat")
    empty = pipe.reconstruction_error(images, num_inversion_steps=2)
    assert not torch.equal(cat, empty)  # the prompt conditions the inversion


@pytest.mark.parametrize("family", ["sdxl", "sd3", "flux"])
def test_bad_inputs_are_refused_before_model_work(family):
    pipe = _dirp(family)
    with pytest.raises(ValueError, match="`prompt_embeds` are taken for SD 1.x / 2.x UNets"):
        pipe(_images(family), prompt_embeds=torch.zeros(1, 4, 8), num_iterations=1)
    side = resolution(family) + 1
    with pytest.raises(ValueError, match=f"not a multiple of {pipe.size_multiple}"):
        pipe(torch.rand(1, 3, side, side), num_iterations=1)
    if family != "sdxl":
        from diffusers import DDIMScheduler

        with pytest.raises(TypeError, match="needs a FlowMatchEulerDiscreteScheduler"):
            DIRPPipeline(transformer=pipe.transformer, scheduler=DDIMScheduler(), vae=pipe.vae)(
                _images(family), num_iterations=1
            )


def test_a_unet_and_a_transformer_together_are_refused():
    sdxl, sd3 = tiny_pipeline("sdxl"), tiny_pipeline("sd3")
    with pytest.raises(ValueError, match="`unet` .* or `transformer` .*, not both"):
        DIRPPipeline(unet=sdxl.unet, transformer=sd3.transformer, scheduler=sd3.scheduler)


@pytest.mark.parametrize("family", ["sdxl", "sd3", "flux"])
def test_purify_command_takes_the_family_folder(family, tmp_path):
    import PIL.Image

    from diffusers_ext.cli import main

    folder = tmp_path / "model"
    tiny_pipeline(family).save_pretrained(folder)
    side = resolution(family)
    (tmp_path / "in").mkdir()
    pixels = (_images(family, n=1)[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
    PIL.Image.fromarray(pixels).save(tmp_path / "in" / "a.png")
    out = tmp_path / "out"
    argv = ["purify", str(tmp_path / "in"), "--out", str(out), "--model", str(folder), "--resolution", str(side)]
    assert main([*argv, "--num_iterations", "1", "--num_inversion_steps", "2"]) == 0
    assert PIL.Image.open(out / "a.png").size == (side, side)
