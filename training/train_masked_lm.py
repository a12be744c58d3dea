#!/usr/bin/env python
"""Train a small bidirectional masked diffusion LM (LLaDA-style loss) on a synthetic task with accelerate.

The model is a transformers `LlamaForCausalLM` with causal masking disabled (`is_causal=False`), read without a
logit shift, like LLaDA. The prompt is never masked, each answer token is masked with probability `t ~ U(eps, 1)`,
and the loss is the cross-entropy on masked tokens weighted by `1 / t`. Tasks (`--task`):

- `addition`: `<bos>a+b=` followed by the sum, most-significant digit first, and EOS padding
  (`diffusers_ext.data.addition`);
- `sudoku`: `<bos>` + a 6x6 puzzle (0 = blank) + `=` followed by the solved grid (`diffusers_ext.data.sudoku`);
  training grids are a seeded pool of training-split grids under random symmetries, with a random number of
  givens in `[--min_givens, --max_givens]`.

    accelerate launch training/train_masked_lm.py --output_dir addition-mdm --max_train_steps 6000
    accelerate launch training/train_masked_lm.py --task sudoku --output_dir sudoku-mdm --save_dtype float16

The result is a `DiffusionLMPipeline` folder (model + tokenizer + `SOARScheduler`) with a model card; checkpoints
are `output_dir/checkpoint-<step>` and `--resume_from_checkpoint latest` continues exactly where the last one
stopped.
"""

import argparse
import sys

import torch
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from diffusers_ext.losses.masked_diffusion import (
    masked_diffusion_loss,
    sample_mask,
    sample_mask_probability,
)
from diffusers_ext.training_utils import (
    add_accelerate_arguments,
    add_optimizer_arguments,
    add_validation_arguments,
    backward_and_step,
    build_optimizer,
    gathered_model,
    output_dir_arg,
)


logger = get_logger(__name__, log_level="INFO")

TASKS = ("addition", "sudoku")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument("--task", type=str, default="addition", choices=TASKS, help="The training task.")
    data.add_argument("--pool_size", type=int, default=20000, help="sudoku: training grids drawn before symmetries.")
    data.add_argument("--min_givens", type=int, default=8, help="sudoku: fewest givens of a training puzzle.")
    data.add_argument("--max_givens", type=int, default=30, help="sudoku: most givens of a training puzzle.")
    data.add_argument("--num_digits", type=int, default=3, help="Digits per operand (1 to 4).")
    data.add_argument(
        "--gen_length",
        type=int,
        default=None,
        help="Answer length in tokens, EOS padding included. Default: num_digits + 5.",
    )
    model = parser.add_argument_group("model")
    model.add_argument("--hidden_size", type=int, default=128, help="Transformer width.")
    model.add_argument("--num_layers", type=int, default=4, help="Transformer layers.")
    model.add_argument("--num_heads", type=int, default=4, help="Attention heads.")
    model.add_argument("--intermediate_size", type=int, default=512, help="MLP width.")
    model.add_argument("--mask_eps", type=float, default=1e-3, help="Smallest masking probability.")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and masking.")
    train.add_argument("--train_batch_size", type=int, default=128, help="Batch size per process.")
    train.add_argument("--max_train_steps", type=int, default=6000, help="Total optimizer steps.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    add_optimizer_arguments(
        train, learning_rate=1e-3, lr_scheduler="constant_with_warmup", lr_warmup_steps=200, weight_decay=0.01
    )
    train.add_argument(
        "--save_dtype",
        type=str,
        default="float32",
        choices=("float32", "float16", "bfloat16"),
        help="Precision of the saved pipeline's weights (half precision halves the folder).",
    )
    add_accelerate_arguments(train, checkpointing_steps=500, checkpoints_total_limit=None)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    validation = parser.add_argument_group(
        "validation",
        "The pipeline the script saves completes the first --num_validation_images training prompts of the task "
        "(its prompts, as diffusers' --validation_prompt; sudoku givens drawn with --seed); prompt and completion "
        "go to the tracker (tensorboard text, wandb table) and to output_dir/validation/step-<N>.txt.",
    )
    add_validation_arguments(validation, "text")
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser):
    if not 1 <= args.num_digits <= 4:
        parser.error(f"--num_digits must lie in [1, 4], got {args.num_digits}.")
    if args.gen_length is not None and args.gen_length < args.num_digits + 1:
        parser.error(f"--gen_length must be at least num_digits + 1 = {args.num_digits + 1}, got {args.gen_length}.")
    if not 0 <= args.min_givens <= args.max_givens <= 36:
        parser.error(
            f"--min_givens and --max_givens must satisfy 0 <= min <= max <= 36, got {args.min_givens}, "
            f"{args.max_givens}."
        )
    if args.pool_size < 1:
        parser.error(f"--pool_size must be >= 1, got {args.pool_size}.")
    if args.hidden_size % args.num_heads:
        parser.error(f"--hidden_size {args.hidden_size} must be divisible by --num_heads {args.num_heads}.")
    if not 0.0 < args.mask_eps < 1.0:
        parser.error(f"--mask_eps must lie in (0, 1), got {args.mask_eps}.")
    for name in ("train_batch_size", "max_train_steps", "gradient_accumulation_steps", "checkpointing_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")


def build_model(args, tokenizer, max_length: int):
    from diffusers_ext.models.bidirectional_llama import build_bidirectional_llama

    return build_bidirectional_llama(
        tokenizer, max_length, args.hidden_size, args.num_layers, args.num_heads, args.intermediate_size
    )


class AdditionTask:
    """`<bos>a+b=` -> the sum (most-significant digit first) and EOS padding; a dataset of all training pairs."""

    def __init__(self, args, tokenizer):
        from diffusers_ext.data.addition import AdditionTokens, addition_pairs

        self.args = args
        self.encoder = AdditionTokens(tokenizer, num_digits=args.num_digits, gen_length=args.gen_length)
        self.data = addition_pairs("train", args.num_digits)
        self.prompt_length, self.gen_length = self.encoder.prompt_length, self.encoder.gen_length

    def batch(self, items: torch.LongTensor, generator: torch.Generator):
        return self.encoder.prompts(items), self.encoder.answers(items)

    def card(self, parameters: int, total_batch: int) -> tuple[str, str]:
        args, encoder = self.args, self.encoder
        title = f"Masked diffusion LM for {args.num_digits}-digit addition (answer most-significant digit first)"
        description = (
            f"A bidirectional `LlamaForCausalLM` ({parameters:,} parameters, {args.num_layers} layers, width "
            f"{args.hidden_size}, `is_causal=False`, no logit shift) trained with `training/train_masked_lm.py` and "
            f"LLaDA's masked-token loss for {args.max_train_steps} steps of batch {total_batch} on the train split "
            f"of `diffusers_ext.data.addition` ({len(self.data):,} pairs). Prompts are `<bos>a+b=` with "
            f"{args.num_digits}-digit zero-padded operands; the answer is {encoder.answer_digits} digits, most "
            f"significant first, then EOS up to {encoder.gen_length} tokens. Load it with "
            "`DiffusionLMPipeline.from_pretrained`; the scheduler saved with it is SOAR."
        )
        return title, description


class SudokuTask:
    """6x6 sudoku: `<bos>` + puzzle + `=` -> the solved grid. The dataset is a seeded pool of training grids; each
    batch applies random symmetries and keeps a random number of givens."""

    def __init__(self, args, tokenizer):
        from diffusers_ext.data.sudoku import SudokuTokens, random_grids

        self.args = args
        self.encoder = SudokuTokens(tokenizer)
        self.data = random_grids(args.pool_size, "train", args.seed)
        self.prompt_length, self.gen_length = self.encoder.prompt_length, self.encoder.gen_length

    def batch(self, items: torch.LongTensor, generator: torch.Generator):
        from diffusers_ext.data.sudoku import augment_grids, random_givens

        grids = augment_grids(items, generator)
        puzzles = random_givens(grids, self.args.min_givens, self.args.max_givens, generator)
        return self.encoder.prompts(puzzles), self.encoder.answers(grids)

    def card(self, parameters: int, total_batch: int) -> tuple[str, str]:
        args = self.args
        title = "Masked diffusion LM for 6x6 sudoku completion"
        description = (
            f"A bidirectional `LlamaForCausalLM` ({parameters:,} parameters, {args.num_layers} layers, width "
            f"{args.hidden_size}, `is_causal=False`, no logit shift, weights saved in {args.save_dtype}) trained "
            f"with `training/train_masked_lm.py --task sudoku` and LLaDA's masked-token loss for "
            f"{args.max_train_steps} steps of batch {total_batch}: a pool of {len(self.data):,} training-split grids "
            f"of `diffusers_ext.data.sudoku` under random symmetries, each keeping {args.min_givens}-"
            f"{args.max_givens} random givens. The prompt is `<bos>` + the 36 puzzle digits (0 = blank) + `=`; the "
            "answer is the 36 digits of the solved grid. Validation and test grids (a hash of the grid) are never "
            "trained on. Load it with `DiffusionLMPipeline.from_pretrained`; the scheduler saved with it is SOAR's "
            "LLaDA paper preset over one block."
        )
        return title, description


def build_pipeline(model, task, tokenizer, args):
    """The pipeline the script saves: a `DiffusionLMPipeline` with the task's `SOARScheduler`."""
    from diffusers_ext import DiffusionLMPipeline, SOARScheduler

    if args.task == "sudoku":
        scheduler = SOARScheduler.from_preset("soar-llada", block_length=task.gen_length)
    else:
        scheduler = SOARScheduler(
            block_length=task.gen_length, confidence_threshold=0.9, max_beam_size=2, max_parallel_tokens=None
        )
    return DiffusionLMPipeline(model=model, scheduler=scheduler, tokenizer=tokenizer)


def run_validation(pipeline, task, args, accelerator, step: int) -> None:
    """`pipeline` completes the first `--num_validation_images` training prompts; the texts go to the trackers and
    `output_dir/validation/step-<step>.txt`. Main process only."""
    from diffusers_ext.training_utils import run_validation as validate
    from diffusers_ext.training_utils import validation_generator

    pipeline.set_progress_bar_config(disable=True)
    prompts, _ = task.batch(task.data[: args.num_validation_images], validation_generator(args.seed))
    captions = [pipeline.tokenizer.decode(ids, skip_special_tokens=True) for ids in prompts]

    def sample(conditions, generator):
        return pipeline(
            input_ids=prompts.to(accelerator.device),
            gen_length=task.gen_length,
            eos_early_stop=False,
            generator=generator,
        ).texts

    validate(accelerator, args, step, sample, captions, [pipeline.model], logger, texts=True, repeat=1)


def main(argv=None):
    args = parse_args(argv)

    from diffusers_ext.models.tiny_tokenizers import get_tiny_lm_tokenizer
    from diffusers_ext.training_utils import (
        ResumableBatchSampler,
        checkpoint_step,
        command_line,
        log_and_checkpoint,
        maybe_push_to_hub,
        resolve_resume_checkpoint,
        start_run,
        step_generator,
        validation_due,
        write_model_card,
    )

    accelerator = start_run(args, logger)

    tokenizer = get_tiny_lm_tokenizer()
    task = (SudokuTask if args.task == "sudoku" else AdditionTask)(args, tokenizer)
    pairs = task.data
    model = build_model(args, tokenizer, task.prompt_length + task.gen_length)
    mask_id = tokenizer.mask_token_id

    optimizer, lr_scheduler = build_optimizer(model.parameters(), args, accelerator.num_processes)
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)

    global_step = 0
    resume_path = resolve_resume_checkpoint(args.output_dir, args.resume_from_checkpoint)
    if resume_path is not None:
        logger.info(f"Resuming from {resume_path}")
        accelerator.load_state(resume_path)
        global_step = checkpoint_step(resume_path)
    elif args.resume_from_checkpoint == "latest":
        logger.info(f"No checkpoint in {args.output_dir}; starting a new run.")

    # Batches and masks are functions of (seed, step, process) alone: a resumed run replays the uninterrupted one.
    sampler = ResumableBatchSampler(
        len(pairs),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    loader = iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(pairs), batch_sampler=sampler))

    if accelerator.is_main_process:
        accelerator.init_trackers("train_masked_lm", config={k: str(v) for k, v in vars(args).items()})
    total_batch = args.train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info(f"{len(pairs)} training items, batch {total_batch}, {args.max_train_steps} steps, from {global_step}")

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    model.train()
    while global_step < args.max_train_steps:
        loss_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            (batch_pairs,) = next(loader)
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            prompts, answers = task.batch(batch_pairs, generator)
            mask_prob = sample_mask_probability(len(batch_pairs), args.mask_eps, generator)
            masked = sample_mask(answers.shape, mask_prob, generator)
            noisy = torch.cat([prompts, torch.where(masked, mask_id, answers)], dim=1)
            noisy, answers = noisy.to(accelerator.device), answers.to(accelerator.device)
            masked, mask_prob = masked.to(accelerator.device), mask_prob.to(accelerator.device)

            with accelerator.accumulate(model):
                with accelerator.autocast():
                    logits = model(noisy).logits[:, task.prompt_length :]
                loss = masked_diffusion_loss(logits, answers, masked, mask_prob)
                backward_and_step(accelerator, loss, model.parameters(), optimizer, lr_scheduler, args.max_grad_norm)
            loss_sum += loss.detach().item() / args.gradient_accumulation_steps

        global_step += 1
        progress.update(1)
        logs = {"loss": loss_sum, "lr": lr_scheduler.get_last_lr()[0]}
        progress.set_postfix(**logs)
        log_and_checkpoint(accelerator, args, global_step, logs, logger)
        if global_step < args.max_train_steps and validation_due(args, global_step):
            trained = gathered_model(accelerator, model)  # every process takes part (a sharded run gathers here)
            if accelerator.is_main_process:
                run_validation(build_pipeline(trained, task, tokenizer, args), task, args, accelerator, global_step)

    accelerator.wait_for_everyone()
    final_model = gathered_model(accelerator, model)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        parameters = sum(p.numel() for p in final_model.parameters())
        pipeline = build_pipeline(final_model, task, tokenizer, args)
        if validation_due(args, global_step, final=True):  # before the cast to --save_dtype
            run_validation(pipeline, task, args, accelerator, global_step)
        final_model.to(getattr(torch, args.save_dtype))
        pipeline.save_pretrained(args.output_dir)
        title, description = task.card(parameters, total_batch)
        write_model_card(
            args.output_dir,
            title=title,
            description=description,
            command=command_line(),
            tags=["masked-diffusion-lm", "soar", "text-generation"],
        )
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_masked_lm.py: error: {error}", file=sys.stderr)
        sys.exit(2)
