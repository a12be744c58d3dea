"""Saving and loading a [`DiffusionLMPipeline`] whose model runs its own modeling code (`trust_remote_code`).

LLaDA and Dream checkpoints ship their modeling files beside the weights (`config.json` has an `auto_map`).
transformers loads them under a generated module name (`transformers_modules.<folder>.<hash>.modeling_llada`),
which diffusers then writes into `model_index.json` as the component's library; no later process can import that
name, so the saved pipeline could not be loaded. The model's own `save_pretrained` copies the modeling files and the
`auto_map` into `model/`, so the folder is complete: this module records the component as a `transformers`
`PreTrainedModel` (what it is; diffusers checks a passed component against the recorded class) and loads it back
through the auto class that `auto_map` names for its architecture, when the caller passes `trust_remote_code`.

LLaDA's and Dream's published modeling files were written for transformers 4, and transformers 5 (which this package
requires) no longer loads them as they are. [`load_remote_code_model`] loads such a checkpoint with its files
untouched: before transformers builds the model, [`bridge_transformers4_code`] adapts the classes and module globals
that transformers loaded from the checkpoint, in this process only, where they rely on what transformers 5 changed.
"""

import copy
import functools
import inspect
import json
import os
import sys

import torch
from diffusers.utils import logging

from ...utils import public


logger = logging.get_logger(__name__)

REMOTE_CODE_PREFIX = "transformers_modules"
# the `from_pretrained` keywords that say where the checkpoint's files come from (as transformers' auto classes read
# them), passed on when its modeling code is fetched ahead of the model
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")


def is_remote_code_model(model) -> bool:
    """Whether `model`'s class was loaded from a checkpoint's own modeling file."""
    return type(model).__module__.split(".")[0] == REMOTE_CODE_PREFIX


def _auto_class_for(auto_map: dict, class_name: str) -> str | None:
    """The most specific auto class (`"AutoModelForCausalLM"` over `"AutoModel"`) that `auto_map` maps to
    `class_name`."""
    matches = [
        auto for auto, target in auto_map.items() if auto != "AutoConfig" and str(target).endswith(f".{class_name}")
    ]
    return max(matches, key=len) if matches else None


def remote_code_auto_class(model) -> str:
    """The `transformers` auto class whose `auto_map` entry in `model.config` names `model`'s class."""
    auto_map = getattr(model.config, "auto_map", None) or {}
    auto_class = _auto_class_for(auto_map, type(model).__name__)
    if auto_class is None:
        raise ValueError(
            f"`model` ({type(model).__name__}) runs remote code but its config's `auto_map` ({auto_map!r}) names no "
            "auto class for it, so the saved pipeline could not load it again; add the entry (e.g. 'AutoModel') to "
            "its config."
        )
    return auto_class


def record_remote_code_model(save_directory: str | os.PathLike) -> None:
    """Rewrite the `model` entry of a saved `model_index.json` as `["transformers", "PreTrainedModel"]`."""
    path = os.path.join(save_directory, "model_index.json")
    with open(path, encoding="utf-8") as f:
        index = json.load(f)
    index["model"] = ["transformers", "PreTrainedModel"]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


def remote_code_pipeline_snapshot(repo_id: str, **kwargs) -> str | None:
    """The local folder of a Hub repository `repo_id` holding a saved pipeline whose model runs its own code, or
    `None` when it holds another pipeline, or cannot be resolved (then diffusers' loader takes the id and reports).

    The repository's `model_index.json` is fetched first (`huggingface_hub.hf_hub_download`); only when its `model`
    entry is the one [`record_remote_code_model`] writes is the whole repository fetched
    (`huggingface_hub.snapshot_download`), so that the model folder, modeling files included, is on disk. Both honour
    `HF_HUB_OFFLINE` and the local cache (`cache_dir`, `HF_HUB_CACHE`): offline, a repository already in the cache
    loads from it. `kwargs` are `from_pretrained`'s: the Hub ones among them (`revision`, `cache_dir`, `token`,
    `local_files_only`, `force_download`) are passed on.
    """
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError, HFValidationError, LocalEntryNotFoundError

    names = ("revision", "cache_dir", "token", "local_files_only", "force_download")
    hub_kwargs = {name: kwargs[name] for name in names if kwargs.get(name) is not None}
    try:
        index_path = hf_hub_download(str(repo_id), "model_index.json", **hub_kwargs)
    except (EntryNotFoundError, LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None
    with open(index_path, encoding="utf-8") as f:
        entry = json.load(f).get("model")
    if entry != ["transformers", "PreTrainedModel"]:
        return None
    return snapshot_download(str(repo_id), **hub_kwargs)


def saved_remote_code_auto_class(folder: str | os.PathLike) -> str | None:
    """The auto class to load a saved pipeline folder's `model` with, when it runs its own code (recorded by
    [`record_remote_code_model`], its `config.json` mapping its architecture in `auto_map`), else `None`."""
    index_path = os.path.join(folder, "model_index.json")
    config_path = os.path.join(folder, "model", "config.json")
    if not (os.path.isfile(index_path) and os.path.isfile(config_path)):
        return None
    with open(index_path, encoding="utf-8") as f:
        entry = json.load(f).get("model")
    if entry != ["transformers", "PreTrainedModel"]:
        return None
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    architectures = config.get("architectures") or []
    return _auto_class_for(config.get("auto_map") or {}, architectures[0]) if architectures else None


def load_saved_remote_code_model(folder: str | os.PathLike, auto_class: str, trust_remote_code: bool, **kwargs):
    """Load a saved pipeline's `folder/model` through `transformers.<auto_class>` with its own modeling code (by
    [`load_remote_code_model`]).

    Raises a `ValueError` unless `trust_remote_code` is True: the folder's Python files run on loading, and, as in
    transformers, that must be asked for.
    """
    model_folder = os.path.join(folder, "model")
    if not trust_remote_code:
        files = sorted(f for f in os.listdir(model_folder) if f.endswith(".py"))
        raise ValueError(
            f"The saved model in {model_folder} runs its own modeling code ({', '.join(files) or 'auto_map'}); pass "
            "`trust_remote_code=True` to `from_pretrained` to load it, as transformers requires."
        )
    return load_remote_code_model(model_folder, auto_class=auto_class, trust_remote_code=trust_remote_code, **kwargs)


@public
def load_remote_code_model(
    pretrained_model_name_or_path: str | os.PathLike,
    auto_class: str | None = None,
    *,
    trust_remote_code: bool = False,
    **kwargs,
):
    """Load a checkpoint that ships its own modeling code (LLaDA, Dream: `config.json` has an `auto_map`), as
    `transformers.<auto_class>.from_pretrained(..., trust_remote_code=True)` does, also when that code was written
    for transformers 4.

    transformers 5 no longer runs LLaDA's and Dream's published modeling files: building or loading the model fails
    before a forward. Here the checkpoint's modeling code is fetched first and bridged
    ([`bridge_transformers4_code`]), then the model is loaded through the auto class; a `use_cache` that
    transformers 5 dropped from its config is put back ([`restore_use_cache`]), and its non-persistent buffers get
    the values its own `__init__` computes ([`restore_non_persistent_buffers`]). The checkpoint's files are not
    changed.

    Args:
        pretrained_model_name_or_path (`str` or `os.PathLike`): a hub id or a local folder.
        auto_class (`str`, *optional*): the transformers auto class to load with (`"AutoModel"`,
            `"AutoModelForCausalLM"`, ...); by default the most specific one that the config's `auto_map` maps to
            its architecture.
        trust_remote_code (`bool`, defaults to `False`): must be True: the checkpoint's Python files run on loading.
        kwargs: passed to `from_pretrained` (`dtype`, `device_map`, `revision`, ...).

    Raises:
        `ValueError`: `trust_remote_code` is not True, or the config's `auto_map` names no model class for
            `auto_class` (or its architecture).
    """
    if trust_remote_code is not True:
        raise ValueError(
            f"`trust_remote_code` must be True to load {pretrained_model_name_or_path}: its own modeling code runs on "
            f"loading (got {trust_remote_code!r})."
        )
    import transformers
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    hub_kwargs = {name: kwargs[name] for name in HUB_KWARGS if name in kwargs}
    config_dict, _ = transformers.PreTrainedConfig.get_config_dict(pretrained_model_name_or_path, **hub_kwargs)
    auto_map = config_dict.get("auto_map") or {}
    if auto_class is None:
        architectures = config_dict.get("architectures") or []
        auto_class = _auto_class_for(auto_map, architectures[0]) if architectures else None
    if auto_class not in auto_map or auto_class == "AutoConfig":
        raise ValueError(
            f"`pretrained_model_name_or_path` ({pretrained_model_name_or_path}) must name its model class in its "
            f"config's `auto_map` (got auto_class={auto_class!r}, auto_map={auto_map!r}); a checkpoint without modeling "
            "code of its own loads with transformers' auto classes."
        )
    # the class transformers' auto class loads below: the same module, reused while its files are unchanged
    model_class = get_class_from_dynamic_module(
        auto_map[auto_class], pretrained_model_name_or_path, code_revision=kwargs.get("code_revision"), **hub_kwargs
    )
    bridge_transformers4_code(model_class)
    model = getattr(transformers, auto_class).from_pretrained(
        pretrained_model_name_or_path, trust_remote_code=trust_remote_code, **kwargs
    )
    restore_use_cache(model.config, config_dict)
    restore_non_persistent_buffers(model)
    return model


def restore_non_persistent_buffers(model) -> None:
    """Give `model`'s non-persistent buffers (not in the checkpoint: rotary frequencies, masks) the values its own
    `__init__` computes.

    transformers 5 builds the model on the meta device and leaves such buffers to the model's `_init_weights`,
    holding uninitialised memory until then; code written for transformers 4 computes them in `__init__` only
    (Dream's rotary `inv_freq`), so they would stay garbage and the model would run with them silently. The model's
    skeleton is built once more, its parameters on the meta device (no memory, no initialisation) and its buffers
    where its code puts them, and those buffers are copied in (cast to the loaded buffers' dtypes and devices).
    """
    from accelerate import init_empty_weights
    from transformers.initialization import no_init_weights

    names = [name for name, buffer in model.named_non_persistent_buffers() if buffer.device.type != "meta"]
    if not names:
        return
    with init_empty_weights(include_buffers=False), no_init_weights():
        # a copy: building a model may write to its config (the attention implementation), the loaded one's included
        skeleton = type(model)(copy.deepcopy(model.config))
    computed = dict(skeleton.named_buffers())
    with torch.no_grad():
        for name in names:
            model.get_buffer(name).copy_(computed[name])


def restore_use_cache(config, config_dict: dict) -> None:
    """Put back `config.use_cache` when transformers 5 dropped it: it discards the generation parameters given to
    `PreTrainedConfig.__init__` among its keyword arguments, which is how LLaDA's config passes `use_cache` (and its
    forward then reads `config.use_cache` when called without one). The value is the checkpoint's `config_dict`
    entry, else the default of the config class's own `use_cache` argument; a config that kept it, or never took
    one, is left as it is. Only `use_cache` is restored: transformers 5 refuses to save a config that holds any other
    generation parameter."""
    if hasattr(config, "use_cache"):
        return
    value = config_dict.get("use_cache")
    if value is None:
        parameter = inspect.signature(type(config).__init__).parameters.get("use_cache")
        if parameter is None or parameter.default is inspect.Parameter.empty:
            return
        value = parameter.default
    config.use_cache = value


# --- transformers 4 modeling code under transformers 5 ---------------------------------------------------------------
# Each bridge below answers one change of transformers 5 that LLaDA's or Dream's published files trip over; it applies
# only where the checkpoint's code relies on the old behaviour, and leaves transformers' own objects as they are.

# keywords that transformers 5 passes to methods which remote code may override with transformers 4's signature
NEW_KEYWORDS = {"tie_weights": ("missing_keys", "recompute_mapping"), "validate": ("strict", "user_set_attributes")}


def bridge_transformers4_code(model_class: type) -> None:
    """Adapt the code transformers loaded from a checkpoint (`model_class` and the other modules of its package
    under `transformers_modules`) to transformers 5, in place and in this process only; what already works is left
    as it is, and a second call changes nothing.

    - A model `__init__` that never calls `post_init()` (LLaDA's) gets it called after it: transformers 5 sets the
      tied-weight map there and reads it while loading.
    - `tie_weights()` (LLaDA's) and `GenerationConfig.validate(is_init=False)` (Dream's) overrides with transformers
      4's signatures accept and ignore the keywords transformers 5 passes (`missing_keys`, `recompute_mapping`;
      `strict`, `user_set_attributes`).
    - `_tied_weights_keys` as transformers 4's list of parameters tied to the input embeddings (Dream's) becomes the
      `{tied parameter: input embedding weight}` map transformers 5 reads.
    - A module reading `ROPE_INIT_FUNCTIONS["default"]` (Dream's rotary embedding) sees a copy that has the plain
      RoPE entry transformers 5 removed ([`default_rope_parameters`]).

    LLaDA's config also loses `use_cache`, which its forward reads when called without one: the loader puts it back
    ([`restore_use_cache`]), and the adapters pass `use_cache=False` whatever the config holds ([`model_logits`]).
    """
    from transformers import GenerationConfig, PreTrainedModel

    _call_post_init(model_class)
    package = model_class.__module__.rpartition(".")[0]
    modules = [m for name, m in list(sys.modules.items()) if name.rpartition(".")[0] == package and m is not None]
    for module in modules:
        rope_functions = getattr(module, "ROPE_INIT_FUNCTIONS", None)
        if isinstance(rope_functions, dict) and "default" not in rope_functions:
            module.ROPE_INIT_FUNCTIONS = {**rope_functions, "default": default_rope_parameters}
            logger.info(f"{module.__name__}: `ROPE_INIT_FUNCTIONS['default']` restored (plain RoPE)")
        for cls in vars(module).values():
            if not (isinstance(cls, type) and cls.__module__ == module.__name__):
                continue
            if issubclass(cls, PreTrainedModel):
                _accept_new_keywords(cls, "tie_weights")
                tied = vars(cls).get("_tied_weights_keys")
                if isinstance(tied, (list, tuple)):
                    cls._tied_weights_keys = _tied_to_input_embeddings(tuple(tied))
                    logger.info(f"{cls.__qualname__}._tied_weights_keys: list {list(tied)} read as a map")
            elif issubclass(cls, GenerationConfig):
                _accept_new_keywords(cls, "validate")


def _call_post_init(model_class: type) -> None:
    init = model_class.__init__
    if getattr(init, "_calls_post_init", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not hasattr(self, "all_tied_weights_keys"):  # set by `post_init`, which this `__init__` never called
            self.post_init()

    __init__._calls_post_init = True
    model_class.__init__ = __init__


def _accept_new_keywords(cls: type, name: str) -> None:
    """Let `cls`'s own `name` method take (and ignore) the keywords of `NEW_KEYWORDS[name]` it does not declare."""
    method = vars(cls).get(name)
    if method is None or getattr(method, "_accepts_new_keywords", False):
        return
    parameters = inspect.signature(method).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = tuple(k for k in NEW_KEYWORDS[name] if k not in parameters)
    if not unknown:
        return

    @functools.wraps(method)
    def bridged(self, *args, **kwargs):
        for keyword in unknown:
            kwargs.pop(keyword, None)
        return method(self, *args, **kwargs)

    bridged._accepts_new_keywords = True
    setattr(cls, name, bridged)
    logger.info(f"{cls.__qualname__}.{name}: transformers 5's keywords {list(unknown)} accepted and ignored")


def _tied_to_input_embeddings(targets: tuple[str, ...]) -> property:
    """`_tied_weights_keys` as transformers 5 reads it, `{target: source}`, from transformers 4's list of targets
    (parameters tied to the input embeddings, when the config ties word embeddings)."""

    def tied_weights_keys(self) -> dict[str, str]:
        embedding = self.get_input_embeddings().weight
        source = next(name for name, p in self.named_parameters(remove_duplicate=False) if p is embedding)
        return {target: source for target in targets if target != source}

    return property(tied_weights_keys)


def default_rope_parameters(config=None, device=None, seq_len=None, **rope_kwargs) -> tuple[torch.Tensor, float]:
    """Plain RoPE, as transformers 4's `ROPE_INIT_FUNCTIONS["default"]` computed it: the inverse frequencies
    `base ** (-2i / dim)` for `i < dim / 2`, shape `(dim // 2,)` in float32, and the attention scaling 1.

    `base` is the config's `rope_theta` (or `rope_parameters["rope_theta"]`) and `dim` its head dimension times its
    `partial_rotary_factor` (1 by default); without a config they come as keywords `base` and `dim`. `seq_len` is
    unused (plain RoPE does not depend on it).
    """
    if config is None:
        base, dim = rope_kwargs["base"], rope_kwargs["dim"]
    else:
        base = getattr(config, "rope_theta", None)
        if base is None:
            base = config.rope_parameters["rope_theta"]
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    return 1.0 / base**exponents, 1.0
