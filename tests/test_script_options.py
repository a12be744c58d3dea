"""One naming family across the training scripts: diffusers-examples option names, TRL's names only where a script
parses a TRL-style config (and then both), earlier spellings kept as aliases of the same option."""

import argparse
import contextlib
import importlib.util
import io
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "training").glob("train_*.py"))
# parse a TrlParser of a TrainingArguments-style config
TRL_SCRIPTS = {"train_grpo.py", "train_unlearning.py", "train_graph_grpo.py"}

# concept -> (the diffusers-examples name, TRL's name or None, other spellings a script may keep as aliases). A script
# that has the concept answers to the diffusers name; TRL's name and earlier spellings are aliases of that option.
# (Model-architecture flags follow each model class's config names and are not listed.)
CONCEPTS = {
    "base model": ("--pretrained_model_name_or_path", None, ("--pretrained_model", "--model_path", "--model")),
    "output folder": ("--output_dir", None, ("--out", "--output")),
    "seed": ("--seed", None, ()),
    "batch size per process": ("--train_batch_size", "--per_device_train_batch_size", ("--batch_size",)),
    "optimizer steps": ("--max_train_steps", "--max_steps", ("--train_steps", "--num_train_steps", "--steps")),
    "learning rate": ("--learning_rate", None, ("--lr",)),
    "learning-rate schedule": ("--lr_scheduler", "--lr_scheduler_type", ()),
    "warm-up steps": ("--lr_warmup_steps", "--warmup_steps", ()),
    "AdamW weight decay": ("--adam_weight_decay", "--weight_decay", ()),
    "AdamW beta1": ("--adam_beta1", None, ()),
    "AdamW beta2": ("--adam_beta2", None, ()),
    "AdamW epsilon": ("--adam_epsilon", None, ()),
    "gradient clipping": ("--max_grad_norm", None, ("--clip_grad_norm", "--grad_clip")),
    "gradient accumulation": ("--gradient_accumulation_steps", None, ("--grad_accum", "--accumulation_steps")),
    "mixed precision": ("--mixed_precision", None, ()),
    "checkpoint interval": ("--checkpointing_steps", "--save_steps", ("--checkpoint_steps",)),
    "checkpoints kept": ("--checkpoints_total_limit", "--save_total_limit", ()),
    "resume": ("--resume_from_checkpoint", None, ("--resume",)),
    "tracker": ("--report_to", None, ()),
    "tracker folder": ("--logging_dir", None, ("--log_dir", "--logdir")),
    "logging interval": ("--logging_steps", None, ("--log_every", "--log_steps")),
    "data loader workers": ("--dataloader_num_workers", None, ("--num_workers",)),
    "image side": ("--resolution", None, ("--image_size", "--size")),
    "image folder": ("--train_data_dir", None, ("--data_dir",)),
    "dataset": ("--dataset_name", None, ("--dataset",)),
    "training set size": ("--num_train_samples", None, ("--num_train",)),
    "EMA": ("--use_ema", None, ("--ema",)),
    "validation prompt": ("--validation_prompt", None, ("--validation_prompts",)),
    "validation samples": ("--num_validation_images", None, ("--num_validation_samples",)),
    "validation interval": ("--validation_steps", None, ("--validation_epochs",)),
    "evaluation sampling steps": ("--eval_inference_steps", None, ("--eval_steps", "--eval_num_inference_steps")),
    "push to the Hub": ("--push_to_hub", None, ()),
    "Hub repository": ("--hub_model_id", None, ()),
    "Hub token": ("--hub_token", None, ()),
}


def script_parser(path: Path) -> argparse.ArgumentParser:
    """The argument parser a training script builds (its largest one), found by parsing no arguments."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parsers = []
    original = argparse.ArgumentParser.parse_known_args

    def recording(self, args=None, namespace=None):
        parsers.append(self)
        return original(self, args, namespace)

    argparse.ArgumentParser.parse_known_args = recording
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.suppress(SystemExit, ValueError):
            module.parse_args([])
    finally:
        argparse.ArgumentParser.parse_known_args = original
    assert parsers, f"{path.name} built no parser"
    return max(parsers, key=lambda parser: len(parser._actions))


def options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Every option string of `parser` -> its destination."""
    return {option: action.dest for action in parser._actions for option in action.option_strings}


@pytest.fixture(scope="module")
def parsers():
    return {path.name: options(script_parser(path)) for path in SCRIPTS}


def test_every_script_spells_each_concept_the_diffusers_way(parsers):
    problems = []
    for script, found in parsers.items():
        for concept, (canonical, trl, aliases) in CONCEPTS.items():
            spellings = [canonical, *([trl] if trl else []), *aliases]
            present = [name for name in spellings if name in found]
            if not present:
                continue
            if canonical not in present:
                problems.append(f"{script}: {concept} is {present}, not {canonical}")
            elif len({found[name] for name in present}) != 1:
                problems.append(f"{script}: {present} ({concept}) are different options")
        if script in TRL_SCRIPTS:
            for canonical, trl, _ in CONCEPTS.values():
                if trl and trl in found and canonical not in found:
                    problems.append(f"{script}: TRL's {trl} without the diffusers name {canonical}")
    assert not problems, "\n".join(problems)


def test_trl_scripts_take_both_names_with_one_meaning(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "training"))
    try:
        spec = importlib.util.spec_from_file_location("train_grpo", REPO / "training" / "train_grpo.py")
        grpo = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(grpo)
        base = ["--pretrained_model_name_or_path", "x", "--output_dir", str(tmp_path / "o")]
        _, config, _ = grpo.parse_args([*base, "--max_train_steps", "7", "--train_batch_size", "16"])
        assert (config.max_steps, config.per_device_train_batch_size) == (7, 16)
        _, config, _ = grpo.parse_args([*base, "--max_steps", "5", "--checkpoints_total_limit", "2"])
        assert (config.max_steps, config.save_total_limit) == (5, 2)
        _, default, _ = grpo.parse_args(base)
        assert default.max_steps == type(default)().max_steps  # an alias brings no default of its own
    finally:
        sys.path.pop(0)


# What the README promises of every script (its "Training scripts" section): `--gradient_accumulation_steps`, and
# validation sampling in the generator scripts, the others named there as measuring their final model instead.
NOT_GENERATORS = {"train_classifier.py", "train_augmentation_regressor.py", "train_semantic_encoder.py"}
MEASURED_AT_THE_END = {
    "train_graph_flow.py",
    "train_graph_grpo.py",
    "train_epidiff.py",
    "train_parameter_diffusion.py",
    "train_spade.py",
}


def test_every_script_takes_gradient_accumulation_and_the_generators_validate_as_the_readme_says(parsers):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "Every script takes `--gradient_accumulation_steps`" in readme
    missing = [script for script, found in parsers.items() if "--gradient_accumulation_steps" not in found]
    assert not missing, f"without --gradient_accumulation_steps: {missing}"
    validating = {s for s, found in parsers.items() if {"--num_validation_images", "--validation_steps"} <= set(found)}
    assert validating == set(parsers) - NOT_GENERATORS - MEASURED_AT_THE_END, sorted(validating)
    paragraph = readme[readme.index("Validation, as in diffusers' examples") :].split("\n\n")[0]
    for script in MEASURED_AT_THE_END:
        assert f"`{script}`" in paragraph, f"the README's validation paragraph does not say what {script} does"


# The extra arguments a script needs to get past its own required options to the Hub check.
HUB_CHECK_ARGS = {
    "train_graph_grpo.py": ["--pretrained_model_name_or_path", "diffusers_ext/zoo/graph-flow-tree16"],
    "train_grpo.py": ["--pretrained_model_name_or_path", "diffusers_ext/zoo/digits-sd3"],
    "train_semantic_nvs.py": ["--no_semantics"],
    "train_text_to_image.py": [
        "--pretrained_model_name_or_path",
        "diffusers_ext/zoo/mosaic-t2i",
        "--train_data_dir",
        ".",
    ],
    "train_text_to_image_sd3.py": ["--pretrained_vae_model_name_or_path", "diffusers_ext/zoo/mosaic-t2i"],
    "train_unlearning.py": [
        "--pretrained_model_name_or_path",
        "diffusers_ext/zoo/digits-ddpm",
        "--forget_classes",
        "3",
    ],
}


def test_every_script_with_push_to_hub_checks_the_hub_when_it_starts(parsers, tmp_path, monkeypatch):
    # HF_HUB_OFFLINE=1 is what a user without network has: an upload cannot happen, so --push_to_hub fails while the
    # arguments are parsed, before any data or model is touched, instead of after training
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(REPO)
    problems = []
    for path in SCRIPTS:
        if "--push_to_hub" not in parsers[path.name]:
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        err = io.StringIO()
        argv = ["--output_dir", str(tmp_path / path.stem), "--push_to_hub", *HUB_CHECK_ARGS.get(path.name, [])]
        try:
            with contextlib.redirect_stderr(err):
                module.parse_args(argv)
            message = "parsed without an error"
        except SystemExit:
            message = err.getvalue().strip().splitlines()[-1]
        except ValueError as error:
            message = str(error)
        if "--push_to_hub: HF_HUB_OFFLINE is set, so the upload to the Hub cannot happen" not in message:
            problems.append(f"{path.name}: {message}")
    assert not problems, "\n".join(problems)
