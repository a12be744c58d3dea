"""Doob guidance on an image model: the class-conditional pipeline's `guidance=` argument, `ClassifierConstraint`,
the independent digits judge, and the report of `benchmarks/doob_guidance/doob_guidance_digits.py`."""

import math
import os

import pytest
import torch
from benchmark_scripts import load_benchmark
from diffusers import EulerDiscreteScheduler

from diffusers_ext import ClassConditionalDDPMPipeline, ClassifierConstraint, DoobGuidance, zoo
from diffusers_ext.data.digits import load_digits_images
from diffusers_ext.evaluation.doob_guidance import model_evaluations_per_candidate, plan_with_budget
from diffusers_ext.evaluation.doob_guidance_digits import PixelDigitJudge, PixelPCAFeatures
from diffusers_ext.testing import count_module_forwards, get_dummy_components


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def benchmark():
    return load_benchmark("doob_guidance_digits", "doob_guidance_digits_benchmark")


def tiny_pipeline() -> ClassConditionalDDPMPipeline:
    pipe = ClassConditionalDDPMPipeline(**get_dummy_components(ClassConditionalDDPMPipeline, seed=0))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def brightness(x0):
    return x0.flatten(1).mean(1) + 1.0  # >= 0 on images in [-1, 1]; guidance makes them darker


@pytest.fixture(scope="module")
def digits():
    pipe = zoo.load("digits-ddpm")
    pipe.set_progress_bar_config(disable=True)
    return pipe, ClassifierConstraint(zoo.load("digits-classifier"), target_class=3, min_probability=0.9)


@pytest.mark.parametrize("estimator", ["tweedie", "mc", "path_integral"])
def test_guided_call_shape_dtype_and_evaluation_count(estimator):
    pipe = tiny_pipeline()
    guidance = DoobGuidance(cost=brightness, estimator=estimator, num_rollouts=4, jacobian="identity")
    out = pipe(
        class_labels=[0, 1, 2],
        num_inference_steps=3,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        guidance=guidance,
    )
    assert out.images.shape == (3, 1, 8, 8) and out.images.dtype == torch.float32
    assert torch.isfinite(out.images).all()
    per_step = 2 if estimator == "tweedie" else 1  # a backward counts like a forward; one-jump rollouts are free
    assert guidance.num_model_evaluations == 3 * 3 * per_step
    plain = pipe(
        class_labels=[0, 1, 2], num_inference_steps=3, generator=torch.Generator().manual_seed(0), output_type="pt"
    ).images
    assert not torch.allclose(plain, out.images)  # the guidance moved the samples
    assert out.images.mean() < plain.mean()  # towards lower cost (darker)


def test_rollouts_repeat_each_images_label_under_classifier_free_guidance():
    pipe = tiny_pipeline()
    calls = []

    def hook(module, args, kwargs):
        calls.append(kwargs["class_labels"].tolist())

    handle = pipe.unet.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        guidance = DoobGuidance(cost=brightness, estimator="mc", num_rollouts=2, rollout_steps=2)
        pipe(class_labels=[1, 2], num_inference_steps=2, guidance_scale=3.0, guidance=guidance, output_type="pt")
    finally:
        handle.remove()
    null = pipe.config.null_class_label
    assert [null, null, 1, 2] in calls  # the step's own forward: null branch, then the conditional one
    assert [null] * 4 + [1, 1, 2, 2] in calls  # a rollout forward: each image's rows repeated, labels alike


def test_bad_guidance_arguments_raise_by_name_before_any_forward():
    pipe = tiny_pipeline()
    guidance = DoobGuidance(cost=brightness)
    with count_module_forwards(pipe) as counts:
        with pytest.raises(TypeError, match="`guidance`"):
            pipe(class_labels=[0], num_inference_steps=2, guidance=brightness)
        with pytest.raises(ValueError, match="`generator`"):
            pipe(class_labels=[0], num_inference_steps=2, guidance=guidance, generator=[torch.Generator()] * 2)
        pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
        with pytest.raises(ValueError, match="EulerDiscreteScheduler"):
            pipe(class_labels=[0], num_inference_steps=2, guidance=guidance)
    assert counts == {"unet": 0}


def test_classifier_constraint_on_real_digits_and_its_bad_arguments(digits):
    _, constraint = digits
    images, labels = load_digits_images("heldout", resolution=8)
    threes, others = images[labels == 3][:20], images[labels == 5][:20]
    assert constraint.satisfied(threes).float().mean() >= 0.9
    assert not constraint.satisfied(others).any()
    cost = constraint.cost(torch.cat([threes, others]))
    satisfied = constraint.satisfied(torch.cat([threes, others]))
    assert torch.equal(cost == 0, satisfied)  # the relaxation is 0 exactly on the feasible set
    x = others.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(constraint.cost(x).sum(), x)
    assert grad.abs().sum() > 0
    with pytest.raises(ValueError, match="target_class"):
        ClassifierConstraint(constraint.classifier, target_class=-1)
    with pytest.raises(ValueError, match="min_probability"):
        ClassifierConstraint(constraint.classifier, target_class=3, min_probability=1.5)
    with pytest.raises(ValueError, match="x0"):
        constraint.satisfied(torch.zeros(2, 64))


def test_doob_guidance_raises_the_guide_probability_of_three_on_the_zoo_model(digits):
    pipe, constraint = digits

    def sample(guidance):
        images = pipe(
            batch_size=16,
            num_inference_steps=10,
            generator=torch.Generator().manual_seed(0),
            output_type="pt",
            guidance=guidance,
        ).images
        return constraint.log_probability(images * 2 - 1).exp()

    plain = sample(None)
    guidance = DoobGuidance(
        constraint=constraint.satisfied, cost=constraint.cost, estimator="mc", num_rollouts=16, scale=4.0
    )
    guided = sample(guidance)
    assert (plain >= 0.9).sum() <= 4  # headroom: few unguided 3s
    assert (guided >= 0.9).sum() >= (plain >= 0.9).sum() + 8
    assert guided.mean() > plain.mean() + 0.4
    assert guidance.num_model_evaluations == 16 * 10


def test_independent_judge_and_pixel_features():
    judge = PixelDigitJudge()
    assert judge.heldout_accuracy >= 0.97 and judge.heldout_size == 360
    images, labels = load_digits_images("heldout", resolution=8)
    assert torch.equal(judge.predict(images[:50]), PixelDigitJudge().predict(images[:50]))  # deterministic
    features = PixelPCAFeatures(num_components=8)
    assert features(images).shape == (len(images), 8)
    threes, fives = images[labels == 3], images[labels == 5]
    assert features.frechet_distance(threes, threes) == pytest.approx(0.0, abs=1e-6)
    assert features.frechet_distance(threes, fives) > 1.0
    with pytest.raises(ValueError, match="images"):
        judge.predict(torch.zeros(2, 64))


def test_benchmark_selection_costs_and_report():
    bench = benchmark()
    a, b = torch.zeros(3, 1, 8, 8), torch.ones(3, 1, 8, 8)
    scores = [torch.tensor([-1.0, 0.0, -0.5]), torch.tensor([0.0, -0.01, -2.0])]
    draws = []

    def draw(i):
        draws.append(i)
        return [a, b][i]

    def score(images):  # candidate a (zeros) has the first scores, b (ones) the second
        return scores[int(images[0, 0, 0, 0])]

    def accepts(images):
        return score(images) >= math.log(0.9)

    first, accepted, outputs = plan_with_budget(draw, 20, 40, accepts)
    assert first[:, 0, 0, 0].tolist() == [1.0, 0.0, 0.0]  # image 2: none accepted, keeps the first candidate
    assert accepted.tolist() == [True, True, False] and len(outputs) == 2
    draws.clear()
    best, accepted, outputs = plan_with_budget(draw, 20, 40, accepts, score=score)
    assert best[:, 0, 0, 0].tolist() == [1.0, 0.0, 0.0] and accepted.tolist() == [True, True, False]
    assert draws == [0, 1]
    draws.clear()
    only_a, _, _ = plan_with_budget(draw, 40, 40, accepts, score=score)  # the budget pays for one candidate
    assert only_a[:, 0, 0, 0].tolist() == [0.0, 0.0, 0.0] and draws == [0]
    assert model_evaluations_per_candidate("dps", {}, 20) == 40
    assert model_evaluations_per_candidate("doob", {"estimator": "mc"}, 20) == 20
    assert model_evaluations_per_candidate("doob", {"estimator": "path_integral", "jacobian": "model"}, 20) == 40
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "0", "1"])

    args = bench.parse_args([])

    def records(judged, bound=0.0):
        row = {"guide_satisfied": [True] * 10, "judge_satisfied": [True] * judged + [False] * (10 - judged)}
        row |= {"single_guide_satisfied": [True] * 5 + [False] * 5, "single_judge_satisfied": [False] * 10}
        row |= {"candidates_drawn": 1, "cost_per_candidate": 20, "evaluations": 20, "bound": bound, "kl": 0.1}
        return row

    judged = {"unguided": 1, "rejection": 2, "dps": 8, "doob": 9}
    results = {
        "settings": vars(args),
        "test": {
            m: {str(s): [records(j, bound=0.7 if s == 0 else 0.0)] for s in args.seeds} for m, j in judged.items()
        },
        "quality": {m: {"pixel_pca": 1.0, "guide_features": 2.0} for m in [*bench.METHODS, "real_train_threes"]},
        "judge": {"heldout_accuracy": 0.99, "heldout_size": 360},
        "validation": {
            m: {
                "validation": [{"name": "{}", "measurement": {"judge": 0.5, "guide": 0.5}}],
                "chosen": {"candidate": {}},
            }
            for m in bench.METHODS
        },
    }
    results["summary"] = summary = bench.summarise(results)
    assert bench.targets_from_results(results) == summary["targets"]
    targets = {t["name"]: t for t in summary["targets"]}
    assert targets["doob judge satisfaction above unguided (difference / SE)"]["met"]
    assert not targets["doob judge satisfaction above dps (difference / SE)"][
        "met"
    ]  # 0.9 vs 0.8 on 30 images each: 1.1 SE
    bound = targets["bound valid: share of test settings with rate >= bound"]
    assert bound["value"] == pytest.approx(2 / 3) and not bound["met"]  # seed 0: bound 0.7 above its rate 0.5
    lines = "\n".join(bench.report_sections(results))
    assert "| doob |" in lines and "valid on 2 of 3 test settings" in lines
