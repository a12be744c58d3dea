#!/usr/bin/env python
"""Train a small masked diffusion LM with MDLM's or LoMDM's objective (learned per-position schedules) with accelerate.

The denoiser is a bidirectional `transformers` Llama (`is_causal=False`, no logit shift). `--method mdlm` trains it
with MDLM's continuous-time NELBO (linear schedule); `--method lomdm` also trains LoMDM's forward scheduler (on the
clean sequence) and reverse scheduler (on the noisy one), with the schedule-mismatch terms and the RLOO gradient
through the mask sampling (`diffusers_ext.losses.lomdm`). Sequences are `<bos>` followed by a sequence
of the corpus: `markov` (the Markov-checksum test bed of `diffusers_ext.data.markov_checksum`) or `stdlib`
(32-character windows of the standard library's docstrings).

    accelerate launch training/train_lomdm.py --method lomdm --corpus markov --output_dir lomdm-markov

The result is a `LoMDMPipeline` folder (denoiser + `OeMDMScheduler` + character tokenizer + both schedule networks)
with a model card; checkpoints are `output_dir/checkpoint-<step>` and `--resume_from_checkpoint latest` continues
exactly where the last one stopped.
"""

import argparse
import math
import sys

import torch
from accelerate.logging import get_logger
from tqdm.auto import tqdm

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

DEFAULT_C = {"mdlm": (1.0, 0.0), "lomdm": (0.7, 0.65)}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    method = parser.add_argument_group("method")
    method.add_argument("--method", type=str, default="lomdm", choices=["mdlm", "lomdm"], help="Objective.")
    method.add_argument("--c1", type=float, default=None, help="Schedule exponent offset (default: 0.7 / MDLM 1).")
    method.add_argument("--c2", type=float, default=None, help="Schedule exponent scale (default: 0.65 / MDLM 0).")
    method.add_argument("--num_mask_samples", type=int, default=2, help="Masks per sequence (the RLOO group).")
    method.add_argument("--mask_eps", type=float, default=1e-3, help="Smallest time.")
    data = parser.add_argument_group("data")
    data.add_argument("--corpus", type=str, default="markov", choices=["markov", "stdlib"], help="Training data.")
    data.add_argument(
        "--num_train_samples",
        "--num_train",
        dest="num_train",
        type=int,
        default=20000,
        help="Markov corpus: training sequences (--num_train: the earlier name).",
    )
    data.add_argument("--window_length", type=int, default=32, help="stdlib corpus: characters per sequence.")
    model = parser.add_argument_group("model")
    model.add_argument("--hidden_size", type=int, default=64, help="Denoiser width.")
    model.add_argument("--num_layers", type=int, default=2, help="Denoiser layers.")
    model.add_argument("--num_heads", type=int, default=4, help="Attention heads.")
    model.add_argument("--intermediate_size", type=int, default=128, help="Denoiser MLP width.")
    model.add_argument("--schedule_hidden_size", type=int, default=32, help="Width of each schedule network.")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and masking.")
    train.add_argument("--train_batch_size", type=int, default=64, help="Sequences per process and step.")
    train.add_argument("--max_train_steps", type=int, default=800, help="Total optimizer steps.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    add_optimizer_arguments(
        train, learning_rate=2e-3, lr_scheduler="constant_with_warmup", lr_warmup_steps=50, weight_decay=0.01
    )
    add_accelerate_arguments(train, checkpointing_steps=200, checkpoints_total_limit=2)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    validation = parser.add_argument_group(
        "validation",
        "The pipeline the script saves draws --num_validation_images unconditional sequences (temperature 1, seeded "
        "with --seed; the language-model counterpart of diffusers' validation images); they go to the tracker "
        "(tensorboard text, wandb table) and to output_dir/validation/step-<N>.txt.",
    )
    add_validation_arguments(validation, "text")
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser):
    c1_default, c2_default = DEFAULT_C[args.method]
    args.c1 = c1_default if args.c1 is None else args.c1
    args.c2 = c2_default if args.c2 is None else args.c2
    if not (args.c1 > 0 and 0 <= args.c2 < args.c1):
        parser.error(f"need --c1 > 0 and 0 <= --c2 < --c1 (positive exponents), got c1={args.c1}, c2={args.c2}.")
    if args.method == "mdlm" and (args.c1, args.c2) != (1.0, 0.0):
        parser.error(f"--method mdlm is (c1, c2) = (1, 0); got ({args.c1}, {args.c2}). Use --method lomdm.")
    if args.hidden_size % args.num_heads or args.schedule_hidden_size % args.num_heads:
        parser.error(
            f"--hidden_size {args.hidden_size} and --schedule_hidden_size {args.schedule_hidden_size} must be "
            f"divisible by --num_heads {args.num_heads}."
        )
    if not 0.0 < args.mask_eps < 1.0:
        parser.error(f"--mask_eps must lie in (0, 1), got {args.mask_eps}.")
    for name in (
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "num_mask_samples",
        "num_train",
        "window_length",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")


def load_corpus(args):
    """`(tokenizer, train ids (N, 1 + L), validation ids, description)`; ids are `<bos>` + the corpus symbols."""
    from diffusers_ext.data.char_tokenizer import CHAR_SPECIAL_TOKENS, build_char_tokenizer

    if args.corpus == "markov":
        from diffusers_ext.data.markov_checksum import MarkovChecksumSource

        source = MarkovChecksumSource()
        alphabet, train, val = source.alphabet, source.sample(args.num_train, seed=1), source.sample(256, seed=2)
        description = (
            f"the Markov-checksum test bed (`diffusers_ext.data.markov_checksum.MarkovChecksumSource()`, "
            f"{args.num_train:,} training sequences of {source.length} symbols)"
        )
    else:
        from diffusers_ext.data.stdlib_text import STDLIB_ALPHABET, encode_windows, stdlib_docstring_windows

        alphabet = STDLIB_ALPHABET
        train = encode_windows(stdlib_docstring_windows("train", args.window_length))
        val = encode_windows(stdlib_docstring_windows("validation", args.window_length, 256))
        description = (
            f"{len(train):,} windows of {args.window_length} characters of the Python standard library's docstrings "
            "(`diffusers_ext.data.stdlib_text`)"
        )
    tokenizer = build_char_tokenizer(alphabet)
    offset = len(CHAR_SPECIAL_TOKENS)

    def with_bos(symbols):
        bos = torch.full((symbols.shape[0], 1), tokenizer.bos_token_id, dtype=torch.long)
        return torch.cat([bos, symbols + offset], dim=1)

    return tokenizer, with_bos(train), with_bos(val), description


def run_validation(pipeline, gen_length: int, args, accelerator, step: int) -> None:
    """`--num_validation_images` unconditional sequences of `gen_length` tokens after `<bos>` from `pipeline`
    (temperature 1, seeded); saved to `output_dir/validation/step-<step>.txt` and logged. Main process only."""
    from diffusers_ext.training_utils import run_validation as validate

    pipeline.set_progress_bar_config(disable=True)

    def sample(conditions, generator):
        return pipeline(
            prompt=[pipeline.tokenizer.bos_token] * len(conditions),
            gen_length=gen_length,
            temperature=1.0,
            eos_early_stop=False,
            generator=generator,
        ).texts

    modules = [m for m in (pipeline.model, pipeline.reverse_schedule, pipeline.forward_schedule) if m is not None]
    validate(accelerator, args, step, sample, [None], modules, logger, texts=True)


def main(argv=None):
    args = parse_args(argv)

    from diffusers_ext import LoMDMPipeline, LoMDMScheduleNetwork, OeMDMScheduler
    from diffusers_ext.evaluation.lomdm import nelbo_per_sequence
    from diffusers_ext.losses.lomdm import lomdm_loss
    from diffusers_ext.models.bidirectional_llama import build_bidirectional_llama
    from diffusers_ext.training_utils import (
        ResumableBatchSampler,
        command_line,
        log_and_checkpoint,
        maybe_push_to_hub,
        maybe_resume,
        start_run,
        step_generator,
        validation_due,
        write_model_card,
    )

    accelerator = start_run(args, logger)

    tokenizer, train_ids, val_ids, description = load_corpus(args)
    length = train_ids.shape[1]
    mask_id = tokenizer.mask_token_id
    denoiser = build_bidirectional_llama(
        tokenizer, length, args.hidden_size, args.num_layers, args.num_heads, args.intermediate_size
    )
    schedules = [
        LoMDMScheduleNetwork(
            len(tokenizer),
            length,
            hidden_size=args.schedule_hidden_size,
            num_heads=args.num_heads,
            c1=args.c1,
            c2=args.c2,
        )
        for _ in range(2)
    ]
    learned = args.c2 > 0
    # with c2 = 0 the schedule networks have no effect (and no gradient): they are neither trained nor saved
    trained = [denoiser, *schedules] if learned else [denoiser]
    params = [p for m in trained for p in m.parameters()]
    optimizer, lr_scheduler = build_optimizer(params, args, accelerator.num_processes)
    prepared = accelerator.prepare(*trained, optimizer, lr_scheduler)
    trained, optimizer, lr_scheduler = list(prepared[: len(trained)]), prepared[-2], prepared[-1]
    model = trained[0]
    forward_schedule, reverse_schedule = trained[1:] if learned else schedules
    forward_schedule.to(accelerator.device)
    reverse_schedule.to(accelerator.device)

    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    # Batches, times and masks are functions of (seed, step, process) alone: a resumed run replays the uninterrupted one.
    sampler = ResumableBatchSampler(
        len(train_ids),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    loader = iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_ids), batch_sampler=sampler))
    schedule_mask = torch.ones(1, length, dtype=torch.bool)
    schedule_mask[:, 0] = False

    if accelerator.is_main_process:
        accelerator.init_trackers("train_lomdm", config={k: str(v) for k, v in vars(args).items()})
    total_batch = args.train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info(f"{len(train_ids)} training sequences, batch {total_batch}, {args.max_train_steps} steps")

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    for m in trained:
        m.train()
    while global_step < args.max_train_steps:
        loss_sum = nelbo_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            (batch,) = next(loader)
            batch = batch.to(accelerator.device)
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            with accelerator.accumulate(*trained):
                with accelerator.autocast():
                    out = lomdm_loss(
                        lambda z: model(z).logits,
                        forward_schedule,
                        reverse_schedule,
                        batch,
                        schedule_mask.expand_as(batch).to(accelerator.device),
                        mask_id,
                        generator=generator,
                        mask_eps=args.mask_eps,
                        num_mask_samples=args.num_mask_samples,
                    )
                backward_and_step(accelerator, out.loss, params, optimizer, lr_scheduler, args.max_grad_norm)
            loss_sum += out.loss.detach().item() / args.gradient_accumulation_steps
            nelbo_sum += out.nelbo.item() / args.gradient_accumulation_steps

        global_step += 1
        progress.update(1)
        logs = {"loss": loss_sum, "nelbo_per_token": nelbo_sum, "lr": lr_scheduler.get_last_lr()[0]}
        progress.set_postfix(**logs)
        log_and_checkpoint(accelerator, args, global_step, logs, logger)
        if global_step < args.max_train_steps and validation_due(args, global_step):
            # every process takes part (a sharded run gathers here)
            trained = [
                gathered_model(accelerator, m)
                for m in (model, reverse_schedule, forward_schedule)
                if learned or m is model
            ]
            if accelerator.is_main_process:
                pipeline = LoMDMPipeline(
                    model=trained[0],
                    scheduler=OeMDMScheduler.from_preset("lomdm" if learned else "mdm"),
                    tokenizer=tokenizer,
                    reverse_schedule=trained[1] if learned else None,
                    forward_schedule=trained[2] if learned else None,
                )
                run_validation(pipeline, length - 1, args, accelerator, global_step)

    accelerator.wait_for_everyone()
    # every process takes part: FSDP gathers the shards
    final_model = gathered_model(accelerator, model)
    forward_final = gathered_model(accelerator, forward_schedule) if learned else None
    reverse_final = gathered_model(accelerator, reverse_schedule) if learned else None
    if accelerator.is_main_process:
        val_nelbo = nelbo_per_sequence(
            lambda z: final_model(z).logits,
            forward_final or schedules[0].eval(),
            reverse_final or schedules[1].eval(),
            val_ids.to(accelerator.device),
            schedule_mask.expand_as(val_ids).to(accelerator.device),
            mask_id,
            num_times=4,
        )
        val_per_token = float(val_nelbo.mean()) / (length - 1)
        pipeline = LoMDMPipeline(
            model=final_model,
            scheduler=OeMDMScheduler.from_preset("lomdm" if learned else "mdm"),
            tokenizer=tokenizer,
            reverse_schedule=reverse_final,
            forward_schedule=forward_final,
        )
        pipeline.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            run_validation(pipeline, length - 1, args, accelerator, global_step)
        name = "LoMDM" if learned else "MDLM"
        write_model_card(
            args.output_dir,
            title=f"{name} masked diffusion LM on the {args.corpus} corpus",
            description=(
                f"A bidirectional `LlamaForCausalLM` ({sum(p.numel() for p in final_model.parameters()):,} "
                f"parameters, {args.num_layers} layers, width {args.hidden_size}) trained with "
                f"`training/train_lomdm.py` ({name}, (c1, c2) = ({args.c1}, {args.c2})) for {args.max_train_steps} "
                f"steps of batch {total_batch} on {description}. "
                + (
                    "It carries LoMDM's forward and reverse schedulers; the saved `OeMDMScheduler` samples with the "
                    "learned order. "
                    if learned
                    else "The saved `OeMDMScheduler` is the `mdm` preset (MDLM's random order). "
                )
                + "Load it with `LoMDMPipeline.from_pretrained` and sample with `temperature=1.0`; swap in any "
                "`OeMDMScheduler` preset or a `SOARScheduler` to compare decoders."
            ),
            command=command_line(),
            metrics={
                "validation NELBO (nats/token, 256 sequences, 4 times each)": val_per_token,
                "validation perplexity bound": math.exp(val_per_token),
            },
            tags=["masked-diffusion-lm", "lomdm", "oemdm", "text-generation"],
        )
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}; validation NELBO {val_per_token:.4f} nats/token")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_lomdm.py: error: {error}", file=sys.stderr)
        sys.exit(2)
