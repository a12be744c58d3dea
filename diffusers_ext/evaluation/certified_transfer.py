"""The digits-episodes proxy of certified few-shot transfer (docs/certified_transfer.md).

A frozen zoo [`ConvImageClassifier`] with peft LoRA adapters (rank 2) on its last convolution (`blocks.10`) and its
feature layer (`feature.0`); logits are scaled cosine similarities between the adapted features and fixed class
prototypes (the mean clean-image features of each digit, the analogue of CLIP's text embeddings), so one adapter
serves any class combination. Everything after the frozen trunk is also written in batched form over many adapter
vectors at once ([`DigitsLoRAProxy.logits`]), which is what makes evaluating thousands of hypotheses cheap; a test
checks it against the peft model.

Also here: the baselines' sampling (a Gaussian fit to the upstream adapters) and the honest bound of a continuously
trained adapter (the parameter-count bound of its `bits`-bit discretisation).
"""

import copy
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..models.conv_image_classifier import ConvImageClassifier
from ..pipelines.certified_transfer.adapter_vectorizer import AdapterVectorizer
from ..utils import check_positive_int


TARGET_MODULES = ("blocks.10", "feature.0")
COSINE_SCALE = 10.0


class DigitsLoRAProxy:
    r"""
    The frozen digit classifier with LoRA adapters on its last layers, evaluated for many adapters at once.

    Args:
        classifier ([`ConvImageClassifier`]): the frozen backbone (the zoo's `digits-classifier`, 8x8 inputs).
        prototype_images (`torch.Tensor` of shape `(N, 1, 8, 8)`) and prototype_labels (`torch.Tensor` of shape
            `(N,)`): clean images whose per-class mean features are the class prototypes.
        rank (`int`, defaults to 2): LoRA rank (`lora_alpha = rank`, scaling 1).
    """

    def __init__(self, classifier: ConvImageClassifier, prototype_images, prototype_labels, rank: int = 2):
        from peft import LoraConfig, get_peft_model

        if not isinstance(classifier, ConvImageClassifier) or len(classifier.blocks) != 14:
            raise ValueError("`classifier` must be a two-block ConvImageClassifier (the zoo's digits-classifier).")
        self.classifier = classifier.eval().requires_grad_(False)
        self.rank = rank
        with torch.no_grad():
            features = self.classifier(prototype_images).features
            num_classes = classifier.config.num_classes
            prototypes = torch.stack([features[prototype_labels == c].mean(0) for c in range(num_classes)])
        self.prototypes = F.normalize(prototypes, dim=-1)  # (num_classes, feature_dim)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(TARGET_MODULES), lora_dropout=0.0)
        self.peft_model = get_peft_model(copy.deepcopy(self.classifier), config).eval()
        self.vectorizer = AdapterVectorizer.from_peft_model(self.peft_model)
        self._slices = {}
        start = 0
        for name, size, shape in zip(
            self.vectorizer.parameter_names, self.vectorizer.sizes, self.vectorizer.parameter_shapes
        ):
            module = next(m for m in TARGET_MODULES if f".{m}." in name)
            part = "A" if "lora_A" in name else "B"
            self._slices[(module, part)] = (start, start + size, shape)
            start += size

    @property
    def dim(self) -> int:
        return self.vectorizer.dim

    def _part(self, vectors: torch.Tensor, module: str, part: str) -> torch.Tensor:
        start, end, shape = self._slices[(module, part)]
        return vectors[:, start:end].reshape(vectors.shape[0], *shape)

    def init_vectors(self, num: int, generator: torch.Generator) -> torch.Tensor:
        """`num` freshly initialised adapters (peft's convention: `lora_A` random, `lora_B` zero), `(num, dim)`."""
        vectors = torch.zeros(num, self.dim)
        for module in TARGET_MODULES:
            start, end, shape = self._slices[(module, "A")]
            fan_in = math.prod(shape[1:])
            vectors[:, start:end] = torch.randn(num, end - start, generator=generator) / math.sqrt(fan_in)
        return vectors

    @torch.no_grad()
    def trunk(self, images: torch.Tensor) -> torch.Tensor:
        """The frozen layers before the adapted convolution: `(N, 1, 8, 8)` -> `(N, 64, 4, 4)`."""
        return self.classifier.blocks[:10](images.float())

    def logits(self, vectors: torch.Tensor, hidden: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        r"""
        Cosine logits of every adapter on every example.

        Args:
            vectors (`torch.Tensor` of shape `(H, dim)`): raw adapter vectors.
            hidden (`torch.Tensor` of shape `(n, 64, 4, 4)` or `(H, n, 64, 4, 4)`): [`trunk`] outputs, shared by all
                adapters or one set per adapter.
            classes (`torch.Tensor` of shape `(K,)` or `(H, K)`): the episode's digit classes (their prototypes).

        Returns:
            `torch.Tensor` of shape `(H, n, K)`.
        """
        num = vectors.shape[0]
        conv = self.classifier.blocks[10]
        shared = hidden.ndim == 4
        flat = hidden if shared else hidden.reshape(-1, *hidden.shape[2:])
        base = conv(flat)  # (n or H n, 64, 4, 4)
        n = hidden.shape[0] if shared else hidden.shape[1]
        columns = F.unfold(flat, conv.kernel_size, padding=conv.padding)  # (n or H n, 576, 16)
        lora_a = self._part(vectors, "blocks.10", "A").reshape(num, self.rank, -1)
        lora_b = self._part(vectors, "blocks.10", "B").reshape(num, -1, self.rank)
        if shared:
            low = torch.einsum("hrk,nkp->hnrp", lora_a, columns)
            out = base.reshape(1, n, base.shape[1], -1) + torch.einsum("hor,hnrp->hnop", lora_b, low)
        else:
            columns = columns.reshape(num, n, *columns.shape[1:])
            low = torch.einsum("hrk,hnkp->hnrp", lora_a, columns)
            out = base.reshape(num, n, base.shape[1], -1) + torch.einsum("hor,hnrp->hnop", lora_b, low)
        out = out.reshape(num * n, base.shape[1], *base.shape[2:])
        pooled = self.classifier.blocks[11:](out).mean(dim=(2, 3)).reshape(num, n, -1)  # (H, n, 64)
        linear = self.classifier.feature[0]
        feature_a = self._part(vectors, "feature.0", "A")  # (H, r, 64)
        feature_b = self._part(vectors, "feature.0", "B")  # (H, 128, r)
        pre = linear(pooled) + torch.einsum("hor,hnr->hno", feature_b, torch.einsum("hri,hni->hnr", feature_a, pooled))
        features = F.normalize(F.silu(pre), dim=-1)
        prototypes = self.prototypes[classes]  # (K, d) or (H, K, d)
        if prototypes.ndim == 2:
            return COSINE_SCALE * features @ prototypes.T
        return COSINE_SCALE * torch.einsum("hnd,hkd->hnk", features, prototypes)

    @torch.no_grad()
    def risks(
        self,
        vectors: torch.Tensor,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        classes: torch.Tensor,
        chunk: int = 256,
    ) -> torch.Tensor:
        """0-1 risks `(H,)` of adapters `(H, dim)` on examples `hidden` `(n, 64, 4, 4)` with `targets` `(n,)`
        (indices into `classes`), in chunks of `chunk` adapters."""
        out = []
        for start in range(0, vectors.shape[0], chunk):
            logits = self.logits(vectors[start : start + chunk], hidden, classes)
            out.append((logits.argmax(-1) != targets).float().mean(-1))
        return torch.cat(out)

    def fit(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        classes: torch.Tensor,
        steps: int,
        lr: float,
        generator: torch.Generator,
        batch_size: int | None = None,
        weight_decay: float = 0.0,
        init: torch.Tensor | None = None,
    ) -> torch.Tensor:
        r"""
        Fit one adapter per task with Adam on the cross-entropy of the cosine logits, all tasks at once.

        Args:
            hidden (`torch.Tensor` of shape `(T, n, 64, 4, 4)`): each task's trunk outputs.
            targets (`torch.Tensor` of shape `(T, n)`): indices into each task's `classes`.
            classes (`torch.Tensor` of shape `(T, K)`): each task's digit classes.
            steps (`int`), lr (`float`): Adam steps and learning rate.
            generator (`torch.Generator`): the adapters' initialisation and the minibatches.
            batch_size (`int`, *optional*): examples per task per step (default all `n`).
            init (`torch.Tensor` of shape `(T, dim)`, *optional*): the starting adapters (default
                [`init_vectors`] drawn from `generator`).

        Returns:
            `torch.Tensor` of shape `(T, dim)`: the fitted raw adapter vectors.
        """
        num, n = targets.shape
        if init is None:
            init = self.init_vectors(num, generator)
        elif tuple(init.shape) != (num, self.dim):
            raise ValueError(f"`init` must have shape ({num}, {self.dim}), got {tuple(init.shape)}.")
        vectors = init.clone().float().requires_grad_(True)
        optimizer = torch.optim.AdamW([vectors], lr=lr, weight_decay=weight_decay)
        rows = torch.arange(num)[:, None]
        with torch.enable_grad():
            for _ in range(steps):
                if batch_size is None or batch_size >= n:
                    batch_hidden, batch_targets = hidden, targets
                else:
                    index = torch.argsort(torch.rand(num, n, generator=generator), dim=1)[:, :batch_size]
                    batch_hidden, batch_targets = hidden[rows, index], targets[rows, index]
                logits = self.logits(vectors, batch_hidden, classes)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch_targets.reshape(-1))
                optimizer.zero_grad()
                (loss * num).backward()
                optimizer.step()
        return vectors.detach()


def gaussian_fit_sample(upstream: torch.Tensor, num: int, generator: torch.Generator) -> torch.Tensor:
    """`num` draws from the Gaussian with the upstream adapters' mean and empirical covariance, `(num, dim)`
    (exact: `mean + centred.T z / sqrt(N - 1)` with `z ~ N(0, I_N)`)."""
    mean = upstream.mean(0)
    centred = upstream - mean
    z = torch.randn(num, upstream.shape[0], generator=generator)
    return mean + z @ centred / math.sqrt(upstream.shape[0] - 1)


def parameter_count_bound(empirical_risk, num_samples: int, num_parameters: int, delta: float = 0.05, bits: int = 32):
    """The honest finite-class bound of a continuously trained adapter: its `bits`-bit discretisation is one of
    `2 ** (bits * num_parameters)` hypotheses, so `R <= r + sqrt((bits * num_parameters * ln 2 + ln(1/delta)) / 2n)`."""
    return empirical_risk + math.sqrt((bits * num_parameters * math.log(2) + math.log(1 / delta)) / (2 * num_samples))


def isotropic_gaussian_kl(mean_q: torch.Tensor, mean_p: torch.Tensor, sigma_q: float, sigma_p: float) -> torch.Tensor:
    r"""`KL(N(mean_q, sigma_q^2 I) || N(mean_p, sigma_p^2 I))` in nats, per row (float64).

    `= 0.5 * (d sigma_q^2 / sigma_p^2 + ||mean_q - mean_p||^2 / sigma_p^2 - d + 2 d ln(sigma_p / sigma_q))`.

    Args:
        mean_q, mean_p (`torch.Tensor` of shape `(..., d)`): the posterior and prior means.
        sigma_q, sigma_p (`float`): their isotropic standard deviations (> 0).

    Returns:
        `torch.Tensor` of shape `(...)`.
    """
    if not (sigma_q > 0 and sigma_p > 0):
        raise ValueError(f"`sigma_q` and `sigma_p` must be > 0, got {sigma_q!r} and {sigma_p!r}.")
    d = mean_q.shape[-1]
    distance = ((mean_q.double() - mean_p.double()) ** 2).sum(-1)
    ratio = (sigma_q / sigma_p) ** 2
    return 0.5 * (d * ratio + distance / sigma_p**2 - d - d * math.log(ratio))


def pac_bayes_bound(gibbs_risk, num_samples: int, kl, delta: float = 0.05, kind: str = "hoeffding"):
    r"""
    PAC-Bayes bound on the true risk `R(Q)` of a Gibbs (stochastic) classifier `Q` with a prior `P` fixed before
    the sample: with probability `>= 1 - delta`, simultaneously for every posterior `Q`,

    - `kind="kl"` (Langford-Seeger, Maurer's constant): `kl(r(Q) || R(Q)) <= (KL(Q || P) + ln(2 sqrt(n) / delta)) / n`;
    - `kind="hoeffding"` (McAllester's form, by Pinsker): `R(Q) <= r(Q) + sqrt((KL(Q || P) + ln(2 sqrt(n) / delta)) / (2 n))`,
      comparable term by term with the finite-class Hoeffding certificate.

    Args:
        gibbs_risk (`float` or `torch.Tensor`): the empirical Gibbs risk `r(Q) = E_{h ~ Q} r(h)` in `[0, 1]` (or an
            upper bound on it, e.g. [`monte_carlo_risk_bound`]).
        num_samples (`int`): the sample size `n`.
        kl (`float` or `torch.Tensor`, broadcastable with `gibbs_risk`): `KL(Q || P)` in nats (>= 0).
        delta (`float`, defaults to 0.05): the failure probability.
        kind (`str`): `"hoeffding"` or `"kl"`.

    Returns:
        float64 tensor of the broadcast shape (a float for float inputs).
    """
    from ..pipelines.certified_transfer.certificate import CERTIFICATE_KINDS, kl_inverse

    check_positive_int("num_samples", num_samples)
    if not 0 < delta < 1:
        raise ValueError(f"`delta` must be in (0, 1), got {delta!r}.")
    if kind not in CERTIFICATE_KINDS:
        raise ValueError(f"`kind` must be one of {CERTIFICATE_KINDS}, got {kind!r}.")
    is_scalar = not isinstance(gibbs_risk, torch.Tensor) and not isinstance(kl, torch.Tensor)
    risk = torch.as_tensor(gibbs_risk, dtype=torch.float64)
    kl = torch.as_tensor(kl, dtype=torch.float64)
    if (risk < 0).any() or (risk > 1).any() or torch.isnan(risk).any():
        raise ValueError("`gibbs_risk` must lie in [0, 1].")
    if (kl < 0).any() or torch.isnan(kl).any():
        raise ValueError("`kl` must be >= 0.")
    budget = (kl + math.log(2 * math.sqrt(num_samples) / delta)) / num_samples
    risk, budget = torch.broadcast_tensors(risk, budget)
    bound = risk + torch.sqrt(budget / 2) if kind == "hoeffding" else kl_inverse(risk, budget)
    return float(bound) if is_scalar else bound


def monte_carlo_risk_bound(mean_risk, num_draws: int, delta: float):
    r"""Upper bound on a Gibbs risk `r(Q)` from the mean `mean_risk` of the empirical risks of `num_draws` i.i.d.
    draws `h ~ Q` (Langford-Caruana sample convergence): with probability `>= 1 - delta` over the draws,
    `r(Q) <= kl^-1(mean_risk, ln(1 / delta) / num_draws)`."""
    from ..pipelines.certified_transfer.certificate import kl_inverse

    check_positive_int("num_draws", num_draws)
    if not 0 < delta < 1:
        raise ValueError(f"`delta` must be in (0, 1), got {delta!r}.")
    bound = kl_inverse(mean_risk, math.log(1 / delta) / num_draws)
    return float(bound) if not isinstance(mean_risk, torch.Tensor) else bound


PRIOR_SIGMAS = tuple(float(s) for s in torch.logspace(-3, 0, 8, dtype=torch.float64))


@torch.no_grad()
def sgd_pac_bayes_bound(
    proxy: DigitsLoRAProxy,
    fitted: torch.Tensor,
    init: torch.Tensor,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    classes: torch.Tensor,
    generator: torch.Generator,
    delta: float = 0.05,
    prior_sigmas: Sequence[float] = PRIOR_SIGMAS,
    num_select_draws: int = 50,
    num_draws: int = 500,
    mc_delta_fraction: float = 0.2,
    kind: str = "hoeffding",
) -> dict:
    r"""
    The honest PAC-Bayes bound of SGD-fitted LoRA adapters, one per task: a Gaussian posterior
    `Q = N(fitted, sigma^2 I)` around each SGD solution, the prior `P = N(init, sigma^2 I)` centred at the adapter's
    (data-independent) initialisation, the best `sigma` of the grid `prior_sigmas` paid for by a union bound.

    The failure probability `delta` is split: `(1 - mc_delta_fraction) delta / G` for the PAC-Bayes bound of each of
    the `G` prior scales, and `mc_delta_fraction * delta` for the Monte Carlo estimate of the chosen posterior's
    Gibbs risk. `sigma` is picked by the bound computed from `num_select_draws` draws; the chosen posterior's Gibbs
    risk is then re-estimated from `num_draws` fresh draws (independent of the choice, so one Monte Carlo bound
    suffices) and bounded by [`monte_carlo_risk_bound`]. The bound is on the Gibbs classifier `Q` (`posterior_draws`
    returns draws from it, for checking the bound on held-out data), which is how PAC-Bayes certifies a continuously
    trained network (Dziugaite & Roy, 2017).

    Args:
        fitted, init (`torch.Tensor` of shape `(T, dim)`): the SGD solutions and their initialisations.
        hidden (`torch.Tensor` of shape `(T, n, 64, 4, 4)`), targets (`(T, n)`), classes (`(T, K)`): the support sets.
        generator (`torch.Generator`): the posterior draws.

    Returns:
        `dict` with `bound` `(T,)` (of `kind`), `kl_bound` (or `hoeffding_bound`, the other form for the same
        posterior) `(T,)`, `sigma` `(T,)` (the chosen scale), `gibbs_risk` `(T,)` (the Monte Carlo mean of the final
        draws), `kl` `(T,)` (`KL(Q || P)`) and `posterior_draws(num, generator)` -> `(T, num, dim)`.
    """
    if not 0 < mc_delta_fraction < 1:
        raise ValueError(f"`mc_delta_fraction` must be in (0, 1), got {mc_delta_fraction!r}.")
    if len(prior_sigmas) < 1 or min(prior_sigmas) <= 0:
        raise ValueError(f"`prior_sigmas` must be a non-empty list of positive scales, got {prior_sigmas!r}.")
    num, n = targets.shape
    delta_pb = (1 - mc_delta_fraction) * delta / len(prior_sigmas)
    delta_mc = mc_delta_fraction * delta

    def gibbs_risks(sigma, draws):  # (T,) Monte Carlo mean support risk of N(fitted, sigma^2 I)
        out = torch.empty(num)
        for t in range(num):
            noise = torch.randn(draws, fitted.shape[1], generator=generator)
            out[t] = proxy.risks(fitted[t] + sigma * noise, hidden[t], targets[t], classes[t]).mean()
        return out

    candidates = []
    for sigma in prior_sigmas:
        kl = isotropic_gaussian_kl(fitted, init, sigma, sigma)
        risk = monte_carlo_risk_bound(gibbs_risks(sigma, num_select_draws).double(), num_select_draws, delta_mc)
        candidates.append(pac_bayes_bound(risk, n, kl, delta_pb, kind))
    choice = torch.stack(candidates).argmin(0)  # (T,)
    sigma = torch.tensor(prior_sigmas, dtype=torch.float64)[choice]
    final = torch.empty(num, dtype=torch.float64)
    for t in range(num):
        noise = torch.randn(num_draws, fitted.shape[1], generator=generator)
        final[t] = proxy.risks(fitted[t] + float(sigma[t]) * noise, hidden[t], targets[t], classes[t]).mean()
    kl = torch.stack([isotropic_gaussian_kl(fitted[t], init[t], float(sigma[t]), float(sigma[t])) for t in range(num)])
    gibbs_upper = monte_carlo_risk_bound(final, num_draws, delta_mc)
    bound = pac_bayes_bound(gibbs_upper, n, kl, delta_pb, kind)
    other = "kl" if kind == "hoeffding" else "hoeffding"
    # the same posterior bounded by the other form (valid too: sigma's choice is paid for by the union bound)
    other_bound = pac_bayes_bound(gibbs_upper, n, kl, delta_pb, other)

    def posterior_draws(count: int, draw_generator: torch.Generator) -> torch.Tensor:
        noise = torch.randn(num, count, fitted.shape[1], generator=draw_generator)
        return fitted[:, None] + sigma[:, None, None].float() * noise

    return {
        "bound": bound,
        f"{other}_bound": other_bound,
        "sigma": sigma,
        "gibbs_risk": final,
        "kl": kl,
        "posterior_draws": posterior_draws,
    }


def episode_classes(num_classes: int = 10, way: int = 5) -> list[tuple[int, ...]]:
    """All `way`-subsets of the digit classes, sorted (252 for 5 of 10)."""
    from itertools import combinations

    return list(combinations(range(num_classes), way))


def split_class_combinations(
    combinations: Sequence[tuple[int, ...]], heldout_fraction: float, generator: torch.Generator
) -> tuple[list, list]:
    """Split class combinations into upstream and held-out (downstream) ones, at random."""
    order = torch.randperm(len(combinations), generator=generator).tolist()
    cut = int(round(len(combinations) * heldout_fraction))
    return [combinations[i] for i in order[cut:]], [combinations[i] for i in order[:cut]]


def load_proxy(classifier_path: str) -> DigitsLoRAProxy:
    """The proxy over a saved `ConvImageClassifier` (e.g. `diffusers_ext/zoo/digits-classifier`), prototypes from
    the clean train split of the digits."""
    from ..data.digits import load_digits_images

    classifier = ConvImageClassifier.from_pretrained(classifier_path)
    images, labels = load_digits_images("train", resolution=classifier.config.sample_size)
    return DigitsLoRAProxy(classifier, images, labels)


def make_task(
    proxy: DigitsLoRAProxy, images, labels, classes: Sequence[int], domain, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One task's data: the images of `classes` shifted into `domain`, as `(hidden (n, 64, 4, 4), targets (n,))`
    with targets the positions in `classes`."""
    from ..data.digit_domains import apply_domain

    classes_t = torch.tensor(classes)
    keep = (labels[:, None] == classes_t[None]).any(1)
    shifted = apply_domain(images[keep], domain, generator)
    targets = (labels[keep][:, None] == classes_t[None]).float().argmax(1)
    return proxy.trunk(shifted), targets


def fit_upstream_adapters(
    proxy: DigitsLoRAProxy,
    num_tasks: int,
    seed: int = 0,
    steps: int = 100,
    lr: float = 0.05,
    batch_size: int = 64,
    examples_per_task: int = 300,
    group_size: int = 25,
) -> tuple[torch.Tensor, list[dict]]:
    """Fit one adapter per upstream task (a 5-way upstream class combination under an upstream domain, on the
    digits' train split): returns `(vectors (num_tasks, dim), tasks)` with each task's classes, domain and train
    accuracy."""
    from ..data.digit_domains import sample_domain
    from ..data.digits import load_digits_images

    images, labels = load_digits_images("train", resolution=proxy.classifier.config.sample_size)
    upstream_combinations, _ = split_class_combinations(episode_classes(), 0.3, torch.Generator().manual_seed(1234))
    generator = torch.Generator().manual_seed(seed)
    vectors, tasks = [], []
    for start in range(0, num_tasks, group_size):
        hidden, targets, classes = [], [], []
        for _ in range(min(group_size, num_tasks - start)):
            combination = upstream_combinations[
                int(torch.randint(len(upstream_combinations), (1,), generator=generator))
            ]
            domain = sample_domain(generator, "upstream")
            h, t = make_task(proxy, images, labels, combination, domain, generator)
            pick = torch.randperm(len(t), generator=generator)[:examples_per_task]
            hidden.append(h[pick])
            targets.append(t[pick])
            classes.append(torch.tensor(combination))
            tasks.append({"classes": list(combination), "domain": domain.to_dict()})
        hidden, targets, classes = torch.stack(hidden), torch.stack(targets), torch.stack(classes)
        fitted = proxy.fit(hidden, targets, classes, steps, lr, generator, batch_size=batch_size)
        with torch.no_grad():
            accuracy = (proxy.logits(fitted, hidden, classes).argmax(-1) == targets).float().mean(1)
        for offset, value in enumerate(accuracy.tolist()):
            tasks[start + offset]["train_accuracy"] = value
        vectors.append(fitted)
    return torch.cat(vectors), tasks
