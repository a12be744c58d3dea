"""SemanticNVS: novel view synthesis conditioned on warped and iteratively re-extracted semantic features."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.image_processor import VaeImageProcessor
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor

from ...geometry.camera import check_intrinsics, check_rigid, scale_intrinsics, scene_plucker
from ...models.semantic_multiview_unet import SemanticMultiViewUNetModel
from ...utils import check_finite, check_positive_int, public
from ..pipeline_utils import (
    check_callback_tensor_inputs,
    check_eta,
    prepare_extra_step_kwargs,
    prepare_initial_noise,
)
from .conditioning import (
    SEMANTIC_MODES,
    estimate_to_images,
    target_semantics,
    unconditional_target_semantics,
    x0_estimate,
)
from .semantic_features import semantic_feature_map
from .warp import warp_to_targets


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


@public
@dataclass
class SemanticNVSPipelineOutput(BaseOutput):
    """
    Args:
        images: the generated target views: a list (per scene) of lists of PIL images, or an array/tensor of
            shape `(B, V_target, H, W, 3)` (`"np"`) / `(B, V_target, 3, H, W)` (`"pt"`, `"latent"`).
        coverage (`torch.Tensor` of shape `(B, V_target, 1, H, W)`): where warped input-view features reached each
            target view (all False when the mode does not warp).
    """

    images: list | np.ndarray | torch.Tensor
    coverage: torch.Tensor


@public
class SemanticNVSPipeline(DiffusionPipeline):
    r"""
    Generate target views of a scene from one or a few posed input views with a camera-conditioned multi-view
    denoiser ([`SemanticMultiViewUNetModel`]), conditioned on semantic features in two ways:

    - **warped**: features of the input views, forward-warped to each target view by the input depth;
    - **iterative**: at every denoising step, features extracted from the model's current estimate of the clean
      target views, which complete what warping cannot see (disocclusions, outside the input frustum).

    `semantic_mode="warped+iterative"` uses the warped features where they are valid and the iterative ones
    elsewhere. Input views are given clean (their noisy sample is replaced by the image at every step).

    Parameters:
        unet ([`SemanticMultiViewUNetModel`]): the multi-view denoiser; its `semantic_channels` must equal the
            semantic encoder's feature size.
        scheduler ([`SchedulerMixin`]): a DDPM/DDIM-family scheduler with `alphas_cumprod`.
        semantic_encoder (*optional*): a transformers ViT-style backbone (e.g. `Dinov2Model`) whose patch
            features are the semantics; needed for every mode but `"none"`.
        depth_estimator (*optional*): a transformers depth-estimation model predicting **metric** z-depth (e.g.
            `DepthAnythingForDepthEstimation` with `depth_estimation_type="metric"`, ZoeDepth), used when a warped
            mode is called without `depths`. Relative (disparity) estimators cannot place the input in the scene's
            units and are rejected when their config says so.
        depth_processor (*optional*): the estimator's transformers image processor (resizing and normalisation);
            needed with `depth_estimator`.
    """

    model_cpu_offload_seq = "semantic_encoder->depth_estimator->unet"
    _optional_components = ["semantic_encoder", "depth_estimator", "depth_processor"]
    _callback_tensor_inputs = ["latents", "noise_pred"]

    def __init__(
        self,
        unet: SemanticMultiViewUNetModel,
        scheduler: SchedulerMixin,
        semantic_encoder=None,
        depth_estimator=None,
        depth_processor=None,
    ):
        super().__init__()
        if depth_estimator is not None:
            if depth_processor is None:
                raise ValueError("`depth_estimator` needs its `depth_processor` (a transformers image processor).")
            kind = getattr(depth_estimator.config, "depth_estimation_type", "metric")
            if kind != "metric":
                raise ValueError(
                    f"`depth_estimator` predicts {kind!r} depth; warping needs metric z-depth (e.g. a Depth Anything "
                    "metric checkpoint)."
                )
        self.register_modules(
            unet=unet,
            scheduler=scheduler,
            semantic_encoder=semantic_encoder,
            depth_estimator=depth_estimator,
            depth_processor=depth_processor,
        )
        # Views live in [-1, 1] pixel space: the processor only maps them to [0, 1] and the output type.
        self.image_processor = VaeImageProcessor(do_resize=False)

    @property
    def guidance_scale(self) -> float:
        """The guidance scale of the running call (a callback may set `pipe._guidance_scale`; read at every step)."""
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale > 1.0

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    # ------------------------------------------------------------------------------------------- inputs
    def _as_scene_batch(self, name: str, value, trailing: tuple[int, ...]) -> torch.Tensor:
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            # one scene per entry: `(views, ...)` or a batch of one `(1, views, ...)`
            scenes = [v[0] if v.ndim == len(trailing) + 2 and v.shape[0] == 1 else v for v in value]
            if any(v.ndim != len(trailing) + 1 for v in scenes):
                raise ValueError(
                    f"`{name}` is a list of tensors of shapes {[tuple(v.shape) for v in value]}; each entry is one "
                    f"scene: (views, {', '.join(map(str, trailing))}) or (1, views, {', '.join(map(str, trailing))})."
                )
            if len({tuple(v.shape) for v in scenes}) > 1:
                raise ValueError(f"`{name}` is a list of tensors of different shapes; expected one shape.")
            value = torch.stack(scenes)
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(value).__name__}.")
        if value.ndim == len(trailing) + 1:
            value = value[None]
        if value.ndim != len(trailing) + 2 or (trailing and tuple(value.shape[-len(trailing) :]) != trailing):
            raise ValueError(
                f"`{name}` has shape {tuple(value.shape)}; expected (views, {', '.join(map(str, trailing))}) or "
                f"(batch, views, {', '.join(map(str, trailing))})."
            )
        return value

    @torch.no_grad()
    def estimate_depth(self, images: torch.Tensor) -> torch.Tensor:
        r"""
        Metric z-depth of views `(B, V, C, H, W)` in [0, 1] from the `depth_estimator`, resized to the views:
        `(B, V, 1, H, W)`, clamped to at least 1e-3.
        """
        b, v, c, h, w = images.shape
        flat = images.reshape(b * v, c, h, w).float().cpu()
        inputs = self.depth_processor(images=list(flat), return_tensors="pt", do_rescale=False)
        pixel_values = inputs["pixel_values"].to(self._execution_device, self.depth_estimator.dtype)
        depth = self.depth_estimator(pixel_values=pixel_values).predicted_depth  # (B * V, h', w')
        depth = torch.nn.functional.interpolate(depth[:, None].float(), size=(h, w), mode="bilinear")
        return depth.clamp(min=1e-3).reshape(b, v, 1, h, w)

    def check_inputs(
        self,
        images,
        input_intrinsics,
        input_c2w,
        target_intrinsics,
        target_c2w,
        depths,
        semantic_mode,
        num_inference_steps,
        guidance_scale,
        output_type,
        generator,
        callback_on_step_end_tensor_inputs,
        num_images_per_prompt=1,
        eta=0.0,
    ):
        """Validate and batch the inputs before any model work; return them as `(B, V, ...)` tensors."""
        check_eta(eta)
        size = self.unet.config.sample_size
        channels = self.unet.config.image_channels
        images = self._as_scene_batch("images", images, (channels, size, size))
        b, v_in = images.shape[:2]
        if images.min() < -1e-3 or images.max() > 1 + 1e-3:
            raise ValueError(
                f"`images` must lie in [0, 1]; got [{float(images.min()):.3g}, {float(images.max()):.3g}]."
            )
        input_intrinsics = self._as_scene_batch("input_intrinsics", input_intrinsics, (3, 3))
        input_c2w = self._as_scene_batch("input_c2w", input_c2w, (4, 4))
        target_intrinsics = self._as_scene_batch("target_intrinsics", target_intrinsics, (3, 3))
        target_c2w = self._as_scene_batch("target_c2w", target_c2w, (4, 4))
        for name, value, views in (("input_intrinsics", input_intrinsics, v_in), ("input_c2w", input_c2w, v_in)):
            if value.shape[:2] != (b, views):
                raise ValueError(
                    f"`{name}` describes {tuple(value.shape[:2])} (batch, views) cameras; `images` has {(b, v_in)}."
                )
        if target_intrinsics.shape[:2] != target_c2w.shape[:2] or target_c2w.shape[0] != b:
            raise ValueError(
                f"`target_intrinsics` {tuple(target_intrinsics.shape[:2])} and `target_c2w` {tuple(target_c2w.shape[:2])} "
                f"must describe the same (batch={b}, views) cameras."
            )
        for name, value in (("input_intrinsics", input_intrinsics), ("target_intrinsics", target_intrinsics)):
            check_intrinsics(value.float(), name)
        for name, value in (("input_c2w", input_c2w), ("target_c2w", target_c2w)):
            check_rigid(value.float(), name)
        if semantic_mode not in SEMANTIC_MODES:
            raise ValueError(f"`semantic_mode` must be one of {SEMANTIC_MODES}, got {semantic_mode!r}.")
        if semantic_mode != "none":
            if not self.unet.config.semantic_channels:
                raise ValueError(f"`semantic_mode` {semantic_mode!r}: this unet has no semantic inputs; use 'none'.")
            if self.semantic_encoder is None:
                raise ValueError(
                    f"`semantic_mode` {semantic_mode!r} needs a `semantic_encoder`; this pipeline has none."
                )
            hidden = self.semantic_encoder.config.hidden_size
            if hidden != self.unet.config.semantic_channels:
                raise ValueError(
                    f"the semantic encoder gives {hidden} channels but the unet takes "
                    f"{self.unet.config.semantic_channels} (`semantic_channels`)."
                )
        if "warped" in semantic_mode and depths is None and getattr(self, "depth_estimator", None) is None:
            raise ValueError(
                f"`semantic_mode` {semantic_mode!r} warps by depth: pass `depths` or give the pipeline a "
                "`depth_estimator`."
            )
        if "warped" in semantic_mode and depths is not None:
            depths = self._as_scene_batch("depths", depths, (1, size, size))
            if depths.shape[:2] != (b, v_in):
                raise ValueError(f"`depths` describes {tuple(depths.shape[:2])} views; `images` has {(b, v_in)}.")
            check_finite("depths", depths, greater_than=0)
        check_positive_int("num_inference_steps", num_inference_steps)
        check_finite("guidance_scale", guidance_scale, scalar=True)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_positive_int("num_images_per_prompt", num_images_per_prompt)
        if isinstance(generator, list) and len(generator) != b * num_images_per_prompt:
            raise ValueError(
                f"`generator` is a list of {len(generator)} generators for {b} scenes x {num_images_per_prompt} "
                "(`num_images_per_prompt`) outputs."
            )
        check_callback_tensor_inputs(self, callback_on_step_end_tensor_inputs)
        return images, input_intrinsics, input_c2w, target_intrinsics, target_c2w, depths

    def _call_scene_by_scene(self, per_scene: dict, kwargs: dict):
        """Run scenes whose per-scene arguments differ in shape one by one; concatenate their outputs."""
        num_scenes, n = len(per_scene["images"]), kwargs["num_images_per_prompt"]
        for name, value in per_scene.items():
            if value is not None and not (isinstance(value, (list, tuple)) and len(value) == num_scenes):
                raise ValueError(
                    f"`images` holds {num_scenes} scenes of different view counts, so `{name}` must be a list of "
                    f"{num_scenes} per-scene tensors; got {type(value).__name__}."
                )
        generator, latents = kwargs["generator"], kwargs["latents"]
        if isinstance(generator, list) and len(generator) != num_scenes * n:
            raise ValueError(f"`generator` is a list of {len(generator)} generators for {num_scenes * n} outputs.")
        outputs = []
        for i in range(num_scenes):
            scene = {k: None if v is None else v[i] for k, v in per_scene.items()}
            rows = slice(i * n, (i + 1) * n)
            scene_generator = generator[rows] if isinstance(generator, list) else generator
            scene_latents = None if latents is None else latents[rows]
            outputs.append(
                self(
                    **{**kwargs, **scene, "generator": scene_generator, "latents": scene_latents, "return_dict": True}
                )
            )
        first = outputs[0].images
        if isinstance(first, list):
            images = [item for out in outputs for item in out.images]
        elif isinstance(first, torch.Tensor):
            images = torch.cat([out.images for out in outputs])
        else:
            images = np.concatenate([out.images for out in outputs])
        coverage = torch.cat([out.coverage for out in outputs])
        if not kwargs["return_dict"]:
            return (images, coverage)
        return SemanticNVSPipelineOutput(images=images, coverage=coverage)

    # ---------------------------------------------------------------------------------------- semantics
    def encode_semantics(self, images: torch.Tensor) -> torch.Tensor:
        """Semantic features of `(N, 3, H, W)` images in [0, 1], upsampled to `(N, S, H, W)`."""
        return semantic_feature_map(self.semantic_encoder, images)

    # ------------------------------------------------------------------------------------------- call
    @torch.no_grad()
    def __call__(
        self,
        images: torch.Tensor,
        input_intrinsics: torch.Tensor,
        input_c2w: torch.Tensor,
        target_intrinsics: torch.Tensor,
        target_c2w: torch.Tensor,
        depths: torch.Tensor | None = None,
        semantic_mode: str = "warped+iterative",
        iterative_start: float = 0.0,
        num_inference_steps: int = 50,
        guidance_scale: float = 2.0,
        num_images_per_prompt: int = 1,
        eta: float = 0.0,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] = ["latents"],
    ) -> SemanticNVSPipelineOutput | tuple:
        r"""
        Generate the target views.

        Args:
            images (`torch.Tensor` of shape `(V_in, 3, H, W)` or `(B, V_in, 3, H, W)`, or a list of `B` per-scene
                `(V_in, 3, H, W)` or `(1, V_in, 3, H, W)` tensors): input views in [0, 1]. Every per-scene argument
                may be such a list; when the scenes differ in their number of views, each scene runs on its own and
                the outputs are concatenated (then `generator` is one per output and a callback is called scene by
                scene).
            input_intrinsics (`torch.Tensor` of shape `([B,] V_in, 3, 3)`), input_c2w (`([B,] V_in, 4, 4)`): the
                input cameras (OpenCV axes, camera-to-world; see [`~geometry.camera`]).
            target_intrinsics (`torch.Tensor` of shape `([B,] V_t, 3, 3)`), target_c2w (`([B,] V_t, 4, 4)`): the
                cameras to render.
            depths (`torch.Tensor` of shape `([B,] V_in, 1, H, W)`, *optional*): input z-depth, needed to warp;
                estimated by the `depth_estimator` when omitted.
            semantic_mode (`str`, defaults to `"warped+iterative"`): `"none"`, `"warped"`, `"iterative"` or
                `"warped+iterative"`.
            iterative_start (`float`, defaults to 0.0): fraction of the denoising steps to run before the iterative
                features are used (the estimate of the clean views is poor at high noise); 0 uses them from the
                second step on, as the method is described. The iterative features are those of the conditional
                (unguided) prediction's estimate of the clean targets, extracted as in training
                ([`~pipelines.semantic_nvs.conditioning.iterative_semantics`]).
            num_inference_steps (`int`, defaults to 50): denoising steps.
            guidance_scale (`float`, defaults to 2.0): classifier-free guidance; the unconditional branch drops the
                input views and the warped features and keeps the cameras and the iterative features (which describe
                the sample, not the condition, as in self-conditioning). `1.0` disables it. A callback may change it
                through `pipe._guidance_scale`.
            num_images_per_prompt (`int`, defaults to 1): renderings of each scene's targets, one after the other
                in the output (`B * num_images_per_prompt` rows).
            eta (`float`, defaults to 0.0): the noise weight of [`DDIMScheduler`] (0: deterministic DDIM, 1: DDPM's
                variance); schedulers whose `step` takes no `eta` ignore it.
            generator (`torch.Generator` or one per output scene, *optional*): for the initial noise and the
                scheduler.
            latents (`torch.Tensor` of shape `(B, V_t, C, H, W)`, *optional*): initial noise of the target views.
            output_type (`str`, defaults to `"pil"`): `"pil"`, `"np"`, `"pt"` or `"latent"` (raw [-1, 1] sample).
            return_dict (`bool`, defaults to `True`): return a [`SemanticNVSPipelineOutput`] instead of a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, i, t, kwargs)` after every step with the
                tensors named in `callback_on_step_end_tensor_inputs` (`"latents"`: the target views'
                `(B, V_t, C, H, W)` sample; `"noise_pred"`).

        Returns:
            [`SemanticNVSPipelineOutput`] or `(images, coverage)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        per_scene = {
            "images": images,
            "input_intrinsics": input_intrinsics,
            "input_c2w": input_c2w,
            "target_intrinsics": target_intrinsics,
            "target_c2w": target_c2w,
            "depths": depths,
        }
        if isinstance(images, (list, tuple)) and len({tuple(getattr(x, "shape", ())) for x in images}) > 1:
            call_kwargs = {k: v for k, v in locals().items() if k not in ("self", "per_scene", "__class__")}
            return self._call_scene_by_scene(per_scene, call_kwargs)
        if not isinstance(iterative_start, (int, float)) or not 0.0 <= iterative_start <= 1.0:
            raise ValueError(f"`iterative_start` must be a fraction in [0, 1], got {iterative_start!r}.")
        images, input_intrinsics, input_c2w, target_intrinsics, target_c2w, depths = self.check_inputs(
            images,
            input_intrinsics,
            input_c2w,
            target_intrinsics,
            target_c2w,
            depths,
            semantic_mode,
            num_inference_steps,
            guidance_scale,
            output_type,
            generator,
            callback_on_step_end_tensor_inputs,
            num_images_per_prompt,
            eta,
        )
        if num_images_per_prompt > 1:
            images, input_intrinsics, input_c2w, target_intrinsics, target_c2w = (
                x.repeat_interleave(num_images_per_prompt, 0)
                for x in (images, input_intrinsics, input_c2w, target_intrinsics, target_c2w)
            )
            depths = None if depths is None else depths.repeat_interleave(num_images_per_prompt, 0)
        device, dtype = self._execution_device, self.unet.dtype
        b, v_in, c, h, w = images.shape
        v_t = target_c2w.shape[1]
        size = self.unet.config.sample_size
        if latents is not None and tuple(latents.shape) != (b, v_t, c, h, w):
            raise ValueError(f"`latents` has shape {tuple(latents.shape)}; expected {(b, v_t, c, h, w)}.")
        if latents is not None:
            check_finite("latents", latents)
        self._guidance_scale = guidance_scale
        self._interrupt = False
        images = images.to(device)

        # Cameras: Plücker maps of all views relative to the first input view of each scene.
        intrinsics = torch.cat([input_intrinsics, target_intrinsics], 1).to(device, torch.float32)
        c2w = torch.cat([input_c2w, target_c2w], 1).to(device, torch.float32)
        plucker = scene_plucker(scale_intrinsics(intrinsics, size / w, size / h), c2w, size, size).to(dtype)

        semantic_channels = self.unet.config.semantic_channels
        input_features = torch.zeros(b, v_in, semantic_channels, h, w, device=device)
        warped = torch.zeros(b, v_t, semantic_channels, h, w, device=device)
        coverage = torch.zeros(b, v_t, 1, h, w, dtype=torch.bool, device=device)
        if semantic_mode != "none":
            input_features = self.encode_semantics(images.reshape(b * v_in, c, h, w)).reshape(b, v_in, -1, h, w)
        if "warped" in semantic_mode:
            if depths is None:
                depths = self.estimate_depth(images)
            warped, coverage = warp_to_targets(
                input_features,
                depths.to(device),
                input_intrinsics.to(device),
                input_c2w.to(device),
                target_intrinsics.to(device),
                target_c2w.to(device),
            )

        if latents is None:
            latents = randn_tensor((b, v_t, c, h, w), generator=generator, device=device, dtype=dtype)
        latents = latents.to(device, dtype)
        clean_inputs = (images * 2 - 1).to(dtype)
        input_mask = torch.cat([torch.ones(b, v_in, dtype=torch.bool), torch.zeros(b, v_t, dtype=torch.bool)], 1).to(
            device
        )
        input_images = torch.cat([clean_inputs, torch.zeros_like(latents)], 1)

        # timesteps first, then the noise scale: `init_noise_sigma` of Euler, Heun, ... depends on them
        latents, timesteps = prepare_initial_noise(self.scheduler, num_inference_steps, latents, device)
        self._num_timesteps = len(timesteps)
        iterative = None  # features of the current estimate of the clean target views
        input_feature_mask = torch.full((b, v_in, 1, h, w), float(semantic_mode != "none"), device=device)
        # The scheduler steps all target views as one batch: each scene's generator serves its views.
        step_generator = [g for g in generator for _ in range(v_t)] if isinstance(generator, list) else generator
        extra_step_kwargs = prepare_extra_step_kwargs(self.scheduler, step_generator, eta)
        for i, t in enumerate(self.progress_bar(timesteps)):
            if self.interrupt:
                continue
            target_features, target_mask = target_semantics(semantic_mode, warped, coverage, iterative)
            features = torch.cat([input_features, target_features], 1).to(dtype)
            feature_mask = torch.cat([input_feature_mask, target_mask], 1).to(dtype)
            scaled = self.scheduler.scale_model_input(latents, t)  # (B, V_t, C, H, W)
            sample = torch.cat([clean_inputs, scaled], 1)
            conditional = {"plucker": plucker, "input_mask": input_mask, "input_images": input_images}
            unconditional = {
                "plucker": plucker,
                "input_mask": torch.zeros_like(input_mask),
                "input_images": torch.zeros_like(input_images),
            }
            if semantic_channels:
                conditional.update(semantic_features=features, semantic_mask=feature_mask)
                # The unconditional branch keeps only the iterative features (see unconditional_target_semantics).
                uncond_features, uncond_mask = unconditional_target_semantics(
                    semantic_mode, warped, coverage, iterative
                )
                unconditional.update(
                    semantic_features=torch.cat([torch.zeros_like(input_features), uncond_features], 1).to(dtype),
                    semantic_mask=torch.cat([torch.zeros_like(input_feature_mask), uncond_mask], 1).to(dtype),
                )
            if self.do_classifier_free_guidance:
                both = {k: torch.cat([unconditional[k], conditional[k]]) for k in conditional}
                timestep = t.expand(2 * b).to(device)
                prediction = self.unet(torch.cat([sample, sample]), timestep, **both).sample
                uncond, cond = prediction.chunk(2)
                prediction = uncond + self.guidance_scale * (cond - uncond)
            else:
                prediction = cond = self.unet(sample, t.expand(b).to(device), **conditional).sample
            noise_pred = prediction[:, v_in:]

            if "iterative" in semantic_mode and i + 1 >= iterative_start * len(timesteps):
                # As in training: the conditional (unguided) prediction's estimate of the clean targets, from the
                # model's own (scaled) input `sqrt(alpha_bar) x_0 + sqrt(1 - alpha_bar) e`.
                x0 = x0_estimate(
                    self.scheduler, cond[:, v_in:].reshape(b * v_t, c, h, w), scaled.reshape(b * v_t, c, h, w), t
                )
                iterative = self.encode_semantics(estimate_to_images(x0)).reshape(b, v_t, -1, h, w)
            flat = self.scheduler.step(
                noise_pred.reshape(b * v_t, c, h, w), t, latents.reshape(b * v_t, c, h, w), **extra_step_kwargs
            )
            latents = flat.prev_sample
            latents = latents.reshape(b, v_t, c, h, w)

            if callback_on_step_end is not None:
                step_tensors = {"latents": latents, "noise_pred": noise_pred}
                outputs = (
                    callback_on_step_end(self, i, t, {k: step_tensors[k] for k in callback_on_step_end_tensor_inputs})
                    or {}
                )
                latents = outputs.pop("latents", latents)

        result = self.image_processor.postprocess(latents.reshape(b * v_t, c, h, w), output_type=output_type)
        if output_type == "pil":
            result = [result[i * v_t : (i + 1) * v_t] for i in range(b)]
        else:
            result = result.reshape(b, v_t, *result.shape[1:])
        self.maybe_free_model_hooks()
        if not return_dict:
            return (result, coverage)
        return SemanticNVSPipelineOutput(images=result, coverage=coverage)
