#!/usr/bin/env python
"""Train a tiny DINOv2-architecture encoder to recognise object classes in procedural scenes, per patch.

It stands in for a pretrained DINOv2 in SemanticNVS experiments on a CPU: its patch features carry what the
objects are. The result is a transformers `Dinov2Model` folder (load it with `Dinov2Model.from_pretrained`).

    accelerate launch training/train_semantic_encoder.py --output_dir procedural-semantic-encoder
"""

import argparse
import logging
import sys

import torch
import torch.nn.functional as F
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from diffusers_ext.training_utils import add_accelerate_arguments, output_dir_arg


logger = get_logger(__name__, log_level="INFO")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--output_dir", type=output_dir_arg, required=True, help="Where the encoder and checkpoints go."
    )
    parser.add_argument("--resolution", type=int, default=32, help="Rendered view size.")
    parser.add_argument("--patch_size", type=int, default=4, help="ViT patch size.")
    parser.add_argument("--hidden_size", type=int, default=16, help="Feature channels (the semantic channels).")
    parser.add_argument("--num_hidden_layers", type=int, default=3, help="Transformer layers.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of initialisation and of the scenes.")
    parser.add_argument("--train_batch_size", type=int, default=32, help="Views per step and process.")
    parser.add_argument("--max_train_steps", type=int, default=1500, help="Optimizer steps.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1, help="Micro-batches per optimizer step.")
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="Peak learning rate (cosine decay).")
    add_accelerate_arguments(parser, checkpointing_steps=500, checkpoints_total_limit=1)
    args = parser.parse_args(argv)
    if args.resolution % args.patch_size:
        parser.error(f"--resolution {args.resolution} must be a multiple of --patch_size {args.patch_size}.")
    for name in (
        "train_batch_size",
        "max_train_steps",
        "gradient_accumulation_steps",
        "checkpointing_steps",
        "hidden_size",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
    from diffusers_ext.training_utils import check_hub_arguments

    check_hub_arguments(args, parser)  # an upload that cannot happen fails now, not after training
    return args


def patch_labels(classes: torch.Tensor, patch: int, num_labels: int) -> torch.Tensor:
    """Majority class of every `patch x patch` patch of class maps `(N, H, W)` (sky -1 becomes the last label)."""
    labels = torch.where(classes < 0, torch.full_like(classes, num_labels - 1), classes)
    n, h, w = labels.shape
    patches = (
        labels.reshape(n, h // patch, patch, w // patch, patch).permute(0, 1, 3, 2, 4).reshape(n, -1, patch * patch)
    )
    return torch.mode(patches, dim=-1).values  # (N, num_patches)


class PatchClassifier(torch.nn.Module):
    """The encoder plus a linear head over its patch features: `(N, 3, H, W)` -> logits `(N, patches, labels)`."""

    def __init__(self, encoder, num_labels: int):
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(encoder.config.hidden_size, num_labels)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        from diffusers_ext.pipelines.semantic_nvs.semantic_features import semantic_feature_grid

        features = semantic_feature_grid(self.encoder, images)
        return self.head(features.flatten(2).transpose(1, 2))


def views(generator: torch.Generator, count: int, size: int) -> dict:
    from diffusers_ext.data.procedural_scenes import sample_scene_batch

    batch = sample_scene_batch(generator, count, 1, size, max_azimuth_span_deg=0.0)
    return {"images": batch["images"][:, 0], "classes": batch["classes"][:, 0]}


def main(argv=None):
    args = parse_args(argv)
    from transformers import Dinov2Config, Dinov2Model

    from diffusers_ext.data.procedural_scenes import OBJECT_CLASSES
    from diffusers_ext.training_utils import (
        build_accelerator,
        command_line,
        gathered_model,
        maybe_push_to_hub,
        maybe_resume,
        save_checkpoint,
        step_generator,
        write_model_card,
    )

    accelerator = build_accelerator(
        args.output_dir, args.logging_dir, args.mixed_precision, args.report_to, args.gradient_accumulation_steps
    )
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    set_seed(args.seed)
    num_labels = len(OBJECT_CLASSES) + 1  # + sky
    config = Dinov2Config(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=2,
        intermediate_size=4 * args.hidden_size,
        patch_size=args.patch_size,
        image_size=args.resolution,
    )
    model = PatchClassifier(Dinov2Model(config), num_labels)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.max_train_steps)
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    global_step = maybe_resume(accelerator, args.output_dir, args.resume_from_checkpoint, logger)
    if accelerator.is_main_process:
        accelerator.init_trackers("train_semantic_encoder", config={k: str(v) for k, v in vars(args).items()})

    progress = tqdm(range(args.max_train_steps), initial=global_step, disable=not accelerator.is_local_main_process)
    model.train()
    while global_step < args.max_train_steps:
        for micro in range(args.gradient_accumulation_steps):
            micro_step = global_step * args.gradient_accumulation_steps + micro
            generator = step_generator(args.seed, micro_step, accelerator.process_index)
            batch = views(generator, args.train_batch_size, args.resolution)
            targets = patch_labels(batch["classes"], args.patch_size, num_labels).to(accelerator.device)
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    logits = model(batch["images"].to(accelerator.device))
                loss = F.cross_entropy(logits.reshape(-1, num_labels).float(), targets.reshape(-1))
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
        global_step += 1
        progress.update(1)
        progress.set_postfix(loss=loss.item())
        if global_step % 50 == 0:
            accelerator.log({"loss": loss.item()}, step=global_step)
        if global_step % args.checkpointing_steps == 0 or global_step == args.max_train_steps:
            save_checkpoint(accelerator, args.output_dir, global_step, args.checkpoints_total_limit)

    accelerator.wait_for_everyone()
    net = gathered_model(accelerator, model)  # every process takes part: FSDP gathers the shards
    if accelerator.is_main_process:
        heldout = views(torch.Generator().manual_seed(10**9 + args.seed), 256, args.resolution)
        with torch.no_grad():
            predictions = net(heldout["images"]).argmax(-1)
        accuracy = (predictions == patch_labels(heldout["classes"], args.patch_size, num_labels)).float().mean().item()
        logger.info(f"held-out patch accuracy {accuracy:.4f}")
        net.encoder.save_pretrained(args.output_dir)
        write_model_card(
            args.output_dir,
            title="Procedural-scene semantic encoder",
            description=(
                f"A `Dinov2Model` ({sum(p.numel() for p in net.encoder.parameters()):,} parameters, patch "
                f"{args.patch_size}, {args.hidden_size} channels) trained with `training/train_semantic_encoder.py` "
                f"to classify each patch of {args.resolution}x{args.resolution} procedural scene views into "
                f"{num_labels} classes (floor, four object classes, sky). It stands in for DINOv2 in SemanticNVS "
                "experiments on a CPU."
            ),
            command=command_line(),
            metrics={"heldout_patch_accuracy": accuracy, "heldout_views": 256},
            tags=["semantic-features", "semantic-nvs"],
        )
        maybe_push_to_hub(args, logger)
    accelerator.end_training()


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        print(f"train_semantic_encoder.py: error: {error}", file=sys.stderr)
        sys.exit(2)
