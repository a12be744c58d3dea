"""Divide-and-Denoise on the model families users run: SDXL (`UNet2DConditionModel` with
`addition_embed_type="text_time"`), SD3 (`SD3Transformer2DModel`) and Flux (`FluxTransformer2DModel`, packed latents
and a guidance input), each with its own CLIP / T5 text encoders, at reduced width (the test kit's tiny builders).

Every family is run in float32 and in the dtype its users run it in (float16 for SDXL, bfloat16 for SD3 and Flux):
one agent reproduces the family's own pipeline image for image, experts compose into finite images through the
cross-attention (joint-attention) utility, a batch equals its single images, the composition saves and loads, a
callback sees and edits every step, and on an analytic case (each expert the exact denoiser of one blob) the fair
division hands each expert its own region.
"""

import numpy as np
import pytest
import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    StableDiffusion3Pipeline,
    StableDiffusionXLPipeline,
)

from diffusers_ext import AverageAllocator, DivideAndDenoisePipeline
from diffusers_ext.pipelines.divide_and_denoise.flux_latents import latent_image_ids, pack_latents, unpack_latents
from diffusers_ext.pipelines.divide_and_denoise.text_encoding import family_prompt_token_positions
from diffusers_ext.testing import get_tiny_flux_components, get_tiny_sd3_components, get_tiny_sdxl_components


# Flux.1-dev's sampler: the shift follows the image's token count (`mu`), which the composition must pass as
# FluxPipeline does.
FLUX_DEV_SCHEDULER = {
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}


def family_pipeline(family: str, seed: int = 0):
    """The family's own diffusers pipeline on the kit's tiny components (Flux with a guidance input, as Flux.1-dev)."""
    if family == "sdxl":
        pipe = StableDiffusionXLPipeline(**get_tiny_sdxl_components(seed))
    elif family == "sd3":
        pipe = StableDiffusion3Pipeline(**get_tiny_sd3_components(seed))
    else:
        components = get_tiny_flux_components(seed, guidance_embeds=True)
        components["scheduler"] = FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER)
        pipe = FluxPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# per family: the call's size and text options (16 x 16 latents each), its guidance, and the latents' shape
CALL = {
    "sdxl": {"height": 32, "width": 32, "guidance_scale": 3.0},
    "sd3": {"height": 32, "width": 32, "guidance_scale": 3.0, "max_sequence_length": 8},
    "flux": {"height": 16, "width": 16, "guidance_scale": 3.5, "max_sequence_length": 8},
}
LATENTS = {"sdxl": (4, 16, 16), "sd3": (4, 16, 16), "flux": (1, 16, 16)}
USER_DTYPE = {"sdxl": torch.float16, "sd3": torch.bfloat16, "flux": torch.bfloat16}
FAMILIES = ("sdxl", "sd3", "flux")


def composition(family: str, seeds=(0, 1), dtype=torch.float32) -> DivideAndDenoisePipeline:
    pipe = DivideAndDenoisePipeline.from_pipelines([family_pipeline(family, seed) for seed in seeds])
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(dtype=dtype)


def dnd_cell(family: str, dtype=None, method: str = "divide_and_denoise"):
    return pytest.mark.support_cell(method, family, dtype=dtype)


def family_and_dtype_params(method: str = "divide_and_denoise"):
    """`(family, dtype)` for every family in float32 and in its users' dtype, each marked as its support cell."""
    params = []
    for family in FAMILIES:
        params.append(pytest.param(family, torch.float32, marks=dnd_cell(family, method=method), id=f"{family}-fp32"))
        user = USER_DTYPE[family]
        name = str(user).removeprefix("torch.")
        params.append(pytest.param(family, user, marks=dnd_cell(family, name, method), id=f"{family}-{name}"))
    return params


@pytest.mark.parametrize("family", FAMILIES)
def test_one_agent_reproduces_the_family_pipeline(family):
    """With one agent every allocation is 1: the composition is the family's own sampler, so its image must be the
    family pipeline's for the same prompt and noise (prompts encoded by the family's own `encode_prompt`, SDXL's time
    ids, SD3's and Flux's T5, Flux's packed latents, guidance input and dynamic shift)."""
    source = family_pipeline(family)
    latents = torch.randn(1, *LATENTS[family], generator=torch.Generator().manual_seed(1))
    family_latents = pack_latents(latents) if family == "flux" else latents
    expected = source("a red circle", num_inference_steps=3, latents=family_latents, output_type="np", **CALL[family])
    pipe = DivideAndDenoisePipeline.from_pipelines([source])
    pipe.set_progress_bar_config(disable=True)
    got = pipe(
        prompt=["a red circle"],
        num_inference_steps=3,
        latents=latents,
        output_type="np",
        allocator=AverageAllocator(),
        **CALL[family],
    )
    np.testing.assert_allclose(got.images, expected.images, atol=1e-5)


@pytest.mark.parametrize("family, dtype", family_and_dtype_params())
def test_experts_compose_through_their_attention_utility(family, dtype):
    """Two experts (different weights) with a prompt each: finite images, and allocations that divide every position
    (summing to 1) unevenly, read from each expert's cross- or joint attention to its prompt's tokens."""
    pipe = composition(family, dtype=dtype)
    out = pipe(
        prompt=["a red circle", "a blue square"],
        num_inference_steps=3,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
        **CALL[family],
    )
    assert pipe.denoisers.dtype == dtype
    assert out.images.shape == (1, CALL[family]["height"], CALL[family]["width"], 3)
    assert np.isfinite(out.images).all()
    assert out.allocations.shape == (3, 1, 2, 16, 16)
    torch.testing.assert_close(out.allocations.sum(dim=2), torch.ones(3, 1, 16, 16), atol=1e-5, rtol=0)
    assert out.allocations.std() > 0


@pytest.mark.parametrize("family, dtype", family_and_dtype_params())
def test_a_batch_equals_its_single_images(family, dtype):
    pipe = composition(family, dtype=dtype)
    kwargs = {"prompt": ["a red circle", "a blue square"], "num_inference_steps": 2, "output_type": "latent"}
    kwargs |= CALL[family]
    batch = pipe(num_images_per_prompt=2, generator=[torch.Generator().manual_seed(s) for s in (3, 4)], **kwargs)
    singles = [pipe(generator=torch.Generator().manual_seed(s), **kwargs) for s in (3, 4)]
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    for b, single in enumerate(singles):
        torch.testing.assert_close(batch.images[b : b + 1], single.images, atol=tolerance, rtol=tolerance)
        torch.testing.assert_close(batch.allocations[:, b : b + 1], single.allocations, atol=tolerance, rtol=0)


@pytest.mark.parametrize("family, dtype", family_and_dtype_params())
def test_the_composition_saves_and_loads(family, dtype, tmp_path):
    pipe = composition(family, dtype=dtype)
    kwargs = {"prompt": ["a red circle", "a blue square"], "num_inference_steps": 2, "output_type": "latent"}
    kwargs |= CALL[family]
    expected = pipe(generator=torch.Generator().manual_seed(0), **kwargs).images
    pipe.save_pretrained(tmp_path)
    loaded = DivideAndDenoisePipeline.from_pretrained(tmp_path, dtype=dtype)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.family == family and loaded.denoisers.dtype == dtype
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        assert (getattr(loaded, name) is None) == (getattr(pipe, name) is None), name
    torch.testing.assert_close(loaded(generator=torch.Generator().manual_seed(0), **kwargs).images, expected)


@pytest.mark.parametrize("family, dtype", family_and_dtype_params())
def test_a_callback_sees_every_step_and_edits_the_latents(family, dtype):
    pipe = composition(family, dtype=dtype)
    seen = []

    def callback(pipeline, i, t, tensors):
        seen.append((i, tuple(tensors["allocation"].shape), tuple(tensors["latents"].shape)))
        return {"latents": torch.zeros_like(tensors["latents"])} if i == 2 else {}

    out = pipe(
        prompt=["a red circle", "a blue square"],
        num_inference_steps=3,
        output_type="latent",
        callback_on_step_end=callback,
        callback_on_step_end_tensor_inputs=["latents", "allocation"],
        generator=torch.Generator().manual_seed(0),
        **CALL[family],
    )
    assert seen == [(i, (1, 2, 16, 16), (1, *LATENTS[family])) for i in range(3)]
    assert torch.equal(out.images, torch.zeros(1, *LATENTS[family], dtype=dtype))


# ---------------------------------------------------------------------------------------------------------------------
# an analytic case: each expert is the exact denoiser of one clean latent (a blob in its own half of the canvas)
# ---------------------------------------------------------------------------------------------------------------------


def blob_latents(family: str, side: str) -> torch.Tensor:
    """A clean latent `(1, C, 16, 16)`: 0 everywhere but a 6 x 6 square of 2.0 in the middle of the left or right
    half."""
    clean = torch.zeros(1, *LATENTS[family])
    left = 1 if side == "left" else 9
    clean[:, :, 5:11, left : left + 6] = 2.0
    return clean


def make_exact_denoiser(model, family: str, clean: torch.Tensor, scheduler) -> None:
    """Replace `model`'s output (a forward hook: the real class still runs) by the exact prediction of a data set that
    holds only `clean`: SDXL's noise `(x_t - sqrt(a) x_0) / sqrt(1 - a)` at the VP-scaled input, SD3's and Flux's
    velocity `(x_t - x_0) / sigma` (Flux's packed)."""

    def hook(module, args, kwargs, output):
        if family == "sdxl":
            sample, timestep = args[0], args[1]
            alpha_bar = scheduler.alphas_cumprod[timestep.long().cpu()].view(-1, 1, 1, 1).to(sample)
            exact = (sample - alpha_bar.sqrt() * clean.to(sample)) / (1 - alpha_bar).sqrt()
        elif family == "sd3":
            sample = kwargs["hidden_states"]
            sigma = (kwargs["timestep"] / 1000).view(-1, 1, 1, 1).to(sample)
            exact = (sample - clean.to(sample)) / sigma
        else:
            sample = kwargs["hidden_states"]
            sigma = kwargs["timestep"].view(-1, 1, 1).to(sample)  # Flux's timestep is sigma itself
            exact = (sample - pack_latents(clean).to(sample)) / sigma
        return type(output)(sample=exact.to(output.sample.dtype))

    model.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fair_division_hands_each_analytic_expert_its_own_region(family):
    """Expert 0 knows only a blob on the left, expert 1 only one on the right. Their clean-sample saliency is exact,
    so the fair division must give each expert its own blob (and the sample must become both blobs): a layout no
    fixed split is told."""
    pipe = composition(family)
    blobs = [blob_latents(family, side) for side in ("left", "right")]
    for model, clean in zip(pipe.denoisers, blobs):
        make_exact_denoiser(model, family, clean, pipe.scheduler)
    out = pipe(
        prompt=["a red circle", "a blue square"],
        num_inference_steps=8,
        utility="x0_saliency",
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
        **{**CALL[family], "guidance_scale": 1.0},
    )
    # inside each blob (one position in from its edge, where the smoothed allocation is mixed) the expert holds its
    # blob, and the sample is that blob
    final, composite, rows = out.allocations[-1, 0], out.images[0], slice(6, 10)
    for k, (clean, columns) in enumerate(zip(blobs, (slice(2, 6), slice(10, 14)))):
        share = final[k, rows, columns]
        assert share.min() > 0.9, (k, share)
        torch.testing.assert_close(composite[:, rows, columns], clean[0, :, rows, columns], atol=0.15, rtol=0)


# ---------------------------------------------------------------------------------------------------------------------
# the pieces: Flux's packing, each family's token positions, the recording processors on Flux and SD3.5
# ---------------------------------------------------------------------------------------------------------------------


def test_flux_packing_round_trips_in_flux_pipelines_patch_order():
    latents = torch.randn(2, 3, 6, 8)
    packed = pack_latents(latents)
    assert packed.shape == (2, 12, 12)
    torch.testing.assert_close(unpack_latents(packed, 6, 8), latents)
    torch.testing.assert_close(packed, FluxPipeline._pack_latents(latents, 2, 3, 6, 8))
    torch.testing.assert_close(
        latent_image_ids(6, 8, "cpu", torch.float32),
        FluxPipeline._prepare_latent_image_ids(2, 3, 4, "cpu", torch.float32),
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_default_token_positions_are_the_prompt_words_in_the_family_sequence(family):
    """SDXL / SD3 sequences start with CLIP's start token (words from 1), Flux's T5 sequence has none (from 0)."""
    pipe = composition(family, seeds=(0,))
    components = pipe._text_components()
    positions = family_prompt_token_positions(family, components, ["a cat", "a red circle"], 8)
    tokenizer = components["tokenizer_2" if family == "flux" else "tokenizer"]
    length = 8 if family == "flux" else tokenizer.model_max_length
    ids = tokenizer(["a cat", "a red circle"], max_length=length, padding="max_length", truncation=True).input_ids
    words = [tokenizer.decode([row[i] for i in p]).replace(" ", "") for row, p in zip(ids, positions)]
    # Flux's T5 sequence is truncated at `max_sequence_length` 8 tokens, the end token included
    assert words == ["acat", "aredcircl" if family == "flux" else "aredcircle"], (positions, words)


def _flux_inputs(transformer):
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 1, 8, 8, generator=generator)
    text = torch.randn(2, 5, 32, generator=generator)
    return {
        "hidden_states": pack_latents(latents),
        "encoder_hidden_states": text,
        "pooled_projections": torch.randn(2, 32, generator=generator),
        "timestep": torch.tensor([0.5, 0.5]),
        "guidance": torch.tensor([3.5, 3.5]),
        "txt_ids": torch.zeros(5, 3),
        "img_ids": latent_image_ids(8, 8, "cpu", torch.float32),
    }


def test_flux_recording_leaves_the_output_unchanged_and_records_the_image_to_text_block():
    from diffusers_ext.pipelines.divide_and_denoise.utilities import ConceptAttentionStore, record_cross_attention

    transformer = get_tiny_flux_components(0, guidance_embeds=True)["transformer"]
    kwargs = _flux_inputs(transformer)
    with torch.no_grad():
        expected = transformer(**kwargs).sample
        store = ConceptAttentionStore((8, 8))
        before = {k: type(v) for k, v in transformer.attn_processors.items()}
        with record_cross_attention(transformer, store):
            got = transformer(**kwargs).sample
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert {k: type(v) for k, v in transformer.attn_processors.items()} == before
    assert store.num_layers == 1  # the one double-stream block; the single-stream block is not read
    assert store.maps.shape == (2, 8, 8, 5)
    torch.testing.assert_close(store.maps.sum(dim=-1), torch.ones(2, 8, 8), atol=1e-4, rtol=0)


def test_flux_recording_is_the_renormalised_block_of_the_explicit_joint_softmax(monkeypatch):
    """The recorded maps equal the image -> text block of the full attention (text tokens first in Flux),
    renormalised over the text tokens: here the full softmax is computed explicitly through diffusers' dispatch."""
    import diffusers_ext.pipelines.divide_and_denoise.joint_attention as joint_attention
    from diffusers_ext.pipelines.divide_and_denoise.utilities import ConceptAttentionStore, record_cross_attention

    transformer = get_tiny_flux_components(0)["transformer"]
    kwargs = _flux_inputs(transformer)
    kwargs.pop("guidance")
    full, recorded = [], []
    dispatch = joint_attention.dispatch_attention_fn

    def explicit(query, key, value, **options):  # (B, S, heads, d)
        probs = (query.transpose(1, 2) @ key.transpose(1, 2).transpose(-1, -2) * query.shape[-1] ** -0.5).softmax(-1)
        full.append(probs)
        return dispatch(query, key, value, **options)

    store = ConceptAttentionStore((8, 8))
    monkeypatch.setattr(joint_attention, "dispatch_attention_fn", explicit)
    monkeypatch.setattr(store, "record", lambda probs, batch: recorded.append(probs))
    with torch.no_grad(), record_cross_attention(transformer, store):
        transformer(**kwargs)
    assert len(recorded) == len(full) == 1
    block = full[0][:, :, 5:, :5]  # image queries x text keys
    expected = (block / block.sum(dim=-1, keepdim=True)).mean(dim=1)
    torch.testing.assert_close(recorded[0], expected, atol=1e-6, rtol=1e-5)


def test_sd35_image_only_second_attention_is_not_read_as_cross_attention():
    """SD3.5's blocks have a second, image-only attention named `attn2` with query-key norms; the recording must
    leave it alone (an SD 1.x cross-attention processor there would drop its norms and change the output)."""
    from diffusers import SD3Transformer2DModel

    from diffusers_ext.pipelines.divide_and_denoise.utilities import (
        ConceptAttentionStore,
        record_cross_attention,
        text_attention_layers,
    )

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=48,
        caption_projection_dim=32,
        pooled_projection_dim=40,
        pos_embed_max_size=16,
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    ).eval()
    assert [kind for _, kind in text_attention_layers(transformer)] == ["joint", "joint"]
    generator = torch.Generator().manual_seed(0)
    kwargs = {
        "hidden_states": torch.randn(1, 4, 8, 8, generator=generator),
        "encoder_hidden_states": torch.randn(1, 6, 48, generator=generator),
        "pooled_projections": torch.randn(1, 40, generator=generator),
        "timestep": torch.tensor([500.0]),
    }
    with torch.no_grad():
        expected = transformer(**kwargs).sample
        with record_cross_attention(transformer, ConceptAttentionStore((8, 8))) as store:
            got = transformer(**kwargs).sample
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert store.num_layers == 2


# ---------------------------------------------------------------------------------------------------------------------
# checks before any model work
# ---------------------------------------------------------------------------------------------------------------------


def test_family_specific_inputs_are_checked_before_any_model_work():
    flux, sdxl, sd3 = composition("flux", seeds=(0,)), composition("sdxl", seeds=(0,)), composition("sd3", seeds=(0,))
    base = {"prompt": ["a", "b"], "num_inference_steps": 2}
    with pytest.raises(ValueError, match="Flux denoisers take no negative prompt"):
        flux(negative_prompt="blurry", **base, **CALL["flux"])
    with pytest.raises(ValueError, match="guidance_delta.*Flux"):
        flux(utility="guidance_delta", **base, **CALL["flux"])
    with pytest.raises(ValueError, match="`max_sequence_length` 8 applies only to SD3 and Flux"):
        sdxl(max_sequence_length=8, **base)
    with pytest.raises(ValueError, match="`max_sequence_length` must be at most 512"):
        sd3(max_sequence_length=600, **base)
    embeds, _, pooled, _ = sdxl.encode_prompt(["a", "b"])
    with pytest.raises(ValueError, match="`pooled_prompt_embeds`"):
        sdxl(prompt_embeds=embeds, token_indices=[[1], [1]], num_inference_steps=2)
    with pytest.raises(ValueError, match=r"takes 64 added-embedding inputs.*pooled embeddings of width 5"):
        sdxl(prompt_embeds=embeds, pooled_prompt_embeds=pooled[:, :5], token_indices=[[1], [1]], num_inference_steps=2)
    without_encoders = DivideAndDenoisePipeline(sd3.denoisers, sd3.scheduler, vae=sd3.vae)
    with pytest.raises(ValueError, match=r"`prompt` needs the SD3 text components.*are None"):
        without_encoders(**base)
    with pytest.raises(ValueError, match="mix model families"):
        DivideAndDenoisePipeline.from_pipelines([family_pipeline("sdxl"), family_pipeline("sd3")])


def test_sdxl_embeddings_from_encode_prompt_give_the_prompts_image():
    pipe = composition("sdxl")
    kwargs = {"num_inference_steps": 2, "output_type": "latent", "token_indices": [[1], [1]], **CALL["sdxl"]}
    expected = pipe(prompt=["a red circle", "a blue square"], generator=torch.Generator().manual_seed(0), **kwargs)
    embeds, negative, pooled, negative_pooled = pipe.encode_prompt(["a red circle", "a blue square"])
    got = pipe(
        prompt_embeds=embeds,
        negative_prompt_embeds=negative[:1],
        pooled_prompt_embeds=pooled,
        negative_pooled_prompt_embeds=negative_pooled[:1],
        generator=torch.Generator().manual_seed(0),
        **kwargs,
    )
    torch.testing.assert_close(got.images, expected.images)


def test_a_unet_with_other_added_conditioning_is_refused():
    """Only SDXL's added conditioning (`"text_time"`) is fed; e.g. Kandinsky's image embeddings are not."""
    from diffusers_ext import MultiDenoiserModel

    unet = get_tiny_sdxl_components(0)["unet"]
    unet.register_to_config(addition_embed_type="image")  # the config is what the check reads
    with pytest.raises(ValueError, match=r"`denoisers\[0\]` is a UNet with `addition_embed_type='image'`"):
        MultiDenoiserModel([unet])


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_a_store_of_a_few_tokens_records_those_columns_of_the_joint_maps(family):
    """Recording only the concept tokens (what the pipeline does) gives those columns of the full maps, still
    normalised over every text token."""
    from diffusers_ext.pipelines.divide_and_denoise.utilities import ConceptAttentionStore, record_cross_attention

    if family == "flux":
        transformer = get_tiny_flux_components(0, guidance_embeds=True)["transformer"]
        kwargs, size = _flux_inputs(transformer), (8, 8)
    else:
        transformer = get_tiny_sd3_components(0)["transformer"]
        generator = torch.Generator().manual_seed(0)
        kwargs = {
            "hidden_states": torch.randn(2, 4, 16, 16, generator=generator),
            "encoder_hidden_states": torch.randn(2, 5, 48, generator=generator),
            "pooled_projections": torch.randn(2, 40, generator=generator),
            "timestep": torch.tensor([500.0, 500.0]),
        }
        size = (16, 16)
    with torch.no_grad():
        with record_cross_attention(transformer, ConceptAttentionStore(size)) as full:
            transformer(**kwargs)
        with record_cross_attention(transformer, ConceptAttentionStore(size, tokens=[3, 1])) as few:
            transformer(**kwargs)
    torch.testing.assert_close(few.maps, full.maps[..., [3, 1]], atol=1e-6, rtol=1e-5)
