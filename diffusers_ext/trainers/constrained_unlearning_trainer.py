"""Constrained unlearning of diffusion models by primal-dual training, and its baselines (ESD, SISS, NegGrad+)."""

import copy
import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from diffusers.utils import logging

from ..training_utils import step_generator
from ..utils import public
from .constrained_unlearning_config import ConstrainedUnlearningConfig


logger = logging.get_logger(__name__)

STATE_FILE = "unlearning_state.safetensors"
CONCEPT_ONLY = ("reverse_kl", "likelihood", "esd")
DATA_ONLY = ("siss", "neggrad_plus")


def _as_tensors(dataset, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(images, labels)` from a tuple of tensors, a single image tensor or a `TensorDataset`."""
    if dataset is None:
        return None
    if isinstance(dataset, torch.utils.data.TensorDataset):
        dataset = dataset.tensors
    if isinstance(dataset, torch.Tensor):
        dataset = (dataset, None)
    if not isinstance(dataset, (tuple, list)) or len(dataset) not in (1, 2):
        raise TypeError(
            f"`{name}` must be an image tensor, an `(images, labels)` tuple or a TensorDataset; got "
            f"{type(dataset).__name__}."
        )
    images, labels = dataset[0], (dataset[1] if len(dataset) == 2 else None)
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(
            f"`{name}` images must be a tensor of shape (N, C, H, W), got {getattr(images, 'shape', images)}."
        )
    if images.shape[0] == 0:
        raise ValueError(f"`{name}` is empty: it holds no examples.")
    if labels is not None and (labels.ndim != 1 or labels.shape[0] != images.shape[0]):
        raise ValueError(f"`{name}` labels must have shape ({images.shape[0]},), got {tuple(labels.shape)}.")
    return images, (labels.long() if labels is not None else None)


@public
class ConstrainedUnlearningTrainer:
    r"""
    Unlearn a concept or a set of training examples from a diffusers UNet by primal-dual training.

    The unlearned model q minimises its deviation from the pretrained model subject to a separation constraint from
    the distribution p_u to forget; lambda is the dual variable of that constraint:

    - `reverse_kl`: min KL(q || p_ref) s.t. KL(q || p_u) >= b. Optimum q ∝ p_ref^{1/(1-λ)} p_u^{-λ/(1-λ)}, i.e. the
      noise-prediction target `eps_ref + λ/(1-λ) (eps_ref - eps_u)` (ESD's target with a learned strength).
    - `likelihood`: min KL(q || p_ref) s.t. E_q[log p_u - log p_ref] <= b. Optimum q ∝ p_ref^{1+λ} p_u^{-λ}, target
      `eps_ref + λ (eps_ref - eps_u)`.
    - `forward_kl`: min KL(p_pre || q) s.t. KL(p_u || q) >= b. Optimum the subtracted mixture
      (p_pre - λ p_u) / (1 - λ), trained by the denoising loss `[E_pre l - λ E_u l] / (1 - λ)`.

    Each step draws the batch (`sample_batch`), computes the targets with the frozen pretrained copy
    (`compute_targets`), takes a primal step on the loss (`compute_loss`) and a projected dual-ascent step on
    lambda from the Monte-Carlo constraint estimate (`dual_step`). `config.baseline` trains ESD, SISS, NegGrad+ or
    a retain-only fine-tune instead, through the same steps with a fixed strength.

    Args:
        config ([`ConstrainedUnlearningConfig`]): what to forget, the constraint and the optimisation settings.
        unet ([`UNet2DModel`] or [`UNet2DConditionModel`]): the pretrained denoiser (epsilon prediction). It is
            trained in place (all weights, or LoRA adapters with `config.use_lora`).
        noise_scheduler: a DDPM/DDIM-family diffusers scheduler (with `alphas_cumprod`) giving the noise schedule.
        accelerator (`accelerate.Accelerator`, *optional*): created when omitted.
        text_encoder, tokenizer (*optional*): encode `forget_prompts`, `retain_prompts` and `reference_prompt` for a
            `UNet2DConditionModel`.
        null_class_label (`int`, *optional*): the null class of a class-conditional UNet (the default reference).
        forget_dataset (*optional*): training examples to forget, `(images, labels)` (data unlearning).
        retain_dataset (*optional*): the remaining training examples, `(images, labels)`.
    """

    def __init__(
        self,
        config: ConstrainedUnlearningConfig,
        unet,
        noise_scheduler,
        accelerator=None,
        text_encoder=None,
        tokenizer=None,
        null_class_label: int | None = None,
        forget_dataset=None,
        retain_dataset=None,
    ):
        from diffusers import UNet2DConditionModel, UNet2DModel

        if not isinstance(config, ConstrainedUnlearningConfig):
            raise TypeError(f"`config` must be a ConstrainedUnlearningConfig, got {type(config).__name__}.")
        if not isinstance(unet, (UNet2DModel, UNet2DConditionModel)):
            raise TypeError(f"`unet` must be a UNet2DModel or UNet2DConditionModel, got {type(unet).__name__}.")
        if not hasattr(noise_scheduler, "alphas_cumprod") or not hasattr(noise_scheduler, "add_noise"):
            raise TypeError(
                f"`noise_scheduler` must be a DDPM/DDIM-family scheduler with `alphas_cumprod` and `add_noise`, got "
                f"{type(noise_scheduler).__name__}."
            )
        prediction_type = noise_scheduler.config.get("prediction_type", "epsilon")
        if prediction_type != "epsilon":
            raise ValueError(
                f"`noise_scheduler` has prediction_type {prediction_type!r}; the unlearning targets are defined for "
                "'epsilon' prediction."
            )
        self.config = config
        self.is_text = isinstance(unet, UNet2DConditionModel)
        self.method = config.method
        self.forget_data = _as_tensors(forget_dataset, "forget_dataset")
        self.retain_data = _as_tensors(retain_dataset, "retain_dataset")
        self.mode = "data" if self.forget_data is not None else "concept"
        self._check_method()
        if accelerator is None:
            from accelerate import Accelerator

            accelerator = Accelerator()
        self.accelerator = accelerator
        self.noise_scheduler = noise_scheduler
        self.num_train_timesteps = int(noise_scheduler.config.num_train_timesteps)
        alphas_cumprod = noise_scheduler.alphas_cumprod.to(torch.float64)
        betas = 1.0 - alphas_cumprod / torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
        # Girsanov / ELBO weight of ||Δeps||² per step in continuous-time form beta_t / (2 (1 - alpha_bar_t)). The
        # exact discrete weight has an extra 1/alpha_t that explodes at the capped last step of cosine schedules.
        self.elbo_weights = (betas / (2.0 * (1.0 - alphas_cumprod))).float()

        # Conditions are validated and encoded before any weights are copied or trained.
        self._build_conditions(unet, text_encoder, tokenizer, null_class_label)

        self.ref_unet = copy.deepcopy(unet).requires_grad_(False).eval()
        unet.train()
        if config.use_lora:
            self._add_lora(unet)
        else:
            unet.requires_grad_(True)
        params = [p for p in unet.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.adam_weight_decay,
            eps=config.adam_epsilon,
        )
        self.unet, self.optimizer = accelerator.prepare(unet, self.optimizer)
        self.ref_unet.to(accelerator.device)
        self.elbo_weights = self.elbo_weights.to(accelerator.device)

        self.lambda_ = float(config.lambda_init)
        self.constraint_ema: float | None = None
        self.best_constraint: float | None = None
        self.violation_steps = 0
        self.global_step = 0
        self.stop_reason: str | None = None
        self.history: list[dict[str, float]] = []
        self.forget_pool: torch.Tensor | None = None
        self.forget_pool_conds: torch.Tensor | None = None
        self._fixed_pools()
        accelerator.register_save_state_pre_hook(self._save_state_hook)
        accelerator.register_load_state_pre_hook(self._load_state_hook)

    # ------------------------------------------------------------------------------------------------------------
    # Validation and conditions
    # ------------------------------------------------------------------------------------------------------------

    def _check_method(self):
        config, method = self.config, self.method
        if self.mode == "data":
            if method in CONCEPT_ONLY:
                raise ValueError(
                    f"method {method!r} unlearns a concept (it needs the forget condition's own prediction eps_u); "
                    "for a `forget_dataset` use constraint='forward_kl' or baseline 'siss', 'neggrad_plus' or "
                    "'retain_only'."
                )
            if self.retain_data is None:
                raise ValueError("data unlearning needs a `retain_dataset` (the training examples to keep).")
            if config.forget_classes is not None or config.forget_prompts is not None:
                raise ValueError("give either a `forget_dataset` or `forget_classes`/`forget_prompts`, not both.")
        else:
            if config.forget_classes is None and config.forget_prompts is None:
                raise ValueError(
                    "nothing to forget: set `forget_classes` or `forget_prompts` in the config, or pass a non-empty "
                    "`forget_dataset`."
                )
            if method in DATA_ONLY:
                raise ValueError(f"baseline {method!r} unlearns training data; pass a `forget_dataset`.")

    def _build_conditions(self, unet, text_encoder, tokenizer, null_class_label):
        config = self.config
        self.sample_shape = (unet.config.in_channels, *self._size(unet))
        if self.is_text:
            if config.forget_classes is not None:
                raise ValueError("`forget_classes` needs a class-conditional UNet2DModel; use `forget_prompts`.")
            if self.mode == "data":
                raise ValueError("data unlearning is supported for UNet2DModel (class-conditional or not).")
            if text_encoder is None or tokenizer is None:
                raise ValueError("a UNet2DConditionModel needs `text_encoder` and `tokenizer` to encode the prompts.")
            self.forget_conds = self._encode(config.forget_prompts, text_encoder, tokenizer, "forget_prompts")
            retain = config.retain_prompts or []
            self.retain_conds = self._encode(retain, text_encoder, tokenizer, "retain_prompts") if retain else None
            self.reference_cond = self._encode([config.reference_prompt], text_encoder, tokenizer, "reference_prompt")
            return
        if config.forget_prompts is not None or config.retain_prompts:
            raise ValueError("prompts need a UNet2DConditionModel; this UNet2DModel is conditioned on class labels.")
        num_classes = unet.config.num_class_embeds
        if self.mode == "data":
            self.forget_conds = self.retain_conds = self.reference_cond = None
            if num_classes is None:  # an unconditional UNet: labels, if any, play no part
                self.forget_data, self.retain_data = (self.forget_data[0], None), (self.retain_data[0], None)
            labels = [d[1] for d in (self.forget_data, self.retain_data) if d[1] is not None]
            if num_classes is not None and len(labels) < 2:
                raise ValueError("the UNet is class-conditional: `forget_dataset` and `retain_dataset` need labels.")
            for name, data in (("forget_dataset", self.forget_data), ("retain_dataset", self.retain_data)):
                if tuple(data[0].shape[1:]) != self.sample_shape:
                    raise ValueError(
                        f"`{name}` images have shape {tuple(data[0].shape[1:])}; the UNet expects {self.sample_shape}."
                    )
                if num_classes is not None:
                    self._check_labels(data[1].tolist(), num_classes, null_class_label, f"{name} labels")
            return
        if num_classes is None:
            raise ValueError("`forget_classes` needs a class-conditional UNet2DModel (`num_class_embeds` is None).")
        self._check_labels(config.forget_classes, num_classes, null_class_label, "forget_classes")
        reference = config.reference_class if config.reference_class is not None else null_class_label
        if reference is None:
            raise ValueError("no reference: set `reference_class`, or pass the pipeline's `null_class_label`.")
        if reference in config.forget_classes:
            raise ValueError(f"`reference_class` {reference} is also a forget class.")
        if not 0 <= reference < num_classes:
            raise ValueError(f"`reference_class` {reference} is not a class of this UNet (0..{num_classes - 1}).")
        retain = config.retain_classes
        if retain is None:
            retain = [c for c in range(num_classes) if c not in config.forget_classes and c != null_class_label]
        else:
            self._check_labels(retain, num_classes, null_class_label, "retain_classes")
        self.forget_conds = torch.tensor(config.forget_classes, dtype=torch.long)
        self.retain_conds = torch.tensor(retain, dtype=torch.long) if retain else None
        self.reference_cond = torch.tensor([reference], dtype=torch.long)

    @staticmethod
    def _check_labels(labels: Sequence[int], num_classes: int, null_label: int | None, name: str):
        unknown = sorted({int(c) for c in labels if not 0 <= int(c) < num_classes or int(c) == null_label})
        if unknown:
            known = f"0..{num_classes - 1}" + (
                f" except the null class {null_label}" if null_label is not None else ""
            )
            raise ValueError(f"`{name}` holds classes the model does not know: {unknown}; known classes are {known}.")

    @staticmethod
    def _size(unet) -> tuple[int, int]:
        size = unet.config.sample_size
        return (size, size) if isinstance(size, int) else tuple(size)

    @staticmethod
    @torch.no_grad()
    def _encode(prompts: list[str], text_encoder, tokenizer, name: str) -> torch.Tensor:
        inputs = tokenizer(
            list(prompts), padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
            return_tensors="pt",
        )  # fmt: skip
        unk = getattr(tokenizer, "unk_token_id", None)
        if unk is not None and name != "reference_prompt":
            for prompt in prompts:  # without padding and special tokens, which may share the unknown token's id
                if unk in tokenizer(prompt, add_special_tokens=False).input_ids:
                    raise ValueError(
                        f"`{name}` prompt {prompt!r} holds tokens the tokenizer does not know (mapped to "
                        f"{tokenizer.unk_token!r}); the model cannot know that concept."
                    )
        device = next(text_encoder.parameters()).device
        return text_encoder(inputs.input_ids.to(device))[0].detach().float().cpu()

    def _add_lora(self, unet):
        from peft import LoraConfig

        config = self.config
        targets = config.lora_target_modules
        if targets is None:
            targets = ["to_q", "to_k", "to_v", "to_out.0"]
            if not self.is_text:
                targets = ["conv1", "conv2", "time_emb_proj", *targets]
        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha or config.lora_rank,
            init_lora_weights="gaussian",
            target_modules=targets,
        )
        unet.requires_grad_(False)
        if self.is_text:
            unet.add_adapter(lora)
        else:
            from peft import inject_adapter_in_model

            inject_adapter_in_model(lora, unet)
        for name, param in unet.named_parameters():
            param.requires_grad_("lora_" in name)
        if not any(p.requires_grad for p in unet.parameters()):
            raise ValueError(f"`lora_target_modules` {targets} matched no module of the UNet.")

    # ------------------------------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------------------------------

    def _eps(self, unet, x, t, cond):
        if self.is_text:
            return unet(x, t, encoder_hidden_states=cond).sample
        if cond is None:
            return unet(x, t).sample
        return unet(x, t, class_labels=cond).sample

    @torch.no_grad()
    def sample(self, unet, conds: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Draw one sample per condition in `conds` with a DDIM sampler (eta 0) of `config.pool_sampling_steps`."""
        from diffusers import DDIMScheduler

        device = self.accelerator.device
        scheduler = DDIMScheduler.from_config(self.noise_scheduler.config, clip_sample=False)
        scheduler.set_timesteps(self.config.pool_sampling_steps, device=device)
        x = torch.randn((len(conds), *self.sample_shape), generator=generator).to(device)
        conds = conds.to(device)
        was_training = unet.training
        unet.eval()
        for t in scheduler.timesteps:
            x = scheduler.step(self._eps(unet, x, t, conds), t, x).prev_sample
        unet.train(was_training)
        return x

    def _pool_generator(self, tag: int, step: int) -> torch.Generator:
        # Identical on every process (pools are shared), so a checkpoint of the main process restores them all.
        return torch.Generator().manual_seed((self.config.seed * 7_919 + tag) * 1_000_003 + step)

    def _repeat(self, conds: torch.Tensor, n: int) -> torch.Tensor:
        return conds[torch.arange(n) % len(conds)]

    def _fixed_pools(self):
        """Samples of the pretrained model at the retained, forget and reference conditions (concept unlearning)."""
        self.retain_pool = self.retain_pool_conds = None
        self.ref_pool = self.u_pool = None
        if self.mode != "concept":
            return
        n = self.config.pool_size
        if self.retain_conds is not None:
            self.retain_pool_conds = self._repeat(self.retain_conds, n)
            self.retain_pool = self.sample(self.ref_unet, self.retain_pool_conds, self._pool_generator(1, 0))
        if self.method == "forward_kl":
            self.ref_pool = self.sample(
                self.ref_unet, self._repeat(self.reference_cond, n), self._pool_generator(2, 0)
            )
            self.u_pool = self.sample(self.ref_unet, self._repeat(self.forget_conds, n), self._pool_generator(3, 0))

    def refresh_forget_pool(self):
        """Redraw the on-policy pool: samples of the model being trained at the forget conditions."""
        conds = self._repeat(self.forget_conds, self.config.pool_size)
        unet = self.accelerator.unwrap_model(self.unet)
        self.forget_pool = self.sample(unet, conds, self._pool_generator(4, self.global_step))
        self.forget_pool_conds = conds

    # ------------------------------------------------------------------------------------------------------------
    # One step: batch, targets, loss, dual update
    # ------------------------------------------------------------------------------------------------------------

    def _noised(self, x0, conds, generator, name: str) -> dict:
        device = self.accelerator.device
        noise = torch.randn(x0.shape, generator=generator).to(device)
        t = torch.randint(0, self.num_train_timesteps, (x0.shape[0],), generator=generator).to(device)
        x0 = x0.to(device)
        return {
            "name": name,
            "x0": x0,
            "noise": noise,
            "t": t,
            "x_t": self.noise_scheduler.add_noise(x0, noise, t),
            "cond": conds.to(device) if conds is not None else None,
        }

    def _pick(self, pool: torch.Tensor, conds: torch.Tensor | None, generator: torch.Generator):
        index = torch.randint(0, pool.shape[0], (self.config.train_batch_size,), generator=generator)
        return pool[index.to(pool.device)], (conds[index.to(conds.device)] if conds is not None else None)

    def sample_batch(self) -> list[dict]:
        """The noised inputs of this step (each part one forward of the trained UNet), from pools or datasets."""
        generator = step_generator(self.config.seed, self.global_step, self.accelerator.process_index)
        method, parts = self.method, []
        if self.mode == "data":
            if method == "siss":
                parts.append(self._siss_part(generator))
                return parts  # SISS's importance-weighted loss already holds the keep term
            if method != "retain_only":
                parts.append(self._noised(*self._pick(*self.forget_data, generator), generator, "forget"))
            parts.append(self._noised(*self._pick(*self.retain_data, generator), generator, "retain"))
            return parts
        if method == "forward_kl":
            n = self.config.train_batch_size
            u_conds = self._repeat(self.forget_conds, self.u_pool.shape[0])
            x_ref, _ = self._pick(self.ref_pool, None, generator)
            x_u, c_u = self._pick(self.u_pool, u_conds, generator)
            # p_ref's samples are denoised under the forget condition: q(.|c_u) learns (p_ref - λ p_u) / (1 - λ).
            parts.append(self._noised(x_ref, self._repeat(self.forget_conds, n), generator, "forget_ref"))
            parts.append(self._noised(x_u, c_u, generator, "forget"))
        elif method != "retain_only":
            if self.forget_pool is None or self.global_step % self.config.pool_refresh_steps == 0:
                self.refresh_forget_pool()
            parts.append(self._noised(*self._pick(self.forget_pool, self.forget_pool_conds, generator), generator,
                                      "forget"))  # fmt: skip
        if self.retain_pool is not None and (self.config.retain_weight > 0 or method == "retain_only"):
            parts.append(self._noised(*self._pick(self.retain_pool, self.retain_pool_conds, generator), generator,
                                      "retain"))  # fmt: skip
        return parts

    def _siss_part(self, generator) -> dict:
        """SISS: m_t from the defensive mixture (1 - s) q(.|x) + s q(.|a) of a data point x and a forget point a."""
        device = self.accelerator.device
        a, a_labels = self._pick(*self.forget_data, generator)
        all_images = torch.cat([self.retain_data[0], self.forget_data[0]])
        all_labels = None
        if self.retain_data[1] is not None:
            all_labels = torch.cat([self.retain_data[1], self.forget_data[1]])
        if all_labels is None:
            x = all_images[torch.randint(0, len(all_images), (len(a),), generator=generator)]
        else:  # x shares a's class, so both terms are denoised under the same condition
            order = torch.argsort(all_labels, stable=True)
            counts = torch.bincount(all_labels, minlength=int(all_labels.max()) + 1)
            starts = torch.cumsum(counts, 0) - counts
            offsets = (torch.rand(len(a), generator=generator) * counts[a_labels]).long()
            x = all_images[order[starts[a_labels] + offsets]]
        noise = torch.randn(a.shape, generator=generator).to(device)
        t = torch.randint(0, self.num_train_timesteps, (len(a),), generator=generator).to(device)
        from_a = (torch.rand(len(a), generator=generator) < self.config.siss_mixture_weight).to(device)
        a, x = a.to(device), x.to(device)
        m = self.noise_scheduler.add_noise(torch.where(from_a[:, None, None, None], a, x), noise, t)
        return {"name": "siss", "x_t": m, "t": t, "cond": a_labels.to(device) if a_labels is not None else None,
                "x": x, "a": a}  # fmt: skip

    @torch.no_grad()
    def compute_targets(self, parts: list[dict]) -> None:
        """Add each part's regression target (and the pretrained predictions the constraint estimates need)."""
        config = self.config
        for part in parts:
            name = part["name"]
            if name == "retain":
                if self.mode == "data":
                    part["target"] = part["noise"]
                else:
                    part["target"] = self._eps(self.ref_unet, part["x_t"], part["t"], part["cond"])
            elif name in ("forget_ref",) or (name == "forget" and self.method in ("forward_kl", "neggrad_plus")):
                part["target"] = part["noise"]
            elif name == "forget":  # reverse_kl, likelihood, esd: guidance-style targets at the forget condition
                ref = self._repeat(self.reference_cond, len(part["t"])).to(part["t"].device)
                eps_ref = self._eps(self.ref_unet, part["x_t"], part["t"], ref)
                eps_u = self._eps(self.ref_unet, part["x_t"], part["t"], part["cond"])
                part["eps_ref"], part["eps_u"] = eps_ref, eps_u
                part["target"] = eps_ref + self.guidance_strength() * (eps_ref - eps_u)
            elif name == "siss":
                alpha_bar = self.noise_scheduler.alphas_cumprod.to(part["t"].device)[part["t"]].view(-1, 1, 1, 1)
                gamma, sigma = alpha_bar.sqrt(), (1 - alpha_bar).sqrt()
                part["target_x"] = (part["x_t"] - gamma * part["x"]) / sigma
                part["target_a"] = (part["x_t"] - gamma * part["a"]) / sigma
                # log q(m|a) - log q(m|x)
                log_ratio = ((part["target_x"] ** 2).flatten(1).sum(1) - (part["target_a"] ** 2).flatten(1).sum(1)) / 2
                s = config.siss_mixture_weight
                part["weight_x"] = torch.exp(-torch.logaddexp(torch.full_like(log_ratio, math.log(1 - s)),
                                                              math.log(s) + log_ratio))  # fmt: skip
                part["weight_a"] = torch.exp(-torch.logaddexp(math.log(1 - s) - log_ratio,
                                                              torch.full_like(log_ratio, math.log(s))))  # fmt: skip

    def guidance_strength(self) -> float:
        """eta of the target eps_ref + eta (eps_ref - eps_u): λ/(1-λ) (reverse KL), λ (likelihood), ESD's fixed eta."""
        if self.method == "esd":
            return self.config.esd_negative_guidance
        if self.method == "reverse_kl":
            return self.lambda_ / (1.0 - self.lambda_)
        return self.lambda_

    def _path_sum(self, per_sample_sq: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Monte-Carlo estimate of sum_t w_t ||.||² over all T steps from uniformly drawn t: T * mean(w_t ||.||²)."""
        return self.num_train_timesteps * (self.elbo_weights[t] * per_sample_sq).mean()

    def compute_loss(self, parts: list[dict]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One forward of the trained UNet over all parts; return the loss and the step's (detached) metrics."""
        config, method = self.config, self.method
        x = torch.cat([p["x_t"] for p in parts])
        t = torch.cat([p["t"] for p in parts])
        conds = None if parts[0]["cond"] is None else torch.cat([p["cond"] for p in parts])
        with self.accelerator.autocast():
            eps = self._eps(self.unet, x, t, conds).float()
        preds = dict(zip([p["name"] for p in parts], eps.split([len(p["t"]) for p in parts])))
        by_name = {p["name"]: p for p in parts}

        def mse(name, target_key="target"):
            return F.mse_loss(preds[name], by_name[name][target_key].float())

        metrics: dict[str, torch.Tensor] = {}
        retain = mse("retain") if "retain" in preds else torch.zeros((), device=x.device)
        metrics["retain_loss"] = retain.detach()
        lam = self.lambda_
        if self.mode == "data":
            n_forget, n_retain = len(self.forget_data[0]), len(self.retain_data[0])
            n = n_forget + n_retain
            if method == "siss":
                p = by_name["siss"]
                sq_x = ((preds["siss"] - p["target_x"]) ** 2).flatten(1).mean(1)
                sq_a = ((preds["siss"] - p["target_a"]) ** 2).flatten(1).mean(1)
                keep = (p["weight_x"] * sq_x).mean() * n / n_retain
                neg = (p["weight_a"] * sq_a).mean() * n_forget / n_retain
                forget = -neg
                loss = keep - neg
                metrics["constraint_estimate"] = (p["weight_a"] * sq_a).mean().detach()
            else:
                forget_mse = mse("forget") if "forget" in preds else torch.zeros((), device=x.device)
                metrics["constraint_estimate"] = forget_mse.detach()
                if method == "forward_kl":
                    # [E_all l - λ E_u l] / (1 - λ) with E_all = (n-k)/n E_keep + k/n E_u
                    forget = (n_forget / n - lam) * forget_mse / (1 - lam)
                    loss = forget + config.retain_weight * (n_retain / n) * retain / (1 - lam)
                elif method == "neggrad_plus":
                    forget = -config.neggrad_weight * forget_mse
                    loss = forget + config.retain_weight * retain
                else:  # retain_only
                    forget = torch.zeros((), device=x.device)
                    loss = config.retain_weight * retain
        elif method == "forward_kl":
            forget_mse = mse("forget")
            forget = (mse("forget_ref") - lam * forget_mse) / (1 - lam)
            loss = forget + config.retain_weight * retain
            metrics["constraint_estimate"] = forget_mse.detach()
        elif method == "retain_only":
            forget = torch.zeros((), device=x.device)
            loss = retain
            metrics["constraint_estimate"] = torch.zeros((), device=x.device)
        else:
            forget = mse("forget")
            loss = forget + config.retain_weight * retain
            p = by_name["forget"]
            with torch.no_grad():
                if method == "likelihood":
                    # ELBO difference log p_u - log p_ref on q's samples: sum_t w_t (||eps_ref - eps||² - ||eps_u - eps||²)
                    diff = ((p["eps_ref"] - p["noise"]) ** 2).flatten(1).sum(1)
                    diff = diff - ((p["eps_u"] - p["noise"]) ** 2).flatten(1).sum(1)
                else:  # path KL(q || p_u) on q's own samples: sum_t w_t ||eps_theta - eps_u||²
                    diff = ((preds["forget"].detach() - p["eps_u"]) ** 2).flatten(1).sum(1)
                metrics["constraint_estimate"] = self._path_sum(diff, p["t"])
        metrics["forget_loss"] = forget.detach()
        metrics["loss"] = loss.detach()
        return loss, metrics

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
        generator = torch.Generator().manual_seed(self.config.seed + 12_345)
        values = []
        for _ in range(num_draws):
            part = self._noised(self.retain_pool, self.retain_pool_conds, generator, "calibration")
            u = self._repeat(self.forget_conds, len(part["t"])).to(device)
            eps_u = self._eps(self.ref_unet, part["x_t"], part["t"], u)
            if self.method == "forward_kl":
                values.append(F.mse_loss(eps_u, part["noise"]))
                continue
            if self.method == "likelihood":
                ref = self._repeat(self.reference_cond, len(part["t"])).to(device)
                eps_ref = self._eps(self.ref_unet, part["x_t"], part["t"], ref)
                diff = ((eps_ref - part["noise"]) ** 2).flatten(1).sum(1) - ((eps_u - part["noise"]) ** 2).flatten(
                    1
                ).sum(1)
            else:
                eps_k = self._eps(self.ref_unet, part["x_t"], part["t"], part["cond"])
                diff = ((eps_k - eps_u) ** 2).flatten(1).sum(1)
            values.append(self._path_sum(diff, part["t"]))
        return float(torch.stack(values).mean())

    def constraint_satisfied(self, value: float) -> bool:
        if self.method == "likelihood":
            return value <= self.config.constraint_level
        return value >= self.config.constraint_level

    def dual_step(self, estimate: float) -> None:
        """Projected dual ascent: λ grows while the constraint is violated, shrinks while it holds with slack."""
        config = self.config
        decay = config.constraint_ema
        self.constraint_ema = (
            estimate if self.constraint_ema is None else decay * self.constraint_ema + (1 - decay) * estimate
        )
        better = max if self.method != "likelihood" else min
        self.best_constraint = (
            self.constraint_ema if self.best_constraint is None else better(self.best_constraint, self.constraint_ema)
        )
        if config.baseline is not None:
            return
        violation = (
            config.constraint_level - estimate if self.method != "likelihood" else estimate - config.constraint_level
        )
        self.lambda_ = min(
            max(self.lambda_ + config.dual_learning_rate * violation, config.lambda_min), config.lambda_max
        )
        at_bound = self.lambda_ >= config.lambda_max
        if at_bound and not self.constraint_satisfied(self.constraint_ema):
            self.violation_steps += 1
        else:
            self.violation_steps = 0
        if self.violation_steps >= config.stop_patience:
            self.stop_reason = (
                f"constraint level {config.constraint_level:g} of {self.method} is not reachable within lambda <= "
                f"{config.lambda_max:g}: lambda sat at its bound for {self.violation_steps} steps; the best smoothed "
                f"constraint value reached is {self.best_constraint:.4g}. Lower the level or raise lambda_max."
            )
            logger.warning(self.stop_reason)

    def slack(self, value: float) -> float:
        """How far the constraint holds (positive) or is violated (negative)."""
        level = self.config.constraint_level
        return level - value if self.method == "likelihood" else value - level

    def step(self) -> dict[str, float]:
        """One primal step and one dual step; return the logged metrics."""
        accelerator = self.accelerator
        parts = self.sample_batch()
        self.compute_targets(parts)
        with accelerator.accumulate(self.unet):
            loss, metrics = self.compute_loss(parts)
            accelerator.backward(loss)
            if accelerator.sync_gradients and self.config.max_grad_norm > 0:
                accelerator.clip_grad_norm_([p for p in self.unet.parameters() if p.requires_grad],
                                            self.config.max_grad_norm)  # fmt: skip
            self.optimizer.step()
            self.optimizer.zero_grad()
        values = torch.stack([metrics[k].float() for k in sorted(metrics)])
        values = accelerator.reduce(values, reduction="mean")
        metrics = {k: float(v) for k, v in zip(sorted(metrics), values.tolist())}
        self.dual_step(metrics["constraint_estimate"])
        self.global_step += 1
        logs = {**metrics, "constraint_ema": self.constraint_ema}
        if self.method in CONCEPT_ONLY:
            logs["guidance_strength"] = self.guidance_strength()
        if self.config.baseline is None:
            logs["lambda"] = self.lambda_
            logs["slack"] = self.slack(metrics["constraint_estimate"])
        self.history.append({"step": self.global_step, **logs})
        if self.global_step % self.config.logging_steps == 0:
            accelerator.log(logs, step=self.global_step)
        return logs

    def train(self, max_steps: int | None = None) -> dict[str, float]:
        """Run steps until `max_steps` (default `config.max_steps`) or an unreachable level stops training."""
        max_steps = self.config.max_steps if max_steps is None else max_steps
        if self.global_step == 0 and self.config.baseline is None:
            level, method = self.config.constraint_level, self.method
            if method in ("reverse_kl", "forward_kl") and level <= 0:
                logger.warning(
                    f"constraint_level {level:g} <= 0: KL({'q || p_u' if method == 'reverse_kl' else 'p_u || q'}) "
                    ">= level always holds, so lambda stays at lambda_init and only the lambda_init target is trained."
                )
        logs = {}
        while self.global_step < max_steps and self.stop_reason is None:
            logs = self.step()
        return logs

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
            state["forget_pool_conds"] = self.forget_pool_conds.detach().cpu().contiguous()
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.lambda_ = float(state["lambda"])
        self.global_step = int(state["global_step"])
        self.violation_steps = int(state["violation_steps"])
        self.constraint_ema = float(state["constraint_ema"]) if "constraint_ema" in state else None
        self.best_constraint = float(state["best_constraint"]) if "best_constraint" in state else None
        if "forget_pool" in state:
            self.forget_pool = state["forget_pool"].to(self.accelerator.device)
            self.forget_pool_conds = state["forget_pool_conds"]

    def _save_state_hook(self, models, weights, output_dir):
        from safetensors.torch import save_file

        if self.accelerator.is_main_process:
            os.makedirs(output_dir, exist_ok=True)
            save_file(self.state_dict(), os.path.join(output_dir, STATE_FILE))

    def _load_state_hook(self, models, input_dir):
        from safetensors.torch import load_file

        path = os.path.join(input_dir, STATE_FILE)
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {input_dir!r} has no {STATE_FILE}; it was not saved by this trainer.")
        self.load_state_dict(load_file(path))

    def unlearned_unet(self):
        """The trained UNet, unwrapped; LoRA adapters of a UNet2DModel are merged into a plain UNet2DModel."""
        unet = self.accelerator.unwrap_model(self.unet)
        if not self.config.use_lora or self.is_text:
            return unet
        from peft.tuners.tuners_utils import BaseTunerLayer

        merged = copy.deepcopy(unet)
        for module in merged.modules():
            if isinstance(module, BaseTunerLayer):
                module.merge()
        state = {k.replace(".base_layer", ""): v for k, v in merged.state_dict().items() if "lora_" not in k}
        plain = type(unet).from_config(unet.config)
        plain.load_state_dict(state)
        return plain

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA weights in diffusers' format (for `save_lora_weights`), for a UNet2DConditionModel with LoRA."""
        if not (self.config.use_lora and self.is_text):
            raise ValueError("`lora_state_dict` needs `use_lora=True` and a UNet2DConditionModel.")
        from diffusers.utils import convert_state_dict_to_diffusers
        from peft.utils import get_peft_model_state_dict

        return convert_state_dict_to_diffusers(get_peft_model_state_dict(self.accelerator.unwrap_model(self.unet)))
