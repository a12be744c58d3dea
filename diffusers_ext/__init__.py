"""diffusers-ext: recent diffusion methods as first-class diffusers classes.

Every public name is imported lazily (diffusers' ``_LazyModule`` pattern): ``import diffusers_ext`` imports neither
torch nor diffusers, and each class loads on first use.
"""

from typing import TYPE_CHECKING


__version__ = "0.1.0"

# submodule -> public names it defines: what users run. Every class listed here pins its ``__module__`` to
# "diffusers_ext" (see ``diffusers_ext.utils.public``) so saved ``model_index.json`` files name
# ``["diffusers_ext", "Class"]``. What only measures or compares is imported from ``diffusers_ext.evaluation``.
_import_structure = {
    "_mixins": ["ConfigMixin", "DiffusionPipeline", "ModelMixin", "PreTrainedModel", "SchedulerMixin"],
    "loading": ["load_pipeline"],
    "models.augmentation_regressor": ["AugmentationRegressor", "AugmentationRegressorOutput"],
    "models.conv_image_classifier": ["ConvImageClassifier", "ImageClassifierOutput"],
    "losses.manifold_feature_distance": ["ManifoldFeatureDistance"],
    "models.semantic_multiview_unet": ["SemanticMultiViewUNetModel", "SemanticMultiViewUNetOutput"],
    "models.discrete_flow_transformer": ["DiscreteFlowModelOutput", "DiscreteFlowTransformerModel"],
    "models.graph_transformer": ["GraphTransformerModel", "GraphTransformerOutput"],
    "pipelines.graph_flow.pipeline_graph_flow": ["GraphFlowPipeline", "GraphFlowPipelineOutput"],
    "pipelines.discrete_flow.pipeline_discrete_flow": ["DiscreteFlowPipeline", "DiscreteFlowPipelineOutput"],
    "schedulers.scheduling_discrete_flow_matching": [
        "DiscreteFlowMatchingScheduler",
        "DiscreteFlowMatchingSchedulerOutput",
    ],
    "pipelines.class_conditional.pipeline_class_conditional_ddpm": ["ClassConditionalDDPMPipeline"],
    "pipelines.dirp.pipeline_dirp": ["DIRPPipeline", "DIRPPipelineOutput"],
    "pipelines.doob_guidance.classifier_constraint": ["ClassifierConstraint"],
    "pipelines.doob_guidance.guidance": ["DoobGuidance", "guided_sample"],
    "pipelines.doob_guidance.pipeline_doob_planner": [
        "DoobGuidedPlannerOutput",
        "DoobGuidedPlannerPipeline",
        "ObstacleConstraint",
    ],
    "pipelines.semantic_nvs.pipeline_semantic_nvs": ["SemanticNVSPipeline", "SemanticNVSPipelineOutput"],
    "schedulers.compatibility": ["compatible_schedulers"],
    "schedulers.scheduling_graph_discrete_flow": ["GraphDiscreteFlowScheduler", "GraphDiscreteFlowSchedulerOutput"],
    "schedulers.scheduling_flow_match_sde": ["FlowMatchSDEScheduler", "FlowMatchSDESchedulerOutput"],
    "pipelines.diffusion_lm.adapters": [
        "DiffusionLMAdapter",
        "DreamAdapter",
        "HFLogitsAdapter",
        "LLaDA2Adapter",
        "LLaDAAdapter",
        "get_diffusion_lm_adapter",
    ],
    "pipelines.diffusion_lm.pipeline_diffusion_lm": ["DiffusionLMPipeline", "DiffusionLMPipelineOutput"],
    "pipelines.diffusion_lm.remote_code": ["load_remote_code_model"],
    "schedulers.scheduling_soar": ["SOARScheduler", "SOARSchedulerOutput"],
    "pipelines.divide_and_denoise.baseline_allocators": ["AverageAllocator", "RegionAllocator"],
    "pipelines.divide_and_denoise.denoisers": ["MultiDenoiserModel", "WindowedDenoiser"],
    "pipelines.divide_and_denoise.fair_division": ["FairDivisionAllocator"],
    "pipelines.divide_and_denoise.region_masks": ["MaskAllocator"],
    "pipelines.divide_and_denoise.pipeline_divide_and_denoise": [
        "DivideAndDenoisePipeline",
        "DivideAndDenoisePipelineOutput",
    ],
    "trainers.diffusion_grpo_config": ["DiffusionGRPOConfig"],
    "trainers.diffusion_grpo_trainer": ["DiffusionGRPOTrainer"],
    "trainers.e2po_config": ["E2POConfig"],
    "trainers.e2po_trainer": ["E2POTrainer"],
    "trainers.graph_grpo_config": ["GraphGRPOConfig"],
    "trainers.graph_grpo_trainer": ["GraphGRPOTrainer"],
    "trainers.constrained_unlearning_config": ["ConstrainedUnlearningConfig"],
    "trainers.constrained_unlearning_trainer": ["ConstrainedUnlearningTrainer"],
    "trainers.base_config": ["BaseGRPOConfig", "DiffusionTrainerConfig", "LoraArguments"],
    "trainers.base_trainer": ["DiffusionTrainer"],
    "models.lomdm_schedule_network": ["LoMDMScheduleNetwork", "LoMDMScheduleOutput"],
    "pipelines.lomdm.pipeline_lomdm": ["LoMDMPipeline"],
    "schedulers.scheduling_oemdm": ["OeMDMScheduler", "OeMDMSchedulerOutput"],
    "models.connectivity_flow": ["ConnectivityFlowModel", "ConnectivityFlowModelOutput"],
    "pipelines.connectivity.pipeline_connectivity": ["ConnectivityPipeline", "ConnectivityPipelineOutput"],
    "pipelines.connectivity.ridge": ["RidgeReadout", "ridge_readout", "ridge_readout_targets"],
    "models.llada": ["LLaDAConfig", "LLaDAModelLM"],
    "models.dream": ["DreamConfig", "DreamModel"],
    "models.manifold_flow": ["ManifoldFlowTransformerModel", "ManifoldFlowTransformerOutput", "SubspaceFit"],
    "models.brain_network_flow": ["BrainNetworkFlowModel", "BrainNetworkFlowOutput"],
    "models.item_scoring": ["ItemScoringModel"],
    "models.neural_item_scoring": ["NeuralItemScoringModel"],
    "models.user_embedding_denoiser": ["UserEmbeddingDenoiser", "UserEmbeddingDenoiserOutput"],
    "models.matrix_codecs": ["CorrelationMatrixCodec", "SPDMatrixCodec"],
    "pipelines.manifold_flow.pipeline_manifold_flow": ["ManifoldFlowPipeline", "ManifoldFlowPipelineOutput"],
    "pipelines.distributional_recommendation.pipeline_distributional_recommendation": [
        "DistributionalRecommendationOutput",
        "DistributionalRecommendationPipeline",
    ],
    "pipelines.brain_network_flow.pipeline_brain_network_flow": [
        "BrainNetworkFlowPipeline",
        "BrainNetworkFlowPipelineOutput",
    ],
    "models.parameter_diffusion": ["ParameterDiffusionModel", "ParameterDiffusionModelOutput"],
    "pipelines.certified_transfer.pipeline_sample_then_evaluate": [
        "SampleThenEvaluatePipeline",
        "SampleThenEvaluateOutput",
    ],
    "pipelines.certified_transfer.adapter_vectorizer": ["AdapterVectorizer"],
    "pipelines.certified_transfer.certificate": ["finite_class_certificate"],
    "models.spatiotemporal_denoiser": ["SpatioTemporalDenoiser", "SpatioTemporalDenoiserOutput"],
    "pipelines.epidiff.pipeline_epidiff": ["EpiDiffForecastOutput", "EpiDiffForecastPipeline"],
    "pipelines.epidiff.mechanistic": [
        "MechanisticConfig",
        "MechanisticForecast",
        "fit_sigma_bounds",
        "fit_sir_map",
        "laplace_covariance",
        "mechanistic_forecast",
        "uncertainty_to_sigma",
        "unscented_forecast",
    ],
    "trainers.epidiff_config": ["EpiDiffConfig"],
    "models.scalar_diffusion_surrogate": ["ScalarDiffusionSurrogate", "ScalarDiffusionSurrogateOutput"],
    "pipelines.spade.pipeline_surrogate_predictive": ["SurrogatePredictiveOutput", "SurrogatePredictivePipeline"],
    "pipelines.spade.pipeline_offline_optimization": ["OfflineOptimizationOutput", "OfflineOptimizationPipeline"],
    "pipelines.spade.search": ["EAConfig"],
    "pipelines.spade.support": ["KnnSupport"],
    "trainers.spade_config": ["SpadeConfig"],
    "trainers.federated_recommendation_config": ["FederatedRecommendationConfig"],
    "trainers.federated_recommendation_trainer": ["FederatedRecommendationTrainer"],
    "trainers.spade_trainer": ["SpadeTrainer"],
    "trainers.epidiff_trainer": [
        "EpiDiffTrainer",
        "build_epidiff_denoiser",
        "build_epidiff_schedulers",
        "epidiff_denoising_loss",
    ],
}

if TYPE_CHECKING:
    from ._mixins import ConfigMixin, DiffusionPipeline, ModelMixin, PreTrainedModel, SchedulerMixin
    from .loading import load_pipeline
    from .losses.manifold_feature_distance import ManifoldFeatureDistance
    from .models.augmentation_regressor import AugmentationRegressor, AugmentationRegressorOutput
    from .models.brain_network_flow import BrainNetworkFlowModel, BrainNetworkFlowOutput
    from .models.connectivity_flow import ConnectivityFlowModel, ConnectivityFlowModelOutput
    from .models.conv_image_classifier import ConvImageClassifier, ImageClassifierOutput
    from .models.discrete_flow_transformer import DiscreteFlowModelOutput, DiscreteFlowTransformerModel
    from .models.dream import DreamConfig, DreamModel
    from .models.graph_transformer import GraphTransformerModel, GraphTransformerOutput
    from .models.item_scoring import ItemScoringModel
    from .models.llada import LLaDAConfig, LLaDAModelLM
    from .models.lomdm_schedule_network import LoMDMScheduleNetwork, LoMDMScheduleOutput
    from .models.manifold_flow import ManifoldFlowTransformerModel, ManifoldFlowTransformerOutput, SubspaceFit
    from .models.matrix_codecs import CorrelationMatrixCodec, SPDMatrixCodec
    from .models.neural_item_scoring import NeuralItemScoringModel
    from .models.parameter_diffusion import ParameterDiffusionModel, ParameterDiffusionModelOutput
    from .models.scalar_diffusion_surrogate import ScalarDiffusionSurrogate, ScalarDiffusionSurrogateOutput
    from .models.semantic_multiview_unet import SemanticMultiViewUNetModel, SemanticMultiViewUNetOutput
    from .models.spatiotemporal_denoiser import SpatioTemporalDenoiser, SpatioTemporalDenoiserOutput
    from .models.user_embedding_denoiser import UserEmbeddingDenoiser, UserEmbeddingDenoiserOutput
    from .pipelines.brain_network_flow.pipeline_brain_network_flow import (
        BrainNetworkFlowPipeline,
        BrainNetworkFlowPipelineOutput,
    )
    from .pipelines.certified_transfer.adapter_vectorizer import AdapterVectorizer
    from .pipelines.certified_transfer.certificate import finite_class_certificate
    from .pipelines.certified_transfer.pipeline_sample_then_evaluate import (
        SampleThenEvaluateOutput,
        SampleThenEvaluatePipeline,
    )
    from .pipelines.class_conditional.pipeline_class_conditional_ddpm import ClassConditionalDDPMPipeline
    from .pipelines.connectivity.pipeline_connectivity import ConnectivityPipeline, ConnectivityPipelineOutput
    from .pipelines.connectivity.ridge import RidgeReadout, ridge_readout, ridge_readout_targets
    from .pipelines.diffusion_lm.adapters import (
        DiffusionLMAdapter,
        DreamAdapter,
        HFLogitsAdapter,
        LLaDA2Adapter,
        LLaDAAdapter,
        get_diffusion_lm_adapter,
    )
    from .pipelines.diffusion_lm.pipeline_diffusion_lm import DiffusionLMPipeline, DiffusionLMPipelineOutput
    from .pipelines.diffusion_lm.remote_code import load_remote_code_model
    from .pipelines.dirp.pipeline_dirp import DIRPPipeline, DIRPPipelineOutput
    from .pipelines.discrete_flow.pipeline_discrete_flow import DiscreteFlowPipeline, DiscreteFlowPipelineOutput
    from .pipelines.distributional_recommendation.pipeline_distributional_recommendation import (
        DistributionalRecommendationOutput,
        DistributionalRecommendationPipeline,
    )
    from .pipelines.divide_and_denoise.baseline_allocators import AverageAllocator, RegionAllocator
    from .pipelines.divide_and_denoise.denoisers import MultiDenoiserModel, WindowedDenoiser
    from .pipelines.divide_and_denoise.fair_division import FairDivisionAllocator
    from .pipelines.divide_and_denoise.pipeline_divide_and_denoise import (
        DivideAndDenoisePipeline,
        DivideAndDenoisePipelineOutput,
    )
    from .pipelines.divide_and_denoise.region_masks import MaskAllocator
    from .pipelines.doob_guidance.classifier_constraint import ClassifierConstraint
    from .pipelines.doob_guidance.guidance import DoobGuidance, guided_sample
    from .pipelines.doob_guidance.pipeline_doob_planner import (
        DoobGuidedPlannerOutput,
        DoobGuidedPlannerPipeline,
        ObstacleConstraint,
    )
    from .pipelines.epidiff.mechanistic import (
        MechanisticConfig,
        MechanisticForecast,
        fit_sigma_bounds,
        fit_sir_map,
        laplace_covariance,
        mechanistic_forecast,
        uncertainty_to_sigma,
        unscented_forecast,
    )
    from .pipelines.epidiff.pipeline_epidiff import EpiDiffForecastOutput, EpiDiffForecastPipeline
    from .pipelines.graph_flow.pipeline_graph_flow import GraphFlowPipeline, GraphFlowPipelineOutput
    from .pipelines.lomdm.pipeline_lomdm import LoMDMPipeline
    from .pipelines.manifold_flow.pipeline_manifold_flow import ManifoldFlowPipeline, ManifoldFlowPipelineOutput
    from .pipelines.semantic_nvs.pipeline_semantic_nvs import SemanticNVSPipeline, SemanticNVSPipelineOutput
    from .pipelines.spade.pipeline_offline_optimization import OfflineOptimizationOutput, OfflineOptimizationPipeline
    from .pipelines.spade.pipeline_surrogate_predictive import SurrogatePredictiveOutput, SurrogatePredictivePipeline
    from .pipelines.spade.search import EAConfig
    from .pipelines.spade.support import KnnSupport
    from .schedulers.compatibility import compatible_schedulers
    from .schedulers.scheduling_discrete_flow_matching import (
        DiscreteFlowMatchingScheduler,
        DiscreteFlowMatchingSchedulerOutput,
    )
    from .schedulers.scheduling_flow_match_sde import FlowMatchSDEScheduler, FlowMatchSDESchedulerOutput
    from .schedulers.scheduling_graph_discrete_flow import (
        GraphDiscreteFlowScheduler,
        GraphDiscreteFlowSchedulerOutput,
    )
    from .schedulers.scheduling_oemdm import OeMDMScheduler, OeMDMSchedulerOutput
    from .schedulers.scheduling_soar import SOARScheduler, SOARSchedulerOutput
    from .trainers.base_config import BaseGRPOConfig, DiffusionTrainerConfig, LoraArguments
    from .trainers.base_trainer import DiffusionTrainer
    from .trainers.constrained_unlearning_config import ConstrainedUnlearningConfig
    from .trainers.constrained_unlearning_trainer import ConstrainedUnlearningTrainer
    from .trainers.diffusion_grpo_config import DiffusionGRPOConfig
    from .trainers.diffusion_grpo_trainer import DiffusionGRPOTrainer
    from .trainers.e2po_config import E2POConfig
    from .trainers.e2po_trainer import E2POTrainer
    from .trainers.epidiff_config import EpiDiffConfig
    from .trainers.epidiff_trainer import (
        EpiDiffTrainer,
        build_epidiff_denoiser,
        build_epidiff_schedulers,
        epidiff_denoising_loss,
    )
    from .trainers.federated_recommendation_config import FederatedRecommendationConfig
    from .trainers.federated_recommendation_trainer import FederatedRecommendationTrainer
    from .trainers.graph_grpo_config import GraphGRPOConfig
    from .trainers.graph_grpo_trainer import GraphGRPOTrainer
    from .trainers.spade_config import SpadeConfig
    from .trainers.spade_trainer import SpadeTrainer
else:
    import sys

    from ._lazy_module import LazyModule

    sys.modules[__name__] = LazyModule(
        __name__,
        globals()["__file__"],
        _import_structure,
        module_spec=__spec__,
        extra_objects={"__version__": __version__},
    )

    # `diffusers.DiffusionPipeline.from_pretrained(folder)` resolves a saved folder's `_class_name` in `diffusers`:
    # let that module answer the pack's pipeline names too (lazily; see `_lazy_module.register_pipeline_names`).
    from ._lazy_module import register_pipeline_names

    register_pipeline_names(
        name for names in _import_structure.values() for name in names if name.endswith("Pipeline")
    )
