"""Regenerate `fixtures/ayt.json`: AYT's manifold feature distance, its normalised-gradient update, its ECT noise-level
curriculum and three of its ECT training steps, computed by the reference code (`1202kbs/AYT`) on fixed inputs.

The reference is not part of this repository. Check it out locally and run

    python tests/parity/regenerate_ayt.py --reference_repo PATH/AYT

What runs from the reference, and what the driver adds:

- The distance is the reference's own `VGG.distance` / `VGG.__get_diff__` (`src/ayt/classifiers.py`), called on a
  stand-in object whose `forward(x, return_feats=True)` returns the feature maps of the package's
  `AugmentationRegressor` (built by `build_feature_network`), so both sides measure with one feature network.
- The normalisation is the reference's `normalize` (`scripts/train_cm/train_ecm_ayt.py`), taken from the script's
  source with `ast` (the script's module level needs hydra, wandb and a GPU) and executed as written.
- The curriculum is the reference's `ContinuousLognormal` (`src/ayt/tdists.py`): `t_to_r_sigmoid` on a grid, and
  `sample` in the training steps.
- The pseudo-Huber CM loss is the reference's `PseudoHuber` (`src/ayt/losses.py`, `c_mult=0.0` as in
  `configs/loss/pseudohuber.yaml`).
- The training step reproduces the body of the reference's training loop (`train_ecm_ayt.py`, the lines from
  "Sample data and noise" to `optimizer.zero_grad()`): `x_r = x0 + r eps`, `x_t = x0 + t eps`, the target `D(x_r, r)`
  without gradient and `x0` where `r <= 0`, `w = 1 / (t - r)`, the CM loss, the distance's gradient at a detached
  copy of `D(x_t, t)`, the proximal loss `mean(w / 2 ||D - sg(D - g)||^2)`, the choice `loss = prox` for
  `lmda1 > 1000` (the default 1e5), `RAdam`. The denoiser `D` is the package's `consistency_model_output` of a tiny
  `UNet2DModel` (the reference's EDM-preconditioned SongUNet and its CIFAR checkpoint are out of scope; both sides use
  one denoiser, so what is compared is the step, not the network).

Shims (CPU, no extra packages): `torch.Tensor.cuda` returns the tensor itself (the reference moves its constants with
`.cuda()`), and the imports the functions under test do not use are stubbed when missing: `einops` (ViT classifier),
`lpips` (the LPIPS loss), `wandb`.
"""

import argparse
import ast
import json
import sys
import types
from pathlib import Path

import torch
from diffusers import UNet2DModel
from parity_utils import reference_commit

from diffusers_ext import AugmentationRegressor
from diffusers_ext.losses.consistency import consistency_model_output


FIXTURE = Path(__file__).parent / "fixtures" / "ayt.json"
BATCH = 4
IMAGE_SHAPE = (1, 8, 8)
NUM_STEPS = 3
LEARNING_RATE = 1e-3
SIGMA_DATA, SIGMA_MIN = 0.5, 0.002
# Both sides compute in float64: in float32 the distance's gradient near its pseudo-Huber kink amplifies the CPU's
# summation order (conv_out gradient relative error 3.6e-5 between two x86 machines, 2.7e-5 between one and two threads)
DTYPE = torch.float64
# the reference's continuous log-normal (configs/tdist/continuouslognormal.yaml) with 4 stages over 400 iterations
CURRICULUM = {"mu": -1.1, "std": 2.0, "q": 2.0, "k": 8.0, "b": 1.0, "n_stages": 4, "n_train_iter": 400}
# the training steps' iterations (one per curriculum stage reached: r = 0 at first, then r > 0) and seeds; no drawn
# pair has an r in (0, sigma_min), where the package sets r to 0 (see the test's docstring)
STEP_ITERATIONS = (0, 200, 399)
STEP_SEEDS = (11, 12, 13)


def build_feature_network() -> AugmentationRegressor:
    torch.manual_seed(0)
    network = AugmentationRegressor(sample_size=8, block_out_channels=(4, 8), layers_per_block=1, num_labels=5)
    return network.to(DTYPE).eval()


def build_unet() -> UNet2DModel:
    torch.manual_seed(1)
    return UNet2DModel(
        sample_size=8,
        in_channels=1,
        out_channels=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D",) * 2,
        up_block_types=("UpBlock2D",) * 2,
        layers_per_block=1,
        norm_num_groups=4,
    ).to(DTYPE)


def build_images(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two image batches `(BATCH, 1, 8, 8)` in [-1, 1] (drawn in float32, returned in `DTYPE`): `x` and a nearby `y`."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(BATCH, *IMAGE_SHAPE, generator=generator) * 2 - 1
    y = (x + 0.3 * torch.randn(BATCH, *IMAGE_SHAPE, generator=generator)).clamp(-1, 1)
    return x.to(DTYPE), y.to(DTYPE)


def curriculum_grid() -> tuple[torch.Tensor, list[int]]:
    """Noise levels t (from below sigma_min to above sigma_max) and iterations (one per stage and past the end)."""
    t = torch.tensor([0.001, 0.003, 0.01, 0.05, 0.2, 0.5, 1.0, 2.0, 5.0, 20.0, 80.0, 150.0])
    return t, [0, 99, 100, 250, 399]


def step_noise(step: int, x0: torch.Tensor) -> torch.Tensor:
    """The noise of the `step`-th training step: `torch.randn_like(x0)` from the global RNG seeded with its seed, as
    the reference's loop draws it; the loop's noise levels are the next draws of the same global RNG."""
    torch.manual_seed(STEP_SEEDS[step])
    return torch.randn_like(x0)


def clean_batch() -> torch.Tensor:
    return build_images(7)[0]


def denoiser(unet: UNet2DModel):
    def call(x, sigma, **_):
        return consistency_model_output(unet, x, sigma, sigma_data=SIGMA_DATA, sigma_min=SIGMA_MIN)

    return call


# ---------------------------------------------------------------------------------------------------------------
# Reference side (needs --reference_repo)
# ---------------------------------------------------------------------------------------------------------------


def _install_shims() -> None:
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    for name in ("einops", "einops.layers", "einops.layers.torch", "lpips", "wandb"):
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            module.rearrange = module.Rearrange = module.LPIPS = None
            sys.modules[name] = module


def _load_reference(repo: Path):
    _install_shims()
    sys.path.insert(0, str(repo / "src"))
    from ayt import classifiers, losses, tdists

    source = (repo / "scripts" / "train_cm" / "train_ecm_ayt.py").read_text()
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "normalize"]
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "train_ecm_ayt.py", "exec"), namespace)
    return classifiers, losses, tdists, namespace["normalize"]


class _SharedFeatures:
    """The reference's VGG distance methods bound to the package's feature network."""

    def __init__(self, classifiers, network):
        self.network = network
        self.distance = types.MethodType(classifiers.VGG.distance, self)
        self.__get_diff__ = types.MethodType(classifiers.VGG.__get_diff__, self)

    def forward(self, x, return_feats=False):
        return list(self.network(x).feature_maps)


def _values(tensor: torch.Tensor) -> list:
    return tensor.detach().double().flatten().tolist()


def run_reference(repo: Path) -> dict:
    classifiers, losses, tdists, normalize = _load_reference(repo)
    features = _SharedFeatures(classifiers, build_feature_network())
    result = {}

    x, y = build_images(3)
    result["distance"] = _values(features.distance(x, y))
    point = x.clone().requires_grad_(True)
    features.distance(point, y, reduce_mean=True).backward()
    result["normalized_gradient"] = _values(normalize(point.grad.detach().clone()))

    curriculum = tdists.ContinuousLognormal(adj="sigmoid", **CURRICULUM)
    t, iterations = curriculum_grid()
    result["curriculum"] = [{"iteration": i, "r": _values(curriculum.t_to_r_sigmoid(t, i))} for i in iterations]

    # The training loop's body (see the module docstring), NUM_STEPS times.
    unet = build_unet()
    unet.train()
    model = denoiser(unet)
    optimizer = torch.optim.RAdam(params=unet.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    criterion = losses.PseudoHuber(c_mult=0.0)
    x0 = clean_batch()
    steps = []
    for iteration in range(NUM_STEPS):
        eps = step_noise(iteration, x0)
        r, t = curriculum.sample(x0.shape[0], STEP_ITERATIONS[iteration])  # float32, stored as drawn
        steps.append({"iteration": STEP_ITERATIONS[iteration], "t": _values(t), "r": _values(r)})
        r, t = r.to(DTYPE), t.to(DTYPE)
        x_r, x_t = x0 + eps * r.reshape(-1, 1, 1, 1), x0 + eps * t.reshape(-1, 1, 1, 1)
        with torch.no_grad():
            target = model(x_r, r)
            target[r <= 0.0] = x0[r <= 0.0]
        prediction = model(x_t, t)
        weight = 1 / (t - r)
        cm_loss = criterion(prediction, target, w=weight)[0]
        point = prediction.detach().clone().requires_grad_(True)
        mean_distance = features.distance(point, target, reduce_mean=True)
        mean_distance.backward()
        direction = normalize(point.grad.detach().clone())
        prox = (weight * 0.5 * (prediction - (prediction - direction).detach()).square().sum(dim=(1, 2, 3))).mean()
        loss = prox  # lmda1 = 1e5 > 1000
        loss.backward()
        grads = [p.grad for p in unet.parameters()]
        steps[-1].update(
            {
                "cm_loss": cm_loss.item(),
                "distance_mean": mean_distance.item(),
                "loss": loss.item(),
                "grad_norm": torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item(),
                "conv_out_weight_grad": _values(unet.conv_out.weight.grad),
            }
        )
        optimizer.step()
        optimizer.zero_grad()
        steps[-1]["conv_out_weight"] = _values(unet.conv_out.weight)
        steps[-1]["parameter_sum"] = sum(p.double().sum().item() for p in unet.parameters())
    result["steps"] = steps
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference_repo", type=Path, required=True, help="A checked-out copy of 1202kbs/AYT.")
    parser.add_argument("--output", type=Path, default=FIXTURE, help="Where to write the fixture.")
    args = parser.parse_args(argv)
    commit = reference_commit(args.reference_repo)
    fixture = {
        "reference": "1202kbs/AYT",
        "commit": commit,
        "config": {
            "batch": BATCH,
            "image_shape": list(IMAGE_SHAPE),
            "num_steps": NUM_STEPS,
            "learning_rate": LEARNING_RATE,
            "sigma_data": SIGMA_DATA,
            "sigma_min": SIGMA_MIN,
            "curriculum": CURRICULUM,
            "step_seeds": list(STEP_SEEDS),
            "step_iterations": list(STEP_ITERATIONS),
            "lmda1": 1e5,
            "pseudo_huber_c_mult": 0.0,
            "dtype": str(DTYPE).removeprefix("torch."),
        },
        **run_reference(args.reference_repo),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes) from {fixture['reference']}@{commit}")


if __name__ == "__main__":
    main()
