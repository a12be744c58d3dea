#!/usr/bin/env python
"""Train a discrete flow matching model (mask, Multimask or uniform source; independent or minibatch-OT coupling).

Data: sequences from a known random hidden Markov model (`--dataset_name hmm`, exact likelihood available) or
scikit-learn's binarised 8x8 digits (`--dataset_name digits`, 64 binary pixels).

    accelerate launch training/train_discrete_flow.py --output_dir dfm-hmm --source multimask --num_mask_tokens 16 \
        --coupling embedding_ot --max_train_steps 3000

The result is a `DiscreteFlowPipeline` folder (model + `DiscreteFlowMatchingScheduler`) with a model card reporting
the validation perplexity bounds; checkpoints are `output_dir/checkpoint-<step>` and `--resume_from_checkpoint
latest` continues exactly where the last one stopped. The coupling is solved on each process's own minibatch.
"""

import argparse
import json
import math
import os
import sys
import time

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

DATASETS = ("hmm", "digits")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset_name",
        "--dataset",
        dest="dataset",
        type=str,
        default="hmm",
        choices=DATASETS,
        help="'hmm' or 'digits' (--dataset: the earlier name).",
    )
    data.add_argument("--hmm_states", type=int, default=4, help="Hidden states of the random HMM.")
    data.add_argument("--vocab_size", type=int, default=8, help="Tokens of the random HMM (digits: 2).")
    data.add_argument("--sequence_length", type=int, default=16, help="Length of the HMM's sequences.")
    data.add_argument("--hmm_seed", type=int, default=0, help="Seed of the HMM's parameters.")
    data.add_argument("--hmm_concentration", type=float, default=0.2, help="Dirichlet concentration of its rows.")
    data.add_argument("--num_train_sequences", type=int, default=20000, help="HMM training sequences.")
    data.add_argument("--num_validation_sequences", type=int, default=500, help="Sequences for the bounds.")
    flow = parser.add_argument_group("flow")
    flow.add_argument(
        "--source",
        type=str,
        default="mask",
        choices=["mask", "multimask", "uniform"],
        help="Source distribution of the mixture path.",
    )
    flow.add_argument("--num_mask_tokens", type=int, default=None, help="Mask tokens M (multimask: required).")
    flow.add_argument(
        "--coupling",
        type=str,
        default="independent",
        choices=["independent", "hamming_ot", "embedding_ot"],
        help="Minibatch coupling.",
    )
    flow.add_argument(
        "--loss_type",
        type=str,
        default="cross_entropy",
        choices=["cross_entropy", "kl", "entropy"],
        help="Token cross-entropy, or a perplexity bound (per token) as the loss.",
    )
    flow.add_argument("--kappa_exponent", type=float, default=1.0, help="kappa(t) = t ** kappa_exponent.")
    model = parser.add_argument_group("model")
    model.add_argument("--hidden_size", type=int, default=64, help="Transformer width.")
    model.add_argument("--num_layers", type=int, default=2, help="Transformer layers.")
    model.add_argument("--num_heads", type=int, default=4, help="Attention heads.")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of initialisation, data order and paths.")
    train.add_argument("--train_batch_size", type=int, default=256, help="Batch size per process (= OT minibatch).")
    train.add_argument("--max_train_steps", type=int, default=3000, help="Total optimizer steps.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    add_optimizer_arguments(train, learning_rate=1e-3, lr_scheduler="cosine", lr_warmup_steps=100, weight_decay=0.0)
    train.add_argument("--bound_samples", type=int, default=16, help="Monte Carlo times per validation sequence.")
    add_accelerate_arguments(train, checkpointing_steps=500, checkpoints_total_limit=2)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    validation = parser.add_argument_group(
        "validation",
        "The pipeline the script saves draws --num_validation_images sequences (seeded with --seed; the "
        "discrete-sequence counterpart of diffusers' validation images), written as their token ids to the tracker "
        "(tensorboard text, wandb table) and to output_dir/validation/step-<N>.txt.",
    )
    add_validation_arguments(validation, "text")
    validation.add_argument(
        "--validation_inference_steps", type=int, default=64, help="Sampling steps of the validation sequences."
    )
    args = parser.parse_args(argv)
    validate_args(args, parser)
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def validate_args(args, parser):
    for name in (
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "num_train_sequences",
        "num_validation_sequences",
        "sequence_length",
        "validation_inference_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.coupling != "independent" and args.train_batch_size < 2:
        parser.error(f"--coupling {args.coupling} needs --train_batch_size >= 2 to couple anything.")
    if args.source == "multimask" and (args.num_mask_tokens is None or args.num_mask_tokens < 2):
        parser.error(f"--source multimask needs --num_mask_tokens >= 2, got {args.num_mask_tokens}.")
    if args.source != "multimask" and args.num_mask_tokens is not None:
        parser.error(f"--num_mask_tokens is only for --source multimask (got --source {args.source}).")
    if args.dataset == "digits" and args.vocab_size != 2:
        args.vocab_size = 2
    if args.bound_samples < 2:
        parser.error(f"--bound_samples must be >= 2, got {args.bound_samples}.")


def build_data(args):
    """Return `(train, validation, judge)`: LongTensors `(N, L)` and, for the HMM, its exact-likelihood judge."""
    if args.dataset == "digits":
        from diffusers_ext.data.binarized_digits import load_binarized_digits

        return load_binarized_digits("train"), load_binarized_digits("validation"), None
    from diffusers_ext.data.random_hmm import RandomHMM
    from diffusers_ext.evaluation.discrete_flow import HMMJudge

    hmm = RandomHMM.random(
        args.hmm_states,
        args.vocab_size,
        args.sequence_length,
        seed=args.hmm_seed,
        transition_concentration=args.hmm_concentration,
        emission_concentration=args.hmm_concentration,
    )
    train = hmm.sample(args.num_train_sequences, seed=10_000 + args.hmm_seed)
    validation = hmm.sample(args.num_validation_sequences, seed=20_000 + args.hmm_seed)
    return train, validation, HMMJudge(hmm)


def run_validation(pipeline, args, accelerator, step: int) -> None:
    """`--num_validation_images` sequences from `pipeline` (seeded), as space-separated token ids, saved to
    `output_dir/validation/step-<step>.txt` and logged. Main process only."""
    from diffusers_ext.training_utils import run_validation as validate

    pipeline.set_progress_bar_config(disable=True)

    def sample(conditions, generator):
        sequences = pipeline(
            batch_size=len(conditions), num_inference_steps=args.validation_inference_steps, generator=generator
        ).sequences
        return [" ".join(str(int(token)) for token in row) for row in sequences]

    validate(accelerator, args, step, sample, [None], [pipeline.model], logger, texts=True)


def main(argv=None):
    args = parse_args(argv)
    from diffusers_ext.training_utils import resolve_resume_checkpoint

    resolve_resume_checkpoint(args.output_dir, args.resume_from_checkpoint)  # a missing checkpoint fails first

    from diffusers_ext import DiscreteFlowMatchingScheduler, DiscreteFlowPipeline, DiscreteFlowTransformerModel
    from diffusers_ext.losses.discrete_flow import discrete_flow_loss, estimate_nll_bounds
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

    train, validation, judge = build_data(args)
    scheduler = DiscreteFlowMatchingScheduler(
        vocab_size=args.vocab_size,
        source=args.source,
        num_mask_tokens=args.num_mask_tokens,
        kappa_exponent=args.kappa_exponent,
    )
    model = DiscreteFlowTransformerModel(
        vocab_size=args.vocab_size,
        num_embeddings=scheduler.num_embeddings,
        sequence_length=train.shape[1],
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
    )
    optimizer, lr_scheduler = build_optimizer(model.parameters(), args, accelerator.num_processes)
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)

    dataset = torch.utils.data.TensorDataset(train)
    sampler = ResumableBatchSampler(
        len(dataset),
        args.train_batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        args.seed,
        start_step=global_step * args.gradient_accumulation_steps,
    )
    loader = iter(torch.utils.data.DataLoader(dataset, batch_sampler=sampler))
    if accelerator.is_main_process:
        accelerator.init_trackers("train_discrete_flow", config={k: str(v) for k, v in vars(args).items()})
    total_batch = args.train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info(f"{len(dataset)} sequences, batch {total_batch}, {args.max_train_steps} steps, from {global_step}")

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    model.train()
    while global_step < args.max_train_steps:
        loss_sum, timings = 0.0, {"coupling_seconds": 0.0}
        step_start = time.perf_counter()
        for micro in range(args.gradient_accumulation_steps):
            (x1,) = next(loader)
            x1 = x1.to(accelerator.device)
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            embedding = accelerator.unwrap_model(model).token_embedding.weight
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    loss = discrete_flow_loss(
                        model,
                        scheduler,
                        x1,
                        args.loss_type,
                        args.coupling,
                        generator,
                        embedding_weight=embedding,
                        timings=timings,
                    )
                backward_and_step(accelerator, loss, model.parameters(), optimizer, lr_scheduler, args.max_grad_norm)
            loss_sum += loss.detach().item() / args.gradient_accumulation_steps
        global_step += 1
        progress.update(1)
        step_seconds = time.perf_counter() - step_start
        logs = {
            "loss": loss_sum,
            "lr": lr_scheduler.get_last_lr()[0],
            "coupling_time_fraction": timings["coupling_seconds"] / step_seconds,
        }
        progress.set_postfix(loss=loss_sum)
        log_and_checkpoint(accelerator, args, global_step, logs, logger)
        if global_step < args.max_train_steps and validation_due(args, global_step):
            trained = gathered_model(accelerator, model)  # every process takes part (a sharded run gathers here)
            if accelerator.is_main_process:
                run_validation(
                    DiscreteFlowPipeline(model=trained, scheduler=scheduler), args, accelerator, global_step
                )

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, model)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = DiscreteFlowPipeline(model=final, scheduler=scheduler)
        pipeline.save_pretrained(args.output_dir)
        if validation_due(args, global_step, final=True):
            run_validation(pipeline, args, accelerator, global_step)
        bounds = estimate_nll_bounds(
            final,
            scheduler,
            validation.to(accelerator.device),
            args.bound_samples,
            torch.Generator(accelerator.device).manual_seed(args.seed),
        )
        L = validation.shape[1]
        metrics = {
            f"validation {kind} perplexity bound": math.exp(float(b["mean"].mean()) / L) for kind, b in bounds.items()
        }
        if judge is not None:
            metrics["validation perplexity of the true HMM"] = math.exp(float(-judge.log_prob(validation).mean()) / L)
        with open(os.path.join(args.output_dir, "validation_metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        data = (
            "scikit-learn's binarised 8x8 digits (train split)"
            if args.dataset == "digits"
            else f"{args.num_train_sequences} sequences of a random HMM ({args.hmm_states} states, "
            f"{args.vocab_size} tokens, length {args.sequence_length}, seed {args.hmm_seed})"
        )
        write_model_card(
            args.output_dir,
            title=f"Discrete flow matching ({args.source} source, {args.coupling} coupling)",
            description=(
                f"A `DiscreteFlowTransformerModel` ({sum(p.numel() for p in final.parameters()):,} parameters) "
                f"trained with `training/train_discrete_flow.py` on {data}: {args.max_train_steps} steps of batch "
                f"{total_batch}, loss `{args.loss_type}`. Sample with `DiscreteFlowPipeline.from_pretrained(folder)`"
                "; perplexity bounds are Monte Carlo estimates on the validation split."
            ),
            command=command_line(),
            metrics=metrics,
            tags=["discrete-flow-matching", args.source, args.coupling],
        )
        maybe_push_to_hub(args, logger)
        logger.info(f"Saved the pipeline to {args.output_dir}: {metrics}")
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_discrete_flow.py: error: {error}", file=sys.stderr)
        sys.exit(2)
