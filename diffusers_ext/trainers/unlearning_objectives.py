r"""
The unlearning methods of [`ConstrainedUnlearningTrainer`], one small class each.

An objective says what a step draws for the forgetting side (`forget_parts`), the regression targets of those draws
(`add_targets`), the loss and the Monte-Carlo constraint estimate (`loss`), how the constraint is read on the
retained conditions (`calibration_value`), and how the dual variable relates to it (`sense`, `primal_dual`,
`guidance_strength`). The trainer owns everything shared: conditions, sample pools, the retain term, the single
forward pass, the dual update, checkpoints. Notation as in `docs/unlearning.md`: eps_ref / eps_u are the frozen
pretrained model's predictions at the reference and forget conditions, λ the dual variable.
"""

import abc
import math

import torch
import torch.nn.functional as F

from ..utils import public


@public
class UnlearningObjective(abc.ABC):
    r"""
    Base class of an unlearning method. Subclasses set the class attributes and override what differs.

    Attributes:
        name (`str`): the config's `constraint` or `baseline` value that selects it.
        modes (`tuple[str]`): `"concept"` (forget classes or prompts) and/or `"data"` (forget training examples).
        primal_dual (`bool`): whether λ is learned (False for fixed-strength baselines).
        sense (`str`): `">="` when the constraint asks C >= b (the KL constraints), `"<="` when C <= b.
        guidance (`bool`): the forget target is `eps_ref + eta (eps_ref - eps_u)`; `guidance_strength` gives eta.
        constraint_text (`str`): the constraint in words (model cards), for primal-dual objectives.
    """

    name = ""
    constraint_text = ""
    modes: tuple[str, ...] = ("concept",)
    primal_dual = True
    sense = ">="
    guidance = False

    def __init__(self, trainer):
        self.trainer = trainer

    @property
    def args(self):
        return self.trainer.args

    def setup(self) -> None:
        """Draw any fixed sample pool the objective needs (once, from the frozen pretrained copy)."""
        return None  # an optional hook: nothing to do by default

    def begin_step(self) -> None:
        """Called once per training step before its micro-batches are drawn."""
        return None  # an optional hook: nothing to do by default

    def wants_retain(self) -> bool:
        """Whether a step also draws the retain part (the trainer adds it where retained data exist)."""
        return self.trainer.mode == "data" or self.args.retain_weight > 0

    def forget_parts(self, generator: torch.Generator) -> list[dict]:
        """The forgetting side's noised inputs of one micro-batch (each a dict with `x_t`, `t`, `cond`, `name`)."""
        return []

    def add_targets(self, part: dict) -> None:
        """Add the regression target (`part["target"]`, or what `loss` needs) to one of this objective's parts."""
        part["target"] = part["noise"]

    @abc.abstractmethod
    def loss(self, preds: dict, parts: dict, retain: torch.Tensor, mse) -> tuple[torch.Tensor, ...]:
        """`(loss, forget_term, constraint_estimate)` from the trained model's predictions `preds[name]`.

        `retain` is the retain part's mean squared error (zero without one); `mse(name)` the mean squared error of
        part `name` against its target.
        """

    def calibration_value(self, part: dict, eps_u: torch.Tensor) -> torch.Tensor:
        """The constraint read on a retained-condition draw `part` (default: path KL(p_k || p_u))."""
        trainer = self.trainer
        eps_k = trainer._eps(trainer.ref_unet, part["x_t"], part["t"], part["cond"])
        diff = ((eps_k - eps_u) ** 2).flatten(1).sum(1)
        return trainer._path_sum(diff, part["t"])

    def satisfied(self, value: float, level: float) -> bool:
        return value <= level if self.sense == "<=" else value >= level

    def slack(self, value: float, level: float) -> float:
        """How far the constraint holds (positive) or is violated (negative)."""
        return level - value if self.sense == "<=" else value - level

    def _zero(self) -> torch.Tensor:
        return torch.zeros((), device=self.trainer.accelerator.device)

    def _data_sizes(self) -> tuple[int, int, int]:
        n_forget, n_retain = len(self.trainer.forget_data[0]), len(self.trainer.retain_data[0])
        return n_forget, n_retain, n_forget + n_retain


def _reference_and_forget_pools(trainer) -> None:
    """Concept mode: fixed pools of the pretrained model's samples at the reference (`trainer.ref_pool`) and forget
    conditions (`trainer.u_pool`), `pool_size` each; used by the forward-KL objective and SISS."""
    if trainer.mode != "concept":
        return
    n = trainer.args.pool_size
    trainer.ref_pool = trainer.sample(trainer.ref_unet, trainer._repeat(trainer.reference_cond, n),
                                      trainer._pool_generator(2, 0))  # fmt: skip
    trainer.u_pool = trainer.sample(trainer.ref_unet, trainer._repeat(trainer.forget_conds, n),
                                    trainer._pool_generator(3, 0))  # fmt: skip


class _GuidanceObjective(UnlearningObjective):
    """Concept unlearning toward `eps_ref + eta (eps_ref - eps_u)` on the model's own (on-policy) samples."""

    guidance = True

    @abc.abstractmethod
    def guidance_strength(self) -> float:
        """eta of the forget target `eps_ref + eta (eps_ref - eps_u)` at the current step."""

    def begin_step(self) -> None:
        trainer = self.trainer
        if trainer.forget_pool is None or trainer.global_step % self.args.pool_refresh_steps == 0:
            trainer.refresh_forget_pool()

    def forget_parts(self, generator):
        trainer = self.trainer
        picked = trainer._pick(trainer.forget_pool, trainer.forget_pool_conds, generator)
        return [trainer._noised(*picked, generator, "forget")]

    def add_targets(self, part):
        trainer = self.trainer
        ref = trainer._repeat(trainer.reference_cond, len(part["t"])).to(part["t"].device)
        eps_ref = trainer._eps(trainer.ref_unet, part["x_t"], part["t"], ref)
        eps_u = trainer._eps(trainer.ref_unet, part["x_t"], part["t"], part["cond"])
        part["eps_ref"], part["eps_u"] = eps_ref, eps_u
        part["target"] = eps_ref + self.guidance_strength() * (eps_ref - eps_u)

    def constraint_diff(self, part: dict, pred: torch.Tensor) -> torch.Tensor:
        """Per-sample path KL(q || p_u) on q's own samples: sum over dims of (eps_theta - eps_u)²."""
        return ((pred.detach() - part["eps_u"]) ** 2).flatten(1).sum(1)

    def loss(self, preds, parts, retain, mse):
        forget = mse("forget")
        loss = forget + self.args.retain_weight * retain
        with torch.no_grad():
            estimate = self.trainer._path_sum(
                self.constraint_diff(parts["forget"], preds["forget"]), parts["forget"]["t"]
            )
        return loss, forget, estimate


@public
class ReverseKLObjective(_GuidanceObjective):
    r"""min KL(q || p_ref) s.t. KL(q || p_u) >= b: target `eps_ref + λ/(1-λ) (eps_ref - eps_u)`; C is the Girsanov
    path KL on the model's own samples."""

    name = "reverse_kl"
    constraint_text = "KL(q || p_u) >= b (reverse KL; target eps_ref + lambda/(1-lambda) (eps_ref - eps_u))"

    def guidance_strength(self):
        lam = self.trainer.lambda_
        return lam / (1.0 - lam)


@public
class LikelihoodObjective(_GuidanceObjective):
    r"""min KL(q || p_ref) s.t. E_q[log p_u - log p_ref] <= b: target `eps_ref + λ (eps_ref - eps_u)`; C is the ELBO
    difference on the model's own samples."""

    name = "likelihood"
    constraint_text = "E_q[log p_u - log p_ref] <= b (likelihood; target eps_ref + lambda (eps_ref - eps_u))"
    sense = "<="

    def guidance_strength(self):
        return self.trainer.lambda_

    def constraint_diff(self, part, pred):
        diff = ((part["eps_ref"] - part["noise"]) ** 2).flatten(1).sum(1)
        return diff - ((part["eps_u"] - part["noise"]) ** 2).flatten(1).sum(1)

    def calibration_value(self, part, eps_u):
        trainer = self.trainer
        ref = trainer._repeat(trainer.reference_cond, len(part["t"])).to(trainer.accelerator.device)
        eps_ref = trainer._eps(trainer.ref_unet, part["x_t"], part["t"], ref)
        diff = ((eps_ref - part["noise"]) ** 2).flatten(1).sum(1) - ((eps_u - part["noise"]) ** 2).flatten(1).sum(1)
        return trainer._path_sum(diff, part["t"])


@public
class ESDObjective(_GuidanceObjective):
    r"""ESD (baseline): the reverse-KL target with a fixed strength `esd_negative_guidance`; λ is not learned."""

    name = "esd"
    primal_dual = False

    def guidance_strength(self):
        return self.args.esd_negative_guidance


@public
class ForwardKLObjective(UnlearningObjective):
    r"""
    min KL(p_pre || q) s.t. KL(p_u || q) >= b: the subtracted mixture `(p_pre - λ p_u) / (1 - λ)`, trained by the
    denoising loss `[E_pre l - λ E_u l] / (1 - λ)`; C is the denoising loss on forget samples.

    Concept unlearning draws p_pre from the reference condition's pretrained samples (denoised under the forget
    condition) and p_u from the forget condition's; data unlearning uses the training set, of which the forget set
    is k of n examples: `[((n-k)/n) l_keep + (k/n - λ) l_forget] / (1 - λ)`.
    """

    name = "forward_kl"
    constraint_text = "KL(p_u || q) >= b (forward KL; the subtracted mixture (p_pre - lambda p_u)/(1 - lambda))"
    modes = ("concept", "data")

    def setup(self):
        _reference_and_forget_pools(self.trainer)

    def forget_parts(self, generator):
        trainer = self.trainer
        if trainer.mode == "data":
            return [trainer._noised(*trainer._pick(*trainer.forget_data, generator), generator, "forget")]
        n = self.args.per_device_train_batch_size
        u_conds = trainer._repeat(trainer.forget_conds, trainer.u_pool.shape[0])
        x_ref, _ = trainer._pick(trainer.ref_pool, None, generator)
        x_u, c_u = trainer._pick(trainer.u_pool, u_conds, generator)
        # p_ref's samples are denoised under the forget condition: q(.|c_u) learns (p_ref - λ p_u) / (1 - λ).
        return [
            trainer._noised(x_ref, trainer._repeat(trainer.forget_conds, n), generator, "forget_ref"),
            trainer._noised(x_u, c_u, generator, "forget"),
        ]

    def loss(self, preds, parts, retain, mse):
        lam, retain_weight = self.trainer.lambda_, self.args.retain_weight
        forget_mse = mse("forget")
        if self.trainer.mode == "data":
            n_forget, n_retain, n = self._data_sizes()
            forget = (n_forget / n - lam) * forget_mse / (1 - lam)
            loss = forget + retain_weight * (n_retain / n) * retain / (1 - lam)
        else:
            forget = (mse("forget_ref") - lam * forget_mse) / (1 - lam)
            loss = forget + retain_weight * retain
        return loss, forget, forget_mse.detach()

    def calibration_value(self, part, eps_u):
        return F.mse_loss(eps_u, part["noise"])


@public
class NegGradPlusObjective(UnlearningObjective):
    r"""NegGrad+ (baseline, data): `l_keep - alpha l_forget` with alpha `neggrad_weight`."""

    name = "neggrad_plus"
    modes = ("data",)
    primal_dual = False

    def forget_parts(self, generator):
        trainer = self.trainer
        return [trainer._noised(*trainer._pick(*trainer.forget_data, generator), generator, "forget")]

    def loss(self, preds, parts, retain, mse):
        forget_mse = mse("forget")
        forget = -self.args.neggrad_weight * forget_mse
        return forget + self.args.retain_weight * retain, forget, forget_mse.detach()


@public
class RetainOnlyObjective(UnlearningObjective):
    r"""Retain-only fine-tuning (baseline): the retain term alone (`retain_weight` scales it for data unlearning)."""

    name = "retain_only"
    modes = ("concept", "data")
    primal_dual = False

    def wants_retain(self):
        return True

    def loss(self, preds, parts, retain, mse):
        loss = self.args.retain_weight * retain if self.trainer.mode == "data" else retain
        return loss, self._zero(), self._zero().detach()


@public
class SISSObjective(UnlearningObjective):
    r"""
    SISS (baseline): x_t from the defensive mixture `(1-s) q(.|x) + s q(.|a)` of a data point x (same condition) and
    a forget point a, importance-weighted: `n/(n-k) E[w_x l_x] - alpha k/(n-k) E[w_a l_a]` with alpha
    `neggrad_weight` (1 is SISS as published; the repository rescales this term with its `scaling_norm`).

    Data unlearning draws x from the whole training set (k forget of n examples) and its keep term replaces the
    retain part; `siss_retain_weight` > 0 adds the retain term the other data methods use (0, as published, by
    default). Concept unlearning takes the pretrained model's samples: the forget points are samples at the forget
    prompts/classes (`u_pool`), the data are those and as many samples of the reference (`ref_pool`), all denoised
    under the forget condition, so the subtracted mixture is the reference; the retain term is the other methods'.
    """

    name = "siss"
    modes = ("concept", "data")
    primal_dual = False

    def setup(self):
        _reference_and_forget_pools(self.trainer)

    def wants_retain(self):
        return self._retain_weight() > 0

    def _retain_weight(self) -> float:
        return self.args.retain_weight if self.trainer.mode == "concept" else self.args.siss_retain_weight

    def _sizes(self) -> tuple[int, int, int]:
        trainer = self.trainer
        if trainer.mode == "data":
            return self._data_sizes()
        n_forget, n_keep = len(trainer.u_pool), len(trainer.ref_pool)
        return n_forget, n_keep, n_forget + n_keep

    def _concept_draws(self, generator):
        trainer = self.trainer
        u_conds = trainer._repeat(trainer.forget_conds, len(trainer.u_pool))
        a, a_conds = trainer._pick(trainer.u_pool, u_conds, generator)
        everything = torch.cat([trainer.ref_pool, trainer.u_pool])
        x = everything[torch.randint(0, len(everything), (len(a),), generator=generator).to(everything.device)]
        return a, a_conds, x

    def forget_parts(self, generator):
        trainer = self.trainer
        device = trainer.accelerator.device
        if trainer.mode == "concept":
            a, a_labels, x = self._concept_draws(generator)
            return self._mixture_part(a, a_labels, x, generator, device)
        a, a_labels = trainer._pick(*trainer.forget_data, generator)
        all_images = torch.cat([trainer.retain_data[0], trainer.forget_data[0]])
        all_labels = None
        if trainer.retain_data[1] is not None:
            all_labels = torch.cat([trainer.retain_data[1], trainer.forget_data[1]])
        if all_labels is None:
            x = all_images[torch.randint(0, len(all_images), (len(a),), generator=generator)]
        else:  # x shares a's class, so both terms are denoised under the same condition
            order = torch.argsort(all_labels, stable=True)
            counts = torch.bincount(all_labels, minlength=int(all_labels.max()) + 1)
            starts = torch.cumsum(counts, 0) - counts
            offsets = (torch.rand(len(a), generator=generator) * counts[a_labels]).long()
            x = all_images[order[starts[a_labels] + offsets]]
        return self._mixture_part(a, a_labels, x, generator, device)

    def _mixture_part(self, a, conds, x, generator, device):
        trainer = self.trainer
        noise = torch.randn(a.shape, generator=generator).to(device)
        t = torch.randint(0, trainer.num_train_timesteps, (len(a),), generator=generator).to(device)
        from_a = (torch.rand(len(a), generator=generator) < self.args.siss_mixture_weight).to(device)
        a, x = a.to(device), x.to(device)
        m = trainer.noise_scheduler.add_noise(torch.where(from_a[:, None, None, None], a, x), noise, t)
        return [{"name": "siss", "x_t": m, "t": t, "cond": conds.to(device) if conds is not None else None,
                 "x": x, "a": a}]  # fmt: skip

    def add_targets(self, part):
        alpha_bar = self.trainer.noise_scheduler.alphas_cumprod.to(part["t"].device)[part["t"]].view(-1, 1, 1, 1)
        gamma, sigma = alpha_bar.sqrt(), (1 - alpha_bar).sqrt()
        part["target_x"] = (part["x_t"] - gamma * part["x"]) / sigma
        part["target_a"] = (part["x_t"] - gamma * part["a"]) / sigma
        # log q(m|a) - log q(m|x)
        log_ratio = ((part["target_x"] ** 2).flatten(1).sum(1) - (part["target_a"] ** 2).flatten(1).sum(1)) / 2
        s = self.args.siss_mixture_weight
        part["weight_x"] = torch.exp(-torch.logaddexp(torch.full_like(log_ratio, math.log(1 - s)),
                                                      math.log(s) + log_ratio))  # fmt: skip
        part["weight_a"] = torch.exp(-torch.logaddexp(math.log(1 - s) - log_ratio,
                                                      torch.full_like(log_ratio, math.log(s))))  # fmt: skip

    def loss(self, preds, parts, retain, mse):
        n_forget, n_retain, n = self._sizes()
        p = parts["siss"]
        sq_x = ((preds["siss"] - p["target_x"]) ** 2).flatten(1).mean(1)
        sq_a = ((preds["siss"] - p["target_a"]) ** 2).flatten(1).mean(1)
        keep = (p["weight_x"] * sq_x).mean() * n / n_retain
        neg = self.args.neggrad_weight * (p["weight_a"] * sq_a).mean() * n_forget / n_retain
        loss = keep - neg + self._retain_weight() * retain
        return loss, -neg, (p["weight_a"] * sq_a).mean().detach()


OBJECTIVES: dict[str, type[UnlearningObjective]] = {
    cls.name: cls
    for cls in (
        ReverseKLObjective,
        ForwardKLObjective,
        LikelihoodObjective,
        ESDObjective,
        SISSObjective,
        NegGradPlusObjective,
        RetainOnlyObjective,
    )  # fmt: skip
}
