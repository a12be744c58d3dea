"""training/train_grpo.py with one extra reward, `flat_for:<prompt>`, for the two-process `drop_zero_advantage` test.

    python tests/script_launch.py --nproc_per_node 2 tests/grpo_flat_rank_driver.py --record_dir DIR [train_grpo args]

The script's rewards all vary with the image, so none can give a group zero spread on demand. This driver runs the
script's own `main` unchanged with one reward added to its `build_reward`: `flat_for:<prompt>` is 1.0 for `<prompt>`
(a group without spread, every image of it dropped by `drop_zero_advantage`) and the image's brightness for any other
prompt. With two prompts and one group per process per step, exactly one process's micro-batch loses all its images
at every step.

Each process writes `DIR/rank<r>.json` (world size seen by `torch.distributed`, the prompts it generated for and the
`frac_samples_trained` it logged at each step) and `DIR/rank<r>_lora.safetensors` (its LoRA weights at the end,
read from its own copy of the model before the main process saves), so the test can check that the processes
stayed identical.
"""

import json
import os
import sys


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "training"))

import train_grpo  # noqa: E402


def flat_for(flat_prompt: str):
    from diffusers_ext.rewards import BrightnessReward

    brightness = BrightnessReward(1.0)

    def reward(prompts, images, **kwargs):
        values = brightness(prompts, images)
        return [1.0 if prompt == flat_prompt else float(value) for prompt, value in zip(prompts, values)]

    return reward


def main(argv: list[str]) -> None:
    if "--record_dir" not in argv:
        raise SystemExit("grpo_flat_rank_driver.py: --record_dir DIR is required")
    at = argv.index("--record_dir")
    record_dir, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    os.makedirs(record_dir, exist_ok=True)

    import torch.distributed as dist
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    from diffusers_ext import DiffusionGRPOTrainer

    original_build = train_grpo.build_reward

    def build_reward(spec: str):
        name, _, value = spec.partition(":")
        return flat_for(value) if name == "flat_for" else original_build(spec)

    train_grpo.build_reward = build_reward

    record = {"prompts": [], "frac_samples_trained": []}
    original_generate = DiffusionGRPOTrainer.generate
    original_log_metric = DiffusionGRPOTrainer.log_metric
    original_save_model = DiffusionGRPOTrainer.save_model

    def generate(self, row_ids, step):
        rollout = original_generate(self, row_ids, step)
        record["prompts"].append(sorted(set(rollout.prompts)))
        return rollout

    def log_metric(self, name, value):
        if name == "frac_samples_trained":
            record["frac_samples_trained"].append(float(value))
        return original_log_metric(self, name, value)

    def save_model(self, *args, **kwargs):
        rank = self.accelerator.process_index
        record["world_size"] = dist.get_world_size() if dist.is_initialized() else 1
        record["num_processes"] = self.accelerator.num_processes
        lora = get_peft_model_state_dict(self.unwrapped_transformer)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in lora.items()},
            os.path.join(record_dir, f"rank{rank}_lora.safetensors"),
        )
        with open(os.path.join(record_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(record, f)
        return original_save_model(self, *args, **kwargs)

    DiffusionGRPOTrainer.generate = generate
    DiffusionGRPOTrainer.log_metric = log_metric
    DiffusionGRPOTrainer.save_model = save_model
    train_grpo.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
