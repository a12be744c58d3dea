import numpy as np
import pytest
import torch

from diffusers_ext.data.mosaic import MosaicConfig
from diffusers_ext.evaluation.mosaic import MosaicEvaluator, mosaic_records
from diffusers_ext.rewards import MosaicJudgeReward, mosaic_reward_rows


CONFIG = MosaicConfig(resolution=64)
JUDGE = MosaicEvaluator(CONFIG)


def _batch(n=8, seed=1000):
    records = list(mosaic_records(CONFIG, n, seed, "test"))
    images = torch.stack(
        [torch.from_numpy(np.asarray(r["image"], dtype=np.float32) / 255).permute(2, 0, 1) for r in records]
    )
    rows = mosaic_reward_rows(records)
    columns = {key: [row[key] for row in rows] for key in ("task", "groups", "relation")}
    return [row["prompt"] for row in rows], images, columns


def test_rendered_scenes_pass_their_own_prompts_and_fail_others():
    prompts, images, columns = _batch()
    reward = MosaicJudgeReward(JUDGE)
    assert reward(prompts, images, **columns) == [1.0] * len(prompts)
    # each image judged against another row's prompt: these rows' scenes differ, so every check fails somewhere
    shifted = {key: values[1:] + values[:1] for key, values in columns.items()}
    assert sum(reward(prompts, images, **shifted)) < len(prompts) / 2
    # a blank canvas has no objects
    assert reward(prompts, torch.zeros_like(images), **columns) == [0.0] * len(prompts)


def test_one_skill_scores_only_the_prompts_it_applies_to():
    prompts, images, columns = _batch(12)
    counts = MosaicJudgeReward(JUDGE, skill="count")(prompts, images, **columns)
    assert counts == [float(task == "count") for task in columns["task"]]


def test_rows_carry_what_the_reward_reads():
    (row,) = mosaic_reward_rows(list(mosaic_records(CONFIG, 1, 3, "train")))
    assert set(row) == {"prompt", "task", "groups", "relation"}


def test_bad_input_is_named():
    prompts, images, columns = _batch(2)
    with pytest.raises(ValueError, match="skill"):
        MosaicJudgeReward(JUDGE, skill="size")
    with pytest.raises(ValueError, match="`judge` must have an `evaluate"):
        MosaicJudgeReward(CONFIG)
    with pytest.raises(ValueError, match="`task`, `groups` and `relation` columns"):
        MosaicJudgeReward(JUDGE)(prompts, images)
    with pytest.raises(ValueError, match="2 images but 1 `task`"):
        MosaicJudgeReward(JUDGE)(prompts, images, **{k: v[:1] for k, v in columns.items()})
