"""The training scripts' save under sharded parameters (FSDP FULL_SHARD, DeepSpeed ZeRO-3).

accelerate does not enter FSDP on this CPU-only machine, so the gather is tested against a faithful stand-in: two
ranks in two threads, each holding a flat half of every parameter (what FULL_SHARD leaves on a process), and a
`get_state_dict` that is a collective (it waits for both ranks, then concatenates their halves), as accelerate's is.
"""

import ast
import copy
import os
import threading

import pytest
import torch
from accelerate.utils import DistributedType
from diffusers import UNet2DModel
from diffusers.training_utils import EMAModel

from diffusers_ext.testing import get_tiny_pixel_unet
from diffusers_ext.training_utils import check_unsharded, gathered_model, shards_parameters


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLD = 2


def tiny_unet(seed=0):
    return get_tiny_pixel_unet(seed)


def shard(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """`model` with every parameter replaced by rank `rank`'s flat half of it, as FULL_SHARD leaves it."""
    sharded = copy.deepcopy(model)
    for parameter in sharded.parameters():
        parameter.data = parameter.data.flatten().tensor_split(WORLD)[rank].clone()
    return sharded


class ShardedAccelerator:
    """One rank of a two-rank FULL_SHARD run: `get_state_dict` gathers every rank's shards (a collective)."""

    distributed_type = DistributedType.FSDP

    def __init__(self, rank, world_models, shapes, barrier):
        self.rank, self.world_models, self.shapes, self.barrier = rank, world_models, shapes, barrier
        self.is_main_process = rank == 0

    def unwrap_model(self, model):
        return model

    def get_state_dict(self, model):
        self.barrier.wait()  # every rank has put what it saves (its EMA shard) in place
        state = {
            name: torch.cat([dict(m.named_parameters())[name].data for m in self.world_models]).view(shape).clone()
            for name, shape in self.shapes.items()
        }
        buffers = dict(self.world_models[0].named_buffers())
        self.barrier.wait()  # nobody restores before everybody has been read
        return {**state, **{k: v.clone() for k, v in buffers.items()}}


def run_ranks(target):
    results, errors = [None] * WORLD, []

    def call(rank):
        try:
            results[rank] = target(rank)
        except Exception as error:  # noqa: BLE001 - re-raised in the main thread
            errors.append(error)

    threads = [threading.Thread(target=call, args=(rank,)) for rank in range(WORLD)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def test_the_saved_model_is_gathered_whole_with_the_ema_weights_and_training_keeps_its_own():
    trained = tiny_unet(0)
    averaged = tiny_unet(1)  # what the EMA holds: other values of the same shapes
    shapes = {name: p.shape for name, p in trained.named_parameters()}
    world = [shard(trained, rank) for rank in range(WORLD)]
    barrier = threading.Barrier(WORLD)
    # the EMA is built after `prepare`, from each rank's shards, and averages them elementwise
    emas = []
    for rank in range(WORLD):
        ema = EMAModel(world[rank].parameters())
        ema.shadow_params = [p.detach().clone() for p in shard(averaged, rank).parameters()]
        emas.append(ema)
    before = [[p.detach().clone() for p in m.parameters()] for m in world]

    results = run_ranks(
        lambda rank: gathered_model(ShardedAccelerator(rank, world, shapes, barrier), world[rank], emas[rank])
    )

    assert results[1] is None  # only the main process gets the model
    saved = results[0]
    assert isinstance(saved, UNet2DModel) and not saved.training
    for name, parameter in saved.named_parameters():
        torch.testing.assert_close(parameter, dict(averaged.named_parameters())[name], rtol=0, atol=0)
    for model, kept in zip(world, before):  # the training shards are back to the trained weights
        for parameter, value in zip(model.parameters(), kept):
            assert torch.equal(parameter, value)


def test_the_unwrapped_shard_on_the_main_process_is_not_the_model():
    """What the scripts saved before: the main process's unwrapped model, which under FULL_SHARD holds a half."""
    trained = tiny_unet(0)
    main_shard = shard(trained, 0)
    with pytest.raises(RuntimeError, match="size mismatch"):
        UNet2DModel.from_config(trained.config).load_state_dict(main_shard.state_dict())


def test_one_process_gives_the_trained_model_and_leaves_the_rng_alone():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    assert not shards_parameters(accelerator)
    model = accelerator.prepare(tiny_unet(0))
    ema = EMAModel(accelerator.unwrap_model(model).parameters())
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    saved = gathered_model(accelerator, model, ema)
    assert torch.equal(torch.rand(3), expected)  # rebuilding the module drew nothing from the run's generator
    for a, b in zip(saved.parameters(), tiny_unet(0).parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    check_unsharded(accelerator, "train_x.py", "a reason")  # nothing to refuse on one process


def test_a_script_that_cannot_shard_says_so_before_training():
    class Sharded:
        distributed_type = DistributedType.FSDP

    with pytest.raises(ValueError, match="train_x.py does not support sharded training .*because"):
        check_unsharded(Sharded(), "train_x.py", "because")


def _calls(tree, name):
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)
    ]


@pytest.mark.parametrize(
    "script", sorted(f for f in os.listdir(os.path.join(REPO, "training")) if f.startswith("train_"))
)
def test_every_training_script_saves_a_gathered_model_and_builds_its_ema_after_prepare(script):
    """A script that saves a model obtains it through `gathered_model` (or refuses sharded runs with
    `check_unsharded`), never as the main process's unwrapped shard; an EMA is built after `accelerator.prepare`."""
    with open(os.path.join(REPO, "training", script), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    if not _calls(tree, "save_pretrained"):
        return  # saves through a trainer (base_trainer gathers) or not at all
    assert _calls(tree, "gathered_model") or _calls(tree, "check_unsharded"), script
    prepares = [node.lineno for node in _calls(tree, "prepare")]
    for ema in _calls(tree, "EMAModel"):
        assert prepares and ema.lineno > min(prepares), f"{script}:{ema.lineno} builds its EMA before prepare"
