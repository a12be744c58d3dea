"""[`PipelineConformanceTests`]: the pytest mixin that checks the diffusers_ext pipeline contract."""

import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import unittest
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput
from transformers import PreTrainedModel

from .outputs import assert_outputs_close, count_module_forwards, output_to_numpy, outputs_differ
from .registry import DummyPipelineSpec, get_dummy_batch_inputs, get_dummy_components, get_dummy_inputs, get_dummy_spec


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
        assert_outputs_close(actual, expected, self.atol, "output of the reloaded pipeline vs in-process")

    def test_batch_matches_single_runs(self):
        pipe = self.get_pipeline()
        singles = [output_to_numpy(pipe(**self.get_inputs(seed=seed))) for seed in (0, 1)]
        batch = output_to_numpy(pipe(**get_dummy_batch_inputs(self.pipeline_class, seeds=(0, 1))))
        assert batch.shape[0] == 2, f"a batch of two gave {batch.shape[0]} outputs"
        for i, single in enumerate(singles):
            assert single.shape[0] == 1, f"a single run gave {single.shape[0]} outputs"
            assert_outputs_close(batch[i : i + 1], single, self.atol, f"batch item {i} vs its single run")

    def _call_parameters(self) -> set[str]:
        return set(inspect.signature(self.pipeline_class.__call__).parameters)

    def test_ragged_batch_matches_single_runs(self):
        # per-row arguments of different sizes (prompts of different lengths, scenes with different view counts):
        # each row must not depend on the longest one (padding, noise drawn over the padded size)
        spec = self.get_spec()
        if spec.ragged_inputs_fn is None:
            raise unittest.SkipTest(f"{self.pipeline_class.__name__} registers no `ragged_inputs_fn`")
        pipe = self.get_pipeline()
        singles = [output_to_numpy(pipe(**spec.ragged_inputs_fn(seed))) for seed in (0, 1)]
        batch = output_to_numpy(pipe(**get_dummy_batch_inputs(self.pipeline_class, seeds=(0, 1), ragged=True)))
        assert batch.shape[0] == 2, f"a ragged batch of two gave {batch.shape[0]} outputs"
        for i, single in enumerate(singles):
            assert_outputs_close(batch[i : i + 1], single, self.atol, f"ragged batch item {i} vs its single run")

    def test_num_images_per_prompt(self):
        # diffusers' PipelineTesterMixin.test_num_images_per_prompt, plus: row j follows generator j. A pipeline with
        # per-sample inputs (`batch_params`: prompts, labels, images) must take the argument; an unconditional one
        # (only `batch_size`, like diffusers' DDPMPipeline) need not
        spec = self.get_spec()
        if not spec.batch_params and "num_images_per_prompt" not in self._call_parameters():
            raise unittest.SkipTest(f"{self.pipeline_class.__name__} is unconditional: `batch_size` sets the count")
        assert "num_images_per_prompt" in self._call_parameters(), (
            f"{self.pipeline_class.__name__}.__call__ takes no `num_images_per_prompt`"
        )
        pipe = self.get_pipeline()
        single = output_to_numpy(pipe(**self.get_inputs(seed=0)))
        other = output_to_numpy(pipe(**self.get_inputs(seed=0, generator=torch.Generator("cpu").manual_seed(1))))
        generators = [torch.Generator("cpu").manual_seed(s) for s in (0, 1)]
        out = output_to_numpy(pipe(**self.get_inputs(seed=0, num_images_per_prompt=2, generator=generators)))
        assert out.shape[0] == 2, f"num_images_per_prompt=2 gave {out.shape[0]} outputs for one prompt"
        assert_outputs_close(out[:1], single, self.atol, "num_images_per_prompt row 0 vs the single run")
        assert_outputs_close(out[1:], other, self.atol, "num_images_per_prompt row 1 vs a run with its generator")
        if spec.batch_size_param != "num_images_per_prompt" and spec.batch_params:
            batch = get_dummy_batch_inputs(self.pipeline_class, seeds=(0, 1))
            batch["generator"] = torch.Generator("cpu").manual_seed(0)
            out = output_to_numpy(pipe(**batch, num_images_per_prompt=2))
            assert out.shape[0] == 4, f"a batch of 2 with num_images_per_prompt=2 gave {out.shape[0]} outputs"

    def test_callback_can_change_guidance(self):
        # diffusers' PipelineTesterMixin.test_callback_cfg: guidance is a read-only property set before the loop and
        # read at every step, so a callback changing `pipe._guidance_scale` changes the rest of the sampling
        if "guidance_scale" not in self._call_parameters():
            raise unittest.SkipTest(f"{self.pipeline_class.__name__} has no `guidance_scale`")
        for name in ("guidance_scale", "do_classifier_free_guidance", "num_timesteps", "interrupt"):
            attribute = inspect.getattr_static(self.pipeline_class, name, None)
            assert isinstance(attribute, property) and attribute.fset is None, (
                f"{self.pipeline_class.__name__}.{name} must be a read-only property"
            )
        pipe = self.get_pipeline()
        start = max(float(self.get_inputs().get("guidance_scale", 2.0)), 2.0)
        baseline = output_to_numpy(pipe(**self.get_inputs(guidance_scale=start)))
        seen = []

        def callback(pipe_, step, timestep, callback_kwargs):
            seen.append((pipe_.guidance_scale, pipe_.do_classifier_free_guidance, pipe_.num_timesteps))
            pipe_._guidance_scale += 1.0
            return {}

        changed = output_to_numpy(pipe(**self.get_inputs(guidance_scale=start), callback_on_step_end=callback))
        assert seen and seen[0][0] == start, f"the first callback read guidance_scale {seen[0][0]}, not {start}"
        assert all(cfg for _, cfg, _ in seen), "do_classifier_free_guidance is False while guidance_scale > 1"
        assert pipe.guidance_scale == start + len(seen), (
            f"guidance_scale is {pipe.guidance_scale} after {len(seen)} callback increments from {start}"
        )
        assert outputs_differ(changed, baseline, 1e-4), (
            "raising `_guidance_scale` in the callback did not change the output: guidance is not read in the loop"
        )

    def test_callback_can_interrupt(self):
        # diffusers' `_interrupt`: once set by a callback, the remaining steps are skipped
        if inspect.getattr_static(self.pipeline_class, "interrupt", None) is None:
            raise unittest.SkipTest(f"{self.pipeline_class.__name__} has no `interrupt` property")
        pipe = self.get_pipeline()
        calls = []

        def callback(pipe_, step, timestep, callback_kwargs):
            calls.append(step)
            pipe_._interrupt = True
            return {}

        output = pipe(**self.get_inputs(), callback_on_step_end=callback)
        assert calls == [0], f"after `_interrupt` was set at step 0 the callback still ran at steps {calls}"
        assert output_to_numpy(output).shape[0] == 1, "an interrupted call must still return its output"

    def test_save_load_variant(self, tmp_path):
        # diffusers: `save_pretrained(variant=..., safe_serialization=...)` names and formats every weight file,
        # `from_pretrained(variant=...)` loads it back, and a variant the folder lacks is a ValueError
        pipe = self.get_pipeline()
        expected = output_to_numpy(pipe(**self.get_inputs()))
        for safe in (True, False):
            folder = tmp_path / f"safe_{safe}"
            pipe.save_pretrained(folder, variant="v1", safe_serialization=safe)
            weights = [
                os.path.relpath(os.path.join(root, name), folder)
                for root, _, names in os.walk(folder)
                for name in names
                if name.endswith((".safetensors", ".bin"))
            ]
            assert weights, "save_pretrained wrote no weight files"
            suffix = ".safetensors" if safe else ".bin"
            # transformers 5 always writes safetensors; the format is checked on diffusers models
            free_format = {name for name, c in pipe.components.items() if isinstance(c, PreTrainedModel)}
            wrong = [
                w
                for w in weights
                if ".v1." not in os.path.basename(w) or not (w.endswith(suffix) or w.split(os.sep)[0] in free_format)
            ]
            assert not wrong, f"variant='v1', safe_serialization={safe}: weight files {wrong} ignore them"
            loaded = self.pipeline_class.from_pretrained(folder, variant="v1")
            loaded.set_progress_bar_config(disable=True)
            actual = output_to_numpy(loaded(**self.get_inputs()))
            assert_outputs_close(actual, expected, self.atol, f"variant round trip (safe_serialization={safe})")
        try:
            self.pipeline_class.from_pretrained(tmp_path / "safe_True", variant="v2")
        except ValueError:
            pass
        except Exception as error:
            raise AssertionError(
                f"from_pretrained with a variant the folder lacks raised {type(error).__name__}: {error}; "
                "expected a ValueError"
            ) from error
        else:
            raise AssertionError("from_pretrained with a variant the folder lacks did not raise")

    def test_prompt_embeds_match_prompt(self):
        # diffusers' test_encode_prompt_works_in_isolation: `encode_prompt` (diffusers' signature) then
        # `prompt_embeds` / `negative_prompt_embeds` give the output of the prompt itself
        if "prompt_embeds" not in self._call_parameters():
            raise unittest.SkipTest(f"{self.pipeline_class.__name__} takes no `prompt_embeds`")
        expected_params = ("prompt", "device", "num_images_per_prompt", "do_classifier_free_guidance")
        params = inspect.signature(self.pipeline_class.encode_prompt).parameters
        missing = [name for name in (*expected_params, "negative_prompt", "prompt_embeds") if name not in params]
        assert not missing, f"{self.pipeline_class.__name__}.encode_prompt lacks diffusers' parameters {missing}"
        pipe = self.get_pipeline()
        if getattr(pipe, "text_encoder", None) is None:
            raise unittest.SkipTest(f"the dummy {self.pipeline_class.__name__} has no text encoder")
        inputs = self.get_inputs()
        prompt = inputs.pop("prompt", None) or "a small test prompt"
        negative = inputs.pop("negative_prompt", None)
        do_cfg = float(inputs.get("guidance_scale", 1.0)) > 1.0
        with_prompt = {**inputs, "prompt": prompt, **({"negative_prompt": negative} if negative else {})}
        expected = output_to_numpy(pipe(**with_prompt))
        with torch.no_grad():
            embeds = pipe.encode_prompt(prompt, torch.device("cpu"), 1, do_cfg, negative_prompt=negative)
        kwargs = {"prompt_embeds": embeds[0]}
        if "negative_prompt_embeds" in self._call_parameters() and embeds[1] is not None:
            kwargs["negative_prompt_embeds"] = embeds[1]
        call = {k: v for k, v in self.get_inputs().items() if k != "negative_prompt"}  # a fresh generator
        actual = output_to_numpy(pipe(**{**call, "prompt": None, **kwargs}))
        assert_outputs_close(actual, expected, self.atol, "prompt_embeds from encode_prompt vs the prompt")

    def test_return_dict_false_matches_output(self):
        pipe = self.get_pipeline()
        output = pipe(**self.get_inputs())
        as_tuple = pipe(**self.get_inputs(), return_dict=False)
        assert isinstance(output, BaseOutput), f"expected a BaseOutput, got {type(output).__name__}"
        assert isinstance(as_tuple, tuple), f"return_dict=False gave {type(as_tuple).__name__}, not a tuple"
        assert len(as_tuple) == len(output.to_tuple()), "the tuple and the dataclass have different lengths"
        assert_outputs_close(
            output_to_numpy(as_tuple[0]), output_to_numpy(output), self.atol, "tuple[0] vs dataclass output"
        )

    def test_same_seed_same_output_different_seed_different_output(self):
        pipe = self.get_pipeline()
        first = output_to_numpy(pipe(**self.get_inputs(seed=0)))
        again = output_to_numpy(pipe(**self.get_inputs(seed=0)))
        other = output_to_numpy(pipe(**self.get_inputs(seed=0, generator=torch.Generator("cpu").manual_seed(1))))
        assert_outputs_close(again, first, self.atol, "two runs with the same seed")
        assert outputs_differ(other, first, 1e-4), "generator seeds 0 and 1 gave the same output"

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
        assert outputs_differ(edited, baseline, 1e-4), f"zeroing `{name}` in the callback did not change the output"

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
                assert_outputs_close(
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
                assert_outputs_close(
                    output_to_numpy(results["text"]), output_to_numpy(results["seq"]), 0, "'text' vs 'seq' token ids"
                )
        if "dense" in results:
            edges = results["dense"]
            assert isinstance(edges, torch.Tensor) and edges.ndim == 3 and edges.shape[1] == edges.shape[2], (
                "'dense' must give a (batch, num_nodes, num_nodes) tensor of edge classes"
            )
            assert not edges.is_floating_point() and torch.equal(edges, edges.transpose(1, 2)), (
                "'dense' edge classes must be a symmetric integer tensor"
            )
        if "networkx" in results:
            graphs = results["networkx"]
            assert isinstance(graphs, list) and all(hasattr(g, "number_of_edges") for g in graphs), (
                "'networkx' must give a list of networkx graphs"
            )
            if "dense" in results:
                dense = results["dense"]
                assert len(graphs) == dense.shape[0], "'networkx' and 'dense' give different batch sizes"
                edges = [int((dense[b] > 0).sum()) // 2 for b in range(dense.shape[0])]
                assert [g.number_of_edges() for g in graphs] == edges, "'networkx' and 'dense' edge counts differ"
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
