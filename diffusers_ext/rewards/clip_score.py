"""CLIP-score and PickScore: image-text similarity from a transformers `CLIPModel`."""

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F

from .images import images_to_tensor


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
