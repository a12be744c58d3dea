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

        Returns:
            `torch.Tensor` of shape `(T, dim)`: the fitted raw adapter vectors.
        """
        num, n = targets.shape
        vectors = self.init_vectors(num, generator).requires_grad_(True)
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
