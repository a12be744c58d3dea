"""The addition-mdm zoo entry: loads as a DiffusionLMPipeline and is as good as its card says on the test split."""

import os

import pytest
import torch

from diffusers_ext import DiffusionLMPipeline, SOARScheduler, zoo
from diffusers_ext.data.addition import AdditionTokens, addition_pairs, draw_test_problems


def test_split_is_fixed_and_disjoint():
    train, test = addition_pairs("train"), addition_pairs("test")
    assert len(train) + len(test) == 1000**2 and 0.005 < len(test) / 1e6 < 0.015
    as_index = lambda pairs: set((pairs[:, 0] * 1000 + pairs[:, 1]).tolist())  # noqa: E731
    assert not as_index(train) & as_index(test)
    assert torch.equal(draw_test_problems(5, seed=3), draw_test_problems(5, seed=3))


@pytest.mark.support_cell("diffusion_lm", "pack")
def test_zoo_model_decodes_addition_well_but_not_perfectly():
    pipe = zoo.load("addition-mdm")
    assert isinstance(pipe, DiffusionLMPipeline) and isinstance(pipe.scheduler, SOARScheduler)
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = SOARScheduler(block_length=8)  # greedy low-confidence, one token per step
    encoder = AdditionTokens(pipe.tokenizer)
    pairs = draw_test_problems(200, seed=0)
    out = pipe(input_ids=encoder.prompts(pairs), gen_length=8, eos_early_stop=False, output_type="text")
    accuracy = (out.sequences == encoder.answers(pairs)).all(1).float().mean().item()
    assert 0.5 <= accuracy < 0.95, accuracy
    a, b = pairs[0].tolist()
    if bool((out.sequences[0] == encoder.answers(pairs[:1])[0]).all()):
        assert out.texts[0] == f"{a + b:04d}"


def test_card_states_the_command_and_the_folder_is_small():
    folder = zoo.path("addition-mdm")
    card = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    assert "training/train_masked_lm.py" in card and "--output_dir diffusers_ext/zoo/addition-mdm" in card
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, files in os.walk(folder) for f in files)
    assert size < 8 * 2**20


def test_sudoku_zoo_model_solves_held_out_puzzles_often_but_not_always():
    from diffusers_ext.data.sudoku import SudokuTokens, sudoku_problems

    pipe = zoo.load("sudoku-mdm")
    pipe.model.to(torch.float32)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.scheduler.config.confidence_threshold == 0.95 and pipe.scheduler.config.max_parallel_tokens == 5
    encoder = SudokuTokens(pipe.tokenizer)
    puzzles, _ = sudoku_problems(24, "validation", seed=7, min_givens=17)
    pipe.scheduler = SOARScheduler(block_length=36)  # greedy, one token per step
    out = pipe(input_ids=encoder.prompts(puzzles), gen_length=36, eos_early_stop=False, output_type="seq")
    solved = encoder.solved(out.sequences, puzzles).float().mean().item()
    assert 0.5 <= solved <= 1.0, solved


def test_sudoku_card_states_the_command_and_the_folder_is_under_1mb():
    folder = zoo.path("sudoku-mdm")
    card = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    assert "training/train_masked_lm.py --task sudoku" in card and "--output_dir diffusers_ext/zoo/sudoku-mdm" in card
    size = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(("checkpoint-", "logs"))]  # git-ignored rebuild leftovers
        size += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    assert size < 2**20
