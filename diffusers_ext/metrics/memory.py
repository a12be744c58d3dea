"""Peak memory of a piece of work: the CUDA allocator's peak on GPUs, the profiler's allocation events on CPUs."""

from collections.abc import Callable

import torch


def peak_memory_bytes(fn: Callable[[], object], device: str | torch.device = "cpu") -> int:
    r"""
    Run `fn()` and return the peak of the bytes it allocated on `device` above what was allocated before.

    On CUDA this is `torch.cuda.max_memory_allocated` after a reset; on the CPU, where torch keeps no peak counter,
    the torch profiler's memory events (every allocation and free, in order) are summed and their running maximum
    taken. Tensors that exist before the call (weights, inputs) are not counted, so ratios between two calls on the
    same inputs compare the work's own memory (activations, gradients, optimiser state).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - baseline)
    if device.type != "cpu":
        raise ValueError(f"`device` must be a CPU or CUDA device, got {device}.")
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    ]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return int(peak)
