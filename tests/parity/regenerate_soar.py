"""Regenerate `tests/parity/fixtures/soar_references.json`: the outputs of the reference decoders on the package's
tiny test models, for `test_soar_reference_parity.py`.

The references are imported at run time from local checkouts (nothing of theirs is stored here, only their outputs
and commit ids):

    for r in ML-GSAI/LLaDA NVlabs/Fast-dLLM duterscmy/SOAR; do git clone https://github.com/$r REFS/${r#*/}; done
    python tests/parity/regenerate_soar.py --llada_repo REFS/LLaDA --fast_dllm_repo REFS/Fast-dLLM \
        --soar_repo REFS/SOAR [--dream_repo DIR]

(`REFS` is any folder of your choice.)

- LLaDA `generate.py` `generate` (low-confidence and random remasking);
- Fast-dLLM `llada/generate.py` `generate(threshold=...)`;
- Dream `diffusion_generate` from the `generation_utils.py` that ships with the Dream checkpoints (`--dream_repo`, a
  folder holding it, e.g. a downloaded `Dream-org/Dream-v0-Base-7B`; by default Fast-dLLM's copy in `dream/model`,
  which only adds `alg="confidence_threshold"`);
- SOAR `eval_llada8b/generate.py` `generate_soar` / `generate_pbs` and `eval_dream7b/generation_utils_soar.py`
  `_sample_soar`.

Temperature 0 cases store each reference's sequences and forward counts; sampled cases (temperature > 0, random
remasking, Dream's `origin`) run the reference over `--num_samples` seeds and store per-position token counts.
At the end the script runs the package on every case and prints the agreement.
"""

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
import types

import torch
from parity_utils import reference_commit


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from soar_parity_models import build_model, make_prompt, position_counts, run_package, total_variation, tv_tolerance  # noqa: E402


FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "soar_references.json")


def load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TopkWatch:
    """Stands in for `torch` inside a reference module and counts its `torch.topk` calls whose chosen values tie
    with another finite value of the same row: there `torch.topk`'s choice among equal values decides, where the
    package takes the lowest position."""

    def __init__(self):
        self.ties = 0

    def __getattr__(self, name):
        return getattr(torch, name)

    def topk(self, input, k, *args, **kwargs):
        result = torch.topk(input, k, *args, **kwargs)
        rows = input.reshape(-1, input.shape[-1])
        chosen = result.values.reshape(-1, result.values.shape[-1])
        for row, values in zip(rows, chosen):
            finite = values[torch.isfinite(values)]
            if len(finite) and bool(((row.unsqueeze(0) == finite.unsqueeze(1)).sum(1) > 1).any()):
                self.ties += 1
        return result


class Counted(torch.nn.Module):
    """The tiny model as the LLaDA-style references call it (`model(x, attention_mask=...).logits`, `model.device`),
    counting forward calls and the rows they carry."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.calls = 0
        self.rows = 0

    @property
    def device(self):
        return self.model.device

    def forward(self, input_ids, attention_mask=None):
        self.calls += 1
        self.rows += input_ids.shape[0]
        return self.model(input_ids, attention_mask=attention_mask)


def dream_model(mixin_module, model, tokenizer):
    """An object the Dream generation mixin of `mixin_module` can drive: `self(x, attention_mask, tok_idx)` as Dream's
    model takes it ("full" or a 4-D boolean mask, position ids), `config`, `device`, `generation_config`."""

    class TinyDream(mixin_module.DreamGenerationMixin):
        def __init__(self):
            self.model = model
            self.config = model.config
            self.device = model.device
            self.generation_config = mixin_module.DreamGenerationConfig(
                mask_token_id=tokenizer.mask_token_id,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                bos_token_id=None,
            )
            self.calls = 0
            self.rows = 0

        def __call__(self, x, attention_mask=None, tok_idx=None):
            self.calls += 1
            self.rows += x.shape[0]
            if isinstance(attention_mask, str):
                return self.model(x)
            return self.model(x, attention_mask=attention_mask, position_ids=tok_idx)

    return TinyDream()


class References:
    def __init__(self, args):
        fast_dllm = args.fast_dllm_repo
        dream_dir = args.dream_repo or os.path.join(fast_dllm, "dream", "model")
        self.llada = load_module(os.path.join(args.llada_repo, "generate.py"), "reference_llada_generate")
        # Fast-dLLM's generate.py imports its LLaDA modeling file, which these runs do not use
        shim = types.ModuleType("model")
        shim.modeling_llada = types.ModuleType("model.modeling_llada")
        shim.modeling_llada.LLaDAModelLM = None
        sys.modules.setdefault("model", shim)
        sys.modules.setdefault("model.modeling_llada", shim.modeling_llada)
        self.fast_dllm = load_module(os.path.join(fast_dllm, "llada", "generate.py"), "reference_fast_dllm_generate")
        self.dream = load_module(os.path.join(dream_dir, "generation_utils.py"), "reference_dream_generation_utils")
        self.soar = load_module(os.path.join(args.soar_repo, "eval_llada8b", "generate.py"), "reference_soar_llada")
        self.soar_dream = load_module(
            os.path.join(args.soar_repo, "eval_dream7b", "generation_utils_soar.py"), "reference_soar_dream"
        )
        # the released accelerate branch reads a module-level `log` flag it never defines; False is what its
        # callers mean
        self.soar_dream.log = False
        # their `validate` does nothing; newer transformers' `GenerationConfig.update` passes it a keyword it lacks
        for module in (self.dream, self.soar_dream):
            module.DreamGenerationConfig.validate = lambda config, *args, **kwargs: None
        self.watch = TopkWatch()
        for module in (self.llada, self.fast_dllm, self.dream, self.soar, self.soar_dream):
            module.torch = self.watch
        self.commits = {
            "ML-GSAI/LLaDA": reference_commit(args.llada_repo),
            "NVlabs/Fast-dLLM": reference_commit(fast_dllm),
            "Dream generation_utils.py": {
                "path": os.path.relpath(dream_dir, fast_dllm),
                "commit": reference_commit(dream_dir),
            }
            if args.dream_repo is None
            else {"path": os.path.basename(os.path.normpath(dream_dir)), "commit": reference_commit(dream_dir)},
            "duterscmy/SOAR": reference_commit(args.soar_repo),
        }

    def run(self, case: dict) -> dict:
        """Run the reference of `case` once (the global torch RNG is the caller's); returns sequences `(B, G)` and
        the forward counts."""
        model, tokenizer = build_model(case["model"], case.get("dtype", "float32"))
        prompt = torch.tensor(case["prompt"])
        call = case["call"]
        gen, block, steps, temperature = (
            call["gen_length"],
            call.get("block_length"),
            call.get("steps"),
            call["temperature"],
        )
        mask_id = tokenizer.mask_token_id
        reference = case["reference"]
        out = {}
        self.watch.ties = 0
        with torch.no_grad():
            if reference in ("llada", "fast-dllm", "soar-llada", "pbs"):
                counted = Counted(model)
                block = gen if block is None else block
                if reference == "llada":
                    am = torch.tensor(case["attention_mask"]) if case.get("attention_mask") is not None else None
                    x = self.llada.generate(
                        counted,
                        prompt,
                        attention_mask=am,
                        steps=steps,
                        gen_length=gen,
                        block_length=block,
                        temperature=temperature,
                        remasking=call.get("remasking", "low_confidence"),
                        mask_id=mask_id,
                    )
                elif reference == "fast-dllm":
                    x, nfe = self.fast_dllm.generate(
                        counted,
                        prompt,
                        steps=steps,
                        gen_length=gen,
                        block_length=block,
                        temperature=temperature,
                        remasking="low_confidence",
                        mask_id=mask_id,
                        threshold=call["threshold"],
                    )
                    out["nfe"] = int(nfe)
                elif reference == "soar-llada":
                    x = self.soar.generate_soar(
                        counted,
                        prompt,
                        steps=steps,
                        gen_length=gen,
                        block_length=block,
                        temperature=temperature,
                        mask_id=mask_id,
                    )
                else:
                    x = self.soar.generate_pbs(
                        counted,
                        prompt,
                        steps=steps,
                        gen_length=gen,
                        block_length=block,
                        temperature=temperature,
                        mask_id=mask_id,
                    )
                calls, rows = counted.calls, counted.rows
            else:
                module = self.dream if reference == "dream" else self.soar_dream
                dream = dream_model(module, model, tokenizer)
                config = module.DreamGenerationConfig(
                    mask_token_id=mask_id, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
                )
                kwargs = {"max_new_tokens": gen, "temperature": temperature, "alg": call.get("alg", "maskgit_plus")}
                if steps is not None:
                    kwargs["steps"] = steps
                if reference == "soar-dream":
                    kwargs["threshhold"] = call.get("threshold", 0.9)
                with contextlib.redirect_stdout(io.StringIO()):  # both print progress lines
                    x = dream.diffusion_generate(prompt, generation_config=config, **kwargs)
                x = x.sequences if hasattr(x, "sequences") else x
                calls, rows = dream.calls, dream.rows
        out.update(
            sequences=x[:, prompt.shape[1] :].tolist(),
            forward_calls=calls,
            forward_rows=rows,
            topk_ties=self.watch.ties,
        )
        return out


def exact_cases() -> list[dict]:
    """Temperature-0 configurations, several with `steps < gen_length`."""
    cases = []

    def add(reference, preset, recipe, prompt, call, overrides=None, attention_mask=None, dtype="float32"):
        name = "/".join(
            [reference, dtype, f"m{recipe['seed']}x{recipe['head_scale']}{'b' if recipe.get('boost') else ''}"]
            + [f"{k}={v}" for k, v in call.items() if v is not None]
            + [f"p{len(cases)}"]
        )
        cases.append(
            {
                "id": name,
                "reference": reference,
                "preset": preset,
                "overrides": overrides or {},
                "model": recipe,
                "prompt": prompt.tolist(),
                "attention_mask": attention_mask,
                "call": {"temperature": 0.0, **call},
                "dtype": dtype,
            }
        )

    llada = [{"family": "llada", "seed": s, "head_scale": 20.0, "boost": None} for s in (0, 1)]
    layouts = [(16, 16, 16), (16, 16, 8), (16, 8, 8), (16, 4, 8), (16, 4, 4), (12, 4, 6)]
    for recipe in llada:
        for p in (0, 1):
            for gen, block, steps in layouts:
                add(
                    "llada",
                    "llada",
                    recipe,
                    make_prompt(1, 5, 10 * recipe["seed"] + p),
                    {"gen_length": gen, "block_length": block, "steps": steps},
                )
    # a left-padded batch of two prompts
    prompt = make_prompt(2, 6, 7)
    prompt[0, :2] = 0  # the tokenizer's pad id
    add(
        "llada",
        "llada",
        llada[0],
        prompt,
        {"gen_length": 8, "block_length": 4, "steps": 4},
        attention_mask=[[0, 0, 1, 1, 1, 1], [1] * 6],
    )

    boosted = [
        {"family": "llada", "seed": s, "head_scale": 20.0, "boost": {"modulus": 3, "strength": 9.0}} for s in (0, 1)
    ]
    for recipe in boosted:
        for p in (0, 1):
            for gen, block, steps in ((16, 16, 16), (16, 8, 8), (16, 4, 4), (16, 4, 8)):
                for tau in (0.9, 0.5):
                    add(
                        "fast-dllm",
                        "fast-dllm",
                        recipe,
                        make_prompt(1, 5, 20 + 10 * recipe["seed"] + p),
                        {"gen_length": gen, "block_length": block, "steps": steps, "threshold": tau},
                        overrides={} if tau == 0.9 else {"confidence_threshold": tau},
                    )
    for recipe in boosted:
        for p in (0, 1, 2, 3):
            for gen, block, steps in ((12, 12, 12), (12, 12, 6), (12, 6, 12), (12, 6, 6), (12, 4, 3), (12, 4, 9)):
                add(
                    "soar-llada",
                    "soar-llada",
                    recipe,
                    make_prompt(1, 5, 40 + 10 * recipe["seed"] + p),
                    {"gen_length": gen, "block_length": block, "steps": steps},
                )
    for recipe in llada:
        for p in (0, 1, 2):
            for gen, block, steps in ((12, 12, 12), (12, 12, 6), (12, 6, 12), (12, 6, 6), (12, 4, 6)):
                add(
                    "pbs",
                    "pbs",
                    recipe,
                    make_prompt(1, 5, 60 + 10 * recipe["seed"] + p),
                    {"gen_length": gen, "block_length": block, "steps": steps},
                )

    dream = [{"family": "dream", "seed": s, "head_scale": 20.0, "boost": None} for s in (2, 3)]
    measures = {
        "maskgit_plus": {},
        "topk_margin": {"confidence_measure": "margin"},
        "entropy": {"confidence_measure": "neg_entropy"},
    }
    for recipe in dream:
        for p in (0, 1):
            for alg, overrides in measures.items():
                for gen, steps in ((12, 12), (12, 6), (12, 4)):
                    add(
                        "dream",
                        "dream",
                        recipe,
                        make_prompt(1, 6, 80 + 10 * recipe["seed"] + p),
                        {"gen_length": gen, "steps": steps, "alg": alg},
                        overrides=overrides,
                    )
    dream_boosted = [
        {"family": "dream", "seed": s, "head_scale": 20.0, "boost": {"modulus": 3, "strength": 9.0}} for s in (2, 3)
    ]
    for recipe in dream_boosted:
        for p in range(6):
            for gen in (8, 12):
                add(
                    "soar-dream",
                    "soar-dream",
                    recipe,
                    make_prompt(1, 6, 100 + 10 * recipe["seed"] + p),
                    {"gen_length": gen, "steps": gen},
                )
    # bf16 models: the softmax precision matters (ties and rounding near the threshold)
    bf16 = [
        {"family": "llada", "seed": s, "head_scale": 20.0, "boost": {"modulus": 3, "strength": 9.0}} for s in (0, 1)
    ]
    for recipe in bf16:
        for p in range(4):
            prompt = make_prompt(1, 5, 120 + 10 * recipe["seed"] + p)
            for gen, block, steps in ((16, 16, 16), (16, 8, 8), (16, 4, 8)):
                add(
                    "fast-dllm",
                    "fast-dllm",
                    recipe,
                    prompt,
                    {"gen_length": gen, "block_length": block, "steps": steps, "threshold": 0.9},
                    dtype="bfloat16",
                )
                add(
                    "llada",
                    "llada",
                    recipe,
                    prompt,
                    {"gen_length": gen, "block_length": block, "steps": steps},
                    dtype="bfloat16",
                )
            add(
                "soar-llada",
                "soar-llada",
                recipe,
                prompt,
                {"gen_length": 12, "block_length": 12, "steps": 12},
                dtype="bfloat16",
            )
            add(
                "soar-llada",
                "soar-llada",
                recipe,
                prompt,
                {"gen_length": 12, "block_length": 6, "steps": 6},
                dtype="bfloat16",
            )
    return cases


# references whose rows are independent samples in one batched call (their quota is the same in every row); the others
# take one prompt at a time
BATCHED = ("llada", "dream")

# settings each preset fixes, and the alternatives the regeneration reports agreement for (the measured reason for
# the preset's choice)
ALTERNATIVES = {
    "confidence_precision": ("float32", "float64", "model"),
    "step_budget": ("per_block", "global", "unbounded"),
    "collapse_rule": ("any_accelerated", "best_multi_token"),
}


def sampled_cases(num_samples: int) -> list[dict]:
    """Sampled configurations, each decoded from one prompt over `num_samples` seeds (tiny: 4-token prompts, 6
    generated tokens)."""
    plain = {"family": "llada", "seed": 5, "head_scale": 40.0, "boost": None}
    boosted = {"family": "llada", "seed": 5, "head_scale": 40.0, "boost": {"modulus": 2, "strength": 6.0}}
    dream = {"family": "dream", "seed": 6, "head_scale": 40.0, "boost": None}
    dream_boosted = {"family": "dream", "seed": 6, "head_scale": 40.0, "boost": {"modulus": 2, "strength": 6.0}}
    specs = [
        ("llada", "llada", plain, {"gen_length": 6, "block_length": 6, "steps": 6, "temperature": 1.0}, {}),
        ("llada", "llada", plain, {"gen_length": 6, "block_length": 3, "steps": 2, "temperature": 0.7}, {}),
        (
            "llada",
            "llada",
            plain,
            {"gen_length": 6, "block_length": 6, "steps": 3, "temperature": 0.0, "remasking": "random"},
            {"confidence_measure": "random"},
        ),
        (
            "llada",
            "llada",
            plain,
            {"gen_length": 6, "block_length": 3, "steps": 6, "temperature": 1.0, "remasking": "random"},
            {"confidence_measure": "random"},
        ),
        (
            "fast-dllm",
            "fast-dllm",
            boosted,
            {"gen_length": 6, "block_length": 6, "steps": 6, "temperature": 1.0, "threshold": 0.9},
            {},
        ),
        (
            "soar-llada",
            "soar-llada",
            boosted,
            {"gen_length": 6, "block_length": 6, "steps": 6, "temperature": 1.0},
            {},
        ),
        (
            "soar-llada",
            "soar-llada",
            boosted,
            {"gen_length": 6, "block_length": 3, "steps": 4, "temperature": 1.0},
            {},
        ),
        ("pbs", "pbs", plain, {"gen_length": 6, "block_length": 6, "steps": 6, "temperature": 1.0}, {}),
        ("dream", "dream", dream, {"gen_length": 6, "steps": 6, "temperature": 1.0, "alg": "maskgit_plus"}, {}),
        (
            "dream",
            "dream",
            dream,
            {"gen_length": 6, "steps": 3, "temperature": 1.0, "alg": "entropy"},
            {"confidence_measure": "neg_entropy"},
        ),
        (
            "dream",
            "dream",
            dream,
            {"gen_length": 6, "steps": 3, "temperature": 1.0, "alg": "origin"},
            {"transfer_schedule": "origin"},
        ),
        ("dream", "dream", dream, {"gen_length": 6, "steps": 3, "temperature": 0.5, "alg": "maskgit_plus"}, {}),
        ("soar-dream", "soar-dream", dream_boosted, {"gen_length": 6, "steps": 6, "temperature": 1.0}, {}),
        ("soar-dream", "soar-dream", dream_boosted, {"gen_length": 6, "steps": 6, "temperature": 0.7}, {}),
    ]
    cases = []
    for i, (reference, preset, recipe, call, overrides) in enumerate(specs):
        cases.append(
            {
                "id": "/".join([reference] + [f"{k}={v}" for k, v in call.items()] + [f"s{i}"]),
                "reference": reference,
                "preset": preset,
                "overrides": overrides,
                "model": recipe,
                "prompt": make_prompt(1, 4, 200 + i).tolist(),
                "attention_mask": None,
                "call": call,
                "num_samples": num_samples,
            }
        )
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llada_repo", required=True, help="checkout of ML-GSAI/LLaDA")
    parser.add_argument("--fast_dllm_repo", required=True, help="checkout of NVlabs/Fast-dLLM")
    parser.add_argument("--soar_repo", required=True, help="checkout of duterscmy/SOAR")
    parser.add_argument(
        "--dream_repo", default=None, help="folder with Dream's generation_utils.py (default: Fast-dLLM's dream/model)"
    )
    parser.add_argument("--num_samples", type=int, default=2000, help="seeds per sampled case")
    parser.add_argument("--output", default=FIXTURE)
    parser.add_argument(
        "--report_alternatives",
        action="store_true",
        help="also report the agreement each preset would have with other values of its settings",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    refs = References(args)

    exact = exact_cases()
    for case in exact:
        case["expected"] = refs.run(case)
    sampled = sampled_cases(args.num_samples)
    for case in sampled:
        if case["reference"] in BATCHED:
            # the reference decodes a batch of copies of the prompt in one call; its rows are independent draws
            torch.manual_seed(0)
            copies = {**case, "prompt": case["prompt"] * case["num_samples"]}
            sequences = torch.tensor(refs.run(copies)["sequences"])
        else:
            rows = []
            for seed in range(case["num_samples"]):
                torch.manual_seed(seed)
                rows.append(refs.run(case)["sequences"][0])
            sequences = torch.tensor(rows)
        print("sampled", case["id"], file=sys.stderr, flush=True)
        masks = int((sequences == build_model(case["model"])[1].mask_token_id).any(1).sum())
        case["expected"] = {"counts": position_counts(sequences), "samples_with_mask_token": masks}

    fixture = {
        "description": "Outputs of the reference decoders on diffusers_ext's tiny test models; regenerate with "
        "tests/parity/regenerate_soar.py. Sequences are the generated tokens; forward_calls / forward_rows count the "
        "reference's model calls and the rows they carried; counts are per-position token counts over seeds 0..n-1.",
        "references": refs.commits,
        "torch": torch.__version__,
        "exact": exact,
        "sampled": sampled,
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")

    # agreement, as the test measures it
    summary = {}
    for case in exact:
        out = run_package(case)
        same = out.sequences.tolist() == case["expected"]["sequences"]
        summary.setdefault(f"{case['reference']} {case['dtype']}", [0, 0])
        summary[f"{case['reference']} {case['dtype']}"][0] += int(same)
        summary[f"{case['reference']} {case['dtype']}"][1] += 1
        if not same:
            print("differs:", case["id"], "topk ties:", case["expected"]["topk_ties"])
    for name, (same, total) in summary.items():
        print(f"T=0 {name}: {same} of {total} exact")
    print("T=0 cases with a tie in a reference topk:", sum(bool(c["expected"]["topk_ties"]) for c in exact))
    # what the other values of the preset's settings would give
    for setting, values in ALTERNATIVES.items() if args.report_alternatives else ():
        for value in values:
            tally = {}
            for case in exact:
                key = (case["reference"], case["dtype"])
                try:
                    out = run_package({**case, "overrides": {**case["overrides"], setting: value}})
                    same = out.sequences.tolist() == case["expected"]["sequences"]
                except ValueError:
                    continue
                tally.setdefault(key, [0, 0])
                tally[key][0] += int(same)
                tally[key][1] += 1
            print(f"{setting}={value}: " + ", ".join(f"{r} {d}: {a}/{b}" for (r, d), (a, b) in sorted(tally.items())))
    for case in exact:
        if case["expected"]["topk_ties"]:
            same = run_package(case).sequences.tolist() == case["expected"]["sequences"]
            print("tie:", case["id"], "exact" if same else "differs")
    positions = sum(len(c["expected"]["counts"]) for c in sampled)
    for case in sampled:
        out = run_package(case, num_samples=case["num_samples"])
        ours = position_counts(out.sequences)
        worst = max(
            (
                total_variation(a, b) / tv_tolerance(a, b, positions),
                total_variation(a, b),
                tv_tolerance(a, b, positions),
            )
            for a, b in zip(case["expected"]["counts"], ours)
        )
        print(
            f"sampled {case['id']}: worst position TV {worst[1]:.4f} (tolerance {worst[2]:.4f}), reference samples "
            f"with [MASK]: {case['expected']['samples_with_mask_token']}"
        )


if __name__ == "__main__":
    main()
