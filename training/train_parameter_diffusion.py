"""Train a parameter diffusion model over LoRA adapters for certified few-shot transfer (STEEL-style).

Stage 1 fits one peft LoRA adapter (rank 2, on the zoo digit classifier's last convolution and feature layer) per
upstream task, a 5-way digit subset under an upstream domain shift (`diffusers_ext.evaluation.certified_transfer`);
the adapters are saved as `output_dir/upstream_adapters.safetensors` (reused on resume). Stage 2 trains a
`ParameterDiffusionModel` on the standardised adapter vectors (with `--canonical_lora`, on their canonical LoRA
factors) with diffusers' `DDPMScheduler` (`--prediction_type`: the noise, the clean vector or the velocity).

    accelerate launch training/train_parameter_diffusion.py --output_dir parameter-diffusion-digits

The result is a `SampleThenEvaluatePipeline` folder (model + `DDPMScheduler`) with a model card; checkpoints are
`output_dir/checkpoint-<step>` and `--resume_from_checkpoint latest` continues where the last one stopped.
"""

import argparse
import json
import os

import torch
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from diffusers_ext.training_utils import (
    add_accelerate_arguments,
    add_optimizer_arguments,
    build_optimizer,
    gathered_model,
    output_dir_arg,
)


logger = get_logger(__name__, log_level="INFO")

ADAPTERS_FILE = "upstream_adapters.safetensors"
TASKS_FILE = "upstream_tasks.json"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    upstream = parser.add_argument_group("upstream adapters")
    upstream.add_argument(
        "--classifier_path", type=str, default="diffusers_ext/zoo/digits-classifier", help="The frozen backbone."
    )
    upstream.add_argument("--num_upstream_tasks", type=int, default=200, help="Upstream tasks (one adapter each).")
    upstream.add_argument("--adapter_steps", type=int, default=100, help="Adam steps per upstream adapter.")
    upstream.add_argument("--adapter_learning_rate", type=float, default=0.05, help="Their learning rate.")
    upstream.add_argument("--adapter_batch_size", type=int, default=64, help="Examples per task per step.")
    model = parser.add_argument_group("model")
    model.add_argument(
        "--canonical_lora",
        action="store_true",
        help="Train on each adapter's canonical LoRA factors (`AdapterVectorizer.canonicalize_lora`: the balanced "
        "SVD factors of every B A, the same adapted model) instead of the raw fitted factors; the saved upstream "
        "adapters stay raw.",
    )
    model.add_argument("--hidden_size", type=int, default=512, help="Width of the denoiser MLP.")
    model.add_argument("--num_layers", type=int, default=3, help="Residual blocks.")
    model.add_argument("--num_train_timesteps", type=int, default=1000, help="DDPM training timesteps.")
    model.add_argument(
        "--beta_schedule",
        default="squaredcos_cap_v2",
        choices=["squaredcos_cap_v2", "linear", "scaled_linear"],
        help="The DDPMScheduler's noise schedule.",
    )
    model.add_argument(
        "--prediction_type",
        default="sample",
        choices=["epsilon", "sample", "v_prediction"],
        help="What the denoiser predicts (the noise, the clean vector, or the velocity).",
    )
    train = parser.add_argument_group("training")
    train.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the pipeline and checkpoints go."
    )
    train.add_argument("--seed", type=int, default=0, help="Seed of the upstream tasks, initialisation and batches.")
    train.add_argument("--train_batch_size", type=int, default=64, help="Adapters per batch per process.")
    train.add_argument("--max_train_steps", type=int, default=6000, help="Optimizer steps of the diffusion model.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    add_optimizer_arguments(train, learning_rate=2e-3, lr_scheduler="cosine", lr_warmup_steps=50, weight_decay=0.0)
    add_accelerate_arguments(train, checkpointing_steps=500, checkpoints_total_limit=2)
    train.add_argument("--logging_steps", type=int, default=50, help="Log metrics every N steps.")
    args = parser.parse_args(argv)
    for name in (
        "num_upstream_tasks",
        "adapter_steps",
        "adapter_batch_size",
        "hidden_size",
        "num_layers",
        "num_train_timesteps",
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    if args.num_upstream_tasks < 2:
        parser.error(
            f"--num_upstream_tasks must be >= 2 (a standard deviation is fitted), got {args.num_upstream_tasks}."
        )
    if not args.adapter_learning_rate > 0:
        parser.error(f"--adapter_learning_rate must be > 0, got {args.adapter_learning_rate}.")
    from diffusers_ext.utils import check_saved_folder

    try:  # a pipeline folder (or any other) fails here, not inside from_pretrained
        check_saved_folder(
            "--classifier_path",
            args.classifier_path,
            "model",
            ("ConvImageClassifier",),
            "diffusers_ext/zoo/digits-classifier",
        )
    except ValueError as error:
        parser.error(str(error))
    from diffusers_ext.training_utils import resolve_resume_checkpoint

    try:  # a missing checkpoint fails before any adapter is fitted
        resolve_resume_checkpoint(args.output_dir, args.resume_from_checkpoint)
    except ValueError as error:
        parser.error(str(error))
    tasks_file = os.path.join(args.output_dir, TASKS_FILE)
    if os.path.isfile(tasks_file):
        with open(tasks_file, encoding="utf-8") as f:
            saved = json.load(f)["settings"]
        if saved != upstream_settings(args):
            parser.error(
                f"{args.output_dir!r} holds upstream adapters fitted with {saved}, not {upstream_settings(args)}; "
                "use a new --output_dir."
            )
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def upstream_settings(args) -> dict:
    """The settings the upstream adapters depend on (a saved set is reused only under the same ones)."""
    return {
        "num_upstream_tasks": args.num_upstream_tasks,
        "adapter_steps": args.adapter_steps,
        "adapter_learning_rate": args.adapter_learning_rate,
        "adapter_batch_size": args.adapter_batch_size,
        "seed": args.seed,
    }


def upstream_adapters(args, accelerator, proxy):
    """The upstream adapter vectors `(num_tasks, dim)`: loaded from `output_dir` if a previous run saved them (with
    the same settings), else fitted (on the main process) and saved."""
    from safetensors.torch import load_file, save_file

    from diffusers_ext.evaluation.certified_transfer import fit_upstream_adapters

    path = os.path.join(args.output_dir, ADAPTERS_FILE)
    settings = upstream_settings(args)
    if accelerator.is_main_process and not os.path.isfile(path):
        vectors, tasks = fit_upstream_adapters(
            proxy,
            args.num_upstream_tasks,
            seed=args.seed,
            steps=args.adapter_steps,
            lr=args.adapter_learning_rate,
            batch_size=args.adapter_batch_size,
        )
        os.makedirs(args.output_dir, exist_ok=True)
        save_file({"vectors": vectors.contiguous()}, path + ".tmp", metadata={k: str(v) for k, v in settings.items()})
        os.replace(path + ".tmp", path)
        with open(os.path.join(args.output_dir, TASKS_FILE), "w", encoding="utf-8") as f:
            json.dump({"settings": settings, "tasks": tasks}, f, indent=1)
        mean_accuracy = sum(t["train_accuracy"] for t in tasks) / len(tasks)
        logger.info(f"fitted {len(tasks)} upstream adapters; mean train accuracy {mean_accuracy:.3f}")
    accelerator.wait_for_everyone()
    with open(os.path.join(args.output_dir, TASKS_FILE), encoding="utf-8") as f:
        saved = json.load(f)["settings"]
    if saved != settings:
        raise ValueError(f"{path} was fitted with {saved}, not {settings}; use a new --output_dir.")
    return load_file(path)["vectors"]


def main(argv=None):
    args = parse_args(argv)
    from diffusers import DDPMScheduler

    from diffusers_ext import ParameterDiffusionModel, SampleThenEvaluatePipeline
    from diffusers_ext.evaluation.certified_transfer import load_proxy
    from diffusers_ext.training_utils import (
        command_line,
        log_and_checkpoint,
        maybe_push_to_hub,
        maybe_resume,
        start_run,
        step_generator,
        write_model_card,
    )

    accelerator = start_run(args, logger)
    proxy = load_proxy(args.classifier_path)
    vectors = upstream_adapters(args, accelerator, proxy)
    if args.canonical_lora:
        vectors = proxy.vectorizer.canonicalize_lora(vectors)
    vectorizer = proxy.vectorizer.fit(vectors)
    data = vectorizer.standardize(vectors)

    torch.manual_seed(args.seed)
    model = ParameterDiffusionModel(
        vector_dim=vectorizer.dim,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        parameter_names=vectorizer.parameter_names,
        parameter_shapes=[list(s) for s in vectorizer.parameter_shapes],
    )
    model.set_standardization(vectorizer.mean, vectorizer.std)
    scheduler = DDPMScheduler(
        num_train_timesteps=args.num_train_timesteps,
        beta_schedule=args.beta_schedule,
        prediction_type=args.prediction_type,
        clip_sample=False,
    )
    optimizer, lr_scheduler = build_optimizer(model.parameters(), args, accelerator.num_processes)
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    if accelerator.is_main_process:
        accelerator.init_trackers("train_parameter_diffusion", config={k: str(v) for k, v in vars(args).items()})
    logger.info(f"{len(data)} adapters of {vectorizer.dim} numbers, {args.max_train_steps} steps, from {global_step}")

    def regression_target(clean, noise, timesteps):
        if args.prediction_type == "epsilon":
            return noise
        if args.prediction_type == "sample":
            return clean
        return scheduler.get_velocity(clean, noise, timesteps)

    device = accelerator.device
    data = data.to(device)
    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    model.train()
    loss_sum = 0.0
    while global_step < args.max_train_steps:
        loss_sum = 0.0
        for micro in range(args.gradient_accumulation_steps):
            generator = step_generator(
                args.seed, global_step * args.gradient_accumulation_steps + micro, accelerator.process_index
            )
            index = torch.randint(0, len(data), (args.train_batch_size,), generator=generator)
            timesteps = torch.randint(0, args.num_train_timesteps, (args.train_batch_size,), generator=generator)
            noise = torch.randn(args.train_batch_size, data.shape[1], generator=generator)
            clean, timesteps, noise = data[index.to(device)], timesteps.to(device), noise.to(device)
            noisy = scheduler.add_noise(clean, noise, timesteps)
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    prediction = model(noisy, timesteps).sample
                    loss = torch.nn.functional.mse_loss(prediction.float(), regression_target(clean, noise, timesteps))
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach().item() / args.gradient_accumulation_steps
        global_step += 1
        progress.update(1)
        progress.set_postfix(loss=loss_sum)
        log_and_checkpoint(
            accelerator, args, global_step, {"loss": loss_sum, "lr": lr_scheduler.get_last_lr()[0]}, logger
        )

    accelerator.wait_for_everyone()
    final = gathered_model(accelerator, model)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        pipeline = SampleThenEvaluatePipeline(model=final, scheduler=scheduler)
        pipeline.save_pretrained(args.output_dir)
        metrics = {
            "final_loss": loss_sum,
            "num_upstream_adapters": len(vectors),
            "vector_dim": vectorizer.dim,
            "canonical_lora": args.canonical_lora,
            "command": command_line(),
        }
        with open(os.path.join(args.output_dir, "training_metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        write_model_card(
            args.output_dir,
            title="Parameter diffusion over LoRA adapters of the digit classifier (certified few-shot transfer)",
            description=(
                f"A `ParameterDiffusionModel` ({sum(p.numel() for p in final.parameters()):,} parameters) trained "
                f"with `training/train_parameter_diffusion.py` on {len(vectors)} rank-2 LoRA adapters "
                f"({vectorizer.dim} numbers each{', canonical factors' if args.canonical_lora else ''}) of the zoo "
                "digit classifier, one per upstream 5-way domain-shifted task. Draw and certify adapters with "
                "`SampleThenEvaluatePipeline.from_pretrained(folder)`."
            ),
            command=command_line(),
            metrics=metrics,
            tags=["parameter-diffusion", "lora", "few-shot", "certified"],
        )
        maybe_push_to_hub(args, logger)
    accelerator.end_training()


if __name__ == "__main__":
    main()
