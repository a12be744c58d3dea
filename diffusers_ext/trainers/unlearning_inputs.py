"""Input handling of [`ConstrainedUnlearningTrainer`]: datasets, class labels, prompts and LoRA adapters."""

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
        list(prompts), padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
        return_tensors="pt",
    )  # fmt: skip
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
