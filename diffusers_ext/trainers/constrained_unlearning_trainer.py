"""Constrained unlearning of diffusion models by primal-dual training, and its baselines (ESD, SISS, NegGrad+)."""

import copy
import os

import torch
from diffusers.utils import logging

from ..pipelines.denoiser_families import Conditions, cat_conditions, get_denoiser_family
from ..training_utils import step_generator
from ..utils import public
from .base_trainer import DiffusionTrainer
from .constrained_unlearning_config import ConstrainedUnlearningConfig
from .unlearning_inputs import add_lora, as_tensors, build_conditions, check_method
from .unlearning_noise import FlowMatchingNoiseProcess, VPNoiseProcess
from .unlearning_objectives import OBJECTIVES, NoisedBatch, UnlearningContext, mse


logger = logging.get_logger(__name__)

STATE_FILE = "unlearning_state.safetensors"


class AdapterDisabledReference(torch.nn.Module):
    """The pretrained denoiser as the LoRA-trained one (UNet or transformer) with its adapters disabled, called like it.

    Every call runs the model in eval mode with its LoRA layers off (peft's base-layer path: exactly the pretrained
    computation) and restores both afterwards. The model is held, not registered as a submodule, so this module owns
    no parameters and the weights are not copied.
    """

    def __init__(self, unet):
        super().__init__()
        self._unet = (unet,)

    @property
    def unet(self):
        return self._unet[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.unet.dtype

    @property
    def config(self):
        return self.unet.config

    def forward(self, *args, **kwargs):
        from peft.tuners.tuners_utils import BaseTunerLayer

        unet = self.unet
        layers = [m for m in unet.modules() if isinstance(m, BaseTunerLayer)]
        was_training = unet.training
        unet.eval()
        for layer in layers:
            layer.enable_adapters(False)
        try:
            return unet(*args, **kwargs)
        finally:
            for layer in layers:
                layer.enable_adapters(True)
            unet.train(was_training)


@public
class ConstrainedUnlearningTrainer(DiffusionTrainer):
    r"""
    Unlearn a concept or a set of training examples from a diffusers denoiser by primal-dual training.

    The unlearned model q minimises its deviation from the pretrained model subject to a separation constraint from
    the distribution p_u to forget; lambda is the dual variable of that constraint:

    - `reverse_kl`: min KL(q || p_ref) s.t. KL(q || p_u) >= b. Optimum q ∝ p_ref^{1/(1-λ)} p_u^{-λ/(1-λ)}, i.e. the
      noise-prediction target `eps_ref + λ/(1-λ) (eps_ref - eps_u)` (ESD's target with a learned strength).
    - `likelihood`: min KL(q || p_ref) s.t. E_q[log p_u - log p_ref] <= b. Optimum q ∝ p_ref^{1+λ} p_u^{-λ}, target
      `eps_ref + λ (eps_ref - eps_u)`.
    - `forward_kl`: min KL(p_pre || q) s.t. KL(p_u || q) >= b. Optimum the subtracted mixture
      (p_pre - λ p_u) / (1 - λ), trained by the denoising loss `[E_pre l - λ E_u l] / (1 - λ)`.

    Each training step draws the batch (`sample_batch`), computes the targets with the frozen pretrained copy
    (`compute_targets`), takes a primal step on the loss (`compute_loss`) and a projected dual-ascent step on
    lambda from the Monte-Carlo constraint estimate (`dual_step`). What differs between the methods lives in one
    [`UnlearningObjective`] per method (`diffusers_ext.trainers.unlearning_objectives`), chosen by
    `args.constraint` or `args.baseline` (ESD, SISS, NegGrad+ or a retain-only fine-tune, trained by the same steps
    with a fixed strength); it sees an [`UnlearningContext`], not the trainer. The loop, checkpoints (`save_steps`,
    `resume_from_checkpoint`; lambda and the on-policy pool go into `unlearning_state.safetensors`), logging and
    `save_model` come from [`DiffusionTrainer`].

    Flow-matching models (SD3, Flux) predict a velocity, not the noise; every target above is an affine combination
    of predictions with weights summing to 1, so it holds unchanged for velocities, and the constraint estimates use
    the rectified flow's path weights (`docs/unlearning.md`, "Flow-matching models").

    Args:
        pipeline: a diffusers pipeline holding the pretrained denoiser:
            - a [`ClassConditionalDDPMPipeline`] or `DDPMPipeline` ([`UNet2DModel`], epsilon prediction; its
              `null_class_label` is the default reference);
            - a `StableDiffusionPipeline`-like one (SD 1.x / 2.x [`UNet2DConditionModel`], epsilon prediction; its
              `text_encoder` and `tokenizer` encode `forget_prompts`, `retain_prompts` and `reference_prompt`);
            - a `StableDiffusionXLPipeline` (UNet with `addition_embed_type="text_time"`: the pipeline's
              `encode_prompt` gives the prompt states and pooled embeddings, and the time ids are those of
              `config.resolution` with no crop);
            - a `StableDiffusion3Pipeline` or `FluxPipeline` (`SD3Transformer2DModel` / `FluxTransformer2DModel`,
              rectified flow; the pipeline's `encode_prompt` with `config.max_sequence_length` T5 tokens; Flux's
              guidance input is `config.guidance_scale`).
            The scheduler's configuration gives the noise process. The denoiser (`pipeline.unet` or
            `pipeline.transformer`) is trained in place (all weights, or the LoRA adapters of `peft_config`);
            `save_model` saves the pipeline with the unlearned denoiser, or its LoRA weights.
        args ([`ConstrainedUnlearningConfig`], *optional*): what to forget, the constraint and the optimisation.
        forget_dataset (*optional*): training examples to forget, `(images, labels)` (data unlearning).
        retain_dataset (*optional*): the remaining training examples, `(images, labels)`.
        peft_config (`peft.LoraConfig`, *optional*): train these LoRA adapters instead of all weights; without
            `target_modules` they go on the attention projections (`to_q`, `to_k`, `to_v`, `to_out.0`), for a
            `UNet2DModel` also on `conv1`, `conv2` and `time_emb_proj`, and for SD3 / Flux also on the text tokens'
            joint-attention projections (`add_q_proj`, `add_k_proj`, `add_v_proj`, `to_add_out`). The frozen
            pretrained reference is then the same model with its adapters disabled ([`AdapterDisabledReference`]),
            not a copy.
        accelerator (`accelerate.Accelerator`, *optional*): built from `args` when omitted.

    Attributes:
        unet: the denoiser being trained (the pipeline's `unet`, or its `transformer` for SD3 / Flux), prepared by
            the accelerator; `ref_unet` the frozen pretrained one.
        family ([`DenoiserFamily`]): how the denoiser is conditioned and called; `noise_process` its forward noising.
        constraint_level (`float`): the level b in use; `constraint_level="auto"` is resolved (calibrated, times
            `constraint_level_factor`) on first use, at the latest when training starts.
        dual_learning_rate (`float`): the dual step size in use (`"auto"` resolved from b the same way).

    Metrics (every step in `history`, and to the trackers every `logging_steps`): `loss`, `forget_loss`,
    `retain_loss`, `constraint_estimate`, `constraint_ema`, `grad_norm`, and `lambda`, `slack` (primal-dual
    methods) and `guidance_strength` (guidance-style targets).
    """

    config_class = ConstrainedUnlearningConfig
    state_file = STATE_FILE
    _progress_keys = ("loss", "lambda", "slack")

    def __init__(
        self,
        pipeline,
        args: ConstrainedUnlearningConfig | None = None,
        *,
        forget_dataset=None,
        retain_dataset=None,
        peft_config=None,
        accelerator=None,
    ):
        super().__init__(args)
        args = self.args
        # a TypeError naming what the pipeline holds, before anything else
        self.family = family = get_denoiser_family(
            pipeline, max_sequence_length=args.max_sequence_length, guidance_scale=args.guidance_scale
        )
        unet = family.denoiser
        scheduler = pipeline.scheduler
        if not family.flow_matching:
            if not hasattr(scheduler, "alphas_cumprod") or not hasattr(scheduler, "add_noise"):
                raise TypeError(
                    "`pipeline.scheduler` must be a DDPM/DDIM-family scheduler with `alphas_cumprod` and `add_noise`, "
                    f"got {type(scheduler).__name__}."
                )
            prediction_type = scheduler.config.get("prediction_type", "epsilon")
            if prediction_type != "epsilon":
                raise ValueError(
                    f"`pipeline.scheduler` has prediction_type {prediction_type!r}; the unlearning targets of UNets "
                    "are defined for 'epsilon' prediction."
                )
        self.pipeline = pipeline
        self.peft_config = peft_config
        self.is_text = family.text
        self.method = args.method
        self.forget_data = as_tensors(forget_dataset, "forget_dataset")
        self.retain_data = as_tensors(retain_dataset, "retain_dataset")
        self.mode = "data" if self.forget_data is not None else "concept"
        objective_class = OBJECTIVES[self.method]
        check_method(args, self.mode, objective_class, self.retain_data)
        accelerator = self.create_accelerator(accelerator)
        if self.shards_parameters and peft_config is not None and not self.is_text:
            raise ValueError(
                "`peft_config` on a UNet2DModel (saved merged into plain weights) cannot be saved from sharded "
                f"parameters ({accelerator.distributed_type}); train it with DDP, or without `peft_config`."
            )
        process_class = FlowMatchingNoiseProcess if family.flow_matching else VPNoiseProcess
        self.noise_process = process_class(scheduler.config)
        self.num_train_timesteps = self.noise_process.num_train_timesteps
        self.path_weights = self.noise_process.path_weights

        # Conditions are validated and encoded before any weights are copied or trained.
        null_class_label = getattr(pipeline.config, "null_class_label", None)
        (
            self.sample_shape,
            self.forget_conds,
            self.retain_conds,
            self.reference_cond,
            self.forget_data,
            self.retain_data,
        ) = build_conditions(args, family, self.mode, self.forget_data, self.retain_data, null_class_label)
        self._constraint_level = None if args.constraint_level == "auto" else args.constraint_level
        self._dual_learning_rate = None if args.dual_learning_rate == "auto" else args.dual_learning_rate
        self._check_auto_level(objective_class)

        # the model's own dtype (float16 / bfloat16 checkpoints): its inputs are cast to it, its outputs to float32
        self.unet_dtype = unet.dtype
        if peft_config is not None:
            # the reference is the same model with its adapters disabled: no second copy of the weights
            add_lora(unet, peft_config, family.lora_targets)
            self.ref_unet = AdapterDisabledReference(unet)
        else:
            self.ref_unet = copy.deepcopy(unet).requires_grad_(False).eval()
            unet.requires_grad_(True)
        unet.train()
        self.unet, self.trainable_parameters = self.prepare_trained_model(unet)
        self.ref_unet.to(accelerator.device)
        self.path_weights = self.path_weights.to(accelerator.device)

        self.lambda_ = float(args.lambda_init)
        self.constraint_ema: float | None = None
        self.best_constraint: float | None = None
        self.violation_steps = 0
        self.forget_pool: torch.Tensor | None = None
        self.forget_pool_conds: torch.Tensor | None = None
        self.objective = objective_class(self._context())
        self._fixed_pools()

    def _context(self) -> UnlearningContext:
        """What the objective may read and draw."""
        return UnlearningContext(
            args=self.args,
            mode=self.mode,
            device=self.accelerator.device,
            num_train_timesteps=self.num_train_timesteps,
            noise_process=self.noise_process,
            forget_conds=self.forget_conds,
            reference_cond=self.reference_cond,
            forget_data=self.forget_data,
            retain_data=self.retain_data,
            noised=self._noised,
            pick=self._pick,
            repeat=self._repeat,
            pretrained_eps=lambda x, t, cond: self.predict(self.ref_unet, x, t, cond),
            path_sum=self._path_sum,
            sample_pretrained=lambda conds, tag: self.sample(self.ref_unet, conds, self._pool_generator(tag, 0)),
            on_policy_pool=self.on_policy_pool,
        )

    # ------------------------------------------------------------------------------------------------------------
    # The constraint level and dual step size in use
    # ------------------------------------------------------------------------------------------------------------

    @property
    def constraint_level(self) -> float:
        """The level b in use: `args.constraint_level`, or for "auto" `calibrate_level()` times
        `constraint_level_factor` (resolved once; calibration is deterministic, so a resumed run gets the same)."""
        if self._constraint_level is None:
            self._constraint_level = self.calibrate_level() * self.args.constraint_level_factor
        return self._constraint_level

    @property
    def dual_learning_rate(self) -> float:
        """The dual step size in use: `args.dual_learning_rate`, or for "auto" `dual_learning_rate_scale` (default
        0.02 for concepts, 0.3 for data) divided by max(|b|, 1e-3)."""
        if self._dual_learning_rate is None:
            scale = self.args.dual_learning_rate_scale
            scale = scale if scale is not None else (0.3 if self.mode == "data" else 0.02)
            self._dual_learning_rate = scale / max(abs(self.constraint_level), 1e-3)
        return self._dual_learning_rate

    def _check_auto_level(self, objective_class) -> None:
        if self.args.constraint_level != "auto" or not objective_class.primal_dual:
            return
        if self.mode == "data":
            raise ValueError(
                "`constraint_level='auto'` calibrates on the retained classes or prompts (concept unlearning); for "
                "data unlearning give the level, e.g. the held-out non-members' denoising loss (membership parity)."
            )
        if self.retain_conds is None:
            raise ValueError(
                "`constraint_level='auto'` calibrates on the retained classes or prompts, and there are none: give "
                "`retain_classes` / `retain_prompts`, or a numeric `constraint_level`."
            )

    # ------------------------------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------------------------------

    def predict(self, unet, x, t, cond):
        """The prediction of `unet` (the trained or the frozen denoiser) at `(x, t)` under `cond`, in float32: the
        noise for DDPM-family UNets, the velocity for SD3 / Flux. `t` `(B,)` holds training steps of the noise
        process (or, 0-d, one for all); the inputs are cast to the model's dtype (a float16 / bfloat16 model then
        runs with or without autocast)."""
        return self._predict_at(unet, x, self.noise_process.model_timestep(t), cond)

    def _predict_at(self, unet, x, timestep, cond):
        return self.family.predict(unet, x, timestep, cond, self.unet_dtype).float()

    @torch.no_grad()
    def sample(self, unet, conds, generator: torch.Generator) -> torch.Tensor:
        """Draw one sample per condition in `conds` with the noise process's deterministic sampler (DDIM, or Euler
        on the flow ODE) of `config.pool_sampling_steps` steps."""
        device = self.accelerator.device
        noise = torch.randn((len(conds), *self.sample_shape), generator=generator).to(device)
        conds = conds.to(device)
        was_training = unet.training
        unet.eval()
        x = self.noise_process.sample(
            lambda x, timestep: self._predict_at(unet, x, timestep, conds), noise, self.args.pool_sampling_steps
        )
        unet.train(was_training)
        return x

    def _pool_generator(self, tag: int, step: int) -> torch.Generator:
        # Identical on every process (pools are shared), so a checkpoint of the main process restores them all.
        return torch.Generator().manual_seed((self.args.seed * 7_919 + tag) * 1_000_003 + step)

    def _repeat(self, conds: torch.Tensor, n: int) -> torch.Tensor:
        return conds[torch.arange(n) % len(conds)]

    def _fixed_pools(self):
        """Samples of the pretrained model at the retained conditions, and the objective's own fixed pools."""
        self.retain_pool = self.retain_pool_conds = None
        self.ref_pool = self.u_pool = None
        if self.mode != "concept":
            return
        if self.retain_conds is not None:
            self.retain_pool_conds = self._repeat(self.retain_conds, self.args.pool_size)
            self.retain_pool = self.sample(self.ref_unet, self.retain_pool_conds, self._pool_generator(1, 0))
        self.objective.setup()

    def refresh_forget_pool(self):
        """Redraw the on-policy pool: samples of the model being trained at the forget conditions."""
        conds = self._repeat(self.forget_conds, self.args.pool_size)
        unet = self.accelerator.unwrap_model(self.unet)
        self.forget_pool = self.sample(unet, conds, self._pool_generator(4, self.global_step))
        self.forget_pool_conds = conds

    def on_policy_pool(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`(samples, conds)` of the on-policy pool at `step`, redrawn first every `pool_refresh_steps` steps."""
        if self.forget_pool is None or step % self.args.pool_refresh_steps == 0:
            self.refresh_forget_pool()
        return self.forget_pool, self.forget_pool_conds

    # ------------------------------------------------------------------------------------------------------------
    # One step: batch, targets, loss, dual update
    # ------------------------------------------------------------------------------------------------------------

    def _noised(self, x0, conds, generator, name: str) -> NoisedBatch:
        device = self.accelerator.device
        noise = torch.randn(x0.shape, generator=generator).to(device)
        t = torch.randint(0, self.num_train_timesteps, (x0.shape[0],), generator=generator).to(device)
        x0 = x0.to(device)
        return NoisedBatch(
            name=name,
            x_t=self.noise_process.add_noise(x0, noise, t),
            t=t,
            cond=conds.to(device) if conds is not None else None,
            noise=noise,
            x0=x0,
            denoising_target=self.noise_process.denoising_target(x0, noise),
        )

    def _pick(self, pool: torch.Tensor, conds: torch.Tensor | None, generator: torch.Generator):
        index = torch.randint(0, pool.shape[0], (self.args.per_device_train_batch_size,), generator=generator)
        return pool[index.to(pool.device)], (conds[index.to(conds.device)] if conds is not None else None)

    def sample_batch(self, micro_step: int = 0) -> list[NoisedBatch]:
        """The noised inputs of one micro-batch (each part one forward of the trained UNet): the objective's forget
        parts, then the retain part (from the retained conditions' pool or the retain set) when it wants one."""
        args = self.args
        if micro_step == 0:
            self.objective.begin_step(self.global_step)
        step = self.global_step * args.gradient_accumulation_steps + micro_step
        generator = step_generator(args.seed, step, self.accelerator.process_index)
        parts = self.objective.forget_parts(generator)
        if self.objective.wants_retain():
            if self.mode == "data":
                parts.append(self._noised(*self._pick(*self.retain_data, generator), generator, "retain"))
            elif self.retain_pool is not None:
                parts.append(
                    self._noised(*self._pick(self.retain_pool, self.retain_pool_conds, generator), generator, "retain")
                )
        return parts

    @torch.no_grad()
    def compute_targets(self, parts: list[NoisedBatch]) -> None:
        """Set each part's regression target: the pretrained prediction (concept) or the noise (data) for the retain
        part, the objective's target for the others."""
        for part in parts:
            if part.name != "retain":
                self.objective.add_targets(part, self.lambda_)
            elif self.mode == "data":
                part.target = part.denoising_target
            else:
                part.target = self.predict(self.ref_unet, part.x_t, part.t, part.cond)

    def guidance_strength(self) -> float:
        """eta of the target eps_ref + eta (eps_ref - eps_u): λ/(1-λ) (reverse KL), λ (likelihood), ESD's fixed eta."""
        if not self.objective.guidance:
            raise ValueError(f"{self.objective.name!r} has no guidance-style target, so no guidance strength.")
        return self.objective.guidance_strength(self.lambda_)

    def _path_sum(self, per_sample_sq: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Monte-Carlo estimate of sum_t w_t ||.||² over all T steps from uniformly drawn t: T * mean(w_t ||.||²)."""
        return self.num_train_timesteps * (self.path_weights[t] * per_sample_sq).mean()

    def compute_loss(self, parts: list[NoisedBatch]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One forward of the trained model over all parts; return the loss and the micro-batch's (detached) metrics."""
        x = torch.cat([p.x_t for p in parts])
        t = torch.cat([p.t for p in parts])
        conds = cat_conditions([p.cond for p in parts])
        with self.accelerator.autocast():
            eps = self.predict(self.unet, x, t, conds).float()
        preds = dict(zip([p.name for p in parts], eps.split([len(p.t) for p in parts])))
        by_name = {p.name: p for p in parts}
        retain = mse(preds["retain"], by_name["retain"]) if "retain" in preds else torch.zeros((), device=x.device)
        out = self.objective.loss(preds, by_name, retain, self.lambda_)
        metrics = {
            "retain_loss": retain.detach(),
            "constraint_estimate": out.constraint_estimate,
            "forget_loss": out.forget_loss.detach(),
            "loss": out.loss.detach(),
        }
        return out.loss, metrics

    @torch.no_grad()
    def calibrate_level(self, num_draws: int = 4) -> float:
        """What this trainer's constraint estimate reads for the *retained* distributions, under the pretrained model.

        A natural level b: the unlearned condition should be as far from p_u as the retained classes or anchor
        prompts are. Uses the pretrained samples of the retained conditions, each paired with a forget condition:
        the path KL(p_k || p_u) (reverse_kl), E_{p_k}[log p_u - log p_ref] (likelihood), or the denoising loss of
        p_k's samples under the forget condition (forward_kl). Concept unlearning only.
        """
        if self.mode != "concept" or self.retain_pool is None:
            raise ValueError(
                "`calibrate_level` needs concept unlearning with retained conditions; for data unlearning use the "
                "denoising loss of held-out non-members (membership parity)."
            )
        device = self.accelerator.device
        generator = torch.Generator().manual_seed(self.args.seed + 12_345)
        values = []
        for _ in range(num_draws):
            part = self._noised(self.retain_pool, self.retain_pool_conds, generator, "calibration")
            u = self._repeat(self.forget_conds, len(part.t)).to(device)
            eps_u = self.predict(self.ref_unet, part.x_t, part.t, u)
            values.append(self.objective.calibration_value(part, eps_u))
        return float(torch.stack(values).mean())

    def constraint_satisfied(self, value: float) -> bool:
        return self.objective.satisfied(value, self.constraint_level)

    def slack(self, value: float) -> float:
        """How far the constraint holds (positive) or is violated (negative)."""
        return self.objective.slack(value, self.constraint_level)

    def dual_step(self, estimate: float) -> None:
        """Projected dual ascent: λ grows while the constraint is violated, shrinks while it holds with slack."""
        args, objective = self.args, self.objective
        decay = args.constraint_ema
        self.constraint_ema = (
            estimate if self.constraint_ema is None else decay * self.constraint_ema + (1 - decay) * estimate
        )
        better = max if objective.sense == ">=" else min
        self.best_constraint = (
            self.constraint_ema if self.best_constraint is None else better(self.best_constraint, self.constraint_ema)
        )
        if not objective.primal_dual:
            return
        level = self.constraint_level
        violation = level - estimate if objective.sense == ">=" else estimate - level
        self.lambda_ = min(max(self.lambda_ + self.dual_learning_rate * violation, args.lambda_min), args.lambda_max)
        at_bound = self.lambda_ >= args.lambda_max
        if at_bound and not self.constraint_satisfied(self.constraint_ema):
            self.violation_steps += 1
        else:
            self.violation_steps = 0
        if self.violation_steps >= args.stop_patience:
            self.stop_reason = (
                f"constraint level {level:g} of {self.method} is not reachable within lambda <= "
                f"{args.lambda_max:g}: lambda sat at its bound for {self.violation_steps} steps; the best smoothed "
                f"constraint value reached is {self.best_constraint:.4g}. Lower the level or raise lambda_max."
            )
            logger.warning(self.stop_reason)

    def training_step(self) -> dict[str, float]:
        """One primal step (over `gradient_accumulation_steps` micro-batches) and one dual step; return the metrics."""
        accelerator = self.accelerator
        micro_metrics = []
        for micro_step in range(self.args.gradient_accumulation_steps):
            parts = self.sample_batch(micro_step)
            self.compute_targets(parts)
            with accelerator.accumulate(self.unet):
                loss, metrics = self.compute_loss(parts)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    metrics["grad_norm"] = torch.tensor(self.clip_gradients(self.trainable_parameters, self.unet))
                self.optimizer.step()
                self.optimizer.zero_grad()
            micro_metrics.append(metrics)
        names = sorted(micro_metrics[-1])
        mean = {k: torch.stack([m[k].float() for m in micro_metrics if k in m]).mean() for k in names}
        metrics = self.reduce_metrics(mean)
        self.dual_step(metrics["constraint_estimate"])
        logs = {**metrics, "constraint_ema": self.constraint_ema}
        if self.objective.guidance:
            logs["guidance_strength"] = self.guidance_strength()
        if self.objective.primal_dual:
            logs["lambda"] = self.lambda_
            logs["slack"] = self.slack(metrics["constraint_estimate"])
        return logs

    def on_train_begin(self) -> None:
        """Resolve and log the constraint level and dual step size in use (primal-dual methods)."""
        if not self.objective.primal_dual:
            return
        args, level, method = self.args, self.constraint_level, self.method
        how = (
            f"calibrated on the retained conditions x {args.constraint_level_factor:g}"
            if args.constraint_level == "auto"
            else "given"
        )
        logger.info(
            f"{method}: constraint level b = {level:.4g} ({how}), dual learning rate {self.dual_learning_rate:.4g}"
            + (" (auto)" if args.dual_learning_rate == "auto" else "")
        )
        if self.global_step == 0:
            if method in ("reverse_kl", "forward_kl") and level <= 0:
                logger.warning(
                    f"constraint_level {level:g} <= 0: KL({'q || p_u' if method == 'reverse_kl' else 'p_u || q'}) "
                    ">= level always holds, so lambda stays at lambda_init and only the lambda_init target is trained."
                )

    # ------------------------------------------------------------------------------------------------------------
    # State and export
    # ------------------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {
            "lambda": torch.tensor(self.lambda_, dtype=torch.float64),
            "global_step": torch.tensor(self.global_step),
            "violation_steps": torch.tensor(self.violation_steps),
        }
        if self.constraint_ema is not None:
            state["constraint_ema"] = torch.tensor(self.constraint_ema, dtype=torch.float64)
            state["best_constraint"] = torch.tensor(self.best_constraint, dtype=torch.float64)
        if self.forget_pool is not None:
            state["forget_pool"] = self.forget_pool.detach().cpu().contiguous()
            conds = self.forget_pool_conds
            entries = conds.tensors if isinstance(conds, Conditions) else {"": conds}
            for name, value in entries.items():  # prompt conditions: one safetensors entry per tensor
                state["forget_pool_conds" + (f".{name}" if name else "")] = value.detach().cpu().contiguous()
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.lambda_ = float(state["lambda"])
        self.global_step = int(state["global_step"])
        self.violation_steps = int(state["violation_steps"])
        self.constraint_ema = float(state["constraint_ema"]) if "constraint_ema" in state else None
        self.best_constraint = float(state["best_constraint"]) if "best_constraint" in state else None
        if "forget_pool" in state:
            self.forget_pool = state["forget_pool"].to(self.accelerator.device)
            prefix = "forget_pool_conds."
            named = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            self.forget_pool_conds = Conditions(named) if named else state["forget_pool_conds"]

    def unlearned_unet(self, state_dict: dict[str, torch.Tensor] | None = None):
        """The trained denoiser (UNet or transformer), unwrapped; LoRA adapters of a UNet2DModel are merged into a
        plain UNet2DModel.

        `state_dict`: the full weights gathered off sharded processes (`gathered_state_dict`), loaded into a fresh
        UNet, when the prepared UNet holds only a shard (FSDP, DeepSpeed ZeRO-3)."""
        unet = self.accelerator.unwrap_model(self.unet)
        if state_dict is not None:
            plain = type(unet).from_config(unet.config)
            plain.load_state_dict(state_dict)
            return plain.to(self.unet_dtype)
        if self.peft_config is None or self.is_text:
            return unet
        from peft.tuners.tuners_utils import BaseTunerLayer

        merged = copy.deepcopy(unet)
        for module in merged.modules():
            if isinstance(module, BaseTunerLayer):
                module.merge()
        state = {k.replace(".base_layer", ""): v for k, v in merged.state_dict().items() if "lora_" not in k}
        plain = type(unet).from_config(unet.config)
        plain.load_state_dict(state)
        return plain.to(self.unet_dtype)

    def lora_state_dict(self, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The LoRA weights in diffusers' format (for `save_lora_weights`), for a text-conditioned denoiser
        (UNet2DConditionModel, SD3 / Flux transformer) with LoRA; read from `state_dict` (gathered off sharded
        processes) when given."""
        if not self.saves_lora_only:
            raise ValueError("`lora_state_dict` needs a `peft_config` and a text-conditioned denoiser.")
        from diffusers.utils import convert_state_dict_to_diffusers
        from peft.utils import get_peft_model_state_dict

        unet = self.accelerator.unwrap_model(self.unet)
        state = get_peft_model_state_dict(unet, state_dict=state_dict)
        if self.family.component == "transformer":
            # SD3 / Flux load peft's own names (as diffusers' scripts save them); the conversion would rename only the
            # `to_q`-style projections to the UNet-era `lora.down` format, which their loaders then skip
            return state
        return convert_state_dict_to_diffusers(state)

    @property
    def saves_lora_only(self) -> bool:
        """Whether `save_model` writes LoRA weights (LoRA on a text-conditioned denoiser) rather than the pipeline."""
        return self.peft_config is not None and self.is_text

    def unlearned_pipeline(self, state_dict: dict[str, torch.Tensor] | None = None):
        """A shallow copy of the pipeline with the unlearned denoiser (`unlearned_unet(state_dict)`) in place of its
        own."""
        pipeline = copy.copy(self.pipeline)
        pipeline.register_modules(**{self.family.component: self.unlearned_unet(state_dict)})
        return pipeline

    def _save_weights(self, output_dir: str) -> None:
        """The pipeline with the unlearned denoiser (`from_pretrained` / `load_pipeline`), or for LoRA on a
        text-conditioned denoiser the LoRA weights (`pipe.load_lora_weights(output_dir)`)."""
        state = self.gathered_state_dict(self.unet)  # every process (a collective when sharded)
        if not self.accelerator.is_main_process:
            return
        if self.saves_lora_only:
            lora_layers = {self.family.lora_layers_argument: self.lora_state_dict(state)}
            type(self.pipeline).save_lora_weights(output_dir, **lora_layers)
        else:
            self.unlearned_pipeline(state).save_pretrained(output_dir)

    def unlearned_description(self) -> str:
        """What was unlearned, in words (for model cards and logs)."""
        args = self.args
        if args.forget_classes:
            return ("classes " if len(args.forget_classes) > 1 else "class ") + ", ".join(
                map(str, args.forget_classes)
            )
        if args.forget_prompts:
            return "the prompts " + ", ".join(repr(p) for p in args.forget_prompts)
        return f"{len(self.forget_data[0])} training images"

    def _card_title(self, base_model):
        name = os.path.basename(os.path.normpath(base_model)) if base_model else type(self.family.denoiser).__name__
        return f"{name} with {self.unlearned_description()} unlearned"

    def _card_description(self) -> str:
        args = self.args
        method = (
            f"the **{args.baseline}** baseline"
            if args.baseline
            else f"primal-dual constrained unlearning with the constraint {self.objective.constraint_text}, b = "
            f"{self.constraint_level:.4g}"
        )
        lora = ""
        if self.peft_config is not None:
            lora = (
                " of LoRA (load with `pipe.load_lora_weights(folder)`)"
                if self.is_text
                else " of LoRA, merged into the UNet"
            )
        stop = f"\n\nTraining stopped early: {self.stop_reason}" if self.stop_reason else ""
        return (
            f"This model is the pretrained one after unlearning **{self.unlearned_description()}** with "
            f"`{type(self).__name__}` (diffusers-ext): {method}; {self.global_step} steps{lora}. Seed {args.seed}."
            + stop
        )

    def _card_metrics(self) -> dict:
        metrics = {"steps": self.global_step, "final lambda": self.lambda_}
        if self.constraint_ema is not None:
            metrics["final constraint estimate (smoothed)"] = self.constraint_ema
            if self.objective.primal_dual:
                metrics["constraint level"] = self.constraint_level
                metrics["dual learning rate"] = self.dual_learning_rate
                metrics["final slack (smoothed)"] = self.slack(self.constraint_ema)
        return metrics

    def _card_tags(self) -> list[str]:
        return ["unlearning", self.method]
