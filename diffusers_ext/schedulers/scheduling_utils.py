"""What the package's schedulers share: timestep lookup, per-row uniform noise, and the contract between
[`DiffusionLMPipeline`] and its schedulers."""

import math

import torch


DIFFUSION_LM_STEP_KEYWORDS = (
    "mask_token_id",
    "transfer_mask",
    "beam_scores",
    "beam_lengths",
    "beam_groups",
    "temperature",
    "generator",
)
"""The keywords [`DiffusionLMPipeline`] passes to every diffusion-LM scheduler's `step`, after `model_output`
(logits `(N, L, V)` aligned with the sequences), `timestep` (one per row, `(N,)`) and `sample` `(N, L)`."""

DIFFUSION_LM_OUTPUT_FIELDS = (
    "prev_sample",
    "transfer_index",
    "confidence",
    "beam_scores",
    "beam_lengths",
    "beam_groups",
    "parent_index",
)
"""The fields [`DiffusionLMPipeline`] reads from the output of a diffusion-LM scheduler's `step`."""


class DiffusionLMSchedulerMixin:
    """The contract of a scheduler that decodes masked diffusion language models in [`DiffusionLMPipeline`].

    - `set_timesteps(num_inference_steps, device=None, **options)` sets the `timesteps` of one block.
    - `step(model_output, timestep, sample, *, mask_token_id, transfer_mask, beam_scores, beam_lengths, beam_groups,
      temperature, generator, return_dict=True, **options)` commits tokens (`DIFFUSION_LM_STEP_KEYWORDS`) and returns
      an output with at least the fields `DIFFUSION_LM_OUTPUT_FIELDS`: the kept rows `(N',)` (beams of all prompts,
      rows of a prompt contiguous) and, for each, the input row it came from (`parent_index`).
    - The optional keywords a scheduler implements are declared, not guessed from its signature:
      `step_options` (e.g. SOAR's `top_p`, `num_transfer_tokens`; OeMDM's `exponents`) and
      `set_timesteps_options` (e.g. SOAR's `block_length`). The pipeline passes only declared options, and a decoding
      option a caller set that the scheduler does not declare raises a `ValueError` naming it.
    """

    step_options: tuple[str, ...] = ()
    set_timesteps_options: tuple[str, ...] = ()


def timestep_indices(timestep, timesteps: torch.Tensor, atol: float | None = None) -> torch.LongTensor:
    """The index in `timesteps` of `timestep` (a number, a 0-d tensor or a 1-D tensor of them), of shape `(n,)`.

    A value matches a timestep when equal to it (or, with `atol`, closer than `atol`); the first match wins. A value
    that matches none raises a `ValueError` naming it and the scheduler's timesteps.
    """
    timesteps = timesteps.cpu()
    values = torch.as_tensor(timestep, dtype=timesteps.dtype).reshape(-1).cpu()
    if atol is None:
        matches = values.unsqueeze(1) == timesteps.unsqueeze(0)
    else:
        matches = (values.unsqueeze(1) - timesteps.unsqueeze(0)).abs() < atol
    unknown = ~matches.any(1)
    if bool(unknown.any()):
        raise ValueError(
            f"`timestep` {values[unknown].tolist()} is not among the scheduler's timesteps {timesteps.tolist()}; "
            "call `set_timesteps` first and pass its values."
        )
    return matches.to(torch.int8).argmax(1)


def draw_uniform(
    shape,
    generator,
    groups: torch.Tensor,
    device,
    dtype: torch.dtype | None = None,
    offset: int = 0,
    one_draw: bool = False,
) -> torch.Tensor:
    """Uniform `[0, 1)` noise of shape `(N, *shape)`, `N = len(groups)`, drawn over the positions from `offset` on
    (earlier positions get 0.5 and are never used).

    With a list of generators, row `r` draws from `generator[groups[r]]` alone, so a prompt (or sequence) with its own
    generator gets the same noise alone or in any batch. With one generator (or `None`, the global RNG) the rows
    draw in order, one draw per row, or with `one_draw` one draw of the whole tensor (the same numbers on a CPU;
    not on every accelerator). Draws are made on the generator's device and moved to `device`.
    """
    shape = tuple(shape)
    drawn = (shape[0] - offset, *shape[1:])

    def rand(size, source):
        source_device = source.device if source is not None else device
        return torch.rand(size, generator=source, dtype=dtype, device=source_device).to(device)

    if one_draw and not isinstance(generator, (list, tuple)):
        noise = rand((len(groups), *drawn), generator)
        if offset == 0:
            return noise
        out = torch.full((len(groups), *shape), 0.5, dtype=noise.dtype, device=device)
        out[:, offset:] = noise
        return out
    rows = []
    for g in groups.tolist():
        source = generator[g] if isinstance(generator, (list, tuple)) else generator
        noise = rand(drawn, source)
        if offset == 0:
            rows.append(noise)
            continue
        row = torch.full(shape, 0.5, dtype=noise.dtype, device=device)
        row[offset:] = noise
        rows.append(row)
    return torch.stack(rows) if rows else torch.empty((0, *shape), dtype=dtype, device=device)


# float64 noise values a CPU generator draws per call when it draws a row position by position (~32 MiB)
_DRAW_CHUNK_NUMEL = 1 << 22


def draw_uniform_at(
    positions: torch.BoolTensor,
    size,
    generator,
    groups: torch.Tensor,
    device,
    dtype: torch.dtype | None = None,
    offset: int = 0,
    one_draw: bool = False,
) -> torch.Tensor:
    """The values of `draw_uniform((L, *size), generator, groups, device, dtype, offset, one_draw)` at `positions`
    `(N, L)`, of shape `(P, *size)` in the order of `positions.nonzero()`: the same numbers, drawn with the same
    consumption of every generator, without holding the whole `(N, L, *size)` noise.

    A row is drawn and gathered before the next one is drawn; from a CPU generator (or the global CPU RNG) a row is
    drawn in chunks of positions (a CPU generator gives the same numbers however a draw is split), so at most
    `_DRAW_CHUNK_NUMEL` values are alive at a time. On another device with one generator and `one_draw`, the whole
    tensor is drawn at once (splitting it would change the numbers there) and then gathered.
    """
    size = tuple(size)
    length = positions.shape[1]
    dtype = dtype if dtype is not None else torch.get_default_dtype()

    def source_of(g):
        return g.device if g is not None else torch.device(device)

    single = not isinstance(generator, (list, tuple))
    if one_draw and single and source_of(generator).type != "cpu":
        return draw_uniform((length, *size), generator, groups, device, dtype, offset, one_draw=True)[positions]
    per_position = math.prod(size)
    counts = positions.sum(1).tolist()
    out = torch.full((sum(counts), *size), 0.5, dtype=dtype, device=device)
    first = 0
    for row, g in enumerate(groups.tolist()):
        source = generator if single else generator[g]
        source_device = source_of(source)
        cols = positions[row].nonzero(as_tuple=True)[0].to(source_device)
        drawn = length - offset
        step = drawn if source_device.type != "cpu" else max(1, _DRAW_CHUNK_NUMEL // max(1, per_position))
        for start in range(0, drawn, step):
            stop = min(start + step, drawn)
            noise = torch.rand((stop - start, *size), generator=source, dtype=dtype, device=source_device)
            inside = ((cols >= offset + start) & (cols < offset + stop)).nonzero(as_tuple=True)[0]
            if len(inside):
                out[first + inside.to(out.device)] = noise[cols[inside] - offset - start].to(device)
            del noise  # before the next chunk is drawn
        first += counts[row]
    return out
