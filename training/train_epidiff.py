#!/usr/bin/env python
"""Train EpiDiff's spatio-temporal denoiser on forecast windows of an epidemic panel (nodes x time + a graph).

The Boston influenza-like-illness rates of the `areafluforecast` wheel (`pip install --no-deps areafluforecast`):

    accelerate launch training/train_epidiff.py --output_dir epidiff-boston --dataset_name boston --horizon 7

Your own panel: a CSV of counts (first column the time, one column per region) and an adjacency CSV:

    accelerate launch training/train_epidiff.py --output_dir epidiff-mine --dataset_name csv \\
        --counts_csv counts.csv --adjacency_csv adjacency.csv --population 1e5 --horizon 4

`--dataset_name simulator` trains on the metapopulation SIRS simulator (`simulate_metapopulation_sir`). Windows of
`--history` + `--horizon` steps are cut chronologically 60/20/20 and only the training segment's windows are
trained on. The result is an `EpiDiffForecastPipeline` folder (`EpiDiffForecastPipeline.from_pretrained(output_dir)`)
with a model card holding the unguided forecast's validation MAE and CRPS; checkpoints are
`output_dir/checkpoint-<step>` every `--save_steps` and `--resume_from_checkpoint latest` continues exactly.

Options are the fields of `EpiDiffConfig` (named as in `transformers.TrainingArguments`: `--max_steps`,
`--per_device_train_batch_size`, `--learning_rate`, `--save_steps`, ...; diffusers' example names
`--max_train_steps`, `--train_batch_size`, `--checkpointing_steps` work too) and the script arguments below, parsed
by TRL's `TrlParser` (so `--config run.yaml` works). `--output_dir` is required.
"""

import logging
import re
import sys
from dataclasses import dataclass, field

from accelerate import PartialState
from accelerate.logging import get_logger
from accelerate.utils import parse_flag_from_env, set_seed


logger = get_logger(__name__, log_level="INFO")

DATASETS = ("boston", "simulator", "csv")
# This script's defaults where they differ from the config's.
DEFAULTS = {"output_dir": None, "report_to": "tensorboard"}


@dataclass
class ScriptArguments:
    """The data the denoiser is trained on and how its result is measured; the trainer's options are its config's."""

    dataset_name: str = field(default="boston", metadata={"help": "'boston', 'simulator' or 'csv'."})
    counts_csv: str | None = field(default=None, metadata={"help": "--dataset_name csv: the counts (time x regions)."})
    adjacency_csv: str | None = field(
        default=None, metadata={"help": "--dataset_name csv: the adjacency (a square matrix or an edge list)."}
    )
    population: float = field(
        default=1e5, metadata={"help": "--dataset_name csv: the population the counts refer to."}
    )
    horizon: int = field(default=7, metadata={"help": "Forecast steps per window."})
    sim_nodes: int = field(default=10, metadata={"help": "--dataset_name simulator: regions."})
    sim_steps: int = field(default=300, metadata={"help": "--dataset_name simulator: time steps."})
    sim_seed: int = field(default=0, metadata={"help": "--dataset_name simulator: seed of the epidemic."})
    eval_num_samples: int = field(default=8, metadata={"help": "Draws per validation window for the model card."})
    eval_inference_steps: int = field(default=10, metadata={"help": "DDIM steps of those draws."})


def parse_args(argv=None):
    """`(script_args, config)` from the command line (or `--config file.yaml`); exits with status 2 and a one-line
    message on a bad option."""
    from trl import TrlParser

    from diffusers_ext import EpiDiffConfig
    from diffusers_ext.training_utils import TRL_OPTION_ALIASES, add_option_aliases

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = TrlParser((ScriptArguments, EpiDiffConfig))
    parser.set_defaults(**DEFAULTS)
    add_option_aliases(parser, TRL_OPTION_ALIASES)
    try:
        script_args, config = parser.parse_args_and_config(args=argv)
    except ValueError as error:  # a config's own check: name the option as on the command line
        parser.error(re.sub(r"`(\w+)`", r"--\1", str(error)))
    if config.output_dir is None:
        parser.error("--output_dir is required.")
    if script_args.dataset_name not in DATASETS:
        parser.error(f"--dataset_name must be one of {DATASETS}, got {script_args.dataset_name!r}.")
    if script_args.dataset_name == "csv" and script_args.counts_csv is None:
        parser.error("--dataset_name csv needs --counts_csv.")
    if script_args.dataset_name != "csv" and (script_args.counts_csv or script_args.adjacency_csv):
        parser.error(
            f"--counts_csv/--adjacency_csv need --dataset_name csv, got --dataset_name {script_args.dataset_name}."
        )
    for name in ("horizon", "sim_nodes", "sim_steps", "eval_num_samples", "eval_inference_steps"):
        if getattr(script_args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(script_args, name)}.")
    if script_args.population <= 0:
        parser.error(f"--population must be > 0, got {script_args.population}.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(config, parser)  # an upload that cannot happen fails now, not after training
    return script_args, config


def load_series(script_args):
    from diffusers_ext.data.epidemics import load_boston_ili, load_counts_csv, simulate_metapopulation_sir

    if script_args.dataset_name == "boston":
        return load_boston_ili()
    if script_args.dataset_name == "simulator":
        return simulate_metapopulation_sir(
            num_nodes=script_args.sim_nodes, num_steps=script_args.sim_steps, seed=script_args.sim_seed
        )
    return load_counts_csv(script_args.counts_csv, script_args.adjacency_csv, population=script_args.population)


def measure(pipe, validation, adjacency, script_args, seed: int) -> dict:
    """The unguided forecast's MAE and CRPS on the validation windows (every `horizon`-th origin)."""
    import numpy as np
    import torch

    from diffusers_ext.evaluation.epidiff import summarize_scores, window_scores

    validation = validation.select(slice(None, None, validation.horizon))
    past, future = validation.past, validation.future
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        past,
        adjacency,
        num_samples=script_args.eval_num_samples,
        num_inference_steps=script_args.eval_inference_steps,
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
    )
    scores = window_scores(out.samples.astype(np.float64), future, observed=validation.future_observed)
    summary = summarize_scores(scores)  # over the observed targets only
    return {
        f"validation MAE (unguided, {len(past)} windows)": summary["mae"],
        f"validation CRPS (unguided, {len(past)} windows)": summary["crps"],
    }


def main(argv=None):
    script_args, config = parse_args(argv)
    import datasets

    from diffusers_ext import EpiDiffTrainer, build_epidiff_denoiser
    from diffusers_ext.data.epidemics import chronological_windows

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    # the process state the trainer's Accelerator joins (see train_unlearning.py for why ACCELERATE_USE_CPU is read)
    PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    set_seed(config.seed)

    series = load_series(script_args)
    # each window's missing cells filled from its own past (the series' fill looks ahead), observed targets scored
    splits = chronological_windows(series.values, config.history, script_args.horizon, observed=series.observed)
    train = splits["train"].windows
    model = build_epidiff_denoiser(config, train)
    train_dataset = datasets.Dataset.from_dict({"window": train})
    trainer = EpiDiffTrainer(model, config, train_dataset=train_dataset, adjacency=series.adjacency)
    accelerator = trainer.accelerator
    logger.info(accelerator.state, main_process_only=False)
    logger.info(
        f"{script_args.dataset_name}: {series.num_nodes} nodes x {series.num_steps} steps; {len(train)} training windows "
        f"of {config.history} + {script_args.horizon} steps"
    )
    trainer.train()  # resumes per --resume_from_checkpoint, checkpoints every --save_steps

    metrics = {}
    if accelerator.is_main_process:
        metrics = measure(
            trainer.forecast_pipeline(), splits["validation"], series.adjacency, script_args, config.seed
        )
        logger.info(f"Validation: {metrics}")
    trainer.save_model(config.output_dir, metrics=metrics)
    logger.info(f"Saved the pipeline to {config.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_epidiff.py: error: {error}", file=sys.stderr)
        sys.exit(2)
