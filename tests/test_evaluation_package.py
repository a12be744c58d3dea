"""diffusers_ext.evaluation: lazy like the top-level API, and its saveable models resolve under the package name."""

import importlib
import os
import subprocess
import sys

import pytest
import torch

import diffusers_ext
from diffusers_ext import evaluation
from diffusers_ext.loading import resolve_model_class


def test_import_loads_no_torch():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = "import sys, diffusers_ext.evaluation; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "False"


def test_every_evaluation_name_resolves():
    for module_name, names in evaluation._import_structure.items():
        module = importlib.import_module(f"diffusers_ext.evaluation.{module_name}")
        for name in names:
            assert getattr(evaluation, name) is getattr(module, name)


def test_evaluation_names_are_not_in_the_user_api():
    public = {name for names in diffusers_ext._import_structure.values() for name in names}
    measuring = {name for names in evaluation._import_structure.values() for name in names}
    assert public.isdisjoint(measuring), sorted(public & measuring)


def test_saved_component_names_resolve_in_the_api_then_in_evaluation():
    assert resolve_model_class("diffusers_ext", "WindowedDenoiser") is diffusers_ext.WindowedDenoiser
    assert resolve_model_class("diffusers_ext", "EmpiricalOptimalDenoiser") is evaluation.EmpiricalOptimalDenoiser
    assert resolve_model_class("diffusers", "UNet2DModel").__name__ == "UNet2DModel"
    with pytest.raises(ValueError, match="'NoSuchModel' is not a class of 'diffusers_ext'"):
        resolve_model_class("diffusers_ext", "NoSuchModel")
    with pytest.raises(ValueError, match="library 'torch'"):
        resolve_model_class("torch", "Tensor")


def test_multi_denoiser_folder_with_an_evaluation_model_round_trips(tmp_path):
    model = diffusers_ext.MultiDenoiserModel(
        [evaluation.EmpiricalOptimalDenoiser.from_templates(torch.ones(2, 1, 4, 4))]
    )
    model.save_pretrained(tmp_path)
    loaded = diffusers_ext.MultiDenoiserModel.from_pretrained(tmp_path)
    assert type(loaded[0]) is evaluation.EmpiricalOptimalDenoiser
    assert loaded.config.denoiser_classes == [["diffusers_ext", "EmpiricalOptimalDenoiser"]]
