"""The command-line flags every training script shares, with diffusers' examples' names (and TRL's where a script
takes a TRL config)."""

import argparse

from ..utils import check_output_dir, positive_int_arg


def output_dir_arg(value: str) -> str:
    """The argparse `type=` of `--output_dir`: a folder, or a path where one can be created (see
    [`~diffusers_ext.utils.check_output_dir`]), so that a file there fails at parse time, not at the first save."""
    try:
        check_output_dir("--output_dir", value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--output_dir ")) from None
    return value


def add_accelerate_arguments(parser, checkpointing_steps: int = 500, checkpoints_total_limit: int | None = None):
    """Add the flags every training script shares: mixed precision, checkpoints, resume and trackers.

    `parser` is an `argparse.ArgumentParser` or one of its argument groups; the defaults of the two checkpoint
    flags differ between scripts.
    """
    parser.add_argument(
        "--mixed_precision",
        type=str,
        default=None,
        choices=["no", "fp16", "bf16"],
        help="Overrides accelerate's config.",
    )
    parser.add_argument(
        "--checkpointing_steps", type=int, default=checkpointing_steps, help="Save a checkpoint every N steps."
    )
    parser.add_argument(
        "--checkpoints_total_limit",
        type=positive_int_arg,
        default=checkpoints_total_limit,
        help="Keep at most N checkpoints (the newest; N >= 1). Default: keep all.",
    )
    parser.add_argument(
        "--resume_from_checkpoint",
        type=str,
        default=None,
        help="'latest', a checkpoint folder name in output_dir, or a path.",
    )
    parser.add_argument(
        "--report_to",
        type=str,
        default="tensorboard",
        help="accelerate tracker: 'tensorboard', 'wandb', 'all' or 'none'.",
    )
    parser.add_argument("--logging_dir", type=str, default="logs", help="Tracker folder, relative to output_dir.")
    add_hub_arguments(parser)


def add_hub_arguments(parser):
    """`--push_to_hub`, `--hub_model_id` and `--hub_token`, as in diffusers' examples (read by [`maybe_push_to_hub`])."""
    parser.add_argument("--push_to_hub", action="store_true", help="Upload the result to the Hub at the end.")
    parser.add_argument(
        "--hub_model_id", type=str, default=None, help="Hub repository (default: the output folder's name)."
    )
    parser.add_argument("--hub_token", type=str, default=None, help="Hub token (default: the logged-in one).")


def add_optimizer_arguments(
    parser,
    learning_rate: float,
    lr_scheduler: str,
    lr_warmup_steps: int,
    weight_decay: float,
    max_grad_norm: float | None = 1.0,
):
    """Add the AdamW + learning-rate-schedule flags our training scripts share (the names of diffusers' examples).

    `parser` is an `argparse.ArgumentParser` or one of its argument groups; the defaults differ between scripts.
    [`build_optimizer`] reads the flags back.
    """
    parser.add_argument("--learning_rate", type=float, default=learning_rate, help="Peak learning rate.")
    parser.add_argument(
        "--lr_scheduler",
        type=str,
        default=lr_scheduler,
        help="A diffusers.optimization scheduler name ('cosine', 'constant_with_warmup', ...).",
    )
    parser.add_argument("--lr_warmup_steps", type=int, default=lr_warmup_steps, help="Warm-up optimizer steps.")
    parser.add_argument("--adam_beta1", type=float, default=0.9, help="AdamW beta1.")
    parser.add_argument("--adam_beta2", type=float, default=0.999, help="AdamW beta2.")
    parser.add_argument("--adam_weight_decay", type=float, default=weight_decay, help="AdamW weight decay.")
    parser.add_argument("--adam_epsilon", type=float, default=1e-8, help="AdamW epsilon.")
    parser.add_argument(
        "--max_grad_norm", type=float, default=max_grad_norm, help="Gradient clipping norm (none: no clipping)."
    )


def add_option_aliases(parser, aliases: dict[str, str]) -> None:
    """Make `parser` (a TRL/`HfArgumentParser`) also answer to diffusers-examples names: `aliases` maps an alias
    (`"--max_train_steps"`) to an existing option (`"--max_steps"`), whose destination, type and choices it shares.
    The alias sets no default of its own, so the original's default (or a `--config` file's) stays."""
    by_option = {option: action for action in parser._actions for option in action.option_strings}
    for alias, original in aliases.items():
        action = by_option.get(original)
        if action is None:
            raise ValueError(f"`aliases`: {original!r} (for {alias!r}) is not an option of this parser.")
        if alias in by_option:
            continue
        kwargs = {"dest": action.dest, "default": argparse.SUPPRESS, "help": f"Alias of {original}."}
        if action.nargs == 0:  # store_true / store_const
            kwargs.update(action="store_const", const=action.const)
        else:
            kwargs.update(type=action.type, nargs=action.nargs, choices=action.choices, metavar=action.metavar)
            if action.nargs == "?":  # HfArgumentParser's booleans: `--flag` alone means its const
                kwargs["const"] = action.const
        parser.add_argument(alias, **kwargs)


# The diffusers-examples names that the TRL-style scripts (train_grpo.py, train_unlearning.py) also accept for
# their config's TrainingArguments-style fields.
TRL_OPTION_ALIASES = {
    "--max_train_steps": "--max_steps",
    "--train_batch_size": "--per_device_train_batch_size",
    "--adam_weight_decay": "--weight_decay",
    "--checkpointing_steps": "--save_steps",
    "--checkpoints_total_limit": "--save_total_limit",
}
