"""GRPO for flow-matching text-to-image pipelines (Flow-GRPO), shaped like TRL's `GRPOTrainer`."""

import contextlib
import inspect
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from diffusers.utils import logging

from ..schedulers.scheduling_flow_match_sde import FlowMatchSDEScheduler
from ..training_utils import ResumableBatchSampler, save_model_state_dict, step_generator
from ..utils import public
from .base_config import with_default_targets
from .base_trainer import DiffusionTrainer
from .diffusion_grpo_config import SD3_LORA_TARGETS, DiffusionGRPOConfig
from .pipeline_adapters import get_adapter


logger = logging.get_logger(__name__)

RewardFunc = Callable[..., Sequence[float]]


@dataclass
class Rollout:
    """One generation round on one process: what the loss needs to rescore every stored transition.

    Attributes:
        prompts: one prompt per image (groups of `num_generations` consecutive images share one).
        columns: the other dataset columns, one entry per image.
        cond: conditioning actually used per image (E2PO stores the perturbed embeddings here).
        uncond: the unconditional (negative) conditioning per image, or None without CFG.
        latents: `(batch, num_steps + 1, ...)` the trajectory, `latents[:, i]` the input of step `i`.
        log_probs: `(batch, num_steps)` log-probabilities of the sampled transitions (NaN on ODE steps).
        timesteps: `(num_steps,)` the scheduler's timesteps.
        images: `(batch, channels, height, width)` decoded images in [0, 1].
        group_ids: `(batch,)` the index of each image's group in this rollout.
        row_ids: the dataset row of each group (`batch // num_generations` entries).
        rewards_per_func / rewards / advantages / group_std: filled by scoring: `(batch, num_funcs)`, `(batch,)`,
            `(batch,)` and `(batch // num_generations,)` (the reward std of each group).
    """

    prompts: list[str]
    columns: dict[str, list]
    cond: dict[str, torch.Tensor]
    uncond: dict[str, torch.Tensor] | None
    latents: torch.Tensor
    log_probs: torch.Tensor
    timesteps: torch.Tensor
    images: torch.Tensor
    group_ids: torch.Tensor
    row_ids: list[int]
    rewards_per_func: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    group_std: torch.Tensor | None = None


def clipped_policy_loss(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """PPO's clipped surrogate, `mean(max(-A r, -A clip(r, low, high)))`, as in Flow-GRPO and TRL's GRPO.

    Args:
        ratio (`torch.Tensor` of shape `(batch_size,)`): `exp(log pi_theta - log pi_old)` of each transition.
        advantages (`torch.Tensor` of shape `(batch_size,)`): the transitions' advantages.
        low, high (`float`): the clip range of the ratio, `1 - epsilon` and `1 + epsilon_high`.

    Returns:
        A 0-d tensor.
    """
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(low, high)).mean()


def check_reward_values(name: str, values, count: int, items: str = "images", prompts=None) -> torch.Tensor:
    """The rewards one reward function returned for `count` items, as a float32 tensor `(count,)`; a `ValueError`
    naming the function unless they are a sequence of `count` finite numbers (`prompts`, if given, are quoted)."""
    if values is None or isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"reward function {name!r} returned {type(values).__name__}; expected a list of floats.")
    if len(values) != count:
        raise ValueError(
            f"reward function {name!r} returned {len(values)} rewards for {count} {items}; it must return one float "
            f"per {items[:-1]}."
        )
    tensor = torch.as_tensor([float(v) for v in values], dtype=torch.float32)
    bad = (~torch.isfinite(tensor)).nonzero().flatten().tolist()
    if bad:
        quoted = f" (prompts {[prompts[i] for i in bad[:3]]})" if prompts is not None else ""
        raise ValueError(
            f"reward function {name!r} returned non-finite rewards {tensor[bad].tolist()} for {items} {bad}{quoted}; "
            "rewards must be finite. Nothing was optimised."
        )
    return tensor


def _reward_name(func) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


def reward_functions(reward_funcs, reward_weights=None) -> tuple[list, list[str], torch.Tensor]:
    """`(funcs, names, weights)` of a GRPO trainer's `reward_funcs` (a callable or a non-empty list of them) and
    `reward_weights` (one per function; None weighs each 1.0), checked; `weights` is a float32 tensor."""
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs or not all(callable(f) for f in funcs):
        raise TypeError(f"`reward_funcs` must be a callable or a non-empty list of callables, got {reward_funcs!r}.")
    weights = reward_weights if reward_weights is not None else [1.0] * len(funcs)
    if len(weights) != len(funcs):
        raise ValueError(f"`reward_weights` has {len(weights)} entries for {len(funcs)} reward functions.")
    return funcs, [_reward_name(f) for f in funcs], torch.tensor(weights, dtype=torch.float32)


def _as_rows(train_dataset, encoder_prompt_keys: tuple[str, ...]) -> list[dict]:
    """Dataset rows as dicts with a non-empty `prompt` (a list of strings, of dicts, or a `datasets.Dataset`).

    A row may also give the pipeline's per-text-encoder prompts (`prompt_2`, `prompt_3` for SD3; `prompt_2` for
    Flux), the arguments of the same names of the pipeline's `__call__`.
    """
    if train_dataset is None:
        raise ValueError("`train_dataset` is required: a list of prompts, of dicts with 'prompt', or a Dataset.")
    rows = [{"prompt": row} if isinstance(row, str) else dict(row) for row in train_dataset]
    if not rows:
        raise ValueError("`train_dataset` is empty: give at least one prompt.")
    for index, row in enumerate(rows):
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"`train_dataset` row {index} has no non-empty 'prompt' string: {row!r}.")
        for key in ("prompt_2", "prompt_3"):
            if key in row and key not in encoder_prompt_keys:
                raise ValueError(
                    f"`train_dataset` row {index} has a {key!r} column, but this pipeline's text encoders take only "
                    f"{['prompt', *encoder_prompt_keys]}."
                )
            if key in row and (not isinstance(row[key], str) or not row[key].strip()):
                raise ValueError(f"`train_dataset` row {index} has no non-empty {key!r} string: {row[key]!r}.")
    keys = set(rows[0])
    for index, row in enumerate(rows):
        if set(row) != keys:
            raise ValueError(f"`train_dataset` row {index} has columns {sorted(row)}, row 0 has {sorted(keys)}.")
    return rows


@public
class DiffusionGRPOTrainer(DiffusionTrainer):
    r"""
    Group Relative Policy Optimization for flow-matching text-to-image pipelines ([`StableDiffusion3Pipeline`],
    [`FluxPipeline`]), following Flow-GRPO and TRL's `GRPOTrainer` conventions.

    Each step draws prompts, generates `num_generations` images per prompt with the SDE sampler of
    [`FlowMatchSDEScheduler`] (keeping every transition's log-probability), scores them with the reward functions,
    turns rewards into group-relative advantages and minimises the clipped ratio loss
    `mean(max(-A r, -A clip(r, 1 - epsilon, 1 + epsilon_high)))` plus `beta` times the KL to the reference model
    (the transformer with its LoRA adapter disabled) on a share of the denoising steps.

    Args:
        pipeline: a `StableDiffusion3Pipeline` or `FluxPipeline` (its scheduler is swapped for a
            `FlowMatchSDEScheduler` with the same configuration).
        reward_funcs: a callable or a list of callables `f(prompts, images, **columns) -> list[float]`; `images`
            is a float tensor `(batch, channels, height, width)` in [0, 1]; the other dataset columns are passed by
            name, one entry per image. See `diffusers_ext.rewards`.
        args ([`DiffusionGRPOConfig`], *optional*): the configuration.
        train_dataset: prompts (a list of strings, of dicts with a `"prompt"` key, or a `datasets.Dataset`). Rows
            may give `"prompt_2"` / `"prompt_3"` too: the prompts of the second / third text encoder, as the
            pipeline's arguments of those names (otherwise every encoder reads `"prompt"`).
        peft_config (`peft.LoraConfig`, *optional*): train this LoRA adapter of the transformer (its
            `target_modules` default to the attention projections of SD3/Flux, `SD3_LORA_TARGETS`); None trains the
            whole transformer, as in TRL.

    Attributes:
        generation_batch_size (`int`): images generated per step over all processes (TRL's meaning).
        steps_per_generation (`int`): micro-batches of `per_device_train_batch_size` images per process in it.
        images_per_process (`int`): `per_device_train_batch_size * steps_per_generation`.

    Metrics (logged through the accelerate trackers every `logging_steps` and kept in `self.history`): `reward`,
    `reward_std`, `frac_reward_zero_std`, `rewards/{name}/mean|std`, `kl`, `clip_ratio/low_mean`,
    `clip_ratio/high_mean`, `clip_ratio/region_mean`, `loss`, `grad_norm`, and `time/*`: seconds per step by phase
    (`sampling`, `reward`, `optimization`, `other`, summing to `step`) and by model work (`text_encoder`,
    `transformer_forward`, `transformer_backward`, `vae_decode`, `optimizer_step`), and `overhead_fraction`, the
    share of the step that is neither model work nor reward ([`time_metrics`]).
    """

    _tag_names = ["diffusers-ext", "grpo", "flow-grpo"]
    config_class = DiffusionGRPOConfig

    def __init__(
        self,
        pipeline,
        reward_funcs: RewardFunc | list[RewardFunc],
        args: DiffusionGRPOConfig | None = None,
        train_dataset=None,
        peft_config=None,
    ):
        super().__init__(args)
        args = self.args
        self.adapter = get_adapter(pipeline)
        self.pipeline = pipeline
        self.reward_funcs, self.reward_names, self.reward_weights = reward_functions(reward_funcs, args.reward_weights)
        self.rows = _as_rows(train_dataset, self.adapter.encoder_prompt_keys)

        pipeline.scheduler = FlowMatchSDEScheduler.from_config(
            pipeline.scheduler.config,
            noise_level=args.noise_level,
            sde_type=args.sde_type,
            sde_window=tuple(args.sde_window) if args.sde_window else None,
        )
        self.scheduler = pipeline.scheduler
        self.train_step_indices = self._stochastic_steps()
        self.num_train_timesteps = max(1, int(len(self.train_step_indices) * args.timestep_fraction))
        self.peft_config = with_default_targets(peft_config, SD3_LORA_TARGETS)
        # One optimizer step accumulates `gradient_accumulation_steps` micro-batches at every trained timestep.
        self.create_accelerator(
            gradient_accumulation_steps=args.gradient_accumulation_steps * self.num_train_timesteps
        )
        self.generation_batch_size, self.steps_per_generation, self.images_per_process = args.resolve_generation_batch(
            self.accelerator.num_processes
        )
        device = self.accelerator.device
        pipeline.to(device)
        pipeline.set_progress_bar_config(disable=True)
        for name in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
            module = getattr(pipeline, name, None)
            if module is not None:
                module.requires_grad_(False).eval()

        transformer = pipeline.transformer
        transformer.requires_grad_(False)
        self.reference = None
        if self.peft_config is not None:
            # The adapter's random initialisation depends on `seed` alone (not on what ran before in the process).
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(args.seed)
                transformer.add_adapter(self.peft_config)
            for parameter in transformer.parameters():
                if parameter.requires_grad:
                    parameter.data = parameter.data.float()
        else:
            transformer.requires_grad_(True)
            if args.beta > 0:
                import copy

                self.reference = copy.deepcopy(transformer).requires_grad_(False).eval()
        self.transformer, self.trainable_parameters = self.prepare_trained_model(transformer)
        self.ema = None
        if args.use_ema:
            from diffusers.training_utils import EMAModel

            # A constant decay (min_decay = decay), as Flow-GRPO's EMA; checkpointed with the accelerator state.
            self.ema = EMAModel(self.trainable_parameters, decay=args.ema_decay, min_decay=args.ema_decay)
            self.accelerator.register_for_checkpointing(self.ema)
        self._timers: dict[str, float] = defaultdict(float)

    # ------------------------------------------------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------------------------------------------------

    def _stochastic_steps(self) -> list[int]:
        window = self.args.sde_window
        steps = range(self.args.num_inference_steps)
        chosen = [i for i in steps if window is None or window[0] <= i < window[1]]
        if not chosen:
            raise ValueError(f"`sde_window` {window} holds none of the {self.args.num_inference_steps} steps.")
        return chosen

    def _image_size(self) -> tuple[int, int]:
        default_h, default_w = self.adapter.default_size()
        return self.args.height or default_h, self.args.width or default_w

    @property
    def unwrapped_transformer(self):
        return self.accelerator.unwrap_model(self.transformer)

    @contextlib.contextmanager
    def ema_weights(self):
        """Context in which the transformer holds the EMA weights (`use_ema`); the trained weights come back after."""
        if self.ema is None:
            raise ValueError("`ema_weights()` needs `use_ema=True` in the config.")
        self.ema.store(self.trainable_parameters)
        self.ema.copy_to(self.trainable_parameters)
        try:
            yield self.unwrapped_transformer
        finally:
            self.ema.restore(self.trainable_parameters)

    def _timed(self, name: str):
        """Add the block's wall-clock seconds to `self._timers[name]` (after a device synchronise on CUDA, so that
        queued kernels are counted where they were launched)."""
        trainer = self
        device = self.accelerator.device

        def synchronize():
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        class _Timer:
            def __enter__(self):
                synchronize()
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                synchronize()
                trainer._timers[name] += time.perf_counter() - self.start

        return _Timer()

    def _generator(self, step: int, salt: int = 0) -> torch.Generator:
        return step_generator(self.args.seed + salt * 7919, step, self.accelerator.process_index)

    # ------------------------------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------------------------------

    def prompt_indices(self, step: int) -> list[int]:
        """Dataset rows of this process at `step` (each repeated `num_generations` times), resumable by step."""
        per_process = self.images_per_process // self.args.num_generations
        sampler = ResumableBatchSampler(
            len(self.rows),
            per_process,
            self.accelerator.num_processes,
            self.accelerator.process_index,
            self.args.seed,
            start_step=step,
        )
        return next(iter(sampler))

    def perturb_conditioning(self, cond: dict[str, torch.Tensor], step: int, row_ids: list[int]):
        """Hook for subclasses (E2PO): the conditioning each image is generated and trained with.

        `cond` holds one row per image (groups of `num_generations` consecutive rows); `row_ids` are the dataset
        rows of the groups.
        """
        return cond

    @torch.no_grad()
    def generate(self, row_ids: list[int], step: int) -> Rollout:
        """Generate `num_generations` images for each dataset row with the SDE sampler; keep trajectory and log-probs."""
        args, adapter, device = self.args, self.adapter, self.accelerator.device
        rows = [self.rows[i] for i in row_ids]
        G = args.num_generations
        prompts = [row["prompt"] for row in rows for _ in range(G)]
        columns = {key: [row[key] for row in rows for _ in range(G)] for key in rows[0] if key != "prompt"}
        group_ids = torch.arange(len(rows), device=device).repeat_interleave(G)
        height, width = self._image_size()

        with self._timed("text_encoder"):
            encoder_prompts = {
                key: [row[key] for row in rows] for key in adapter.encoder_prompt_keys if key in rows[0]
            }
            cond, uncond = adapter.encode(
                [row["prompt"] for row in rows],
                args.negative_prompt,
                args.guidance_scale,
                args.max_sequence_length,
                encoder_prompts,
            )
        cond = {k: v.repeat_interleave(G, dim=0) for k, v in cond.items()}
        uncond = None if uncond is None else {k: v.repeat_interleave(G, dim=0) for k, v in uncond.items()}
        cond = self.perturb_conditioning(cond, step, row_ids)

        generator = self._generator(step)
        dtype = self.unwrapped_transformer.dtype
        if args.init_same_noise:
            latents = adapter.prepare_latents(len(rows), height, width, generator, device, dtype)
            latents = latents.repeat_interleave(G, dim=0)
        else:
            latents = adapter.prepare_latents(len(prompts), height, width, generator, device, dtype)
        timesteps = adapter.set_timesteps(self.scheduler, args.num_inference_steps, latents, device)
        trajectory, log_probs = [latents], []
        self.transformer.eval()
        for t in timesteps:
            with self._timed("transformer_forward"), self.accelerator.autocast():
                velocity = adapter.velocity(self.transformer, latents, t, cond, uncond, args.guidance_scale)
            output = self.scheduler.step(velocity.float(), t, latents.float(), generator=generator)
            latents = output.prev_sample.to(dtype)
            trajectory.append(latents)
            log_prob = output.log_prob
            if log_prob is not None and latents.dtype != output.prev_sample.dtype:
                # the trajectory keeps the sample rounded to the model's dtype and the loss rescores that one, so
                # the old log-prob scores it too (else the on-policy ratio is not 1 in bf16/fp16)
                std = output.std_dev.reshape(-1, *([1] * (latents.ndim - 1)))
                log_prob = self.scheduler.gaussian_log_prob(latents, output.prev_sample_mean, std)
            log_probs.append(
                log_prob if log_prob is not None else torch.full((len(prompts),), math.nan, device=device)
            )
        with self._timed("vae_decode"):
            chunk = args.vae_decode_batch_size or len(latents)
            images = torch.cat([adapter.decode(part, height, width) for part in latents.split(chunk)])
        return Rollout(
            prompts=prompts,
            columns=columns,
            cond=cond,
            uncond=uncond,
            latents=torch.stack(trajectory, dim=1),
            log_probs=torch.stack(log_probs, dim=1).float(),
            timesteps=timesteps,
            images=images,
            group_ids=group_ids,
            row_ids=list(row_ids),
        )

    # ------------------------------------------------------------------------------------------------------------
    # Scoring
    # ------------------------------------------------------------------------------------------------------------

    def score(self, prompts: list[str], images: torch.Tensor, columns: dict[str, list]) -> torch.Tensor:
        """Call every reward function; return `(batch, num_funcs)` rewards, or raise on a wrong length or NaN."""
        scores = []
        for func, name in zip(self.reward_funcs, self.reward_names):
            kwargs = dict(columns)
            if "trainer_state" in inspect.signature(func).parameters:
                kwargs["trainer_state"] = {"global_step": self.global_step}
            with self._timed("reward"):
                values = func(prompts=prompts, images=images, **kwargs)
            scores.append(check_reward_values(name, values, len(prompts), "images", prompts))
        return torch.stack(scores, dim=1).to(self.accelerator.device)

    def compute_advantages(self, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Group-relative advantages of `rewards` (this process's, grouped by `num_generations`).

        Returns `(advantages, group_std)`; `scale_rewards` picks the divisor (group std, the std of the whole batch
        on all processes, or none), and advantages are clipped to `adv_clip_max`.
        """
        G = self.args.num_generations
        grouped = rewards.view(-1, G)
        mean = grouped.mean(dim=1, keepdim=True)
        std = grouped.std(dim=1, keepdim=True)
        advantages = grouped - mean
        if self.args.scale_rewards == "group":
            advantages = advantages / (std + 1e-4)
        elif self.args.scale_rewards == "batch":
            everything = self.accelerator.gather(rewards.detach())
            advantages = advantages / (everything.std() + 1e-4)
        advantages = advantages.clamp(-self.args.adv_clip_max, self.args.adv_clip_max)
        return advantages.flatten(), std.flatten()

    def score_rollout(self, rollout: Rollout) -> Rollout:
        """Fill `rollout`'s rewards and advantages, and record the reward metrics."""
        rewards_per_func = self.score(rollout.prompts, rollout.images, rollout.columns)
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).sum(dim=1)
        advantages, group_std = self.compute_advantages(rewards)
        rollout.rewards_per_func, rollout.rewards, rollout.advantages = rewards_per_func, rewards, advantages
        rollout.group_std = group_std

        all_rewards = self.accelerator.gather(rewards)
        all_std = self.accelerator.gather(group_std)
        all_per_func = self.accelerator.gather(rewards_per_func)
        self._metrics["reward"].append(all_rewards.mean().item())
        self._metrics["reward_std"].append(all_std.mean().item())
        self._metrics["frac_reward_zero_std"].append((all_std <= self.args.reward_std_tolerance).float().mean().item())
        for j, name in enumerate(self.reward_names):
            self._metrics[f"rewards/{name}/mean"].append(all_per_func[:, j].mean().item())
            self._metrics[f"rewards/{name}/std"].append(all_per_func[:, j].std().item())
        return rollout

    # ------------------------------------------------------------------------------------------------------------
    # Loss
    # ------------------------------------------------------------------------------------------------------------

    def timesteps_to_train(self, step: int) -> list[int]:
        """The step indices trained this step: the first share of the stochastic steps, or a random subset."""
        indices = self.train_step_indices
        if self.args.timestep_selection == "first":
            return indices[: self.num_train_timesteps]
        order = torch.randperm(len(indices), generator=self._generator(step, salt=1))
        return sorted(indices[int(i)] for i in order[: self.num_train_timesteps])

    def _select(self, tensors: dict | None, index: torch.Tensor) -> dict | None:
        return None if tensors is None else {k: v[index] for k, v in tensors.items()}

    def step_log_prob(self, transformer, rollout: Rollout, index: torch.Tensor, i: int):
        """Log-probability of the stored transition `i` of images `index` under `transformer`, and its mean/std."""
        latents = rollout.latents[index, i]
        with self._timed("transformer_forward"), self.accelerator.autocast():
            velocity = self.adapter.velocity(
                transformer,
                latents,
                rollout.timesteps[i],
                self._select(rollout.cond, index),
                self._select(rollout.uncond, index),
                self.args.guidance_scale,
            )
        mean, std = self.scheduler.transition(velocity.float(), latents.float(), i)
        log_prob = self.scheduler.gaussian_log_prob(rollout.latents[index, i + 1], mean, std)
        return log_prob, mean, std

    def compute_loss(self, rollout: Rollout, index: torch.Tensor, i: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped-ratio GRPO loss (+ `beta` KL) of images `index` at step index `i`."""
        args = self.args
        log_prob, mean, std = self.step_log_prob(self.transformer, rollout, index, i)
        advantages = rollout.advantages[index]
        ratio = torch.exp(log_prob - rollout.log_probs[index, i])
        low, high = 1 - args.epsilon, 1 + (args.epsilon_high if args.epsilon_high is not None else args.epsilon)
        policy_loss = clipped_policy_loss(ratio, advantages, low, high)
        loss = policy_loss
        metrics = {
            "clip_ratio/low_mean": ((ratio < low) & (advantages < 0)).float().mean().item(),
            "clip_ratio/high_mean": ((ratio > high) & (advantages > 0)).float().mean().item(),
            "clip_ratio/region_mean": ((ratio < low) | (ratio > high)).float().mean().item(),
            "policy_loss": policy_loss.item(),
        }
        if args.beta > 0:
            with torch.no_grad():
                if self.reference is not None:
                    _, reference_mean, _ = self.step_log_prob(self.reference, rollout, index, i)
                else:
                    model = self.unwrapped_transformer
                    model.disable_adapters()
                    try:
                        _, reference_mean, _ = self.step_log_prob(model, rollout, index, i)
                    finally:
                        model.enable_adapters()
            kl = self.scheduler.kl_penalty(mean, reference_mean, i)
            loss = loss + args.beta * kl.mean()
            metrics["kl"] = kl.mean().item()
        return loss, metrics

    def optimize(self, rollout: Rollout, step: int) -> None:
        """`num_iterations` optimizer steps on `rollout`, each over all micro-batches and trained timesteps."""
        args = self.args
        self.transformer.train()
        timesteps = self.timesteps_to_train(step)
        micro = args.per_device_train_batch_size
        batch = rollout.latents.shape[0]
        keep = torch.ones(batch, dtype=torch.bool, device=rollout.latents.device)
        if args.drop_zero_advantage:
            keep = rollout.group_std.repeat_interleave(args.num_generations) > args.reward_std_tolerance
        self.log_metric("frac_samples_trained", keep.float().mean().item())
        for iteration in range(args.num_iterations):
            for start in range(0, batch, micro):
                index = torch.arange(start, min(start + micro, batch), device=keep.device)
                # Dropped images leave the micro-batch; an emptied one still counts toward the accumulation.
                full, index = index, index[keep[index]]
                for i in timesteps:
                    with self.accelerator.accumulate(self.transformer):
                        if len(index):
                            loss, metrics = self.compute_loss(rollout, index, i)
                            with self._timed("transformer_backward"):
                                self.accelerator.backward(loss)
                            self._metrics["loss"].append(loss.item())
                            for key, value in metrics.items():
                                self._metrics[key].append(value)
                        elif self.accelerator.num_processes > 1:
                            # Under DDP every process must run the same forwards and backwards (gradients are
                            # all-reduced in backward): one whose images were all dropped joins with a zero-weighted
                            # loss, so its gradient contribution is zero and the collectives line up.
                            loss, _ = self.compute_loss(rollout, full, i)
                            with self._timed("transformer_backward"):
                                self.accelerator.backward(loss * 0.0)
                        with self._timed("optimizer_step"):
                            if self.accelerator.sync_gradients:
                                self.log_metric(
                                    "grad_norm", self.clip_gradients(self.trainable_parameters, self.transformer)
                                )
                            self.optimizer.step()
                            self.optimizer.zero_grad()
            # One optimizer step per iteration; counting them from the step keeps a resumed run's EMA identical.
            if self.ema is not None and (step * args.num_iterations + iteration + 1) % args.ema_update_steps == 0:
                self.ema.step(self.trainable_parameters)

    # ------------------------------------------------------------------------------------------------------------
    # Training loop
    # ------------------------------------------------------------------------------------------------------------

    def training_step(self) -> dict[str, float]:
        """One generation round: sample, score, optimise. Returns the step's metrics (averaged over processes)."""
        step = self.global_step
        self._timers.clear()
        start = time.perf_counter()
        with self._timed("sampling"):
            rollout = self.generate(self.prompt_indices(step), step)
        rollout = self.score_rollout(rollout)
        with self._timed("optimization"):
            self.optimize(rollout, step)
        self.after_step(rollout, step)
        total = time.perf_counter() - start

        logs = {key: sum(values) / len(values) for key, values in self._metrics.items() if values}
        logs.update(self.time_metrics(total))
        logs.update(self.extra_metrics(rollout))
        return self.reduce_metrics(logs)

    #: the model work of a step, the part a bare loop doing the same sampling and training would also spend
    MODEL_TIMERS = ("text_encoder", "transformer_forward", "transformer_backward", "vae_decode", "optimizer_step")

    def time_metrics(self, total: float) -> dict[str, float]:
        """The step's time, in seconds, by phase and by kind of work; see the class docstring.

        Phases sum to `time/step`: `sampling`, `reward`, `optimization` and `other` (advantages, metrics, the
        subclass hook). Model work (`MODEL_TIMERS`, each measured around the call itself) and the reward are what
        any implementation spends; `time/overhead_fraction` is the rest of the step (SDE arithmetic and
        log-probabilities, conditioning copies, metric reads, Python) over the step.
        """
        timers = self._timers
        phases = {name: timers[name] for name in ("sampling", "reward", "optimization")}
        logs = {"time/step": total, **{f"time/{name}": value for name, value in phases.items()}}
        logs["time/other"] = max(0.0, total - sum(phases.values()))
        logs.update({f"time/{name}": timers[name] for name in self.MODEL_TIMERS})
        model = sum(timers[name] for name in self.MODEL_TIMERS) + timers["reward"]
        logs["time/overhead_fraction"] = max(0.0, total - model) / total
        return logs

    def after_step(self, rollout: Rollout, step: int) -> None:
        """Hook for subclasses, called after the optimizer steps of `step`."""

    def extra_metrics(self, rollout: Rollout) -> dict[str, float]:
        """Hook for subclasses: metrics to add to the step's logs."""
        return {}

    # ------------------------------------------------------------------------------------------------------------
    # Saving
    # ------------------------------------------------------------------------------------------------------------

    def _save_weights(self, output_dir: str) -> None:
        """The LoRA (`pytorch_lora_weights.safetensors`, loadable with `load_lora_weights`) or the full transformer;
        the EMA weights with `use_ema`."""
        if self.ema is not None:
            with self.ema_weights():
                return self._save_trained_weights(output_dir)
        return self._save_trained_weights(output_dir)

    def _save_trained_weights(self, output_dir: str) -> None:
        state = self.gathered_state_dict(self.transformer)  # every process (a collective when sharded)
        if not self.accelerator.is_main_process:
            return
        transformer = self.unwrapped_transformer
        if self.peft_config is not None:
            from peft.utils import get_peft_model_state_dict

            lora = get_peft_model_state_dict(transformer, state_dict=state)
            layers = {k: v.detach().cpu() for k, v in lora.items()}
            # The adapter's config (rank, alpha, targets) goes into the file's metadata, so the scale survives loading.
            type(self.pipeline).save_lora_weights(
                output_dir,
                transformer_lora_layers=layers,
                transformer_lora_adapter_metadata=transformer.peft_config["default"].to_dict(),
            )
        elif state is None:
            transformer.save_pretrained(os.path.join(output_dir, "transformer"))
        else:
            save_model_state_dict(transformer, state, os.path.join(output_dir, "transformer"))

    def _card_title(self, base_model: str | None) -> str:
        return f"{type(self).__name__.replace('Trainer', '')} LoRA for {type(self.pipeline).__name__}"

    def _card_metrics(self) -> dict:
        last = self.history[-1] if self.history else {}
        first = self.history[0] if self.history else {}
        metrics = {"reward (first step)": first["reward"]} if "reward" in first else {}
        for key in ("reward", "reward_std", "frac_reward_zero_std", "kl"):
            if key in last:
                metrics[f"{key} (last step)"] = last[key]
        return metrics

    def _card_tags(self) -> list[str]:
        return [*self._tag_names, "lora" if self.peft_config is not None else "full-finetune"]

    def _card_description(self) -> str:
        args = self.args
        rewards = ", ".join(f"`{n}` (weight {w:g})" for n, w in zip(self.reward_names, self.reward_weights.tolist()))
        lora = self.peft_config
        what = (
            f"A LoRA (rank {lora.r}, alpha {lora.lora_alpha:g}) of the transformer" if lora else "The full transformer"
        )
        load = (
            "Load it with `pipe.load_lora_weights(folder)`."
            if lora is not None
            else "Load it with `SD3Transformer2DModel.from_pretrained(folder, subfolder='transformer')`."
        )
        return (
            f"{what}, trained by `{type(self).__name__}` (diffusers-ext) for {self.global_step} steps of "
            f"{self.generation_batch_size} images ({self.images_per_process} per process) in groups of "
            f"{args.num_generations}, "
            f"{args.num_inference_steps}-step `{args.sde_type}` sampling at noise level {args.noise_level}, "
            f"guidance {args.guidance_scale}, beta {args.beta}, epsilon {args.epsilon}, learning rate "
            f"{args.learning_rate}. Rewards: {rewards}. {load}"
        )
