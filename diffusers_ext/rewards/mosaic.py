"""A GenEval-style reward on mosaic scenes: the exact mosaic judge's verdict on the prompt's skill checks."""

from .images import images_to_tensor


class MosaicJudgeReward:
    r"""
    1.0 when the image passes every skill check of its prompt (objects, colours, counts, relation; GenEval's
    "correct"), else 0.0, from a mosaic judge (`diffusers_ext.evaluation.mosaic.MosaicEvaluator`, a rule-based
    judge that reads the rendered scene: no network, so nothing the policy is trained on can fool it through shared
    features).

    The prompt's structure arrives as the dataset columns of a mosaic row (`diffusers_ext.data.mosaic`):
    `task`, `groups` and `relation`, one entry per image, as the RL trainers pass extra columns.

    Args:
        judge (`MosaicEvaluator`): the judge; anything with `evaluate(image, prompt) -> dict[str, bool]`
            works.
        skill (`str`, defaults to `"overall"`): the verdict rewarded: `"overall"` (every check) or one skill
            (`"object"`, `"colour"`, `"count"`, `"relation"`), scored 0 on prompts it does not apply to.

    Example:
        >>> reward = MosaicJudgeReward(MosaicEvaluator(MosaicConfig(resolution=64)))
        >>> reward(prompts, images, task=tasks, groups=groups, relation=relations)  # images (B, 3, 64, 64) in [0, 1]
    """

    SKILLS = ("overall", "object", "colour", "count", "relation")

    def __init__(self, judge, skill: str = "overall"):
        if not callable(getattr(judge, "evaluate", None)):
            raise ValueError(
                f"`judge` must have an `evaluate(image, prompt)` method (a MosaicEvaluator), got {judge!r}."
            )
        if skill not in self.SKILLS:
            raise ValueError(f"`skill` must be one of {list(self.SKILLS)}, got {skill!r}.")
        self.judge = judge
        self.skill = skill
        self.__name__ = f"mosaic_{skill}"

    def __call__(self, prompts, images, task=None, groups=None, relation=None, **kwargs) -> list[float]:
        images = images_to_tensor(images)
        if task is None or groups is None:
            raise ValueError(
                "MosaicJudgeReward needs the mosaic row's `task`, `groups` and `relation` columns (one per image); "
                f"got task={task!r}, groups={groups!r}."
            )
        relations = relation if relation is not None else [""] * len(task)
        if not len(task) == len(groups) == len(relations) == images.shape[0]:
            raise ValueError(
                f"{images.shape[0]} images but {len(task)} `task`, {len(groups)} `groups` and {len(relations)} "
                "`relation` entries; expected one of each per image."
            )
        rewards = []
        for image, t, g, r in zip(images.float().clamp(0, 1), task, groups, relations):
            verdict = self.judge.evaluate(image, {"task": t, "groups": g, "relation": r})
            rewards.append(float(verdict.get(self.skill, False)))
        return rewards

    def __repr__(self) -> str:
        return f"MosaicJudgeReward(judge={self.judge!r}, skill={self.skill!r})"


def mosaic_reward_rows(records) -> list[dict]:
    """Trainer dataset rows (`prompt`, `task`, `groups`, `relation`) from mosaic records, for
    `DiffusionGRPOTrainer(..., train_dataset=mosaic_reward_rows(...))` with a [`MosaicJudgeReward`]."""
    return [
        {"prompt": r["caption"], "task": r["task"], "groups": r["groups"], "relation": r.get("relation", "")}
        for r in records
    ]
