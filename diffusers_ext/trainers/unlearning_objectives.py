r"""
The unlearning methods of [`ConstrainedUnlearningTrainer`], one small class each.

An objective says what a step draws for the forgetting side (`forget_parts`), the regression targets of those draws
(`add_targets`), the loss and the Monte-Carlo constraint estimate (`loss`), how the constraint is read on the
retained conditions (`calibration_value`), and how the dual variable relates to it (`sense`, `primal_dual`,
`guidance_strength`). The trainer owns everything shared: conditions, sample pools, the retain term, the single
forward pass, the dual update, checkpoints. An objective sees only an [`UnlearningContext`] (what it may read and
draw) and the current λ, passed to the methods that depend on it; its draws are [`NoisedBatch`] parts. Notation as in
`docs/unlearning.md`: eps_ref / eps_u are the frozen pretrained model's predictions at the reference and forget
conditions, λ the dual variable. A prediction is the noise for DDPM-family UNets and the velocity for rectified-flow
transformers (SD3, Flux): every target below is an affine combination whose weights sum to 1, so it has the same form
in both (`docs/unlearning.md`, "Flow-matching models").
"""

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..utils import public
from .constrained_unlearning_config import ConstrainedUnlearningConfig


@dataclass
class NoisedBatch:
    r"""
    One part of a micro-batch: noised inputs that go through the trained UNet in the step's single forward pass.

    Attributes:
        name (`str`): the part's role: `"forget"`, `"forget_ref"` (forward KL, concept), `"siss"` or `"retain"`.
        x_t: `(batch, channels, height, width)` the noised samples.
        t: `(batch,)` their timesteps.
        cond: `(batch,)` class labels, prompt [`Conditions`], or None (unconditional UNet).
        noise / x0: `(batch, channels, height, width)` the added noise and the clean samples (None where unused).
        denoising_target: `(batch, channels, height, width)` what the model regresses on for `x_t`: the noise
            (DDPM; the default when only `noise` is given) or the velocity `noise - x0` (rectified flow, set by the
            flow-matching noise process).
        target: the regression target of the trained prediction (set by `compute_targets`).
        eps_ref / eps_u: the frozen model's predictions at the reference and forget conditions (guidance targets).
    """

    name: str
    x_t: torch.Tensor
    t: torch.Tensor
    cond: torch.Tensor | None
    noise: torch.Tensor | None = None
    x0: torch.Tensor | None = None
    denoising_target: torch.Tensor | None = None
    target: torch.Tensor | None = None
    eps_ref: torch.Tensor | None = None
    eps_u: torch.Tensor | None = None

    def __post_init__(self):
        if self.denoising_target is None and self.noise is not None:
            self.denoising_target = self.noise  # DDPM's epsilon target


@dataclass
class SISSBatch(NoisedBatch):
    r"""
    SISS's part: `x_t` is noised from the defensive mixture of a data point `x` and a forget point `a` (both
    `(batch, channels, height, width)`); `target_x` / `target_a` are the noises that map each to `x_t`, and
    `weight_x` / `weight_a` `(batch,)` the importance weights (set by `add_targets`).
    """

    x: torch.Tensor | None = None
    a: torch.Tensor | None = None
    target_x: torch.Tensor | None = None
    target_a: torch.Tensor | None = None
    weight_x: torch.Tensor | None = None
    weight_a: torch.Tensor | None = None


@dataclass
class ObjectiveLoss:
    """What an objective's `loss` returns: the loss to minimise, its forgetting term and the constraint estimate
    (both detached or scalars for logging), all 0-d tensors."""

    loss: torch.Tensor
    forget_loss: torch.Tensor
    constraint_estimate: torch.Tensor


@dataclass
class UnlearningContext:
    r"""
    What an [`UnlearningObjective`] may read and draw, built by [`ConstrainedUnlearningTrainer`].

    Attributes:
        args ([`ConstrainedUnlearningConfig`]): the configuration.
        mode (`str`): `"concept"` (forget classes or prompts) or `"data"` (forget training examples).
        device (`torch.device`): where the draws live.
        num_train_timesteps (`int`): T of the noise schedule.
        noise_process: the forward noising (`add_noise`, `denoising_target`, `noise_between`): DDPM or rectified
            flow (`diffusers_ext.trainers.unlearning_noise`).
        forget_conds / reference_cond: the forget conditions and the reference condition (concept mode).
        forget_data / retain_data: `(images, labels)` of the forget and retain sets (data mode).
        noised: `(x0, conds, generator, name) -> NoisedBatch`, x0 noised at uniformly drawn timesteps.
        pick: `(pool, conds, generator) -> (samples, conds)`, `per_device_train_batch_size` draws with replacement.
        repeat: `(conds, n) -> conds` cycled to `n` entries.
        pretrained_eps: `(x_t, t, cond) -> eps`, the frozen pretrained model's prediction (noise or velocity).
        path_sum: `(per_sample_sq, t) -> C`, the Monte-Carlo path sum `T * mean(w_t * per_sample_sq)`.
        sample_pretrained: `(conds, tag) -> samples` of the frozen model (a fixed pool; `tag` seeds it).
        on_policy_pool: `step -> (samples, conds)`, the trained model's own samples at the forget conditions,
            redrawn every `pool_refresh_steps`.
    """

    args: ConstrainedUnlearningConfig
    mode: str
    device: torch.device
    num_train_timesteps: int
    noise_process: object
    forget_conds: torch.Tensor | None
    reference_cond: torch.Tensor | None
    forget_data: tuple | None
    retain_data: tuple | None
    noised: Callable[..., NoisedBatch]
    pick: Callable
    repeat: Callable
    pretrained_eps: Callable
    path_sum: Callable
    sample_pretrained: Callable
    on_policy_pool: Callable


def mse(pred: torch.Tensor, part: NoisedBatch) -> torch.Tensor:
    """Mean squared error of the trained prediction `pred` of `part` against its target."""
    return F.mse_loss(pred, part.target.float())


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

    def __init__(self, context: UnlearningContext):
        self.context = context
        self.args = context.args

    def setup(self) -> None:
        """Draw any fixed sample pool the objective needs (once, from the frozen pretrained copy)."""
        return None  # an optional hook: nothing to do by default

    def begin_step(self, step: int) -> None:
        """Called once per training step `step` before its micro-batches are drawn."""
        return None  # an optional hook: nothing to do by default

    def wants_retain(self) -> bool:
        """Whether a step also draws the retain part (the trainer adds it where retained data exist)."""
        return self.context.mode == "data" or self.args.retain_weight > 0

    def forget_parts(self, generator: torch.Generator) -> list[NoisedBatch]:
        """The forgetting side's noised inputs of one micro-batch."""
        return []

    def add_targets(self, part: NoisedBatch, lambda_: float) -> None:
        """Set the regression target (`part.target`, or what `loss` needs) of one of this objective's parts."""
        part.target = part.denoising_target

    @abc.abstractmethod
    def loss(
        self, preds: dict[str, torch.Tensor], parts: dict[str, NoisedBatch], retain: torch.Tensor, lambda_: float
    ) -> ObjectiveLoss:
        """The loss, forget term and constraint estimate from the trained model's predictions `preds[name]` of the
        parts `parts[name]` (each `(batch, channels, height, width)`); `retain` is the retain part's mean squared
        error (zero without one), `lambda_` the dual variable."""

    def calibration_value(self, part: NoisedBatch, eps_u: torch.Tensor) -> torch.Tensor:
        """The constraint read on a retained-condition draw `part` (default: path KL(p_k || p_u))."""
        context = self.context
        eps_k = context.pretrained_eps(part.x_t, part.t, part.cond)
        diff = ((eps_k - eps_u) ** 2).flatten(1).sum(1)
        return context.path_sum(diff, part.t)

    def satisfied(self, value: float, level: float) -> bool:
        return value <= level if self.sense == "<=" else value >= level

    def slack(self, value: float, level: float) -> float:
        """How far the constraint holds (positive) or is violated (negative)."""
        return level - value if self.sense == "<=" else value - level

    def _zero(self) -> torch.Tensor:
        return torch.zeros((), device=self.context.device)

    def _data_sizes(self) -> tuple[int, int, int]:
        n_forget, n_retain = len(self.context.forget_data[0]), len(self.context.retain_data[0])
        return n_forget, n_retain, n_forget + n_retain


class _PooledObjective(UnlearningObjective):
    """An objective that, for concepts, draws from fixed pools of the pretrained model's samples at the reference
    (`ref_pool`) and forget conditions (`u_pool`), `pool_size` each (the forward-KL objective and SISS)."""

    ref_pool: torch.Tensor | None = None
    u_pool: torch.Tensor | None = None

    def setup(self):
        context = self.context
        if context.mode != "concept":
            return
        n = self.args.pool_size
        self.ref_pool = context.sample_pretrained(context.repeat(context.reference_cond, n), 2)
        self.u_pool = context.sample_pretrained(context.repeat(context.forget_conds, n), 3)


class _GuidanceObjective(UnlearningObjective):
    """Concept unlearning toward `eps_ref + eta (eps_ref - eps_u)` on the model's own (on-policy) samples."""

    guidance = True

    @abc.abstractmethod
    def guidance_strength(self, lambda_: float) -> float:
        """eta of the forget target `eps_ref + eta (eps_ref - eps_u)` at the dual variable `lambda_`."""

    def begin_step(self, step):
        self.pool, self.pool_conds = self.context.on_policy_pool(step)

    def forget_parts(self, generator):
        context = self.context
        return [context.noised(*context.pick(self.pool, self.pool_conds, generator), generator, "forget")]

    def add_targets(self, part, lambda_):
        context = self.context
        ref = context.repeat(context.reference_cond, len(part.t)).to(part.t.device)
        part.eps_ref = context.pretrained_eps(part.x_t, part.t, ref)
        part.eps_u = context.pretrained_eps(part.x_t, part.t, part.cond)
        part.target = part.eps_ref + self.guidance_strength(lambda_) * (part.eps_ref - part.eps_u)

    def constraint_diff(self, part: NoisedBatch, pred: torch.Tensor) -> torch.Tensor:
        """Per-sample path KL(q || p_u) on q's own samples: sum over dims of (eps_theta - eps_u)²."""
        return ((pred.detach() - part.eps_u) ** 2).flatten(1).sum(1)

    def loss(self, preds, parts, retain, lambda_):
        forget = mse(preds["forget"], parts["forget"])
        loss = forget + self.args.retain_weight * retain
        with torch.no_grad():
            estimate = self.context.path_sum(self.constraint_diff(parts["forget"], preds["forget"]), parts["forget"].t)
        return ObjectiveLoss(loss, forget, estimate)


@public
class ReverseKLObjective(_GuidanceObjective):
    r"""min KL(q || p_ref) s.t. KL(q || p_u) >= b: target `eps_ref + λ/(1-λ) (eps_ref - eps_u)`; C is the Girsanov
    path KL on the model's own samples."""

    name = "reverse_kl"
    constraint_text = "KL(q || p_u) >= b (reverse KL; target eps_ref + lambda/(1-lambda) (eps_ref - eps_u))"

    def guidance_strength(self, lambda_):
        return lambda_ / (1.0 - lambda_)


@public
class LikelihoodObjective(_GuidanceObjective):
    r"""min KL(q || p_ref) s.t. E_q[log p_u - log p_ref] <= b: target `eps_ref + λ (eps_ref - eps_u)`; C is the ELBO
    difference on the model's own samples."""

    name = "likelihood"
    constraint_text = "E_q[log p_u - log p_ref] <= b (likelihood; target eps_ref + lambda (eps_ref - eps_u))"
    sense = "<="

    def guidance_strength(self, lambda_):
        return lambda_

    def constraint_diff(self, part, pred):
        diff = ((part.eps_ref - part.denoising_target) ** 2).flatten(1).sum(1)
        return diff - ((part.eps_u - part.denoising_target) ** 2).flatten(1).sum(1)

    def calibration_value(self, part, eps_u):
        context = self.context
        ref = context.repeat(context.reference_cond, len(part.t)).to(context.device)
        eps_ref = context.pretrained_eps(part.x_t, part.t, ref)
        target = part.denoising_target
        diff = ((eps_ref - target) ** 2).flatten(1).sum(1) - ((eps_u - target) ** 2).flatten(1).sum(1)
        return context.path_sum(diff, part.t)


@public
class ESDObjective(_GuidanceObjective):
    r"""ESD (baseline): the reverse-KL target with a fixed strength `esd_negative_guidance`; λ is not learned."""

    name = "esd"
    primal_dual = False

    def guidance_strength(self, lambda_):
        return self.args.esd_negative_guidance


@public
class ForwardKLObjective(_PooledObjective):
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

    def forget_parts(self, generator):
        context = self.context
        if context.mode == "data":
            return [context.noised(*context.pick(*context.forget_data, generator), generator, "forget")]
        n = self.args.per_device_train_batch_size
        u_conds = context.repeat(context.forget_conds, self.u_pool.shape[0])
        x_ref, _ = context.pick(self.ref_pool, None, generator)
        x_u, c_u = context.pick(self.u_pool, u_conds, generator)
        # p_ref's samples are denoised under the forget condition: q(.|c_u) learns (p_ref - λ p_u) / (1 - λ).
        return [
            context.noised(x_ref, context.repeat(context.forget_conds, n), generator, "forget_ref"),
            context.noised(x_u, c_u, generator, "forget"),
        ]

    def loss(self, preds, parts, retain, lambda_):
        lam, retain_weight = lambda_, self.args.retain_weight
        forget_mse = mse(preds["forget"], parts["forget"])
        if self.context.mode == "data":
            n_forget, n_retain, n = self._data_sizes()
            forget = (n_forget / n - lam) * forget_mse / (1 - lam)
            loss = forget + retain_weight * (n_retain / n) * retain / (1 - lam)
        else:
            forget = (mse(preds["forget_ref"], parts["forget_ref"]) - lam * forget_mse) / (1 - lam)
            loss = forget + retain_weight * retain
        return ObjectiveLoss(loss, forget, forget_mse.detach())

    def calibration_value(self, part, eps_u):
        return F.mse_loss(eps_u, part.denoising_target)


@public
class NegGradPlusObjective(UnlearningObjective):
    r"""NegGrad+ (baseline, data): `l_keep - alpha l_forget` with alpha `neggrad_weight`."""

    name = "neggrad_plus"
    modes = ("data",)
    primal_dual = False

    def forget_parts(self, generator):
        context = self.context
        return [context.noised(*context.pick(*context.forget_data, generator), generator, "forget")]

    def loss(self, preds, parts, retain, lambda_):
        forget_mse = mse(preds["forget"], parts["forget"])
        forget = -self.args.neggrad_weight * forget_mse
        return ObjectiveLoss(forget + self.args.retain_weight * retain, forget, forget_mse.detach())


@public
class RetainOnlyObjective(UnlearningObjective):
    r"""Retain-only fine-tuning (baseline): the retain term alone (`retain_weight` scales it for data unlearning)."""

    name = "retain_only"
    modes = ("concept", "data")
    primal_dual = False

    def wants_retain(self):
        return True

    def loss(self, preds, parts, retain, lambda_):
        loss = self.args.retain_weight * retain if self.context.mode == "data" else retain
        return ObjectiveLoss(loss, self._zero(), self._zero().detach())


@public
class SISSObjective(_PooledObjective):
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

    def wants_retain(self):
        return self._retain_weight() > 0

    def _retain_weight(self) -> float:
        return self.args.retain_weight if self.context.mode == "concept" else self.args.siss_retain_weight

    def _sizes(self) -> tuple[int, int, int]:
        if self.context.mode == "data":
            return self._data_sizes()
        n_forget, n_keep = len(self.u_pool), len(self.ref_pool)
        return n_forget, n_keep, n_forget + n_keep

    def _concept_draws(self, generator):
        context = self.context
        u_conds = context.repeat(context.forget_conds, len(self.u_pool))
        a, a_conds = context.pick(self.u_pool, u_conds, generator)
        everything = torch.cat([self.ref_pool, self.u_pool])
        x = everything[torch.randint(0, len(everything), (len(a),), generator=generator).to(everything.device)]
        return a, a_conds, x

    def forget_parts(self, generator):
        context = self.context
        device = context.device
        if context.mode == "concept":
            a, a_labels, x = self._concept_draws(generator)
            return self._mixture_part(a, a_labels, x, generator, device)
        a, a_labels = context.pick(*context.forget_data, generator)
        all_images = torch.cat([context.retain_data[0], context.forget_data[0]])
        all_labels = None
        if context.retain_data[1] is not None:
            all_labels = torch.cat([context.retain_data[1], context.forget_data[1]])
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
        context = self.context
        noise = torch.randn(a.shape, generator=generator).to(device)
        t = torch.randint(0, context.num_train_timesteps, (len(a),), generator=generator).to(device)
        from_a = (torch.rand(len(a), generator=generator) < self.args.siss_mixture_weight).to(device)
        a, x = a.to(device), x.to(device)
        m = context.noise_process.add_noise(torch.where(from_a[:, None, None, None], a, x), noise, t)
        return [SISSBatch("siss", m, t, conds.to(device) if conds is not None else None, x=x, a=a)]

    def add_targets(self, part, lambda_):
        process = self.context.noise_process
        # the noise that takes each clean sample to x_t, and the regression target it gives
        noise_x = process.noise_between(part.x, part.x_t, part.t)
        noise_a = process.noise_between(part.a, part.x_t, part.t)
        part.target_x = process.denoising_target(part.x, noise_x)
        part.target_a = process.denoising_target(part.a, noise_a)
        # log q(m|a) - log q(m|x)
        log_ratio = ((noise_x**2).flatten(1).sum(1) - (noise_a**2).flatten(1).sum(1)) / 2
        s = self.args.siss_mixture_weight
        part.weight_x = torch.exp(
            -torch.logaddexp(torch.full_like(log_ratio, math.log(1 - s)), math.log(s) + log_ratio)
        )
        part.weight_a = torch.exp(
            -torch.logaddexp(math.log(1 - s) - log_ratio, torch.full_like(log_ratio, math.log(s)))
        )

    def loss(self, preds, parts, retain, lambda_):
        n_forget, n_retain, n = self._sizes()
        p = parts["siss"]
        sq_x = ((preds["siss"] - p.target_x) ** 2).flatten(1).mean(1)
        sq_a = ((preds["siss"] - p.target_a) ** 2).flatten(1).mean(1)
        keep = (p.weight_x * sq_x).mean() * n / n_retain
        neg = self.args.neggrad_weight * (p.weight_a * sq_a).mean() * n_forget / n_retain
        loss = keep - neg + self._retain_weight() * retain
        return ObjectiveLoss(loss, -neg, (p.weight_a * sq_a).mean().detach())


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
    )
}
