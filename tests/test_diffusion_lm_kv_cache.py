"""`DiffusionLMPipeline(cache="prefix" | "dual")`: Fast-dLLM's block-wise key/value caches.

The caches are approximate for bidirectional models, so they are checked two ways:

- against Fast-dLLM itself (`tests/parity/test_llada_dream_reference_parity.py`: token-exact, NFE equal);
- here, on *causal* models, where both caches are exact (a position never attends to later ones, so the cached
  prefix is final and the stale suffix is never read): every decoder of the `SOARScheduler` presets, beams, padded
  batches whose rows sit in different blocks, shifted (Dream-style) and block-causal (LLaDA2-style) models must give
  the tokens of the uncached decode. A wrong window, position, alignment or beam reordering breaks that equality.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from diffusers_ext import DiffusionLMPipeline, DreamAdapter, HFLogitsAdapter, LLaDAAdapter, SOARScheduler
from diffusers_ext.pipelines.diffusion_lm.kv_cache import BlockWindowLayer, model_cache_keyword


MASK = 63
PRESETS = ["llada", "fast-dllm", "soar-llada", "pbs", "dream", "soar-dream"]


def _causal_lm(shift: bool, seed: int = 0):
    """A causal transformers decoder (Qwen2 when `shift`, read Dream-style; Llama otherwise), its head sharpened
    so that thresholds are crossed, and the mask token never predicted."""
    config_class, model_class = (Qwen2Config, Qwen2ForCausalLM) if shift else (LlamaConfig, LlamaForCausalLM)
    config = config_class(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
    )
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
        model.lm_head.weight[MASK].zero_()
    return model


def _decode(model, preset, adapter, cache, input_ids, attention_mask=None, **kwargs):
    scheduler = SOARScheduler.from_preset(preset, block_length=4)
    pipe = DiffusionLMPipeline(model, scheduler, adapter=adapter)
    pipe.set_progress_bar_config(disable=True)
    call = {"gen_length": 12, "block_length": 4, "num_inference_steps": 12, **kwargs}
    return pipe(
        input_ids=input_ids,
        attention_mask=attention_mask,
        mask_token_id=MASK,
        eos_early_stop=False,
        output_type="seq",
        cache=cache,
        **call,
    )


def _prompts():
    ids = torch.randint(2, 60, (3, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding: rows of different lengths
    mask[2, :4] = 0
    return ids.masked_fill(mask == 0, 0), mask


ADAPTERS = {
    "hf": (False, lambda: HFLogitsAdapter()),
    "hf-shifted": (True, lambda: HFLogitsAdapter(shift_logits=True)),
    "dream": (True, lambda: DreamAdapter()),  # 4-D masks and position ids in padded batches
    "llada": (False, lambda: LLaDAAdapter()),  # positions count the padding
}


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("preset", PRESETS)
def test_on_a_causal_model_the_cache_is_exact_for_every_preset(preset, cache, adapter):
    shift, make_adapter = ADAPTERS[adapter]
    model = _causal_lm(shift)
    adapter = make_adapter()
    ids, mask = _prompts()
    if isinstance(adapter, DreamAdapter):
        # Dream's padded batches get a 4-D mask that makes every model bidirectional among real tokens, where the
        # cache is no longer exact: unpadded prompts here (the padded path is checked below, on the native model)
        ids, mask = ids[1:2], mask[1:2]
    uncached = _decode(model, preset, adapter, None, ids, mask)
    cached = _decode(model, preset, adapter, cache, ids, mask)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert torch.equal(cached.nfe, uncached.nfe)
    assert torch.equal(cached.row_forwards, uncached.row_forwards)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_block_causal_models_get_the_uncached_tokens(cache):
    # LLaDA2-style: blocks aligned to absolute positions, the model runs up to the current block's end
    model = _causal_lm(shift=False, seed=2)
    ids = torch.randint(2, 60, (1, 6), generator=torch.Generator().manual_seed(4))
    kwargs = {"gen_length": 10, "num_inference_steps": 12}
    uncached = _decode(model, "fast-dllm", "llada2", None, ids, **kwargs)
    cached = _decode(model, "fast-dllm", "llada2", cache, ids, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)


def test_the_window_forwards_run_the_block_and_what_the_cache_does_not_hold():
    model = _causal_lm(shift=False)
    shapes = {"prefix": [], "dual": []}
    ids = torch.randint(2, 60, (1, 6), generator=torch.Generator().manual_seed(5))
    for cache, seen in shapes.items():
        handle = model.register_forward_pre_hook(
            lambda module, args, kwargs, seen=seen: (
                seen.append(tuple((args[0] if args else kwargs["input_ids"]).shape)) or None
            ),
            with_kwargs=True,
        )
        try:
            _decode(model, "llada", LLaDAAdapter(), cache, ids, num_inference_steps=12)
        finally:
            handle.remove()
    # 3 blocks of 4 tokens, 4 steps each: the first step of a block runs all 18 positions, the others the window
    assert shapes["prefix"] == [(1, 18), (1, 12), (1, 12), (1, 12), (1, 18), (1, 8), (1, 8), (1, 8)] + [
        (1, 18),
        (1, 4),
        (1, 4),
        (1, 4),
    ]
    assert shapes["dual"] == [(1, 18), (1, 4), (1, 4), (1, 4)] * 3


def test_on_a_bidirectional_model_the_cache_changes_the_result():
    # the cache is an approximation there: a check that could not tell the caches from the uncached decode would be
    # worthless; the reference parity pins which tokens are right
    from diffusers_ext.models.tiny_components import get_tiny_llada_like_lm

    model, tokenizer = get_tiny_llada_like_lm(seed=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    pipe = DiffusionLMPipeline(model, SOARScheduler.from_preset("llada", block_length=4), tokenizer)
    pipe.set_progress_bar_config(disable=True)
    outs = {
        cache: pipe(
            prompt="abc", gen_length=16, num_inference_steps=16, eos_early_stop=False, output_type="seq", cache=cache
        )
        for cache in (None, "prefix", "dual")
    }
    assert not torch.equal(outs["prefix"].sequences, outs[None].sequences)
    assert not torch.equal(outs["dual"].sequences, outs[None].sequences)
    assert outs["prefix"].nfe.tolist() == outs[None].nfe.tolist() == [16]


@pytest.mark.parametrize(
    "name, adapter",
    # the "hf" adapter gives LLaDA position ids that count real tokens; Dream's its 4-D mask and position ids
    [("llada-8b", "hf"), ("dream-7b", "dream")],
)
def test_native_classes_with_a_cache_decode_a_padded_batch_as_each_prompt_alone(name, adapter):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "parity"))
    from diffusion_lm_parity_models import build_native

    model = build_native(name, seed=0, head_scale=6.0)
    ids, mask = _prompts()
    ids = ids.clamp(max=120)
    scheduler = SOARScheduler.from_preset("fast-dllm", block_length=4, confidence_threshold=0.5)
    pipe = DiffusionLMPipeline(model, scheduler, adapter=adapter)
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"gen_length": 12, "num_inference_steps": 12, "mask_token_id": 127, "eos_early_stop": False}
    for cache in ("prefix", "dual"):
        batch = pipe(input_ids=ids, attention_mask=mask, output_type="seq", cache=cache, **kwargs)
        for i in range(3):
            real = mask[i].bool()
            alone = pipe(input_ids=ids[i : i + 1, real], output_type="seq", cache=cache, **kwargs)
            assert torch.equal(batch.sequences[i], alone.sequences[0]), (cache, i)
            assert batch.nfe[i] == alone.nfe[0]


def test_the_cache_layer_splices_the_window_between_the_cached_keys():
    before = (torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    after = (torch.full((1, 2, 2, 4), 2.0), torch.full((1, 2, 2, 4), 2.0))
    layer = BlockWindowLayer(before=before, after=after)
    window = torch.ones(1, 2, 4, 4)
    keys, values = layer.update(window, window)
    assert keys.shape == (1, 2, 9, 4) and keys[0, 0, :, 0].tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert layer.get_seq_length() == 3 and layer.get_mask_sizes(4) == (9, 0)
    recorder = BlockWindowLayer()
    recorder.update(window, window)
    assert recorder.keys is window and recorder.get_seq_length() == 0


# ---------------------------------------------------------------------------------------------------------------------
# bad input: a clear error before any model call
# ---------------------------------------------------------------------------------------------------------------------


def _counting_pipe(model, adapter=None):
    pipe = DiffusionLMPipeline(model, SOARScheduler(block_length=4), adapter=adapter)
    pipe.set_progress_bar_config(disable=True)
    calls = []
    pipe.model.register_forward_pre_hook(lambda *args: calls.append(1))
    return pipe, calls


def test_an_unknown_cache_mode_is_refused_by_name():
    pipe, calls = _counting_pipe(_causal_lm(shift=False))
    with pytest.raises(ValueError, match="`cache` must be None or one of") as error:
        pipe(input_ids=torch.ones(1, 3, dtype=torch.long), gen_length=8, mask_token_id=MASK, cache="full")
    assert "'full'" in str(error.value) and not calls


def test_a_model_that_cannot_take_a_cache_is_refused():
    class NoCache(torch.nn.Module):
        config = None

        def forward(self, input_ids, attention_mask=None):
            raise AssertionError("never called")

    assert model_cache_keyword(NoCache()) is None
    pipe, calls = _counting_pipe(NoCache(), adapter="llada")
    with pytest.raises(ValueError, match="cache='prefix'.*NoCache takes none"):
        pipe(input_ids=torch.ones(1, 3, dtype=torch.long), gen_length=8, mask_token_id=MASK, cache="prefix")
    assert not calls


def test_guidance_and_an_adapter_without_model_keywords_are_refused():
    from diffusers_ext import DiffusionLMAdapter

    class Plain(DiffusionLMAdapter):
        def forward_logits(self, model, input_ids, attention_mask, block_end):
            return model(input_ids).logits

    pipe, calls = _counting_pipe(_causal_lm(shift=False))
    with pytest.raises(ValueError, match="guidance_scale"):
        pipe(
            input_ids=torch.ones(1, 3, dtype=torch.long),
            gen_length=8,
            mask_token_id=MASK,
            cache="dual",
            guidance_scale=2.0,
        )
    pipe.adapter = Plain()
    with pytest.raises(ValueError, match="Plain"):
        pipe(input_ids=torch.ones(1, 3, dtype=torch.long), gen_length=8, mask_token_id=MASK, cache="dual")
    assert not calls


def test_native_classes_refuse_a_prompt_past_their_positions_and_a_block_that_does_not_divide():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "parity"))
    from diffusion_lm_parity_models import build_native

    for name in ("llada-8b", "dream-7b"):
        pipe, calls = _counting_pipe(build_native(name))  # 256 positions
        prompt = torch.ones(1, 10, dtype=torch.long)
        with pytest.raises(ValueError, match=r"need 266 positions, but the model has 256"):
            pipe(
                input_ids=prompt,
                gen_length=256,
                block_length=8,
                num_inference_steps=256,
                mask_token_id=127,
                cache="dual",
            )
        with pytest.raises(ValueError, match="`gen_length` 30 must be divisible by `block_length` 8"):
            pipe(
                input_ids=prompt,
                gen_length=30,
                block_length=8,
                num_inference_steps=30,
                mask_token_id=127,
                cache="prefix",
            )
        assert not calls


@pytest.mark.parametrize("name", ["bidirectional-llama", "llada-8b", "dream-7b"])
def test_a_window_over_keys_of_the_same_sequence_gives_the_full_forwards_logits(name):
    # the cache is approximate only because the sequence changes between steps: with the keys and values of the
    # very sequence it runs on, a window forward (attending to every key, bidirectionally) is the full forward
    import sys
    from pathlib import Path

    from transformers.cache_utils import Cache

    from diffusers_ext.models.tiny_components import get_tiny_llada_like_lm

    sys.path.insert(0, str(Path(__file__).parent / "parity"))
    from diffusion_lm_parity_models import build_native

    model = get_tiny_llada_like_lm(seed=0)[0] if name == "bidirectional-llama" else build_native(name)
    keyword = model_cache_keyword(model)
    ids = torch.randint(5, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    recorder = Cache(layer_class_to_replicate=BlockWindowLayer)
    with torch.no_grad():
        full = model(ids, **{keyword: recorder}, use_cache=True).logits
        for first, last, dual in [(4, 12, False), (4, 8, True)]:
            layers = [
                BlockWindowLayer(
                    before=(layer.keys[:, :, :first], layer.values[:, :, :first]),
                    after=(layer.keys[:, :, last:], layer.values[:, :, last:]) if dual else None,
                )
                for layer in recorder.layers
            ]
            window = model(
                ids[:, first:last],
                **{keyword: Cache(layers=layers)},
                use_cache=True,
                position_ids=torch.arange(first, last).unsqueeze(0),
            ).logits
            torch.testing.assert_close(window, full[:, first:last], rtol=0, atol=1e-5)
