"""Regenerate `fixtures/unlearning.json`: the training steps and dual updates of `shervinkhalafi/constrained_unlearning`
on a tiny Stable Diffusion UNet with LoRA, computed by the reference code on fixed inputs.

The reference is not part of this repository. Check it out locally and run

    python tests/parity/regenerate_unlearning.py --reference_repo PATH/constrained_unlearning

The reference holds three programs, none importable as a whole (argparse mains that download SD v1.4, CLIP and
BLIP from the Hub; wandb; CUDA), so the driver below runs each one's training lines on the package's tiny components:

1. `esd` — `concept_erasure_rohit/train_final.py`, one iteration of its training loop (from `optimizer.zero_grad()`
   to `optimizer.step()`) with `use_likelihood_ratio=0` (its default, so `ratio = 1`) and `erase_from` equal to the
   erased prompt: the frozen model's predictions at the erased, empty and "from" prompts, the loss
   `MSE(eps_theta(x_t, c_from), eps_from - negative_guidance * ratio * (eps_erase - eps_null))` with
   `negative_guidance = 2` (its default), `Adam`. The frozen model is the LoRA-trained UNet with its adapters
   disabled and the trained parameters are the LoRA adapters of `train.py` (rank 8, alpha 8, Gaussian init, on
   `to_q`, `to_k`, `to_v`, `to_out.0`) in place of `train_final.py`'s full `esd-x` cross-attention weights, so that
   the trained set is one the package can train too. The latent `x_t` is a seeded draw in place of the reference's
   partial DDIM run of its own model to the drawn timestep (`pipe(..., run_till_timestep=...)`; the package draws
   `x_t` from its on-policy pool instead), and the timesteps are those the loop draws with `random.seed(42)`.
2. `likelihood_rl` — `train.py`'s epoch loop with the reference's own `my_utils.sample_loop` (DDIM, eta 0.5, guidance
   7.5, with log-probabilities and the per-step KL to the adapter-disabled model, gradients on) and
   `my_utils.compute_likelihood` (with adapters disabled), then `loss = lam * mean(rewards * log_probs) + mean(KL)`,
   `clip_grad_norm_(1.0)`, `AdamW(weight_decay=0.01)` with the cosine warm-up schedule, and the dual update
   `lam <- max(lam + lr_dual * (mean reward - b), 0)`. Left out: the evaluations (CLIP, FID, images), which do not
   change the weights; the driver seeds the global RNG at each epoch's start instead (the reference's evaluations
   consume it).
3. `dual_kl` — the notebook's (`superdiff_unlearning.ipynb`) `dual_step` for its KL constraints, executed from the
   notebook's cell source on a seeded sequence of KL estimates.

Shims (CPU, no extra packages): `wandb` and `cleanfid` are stubbed when missing (only evaluation uses them); the
reference's `accelerator` argument is a stand-in with `.device = cpu`.
"""

import argparse
import ast
import json
import random
import sys
import types
from pathlib import Path

import torch
from diffusers import StableDiffusionPipeline
from parity_utils import reference_commit
from peft import LoraConfig

from diffusers_ext.models.tiny_components import get_tiny_sd_components


FIXTURE = Path(__file__).parent / "fixtures" / "unlearning.json"
PROMPT = "a photo of a cat"
LATENT_SHAPE = (1, 4, 16, 16)
LORA_SEED = 5
NUM_STEPS = 3

# 1. esd (train_final.py's defaults: negative_guidance 2, num_inference_steps 50, training_seed 42, Adam betas)
ESD = {"negative_guidance": 2.0, "learning_rate": 1e-3, "num_inference_steps": 50, "training_seed": 42}
# 2. likelihood_rl (train.py's options; b and lr_dual sized for the tiny model's rewards)
LIKELIHOOD_RL = {
    "reward_type": "log_likelihood",
    "batch_size": 2,
    "num_inference_steps": 4,
    "n_noise_samples": 2,
    "lr": 1e-3,
    "lamb_init": 0.2,
    "lr_dual": 1.0,
    "b": 8.8,
    "num_epochs": NUM_STEPS,
    "seed": 21,
}
# 3. dual_kl (the notebook's dual step: lr_dual 0.1, level b)
DUAL_KL = {"lr_dual": 0.1, "b": 2.0, "mu_init": 0.1, "num_steps": 8, "seed": 31}


def lora_config() -> LoraConfig:
    return LoraConfig(
        r=8, lora_alpha=8, init_lora_weights="gaussian", target_modules=["to_q", "to_k", "to_v", "to_out.0"]
    )


def build_pipeline() -> StableDiffusionPipeline:
    """The tiny SD pipeline (weights seeded; DDIM scheduler with Stable Diffusion's configuration)."""
    return StableDiffusionPipeline(**get_tiny_sd_components(seed=0))


def add_lora(unet) -> None:
    """LoRA as `train.py` adds it, with a seeded Gaussian initialisation."""
    unet.requires_grad_(False)
    torch.manual_seed(LORA_SEED)
    unet.add_adapter(lora_config())


def esd_latent(step: int) -> torch.Tensor:
    return torch.randn(LATENT_SHAPE, generator=torch.Generator().manual_seed(100 + step))


def esd_timesteps(scheduler) -> list[int]:
    """The timesteps `train_final.py` trains at: `timesteps[random.randint(0, n - 1)]` per iteration, after
    `random.seed(training_seed)` (the loop also draws a sampling seed per iteration)."""
    scheduler.set_timesteps(ESD["num_inference_steps"])
    rng = random.Random(ESD["training_seed"])
    out = []
    for _ in range(NUM_STEPS):
        index = rng.randint(0, ESD["num_inference_steps"] - 1)
        rng.randint(0, 2**15)
        out.append(int(scheduler.timesteps[index]))
    return out


def kl_estimates() -> list[float]:
    """The dual_kl section's KL estimates: uniform in [0, 3b) (the constraint holds two times in three, so the dual
    variable drifts down to its projection at 0)."""
    generator = torch.Generator().manual_seed(DUAL_KL["seed"])
    return (torch.rand(DUAL_KL["num_steps"], generator=generator) * 3 * DUAL_KL["b"]).tolist()


def lora_parameters(unet) -> list[torch.Tensor]:
    return [p for p in unet.parameters() if p.requires_grad]


def probe(unet) -> torch.Tensor:
    """A small trained tensor to compare elementwise: the LoRA `B` of the first cross-attention key projection."""
    return dict(unet.named_parameters())[
        "down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.lora_B.default.weight"
    ]


# ---------------------------------------------------------------------------------------------------------------
# Reference side (needs --reference_repo)
# ---------------------------------------------------------------------------------------------------------------


def _values(tensor: torch.Tensor) -> list:
    return tensor.detach().double().flatten().tolist()


def _grad_norm(parameters) -> float:
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None])).item()


def _load_my_utils(repo: Path):
    for name in ("wandb", "cleanfid"):
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            module.fid = None
            sys.modules[name] = module
    sys.path.insert(0, str(repo))
    import my_utils

    return my_utils


def _notebook_function(repo: Path, name: str):
    cells = json.loads((repo / "superdiff_unlearning.ipynb").read_text())["cells"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and f"def {name}(" in source:
            (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name]
            namespace = {"torch": torch}
            exec(compile(ast.Module(body=[node], type_ignores=[]), "superdiff_unlearning.ipynb", "exec"), namespace)
            return namespace[name]
    raise LookupError(f"no cell of the notebook defines {name}")


def run_esd(my_utils) -> dict:
    accelerator = types.SimpleNamespace(device=torch.device("cpu"))
    pipe = build_pipeline()
    unet = pipe.unet
    with torch.no_grad():
        erase_states = my_utils.get_text_embedding([PROMPT], pipe.tokenizer, pipe.text_encoder, accelerator)
        null_states = my_utils.get_text_embedding([""], pipe.tokenizer, pipe.text_encoder, accelerator)
    from_states = erase_states
    add_lora(unet)
    params = lora_parameters(unet)
    optimizer = torch.optim.Adam(params, lr=ESD["learning_rate"], betas=(0.9, 0.999))
    mse = torch.nn.MSELoss()
    timesteps = esd_timesteps(pipe.scheduler)
    steps = []
    initial_lora_sum = sum(p.double().sum().item() for p in params)
    for iteration in range(NUM_STEPS):
        optimizer.zero_grad()
        xt, t = esd_latent(iteration), torch.tensor(timesteps[iteration])
        with torch.no_grad():
            unet.disable_adapters()
            eps_erase = unet(xt, t, encoder_hidden_states=erase_states, return_dict=False)[0]
            eps_null = unet(xt, t, encoder_hidden_states=null_states, return_dict=False)[0]
            eps_from = unet(xt, t, encoder_hidden_states=from_states, return_dict=False)[0]
            unet.enable_adapters()
        eps_trained = unet(xt, t, encoder_hidden_states=from_states, return_dict=False)[0]
        ratio = 1
        target = eps_from - (ESD["negative_guidance"] * ratio * (eps_erase - eps_null))
        loss = mse(eps_trained, target)
        loss.backward()
        record = {"timestep": timesteps[iteration], "loss": loss.item(), "grad_norm": _grad_norm(params)}
        record["probe_grad"] = _values(probe(unet).grad)
        optimizer.step()
        record["probe"] = _values(probe(unet))
        record["lora_sum"] = sum(p.double().sum().item() for p in params)
        steps.append(record)
    return {"initial_lora_sum": initial_lora_sum, "steps": steps}


def run_likelihood_rl(my_utils) -> dict:
    from transformers import get_cosine_schedule_with_warmup

    options = LIKELIHOOD_RL
    accelerator = types.SimpleNamespace(device=torch.device("cpu"))
    pipe = build_pipeline()
    unet, tokenizer, text_encoder = pipe.unet, pipe.tokenizer, pipe.text_encoder
    with torch.no_grad():
        prompt_states = my_utils.get_text_embedding([PROMPT], tokenizer, text_encoder, accelerator)
        empty_states = my_utils.get_text_embedding([""], tokenizer, text_encoder, accelerator)
    lam = torch.tensor(options["lamb_init"], requires_grad=False)
    b = torch.tensor(options["b"], requires_grad=False)
    unet.train()
    add_lora(unet)
    trained = lora_parameters(unet)
    scheduler = my_utils.my_DDIMScheduler.from_config(pipe.scheduler.config)
    optimizer = torch.optim.AdamW(trained, lr=options["lr"], weight_decay=0.01)
    lr_scheduler = get_cosine_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=10, num_training_steps=options["num_epochs"]
    )
    epochs = []
    for epoch in range(options["num_epochs"]):
        torch.manual_seed(options["seed"] + epoch)
        log_probs, kls, samples = my_utils.sample_loop(
            accelerator,
            scheduler,
            unet,
            None,
            tokenizer,
            text_encoder,
            batch_size=options["batch_size"],
            with_log_prob=True,
            with_KL=True,
            num_inference_steps=options["num_inference_steps"],
            grad=True,
            precomputed_text_embeddings=prompt_states,
            precomputed_uncond_embeddings=empty_states,
        )
        with torch.no_grad():
            unet.eval()
            unet.disable_adapters()
            rewards = my_utils.compute_likelihood(
                accelerator,
                scheduler,
                unet,
                None,
                tokenizer,
                text_encoder,
                samples,
                batch_size=options["batch_size"],
                precomputed_text_embeddings=prompt_states,
                precomputed_uncond_embeddings=empty_states,
                num_inference_steps=options["num_inference_steps"],
                n_noise_samples=options["n_noise_samples"],
            )
            if options["reward_type"] == "likelihood":
                rewards = 0.001 * torch.exp(rewards)
            unet.enable_adapters()
            unet.train()
        r = (rewards * log_probs).mean()
        KL = kls.mean()
        loss = lam * r + KL
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(trained, max_norm=1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        mean_reward = rewards.mean().item()
        lam = lam + options["lr_dual"] * (mean_reward - b)
        if lam < 0.0:
            lam = 0.0 * lam
        epochs.append(
            {
                "loss": loss.item(),
                "KL": KL.item(),
                "reward_mean": mean_reward,
                "log_prob_mean": log_probs.mean().item(),
                "grad_norm": float(grad_norm),
                "lambda": float(lam),
            }
        )
    return {"epochs": epochs}


def run_dual_kl(repo: Path) -> dict:
    dual_step = _notebook_function(repo, "dual_step")
    mu = torch.tensor([DUAL_KL["mu_init"]])
    trajectory = []
    for kl in kl_estimates():
        mu = dual_step(DUAL_KL["lr_dual"], [kl], mu, torch.tensor([DUAL_KL["b"]]))
        trajectory.append(mu.item())
    return {"kl_estimates": kl_estimates(), "mu": trajectory}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference_repo",
        type=Path,
        required=True,
        help="A checked-out copy of shervinkhalafi/constrained_unlearning.",
    )
    parser.add_argument("--output", type=Path, default=FIXTURE, help="Where to write the fixture.")
    args = parser.parse_args(argv)
    repo = args.reference_repo
    commit = reference_commit(repo)
    my_utils = _load_my_utils(repo)
    fixture = {
        "reference": "shervinkhalafi/constrained_unlearning",
        "commit": commit,
        "config": {
            "prompt": PROMPT,
            "latent_shape": list(LATENT_SHAPE),
            "lora_seed": LORA_SEED,
            "num_steps": NUM_STEPS,
            "esd": ESD,
            "likelihood_rl": LIKELIHOOD_RL,
            "dual_kl": DUAL_KL,
        },
        "esd": run_esd(my_utils),
        "likelihood_rl": run_likelihood_rl(my_utils),
        "dual_kl": run_dual_kl(repo),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes) from {fixture['reference']}@{fixture['commit']}")


if __name__ == "__main__":
    main()
