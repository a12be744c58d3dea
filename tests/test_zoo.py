"""The bundled zoo: loadable, small, documented, and as good as its cards say."""

import os
import subprocess

import pytest
import torch

from diffusers_ext import ClassConditionalDDPMPipeline, ConvImageClassifier, zoo
from diffusers_ext.data.digits import load_digits_images
from diffusers_ext.evaluation.digits import evaluate_digits_generator
from diffusers_ext.metrics import classifier_accuracy, classifier_predictions, frechet_distance


@pytest.fixture(scope="module")
def classifier():
    return zoo.load("digits-classifier")


@pytest.fixture(scope="module")
def pipe():
    pipe = zoo.load("digits-ddpm")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_names_paths_and_errors():
    assert zoo.names() == [
        "addition-mdm",
        "digits-augmentation-regressor",
        "digits-classifier",
        "digits-cm",
        "digits-ddpm",
        "digits-sd3",
        "graph-flow-tree16",
        "lomdm-markov",
        "mosaic-sd3-64",
        "mosaic-t2i",
        "mosaic-t2i-64",
        "navigation-planner",
        "procedural-nvs",
        "procedural-nvs-baseline",
        "procedural-semantic-encoder",
        "sudoku-mdm",
    ]
    for name in zoo.names():
        assert os.path.isfile(os.path.join(zoo.path(name), "README.md"))
    with pytest.raises(ValueError, match="unknown zoo name 'digits-gan'"):
        zoo.path("digits-gan")
    with pytest.raises(ValueError, match="unknown zoo name"):
        zoo.load("digits-gan")


def test_zoo_is_small_and_ships_no_training_leftovers():
    # A rebuild into the zoo folder leaves checkpoint-*/ and logs/ behind; .gitignore keeps them out of the repo.
    leftovers = ("checkpoint-", "logs")
    total = 0
    for root, dirs, files in os.walk(zoo.ZOO_DIR):
        dirs[:] = [d for d in dirs if not d.startswith(leftovers)]
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    # 48 MiB: 24 MiB held the first thirteen entries (the largest, mosaic-t2i, 2.8 MB in float16). The 64x64 mosaic
    # world needs a UNet large enough to draw several objects per scene (mosaic-t2i-64: 6.6M parameters, 14 MB in
    # float16) and its SD3-format twin (mosaic-sd3-64: a 4-block transformer, ~11 MB in float16), so the two may take
    # the other 24 MiB; the rest stay a few MB each.
    assert total < 48 * 2**20
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", os.path.join(zoo.ZOO_DIR, "digits-ddpm", "checkpoint-1", "x")], cwd=zoo.ZOO_DIR
    )
    assert ignored.returncode in (0, 128)  # 0: ignored; 128: not a git checkout (an installed package)


def test_cards_state_the_rebuild_command():
    for name, script in [
        ("digits-ddpm", "training/train_ddpm.py"),
        ("digits-classifier", "training/train_classifier.py"),
        ("digits-augmentation-regressor", "training/train_augmentation_regressor.py"),
        ("digits-cm", "training/train_consistency.py"),
        ("addition-mdm", "training/train_masked_lm.py"),
        ("digits-sd3", "training/train_sd3_digits.py"),
        ("lomdm-markov", "training/train_lomdm.py"),
        ("procedural-semantic-encoder", "training/train_semantic_encoder.py"),
        ("procedural-nvs", "training/train_semantic_nvs.py"),
        ("procedural-nvs-baseline", "training/train_semantic_nvs.py"),
        ("sudoku-mdm", "training/train_masked_lm.py"),
        ("mosaic-t2i", "training/train_text_to_image_from_scratch.py"),
        ("mosaic-t2i-64", "training/train_text_to_image_from_scratch.py"),
        ("mosaic-sd3-64", "training/train_text_to_image_sd3.py"),
        ("navigation-planner", "training/train_trajectory_diffusion.py"),
        ("graph-flow-tree16", "training/train_graph_flow.py"),
    ]:
        card = open(os.path.join(zoo.path(name), "README.md"), encoding="utf-8").read()
        assert card.startswith("---\n") and script in card and f"--output_dir diffusers_ext/zoo/{name}" in card


def test_classifier_heldout_accuracy(classifier):
    assert isinstance(classifier, ConvImageClassifier)
    images, labels = load_digits_images("heldout", resolution=classifier.config.sample_size)
    assert classifier_accuracy(classifier, images, labels) >= 0.97


def test_ddpm_samples_are_their_class_and_close_to_real_digits(pipe, classifier):
    assert isinstance(pipe, ClassConditionalDDPMPipeline)
    report = evaluate_digits_generator(
        pipe, classifier, samples_per_class=20, num_inference_steps=25, guidance_scale=1.0, seed=0
    )
    assert report.conditional_accuracy >= 0.90, report.per_class_accuracy
    # Same-size real reference: 200 real train digits vs the held-out set.
    train, _ = load_digits_images("train", resolution=8)
    subset = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:200]]
    _, real_features = classifier_predictions(classifier, subset)
    _, heldout_features = classifier_predictions(classifier, load_digits_images("heldout", resolution=8)[0])
    reference = frechet_distance(real_features, heldout_features)
    assert report.frechet_distance <= 2 * reference, (report.frechet_distance, reference)


def test_unconditional_samples_differ_from_a_fixed_class(pipe, classifier):
    generator = torch.Generator().manual_seed(1)
    images = pipe(batch_size=100, num_inference_steps=25, generator=generator, output_type="pt").images * 2 - 1
    predictions, _ = classifier_predictions(classifier, images)
    # Unconditional samples cover many digits, not one.
    assert len(torch.unique(predictions)) >= 8


def test_graph_flow_tree16_samples_trees_as_its_card_says():
    from diffusers_ext import GraphFlowPipeline
    from diffusers_ext.data.graphs import spectre_splits
    from diffusers_ext.metrics.graphs import vun

    pipe = zoo.load("graph-flow-tree16")
    assert isinstance(pipe, GraphFlowPipeline)
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(1000)  # the first test generator of benchmarks/graph_grpo/graph_grpo.py
    graphs = pipe(num_graphs=40, num_nodes=16, num_inference_steps=50, generator=generator).graphs
    scores = vun(graphs, spectre_splits("tree", 16, 0)["train"], "tree")
    # the card measures V.U.N. 0.585 over 5 seeds (0.575 on this one)
    assert scores["vun"] >= 0.4 and scores["unique"] >= 0.9, scores


def _tiny_call(name, loaded):
    """One small call of the loaded entry `name`; returns its output tensor (or the texts of a language model)."""
    generator = torch.Generator().manual_seed(0)
    if name in ("digits-classifier", "digits-augmentation-regressor"):
        return loaded(torch.zeros(2, 1, 8, 8))[0]
    if name == "procedural-semantic-encoder":
        size = loaded.config.image_size
        return loaded(pixel_values=torch.zeros(1, loaded.config.num_channels, size, size)).last_hidden_state
    if name == "digits-ddpm":
        return loaded(class_labels=[3], num_inference_steps=2, generator=generator, output_type="pt").images
    if name == "digits-cm":
        return loaded(batch_size=1, num_inference_steps=1, generator=generator, output_type="pt").images
    if name == "digits-sd3":
        images = loaded("3", height=8, width=8, max_sequence_length=8, num_inference_steps=2, output_type="pt")
        return images.images
    if name == "mosaic-sd3-64":
        kwargs = {"height": 64, "width": 64, "max_sequence_length": 8, "num_inference_steps": 2, "output_type": "pt"}
        return loaded("a red circle", **kwargs).images
    if name in ("mosaic-t2i", "mosaic-t2i-64"):
        side = 64 if name == "mosaic-t2i-64" else 32
        return loaded("a red circle", height=side, width=side, num_inference_steps=2, output_type="pt").images
    if name in ("addition-mdm", "sudoku-mdm", "lomdm-markov"):
        prompt = "<|bos|>" if name == "lomdm-markov" else "1"
        out = loaded(prompt=prompt, gen_length=4, num_inference_steps=4, generator=generator, output_type="seq")
        return out.sequences.float()
    if name == "navigation-planner":
        plans = loaded(
            [-0.5, 0.0], [0.5, 0.0], torch.zeros(0, 3), batch_size=1, num_inference_steps=2, generator=generator
        )
        return plans.trajectories
    if name == "graph-flow-tree16":
        out = loaded(num_graphs=2, num_nodes=16, num_inference_steps=2, generator=generator, output_type="dense")
        return out.graphs.float()
    if name.startswith("procedural-nvs"):
        from diffusers_ext.data.procedural_scenes import sample_scene_batch

        scene = sample_scene_batch(torch.Generator().manual_seed(0), 1, 2, loaded.unet.config.sample_size)
        mode = "none" if loaded.semantic_encoder is None else "warped+iterative"
        return loaded(
            images=scene["images"][:, :1],
            input_intrinsics=scene["intrinsics"][:, :1],
            input_c2w=scene["c2w"][:, :1],
            target_intrinsics=scene["intrinsics"][:, 1:],
            target_c2w=scene["c2w"][:, 1:],
            depths=scene["depths"][:, :1],
            semantic_mode=mode,
            num_inference_steps=2,
            generator=generator,
            output_type="pt",
        ).images
    raise AssertionError(f"no tiny call for the zoo entry {name!r}: add one")


@pytest.mark.parametrize("name", zoo.names())
def test_every_entry_loads_in_float32_and_runs_as_loaded(name):
    loaded = zoo.load(name)
    modules = loaded.components.values() if hasattr(loaded, "components") else [loaded]
    for module in modules:
        if isinstance(module, torch.nn.Module):
            dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
            assert dtypes <= {torch.float32}, (name, type(module).__name__, dtypes)
    if hasattr(loaded, "set_progress_bar_config"):
        loaded.set_progress_bar_config(disable=True)
    with torch.no_grad():
        output = _tiny_call(name, loaded)
    assert torch.isfinite(output).all()


def test_an_explicit_dtype_wins():
    pipe = zoo.load("digits-ddpm", dtype=torch.float16)
    assert pipe.unet.dtype == torch.float16
    encoder = zoo.load("procedural-semantic-encoder", dtype=torch.bfloat16)
    assert encoder.dtype == torch.bfloat16
