"""What measures or compares a method: judges, oracles, benchmark experts, attack suites and comparison baselines.

One module or folder per method (see docs/architecture.md). Nothing in a pipeline room imports this package; the
benchmarks, the demo, the training scripts' evaluations and the tests do. Names are imported lazily, as in the
top-level package: ``from diffusers_ext.evaluation import MarkovChainOracleLM``.
"""

from typing import TYPE_CHECKING


_import_structure = {
    "connectivity": [
        "TOLERANCES",
        "attractor_summary",
        "limit_cycle_summary",
        "loading_distances",
        "reproduces_attractor",
        "ring_summary",
        "stable_fixed_points",
    ],
    "consistency": ["ClassifierFeatureDistance", "sample_consistency_model", "train_judge_classifier"],
    "digits": ["DigitsGeneratorReport", "evaluate_digits_generator", "sample_digits"],
    "spade": [
        "SPADE_VARIANTS",
        "MLPRegressor",
        "best_of_offline",
        "fit_regressor",
        "gradient_ascent",
        "regressor_search",
        "spade_search",
        "train_spade",
    ],
    "epidiff": ["QUANTILE_LEVELS", "gamma_draws", "quantile_loss", "summarize_scores", "window_scores"],
    "doob_guidance": [
        "model_evaluations_per_candidate",
        "plan_with_budget",
        "project_out_of_discs",
        "projection_guidance",
    ],
    "doob_guidance_digits": ["PixelDigitJudge", "PixelPCAFeatures"],
    "federated_recommendation": ["flip_training_positives", "taste_coverage", "top_k_kendall_tau"],
    "dirp.latent_mimicry": ["mimic_frechet", "sample_mimic"],
    "dirp.latent_protections": ["inversion_amplification", "protect_for_prompt"],
    "dirp.mimicry": ["MimicryReport", "evaluate_mimicry"],
    "dirp.protections": ["PROTECTIONS", "protect", "protection_loss"],
    "dirp.purifiers": ["PURIFIERS"],
    "discrete_flow": [
        "BernoulliMixtureJudge",
        "HMMJudge",
        "exact_nll_bounds",
        "generative_perplexity",
        "sample_diversity",
    ],
    "certified_transfer": [
        "DigitsLoRAProxy",
        "episode_classes",
        "fit_upstream_adapters",
        "gaussian_fit_sample",
        "isotropic_gaussian_kl",
        "load_proxy",
        "make_task",
        "monte_carlo_risk_bound",
        "pac_bayes_bound",
        "parameter_count_bound",
        "sgd_pac_bayes_bound",
        "split_class_combinations",
    ],
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
    "divide_and_denoise.mosaic_composition": ["make_prompts", "oracle_regions"],
    "divide_and_denoise.region_multidiffusion": [
        "RegionMultiDiffusion",
        "WindowMultiDiffusion",
        "partition_masks",
        "window_corners",
    ],
    "divide_and_denoise.placements": [
        "colour_expert",
        "colour_object_scores",
        "colour_success",
        "count_colour_blobs",
        "layout_experts",
        "layout_regions",
        "random_layout",
    ],
    "lomdm": [
        "markov_checksum_entropy_rate",
        "markov_checksum_log_likelihood",
        "markov_checksum_sample_quality",
        "nelbo_per_sequence",
    ],
    "fast_dllm_reference": ["CountedForwards", "FastDLLM", "load_fast_dllm", "published_model"],
    "brain_network_flow": [
        "RawUpperTriangleCodec",
        "codec_against_raw",
        "mean_error",
        "mmd_to_truth",
        "trend_error",
        "upper_triangle",
        "validity",
    ],
    "manifold_flow": [
        "GaussianMixtureVelocityModel",
        "PlainFlowTransformerModel",
        "manifold_sliced_wasserstein",
        "model_velocity_fn",
        "off_manifold_rms",
        "sample_latent_flow",
        "sample_pipeline",
        "train_velocity_model",
        "velocity_errors",
        "velocity_errors_along",
    ],
    "mosaic": [
        "FeatureNetReport",
        "MosaicDetection",
        "MosaicEvaluator",
        "MosaicFeatureNet",
        "capability_on_validation",
        "corrupt_prompt",
        "evaluate_text_to_image",
        "image_features",
        "summarize",
        "train_feature_net",
    ],
    "mosaic_finetune": ["finetune_unet", "unet_with_lora"],
    "mosaic_unlearning": [
        "asks_for",
        "concept_kind",
        "concept_presence",
        "concept_prompt_sets",
        "judge_accuracy",
        "sample_prompts",
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
        "without_machine_paths",
        "write_results",
    ],
    "semantic_nvs": ["SceneEvaluator", "bootstrap_frechet", "evaluator_accuracy", "train_scene_evaluator"],
    "soar": ["MarkovChainOracleLM"],
    "soar_headroom": ["oracle_order_search"],
    "unlearning": ["ConceptUnlearningReport", "denoising_losses", "evaluate_concept_unlearning", "membership_summary"],
}

if TYPE_CHECKING:
    from .brain_network_flow import (
        RawUpperTriangleCodec,
        codec_against_raw,
        mean_error,
        mmd_to_truth,
        trend_error,
        upper_triangle,
        validity,
    )
    from .certified_transfer import (
        DigitsLoRAProxy,
        episode_classes,
        fit_upstream_adapters,
        gaussian_fit_sample,
        isotropic_gaussian_kl,
        load_proxy,
        make_task,
        monte_carlo_risk_bound,
        pac_bayes_bound,
        parameter_count_bound,
        sgd_pac_bayes_bound,
        split_class_combinations,
    )
    from .connectivity import (
        TOLERANCES,
        attractor_summary,
        limit_cycle_summary,
        loading_distances,
        reproduces_attractor,
        ring_summary,
        stable_fixed_points,
    )
    from .consistency import ClassifierFeatureDistance, sample_consistency_model, train_judge_classifier
    from .digits import DigitsGeneratorReport, evaluate_digits_generator, sample_digits
    from .dirp.latent_mimicry import mimic_frechet, sample_mimic
    from .dirp.latent_protections import inversion_amplification, protect_for_prompt
    from .dirp.mimicry import MimicryReport, evaluate_mimicry
    from .dirp.protections import PROTECTIONS, protect, protection_loss
    from .dirp.purifiers import PURIFIERS
    from .discrete_flow import (
        BernoulliMixtureJudge,
        HMMJudge,
        exact_nll_bounds,
        generative_perplexity,
        sample_diversity,
    )
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
    from .divide_and_denoise.mosaic_composition import make_prompts, oracle_regions
    from .divide_and_denoise.placements import (
        colour_expert,
        colour_object_scores,
        colour_success,
        count_colour_blobs,
        layout_experts,
        layout_regions,
        random_layout,
    )
    from .divide_and_denoise.region_multidiffusion import (
        RegionMultiDiffusion,
        WindowMultiDiffusion,
        partition_masks,
        window_corners,
    )
    from .doob_guidance import (
        model_evaluations_per_candidate,
        plan_with_budget,
        project_out_of_discs,
        projection_guidance,
    )
    from .doob_guidance_digits import PixelDigitJudge, PixelPCAFeatures
    from .epidiff import QUANTILE_LEVELS, gamma_draws, quantile_loss, summarize_scores, window_scores
    from .fast_dllm_reference import CountedForwards, FastDLLM, load_fast_dllm, published_model
    from .federated_recommendation import flip_training_positives, taste_coverage, top_k_kendall_tau
    from .lomdm import (
        markov_checksum_entropy_rate,
        markov_checksum_log_likelihood,
        markov_checksum_sample_quality,
        nelbo_per_sequence,
    )
    from .manifold_flow import (
        GaussianMixtureVelocityModel,
        PlainFlowTransformerModel,
        manifold_sliced_wasserstein,
        model_velocity_fn,
        off_manifold_rms,
        sample_latent_flow,
        sample_pipeline,
        train_velocity_model,
        velocity_errors,
        velocity_errors_along,
    )
    from .mosaic import (
        FeatureNetReport,
        MosaicDetection,
        MosaicEvaluator,
        MosaicFeatureNet,
        capability_on_validation,
        corrupt_prompt,
        evaluate_text_to_image,
        image_features,
        summarize,
        train_feature_net,
    )
    from .mosaic_finetune import finetune_unet, unet_with_lora
    from .mosaic_unlearning import (
        asks_for,
        concept_kind,
        concept_presence,
        concept_prompt_sets,
        judge_accuracy,
        sample_prompts,
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
        without_machine_paths,
        write_results,
    )
    from .semantic_nvs import SceneEvaluator, bootstrap_frechet, evaluator_accuracy, train_scene_evaluator
    from .soar import MarkovChainOracleLM
    from .soar_headroom import oracle_order_search
    from .spade import (
        SPADE_VARIANTS,
        MLPRegressor,
        best_of_offline,
        fit_regressor,
        gradient_ascent,
        regressor_search,
        spade_search,
        train_spade,
    )
    from .unlearning import ConceptUnlearningReport, denoising_losses, evaluate_concept_unlearning, membership_summary
else:
    import sys

    from .._lazy_module import LazyModule

    sys.modules[__name__] = LazyModule(__name__, globals()["__file__"], _import_structure, module_spec=__spec__)
