"""Reward functions for the RL trainers: plain callables `f(prompts, images, **kwargs) -> list[float]`.

`images` is what the trainer decodes: a float tensor `(batch, channels, height, width)` in [0, 1]. Lists of PIL
images and `(batch, height, width, channels)` numpy arrays in [0, 1] are accepted too, so the same callables score
a pipeline's `output_type="pil"` or `"np"` results. Extra dataset columns (e.g. `label`) arrive as keyword lists
with one entry per image, as in TRL. Graph rewards (`graphs.py`) take `f(graphs, **columns)` with a list of networkx
graphs instead.
"""

from .classifier import ClassifierReward, digit_accuracy
from .clip_score import CLIPScoreReward
from .color import BrightnessReward, ColorReward
from .compressibility import jpeg_compressibility, jpeg_incompressibility
from .graphs import PlanarShapedReward, planar_validity_reward, tree_validity_reward
from .images import images_to_tensor
from .mosaic import MosaicJudgeReward, mosaic_reward_rows


__all__ = [
    "BrightnessReward",
    "CLIPScoreReward",
    "ClassifierReward",
    "ColorReward",
    "digit_accuracy",
    "images_to_tensor",
    "jpeg_compressibility",
    "jpeg_incompressibility",
    "MosaicJudgeReward",
    "mosaic_reward_rows",
    "PlanarShapedReward",
    "planar_validity_reward",
    "tree_validity_reward",
]
