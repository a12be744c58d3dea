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


def sample_size(unet) -> tuple[int, int]:
    """`(height, width)` of a UNet's samples."""
    size = unet.config.sample_size
    return (size, size) if isinstance(size, int) else tuple(size)


@torch.no_grad()
def encode_prompts(prompts: list[str], text_encoder, tokenizer, name: str) -> torch.Tensor:
    """`(len(prompts), seq, dim)` text-encoder states of `prompts`; refuses prompts with unknown tokens."""
    inputs = tokenizer(
        list(prompts),
        padding="max_length",
        max_length=tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    )
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and name != "reference_prompt":
        for prompt in prompts:  # without padding and special tokens, which may share the unknown token's id
            if unk in tokenizer(prompt, add_special_tokens=False).input_ids:
                raise ValueError(
                    f"`{name}` prompt {prompt!r} holds tokens the tokenizer does not know (mapped to "
                    f"{tokenizer.unk_token!r}); the model cannot know that concept."
                )
    device = next(text_encoder.parameters()).device
    return text_encoder(inputs.input_ids.to(device))[0].detach().float().cpu()


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


def build_conditions(config, unet, mode: str, forget_data, retain_data, text_encoder, tokenizer, null_class_label):
    """Validate and encode what to forget, keep and fall back to. Returns `(sample_shape, forget_conds,
    retain_conds, reference_cond, forget_data, retain_data)`: conditions are class labels `(n,)`, prompt states
    `(n, seq, dim)` or None; the datasets lose their labels for an unconditional UNet."""
    from diffusers import UNet2DConditionModel

    sample_shape = (unet.config.in_channels, *sample_size(unet))
    if isinstance(unet, UNet2DConditionModel):
        if config.forget_classes is not None:
            raise ValueError("`forget_classes` needs a class-conditional UNet2DModel; use `forget_prompts`.")
        if mode == "data":
            raise ValueError("data unlearning is supported for UNet2DModel (class-conditional or not).")
        if text_encoder is None or tokenizer is None:
            raise ValueError("a UNet2DConditionModel needs `text_encoder` and `tokenizer` to encode the prompts.")
        forget = encode_prompts(config.forget_prompts, text_encoder, tokenizer, "forget_prompts")
        retain = config.retain_prompts or []
        retain = encode_prompts(retain, text_encoder, tokenizer, "retain_prompts") if retain else None
        reference = encode_prompts([config.reference_prompt], text_encoder, tokenizer, "reference_prompt")
        return sample_shape, forget, retain, reference, forget_data, retain_data
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


ATTENTION_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def add_lora(unet, peft_config, is_text: bool) -> None:
    """Add the LoRA adapters of `peft_config` to `unet` (in place) and make only them trainable; without
    `target_modules` they go on the attention projections (and `conv1`, `conv2`, `time_emb_proj` of a UNet2DModel)."""
    targets = ATTENTION_TARGETS if is_text else ["conv1", "conv2", "time_emb_proj", *ATTENTION_TARGETS]
    lora = with_default_targets(peft_config, targets)
    targets = sorted(lora.target_modules) if not isinstance(lora.target_modules, str) else lora.target_modules
    unet.requires_grad_(False)
    if is_text:
        unet.add_adapter(lora)
    else:
        from peft import inject_adapter_in_model

        inject_adapter_in_model(lora, unet)
    for name, param in unet.named_parameters():
        param.requires_grad_("lora_" in name)
    if not any(p.requires_grad for p in unet.parameters()):
        raise ValueError(f"`lora_target_modules` {targets} matched no module of the UNet.")
