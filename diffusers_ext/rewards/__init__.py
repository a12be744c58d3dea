"""Reward functions for the RL trainers: plain callables `f(prompts, images, **kwargs) -> list[float]`.

`images` is what the trainer decodes: a float tensor `(batch, channels, height, width)` in [0, 1]. Lists of PIL
images and `(batch, height, width, channels)` numpy arrays in [0, 1] are accepted too, so the same callables score
a pipeline's `output_type="pil"` or `"np"` results. Extra dataset columns (e.g. `label`) arrive as keyword lists
with one entry per image, as in TRL.
"""

import io
from collections.abc import Sequence

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F


__all__ = [
    "BrightnessReward",
    "CLIPScoreReward",
    "ClassifierReward",
    "ColorReward",
    "digit_accuracy",
    "images_to_tensor",
    "jpeg_compressibility",
    "jpeg_incompressibility",
]


def images_to_tensor(images) -> torch.Tensor:
    """Images as a float tensor `(batch, channels, height, width)` in [0, 1] (from a tensor, array or PIL list)."""
    if isinstance(images, torch.Tensor):
        tensor = images
    elif isinstance(images, np.ndarray):
        tensor = torch.from_numpy(images).permute(0, 3, 1, 2)
    elif isinstance(images, Sequence) and all(isinstance(i, PIL.Image.Image) for i in images):
        tensor = torch.stack(
            [torch.from_numpy(np.asarray(i.convert("RGB"), dtype=np.float32) / 255.0) for i in images]
        ).permute(0, 3, 1, 2)
    else:
        raise TypeError(
            f"`images` must be a tensor (B, C, H, W), an array (B, H, W, C) or a list of PIL images, got "
            f"{type(images).__name__}."
        )
    if tensor.ndim != 4:
        raise ValueError(f"`images` must have 4 dimensions, got shape {tuple(tensor.shape)}.")
    return tensor.detach().float().cpu()


def _jpeg_sizes_kb(images, quality: int) -> list[float]:
    array = (images_to_tensor(images).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    sizes = []
    for image in array:
        buffer = io.BytesIO()
        PIL.Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(
            buffer, format="JPEG", quality=quality
        )
        sizes.append(buffer.tell() / 1000)
    return sizes


def jpeg_compressibility(prompts, images, quality: int = 95, **kwargs) -> list[float]:
    """Minus the JPEG size in kB (DDPO's compressibility reward): simpler images score higher."""
    return [-size for size in _jpeg_sizes_kb(images, quality)]


def jpeg_incompressibility(prompts, images, quality: int = 95, **kwargs) -> list[float]:
    """The JPEG size in kB (DDPO's incompressibility reward): detailed images score higher."""
    return _jpeg_sizes_kb(images, quality)


class BrightnessReward:
    """Minus the distance of an image's mean brightness (in [0, 1]) from `target`.

    Args:
        target (`float`): the wanted mean brightness in [0, 1].
    """

    def __init__(self, target: float):
        if not 0 <= target <= 1:
            raise ValueError(f"`target` must lie in [0, 1], got {target!r}.")
        self.target = target
        self.__name__ = f"brightness_{target:g}"

    def __call__(self, prompts, images, **kwargs) -> list[float]:
        brightness = images_to_tensor(images).mean(dim=(1, 2, 3))
        return (-(brightness - self.target).abs()).tolist()


class ColorReward:
    """Minus the Euclidean distance of an image's mean RGB colour (in [0, 1]) from `target`.

    Args:
        target (`tuple[float, float, float]`): the wanted mean colour.
    """

    def __init__(self, target: Sequence[float]):
        if len(target) != 3 or not all(0 <= c <= 1 for c in target):
            raise ValueError(f"`target` must be three values in [0, 1] (RGB), got {target!r}.")
        self.target = torch.tensor([float(c) for c in target])
        self.__name__ = "color"

    def __call__(self, prompts, images, **kwargs) -> list[float]:
        tensor = images_to_tensor(images)
        if tensor.shape[1] != 3:
            raise ValueError(f"ColorReward needs RGB images, got {tensor.shape[1]} channels.")
        return (-(tensor.mean(dim=(2, 3)) - self.target).norm(dim=1)).tolist()


def _classifier_inputs(classifier, images) -> torch.Tensor:
    """Images in [0, 1] mapped to the classifier's input: its channels (grey = channel mean), size, [-1, 1]."""
    tensor = images_to_tensor(images)
    config = classifier.config
    if config.in_channels == 1 and tensor.shape[1] != 1:
        tensor = tensor.mean(dim=1, keepdim=True)
    if tensor.shape[-1] != config.sample_size or tensor.shape[-2] != config.sample_size:
        tensor = F.interpolate(tensor, size=(config.sample_size,) * 2, mode="bilinear", antialias=True)
    device = next(classifier.parameters()).device
    return (tensor * 2 - 1).to(device)


@torch.no_grad()
def _class_probabilities(classifier, images) -> torch.Tensor:
    was_training = classifier.training
    classifier.eval()
    logits = classifier(_classifier_inputs(classifier, images)).logits.float().cpu()
    classifier.train(was_training)
    return logits.softmax(dim=-1)


def digit_accuracy(classifier, images, labels: Sequence[int]) -> list[float]:
    """1.0 where the classifier's top class is the given label, else 0.0 (one entry per image)."""
    predictions = _class_probabilities(classifier, images).argmax(dim=-1)
    return (predictions == torch.as_tensor(list(labels))).float().tolist()


class ClassifierReward:
    """Classifier confidence of the class a prompt asks for.

    The class comes from a dataset column passed as a keyword (TRL's convention: `label_key`, one per image).

    Args:
        classifier: a model whose output has `.logits` and whose config has `in_channels` and `sample_size`, e.g.
            the zoo's [`ConvImageClassifier`] (`zoo.load("digits-classifier")`).
        label_key (`str`, defaults to `"label"`): the keyword holding the wanted class of every image.
        mode (`str`, defaults to `"probability"`): `"probability"` (softmax probability of the class),
            `"log_probability"`, or `"correct"` (1 if the top class is the wanted one, else 0; GenEval-like).
    """

    MODES = ("probability", "log_probability", "correct")

    def __init__(self, classifier, label_key: str = "label", mode: str = "probability"):
        if mode not in self.MODES:
            raise ValueError(f"`mode` must be one of {self.MODES}, got {mode!r}.")
        self.classifier, self.label_key, self.mode = classifier, label_key, mode
        self.__name__ = f"classifier_{mode}"

    def __call__(self, prompts, images, **kwargs) -> list[float]:
        if self.label_key not in kwargs:
            raise ValueError(
                f"ClassifierReward needs the wanted class of every image in the dataset column {self.label_key!r}; "
                f"the trainer passed the columns {sorted(kwargs)}."
            )
        labels = torch.as_tensor([int(label) for label in kwargs[self.label_key]])
        probabilities = _class_probabilities(self.classifier, images)
        if self.mode == "correct":
            return (probabilities.argmax(dim=-1) == labels).float().tolist()
        chosen = probabilities.gather(1, labels[:, None]).squeeze(1)
        return (chosen.clamp_min(1e-12).log() if self.mode == "log_probability" else chosen).tolist()


class CLIPScoreReward:
    """CLIP-score (or PickScore) reward: image-text similarity from a transformers `CLIPModel` on disk or the Hub.

    The score is `logit_scale * cosine(image, text)` (PickScore's definition; `yuvalkirstain/PickScore_v1` is a
    `CLIPModel`), or `100 * max(cosine, 0)` with `scale="clip_score"` (the CLIP-score of Hessel et al.).

    Args:
        model_name_or_path (`str`): a `CLIPModel` folder with its processor (tokenizer and image processor).
        scale (`str`, defaults to `"logit_scale"`): `"logit_scale"` or `"clip_score"`.
        device (`str`, defaults to `"cpu"`): where the model runs.
    """

    def __init__(self, model_name_or_path: str, scale: str = "logit_scale", device: str = "cpu"):
        if scale not in ("logit_scale", "clip_score"):
            raise ValueError(f"`scale` must be 'logit_scale' or 'clip_score', got {scale!r}.")
        from transformers import AutoProcessor, CLIPModel

        self.model = CLIPModel.from_pretrained(model_name_or_path).to(device).eval()
        self.processor = AutoProcessor.from_pretrained(model_name_or_path)
        self.scale, self.device = scale, device
        self.__name__ = "clip_score" if scale == "clip_score" else "pickscore"

    @torch.no_grad()
    def __call__(self, prompts, images, **kwargs) -> list[float]:
        tensor = images_to_tensor(images).clamp(0, 1)
        if tensor.shape[1] == 1:
            tensor = tensor.expand(-1, 3, -1, -1)
        pil = [
            PIL.Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)) for image in tensor
        ]
        inputs = self.processor(text=list(prompts), images=pil, return_tensors="pt", padding=True, truncation=True).to(
            self.device
        )
        outputs = self.model(**inputs)
        image = F.normalize(outputs.image_embeds.float(), dim=-1)
        text = F.normalize(outputs.text_embeds.float(), dim=-1)
        cosine = (image * text).sum(dim=-1)
        if self.scale == "clip_score":
            return (100 * cosine.clamp_min(0)).cpu().tolist()
        return (self.model.logit_scale.exp().float() * cosine).cpu().tolist()
