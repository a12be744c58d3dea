#!/usr/bin/env python
"""Cost at realistic shapes, random weights: the pack's decoders and pipelines against plain loops of the same work.

    python benchmarks/scale/scale.py                      # every part at the issue's shapes
    python benchmarks/scale/scale.py --parts dlm --gen_length 64 --steps 64 --repetitions 2   # a smaller run

Speed and memory do not need trained weights, so every model here is built from a config at the width its users run
(or a stated fraction of it) and initialised at random. Each part runs the pack's code and a baseline doing the same
model work in one process, alternating, on the same inputs and seeds; ratios are taken within one run (min and
median over `--repetitions`). These are CPU figures of this machine, not accelerator figures.

Parts:
- `dlm`: a LLaDA-shaped bidirectional Llama (hidden 512, 8 layers, vocabulary 32k; 128-token prompt, 256 generated,
  blocks of 32, one token per step). Greedy low-confidence decoding by `DiffusionLMPipeline` + `SOARScheduler
  (max_beam_size=1)` against the LLaDA `generate` rule written out here as a plain loop (argmax, softmax, top-k
  commit per block), and, with `--llada_repo PATH` (a local copy of the public LLaDA code, never committed), its own
  `generate`. The tokens must agree. Also the time outside the model forward, and SOAR at beam 4: the cost outside
  the forward per beam row per step.
- `dnd`: Divide-and-Denoise with 3 experts (SD1.5's UNet block structure at a fifth of its width), 64x64 latents,
  against what a user would run instead: 3 plain `StableDiffusionPipeline` calls (one per expert and prompt, the same
  steps, size, guidance scale 7.5 and `output_type="latent"`), the two alternating in one process (the order swapped
  every repetition).
- `dirp`: one DIRP iteration (the differentiable DDIM round trip and its backward) against a plain inversion +
  reconstruction without gradients, at 64x64 latents with an SD-shaped UNet and a VAE of SD's block structure (4
  levels, 2 ResNet layers per block, a mid-block with attention) at reduced width: peak memory
  (torch's CPU allocator events, `diffusers_ext.metrics.peak_memory_bytes`) and time.
- `grpo`: `DiffusionGRPOTrainer` steps (LoRA, classifier-free guidance 4.5) on an SD3-format pipeline whose
  transformer has 4 joint blocks of width 192 (by default) at 32x32 latents, random weights. The trainer's own
  `time/overhead_fraction` (`--grpo_layers`, `--grpo_width`) against an outside measurement of the same step: the
  benchmark's own clocks around every transformer, text-encoder and VAE call, backward, optimizer step, gradient
  clipping and reward call (module hooks and wrappers, none of the trainer's timers), outside overhead = 1 - their
  sum / step time. For context, every model call is also recorded and replayed bare after the step (forwards, plus a
  backward for the calls made with gradients): 1 - replay time / step time.
- `sd3_attention`: one SD3.5-medium joint attention layer (hidden 1536, 24 heads) at `--sd3_image_size` px (2304
  image tokens at 768 px) and 333 text tokens: Divide-and-Denoise's recording processor against diffusers'
  `JointAttnProcessor2_0`, peak memory and time of a forward (no targets: the issue measured the earlier explicit
  joint softmax at 5.5x the memory and 2.6x the time).

Writes `benchmarks/scale/results/scale.json` and `scale.md`.
"""

import argparse
import os
import statistics
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
PARTS = ("dlm", "dnd", "dirp", "grpo", "sd3_attention")

# Targets of the performance issue (issue 28).
DLM_WALL_RATIO_TARGET = 0.85  # package / LLaDA `generate`, greedy low-confidence
DLM_OUTSIDE_FRACTION_TARGET = 0.10  # time outside the model forward / decode time
SOAR_OUTSIDE_MS_TARGET = 10.0  # per beam row per step, beam 4
DND_RATIO_TARGET = 1.03  # D&D wall / the same number of plain StableDiffusionPipeline calls
DIRP_MEMORY_RATIO_TARGET = 3.0  # one iteration / plain inversion + reconstruction
DIRP_TIME_RATIO_TARGET = 3.5
GRPO_OVERHEAD_AGREEMENT_TARGET = 0.02  # |trainer's overhead fraction - outside measurement|


def parse_args(argv=None):
    from diffusers_ext.evaluation.reporting import add_from_results_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--repetitions", type=int, default=3, help="Alternating repetitions of every comparison.")
    parser.add_argument("--seed", type=int, default=0)
    # dlm
    parser.add_argument("--hidden_size", type=int, default=512)
    parser.add_argument("--num_layers", type=int, default=8)
    parser.add_argument("--vocab_size", type=int, default=32000)
    parser.add_argument("--prompt_length", type=int, default=128)
    parser.add_argument("--gen_length", type=int, default=256)
    parser.add_argument("--block_length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=256, help="Decoding steps (gen_length: one token per step).")
    parser.add_argument("--soar_steps", type=int, default=16, help="SOAR beam-4 steps timed (a prefix of a decode).")
    parser.add_argument("--llada_repo", default=None, help="A local copy of the LLaDA code; its generate() is timed.")
    # dnd / dirp
    parser.add_argument("--latent_size", type=int, default=64, help="Latent side of the dnd and dirp parts.")
    parser.add_argument("--width_fraction", type=float, default=0.2, help="UNet width as a fraction of SD1.5's.")
    parser.add_argument("--dnd_steps", type=int, default=4, help="Divide-and-Denoise denoising steps.")
    parser.add_argument("--dirp_inversion_steps", type=int, default=4, help="DDIM inversion steps of the dirp part.")
    parser.add_argument("--grpo_steps", type=int, default=10, help="Denoising steps of the grpo part's rollouts.")
    parser.add_argument(
        "--grpo_repetitions",
        type=int,
        default=6,
        help="Trainer steps of the grpo part, each replayed once; its agreement is read from their medians.",
    )
    parser.add_argument("--grpo_layers", type=int, default=4, help="Joint blocks of the grpo part's transformer.")
    parser.add_argument("--grpo_width", type=int, default=192, help="Its width (a multiple of 32, the head size).")
    parser.add_argument("--sd3_image_size", type=int, default=768, help="Image side of the sd3_attention part.")
    parser.add_argument("--output_dir", default=RESULTS, help="Where the results' .json/.md go.")
    parser.add_argument(
        "--results_name",
        default=None,
        help="Base name of the results files (e.g. scale_grpo for one part's run; default scale, with --from_results "
        "that file's own stem).",
    )
    add_from_results_argument(parser)
    args = parser.parse_args(argv)
    if args.results_name is None:
        args.results_name = os.path.splitext(os.path.basename(args.from_results))[0] if args.from_results else "scale"
    from diffusers_ext.utils import check_positive_int

    for name in ("repetitions", "hidden_size", "num_layers", "vocab_size", "prompt_length", "gen_length"):
        check_positive_int(name, getattr(args, name))
    for name in (
        "block_length",
        "steps",
        "soar_steps",
        "latent_size",
        "dnd_steps",
        "dirp_inversion_steps",
        "sd3_image_size",
        "grpo_steps",
        "grpo_repetitions",
        "grpo_layers",
        "grpo_width",
    ):
        check_positive_int(name, getattr(args, name))
    if args.gen_length % args.block_length or args.steps % (args.gen_length // args.block_length):
        parser.error(
            f"--gen_length {args.gen_length} must be a multiple of --block_length {args.block_length}, and --steps "
            f"{args.steps} a multiple of the number of blocks."
        )
    if args.grpo_width % 32:
        parser.error(f"--grpo_width must be a multiple of 32 (the head size), got {args.grpo_width}.")
    if not 0 < args.width_fraction <= 1:
        parser.error(f"--width_fraction must be in (0, 1], got {args.width_fraction}.")
    if args.llada_repo is not None and not os.path.isfile(os.path.join(args.llada_repo, "generate.py")):
        parser.error(f"--llada_repo {args.llada_repo!r} has no generate.py; expected a copy of the LLaDA repository.")
    return args


class ForwardTimer:
    """Wall-clock seconds spent inside `module.forward`, and the number of calls.

    The forward is wrapped on the instance rather than hooked: a forward hook on a diffusion LM makes the pipeline
    give it full logits (a hook may read them by position), which would time a different forward than users run."""

    def __init__(self, module):
        import functools

        self.seconds, self.calls = 0.0, 0
        self._module = module
        self._saved = module.__dict__.get("forward")
        forward = module.forward

        @functools.wraps(forward)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        module.forward = timed

    def reset(self):
        self.seconds, self.calls = 0.0, 0

    def remove(self):
        if self._saved is None:
            del self._module.forward
        else:
            self._module.forward = self._saved


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "all": values}


# ----------------------------------------------------------------------------------------------------------------
# dlm: greedy low-confidence decoding and SOAR at LLaDA's shape
# ----------------------------------------------------------------------------------------------------------------


def build_llada_shaped_lm(args):
    """A bidirectional Llama at the benchmark's shape (random weights), and the tiny tokenizer for its special ids."""
    import torch

    from diffusers_ext.models.bidirectional_llama import build_bidirectional_llama
    from diffusers_ext.models.tiny_tokenizers import get_tiny_lm_tokenizer

    tokenizer = get_tiny_lm_tokenizer()
    torch.manual_seed(args.seed)
    model = build_bidirectional_llama(
        tokenizer,
        max_length=args.prompt_length + args.gen_length,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=max(1, args.hidden_size // 64),
        intermediate_size=int(args.hidden_size * 8 / 3) // 64 * 64,
        vocab_size=args.vocab_size,
        tie_word_embeddings=False,
    ).eval()
    return model, tokenizer


def llada_generate_loop(model, prompt, steps: int, gen_length: int, block_length: int, mask_id: int):
    """LLaDA's `generate` rule at temperature 0 with low-confidence remasking, written as a plain loop.

    `prompt` `(1, P)`; returns `(1, P + gen_length)`. Per block, the masks are filled over `steps / blocks` steps with
    an even quota; each step commits the quota's most confident masked positions of the current block, confidence
    being the softmax probability of the argmax token (positions after the block excluded).
    """
    import torch
    import torch.nn.functional as F

    x = torch.cat([prompt, torch.full((1, gen_length), mask_id, dtype=prompt.dtype)], dim=1)
    prompt_length = prompt.shape[1]
    blocks = gen_length // block_length
    steps_per_block = steps // blocks
    for block in range(blocks):
        start = prompt_length + block * block_length
        end = start + block_length
        block_masks = (x[:, start:end] == mask_id).sum(dim=1)
        quota = torch.full((1, steps_per_block), int(block_masks) // steps_per_block, dtype=torch.long)
        quota[:, : int(block_masks) % steps_per_block] += 1
        for step in range(steps_per_block):
            masked = x == mask_id
            logits = model(x).logits
            x0 = logits.argmax(dim=-1)
            p = F.softmax(logits.float(), dim=-1)
            confidence = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
            confidence[:, end:] = -float("inf")
            x0 = torch.where(masked, x0, x)
            confidence = torch.where(masked, confidence, torch.tensor(-float("inf")))
            chosen = torch.topk(confidence[0], k=int(quota[0, step])).indices
            x[0, chosen] = x0[0, chosen]
    return x


def measure_dlm(args) -> dict:
    import torch

    from diffusers_ext import DiffusionLMPipeline, SOARScheduler

    model, tokenizer = build_llada_shaped_lm(args)
    mask_id = tokenizer.mask_token_id
    generator = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(6, min(args.vocab_size, 32000), (1, args.prompt_length), generator=generator)
    pipe = DiffusionLMPipeline(model, SOARScheduler(block_length=args.block_length, max_beam_size=1), tokenizer)
    pipe.set_progress_bar_config(disable=True)

    reference_generate = None
    if args.llada_repo is not None:
        sys.path.insert(0, args.llada_repo)
        from generate import generate as reference_generate  # the public LLaDA code, run from the given copy

    def ours():
        return pipe(
            input_ids=prompt,
            gen_length=args.gen_length,
            block_length=args.block_length,
            num_inference_steps=args.steps,
            eos_early_stop=False,
            output_type="seq",
        ).sequences

    def plain():
        return llada_generate_loop(model, prompt, args.steps, args.gen_length, args.block_length, mask_id)

    def reference():
        return reference_generate(
            model,
            prompt,
            steps=args.steps,
            gen_length=args.gen_length,
            block_length=args.block_length,
            temperature=0.0,
            remasking="low_confidence",
            mask_id=mask_id,
        )

    decoders = {"package": ours, "plain_loop": plain}
    if reference_generate is not None:
        decoders["llada_reference"] = reference
    timer = ForwardTimer(model)
    wall = {name: [] for name in decoders}
    inside = {name: [] for name in decoders}
    tokens = {}
    with torch.no_grad():
        for _ in range(args.repetitions):
            for name, fn in decoders.items():
                timer.reset()
                seconds, out = _timed(fn)
                wall[name].append(seconds)
                inside[name].append(timer.seconds)
                tokens[name] = out[:, -args.gen_length :].tolist()
    agree = {name: tokens[name] == tokens["package"] for name in decoders}

    # SOAR at beam 4: cost outside the forward per beam row per step, over a prefix of a decode.
    soar = DiffusionLMPipeline(model, SOARScheduler(block_length=args.block_length, max_beam_size=4), tokenizer)
    soar.set_progress_bar_config(disable=True)
    rows_steps, outside = [], []
    batch_sizes = []

    def count_rows(module, margs, kwargs):
        x = margs[0] if margs else kwargs["input_ids"]
        batch_sizes.append(x.shape[0])

    handle = model.register_forward_pre_hook(count_rows, with_kwargs=True)
    with torch.no_grad():
        for _ in range(args.repetitions):
            timer.reset()
            batch_sizes.clear()
            seconds, _ = _timed(
                lambda: soar(
                    input_ids=prompt,
                    gen_length=args.block_length,
                    block_length=args.block_length,
                    num_inference_steps=min(args.soar_steps, args.block_length),
                    eos_early_stop=False,
                    output_type="seq",
                )
            )
            rows_steps.append(sum(batch_sizes))
            outside.append((seconds - timer.seconds) / max(1, sum(batch_sizes)) * 1000)
    handle.remove()
    timer.remove()

    ratios = {name: [w / p for w, p in zip(wall[name], wall["package"])] for name in decoders}
    baseline = "llada_reference" if "llada_reference" in decoders else "plain_loop"
    return {
        "shape": {
            "hidden_size": args.hidden_size,
            "num_layers": args.num_layers,
            "vocab_size": args.vocab_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "prompt_length": args.prompt_length,
            "gen_length": args.gen_length,
            "block_length": args.block_length,
            "steps": args.steps,
        },
        "wall_seconds": {name: _spread(v) for name, v in wall.items()},
        "outside_forward_fraction": {
            name: _spread([1 - i / w for i, w in zip(inside[name], wall[name])]) for name in decoders
        },
        "package_over_baseline": _spread([1 / r for r in ratios[baseline]]),
        "baseline": baseline,
        "tokens_agree": agree,
        "soar_beam4": {"rows_times_steps": rows_steps, "outside_ms_per_row_step": _spread(outside)},
    }


# ----------------------------------------------------------------------------------------------------------------
# dnd and dirp: SD-shaped UNets at a fraction of the width
# ----------------------------------------------------------------------------------------------------------------


def _sd_unet(width_fraction: float, cross_attention_dim: int, seed: int):
    """SD1.5's UNet block structure (4 levels, 2 layers per block, cross-attention on three) at a fraction of the width."""
    import torch
    from diffusers import UNet2DConditionModel

    channels = [max(32, int(c * width_fraction) // 32 * 32) for c in (320, 640, 1280, 1280)]
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=64,
        in_channels=4,
        out_channels=4,
        layers_per_block=2,
        block_out_channels=channels,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        cross_attention_dim=cross_attention_dim,
        attention_head_dim=8,
        norm_num_groups=32,
    ).eval()


def _sd_pipelines(args, experts: int):
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextConfig, CLIPTextModel

    from diffusers_ext.models.tiny_tokenizers import get_tiny_clip_tokenizer

    tokenizer = get_tiny_clip_tokenizer()
    hidden = max(64, int(768 * args.width_fraction) // 32 * 32)
    torch.manual_seed(args.seed)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            intermediate_size=4 * hidden,
            num_hidden_layers=2,
            num_attention_heads=max(1, hidden // 64),
            max_position_embeddings=77,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).eval()
    vae_channels = [max(32, int(c * args.width_fraction) // 32 * 32) for c in (128, 256, 512, 512)]
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=vae_channels,
        layers_per_block=2,  # SD's VAE
        latent_channels=4,
        norm_num_groups=32,
        sample_size=args.latent_size * 8,
    ).eval()
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipes = []
    for k in range(experts):
        pipes.append(
            StableDiffusionPipeline(
                vae=vae,
                text_encoder=text_encoder,
                tokenizer=tokenizer,
                unet=_sd_unet(args.width_fraction, hidden, args.seed + k),
                scheduler=scheduler,
                safety_checker=None,
                feature_extractor=None,
                requires_safety_checker=False,
            )
        )
    return pipes


def measure_dnd(args) -> dict:
    import torch

    from diffusers_ext import DivideAndDenoisePipeline

    pipes = _sd_pipelines(args, experts=3)
    for p in pipes:
        p.set_progress_bar_config(disable=True)
    pipe = DivideAndDenoisePipeline.from_pipelines(pipes)
    pipe.set_progress_bar_config(disable=True)
    size = args.latent_size * 8
    prompts = ["a red cube", "a blue ball", "a green tree"]
    # the same call on both sides, with Stable Diffusion's default classifier-free guidance (D&D's own default is 1)
    common = {
        "height": size,
        "width": size,
        "num_inference_steps": args.dnd_steps,
        "guidance_scale": 7.5,
        "output_type": "latent",
    }

    def ours(**kwargs):
        return pipe(prompt=prompts, generator=torch.Generator().manual_seed(args.seed), **common, **kwargs)

    def plain():
        # what a user runs instead: each expert's own pipeline on its own prompt
        for p, prompt in zip(pipes, prompts):
            p(prompt=prompt, generator=torch.Generator().manual_seed(args.seed), **common)

    # Attend-and-Excite's choice, one attention grid a quarter of the latent side (16x16 at 64x64 latents)
    attn_res = (args.latent_size // 4, args.latent_size // 4)
    runs = {
        "divide_and_denoise": ours,
        "divide_and_denoise_attn_res": lambda: ours(attn_res=attn_res),
        "plain_pipeline_calls": plain,
    }
    plain()  # warm-up of every code path, untimed
    ours()
    wall = {name: [] for name in runs}
    order = list(runs)
    for repetition in range(args.repetitions):
        for name in order if repetition % 2 == 0 else order[::-1]:  # alternate, so drift hits both sides alike
            wall[name].append(_timed(runs[name])[0])
    ratios = [a / b for a, b in zip(wall["divide_and_denoise"], wall["plain_pipeline_calls"])]
    ratios_attn_res = [a / b for a, b in zip(wall["divide_and_denoise_attn_res"], wall["plain_pipeline_calls"])]
    return {
        "shape": {
            "experts": 3,
            "latent_size": args.latent_size,
            "unet_channels": list(pipes[0].unet.config.block_out_channels),
            "unet_parameters": sum(p.numel() for p in pipes[0].unet.parameters()),
            "num_inference_steps": args.dnd_steps,
        },
        "baseline": "3 plain StableDiffusionPipeline calls (guidance scale 7.5 on both sides), alternating with the "
        "D&D call in one process",
        "wall_seconds": {name: _spread(v) for name, v in wall.items()},
        "ratio": _spread(ratios),
        "attn_res": list(attn_res),
        "ratio_attn_res": _spread(ratios_attn_res),
    }


def measure_dirp(args) -> dict:
    import torch

    from diffusers_ext import DIRPPipeline
    from diffusers_ext.metrics import peak_memory_bytes

    sd = _sd_pipelines(args, experts=1)[0]
    pipe = DIRPPipeline(
        unet=sd.unet, scheduler=sd.scheduler, vae=sd.vae, text_encoder=sd.text_encoder, tokenizer=sd.tokenizer
    )
    pipe.set_progress_bar_config(disable=True)
    for module in (pipe.unet, pipe.vae, pipe.text_encoder):
        module.requires_grad_(False)
    size = args.latent_size * 8
    generator = torch.Generator().manual_seed(args.seed)
    images = torch.rand((1, 3, size, size), generator=generator) * 2 - 1
    K = args.dirp_inversion_steps
    noise_fn = pipe.noise_function(1, images.device, "")

    def iteration():
        x = images.clone().requires_grad_(True)
        recon = pipe.reconstruct(x, K, 0.5, "", noise_fn=noise_fn)  # the default: gradient checkpointing
        (recon - x).pow(2).mean().backward()
        return x.grad

    @torch.no_grad()
    def plain():
        return pipe.reconstruct(images, K, 0.5, "", gradient_checkpointing=False, noise_fn=noise_fn)

    memory = {"dirp_iteration": peak_memory_bytes(iteration), "plain_round_trip": peak_memory_bytes(plain)}
    wall = {"dirp_iteration": [], "plain_round_trip": []}
    for repetition in range(args.repetitions):
        order = ("dirp_iteration", "plain_round_trip")
        for name in order if repetition % 2 == 0 else order[::-1]:
            wall[name].append(_timed(iteration if name == "dirp_iteration" else plain)[0])
    ratios = [a / b for a, b in zip(wall["dirp_iteration"], wall["plain_round_trip"])]
    return {
        "shape": {
            "latent_size": args.latent_size,
            "image_size": size,
            "num_inversion_steps": K,
            "unet_channels": list(pipe.unet.config.block_out_channels),
            "vae_channels": list(pipe.vae.config.block_out_channels),
        },
        "peak_memory_bytes": memory,
        "memory_ratio": memory["dirp_iteration"] / memory["plain_round_trip"],
        "wall_seconds": {name: _spread(v) for name, v in wall.items()},
        "time_ratio": _spread(ratios),
    }


def _grpo_trainer(args, output_dir: str):
    import torch
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from peft import LoraConfig

    from diffusers_ext import DiffusionGRPOConfig, DiffusionGRPOTrainer
    from diffusers_ext.models.tiny_components import get_tiny_sd3_components

    components = get_tiny_sd3_components(args.seed)
    torch.manual_seed(args.seed)
    components["transformer"] = SD3Transformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=args.grpo_layers,
        attention_head_dim=32,
        num_attention_heads=args.grpo_width // 32,
        joint_attention_dim=48,
        caption_projection_dim=args.grpo_width,
        pooled_projection_dim=40,
        pos_embed_max_size=64,
    ).eval()
    pipe = StableDiffusion3Pipeline(**components)
    config = DiffusionGRPOConfig(
        output_dir=output_dir,
        max_steps=args.repetitions + 1,
        num_generations=4,
        per_device_train_batch_size=8,
        num_inference_steps=args.grpo_steps,
        guidance_scale=4.5,
        height=64,
        width=64,
        max_sequence_length=8,
        learning_rate=1e-4,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
    )

    def brightness(images, prompts, **kwargs):
        return images.mean(dim=(1, 2, 3)).tolist()

    prompts = [{"prompt": p} for p in ("a red circle", "a blue square", "a green cross", "a white disc")]
    lora = LoraConfig(r=8, lora_alpha=8, init_lora_weights="gaussian")
    return DiffusionGRPOTrainer(pipe, [brightness], config, train_dataset=prompts, peft_config=lora)


def overhead_agreement(steps: list[dict]) -> tuple[float, float]:
    """`(outside overhead fraction, |trainer's - outside|)` of measured trainer steps, each a dict with
    `step_seconds`, `replay_seconds` (its model calls replayed bare) and `trainer_overhead_fraction`.

    One step and its replay vary by a few percent from run to run, more than the ~1% overhead being checked, so the
    outside figure is `1 - median(replays) / median(steps)` and is compared with the trainer's median, rather than
    step by step.
    """
    trainer = _spread([s["trainer_overhead_fraction"] for s in steps])["median"]
    replay = _spread([s["replay_seconds"] for s in steps])["median"]
    step = _spread([s["step_seconds"] for s in steps])["median"]
    outside = 1 - replay / step
    return outside, abs(trainer - outside)


def measure_grpo(args) -> dict:
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as output_dir:
        trainer = _grpo_trainer(args, output_dir)
        pipe = trainer.pipeline
        calls = []  # (kind, module, args, kwargs, grad enabled) of every model call of the measured step

        recording = [True]  # off while replaying: the replay's own calls must not be recorded

        def recorder(kind):
            def hook(module, margs, kwargs):
                if not recording[0]:
                    return
                clone = lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x  # noqa: E731
                calls.append(
                    (
                        kind,
                        module,
                        [clone(a) for a in margs],
                        {k: clone(v) for k, v in kwargs.items()},
                        torch.is_grad_enabled(),
                    )
                )

            return hook

        modules = [("transformer", trainer.transformer)]
        modules += [(name, getattr(pipe, name)) for name in ("text_encoder", "text_encoder_2", "text_encoder_3")]
        handles = [m.register_forward_pre_hook(recorder(kind), with_kwargs=True) for kind, m in modules]
        decode = pipe.vae.decode

        def recorded_decode(z, *margs, **kwargs):
            if recording[0]:
                calls.append(("vae_decode", None, [z.detach().clone()], {}, False))
            return decode(z, *margs, **kwargs)

        pipe.vae.decode = recorded_decode
        optimizer_step = trainer.optimizer.step

        def recorded_step(*margs, **kwargs):
            if recording[0]:
                calls.append(("optimizer_step", None, [], {}, False))
            return optimizer_step(*margs, **kwargs)

        trainer.optimizer.step = recorded_step
        # The outside measurement: the benchmark's own clocks around every model call of the real step (forwards
        # by module hooks, backward, VAE decode, optimizer and clipping, reward by wrapping), none of the trainer's
        # timers. The same step's calls are timed, so the step-to-step variation of the machine cancels.
        model_seconds = [0.0]
        step_seconds = [0.0]

        def timed_call(fn):
            def call(*margs, **kwargs):
                start = time.perf_counter()
                try:
                    return fn(*margs, **kwargs)
                finally:
                    model_seconds[0] += time.perf_counter() - start

            return call

        forward_starts = []

        def forward_started(module, margs):
            forward_starts.append(time.perf_counter())

        def forward_ended(module, margs, output):
            model_seconds[0] += time.perf_counter() - forward_starts.pop()

        for module in [trainer.unwrapped_transformer] + [m for kind, m in modules if kind != "transformer"]:
            handles += [module.register_forward_pre_hook(forward_started), module.register_forward_hook(forward_ended)]
        pipe.vae.decode = timed_call(pipe.vae.decode)
        trainer.optimizer.step = timed_call(trainer.optimizer.step)
        trainer.optimizer.zero_grad = timed_call(trainer.optimizer.zero_grad)
        trainer.accelerator.backward = timed_call(trainer.accelerator.backward)
        trainer.clip_gradients = timed_call(trainer.clip_gradients)
        trainer.reward_funcs = [timed_call(f) for f in trainer.reward_funcs]
        training_step = trainer.training_step

        def timed_training_step():
            model_seconds[0] = 0.0
            start = time.perf_counter()
            logs = training_step()
            step_seconds[0] = time.perf_counter() - start
            return logs

        trainer.training_step = timed_training_step
        trainer.train(max_steps=1)  # warm-up: first-call costs stay out of the measurement
        parameters = [p for p in trainer.transformer.parameters() if p.requires_grad]
        replay_optimizer = torch.optim.AdamW(parameters, lr=0.0)

        def replay():
            for kind, module, margs, kwargs, grad in calls:
                if kind == "vae_decode":
                    with torch.no_grad():
                        decode(margs[0])
                elif kind == "optimizer_step":
                    replay_optimizer.step()
                    replay_optimizer.zero_grad()
                else:
                    with torch.set_grad_enabled(grad):
                        out = module(*margs, **kwargs)
                        if grad:
                            first = out[0] if isinstance(out, tuple) else getattr(out, "sample", out)
                            first.float().pow(2).mean().backward()

        steps = []
        for _ in range(args.grpo_repetitions):
            calls.clear()
            logs = trainer.train(max_steps=trainer.global_step + 1)[-1]
            in_step_outside = 1 - model_seconds[0] / step_seconds[0]  # read before the replay's forwards add to it
            recording[0] = False
            replayed = _timed(replay)[0]
            recording[0] = True
            steps.append(
                {
                    "step_seconds": logs["time/step"],
                    "trainer_overhead_fraction": logs["time/overhead_fraction"],
                    "in_step_outside_overhead_fraction": in_step_outside,
                    "replay_seconds": replayed,
                    "outside_overhead_fraction": 1 - replayed / logs["time/step"],
                    "calls": {kind: sum(c[0] == kind for c in calls) for kind in {c[0] for c in calls}},
                }
            )
        for handle in handles:
            handle.remove()
    differences = [abs(s["trainer_overhead_fraction"] - s["outside_overhead_fraction"]) for s in steps]
    in_step = [abs(s["trainer_overhead_fraction"] - s["in_step_outside_overhead_fraction"]) for s in steps]
    pooled_outside, pooled_difference = overhead_agreement(steps)
    transformer = trainer.unwrapped_transformer
    return {
        "shape": {
            "transformer_layers": transformer.config.num_layers,
            "transformer_width": transformer.config.num_attention_heads * transformer.config.attention_head_dim,
            "transformer_parameters": sum(p.numel() for p in transformer.parameters()),
            "latent_size": 32,
            "num_inference_steps": args.grpo_steps,
            "batch": 8,
            "guidance_scale": 4.5,
        },
        "steps": steps,
        "trainer_overhead_fraction": _spread([s["trainer_overhead_fraction"] for s in steps]),
        "outside_overhead_fraction": _spread([s["outside_overhead_fraction"] for s in steps]),
        "overhead_difference": _spread(differences),
        "pooled_outside_overhead_fraction": pooled_outside,
        "pooled_overhead_difference": pooled_difference,
        "in_step_outside_overhead_fraction": _spread([s["in_step_outside_overhead_fraction"] for s in steps]),
        "in_step_overhead_difference": _spread(in_step),
    }


def measure_sd3_attention(args) -> dict:
    import torch
    from diffusers.models.attention_processor import Attention, JointAttnProcessor2_0

    from diffusers_ext.metrics import peak_memory_bytes
    from diffusers_ext.pipelines.divide_and_denoise.joint_attention import JointConceptAttentionProcessor
    from diffusers_ext.pipelines.divide_and_denoise.utilities import ConceptAttentionStore

    hidden, heads, text_tokens, patch = 1536, 24, 333, 2  # SD3.5-medium; CLIP 77 + T5 256 tokens
    grid = args.sd3_image_size // 8 // patch
    torch.manual_seed(args.seed)
    layer = Attention(
        query_dim=hidden,
        cross_attention_dim=None,
        added_kv_proj_dim=hidden,
        dim_head=hidden // heads,
        heads=heads,
        out_dim=hidden,
        context_pre_only=False,
        bias=True,
        qk_norm="rms_norm",
        eps=1e-6,
        processor=JointAttnProcessor2_0(),
    ).requires_grad_(False)
    generator = torch.Generator().manual_seed(args.seed)
    image = torch.randn(1, grid * grid, hidden, generator=generator)
    text = torch.randn(1, text_tokens, hidden, generator=generator)
    store = ConceptAttentionStore((grid, grid))
    processors = {"plain": JointAttnProcessor2_0(), "recording": JointConceptAttentionProcessor(store)}

    def forward(name):
        def run():
            layer.set_processor(processors[name])
            with torch.no_grad():
                return layer(image, encoder_hidden_states=text)

        return run

    memory = {name: peak_memory_bytes(forward(name)) for name in processors}
    outputs = {name: forward(name)()[0] for name in processors}
    wall = {name: [] for name in processors}
    for _ in range(args.repetitions):
        for name in processors:
            wall[name].append(_timed(forward(name))[0])
    ratios = [a / b for a, b in zip(wall["recording"], wall["plain"])]
    return {
        "shape": {"image_size": args.sd3_image_size, "image_tokens": grid * grid, "text_tokens": text_tokens},
        "max_abs_output_difference": float((outputs["recording"] - outputs["plain"]).abs().max()),
        "peak_memory_bytes": memory,
        "memory_ratio": memory["recording"] / memory["plain"],
        "wall_seconds": {name: _spread(v) for name, v in wall.items()},
        "time_ratio": _spread(ratios),
    }


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def scale_targets(summary: dict) -> list[dict]:
    """Every target of the parts that ran, from the recorded medians."""
    from diffusers_ext.evaluation.protocol import target

    targets = []
    dlm = summary.get("dlm")
    if dlm:
        baseline = dlm["baseline"]
        targets += [
            target(
                f"dlm greedy: package wall / {baseline} wall (median)",
                dlm["package_over_baseline"]["median"],
                DLM_WALL_RATIO_TARGET,
                "<=",
            ),
            target(
                "dlm greedy: package time outside the forward / decode (median)",
                dlm["outside_forward_fraction"]["package"]["median"],
                DLM_OUTSIDE_FRACTION_TARGET,
                "<=",
            ),
            target(
                "dlm SOAR beam 4: outside-forward ms per beam row per step (median)",
                dlm["soar_beam4"]["outside_ms_per_row_step"]["median"],
                SOAR_OUTSIDE_MS_TARGET,
                "<=",
            ),
        ]
    if summary.get("dnd"):
        # files measured before the real-pipeline baseline compared against replayed UNet forwards, and say so
        against = "3 plain StableDiffusionPipeline calls" if "baseline" in summary["dnd"] else "plain UNet forwards"
        targets.append(
            target(
                f"dnd 3 experts: wall / {against} (median)",
                summary["dnd"]["ratio"]["median"],
                DND_RATIO_TARGET,
                "<=",
            )
        )
    if summary.get("dirp"):
        targets += [
            target(
                "dirp: peak memory of one iteration / plain round trip",
                summary["dirp"]["memory_ratio"],
                DIRP_MEMORY_RATIO_TARGET,
                "<=",
            ),
            target(
                "dirp: time of one iteration / plain round trip (median)",
                summary["dirp"]["time_ratio"]["median"],
                DIRP_TIME_RATIO_TARGET,
                "<=",
            ),
        ]
    if summary.get("grpo"):
        targets.append(
            target(
                "grpo: |trainer's overhead fraction - outside measurement in the same step| (median over the steps)",
                summary["grpo"]["in_step_overhead_difference"]["median"],
                GRPO_OVERHEAD_AGREEMENT_TARGET,
                "<=",
            )
        )
    return targets


def report_sections(results: dict) -> list[str]:
    summary = results["summary"]
    lines = [
        f"CPU figures ({results['machine']['torch_threads']} torch threads, {results['machine']['platform']}); "
        "random weights; every comparison alternates in one process on the same inputs.",
        "",
    ]
    dlm = summary.get("dlm")
    if dlm:
        shape = dlm["shape"]
        lines += [
            "## dlm: greedy low-confidence decoding",
            "",
            f"Bidirectional Llama, hidden {shape['hidden_size']}, {shape['num_layers']} layers, vocabulary "
            f"{shape['vocab_size']} ({shape['parameters']:,} parameters); prompt {shape['prompt_length']}, "
            f"{shape['gen_length']} generated in blocks of {shape['block_length']}, {shape['steps']} steps.",
            "",
            "| decoder | wall s (min) | wall s (median) | outside the forward (median) | same tokens as the package |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, wall in dlm["wall_seconds"].items():
            outside = dlm["outside_forward_fraction"][name]["median"]
            lines.append(
                f"| {name} | {wall['min']:.2f} | {wall['median']:.2f} | {outside:.1%} | {dlm['tokens_agree'][name]} |"
            )
        soar = dlm["soar_beam4"]["outside_ms_per_row_step"]
        lines += ["", f"SOAR beam 4: {soar['median']:.1f} ms outside the forward per beam row per step (median).", ""]
    if summary.get("dnd"):
        dnd = summary["dnd"]
        lines += [
            "## dnd: Divide-and-Denoise against "
            + ("3 plain StableDiffusionPipeline calls" if "baseline" in dnd else "replayed UNet forwards"),
            "",
            f"3 experts, UNet channels {dnd['shape']['unet_channels']} ({dnd['shape']['unet_parameters']:,} parameters "
            f"each), {dnd['shape']['latent_size']}x{dnd['shape']['latent_size']} latents, "
            f"{dnd['shape']['num_inference_steps']} steps; the baseline is "
            f"{dnd.get('baseline', 'the same UNet calls replayed bare in a fixed order')}. Ratio "
            f"{dnd['ratio']['median']:.3f} (median), {dnd['ratio']['min']:.3f} (min), with the default "
            "cross-attention utility (every cross-attention layer recorded at the concept tokens). Recording one "
            f"attention grid, `attn_res={tuple(dnd['attn_res'])}` as Attend-and-Excite (an option, not the default, and not what "
            f"the target row measures): {dnd['ratio_attn_res']['median']:.3f} (median), "
            f"{dnd['ratio_attn_res']['min']:.3f} (min).",
            "",
        ]
    if summary.get("dirp"):
        dirp = summary["dirp"]
        memory = dirp["peak_memory_bytes"]
        lines += [
            "## dirp: one iteration against a plain round trip",
            "",
            f"{dirp['shape']['image_size']} px images ({dirp['shape']['latent_size']}x{dirp['shape']['latent_size']} "
            f"latents), {dirp['shape']['num_inversion_steps']} inversion steps; peak memory "
            f"{memory['dirp_iteration'] / 2**20:.0f} MiB vs {memory['plain_round_trip'] / 2**20:.0f} MiB "
            f"({dirp['memory_ratio']:.2f}x); time {dirp['time_ratio']['median']:.2f}x (median).",
            "",
        ]
    if summary.get("grpo"):
        grpo = summary["grpo"]
        shape = grpo["shape"]
        lines += [
            "## grpo: the trainer's overhead metric against an outside measurement",
            "",
            f"SD3-format transformer, {shape['transformer_layers']} joint blocks of width {shape['transformer_width']} "
            f"({shape['transformer_parameters']:,} parameters), {shape['latent_size']}x{shape['latent_size']} "
            f"latents, {shape['num_inference_steps']} steps, batch {shape['batch']}, guidance {shape['guidance_scale']}"
            f", LoRA rank 8; {len(grpo['steps'])} trainer steps. Overhead fraction: trainer "
            f"{grpo['trainer_overhead_fraction']['median']:.3f} (median); outside, from the benchmark's own clocks "
            "around every model call and the reward of the same step, "
            f"{grpo['in_step_outside_overhead_fraction']['median']:.3f} (median difference "
            f"{grpo['in_step_overhead_difference']['median']:.3f}). Replaying each step's model calls bare afterwards "
            f"gives {grpo['pooled_outside_overhead_fraction']:.3f} (1 - median replay / median step), step by step "
            f"{min(grpo['outside_overhead_fraction']['all']):.3f} to {max(grpo['outside_overhead_fraction']['all']):.3f}: "
            "two runs of the same calls vary by more than the overhead being checked, so the replay is context, not "
            "the check.",
            "",
        ]
    if summary.get("sd3_attention"):
        sd3 = summary["sd3_attention"]
        memory = sd3["peak_memory_bytes"]
        lines += [
            "## sd3_attention: recording the image-to-text attention of one joint layer",
            "",
            f"SD3.5-medium joint attention, {sd3['shape']['image_size']} px ({sd3['shape']['image_tokens']} image "
            f"tokens), {sd3['shape']['text_tokens']} text tokens: peak memory {memory['recording'] / 2**20:.0f} MiB "
            f"recording vs {memory['plain'] / 2**20:.0f} MiB for diffusers' processor ({sd3['memory_ratio']:.2f}x); "
            f"time {sd3['time_ratio']['median']:.2f}x (median); outputs differ by at most "
            f"{sd3['max_abs_output_difference']:.1e}.",
            "",
        ]
    return lines


def main(argv=None) -> dict:
    import platform

    import torch

    from diffusers_ext.evaluation.reporting import command, rebuild_results, write_results

    args = parse_args(argv)
    if args.from_results:
        results = rebuild_results(args.from_results, lambda r: scale_targets(r["summary"]), rel_to=REPO)
    else:
        start = time.perf_counter()
        measure = {
            "dlm": measure_dlm,
            "dnd": measure_dnd,
            "dirp": measure_dirp,
            "grpo": measure_grpo,
            "sd3_attention": measure_sd3_attention,
        }
        summary = {}
        for part in args.parts:
            summary[part] = measure[part](args)
        summary["targets"] = scale_targets(summary)
        results = {
            "command": command(__file__, argv, omit=("--output_dir", "--llada_repo")),
            "settings": {
                **{k: v for k, v in vars(args).items() if k not in ("output_dir", "from_results", "llada_repo")},
                "llada_repo_given": args.llada_repo is not None,  # its path names one machine's folder
            },
            "machine": {
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
            },
            "wall_seconds": time.perf_counter() - start,
            "summary": summary,
        }
    write_results(
        os.path.join(args.output_dir, args.results_name),
        results,
        "Cost at realistic shapes (CPU, random weights)",
        report_sections(results),
    )
    return results


if __name__ == "__main__":
    main()
