"""AdapterVectorizer: a peft adapter's state dict <-> one flat vector, and its per-coordinate standardisation."""

from collections.abc import Mapping, Sequence

import torch

from ...utils import public


@public
class AdapterVectorizer:
    r"""
    Flatten a peft adapter (the tensors of `peft.get_peft_model_state_dict`) into one vector and back.

    The layout (tensor names, shapes, order) is fixed at construction, so `to_state_dict(vectorize(sd))` returns the
    same tensors bit for bit. `fit` learns a per-coordinate mean and standard deviation over a set of adapter
    vectors (the upstream adapters), and `standardize` / `destandardize` map between raw vectors and the standardised
    space a [`ParameterDiffusionModel`] is trained in.

    Args:
        parameter_names (`Sequence[str]`): the state dict keys, in vector order.
        parameter_shapes (`Sequence[Sequence[int]]`): each key's tensor shape.
        mean (`torch.Tensor` of shape `(dim,)`, *optional*): per-coordinate mean (default 0).
        std (`torch.Tensor` of shape `(dim,)`, *optional*): per-coordinate standard deviation (default 1).
    """

    def __init__(
        self,
        parameter_names: Sequence[str],
        parameter_shapes: Sequence[Sequence[int]],
        mean: torch.Tensor | None = None,
        std: torch.Tensor | None = None,
    ):
        names, shapes = list(parameter_names), [tuple(int(s) for s in shape) for shape in parameter_shapes]
        if not names or len(names) != len(shapes) or len(set(names)) != len(names):
            raise ValueError(
                f"`parameter_names` ({len(names)} unique names expected) and `parameter_shapes` ({len(shapes)}) must "
                "be non-empty, of equal length, and the names distinct."
            )
        self.parameter_names, self.parameter_shapes = names, shapes
        self.sizes = [int(torch.Size(shape).numel()) for shape in shapes]
        self.dim = sum(self.sizes)
        self.mean = torch.zeros(self.dim) if mean is None else self._check_vector("mean", mean)
        self.std = torch.ones(self.dim) if std is None else self._check_vector("std", std)
        if (self.std <= 0).any():
            raise ValueError("`std` must be positive in every coordinate.")

    def _check_vector(self, name: str, value) -> torch.Tensor:
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (self.dim,):
            raise ValueError(
                f"`{name}` must be a tensor of shape ({self.dim},), got {getattr(value, 'shape', value)}."
            )
        return value.detach().to(torch.float32).clone()

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor]) -> "AdapterVectorizer":
        """The layout of `state_dict` (e.g. `peft.get_peft_model_state_dict(model)`), keys in their sorted order."""
        names = sorted(state_dict)
        return cls(names, [tuple(state_dict[name].shape) for name in names])

    @classmethod
    def from_peft_model(cls, model: torch.nn.Module, adapter_name: str = "default") -> "AdapterVectorizer":
        """The layout of `model`'s adapter `adapter_name` (a `peft.PeftModel` or a model with peft layers)."""
        from peft import get_peft_model_state_dict

        return cls.from_state_dict(get_peft_model_state_dict(model, adapter_name=adapter_name))

    def vectorize(self, state_dict: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The raw flat vector of `state_dict`, shape `(dim,)` in the tensors' dtype (float32 by default)."""
        missing = [name for name in self.parameter_names if name not in state_dict]
        extra = [name for name in state_dict if name not in set(self.parameter_names)]
        if missing or extra:
            raise ValueError(f"`state_dict` does not match the layout: missing {missing[:5]}, unexpected {extra[:5]}.")
        parts = []
        for name, shape in zip(self.parameter_names, self.parameter_shapes):
            tensor = state_dict[name]
            if tuple(tensor.shape) != shape:
                raise ValueError(f"`state_dict[{name!r}]` has shape {tuple(tensor.shape)}; expected {shape}.")
            parts.append(tensor.detach().reshape(-1))
        return torch.cat(parts)

    def to_state_dict(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """The state dict of one raw vector of shape `(dim,)` (views reshaped into the layout's shapes)."""
        if not isinstance(vector, torch.Tensor) or tuple(vector.shape) != (self.dim,):
            raise ValueError(
                f"`vector` must be a tensor of shape ({self.dim},), got {getattr(vector, 'shape', vector)}."
            )
        chunks = torch.split(vector, self.sizes)
        return {
            name: chunk.reshape(shape)
            for name, shape, chunk in zip(self.parameter_names, self.parameter_shapes, chunks)
        }

    def load_into(self, model: torch.nn.Module, vector: torch.Tensor, adapter_name: str = "default") -> None:
        """Write one raw vector into `model`'s adapter (`peft.set_peft_model_state_dict`)."""
        from peft import set_peft_model_state_dict

        state_dict = {k: v.clone() for k, v in self.to_state_dict(vector).items()}
        result = set_peft_model_state_dict(model, state_dict, adapter_name=adapter_name)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"`vector`'s layout does not match `model`: unexpected keys {unexpected[:5]}.")

    def fit(self, vectors: torch.Tensor, min_std: float = 1e-6) -> "AdapterVectorizer":
        """Set the per-coordinate mean and standard deviation from raw vectors of shape `(num_adapters, dim)`."""
        if not isinstance(vectors, torch.Tensor) or vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(
                f"`vectors` must have shape (num_adapters, {self.dim}), got {getattr(vectors, 'shape', vectors)}."
            )
        if vectors.shape[0] < 2:
            raise ValueError(
                f"`vectors` needs at least 2 adapters to fit a standard deviation, got {vectors.shape[0]}."
            )
        vectors = vectors.detach().to(torch.float32)
        self.mean = vectors.mean(dim=0)
        self.std = vectors.std(dim=0).clamp_min(min_std)
        return self

    def standardize(self, vectors: torch.Tensor) -> torch.Tensor:
        """`(vectors - mean) / std`, shape `(..., dim)`."""
        return (vectors - self.mean.to(vectors)) / self.std.to(vectors)

    def destandardize(self, vectors: torch.Tensor) -> torch.Tensor:
        """`vectors * std + mean`, shape `(..., dim)`."""
        return vectors * self.std.to(vectors) + self.mean.to(vectors)

    def lora_pairs(self) -> list[tuple[int, int]]:
        """Indices `(a, b)` into the layout of each LoRA factor pair: a `...lora_A...` tensor of shape `(r, ...)` and
        the `...lora_B...` tensor of the same name, shape `(out, r, 1, ...)`."""
        pairs = []
        for a, name in enumerate(self.parameter_names):
            if "lora_A" not in name:
                continue
            partner = name.replace("lora_A", "lora_B")
            if partner not in self.parameter_names:
                raise ValueError(f"`{name}` has no `lora_B` partner `{partner}` in the layout.")
            b = self.parameter_names.index(partner)
            shape_a, shape_b = self.parameter_shapes[a], self.parameter_shapes[b]
            if len(shape_b) < 2 or shape_b[1] != shape_a[0] or any(s != 1 for s in shape_b[2:]):
                raise ValueError(f"`{partner}` of shape {shape_b} is not a LoRA up-projection of rank {shape_a[0]}.")
            pairs.append((a, b))
        return pairs

    def canonicalize_lora(self, vectors: torch.Tensor) -> torch.Tensor:
        r"""
        The canonical factorisation of every LoRA pair of raw vectors `(num, dim)`, returned in the same layout.

        A LoRA update `B A` is unchanged by `(B, A) -> (B G^{-1}, G A)` for any invertible `G` (`r x r`), so the raw
        factors of one update are far from unique (peft starts `A` at random and `B` at zero, and `A` keeps much of
        its random start). This maps each pair to the factors of the product's SVD `B A = U S V^T` with the singular
        values split evenly: `B' = U S^{1/2}`, `A' = S^{1/2} V^T`, each singular direction's sign fixed so that the
        largest-magnitude entry of its column of `U` is positive. The product, and so the adapted model, is unchanged
        (up to rounding); every factorisation of one product maps to the same vector (for distinct nonzero singular
        values). Coordinates outside LoRA pairs are copied.
        """
        if not isinstance(vectors, torch.Tensor) or vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(
                f"`vectors` must have shape (num_adapters, {self.dim}), got {getattr(vectors, 'shape', vectors)}."
            )
        pairs = self.lora_pairs()
        if not pairs:
            raise ValueError("the layout holds no `lora_A` / `lora_B` pair.")
        dtype = vectors.dtype
        chunks = list(torch.split(vectors.detach().to(torch.float64), self.sizes, dim=1))
        for a, b in pairs:
            rank, num = self.parameter_shapes[a][0], vectors.shape[0]
            lora_a = chunks[a].reshape(num, rank, -1)  # (N, r, in)
            lora_b = chunks[b].reshape(num, -1, rank)  # (N, out, r)
            q_b, r_b = torch.linalg.qr(lora_b)  # B = Qb Rb
            q_a, r_a = torch.linalg.qr(lora_a.transpose(1, 2))  # A^T = Qa Ra
            u, s, vh = torch.linalg.svd(r_b @ r_a.transpose(1, 2))  # B A = (Qb u) diag(s) (Qa vh^T)^T
            left, right = q_b @ u, q_a @ vh.transpose(1, 2)  # (N, out, r), (N, in, r)
            peak = left.abs().argmax(dim=1, keepdim=True)
            sign = torch.sign(torch.gather(left, 1, peak))
            sign[sign == 0] = 1
            root = s.sqrt()[:, None, :]
            chunks[b] = (left * sign * root).reshape(num, -1)
            chunks[a] = (right * sign * root).transpose(1, 2).reshape(num, -1)
        return torch.cat(chunks, dim=1).to(dtype)
