#!/usr/bin/env python
"""Train a SPADE surrogate (a scalar conditional diffusion model of a design's score) on offline data.

Options are the fields of `SpadeConfig` and the script arguments below, parsed by TRL's `TrlParser` (so
`--config run.yaml` works). The data are one of the built-in offline tasks (`--task`, from
`diffusers_ext.data.offline_bbo`) or your own `--data_file` (a `.npz` with arrays `x` of shape `(N, D)` and `y` of
shape `(N,)`). The result is a `SurrogatePredictivePipeline` folder (`SurrogatePredictivePipeline.from_pretrained`;
its `model` and `scheduler` also build an `OfflineOptimizationPipeline`), with a model card;
`--resume_from_checkpoint latest` continues a run exactly.

    accelerate launch training/train_spade.py --task tfbind8 --offline_size 1000 --hidden_size 128 \
        --max_train_steps 300 --output_dir spade-tfbind8
"""

import logging
import os
import sys
from dataclasses import dataclass, field


logger = logging.getLogger("train_spade")

TASKS = ("tfbind8", "ehrlich", "ackley", "rosenbrock", "styblinski_tang")


@dataclass
class ScriptArguments:
    """What to train on and the surrogate's shape; the trainer's options come from `SpadeConfig`."""

    task: str | None = field(
        default="tfbind8", metadata={"help": f"A built-in offline task: one of {TASKS} (ignored with --data_file)."}
    )
    data_file: str | None = field(
        default=None, metadata={"help": "Your own data: a .npz file with `x` (N, D) and `y` (N,) float arrays."}
    )
    task_seed: int = field(default=0, metadata={"help": "Seed of the built-in task (another seed, another task)."})
    offline_size: int | None = field(
        default=None, metadata={"help": "Keep a random subset of this many offline points of the task."}
    )
    hidden_size: int = field(default=2048, metadata={"help": "Hidden width H (the paper's 2048; 128 on a CPU)."})
    time_embed_dim: int = field(default=128, metadata={"help": "Size of the sinusoidal time embedding (even)."})
    num_train_timesteps: int = field(default=100, metadata={"help": "Diffusion steps T of the surrogate."})


def parse_args(argv=None):
    """`(script_args, config)`; bad values fail here, before any data is built."""
    from trl import TrlParser

    from diffusers_ext.trainers.spade_config import SpadeConfig
    from diffusers_ext.training_utils import TRL_OPTION_ALIASES, add_option_aliases

    parser = TrlParser((ScriptArguments, SpadeConfig))
    parser.set_defaults(save_strategy="steps", output_dir=None)
    add_option_aliases(parser, TRL_OPTION_ALIASES)
    script_args, config = parser.parse_args_and_config(args=argv)
    if config.output_dir is None:
        raise ValueError("--output_dir is required (where checkpoints and the trained pipeline go).")
    if script_args.data_file is None and script_args.task not in TASKS:
        raise ValueError(f"--task must be one of {TASKS} (or pass --data_file), got {script_args.task!r}.")
    if script_args.data_file is not None and not (
        script_args.data_file.endswith(".npz") and os.path.isfile(script_args.data_file)
    ):
        raise ValueError(f"--data_file must be an existing .npz file, got {script_args.data_file!r}.")
    if script_args.offline_size is not None and script_args.offline_size < 2:
        raise ValueError(f"--offline_size must be >= 2, got {script_args.offline_size}.")
    for name in ("hidden_size", "num_train_timesteps"):
        if getattr(script_args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(script_args, name)}.")
    if script_args.time_embed_dim < 2 or script_args.time_embed_dim % 2:
        raise ValueError(f"--time_embed_dim must be an even integer >= 2, got {script_args.time_embed_dim}.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(config, parser)  # an upload that cannot happen fails now, not after training
    return script_args, config


def load_data(script_args):
    """`(x, y, description)`: the offline designs `(N, D)` and scores `(N,)`."""
    import numpy as np

    if script_args.data_file is not None:
        with np.load(script_args.data_file, allow_pickle=False) as data:
            missing = {"x", "y"} - set(data.files)
            if missing:
                raise ValueError(f"--data_file {script_args.data_file!r} lacks arrays {sorted(missing)}.")
            x, y = np.asarray(data["x"], dtype=np.float32), np.asarray(data["y"], dtype=np.float32)
        if x.ndim != 2 or y.reshape(-1).shape[0] != x.shape[0]:
            raise ValueError(f"--data_file: `x` must be (N, D) and `y` (N,), got {x.shape} and {y.shape}.")
        from diffusers_ext.utils import check_finite

        for name, values in (("x", x), ("y", y.reshape(-1))):  # a NaN target would train and save a NaN surrogate
            try:
                check_finite(name, values)
            except ValueError as error:
                raise ValueError(f"--data_file {script_args.data_file!r}: {error}") from None
        return x, y.reshape(-1), os.path.basename(script_args.data_file)
    from diffusers_ext.data.offline_bbo import make_task

    kwargs = {} if script_args.offline_size is None else {"offline_size": script_args.offline_size}
    task = make_task(script_args.task, seed=script_args.task_seed, **kwargs)
    return task.offline_x, task.offline_y, task.name


def main(argv=None):
    script_args, config = parse_args(argv)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    import datasets
    import diffusers
    import torch

    from diffusers_ext.models.scalar_diffusion_surrogate import ScalarDiffusionSurrogate
    from diffusers_ext.trainers.spade_trainer import SpadeTrainer

    diffusers.utils.logging.set_verbosity_info()
    x, y, description = load_data(script_args)
    torch.manual_seed(config.seed)
    model = ScalarDiffusionSurrogate(
        x_dim=x.shape[1],
        hidden_size=script_args.hidden_size,
        time_embed_dim=script_args.time_embed_dim,
        num_train_timesteps=script_args.num_train_timesteps,
    )
    trainer = SpadeTrainer(model, config, train_dataset=datasets.Dataset.from_dict({"x": x, "y": y}))
    accelerator = trainer.accelerator
    logger.info(accelerator.state)
    logger.info(f"SPADE on {description}: {x.shape[0]} points of dimension {x.shape[1]}, {config.max_steps} steps")
    history = trainer.train()
    if history and accelerator.is_main_process:
        last = history[-1]
        logger.info(f"step {int(last['step'])}: " + ", ".join(f"{k} {v:.4f}" for k, v in last.items() if k != "step"))
    trainer.save_model()
    if accelerator.is_main_process:
        logger.info(f"Saved the SurrogatePredictivePipeline to {config.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_spade.py: error: {error}", file=sys.stderr)
        sys.exit(2)
