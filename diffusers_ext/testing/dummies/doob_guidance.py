"""Dummy setup of [`DoobGuidedPlannerPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A tiny random trajectory `UNet1DModel` (horizon 16, channels 8 and 16; the block layout of
`training/train_trajectory_diffusion.py`), a 20-step `DDPMScheduler`, one plan among two discs in 2 steps.
"""

import torch
from diffusers import DDPMScheduler, UNet1DModel

from ...pipelines.doob_guidance.pipeline_doob_planner import DoobGuidedPlannerPipeline
from ..registry import BadInput, register_dummy_pipeline


def get_components(seed: int = 0) -> dict:
    """A seeded tiny trajectory `UNet1DModel` and a `DDPMScheduler`."""
    torch.manual_seed(seed)
    unet = UNet1DModel(
        sample_size=16,
        in_channels=2,
        out_channels=2,
        down_block_types=("DownResnetBlock1D", "DownResnetBlock1D"),
        up_block_types=("UpResnetBlock1D",),
        mid_block_type="MidResTemporalBlock1D",
        out_block_type="OutConv1DBlock",
        block_out_channels=(8, 16),
        layers_per_block=1,
        use_timestep_embedding=True,
        time_embedding_type="positional",
        flip_sin_to_cos=False,
        freq_shift=1,
        downsample_each_block=False,
        act_fn="mish",
        norm_num_groups=8,
    )
    return {"unet": unet.eval(), "scheduler": DDPMScheduler(num_train_timesteps=20, clip_sample=False)}


def get_inputs(seed: int = 0) -> dict:
    """One plan from (-0.8, -0.8) to (0.8, 0.8) among two discs, 2 steps, seeded generator, `"np"` output."""
    return {
        "start": torch.tensor([-0.8, -0.8]),
        "goal": torch.tensor([0.8, 0.8]),
        "obstacles": torch.tensor([[0.0, 0.0, 0.2], [0.4, -0.3, 0.15]]),
        "batch_size": 1,
        "num_inference_steps": 2,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"batch_size": 0}, "batch_size"),
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"start": torch.tensor([float("nan"), -0.8])}, "start"),
    BadInput({"goal": [0.8, float("inf")]}, "goal"),
    BadInput({"obstacles": torch.tensor([[0.0, 0.0, -0.2]])}, "obstacles[:, 2]"),
    BadInput({"obstacles": torch.tensor([[float("nan"), 0.0, 0.2]])}, "obstacles"),
    BadInput({"horizon": 17}, "horizon"),
    BadInput({"latents": torch.full((1, 2, 16), float("nan"))}, "latents"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
]

register_dummy_pipeline(
    DoobGuidedPlannerPipeline,
    get_components,
    get_inputs,
    output_types=("np", "pt"),
    bad_inputs=BAD_INPUTS,
    batch_size_param="batch_size",
)
