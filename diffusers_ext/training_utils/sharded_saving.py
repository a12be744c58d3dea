"""Saving what the processes trained when each holds only a shard of it (FSDP, DeepSpeed ZeRO-3).

Under FSDP's FULL_SHARD, `accelerator.prepare` replaces every parameter of the model with a flat shard of it, so
two things a single-process script gets right by accident go wrong:

- an EMA built before `prepare` tracks the original, now orphaned, tensors (build it after `prepare`, from the
  prepared model's parameters: an EMA is elementwise, so each process averaging its own shard is exact);
- `accelerator.unwrap_model(model)` on the main process holds only that process's shard, so saving it writes a
  fraction of the weights.

[`gathered_model`] is the one way the training scripts obtain the model they save: a collective every process
calls, which copies the EMA weights into each shard, gathers the full state dict and rebuilds the model whole on the
main process. On one process or under DDP it is a copy of the unwrapped model (with the EMA weights).
"""

import copy

import torch


def shards_parameters(accelerator) -> bool:
    """Whether models prepared by `accelerator` hold only a shard of their parameters on each process (FSDP,
    DeepSpeed ZeRO-3); then the unwrapped model is not the trained model and saving must gather it first."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        return True
    if kind == DistributedType.DEEPSPEED:
        return accelerator.state.deepspeed_plugin.zero_stage == 3
    return False


def _empty_like(model: torch.nn.Module) -> torch.nn.Module:
    """A new instance of `model`'s class with its configuration (diffusers' `from_config`, transformers'
    `_from_config`), to load a gathered state dict into."""
    if hasattr(type(model), "from_config") and hasattr(model, "config") and hasattr(model, "save_config"):
        return type(model).from_config(model.config)
    if hasattr(type(model), "_from_config") and hasattr(model, "config"):
        return type(model)._from_config(model.config)
    raise TypeError(
        f"`model` must be a diffusers ModelMixin or a transformers PreTrainedModel to be rebuilt from its "
        f"configuration, got {type(model).__name__}."
    )


def gathered_model(accelerator, model: torch.nn.Module, ema=None) -> torch.nn.Module | None:
    """The trained `model`, whole, as a new module on the main process (`None` on the others).

    A collective: call it on every process (after `accelerator.wait_for_everyone()`), not under
    `if accelerator.is_main_process`, or a sharded run hangs in the gather.

    Args:
        accelerator (`accelerate.Accelerator`): the run's accelerator.
        model (`torch.nn.Module`): the prepared model (what `accelerator.prepare` returned).
        ema (`diffusers.training_utils.EMAModel`, *optional*): an EMA built after `prepare` from the prepared model's
            parameters; the returned model then holds the EMA weights, and the training model keeps its own.

    Returns:
        A new module of the unwrapped model's class (its weights as trained, or the EMA's; in eval mode) on the main
        process, `None` elsewhere. Under sharding it is rebuilt from the model's configuration (diffusers'
        `from_config`, transformers' `_from_config`) and the gathered state dict.
    """
    unwrapped = accelerator.unwrap_model(model)
    parameters = list(unwrapped.parameters())
    if ema is not None:
        ema.store(parameters)
        ema.copy_to(parameters)
    try:
        if not shards_parameters(accelerator):
            # the unwrapped model is whole on every process: a copy keeps its state, buffers and attributes
            return copy.deepcopy(unwrapped).eval() if accelerator.is_main_process else None
        state = accelerator.get_state_dict(model)
        if not accelerator.is_main_process:
            return None
        with torch.random.fork_rng(devices=[]):  # building the module draws initial weights: leave the run's RNG be
            final = _empty_like(unwrapped)
        final.load_state_dict({name: tensor.detach().clone() for name, tensor in state.items()})
        return final.to(parameters[0].device if parameters else "cpu").eval()
    finally:
        if ema is not None:
            ema.restore(parameters)


def check_unsharded(accelerator, script: str, reason: str) -> None:
    """Refuse, before any training, to run `script` with sharded parameters (FSDP, DeepSpeed ZeRO-3), saying
    `reason`: for scripts that train parts of a model through wrapper modules and save the parts, which a sharded
    run would save as shards."""
    if shards_parameters(accelerator):
        raise ValueError(
            f"{script} does not support sharded training ({accelerator.distributed_type}): {reason}. Run it on one "
            "process or with data parallelism (`accelerate launch --multi_gpu` / the default multi-process launch)."
        )
