"""What measures or compares a method: judges, oracles, benchmark experts, attack suites and comparison baselines.

One module or folder per method (see docs/architecture.md). Nothing in a pipeline room imports this package; the
benchmarks, the demo, the training scripts' evaluations and the tests do. Names are imported lazily, as in the
top-level package: ``from diffusers_ext.evaluation import MarkovChainOracleLM``.
"""

from typing import TYPE_CHECKING


_import_structure = {
    "digits": ["DigitsGeneratorReport", "evaluate_digits_generator", "sample_digits"],
    "dirp.mimicry": ["MimicryReport", "evaluate_mimicry"],
    "dirp.protections": ["PROTECTIONS", "protect", "protection_loss"],
    "dirp.purifiers": ["PURIFIERS"],
    "divide_and_denoise.composition": [
        "centred_experts",
        "conflict_experts",
        "detect_discs",
        "digits_success",
        "disc_templates",
        "discs_success",
        "dominant_experts",
        "score_digit_slots",
    ],
    "divide_and_denoise.empirical_denoiser": ["EmpiricalOptimalDenoiser"],
    "divide_and_denoise.placements": [
        "colour_expert",
        "colour_object_scores",
        "colour_success",
        "count_colour_blobs",
        "layout_experts",
        "layout_regions",
        "random_layout",
    ],
    "protocol": [
        "binomial_standard_error",
        "calibrate_threshold",
        "mean_spread",
        "settings_code_hash",
        "target",
        "targets_met",
        "targets_status",
    ],
    "reporting": [
        "ResultCache",
        "add_from_results_argument",
        "choose_on_validation",
        "command",
        "rebuild_results",
        "run_jobs",
        "targets_table",
        "write_results",
    ],
    "semantic_nvs": ["SceneEvaluator", "bootstrap_frechet", "evaluator_accuracy", "train_scene_evaluator"],
    "soar": ["MarkovChainOracleLM"],
    "unlearning": ["ConceptUnlearningReport", "denoising_losses", "evaluate_concept_unlearning", "membership_summary"],
}

if TYPE_CHECKING:
    from .digits import DigitsGeneratorReport, evaluate_digits_generator, sample_digits
    from .dirp.mimicry import MimicryReport, evaluate_mimicry
    from .dirp.protections import PROTECTIONS, protect, protection_loss
    from .dirp.purifiers import PURIFIERS
    from .divide_and_denoise.composition import (
        centred_experts,
        conflict_experts,
        detect_discs,
        digits_success,
        disc_templates,
        discs_success,
        dominant_experts,
        score_digit_slots,
    )
    from .divide_and_denoise.empirical_denoiser import EmpiricalOptimalDenoiser
    from .divide_and_denoise.placements import (
        colour_expert,
        colour_object_scores,
        colour_success,
        count_colour_blobs,
        layout_experts,
        layout_regions,
        random_layout,
    )
    from .protocol import (
        binomial_standard_error,
        calibrate_threshold,
        mean_spread,
        settings_code_hash,
        target,
        targets_met,
        targets_status,
    )
    from .reporting import (
        ResultCache,
        add_from_results_argument,
        choose_on_validation,
        command,
        rebuild_results,
        run_jobs,
        targets_table,
        write_results,
    )
    from .semantic_nvs import SceneEvaluator, bootstrap_frechet, evaluator_accuracy, train_scene_evaluator
    from .soar import MarkovChainOracleLM
    from .unlearning import ConceptUnlearningReport, denoising_losses, evaluate_concept_unlearning, membership_summary
else:
    import sys

    from .._lazy_module import LazyModule

    sys.modules[__name__] = LazyModule(__name__, globals()["__file__"], _import_structure, module_spec=__spec__)
