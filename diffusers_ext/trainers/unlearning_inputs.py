"""Input handling of [`ConstrainedUnlearningTrainer`]: datasets, labels, prompts, conditions and LoRA adapters."""

from collections.abc import Sequence

import torch

from .base_config import with_default_targets


def as_tensors(dataset, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(images, labels)` from a tuple of tensors, a single image tensor or a `TensorDataset`."""
    if dataset is None:
        return None
    if isinstance(dataset, torch.utils.data.TensorDataset):
        dataset = dataset.tensors
    if isinstance(dataset, torch.Tensor):
        dataset = (dataset, None)
    if not isinstance(dataset, (tuple, list)) or len(dataset) not in (1, 2):
        raise TypeError(
            f"`{name}` must be an image tensor, an `(images, labels)` tuple or a TensorDataset; got "
            f"{type(dataset).__name__}."
        )
    images, labels = dataset[0], (dataset[1] if len(dataset) == 2 else None)
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(
            f"`{name}` images must be a tensor of shape (N, C, H, W), got {getattr(images, 'shape', images)}."
        )
    if images.shape[0] == 0:
        raise ValueError(f"`{name}` is empty: it holds no examples.")
    if labels is not None and (labels.ndim != 1 or labels.shape[0] != images.shape[0]):
        raise ValueError(f"`{name}` labels must have shape ({images.shape[0]},), got {tuple(labels.shape)}.")
    return images, (labels.long() if labels is not None else None)


def check_labels(labels: Sequence[int], num_classes: int, null_label: int | None, name: str):
    """Raise unless every label is a class of the model other than the null class."""
    unknown = sorted({int(c) for c in labels if not 0 <= int(c) < num_classes or int(c) == null_label})
    if unknown:
        known = f"0..{num_classes - 1}" + (f" except the null class {null_label}" if null_label is not None else "")
        raise ValueError(f"`{name}` holds classes the model does not know: {unknown}; known classes are {known}.")


def check_method(args, mode: str, objective_class, retain_data) -> None:
    """Raise unless the objective unlearns this kind of input (`mode`) and what it needs was given."""
    method = args.method
    if mode not in objective_class.modes:
        if mode == "data":
            raise ValueError(
                f"method {method!r} unlearns a concept (it needs the forget condition's own prediction eps_u); "
                "for a `forget_dataset` use constraint='forward_kl' or baseline 'siss', 'neggrad_plus' or "
                "'retain_only'."
            )
        raise ValueError(f"baseline {method!r} unlearns training data; pass a `forget_dataset`.")
    if mode == "data":
        if retain_data is None:
            raise ValueError("data unlearning needs a `retain_dataset` (the training examples to keep).")
        if args.forget_classes is not None or args.forget_prompts is not None:
            raise ValueError("give either a `forget_dataset` or `forget_classes`/`forget_prompts`, not both.")
    elif args.forget_classes is None and args.forget_prompts is None:
        raise ValueError(
            "nothing to forget: set `forget_classes` or `forget_prompts` in the config, or pass a non-empty "
            "`forget_dataset`."
        )


def build_conditions(config, family, mode: str, forget_data, retain_data, null_class_label):
    """Validate and encode what to forget, keep and fall back to. Returns `(sample_shape, forget_conds,
    retain_conds, reference_cond, forget_data, retain_data)`: conditions are class labels `(n,)`, prompt
    [`Conditions`] of `n` rows, or None; the datasets lose their labels for an unconditional UNet. `family` is the
    pipeline's [`DenoiserFamily`]."""
    sample_shape = family.sample_shape(config.resolution)
    image_size = sample_shape[-1] * family.vae_scale_factor
    if family.text:
        model = type(family.denoiser).__name__
        if config.forget_classes is not None:
            raise ValueError(f"`forget_classes` needs a class-conditional UNet2DModel; this {model} takes prompts.")
        if mode == "data":
            raise ValueError(f"data unlearning is supported for UNet2DModel (class-conditional or not), not {model}.")
        if (
            getattr(family.pipeline, "text_encoder", None) is None
            or getattr(family.pipeline, "tokenizer", None) is None
        ):
            raise ValueError(f"a {model} needs the pipeline's `text_encoder` and `tokenizer` to encode the prompts.")
        forget = family.encode_prompts(config.forget_prompts, "forget_prompts", image_size)
        retain = config.retain_prompts or []
        retain = family.encode_prompts(retain, "retain_prompts", image_size) if retain else None
        reference = family.encode_prompts([config.reference_prompt], "reference_prompt", image_size)
        return sample_shape, forget, retain, reference, forget_data, retain_data
    unet = family.denoiser
    if config.forget_prompts is not None or config.retain_prompts:
        raise ValueError("prompts need a UNet2DConditionModel; this UNet2DModel is conditioned on class labels.")
    num_classes = unet.config.num_class_embeds
    if mode == "data":
        if num_classes is None:  # an unconditional UNet: labels, if any, play no part
            forget_data, retain_data = (forget_data[0], None), (retain_data[0], None)
        labels = [d[1] for d in (forget_data, retain_data) if d[1] is not None]
        if num_classes is not None and len(labels) < 2:
            raise ValueError("the UNet is class-conditional: `forget_dataset` and `retain_dataset` need labels.")
        for name, data in (("forget_dataset", forget_data), ("retain_dataset", retain_data)):
            if tuple(data[0].shape[1:]) != sample_shape:
                raise ValueError(
                    f"`{name}` images have shape {tuple(data[0].shape[1:])}; the UNet expects {sample_shape}."
                )
            if num_classes is not None:
                check_labels(data[1].tolist(), num_classes, null_class_label, f"{name} labels")
        return sample_shape, None, None, None, forget_data, retain_data
    if num_classes is None:
        raise ValueError("`forget_classes` needs a class-conditional UNet2DModel (`num_class_embeds` is None).")
    check_labels(config.forget_classes, num_classes, null_class_label, "forget_classes")
    reference = config.reference_class if config.reference_class is not None else null_class_label
    if reference is None:
        raise ValueError("no reference: set `reference_class`, or pass the pipeline's `null_class_label`.")
    if reference in config.forget_classes:
        raise ValueError(f"`reference_class` {reference} is also a forget class.")
    if not 0 <= reference < num_classes:
        raise ValueError(f"`reference_class` {reference} is not a class of this UNet (0..{num_classes - 1}).")
    retain = config.retain_classes
    if retain is None:
        retain = [c for c in range(num_classes) if c not in config.forget_classes and c != null_class_label]
    else:
        check_labels(retain, num_classes, null_class_label, "retain_classes")
    forget = torch.tensor(config.forget_classes, dtype=torch.long)
    retain = torch.tensor(retain, dtype=torch.long) if retain else None
    return sample_shape, forget, retain, torch.tensor([reference], dtype=torch.long), forget_data, retain_data


def add_lora(model, peft_config, default_targets: list[str]) -> None:
    """Add the LoRA adapters of `peft_config` to `model` (in place) and make only them trainable, in float32 whatever
    the model's dtype; without `target_modules` they go on `default_targets` (the family's
    [`DenoiserFamily.lora_targets`])."""
    lora = with_default_targets(peft_config, default_targets)
    targets = sorted(lora.target_modules) if not isinstance(lora.target_modules, str) else lora.target_modules
    model.requires_grad_(False)
    if hasattr(model, "add_adapter"):  # diffusers' PeftAdapterMixin (UNet2DConditionModel, SD3, Flux)
        model.add_adapter(lora)
    else:  # UNet2DModel
        from peft import inject_adapter_in_model

        inject_adapter_in_model(lora, model)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
        if "lora_" in name and param.dtype in (torch.float16, torch.bfloat16):
            # trained weights in float32 (diffusers' `cast_training_params`): Adam's epsilon and small updates
            # vanish in half precision (a float16 LoRA reached NaN at its second step)
            param.data = param.data.float()
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"`lora_target_modules` {targets} matched no module of the {type(model).__name__}.")
