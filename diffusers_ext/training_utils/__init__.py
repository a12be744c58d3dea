"""Helpers shared by the `training/` scripts, one concern per module: checkpoints, run setup and the optimisation
step, command-line flags, model cards, the Hub, validation during training, and the text-to-image scripts' data.

The names are re-exported here, so `from diffusers_ext.training_utils import save_checkpoint` keeps working; the
one-forward training modules of a latent text-to-image model are models (`diffusers_ext.models.training_modules`).
"""

from .arguments import (
    TRL_OPTION_ALIASES,
    add_accelerate_arguments,
    add_hub_arguments,
    add_optimizer_arguments,
    add_option_aliases,
    output_dir_arg,
)
from .checkpoints import (
    CHECKPOINT_PREFIX,
    GeneratorState,
    ResumableBatchSampler,
    checkpoint_step,
    list_checkpoints,
    log_and_checkpoint,
    maybe_resume,
    resolve_resume_checkpoint,
    save_checkpoint,
    save_model_state_dict,
    step_generator,
)
from .hub import HUB_IGNORE_PATTERNS, check_hub_arguments, hub_offline, maybe_push_to_hub, push_to_hub
from .model_cards import base_model_license, command_line, write_model_card
from .run_setup import backward_and_step, build_accelerator, build_optimizer, cosine_with_warmup, start_run
from .sharded_saving import check_unsharded, gathered_model, shards_parameters
from .text_to_image import encode_posteriors, tokenize_captions
from .validation import (
    VALIDATION_CONDITIONS,
    VALIDATION_DIR,
    add_validation_arguments,
    check_validation_arguments,
    log_validation_images,
    log_validation_texts,
    run_validation,
    trainer_validation_args,
    validation_due,
    validation_enabled,
    validation_generator,
    with_step_validation,
)
