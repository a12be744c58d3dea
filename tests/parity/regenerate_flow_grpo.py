"""Regenerate `fixtures/flow_grpo.json`: Flow-GRPO's and Flow-CPS's SDE step, log-probability, clipped loss and KL
term, computed by the reference code on fixed inputs.

The reference is not part of this repository. Check the two repositories out locally and run

    python tests/parity/regenerate_flow_grpo.py --flow_grpo_repo PATH/flow_grpo --flow_cps_repo PATH/FlowCPS

`sde_step_with_logprob` is imported from each copy's `flow_grpo/diffusers_patch/sd3_sde_with_logprob.py` (Flow-GRPO
holds the `"sde"` step, Flow-CPS the `"cps"` step). The clipped policy loss and the KL term live inline in the
references' `scripts/train_sd3.py` training loop (Flow-GRPO lines 881-897, Flow-CPS 886-902 at the commits recorded in
the fixture); `reference_losses` below evaluates those expressions on the step's outputs. The test
(`test_flow_grpo_reference_parity.py`) rebuilds the same inputs with `build_inputs` and compares the package's side.
"""

import argparse
import importlib.util
import json
from pathlib import Path

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from parity_utils import reference_commit


FIXTURE = Path(__file__).parent / "fixtures" / "flow_grpo.json"
SHAPE = (2, 4, 4, 4)
NUM_STEPS = 10
SHIFT = 3.0
NOISE_LEVEL = 0.7
BETA = 0.04
CLIP_RANGES = (1e-4, 0.2)


def build_inputs(step_index: int) -> dict[str, torch.Tensor]:
    """Deterministic float32 inputs of one step: the sample `x_t`, the policy's velocity, a second ("old") velocity
    that scored the stored sample, the reference model's velocity, a stored next sample and the advantages."""
    generator = torch.Generator().manual_seed(1000 + step_index)

    def draw(*shape):
        return torch.randn(*shape, generator=generator)

    sample = draw(*SHAPE)
    velocity = draw(*SHAPE)
    return {
        "sample": sample,
        "velocity": velocity,
        "old_velocity": velocity + 0.05 * draw(*SHAPE),
        "reference_velocity": velocity + 0.1 * draw(*SHAPE),
        "stored_prev_sample": sample - 0.1 * velocity + 0.2 * draw(*SHAPE),
        "advantages": torch.tensor([1.5, -0.75]),
        "noise_seed": torch.tensor(2000 + step_index),
    }


def reference_losses(log_prob, old_log_prob, advantages, mean, reference_mean, std_dev_t, clip_range, sde_type):
    """The references' inline loss expressions (see the module docstring), on one step's outputs."""
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    policy_loss = torch.mean(torch.maximum(unclipped, clipped))
    squared = ((mean - reference_mean) ** 2).mean(dim=(1, 2, 3), keepdim=True)
    kl = squared / (2 * std_dev_t**2) if sde_type == "sde" else squared
    return policy_loss, torch.mean(kl)


def _load_step(repo: Path):
    path = repo / "flow_grpo" / "diffusers_patch" / "sd3_sde_with_logprob.py"
    spec = importlib.util.spec_from_file_location(f"reference_sde_{repo.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sde_step_with_logprob


def run_reference(step_fn, sde_type: str) -> list[dict]:
    scheduler = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
    scheduler.set_timesteps(NUM_STEPS)
    records = []
    for i in range(NUM_STEPS):
        inputs = build_inputs(i)
        timestep = scheduler.timesteps[i].repeat(SHAPE[0])
        generator = torch.Generator().manual_seed(int(inputs["noise_seed"]))
        drawn, drawn_log_prob, mean, std_dev_t = step_fn(
            scheduler, inputs["velocity"], timestep, inputs["sample"], noise_level=NOISE_LEVEL, generator=generator
        )
        stored = inputs["stored_prev_sample"]
        _, log_prob, _, _ = step_fn(
            scheduler, inputs["velocity"], timestep, inputs["sample"], noise_level=NOISE_LEVEL, prev_sample=stored
        )
        _, old_log_prob, _, _ = step_fn(
            scheduler, inputs["old_velocity"], timestep, inputs["sample"], noise_level=NOISE_LEVEL, prev_sample=stored
        )
        _, _, reference_mean, _ = step_fn(
            scheduler, inputs["reference_velocity"], timestep, inputs["sample"], noise_level=NOISE_LEVEL
        )
        record = {
            "step_index": i,
            "prev_sample_mean": mean.flatten().tolist(),
            "drawn_prev_sample": drawn.flatten().tolist(),
            "drawn_log_prob": drawn_log_prob.tolist(),
            "log_prob": log_prob.tolist(),
            "old_log_prob": old_log_prob.tolist(),
            "std_dev_t": torch.as_tensor(std_dev_t).flatten().tolist(),
            "losses": {},
        }
        for clip_range in CLIP_RANGES:
            policy_loss, kl = reference_losses(
                log_prob, old_log_prob, inputs["advantages"], mean, reference_mean, std_dev_t, clip_range, sde_type
            )
            record["losses"][repr(clip_range)] = {"policy_loss": policy_loss.item(), "kl": kl.item()}
        records.append(record)
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flow_grpo_repo", type=Path, required=True, help="local checkout of yifan123/flow_grpo")
    parser.add_argument("--flow_cps_repo", type=Path, required=True, help="local checkout of IamCreateAI/FlowCPS")
    parser.add_argument("--flow_grpo_commit", default=None, help="commit id if the checkout is not a git work tree")
    parser.add_argument("--flow_cps_commit", default=None, help="commit id if the checkout is not a git work tree")
    args = parser.parse_args()
    fixture = {
        "config": {
            "shape": list(SHAPE),
            "num_inference_steps": NUM_STEPS,
            "shift": SHIFT,
            "noise_level": NOISE_LEVEL,
            "beta": BETA,
            "clip_ranges": list(CLIP_RANGES),
            "inputs": "tests/parity/regenerate_flow_grpo.py:build_inputs",
        },
        "sde": {
            "reference": "yifan123/flow_grpo",
            "commit": args.flow_grpo_commit or reference_commit(args.flow_grpo_repo),
            "steps": run_reference(_load_step(args.flow_grpo_repo), "sde"),
        },
        "cps": {
            "reference": "IamCreateAI/FlowCPS",
            "commit": args.flow_cps_commit or reference_commit(args.flow_cps_repo),
            "steps": run_reference(_load_step(args.flow_cps_repo), "cps"),
        },
    }
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
