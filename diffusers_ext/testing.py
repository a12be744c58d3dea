"""Test kit for diffusers_ext: tiny seeded components, a dummy-pipeline registry and pytest conformance suites.

Three parts, all importable as ``from diffusers_ext.testing import ...`` (this module is not part of the lazy
top-level API and does not import pytest at import time):

1. **Tiny components built from configs** (no hub access, seeded, a forward takes milliseconds):
   [`get_tiny_sd_components`], [`get_tiny_sd3_components`], [`get_tiny_pixel_unet`], the bidirectional stand-ins
   for diffusion LMs [`get_tiny_llada_like_lm`] and [`get_tiny_dream_like_lm`], and the locally built tokenizers
   they use ([`get_tiny_clip_tokenizer`], [`get_tiny_t5_tokenizer`], [`get_tiny_lm_tokenizer`]).
2. **A registry of dummy pipeline setups**: every pipeline class of ours registers how to build tiny components and
   call arguments with [`register_dummy_pipeline`]; [`get_dummy_components`], [`get_dummy_inputs`] and
   [`get_dummy_batch_inputs`] read it. By convention a method registers its pipeline in
   ``diffusers_ext/pipelines/<method>/dummies.py``; those modules are imported on the first registry miss, so the
   lookup also works in a fresh interpreter.
3. **Conformance suites**: [`PipelineConformanceTests`] and [`SchedulerConformanceTests`] are mixins for pytest
   test classes. A method issue adds one registration and one test class:

```py
# diffusers_ext/pipelines/my_method/dummies.py
register_dummy_pipeline(MyPipeline, components_fn, inputs_fn, batch_params=("prompt",), bad_inputs=[...])

# tests/test_pipeline_my_method.py
class TestMyPipeline(PipelineConformanceTests):
    pipeline_class = MyPipeline
```
"""

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import pkgutil
import string
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import PIL.Image
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DiffusionPipeline,
    FlowMatchEulerDiscreteScheduler,
    SD3Transformer2DModel,
    UNet2DConditionModel,
    UNet2DModel,
)
from diffusers.utils import BaseOutput
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5EncoderModel,
    T5TokenizerFast,
)


__all__ = [
    "BadInput",
    "DummyPipelineSpec",
    "PipelineConformanceTests",
    "SchedulerConformanceTests",
    "count_module_forwards",
    "get_dummy_batch_inputs",
    "get_dummy_components",
    "get_dummy_inputs",
    "get_dummy_spec",
    "get_tiny_clip_tokenizer",
    "get_tiny_dream_like_lm",
    "get_tiny_llada_like_lm",
    "get_tiny_lm_tokenizer",
    "get_tiny_pixel_unet",
    "get_tiny_sd3_components",
    "get_tiny_sd_components",
    "get_tiny_t5_tokenizer",
    "output_to_numpy",
    "register_dummy_pipeline",
    "registered_pipelines",
]


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch's CPU generator for the block and restore the caller's generator state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizers, built in code
# ---------------------------------------------------------------------------------------------------------------------

# Whole-word pieces of the tiny T5 vocabulary; every other word falls back to single characters.
_T5_WORDS = (
    "a an the of and in on with at to is are photo picture painting image cat dog bird car house tree red green "
    "blue white black small large sitting standing"
).split()


def _byte_alphabet() -> list[str]:
    """The 256 characters byte-level BPE uses to spell bytes, sorted by code point."""
    return sorted(pre_tokenizers.ByteLevel.alphabet())


def get_tiny_clip_tokenizer(model_max_length: int = 77) -> CLIPTokenizer:
    """Build a byte-level CLIP tokenizer in code: every byte, alone and word-final (`"x</w>"`), and no merges.

    It tokenizes any text (one token per byte, lowercased like CLIP), pads with `<|endoftext|>` and has 514 tokens:
    ids 0-511 are the bytes, 512 is `<|startoftext|>`, 513 is `<|endoftext|>`.

    Args:
        model_max_length (`int`, defaults to 77): the padded prompt length that diffusers pipelines use.
    """
    alphabet = _byte_alphabet()
    vocab = {char: i for i, char in enumerate(alphabet)}
    vocab.update({char + "</w>": len(alphabet) + i for i, char in enumerate(alphabet)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=model_max_length)


def get_tiny_t5_tokenizer(model_max_length: int = 256) -> T5TokenizerFast:
    """Build a T5-style Unigram tokenizer in code: a few dozen whole words plus every printable ASCII character.

    Case is kept and any ASCII text round-trips (`decode(encode(text), skip_special_tokens=True) == text` up to
    whitespace normalisation); other characters map to `<unk>`. Ids: `<pad>` 0, `</s>` 1, `<unk>` 2.

    Args:
        model_max_length (`int`, defaults to 256): the default maximum length.
    """
    pieces: dict[str, float] = {"<pad>": 0.0, "</s>": 0.0, "<unk>": 0.0, "\u2581": -2.0}
    for word in _T5_WORDS:
        pieces.setdefault("\u2581" + word, -3.0)
    for char in string.printable:
        if not char.isspace():
            pieces.setdefault(char, -5.0)
            pieces.setdefault("\u2581" + char, -5.5)
    return T5TokenizerFast(vocab=list(pieces.items()), extra_ids=0, model_max_length=model_max_length)


_LM_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def get_tiny_lm_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """Build the byte-level tokenizer of the tiny diffusion-LM stand-ins: one token per byte, no merges.

    Any text round-trips exactly. Special tokens come first: `<|pad|>` 0, `<|bos|>` 1, `<|eos|>` 2, `<|mask|>` 3,
    `<|im_start|>` 4, `<|im_end|>` 5, then the 256 bytes (262 tokens). Padding is on the left, as batched prompts
    for generation want. The chat template renders
    `<|bos|><|im_start|>user\\n{content}<|im_end|>\\n...<|im_start|>assistant\\n`.

    Args:
        model_max_length (`int`, defaults to 512): the default maximum length.
    """
    specials = ["<|pad|>", "<|bos|>", "<|eos|>", "<|mask|>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials + _byte_alphabet())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        mask_token="<|mask|>",
        extra_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=_LM_CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="left",
    )


# ---------------------------------------------------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------------------------------------------------


def _tiny_clip_text_config(tokenizer: CLIPTokenizer, hidden_size: int, projection_dim: int) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        projection_dim=projection_dim,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def get_tiny_sd_components(seed: int = 0) -> dict[str, Any]:
    """Tiny Stable Diffusion 1.x-style components, usable as `StableDiffusionPipeline(**components)`.

    A [`UNet2DConditionModel`] (4 latent channels, blocks of 8 and 16 channels, cross-attention dim 32), an
    [`AutoencoderKL`] with one downsampling (`vae_scale_factor` 2), a 2-layer `CLIPTextModel` (hidden size 32) with
    [`get_tiny_clip_tokenizer`], the SD `DDIMScheduler` config, and no safety checker. The default image is 32x32
    (latents `(batch, 4, 16, 16)`); prompt embeddings are `(batch, 77, 32)`. Models are in eval mode.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.
    """
    with _seeded(seed):
        unet = UNet2DConditionModel(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            layers_per_block=1,
            block_out_channels=(8, 16),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=32,
            attention_head_dim=2,
            norm_num_groups=4,
        )
        vae = AutoencoderKL(
            sample_size=32,
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            block_out_channels=(4, 8),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=2,
        )
        tokenizer = get_tiny_clip_tokenizer()
        text_encoder = CLIPTextModel(_tiny_clip_text_config(tokenizer, hidden_size=32, projection_dim=32))
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return {
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "unet": unet.eval(),
        "scheduler": scheduler,
        "safety_checker": None,
        "feature_extractor": None,
        "image_encoder": None,
        "requires_safety_checker": False,
    }


def get_tiny_sd3_components(seed: int = 0) -> dict[str, Any]:
    """Tiny Stable Diffusion 3-style components, usable as `StableDiffusion3Pipeline(**components)`.

    Shaped like SD3 in miniature: an [`SD3Transformer2DModel`] (patch size 2, one joint block, inner dim 32), an
    [`AutoencoderKL`] with 4 latent channels and one downsampling (`vae_scale_factor` 2, SD3's shift and scaling
    factors), two `CLIPTextModelWithProjection` of different widths (16 and 24, pooled projections concatenated to
    40 = `pooled_projection_dim`), a `T5EncoderModel` of width 48 (= `joint_attention_dim`; the CLIP embeddings,
    40 wide, are zero-padded to it as in SD3), the locally built CLIP and T5 tokenizers, and a
    `FlowMatchEulerDiscreteScheduler` with `shift=3.0`. The default image is 32x32 (latents `(batch, 4, 16, 16)`,
    64 image tokens). Models are in eval mode.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.
    """
    with _seeded(seed):
        transformer = SD3Transformer2DModel(
            sample_size=16,
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=4,
            joint_attention_dim=48,
            caption_projection_dim=32,
            pooled_projection_dim=40,
            pos_embed_max_size=32,
        )
        vae = AutoencoderKL(
            sample_size=32,
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            block_out_channels=(4, 8),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=2,
            use_quant_conv=False,
            use_post_quant_conv=False,
            shift_factor=0.0609,
            scaling_factor=1.5305,
        )
        tokenizer = get_tiny_clip_tokenizer()
        tokenizer_2 = get_tiny_clip_tokenizer()
        text_encoder = CLIPTextModelWithProjection(
            _tiny_clip_text_config(tokenizer, hidden_size=16, projection_dim=16)
        )
        text_encoder_2 = CLIPTextModelWithProjection(
            _tiny_clip_text_config(tokenizer_2, hidden_size=24, projection_dim=24)
        )
        tokenizer_3 = get_tiny_t5_tokenizer()
        text_encoder_3 = T5EncoderModel(
            T5Config(
                vocab_size=len(tokenizer_3),
                d_model=48,
                d_kv=12,
                d_ff=96,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                relative_attention_max_distance=32,
                feed_forward_proj="gated-gelu",
                dropout_rate=0.0,
                pad_token_id=tokenizer_3.pad_token_id,
                eos_token_id=tokenizer_3.eos_token_id,
                decoder_start_token_id=tokenizer_3.pad_token_id,
            )
        )
    return {
        "transformer": transformer.eval(),
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "text_encoder_2": text_encoder_2.eval(),
        "tokenizer_2": tokenizer_2,
        "text_encoder_3": text_encoder_3.eval(),
        "tokenizer_3": tokenizer_3,
        "image_encoder": None,
        "feature_extractor": None,
    }


def get_tiny_pixel_unet(
    seed: int = 0, sample_size: int = 8, in_channels: int = 1, num_class_embeds: int | None = None
) -> UNet2DModel:
    """A tiny pixel-space [`UNet2DModel`]: two levels (8 and 16 channels, attention at the lower one).

    It maps `(batch, in_channels, sample_size, sample_size)` to the same shape; with `num_class_embeds` it takes
    `class_labels` of shape `(batch,)` with values in `[0, num_class_embeds)`. The model is in eval mode.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.
        sample_size (`int`, defaults to 8): image side; must be even (one downsampling).
        in_channels (`int`, defaults to 1): image channels (also the output channels).
        num_class_embeds (`int`, *optional*): size of the class embedding table (include the null class).
    """
    if sample_size < 2 or sample_size % 2:
        raise ValueError(f"`sample_size` must be an even int >= 2, got {sample_size!r}.")
    with _seeded(seed):
        unet = UNet2DModel(
            sample_size=sample_size,
            in_channels=in_channels,
            out_channels=in_channels,
            layers_per_block=1,
            block_out_channels=(8, 16),
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=8,
            norm_num_groups=4,
            num_class_embeds=num_class_embeds,
        )
    return unet.eval()


def _tiny_bidirectional_lm(config_class, model_class, seed: int, shift_logits: bool, num_key_value_heads: int):
    tokenizer = get_tiny_lm_tokenizer()
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=tokenizer.model_max_length,
        tie_word_embeddings=False,
        use_cache=False,
        is_causal=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id,
        shift_logits=shift_logits,
    )
    with _seeded(seed):
        model = model_class(config)
    return model.eval(), tokenizer


def get_tiny_llada_like_lm(seed: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A tiny masked-diffusion LM stand-in in the LLaDA convention: a Llama decoder with causal masking disabled.

    Convention (recorded in `model.config`): `is_causal=False` (every position attends to every other, padding
    excepted), `shift_logits=False` (the logits at position `i` predict token `i`: a masked position is read out
    where it stands), and `mask_token_id` is the tokenizer's `<|mask|>`. `use_cache=False`.

    `model(input_ids, attention_mask=None).logits` maps `input_ids` of shape `(batch, seq)` to logits of shape
    `(batch, seq, vocab_size)`, `vocab_size == len(tokenizer)` (262). 2 layers, hidden size 32, 4 heads.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.

    Returns:
        `tuple`: `(model, tokenizer)`, the model in eval mode and [`get_tiny_lm_tokenizer`]'s tokenizer.
    """
    return _tiny_bidirectional_lm(LlamaConfig, LlamaForCausalLM, seed, shift_logits=False, num_key_value_heads=4)


def get_tiny_dream_like_lm(seed: int = 0) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """A tiny masked-diffusion LM stand-in in the Dream convention: a Qwen2 decoder with causal masking disabled.

    Convention (recorded in `model.config`): `is_causal=False` (full bidirectional attention, padding excepted),
    `shift_logits=True` (the logits at position `i` predict token `i + 1`, as in Dream, which keeps the
    autoregressive head it was initialised from: read the prediction for position `j` at `j - 1`), and
    `mask_token_id` is the tokenizer's `<|mask|>`. `use_cache=False`.

    `model(input_ids, attention_mask=None).logits` maps `input_ids` of shape `(batch, seq)` to logits of shape
    `(batch, seq, vocab_size)`, `vocab_size == len(tokenizer)` (262). 2 layers, hidden size 32, 4 query and 2
    key/value heads.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.

    Returns:
        `tuple`: `(model, tokenizer)`, the model in eval mode and [`get_tiny_lm_tokenizer`]'s tokenizer.
    """
    return _tiny_bidirectional_lm(Qwen2Config, Qwen2ForCausalLM, seed, shift_logits=True, num_key_value_heads=2)


# ---------------------------------------------------------------------------------------------------------------------
# Registry of dummy pipeline setups
# ---------------------------------------------------------------------------------------------------------------------

# Where a method registers its pipeline: a module of this name inside its pipeline package.
DUMMIES_MODULE_NAME = "dummies"

IMAGE_OUTPUT_TYPES = ("pil", "np", "pt", "latent")
# Text pipelines return token ids (`"seq"`, compared like arrays) and optionally decoded strings (`"text"`).
TEXT_OUTPUT_TYPES = ("seq", "text")


class BadInput(NamedTuple):
    """A bad call for [`PipelineConformanceTests`]: `overrides` replace dummy inputs, and the pipeline must raise a
    `ValueError` or `TypeError` whose message contains `argument`, before any model forward."""

    overrides: dict[str, Any]
    argument: str


@dataclass(frozen=True)
class DummyPipelineSpec:
    """How to build a tiny working setup of one pipeline class; made by [`register_dummy_pipeline`].

    Attributes:
        pipeline_class (`type`): the registered `DiffusionPipeline` subclass.
        components_fn (`Callable[[int], dict]`): `components_fn(seed)` gives the constructor's keyword arguments.
        inputs_fn (`Callable[[int], dict]`): `inputs_fn(seed)` gives one call's keyword arguments (one image).
        batch_params (`tuple[str, ...]`): per-image arguments, concatenated to make a batch.
        output_types (`tuple[str, ...]`): supported `output_type` values: image types among `"pil"`, `"np"`, `"pt"`,
            `"latent"`, or token types among `"seq"`, `"text"` (a text pipeline); never both kinds.
        bad_inputs (`tuple[BadInput, ...]`): bad calls and the argument each error message must name.
        callback_edit_tensor (`str`): the callback tensor whose replacement must change the output.
        batch_size_param (`str`, *optional*): an int argument that sets the number of images (e.g.
            `num_images_per_prompt`), for pipelines whose per-image arguments are not lists; 1 in single inputs.
        module (`str`): the module that registered the entry; a fresh interpreter imports it before lookups.
    """

    pipeline_class: type[DiffusionPipeline]
    components_fn: Callable[[int], dict[str, Any]]
    inputs_fn: Callable[[int], dict[str, Any]]
    batch_params: tuple[str, ...] = ()
    output_types: tuple[str, ...] = ("pil", "np", "pt", "latent")
    bad_inputs: tuple[BadInput, ...] = ()
    callback_edit_tensor: str = "latents"
    batch_size_param: str | None = None
    module: str = ""

    @property
    def is_text(self) -> bool:
        """Whether the pipeline generates token sequences (its output types are `"seq"`/`"text"`)."""
        return set(self.output_types) <= set(TEXT_OUTPUT_TYPES)

    @property
    def comparison_output_type(self) -> str:
        """The `output_type` of the dummy inputs: `"np"` for image pipelines, `"seq"` for text pipelines."""
        return "seq" if self.is_text else "np"


_REGISTRY: dict[type, DummyPipelineSpec] = {}
_discovered = False


def register_dummy_pipeline(
    pipeline_class: type[DiffusionPipeline],
    components_fn: Callable[[int], dict[str, Any]],
    inputs_fn: Callable[[int], dict[str, Any]],
    *,
    batch_params: Sequence[str] = (),
    output_types: Sequence[str] = ("pil", "np", "pt", "latent"),
    bad_inputs: Sequence[BadInput | tuple[dict[str, Any], str]] = (),
    callback_edit_tensor: str = "latents",
    batch_size_param: str | None = None,
) -> DummyPipelineSpec:
    """Register how to build a tiny, fast setup of `pipeline_class` for tests and the conformance suite.

    Call it at import time of the method's ``diffusers_ext/pipelines/<method>/dummies.py`` (imported automatically on
    the first lookup of an unregistered class, in this process or a fresh one). Registering a class again replaces
    its entry.

    Args:
        pipeline_class (`type`): a `DiffusionPipeline` subclass.
        components_fn (`Callable[[int], dict]`): `components_fn(seed)` returns the keyword arguments of
            `pipeline_class(...)`, with weights seeded by `seed`.
        inputs_fn (`Callable[[int], dict]`): `inputs_fn(seed)` returns the keyword arguments of one call making ONE
            image (or sample), with `generator=torch.Generator("cpu").manual_seed(seed)`, `output_type="np"` (a text
            pipeline: `output_type="seq"`, whose first output is the token ids) and a small `num_inference_steps`.
        batch_params (`Sequence[str]`, defaults to `()`): the per-image arguments. A batch of two is made from the
            inputs for two seeds: these arguments are concatenated (tensors along dim 0, lists joined, other values
            listed), `generator` becomes the list of both generators, and every other argument must be equal.
        output_types (`Sequence[str]`, defaults to all four image types): the `output_type` values the pipeline
            supports: among `"pil"`, `"np"`, `"pt"` and `"latent"` for an image pipeline, or among `"seq"` (token
            ids first) and `"text"` (token ids and decoded strings) for a text pipeline, which must support `"seq"`.
        bad_inputs (`Sequence[BadInput]`): bad calls, each an `(overrides, argument)` pair: the pipeline must raise a
            `ValueError`/`TypeError` naming `argument` before any model forward.
        callback_edit_tensor (`str`, defaults to `"latents"`): a name in `_callback_tensor_inputs` that a
            `callback_on_step_end` may replace; replacing it with zeros at the last step must change the output.
        batch_size_param (`str`, *optional*): for pipelines whose batch is a count rather than a list of per-image
            arguments (every image composes the same prompts, say): the int argument giving the number of images,
            e.g. `"num_images_per_prompt"`. Single inputs must set it to 1; a batch of `n` seeds sets it to `n`.

    Returns:
        [`DummyPipelineSpec`]: the registered entry.
    """
    if not (isinstance(pipeline_class, type) and issubclass(pipeline_class, DiffusionPipeline)):
        raise TypeError(f"`pipeline_class` must be a DiffusionPipeline subclass, got {pipeline_class!r}.")
    for name, fn in (("components_fn", components_fn), ("inputs_fn", inputs_fn)):
        if not callable(fn):
            raise TypeError(f"`{name}` must be callable as {name}(seed), got {fn!r}.")
    if isinstance(batch_params, str) or not all(isinstance(p, str) for p in batch_params):
        raise TypeError(f"`batch_params` must be a sequence of argument names, got {batch_params!r}.")
    unknown = set(output_types) - set(IMAGE_OUTPUT_TYPES) - set(TEXT_OUTPUT_TYPES)
    if unknown:
        raise ValueError(
            f"`output_types` must be among {IMAGE_OUTPUT_TYPES} or {TEXT_OUTPUT_TYPES}; got unknown {sorted(unknown)}."
        )
    if not output_types:
        raise ValueError("`output_types` must not be empty.")
    if set(output_types) & set(TEXT_OUTPUT_TYPES):
        if set(output_types) & set(IMAGE_OUTPUT_TYPES):
            raise ValueError(f"`output_types` mixes image and text types: {sorted(output_types)}.")
        if "seq" not in output_types:
            raise ValueError("a text pipeline's `output_types` must include 'seq' (token ids, compared as arrays).")
    checked_bad_inputs = []
    for entry in bad_inputs:
        if not (
            isinstance(entry, (tuple, list))
            and len(entry) == 2
            and isinstance(entry[0], dict)
            and isinstance(entry[1], str)
        ):
            raise TypeError(f"each of `bad_inputs` must be an (overrides dict, argument name) pair, got {entry!r}.")
        checked_bad_inputs.append(BadInput(*entry))
    spec = DummyPipelineSpec(
        pipeline_class=pipeline_class,
        components_fn=components_fn,
        inputs_fn=inputs_fn,
        batch_params=tuple(batch_params),
        output_types=tuple(output_types),
        bad_inputs=tuple(checked_bad_inputs),
        callback_edit_tensor=callback_edit_tensor,
        batch_size_param=batch_size_param,
        # the registering module: a fresh interpreter imports it to find this entry
        module=sys._getframe(1).f_globals.get("__name__", ""),
    )
    _REGISTRY[pipeline_class] = spec
    return spec


def _import_dummies_modules() -> None:
    """Import every ``diffusers_ext.pipelines.<method>.dummies`` module, which registers that method's pipeline."""
    global _discovered
    if _discovered:
        return
    package = importlib.import_module("diffusers_ext.pipelines")
    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg:
            continue
        module_name = f"{package.__name__}.{info.name}.{DUMMIES_MODULE_NAME}"
        if importlib.util.find_spec(module_name) is not None:
            importlib.import_module(module_name)
    _discovered = True


def get_dummy_spec(pipeline_class: type[DiffusionPipeline]) -> DummyPipelineSpec:
    """Return the registered [`DummyPipelineSpec`] of `pipeline_class`; raise a `ValueError` naming it if none."""
    if pipeline_class not in _REGISTRY:
        _import_dummies_modules()
    if pipeline_class not in _REGISTRY:
        name = getattr(pipeline_class, "__name__", repr(pipeline_class))
        raise ValueError(
            f"No dummy setup is registered for pipeline class {name!r}. Register one with "
            f"`diffusers_ext.testing.register_dummy_pipeline({name}, components_fn, inputs_fn, ...)`, conventionally "
            f"in diffusers_ext/pipelines/<method>/{DUMMIES_MODULE_NAME}.py."
        )
    return _REGISTRY[pipeline_class]


def registered_pipelines() -> tuple[type[DiffusionPipeline], ...]:
    """All pipeline classes with a registered dummy setup (after importing every method's `dummies` module)."""
    _import_dummies_modules()
    return tuple(_REGISTRY)


def get_dummy_components(pipeline_class: type[DiffusionPipeline], seed: int = 0) -> dict[str, Any]:
    """Tiny components for `pipeline_class(**components)`, with weights seeded by `seed`."""
    return get_dummy_spec(pipeline_class).components_fn(seed)


def get_dummy_inputs(pipeline_class: type[DiffusionPipeline], seed: int = 0) -> dict[str, Any]:
    """Call arguments for one image: `generator=torch.Generator("cpu").manual_seed(seed)`, `output_type="np"`."""
    return get_dummy_spec(pipeline_class).inputs_fn(seed)


def _concat_batch_values(name: str, values: list[Any]) -> Any:
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.cat(values, dim=0)
    if all(isinstance(v, (list, tuple)) for v in values):
        return [item for v in values for item in v]
    if any(isinstance(v, (torch.Tensor, list, tuple)) for v in values):
        raise TypeError(f"batch parameter `{name}` mixes tensors, sequences and scalars across seeds: {values!r}.")
    return list(values)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return type(a) is type(b) and a == b


def get_dummy_batch_inputs(pipeline_class: type[DiffusionPipeline], seeds: Sequence[int] = (0, 1)) -> dict[str, Any]:
    """Call arguments for a batch with one image per seed, equal image by image to the single-seed runs.

    Built from `get_dummy_inputs(pipeline_class, seed)` for each seed: the registered `batch_params` are
    concatenated, `generator` becomes the list of the per-seed generators, a registered `batch_size_param` becomes
    the number of seeds, and every other argument must agree across seeds (otherwise a `ValueError` says which one
    belongs in `batch_params`).
    """
    spec = get_dummy_spec(pipeline_class)
    singles = [spec.inputs_fn(seed) for seed in seeds]
    batch: dict[str, Any] = {}
    for key in singles[0]:
        values = [single.get(key) for single in singles]
        if key == "generator":
            batch[key] = values
        elif key == spec.batch_size_param:
            if any(v != 1 for v in values):
                raise ValueError(
                    f"dummy inputs of {pipeline_class.__name__} set `{key}` (the `batch_size_param`) to {values}; "
                    "single inputs must set it to 1."
                )
            batch[key] = len(singles)
        elif key in spec.batch_params:
            batch[key] = _concat_batch_values(key, values)
        elif all(_same_value(values[0], v) for v in values[1:]):
            batch[key] = values[0]
        else:
            raise ValueError(
                f"dummy inputs of {pipeline_class.__name__} differ across seeds in `{key}`, which is not in "
                f"`batch_params` {spec.batch_params}; add it there if it is a per-image argument."
            )
    return batch


# ---------------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------------


def output_to_numpy(output: Any) -> np.ndarray:
    """Convert a pipeline output to a numpy array, for comparisons.

    A `BaseOutput` or a `return_dict=False` tuple contributes its first element. Tensors become arrays (floating
    ones as float32), a list of PIL images becomes a `(batch, height, width, channels)` uint8 array, and a list of
    strings an array of strings.
    """
    if isinstance(output, (BaseOutput, tuple)):
        output = output[0]
    if isinstance(output, torch.Tensor):
        output = output.detach().cpu()
        return (output.float() if output.is_floating_point() else output).numpy()
    if isinstance(output, np.ndarray):
        return output
    if isinstance(output, PIL.Image.Image):
        return np.asarray(output)
    if isinstance(output, list) and output and all(isinstance(x, str) for x in output):
        return np.asarray(output)
    if isinstance(output, list) and output:
        return np.stack([output_to_numpy(item) for item in output])
    raise TypeError(f"cannot convert a pipeline output of type {type(output).__name__} to numpy.")


@contextlib.contextmanager
def count_module_forwards(pipe: DiffusionPipeline) -> Iterator[dict[str, int]]:
    """Count the forward calls of every `torch.nn.Module` component of `pipe` while the block runs.

    Yields a dict `{component_name: number_of_forward_calls}`, updated live; the hooks are removed on exit.
    """
    counts: dict[str, int] = {}
    handles = []
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            counts[name] = 0

            def hook(module, args, name=name):
                counts[name] += 1

            handles.append(component.register_forward_pre_hook(hook))
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


def _assert_outputs_close(actual: np.ndarray, expected: np.ndarray, atol: float, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if np.issubdtype(actual.dtype, np.inexact):
        max_diff = float(np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max(initial=0.0))
        assert max_diff <= atol, f"{what}: max abs difference {max_diff:.3g} > atol {atol:g}"
    else:
        assert np.array_equal(actual, expected), f"{what}: arrays differ"


def _outputs_differ(a: np.ndarray, b: np.ndarray, atol: float) -> bool:
    if a.shape != b.shape:
        return True
    if np.issubdtype(a.dtype, np.inexact):
        return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0.0)) > atol
    return not np.array_equal(a, b)


def _package_file() -> str:
    return importlib.import_module("diffusers_ext").__file__


_FRESH_PROCESS_SCRIPT = textwrap.dedent(
    """
    import importlib, json, sys

    import numpy as np
    import torch

    import diffusers_ext
    from diffusers_ext import testing

    folder, output_file, info_file, registration_module, num_threads = sys.argv[1:6]
    torch.set_num_threads(int(num_threads))
    if registration_module and registration_module != "__main__":
        importlib.import_module(registration_module)
    pipe = diffusers_ext.load_pipeline(folder)
    pipe.set_progress_bar_config(disable=True)
    output = pipe(**testing.get_dummy_inputs(type(pipe), seed=0))
    np.save(output_file, testing.output_to_numpy(output), allow_pickle=False)
    components = {name: type(value).__name__ for name, value in pipe.components.items()}
    with open(info_file, "w", encoding="utf-8") as f:
        json.dump(
            {"package_file": diffusers_ext.__file__, "pipeline": type(pipe).__name__, "components": components}, f
        )
    """
)


# ---------------------------------------------------------------------------------------------------------------------
# Conformance suites
# ---------------------------------------------------------------------------------------------------------------------


class PipelineConformanceTests:
    """pytest mixin checking the diffusers_ext pipeline contract on a registered dummy setup.

    Subclass it in a test module with a `Test` name and set `pipeline_class`; the class must be registered with
    [`register_dummy_pipeline`]. Every test builds the pipeline from `get_dummy_components(pipeline_class, 0)` and
    calls it with `get_dummy_inputs(pipeline_class, seed)`; outputs are compared through [`output_to_numpy`].

    Attributes:
        pipeline_class (`type`): the pipeline under test.
        atol (`float`, defaults to 1e-5): tolerance for outputs that must be equal (batch vs single, saved vs
            in-process, tuple vs dataclass, `"np"` vs `"pt"`).
        fresh_process_timeout (`float`, defaults to 300): seconds allowed for the fresh-interpreter load-and-run.
    """

    pipeline_class: type[DiffusionPipeline] | None = None
    atol: float = 1e-5
    fresh_process_timeout: float = 300.0

    # helpers ----------------------------------------------------------------------------------------------------

    def get_spec(self) -> DummyPipelineSpec:
        if self.pipeline_class is None:
            raise ValueError(f"{type(self).__name__} must set `pipeline_class`.")
        return get_dummy_spec(self.pipeline_class)

    def get_pipeline(self, seed: int = 0, disable_progress_bar: bool = True) -> DiffusionPipeline:
        """The pipeline built from its dummy components (progress bar off unless asked)."""
        pipe = self.pipeline_class(**get_dummy_components(self.pipeline_class, seed=seed))
        if disable_progress_bar:
            pipe.set_progress_bar_config(disable=True)
        return pipe

    def get_inputs(self, seed: int = 0, **overrides) -> dict[str, Any]:
        inputs = get_dummy_inputs(self.pipeline_class, seed=seed)
        inputs.update(overrides)
        return inputs

    def _expected_num_steps(self, pipe: DiffusionPipeline, inputs: dict[str, Any]) -> int:
        num_timesteps = getattr(pipe, "num_timesteps", None)
        return int(num_timesteps) if num_timesteps is not None else int(inputs["num_inference_steps"])

    # tests ------------------------------------------------------------------------------------------------------

    def test_dummy_inputs_follow_contract(self):
        spec = self.get_spec()
        for seed in (0, 3):
            inputs = self.get_inputs(seed=seed)
            generator = inputs.get("generator")
            assert isinstance(generator, torch.Generator), "dummy inputs must pass `generator=torch.Generator(...)`"
            assert generator.device.type == "cpu", f"dummy generator must be on the CPU, got {generator.device}"
            assert generator.initial_seed() == seed, f"dummy generator seeded {generator.initial_seed()} != {seed}"
            expected_type = spec.comparison_output_type
            assert inputs.get("output_type") == expected_type, (
                f"dummy `output_type` must be {expected_type!r}, got {inputs.get('output_type')!r}"
            )
        for name in spec.batch_params:
            assert name in self.get_inputs(), f"batch parameter {name!r} is not among the dummy inputs"
        if spec.batch_size_param is not None:
            assert self.get_inputs().get(spec.batch_size_param) == 1, (
                f"dummy inputs must set the batch size parameter {spec.batch_size_param!r} to 1"
            )
        assert spec.bad_inputs, f"the registration of {self.pipeline_class.__name__} lists no `bad_inputs`"

    def test_model_index_names_our_classes(self, tmp_path):
        pipe = self.get_pipeline()
        assert self.pipeline_class.__module__ == "diffusers_ext", (
            f"{self.pipeline_class.__name__}.__module__ is {self.pipeline_class.__module__!r}; decorate it with "
            "`diffusers_ext.utils.public` so saved folders name ['diffusers_ext', class]"
        )
        pipe.save_pretrained(tmp_path)
        with open(tmp_path / "model_index.json", encoding="utf-8") as f:
            index = json.load(f)
        assert index["_class_name"] == self.pipeline_class.__name__, (
            f"model_index.json `_class_name` is {index['_class_name']!r}, not {self.pipeline_class.__name__!r}"
        )
        for name, component in pipe.components.items():
            module = type(component).__module__
            if module == "diffusers_ext" or module.startswith("diffusers_ext."):
                assert index.get(name) == ["diffusers_ext", type(component).__name__], (
                    f"model_index.json names component {name!r} as {index.get(name)!r}; expected "
                    f"['diffusers_ext', {type(component).__name__!r}] (is the class decorated with `public`?)"
                )

    def test_save_load_in_fresh_process(self, tmp_path):
        spec = self.get_spec()
        pipe = self.get_pipeline()
        expected = output_to_numpy(pipe(**self.get_inputs(seed=0)))
        folder, output_file, info_file = tmp_path / "pipeline", tmp_path / "output.npy", tmp_path / "loaded.json"
        pipe.save_pretrained(folder)

        # The child must import this very copy of diffusers_ext (not, say, another checkout installed in editable
        # mode), and whatever module registered the dummy setup: put this process's import path first.
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(_package_file())))
        paths = [package_root] + [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)))
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                _FRESH_PROCESS_SCRIPT,
                str(folder),
                str(output_file),
                str(info_file),
                spec.module,
                str(torch.get_num_threads()),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=self.fresh_process_timeout,
        )
        assert result.returncode == 0, f"loading and running in a fresh interpreter failed:\n{result.stderr[-6000:]}"

        with open(info_file, encoding="utf-8") as f:
            info = json.load(f)
        assert os.path.samefile(info["package_file"], _package_file()), (
            f"the fresh interpreter imported diffusers_ext from {info['package_file']}, not {_package_file()}"
        )
        assert info["pipeline"] == self.pipeline_class.__name__, f"load_pipeline gave a {info['pipeline']}"
        original = {name: type(value).__name__ for name, value in pipe.components.items()}
        assert info["components"] == original, "the reloaded pipeline's components differ in class"
        actual = np.load(output_file, allow_pickle=False)
        _assert_outputs_close(actual, expected, self.atol, "output of the reloaded pipeline vs in-process")

    def test_batch_matches_single_runs(self):
        pipe = self.get_pipeline()
        singles = [output_to_numpy(pipe(**self.get_inputs(seed=seed))) for seed in (0, 1)]
        batch = output_to_numpy(pipe(**get_dummy_batch_inputs(self.pipeline_class, seeds=(0, 1))))
        assert batch.shape[0] == 2, f"a batch of two gave {batch.shape[0]} outputs"
        for i, single in enumerate(singles):
            assert single.shape[0] == 1, f"a single run gave {single.shape[0]} outputs"
            _assert_outputs_close(batch[i : i + 1], single, self.atol, f"batch item {i} vs its single run")

    def test_return_dict_false_matches_output(self):
        pipe = self.get_pipeline()
        output = pipe(**self.get_inputs())
        as_tuple = pipe(**self.get_inputs(), return_dict=False)
        assert isinstance(output, BaseOutput), f"expected a BaseOutput, got {type(output).__name__}"
        assert isinstance(as_tuple, tuple), f"return_dict=False gave {type(as_tuple).__name__}, not a tuple"
        assert len(as_tuple) == len(output.to_tuple()), "the tuple and the dataclass have different lengths"
        _assert_outputs_close(
            output_to_numpy(as_tuple[0]), output_to_numpy(output), self.atol, "tuple[0] vs dataclass output"
        )

    def test_same_seed_same_output_different_seed_different_output(self):
        pipe = self.get_pipeline()
        first = output_to_numpy(pipe(**self.get_inputs(seed=0)))
        again = output_to_numpy(pipe(**self.get_inputs(seed=0)))
        other = output_to_numpy(pipe(**self.get_inputs(seed=0, generator=torch.Generator("cpu").manual_seed(1))))
        _assert_outputs_close(again, first, self.atol, "two runs with the same seed")
        assert _outputs_differ(other, first, 1e-4), "generator seeds 0 and 1 gave the same output"

    def test_callback_receives_declared_tensors_once_per_step(self):
        pipe = self.get_pipeline()
        names = list(pipe._callback_tensor_inputs)
        assert names, f"{self.pipeline_class.__name__}._callback_tensor_inputs is empty"
        calls = []

        def callback(pipe_, step, timestep, callback_kwargs):
            calls.append((step, {k: type(v) for k, v in callback_kwargs.items()}))
            return {}

        inputs = self.get_inputs()
        pipe(**inputs, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=names)
        num_steps = self._expected_num_steps(pipe, inputs)
        assert [step for step, _ in calls] == list(range(num_steps)), (
            f"callback steps {[step for step, _ in calls]}, expected one call per step 0..{num_steps - 1}"
        )
        for step, received in calls:
            assert set(received) == set(names), f"step {step}: callback got {sorted(received)}, asked for {names}"
            not_tensors = {k: t.__name__ for k, t in received.items() if not issubclass(t, torch.Tensor)}
            assert not not_tensors, f"step {step}: callback values that are not tensors: {not_tensors}"

    def test_callback_can_replace_tensor(self):
        spec = self.get_spec()
        pipe = self.get_pipeline()
        name = spec.callback_edit_tensor
        assert name in pipe._callback_tensor_inputs, f"{name!r} is not in `_callback_tensor_inputs`"
        baseline = output_to_numpy(pipe(**self.get_inputs()))
        inputs = self.get_inputs()
        last_step = self._expected_num_steps(pipe, inputs) - 1

        def callback(pipe_, step, timestep, callback_kwargs):
            if step == last_step:
                return {name: torch.zeros_like(callback_kwargs[name])}
            return {}

        edited = output_to_numpy(
            pipe(**inputs, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=[name])
        )
        assert _outputs_differ(edited, baseline, 1e-4), f"zeroing `{name}` in the callback did not change the output"

    def test_output_types(self):
        spec = self.get_spec()
        pipe = self.get_pipeline()
        results = {}
        for output_type in spec.output_types:
            results[output_type] = pipe(**self.get_inputs(output_type=output_type))[0]
        if "np" in results:
            images = results["np"]
            # (batch, H, W, C); multi-view and video pipelines add dimensions after the batch: (batch, ..., H, W, C)
            assert isinstance(images, np.ndarray) and images.ndim >= 4, "'np' must give a (batch, ..., H, W, C) array"
            assert np.issubdtype(images.dtype, np.floating), f"'np' images have dtype {images.dtype}"
            assert images.min() >= 0.0 and images.max() <= 1.0, "'np' images must lie in [0, 1]"
        if "pt" in results:
            images = results["pt"]
            assert isinstance(images, torch.Tensor) and images.ndim >= 4, (
                "'pt' must give a (batch, ..., C, H, W) tensor"
            )
            assert images.min() >= 0.0 and images.max() <= 1.0, "'pt' images must lie in [0, 1]"
            if "np" in results:
                _assert_outputs_close(
                    results["np"], output_to_numpy(images.movedim(-3, -1)), self.atol, "'np' vs permuted 'pt'"
                )
        if "pil" in results:
            images = results["pil"]
            assert isinstance(images, list) and len(images) > 0, "'pil' must give a list (one entry per batch item)"
            if "np" in results:
                array = results["np"]
                assert len(images) == array.shape[0], "'pil' and 'np' give different batch sizes"
                # Multi-view pipelines give a list of lists of views: flatten both to single images.
                images = [im for item in images for im in (item if isinstance(item, list) else [item])]
                array = array.reshape(-1, *array.shape[-3:])
            assert all(isinstance(im, PIL.Image.Image) for im in images), "'pil' must give PIL images"
            if "np" in results:
                assert images[0].size == (array.shape[2], array.shape[1]), "'pil' and 'np' sizes differ"
                as_uint8 = (array * 255).round().astype(np.int16)
                if as_uint8.shape[-1] == 1:
                    as_uint8 = as_uint8[..., 0]
                diff = np.abs(np.stack([np.asarray(im) for im in images]).astype(np.int16) - as_uint8).max()
                assert diff <= 1, f"'pil' pixels differ from 'np' * 255 by up to {diff}"
        if "seq" in results:
            sequences = results["seq"]
            assert isinstance(sequences, torch.Tensor) and sequences.ndim == 2, (
                "'seq' must give a (batch, length) tensor"
            )
            assert not sequences.is_floating_point(), f"'seq' token ids have dtype {sequences.dtype}"
        if "text" in results:
            output = pipe(**self.get_inputs(output_type="text"))
            texts = output[1] if isinstance(output, tuple) else getattr(output, "texts", None)
            assert isinstance(texts, list) and all(isinstance(t, str) for t in texts), (
                "'text' must give the decoded strings as the second output"
            )
            assert len(texts) == len(results["text"]), "'text' gives a different number of strings and sequences"
            if "seq" in results:
                _assert_outputs_close(
                    output_to_numpy(results["text"]), output_to_numpy(results["seq"]), 0, "'text' vs 'seq' token ids"
                )
        if "latent" in results:
            latents = results["latent"]
            assert isinstance(latents, torch.Tensor), f"'latent' must give a tensor, got {type(latents).__name__}"
            batch = next((len(v) for k, v in results.items() if k != "latent"), 1)
            assert latents.shape[0] == batch, f"'latent' batch {latents.shape[0]} != {batch}"

    def test_progress_bar_shows_by_default_and_can_be_disabled(self, capfd):
        pipe = self.get_pipeline(disable_progress_bar=False)
        capfd.readouterr()
        pipe(**self.get_inputs())
        shown = capfd.readouterr().err
        assert "100%" in shown, f"no progress bar on stderr by default; got {shown[-500:]!r}"
        pipe.set_progress_bar_config(disable=True)
        pipe(**self.get_inputs())
        hidden = capfd.readouterr().err
        assert "%|" not in hidden and "it/s" not in hidden, f"progress bar still shown: {hidden[-500:]!r}"

    def test_bad_inputs_raise_before_any_forward(self):
        spec = self.get_spec()
        pipe = self.get_pipeline()
        for overrides, argument in spec.bad_inputs:
            inputs = self.get_inputs(**overrides)
            with count_module_forwards(pipe) as counts:
                try:
                    pipe(**inputs)
                except (ValueError, TypeError) as error:
                    message = str(error)
                except Exception as error:
                    raise AssertionError(
                        f"bad input {overrides!r} raised {type(error).__name__}: {error}; expected a ValueError or "
                        f"TypeError naming {argument!r}"
                    ) from error
                else:
                    raise AssertionError(
                        f"bad input {overrides!r} did not raise; expected an error naming {argument!r}"
                    )
            assert argument in message, f"bad input {overrides!r}: message {message!r} does not name {argument!r}"
            ran = {name: n for name, n in counts.items() if n}
            assert not ran, f"bad input {overrides!r} raised only after model forwards {ran}"


def _config_items(config) -> dict[str, Any]:
    """A scheduler config without private keys, with tuples as lists (as JSON stores them)."""

    def normalise(value):
        if isinstance(value, (list, tuple)):
            return [normalise(v) for v in value]
        return value

    return {k: normalise(v) for k, v in dict(config).items() if not k.startswith("_")}


def _assert_configs_equal(actual, expected, what: str) -> None:
    actual, expected = _config_items(actual), _config_items(expected)
    differing = {
        key: (actual.get(key, "<missing>"), expected.get(key, "<missing>"))
        for key in sorted(actual.keys() | expected.keys())
        if actual.get(key, "<missing>") != expected.get(key, "<missing>")
    }
    assert not differing, f"{what}: config entries differ as (got, expected): {differing}"


class SchedulerConformanceTests:
    """pytest mixin checking the diffusers scheduler contract.

    Subclass it in a test module with a `Test` name and set `scheduler_class` (and `scheduler_config` for the
    constructor's keyword arguments). The denoising loop uses a stand-in model output `0.1 * scaled_sample` on
    samples of `sample_shape`; stochastic `step`s get a seeded `generator`.

    Attributes:
        scheduler_class (`type`): the scheduler under test.
        scheduler_config (`dict`, defaults to `{}`): constructor arguments.
        num_inference_steps (`int`, defaults to 10): steps for `set_timesteps`.
        sample_shape (`tuple`, defaults to `(2, 3, 8, 8)`): shape of the sample `(batch, channels, height, width)`.
        step_kwargs (`dict`, defaults to `{}`): extra keyword arguments of every `step` call (e.g. the mask token
            of a discrete scheduler).
        sample_shaped_outputs (`tuple[str, ...]`, *optional*): the `step` output fields that have the sample's
            shape; the other tensor fields must be per-sample (leading dimension = batch). `None`: every tensor
            field has the sample's shape, as in continuous schedulers.
    """

    scheduler_class: type | None = None
    scheduler_config: dict[str, Any] = {}
    num_inference_steps: int = 10
    sample_shape: tuple[int, ...] = (2, 3, 8, 8)
    step_kwargs: dict[str, Any] = {}
    sample_shaped_outputs: tuple[str, ...] | None = None

    def get_scheduler(self, **overrides):
        if self.scheduler_class is None:
            raise ValueError(f"{type(self).__name__} must set `scheduler_class`.")
        return self.scheduler_class(**{**self.scheduler_config, **overrides})

    def get_sample(self, seed: int = 0) -> torch.Tensor:
        return torch.randn(self.sample_shape, generator=torch.Generator("cpu").manual_seed(seed))

    def model_output(self, scaled_sample: torch.Tensor, timestep) -> torch.Tensor:
        """The stand-in denoiser; override for schedulers that need a specific prediction."""
        return 0.1 * scaled_sample

    def run_denoising_loop(self, return_dict: bool = True) -> list[Any]:
        """Run every step of a fresh scheduler; return the raw `step` outputs."""
        scheduler = self.get_scheduler()
        scheduler.set_timesteps(self.num_inference_steps)
        # Flow-matching and discrete schedulers have neither `init_noise_sigma` nor `scale_model_input`; both are
        # optional (and a discrete sample must keep its integer dtype).
        sample = self.get_sample()
        if hasattr(scheduler, "init_noise_sigma"):
            sample = sample * scheduler.init_noise_sigma
        step_kwargs = {**self.step_kwargs, "return_dict": return_dict}
        if "generator" in inspect.signature(scheduler.step).parameters:
            step_kwargs["generator"] = torch.Generator("cpu").manual_seed(0)
        outputs = []
        for t in scheduler.timesteps:
            scaled = scheduler.scale_model_input(sample, t) if hasattr(scheduler, "scale_model_input") else sample
            model_output = self.model_output(scaled, t)
            output = scheduler.step(model_output, t, sample, **step_kwargs)
            outputs.append(output)
            sample = output.prev_sample if return_dict else output[0]
        return outputs

    def test_save_pretrained_from_pretrained_round_trip(self, tmp_path):
        scheduler = self.get_scheduler()
        scheduler.save_pretrained(tmp_path)
        with open(tmp_path / self.scheduler_class.config_name, encoding="utf-8") as f:
            saved = json.load(f)
        assert saved["_class_name"] == self.scheduler_class.__name__, f"saved `_class_name` {saved['_class_name']!r}"
        loaded = self.scheduler_class.from_pretrained(tmp_path)
        assert type(loaded) is self.scheduler_class, f"from_pretrained gave a {type(loaded).__name__}"
        _assert_configs_equal(loaded.config, scheduler.config, "from_pretrained(save_pretrained(...))")

    def test_from_config_round_trip(self):
        scheduler = self.get_scheduler()
        rebuilt = self.scheduler_class.from_config(scheduler.config)
        assert type(rebuilt) is self.scheduler_class, f"from_config gave a {type(rebuilt).__name__}"
        _assert_configs_equal(rebuilt.config, scheduler.config, "from_config(scheduler.config)")

    def test_set_timesteps_gives_requested_length(self):
        for num_steps in sorted({1, 2, self.num_inference_steps}):
            scheduler = self.get_scheduler()
            scheduler.set_timesteps(num_steps)
            timesteps = scheduler.timesteps
            assert isinstance(timesteps, torch.Tensor) and timesteps.ndim == 1, "`timesteps` must be a 1-D tensor"
            assert len(timesteps) == num_steps, f"set_timesteps({num_steps}) gave {len(timesteps)} timesteps"

    def test_step_output_shapes_match_sample(self):
        outputs = self.run_denoising_loop()
        assert len(outputs) == self.num_inference_steps, (
            f"{len(outputs)} steps for {self.num_inference_steps} timesteps"
        )
        for i, output in enumerate(outputs):
            assert isinstance(output, BaseOutput), f"step {i} returned {type(output).__name__}, not a BaseOutput"
            assert "prev_sample" in output, f"step {i} output has no `prev_sample`"
            if self.sample_shaped_outputs is not None:
                missing = set(self.sample_shaped_outputs) - set(output.keys())
                assert not missing, f"step {i}: output has no fields {sorted(missing)}"
            for name, value in output.items():
                if isinstance(value, torch.Tensor):
                    if self.sample_shaped_outputs is None or name in self.sample_shaped_outputs:
                        assert tuple(value.shape) == self.sample_shape, (
                            f"step {i}: `{name}` has shape {tuple(value.shape)}"
                        )
                    else:
                        assert value.ndim >= 1 and value.shape[0] == self.sample_shape[0], (
                            f"step {i}: per-sample field `{name}` has shape {tuple(value.shape)}"
                        )
                    assert torch.isfinite(value).all(), f"step {i}: `{name}` is not finite"

    def test_step_return_dict_false_matches_output_fields(self):
        as_outputs = self.run_denoising_loop(return_dict=True)
        as_tuples = self.run_denoising_loop(return_dict=False)
        for i, (output, as_tuple) in enumerate(zip(as_outputs, as_tuples)):
            assert isinstance(as_tuple, tuple), f"step {i} with return_dict=False gave {type(as_tuple).__name__}"
            fields = output.to_tuple()
            assert len(as_tuple) == len(fields), f"step {i}: tuple of {len(as_tuple)}, output has {len(fields)} fields"
            for j, (a, b) in enumerate(zip(as_tuple, fields)):
                assert torch.equal(a, b), f"step {i}: tuple element {j} differs from the output field"
