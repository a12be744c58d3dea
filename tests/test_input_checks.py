"""Bad input to what was added last (issue 59), one test per class of failure: NaN and impossible values that passed
silently; a user's CSV panel for EpiDiff; raw tracebacks before training; the demo's disc detector; generators as
diffusers passes them (a list, one per sample); the zoo's dtype and its classifier's input range. The Hub checks are in
tests/test_hub.py and tests/test_script_options.py. docs/input_checks.md is the table of what each entry point checks.
"""

import logging
import os

import numpy as np
import pytest
import torch
from script_launch import assert_one_line_argument_error, run_as_main, run_bad_arguments

from diffusers_ext.testing import (
    PipelineConformanceTests,
    count_module_forwards,
    get_dummy_components,
    get_dummy_inputs,
)
from diffusers_ext.utils import check_finite


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(REPO, "diffusers_ext", "zoo")
NAN, INF = float("nan"), float("inf")


# ------------------------------------------------------------------------------- 1. NaN and impossible values


def test_check_finite_names_the_argument_the_index_and_what_was_expected():
    check_finite("x", [1.0, 2.0])
    check_finite("x", torch.tensor([1, 2]))
    check_finite("radius", 0.5, greater_than=0)
    cases = [
        (("start", torch.tensor([0.0, NAN])), ValueError, "`start` must hold finite numbers, got nan at index 1."),
        (("a", np.array([[1.0, INF]])), ValueError, r"`a` must hold finite numbers, got inf at index \(0, 1\)\."),
        (("r", torch.tensor([0.2, -0.2]), {"greater_than": 0}), ValueError, "> 0, got -0.2 at index 1"),
        (("p", [0.5, 1.5], {"minimum": 0, "maximum": 1}), ValueError, r"in \[0, 1\], got 1.5 at index 1"),
        (("g", NAN, {"scalar": True}), ValueError, "`g` must be a finite number, got nan."),
        (("g", "3", {"scalar": True}), TypeError, "`g` must be a number, got '3'"),
        (("g", True), TypeError, "`g` must be a number or an array of numbers, got True"),
        (("m", torch.tensor([True])), TypeError, "torch.bool tensor"),
        (("v", [1.0, None]), TypeError, "must be a number or an array of numbers"),
    ]
    for call, error, message in cases:
        name, value, *kwargs = call
        with pytest.raises(error, match=message):
            check_finite(name, value, **(kwargs[0] if kwargs else {}))


@pytest.mark.parametrize(
    "class_name",
    [
        "DoobGuidedPlannerPipeline",
        "ConnectivityPipeline",
        "SurrogatePredictivePipeline",
        "OfflineOptimizationPipeline",
        "SampleThenEvaluatePipeline",
        "ClassConditionalDDPMPipeline",
    ],
)
def test_registered_bad_inputs_fail_by_name_before_any_forward(class_name):
    # the dummies of these pipelines register NaN / inf starts, goals, obstacles, negative radii, latents,
    # initial states, designs, scores and guidance scales (and generator lists of the wrong length); the suite
    # checks each raises a ValueError / TypeError naming the argument before any model forward
    import diffusers_ext

    suite = PipelineConformanceTests()
    suite.pipeline_class = getattr(diffusers_ext, class_name)
    suite.test_bad_inputs_raise_before_any_forward()


def test_doob_planner_refuses_nan_and_impossible_maps_naming_the_entry():
    from diffusers_ext import DoobGuidedPlannerPipeline

    pipe = DoobGuidedPlannerPipeline(**get_dummy_components(DoobGuidedPlannerPipeline))
    pipe.set_progress_bar_config(disable=True)
    inputs = get_dummy_inputs(DoobGuidedPlannerPipeline)
    cases = [
        ({"start": torch.tensor([-0.8, NAN])}, "`start` must hold finite numbers, got nan at index 1"),
        ({"obstacles": [[0.0, 0.0, 0.2], [0.5, 0.5, -0.1]]}, r"`obstacles\[:, 2\]` must hold radii > 0, got -0.1 at"),
        ({"obstacles": [[0.0, NAN, 0.2]]}, r"`obstacles` must hold finite numbers, got nan at index \(0, 1\)"),
    ]
    with count_module_forwards(pipe) as counts:
        for overrides, message in cases:
            with pytest.raises(ValueError, match=message):
                pipe(**{**inputs, **overrides})
        with pytest.raises(ValueError, match="`obstacles"):  # the constraint of a guidance is checked alike
            pipe.constraint([[0.0, 0.0, -0.3]])
    assert not any(counts.values())
    # a map with a clear obstacle still plans, and "satisfied" is judged against real discs
    out = pipe(**inputs)
    assert out.trajectories.shape == (1, 16, 2) and np.isfinite(out.trajectories).all()


def test_nan_guidance_scale_is_refused_with_the_right_reason():
    from diffusers_ext import ClassConditionalDDPMPipeline

    pipe = ClassConditionalDDPMPipeline(**get_dummy_components(ClassConditionalDDPMPipeline))
    inputs = get_dummy_inputs(ClassConditionalDDPMPipeline)
    with pytest.raises(ValueError, match="`guidance_scale` must be a finite number, got nan"):
        pipe(**{**inputs, "guidance_scale": NAN})  # was "must be a number, got float"
    with pytest.raises(TypeError, match="`guidance_scale` must be a number, got '3'"):
        pipe(**{**inputs, "guidance_scale": "3"})


def test_offline_optimization_refuses_nan_scores():
    from diffusers_ext import OfflineOptimizationPipeline

    pipe = OfflineOptimizationPipeline(**get_dummy_components(OfflineOptimizationPipeline))
    pipe.set_progress_bar_config(disable=True)
    inputs = get_dummy_inputs(OfflineOptimizationPipeline)
    y = inputs["y"].copy()
    y[7] = np.nan
    with count_module_forwards(pipe) as counts, pytest.raises(ValueError, match="`y` must hold finite .* index 7"):
        pipe(**{**inputs, "y": y})
    assert not any(counts.values())


def test_train_spade_refuses_a_data_file_with_nan_targets(tmp_path):
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    y = x.sum(1)
    y[5] = np.nan
    np.savez(tmp_path / "mine.npz", x=x, y=y)
    out = tmp_path / "out"
    argv = ["--output_dir", str(out), "--data_file", str(tmp_path / "mine.npz"), "--max_train_steps", "2"]
    (run,) = run_as_main(os.path.join(REPO, "training", "train_spade.py"), [argv])
    assert_one_line_argument_error(run, "`y` must hold finite numbers, got nan at index 5")
    assert "mine.npz" in run[1].strip().splitlines()[-1]
    assert not (out / "model_index.json").exists()  # nothing trained or saved


# ------------------------------------------------------------------------------- 2. EpiDiff CSV panels

PANELS = {
    "empty date": (
        "date,a,b\n2020-01-01,1,2\n,3,3\n2020-01-15,4,5\n",
        "row 3, column 'date': the time label is empty",
    ),
    "duplicated date": (
        "date,a,b\n2020-01-01,1,2\n2020-01-08,3,3\n2020-01-08,4,5\n",
        "rows 3 and 4, column 'date': the time '2020-01-08' appears twice",
    ),
    "out of order": (
        "date,a,b\n2020-01-01,1,2\n2020-01-15,3,3\n2020-01-08,4,5\n2020-01-22,4,5\n",
        "row 4, column 'date': '2020-01-08' is listed after '2020-01-15' \\(row 3\\) but is not later",
    ),
    "skipped date": (
        "date,a,b\n2020-01-01,1,2\n2020-01-08,3,3\n2020-01-22,4,5\n2020-01-29,4,5\n",
        "row 4, column 'date': '2020-01-22' follows '2020-01-08' \\(row 3\\), skipping 1 step",
    ),
    "duplicate region": ("date,a,a\n2020-01-01,1,2\n2020-01-08,3,3\n", "row 1: columns 2 and 3 are both named 'a'"),
    "inf count": ("date,a,b\n2020-01-01,1,inf\n2020-01-08,3,3\n", "row 2, column 'b': 'inf' is not a finite value"),
    "all-missing region": (
        "date,a,b\n2020-01-01,1,\n2020-01-08,3,NA\n",
        "column 'b': the region has no observed count",
    ),
    "non-number cell": ("date,a,b\n2020-01-01,1,abc\n2020-01-08,3,3\n", "row 2, column 'b': 'abc' is not a number"),
    "negative count": ("week,a,b\n1,1,-2\n2,3,3\n", "row 2, column 'b': -2 is a negative count"),
}


@pytest.mark.parametrize("case", list(PANELS))
def test_csv_panel_errors_name_the_file_the_row_and_the_column(tmp_path, case):
    from diffusers_ext.data.epidemics import load_counts_csv

    text, message = PANELS[case]
    path = tmp_path / "counts.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^'{path}' {message}"):
        load_counts_csv(str(path))


def test_csv_panel_reports_what_was_filled(tmp_path, caplog):
    from diffusers_ext.data.epidemics import load_counts_csv

    path = tmp_path / "counts.csv"
    path.write_text("date,a,b\n2020-01-01,1,2\n2020-01-08,,3\n2020-01-15,4,\n2020-01-22,5,6\n")
    logger = logging.getLogger("diffusers_ext.data.epidemics")
    logger.addHandler(caplog.handler)
    try:
        series = load_counts_csv(str(path))
    finally:
        logger.removeHandler(caplog.handler)
    assert series.extra["filled"] == {"a": ["2020-01-08"], "b": ["2020-01-15"]}
    assert series.values[1, 0] == 2.5 and series.values[2, 1] == 4.5 and series.observed.sum() == 6
    assert "filled 2 missing count(s) by linear interpolation" in caplog.text
    assert "'a' at '2020-01-08'; 'b' at '2020-01-15'" in caplog.text


def test_train_epidiff_names_the_bad_cell_of_the_panel(tmp_path):
    counts = tmp_path / "counts.csv"
    rows = [f"2020-01-{day:02d},{day},{day + 1}" for day in range(1, 21)]
    rows[6] = "2020-01-07,7,abc"
    counts.write_text("date,a,b\n" + "\n".join(rows) + "\n")
    argv = ["--output_dir", str(tmp_path / "out"), "--dataset_name", "csv", "--counts_csv", str(counts)]
    (run,) = run_as_main(os.path.join(REPO, "training", "train_epidiff.py"), [argv])
    assert_one_line_argument_error(run, f"'{counts}' row 8, column 'b': 'abc' is not a number")


# ------------------------------------------------------------------------------- 3. raw tracebacks before training


def test_training_scripts_name_a_wrong_folder_or_value_before_training(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    import PIL.Image

    PIL.Image.new("RGB", (32, 32)).save(images / "a.png")
    cases = {
        "train_parameter_diffusion.py": [
            (
                ["--classifier_path", os.path.join(ZOO, "digits-ddpm")],
                "holds a ClassConditionalDDPMPipeline pipeline (model_index.json), not a ConvImageClassifier model",
            )
        ],
        "train_trajectory_diffusion.py": [(["--num_train_timesteps", "0"], "--num_train_timesteps must be >= 1")],
        "train_text_to_image_from_scratch.py": [
            (["--train_data_dir", str(images)], "is a plain image folder (1 image file(s) at its top level)")
        ],
        "train_text_to_image_sd3.py": [
            (
                ["--pretrained_vae_model_name_or_path", os.path.join(ZOO, "digits-ddpm", "unet")],
                "holds a UNet2DModel model (config.json), not an AutoencoderKL model folder",
            ),
            (
                ["--pretrained_vae_model_name_or_path", os.path.join(ZOO, "mosaic-t2i", "unet")],
                "holds a UNet2DConditionModel model (config.json), not an AutoencoderKL model folder",
            ),
        ],
    }
    for script, script_cases in cases.items():
        runs = run_bad_arguments(os.path.join(REPO, "training", script), script_cases, tmp_path / script)
        for run, (_, message) in zip(runs, script_cases):
            assert_one_line_argument_error(run, message)


def test_planner_refuses_a_horizon_its_unet_cannot_take():
    from diffusers_ext import DoobGuidedPlannerPipeline, zoo

    pipe = zoo.load("navigation-planner")  # three down blocks: the length is halved twice
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe, DoobGuidedPlannerPipeline)
    with count_module_forwards(pipe) as counts:
        with pytest.raises(ValueError, match="`horizon` 30 cannot .* a multiple of 4 \\(e.g. 28 or 32\\)"):
            pipe([-0.8, -0.8], [0.8, 0.8], [[0.0, 0.0, 0.2]], batch_size=1, num_inference_steps=2, horizon=30)
    assert not any(counts.values())
    out = pipe([-0.8, -0.8], [0.8, 0.8], [[0.0, 0.0, 0.2]], batch_size=1, num_inference_steps=2, horizon=36)
    assert out.trajectories.shape == (1, 36, 2)


def _purify(capsys, *args):
    from diffusers_ext.cli import main

    try:
        code = main(["purify", *args, "--num_iterations", "1", "--num_inversion_steps", "1"])
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr()


def test_purify_runs_a_float16_zoo_model_on_rgb_and_names_a_classifier_folder(tmp_path, capsys):
    import PIL.Image

    rgb = tmp_path / "photo.png"
    PIL.Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(rgb)
    # mosaic-t2i stores float16 weights: purify loads it in float32 (it failed with "Half != float" on the CPU)
    code, printed = _purify(capsys, str(rgb), "--out", str(tmp_path / "out"), "--model", "mosaic-t2i")
    assert code == 0, printed.err[-2000:]
    assert sorted(os.listdir(tmp_path / "out")) == ["photo.png", "purification.json"]
    classifier = os.path.join(ZOO, "digits-classifier")
    code, printed = _purify(capsys, str(rgb), "--out", str(tmp_path / "out2"), "--model", classifier)
    last = printed.err.strip().splitlines()[-1]
    assert code == 2 and "holds a ConvImageClassifier model (config.json), not a pipeline folder" in last, last
    assert "Traceback" not in printed.err and not (tmp_path / "out2").exists()


# ------------------------------------------------------------------------------- 5. the demo's disc detector


def _canvas(*shapes):
    """`(1, 3, 16, 16)` image in [0, 1]: each `(colour, mask)` painted at full strength on black."""
    from diffusers_ext.evaluation.divide_and_denoise.placements import COLOURS

    image = np.zeros((3, 16, 16), dtype=np.float32)
    for colour, mask in shapes:
        for channel, value in enumerate(COLOURS[colour]):
            image[channel][mask] = (value + 1) / 2
    return image[None]


def _disc_mask(cx, cy, r):
    yy, xx = np.mgrid[0:16, 0:16] + 0.5
    return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r


def test_disc_detector_judges_shape_and_size():
    from diffusers_ext.evaluation.divide_and_denoise.composition import disc_templates
    from diffusers_ext.evaluation.divide_and_denoise.placements import count_colour_blobs, count_colour_discs, is_disc

    # rendered discs: every radius of the experts (2-3 px) at random sub-pixel centres is one disc
    rendered = disc_templates((1.0, -1.0, -1.0), (4.0, 12.0), (4.0, 12.0), 200, (2.0, 3.0), seed=0)
    rendered = (rendered + 1) / 2
    assert (count_colour_discs(rendered, ["red"])[:, 0] == 1).all()
    # slivers (the thin strips MultiDiffusion's region boundaries leave) are blobs of >= 8 pixels but no discs
    slivers = [np.zeros((16, 16), bool) for _ in range(3)]
    slivers[0][4:6, 3:11] = True  # 2 x 8
    slivers[1][3:13, 7] = True  # 1 x 10
    slivers[2][5:8, 4:12] = True  # 3 x 8
    for mask in slivers:
        image = _canvas(("red", mask))
        assert count_colour_blobs(image, ["red"])[0, 0] == 1 and count_colour_discs(image, ["red"])[0, 0] == 0
    # partial discs: a disc halved by a region boundary, and a third of one, are not discs
    for r in (2.5, 3.0):
        half = _disc_mask(8.3, 8.1, r) & (np.mgrid[0:16, 0:16][1] < 8)
        assert not is_disc(half), r
        third = _disc_mask(8.3, 8.1, r) & (np.mgrid[0:16, 0:16][0] >= 9)
        assert not is_disc(third), r
    # too small, too large, a ring: no disc; a clean disc whose rim is a little below full strength still is one
    assert not is_disc(_disc_mask(8, 8, 1.2)) and not is_disc(_disc_mask(8, 8, 4.5))
    assert not is_disc(_disc_mask(8, 8, 3.0) & ~_disc_mask(8, 8, 1.6))
    soft = _canvas(("blue", _disc_mask(8.0, 8.0, 2.6)))
    soft[0, 2][_disc_mask(8.0, 8.0, 2.6) & ~_disc_mask(8.0, 8.0, 1.5)] = 0.95
    assert count_colour_discs(soft, ["blue"], min_intensity=0.99)[0, 0] == 1
    assert count_colour_blobs(soft, ["blue"], min_intensity=0.99)[0, 0] == 0  # the blob counter loses it
    # a faded disc does not reach the calibrated strength
    assert count_colour_discs(soft * 0.8, ["blue"], min_intensity=0.9)[0, 0] == 0
    # two discs of one colour are two
    two = _canvas(("red", _disc_mask(4.5, 4.5, 2.5) | _disc_mask(11.5, 11.5, 2.5)))
    assert count_colour_discs(two, ["red"])[0, 0] == 2


# ------------------------------------------------------------------------------ 6. generators, one per sample


def _generators(n):
    return [torch.Generator().manual_seed(10 + i) for i in range(n)]


def test_doob_planner_batch_rows_equal_their_single_runs_with_guidance():
    from diffusers_ext import DoobGuidance, DoobGuidedPlannerPipeline

    pipe = DoobGuidedPlannerPipeline(**get_dummy_components(DoobGuidedPlannerPipeline))
    pipe.set_progress_bar_config(disable=True)
    obstacles = torch.tensor([[0.0, 0.0, 0.2], [0.4, -0.3, 0.15]])
    constraint = pipe.constraint(obstacles)

    def plan(batch_size, generator):
        guidance = DoobGuidance(constraint=constraint.satisfied, cost=constraint.cost, num_rollouts=3)
        call = {"start": [-0.8, -0.8], "goal": [0.8, 0.8], "obstacles": obstacles, "num_inference_steps": 3}
        return pipe(**call, batch_size=batch_size, generator=generator, guidance=guidance).trajectories

    batch = plan(3, _generators(3))  # failed inside torch.randn with a raw TypeError
    singles = torch.cat([plan(1, g) for g in _generators(3)])
    torch.testing.assert_close(batch, singles, rtol=0, atol=1e-5)
    assert not torch.allclose(batch[0], batch[1])


def test_class_conditional_guided_batch_rows_equal_their_single_runs():
    from diffusers_ext import ClassConditionalDDPMPipeline, DoobGuidance

    pipe = ClassConditionalDDPMPipeline(**get_dummy_components(ClassConditionalDDPMPipeline))
    pipe.set_progress_bar_config(disable=True)

    def sample(labels, generator):
        guidance = DoobGuidance(cost=lambda x0: x0.flatten(1).mean(1), estimator="mc", num_rollouts=2)
        return pipe(
            class_labels=labels, num_inference_steps=2, generator=generator, guidance=guidance, output_type="np"
        )

    batch = sample([0, 1], _generators(2)).images  # refused before: "the guidance's rollouts draw from one stream"
    singles = np.concatenate([sample([label], g).images for label, g in zip([0, 1], _generators(2))])
    np.testing.assert_allclose(batch, singles, atol=1e-5)


def test_sample_then_evaluate_hypotheses_equal_their_single_runs_whatever_the_chunks():
    from diffusers_ext import SampleThenEvaluatePipeline

    pipe = SampleThenEvaluatePipeline(**get_dummy_components(SampleThenEvaluatePipeline))
    pipe.set_progress_bar_config(disable=True)
    inputs = get_dummy_inputs(SampleThenEvaluatePipeline)
    batch = pipe(**{**inputs, "num_hypotheses": 4, "generator": _generators(4), "sampling_batch_size": 3}).hypotheses
    singles = [pipe(**{**inputs, "num_hypotheses": 1, "generator": g}).hypotheses for g in _generators(4)]
    singles = np.concatenate(singles)
    np.testing.assert_allclose(batch, singles, atol=1e-5)


def test_surrogate_predictive_designs_equal_their_single_runs_and_the_search_refuses_a_list():
    from diffusers_ext import OfflineOptimizationPipeline, SurrogatePredictivePipeline

    pipe = SurrogatePredictivePipeline(**get_dummy_components(SurrogatePredictivePipeline))
    pipe.set_progress_bar_config(disable=True)
    x = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    batch = pipe(x, num_samples=5, num_inference_steps=2, generator=_generators(3), output_type="np").samples
    call = {"num_samples": 5, "num_inference_steps": 2, "output_type": "np"}
    singles = [pipe(x[i : i + 1], generator=g, **call).samples for i, g in enumerate(_generators(3))]
    np.testing.assert_allclose(batch, np.concatenate(singles, axis=1), atol=1e-5)
    search = OfflineOptimizationPipeline(**get_dummy_components(OfflineOptimizationPipeline))
    inputs = get_dummy_inputs(OfflineOptimizationPipeline)
    with pytest.raises(TypeError, match="one torch.Generator or None, got a list of 8: the search evolves one"):
        search(**{**inputs, "generator": _generators(8)})


# ------------------------------------------------------------------------------- 7. the zoo


def test_zoo_refuses_a_bogus_dtype_and_its_classifier_out_of_range_input():
    from diffusers_ext import zoo

    with pytest.raises(ValueError, match="`torch_dtype` must be a torch.dtype or its name .* got 'float17'"):
        zoo.load("digits-classifier", torch_dtype="float17")
    assert zoo.load("digits-classifier", torch_dtype="float16").dtype == torch.float16  # a name is converted
    classifier = zoo.load("digits-classifier")
    digits = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    classifier(digits)  # [-1, 1], as documented
    with pytest.raises(ValueError, match=r"values in \[.*\]; expected images in \[-1, 1\].*x / 127.5 - 1"):
        classifier((digits + 1) * 127.5)  # [0, 255] used to get confident verdicts
    with pytest.raises(ValueError, match="`pixel_values` must hold finite numbers"):
        classifier(torch.full((1, 1, 8, 8), NAN))
