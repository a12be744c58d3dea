"""diffusers_ext.data.sudoku: valid grids, unique puzzles, held-out splits by solution grid, the token encoding and
the judge."""

import pytest
import torch

from diffusers_ext.data.sudoku import (
    SudokuTokens,
    augment_grids,
    count_solutions,
    grid_split,
    is_valid_grid,
    random_givens,
    random_grids,
    sudoku_problems,
)
from diffusers_ext.testing import get_tiny_lm_tokenizer


def test_grids_are_valid_deterministic_and_in_their_split():
    grids = random_grids(20, "train", seed=1)
    assert torch.equal(grids, random_grids(20, "train", seed=1))
    assert all(is_valid_grid(g) and grid_split(g) == "train" for g in grids.tolist())
    held_out = random_grids(3, "test", seed=1)
    assert all(grid_split(g) == "test" for g in held_out.tolist())
    bad = grids[0].clone()
    bad[0], bad[1] = bad[1].item(), bad[0].item()
    assert not is_valid_grid(bad.tolist())
    with pytest.raises(ValueError, match="split"):
        random_grids(1, "dev", seed=0)


def test_puzzles_have_one_solution_and_keep_their_grid():
    puzzles, solutions = sudoku_problems(3, "validation", seed=0, min_givens=14)
    for puzzle, solution in zip(puzzles.tolist(), solutions.tolist()):
        assert count_solutions(puzzle) == 1 and sum(v > 0 for v in puzzle) >= 14
        assert all(p in (0, s) for p, s in zip(puzzle, solution))
    minimal = sudoku_problems(1, "validation", seed=0)[0][0].tolist()
    for cell in (i for i, v in enumerate(minimal) if v):  # no given of a minimal puzzle can be removed
        reduced = list(minimal)
        reduced[cell] = 0
        assert count_solutions(reduced) >= 2


def test_symmetries_keep_grids_valid_and_out_of_held_out_splits():
    grids = random_grids(50, "train", seed=2)
    augmented = augment_grids(grids, torch.Generator().manual_seed(0))
    assert all(is_valid_grid(g) and grid_split(g) == "train" for g in augmented.tolist())
    assert (augmented != grids).any(1).float().mean() > 0.8
    givens = random_givens(grids, 8, 12, torch.Generator().manual_seed(0))
    counts = (givens > 0).sum(1)
    assert int(counts.min()) >= 8 and int(counts.max()) <= 12 and bool(((givens == 0) | (givens == grids)).all())


def test_tokens_round_trip_and_the_judge_checks_validity_and_givens():
    encoder = SudokuTokens(get_tiny_lm_tokenizer())
    puzzles, solutions = sudoku_problems(2, "test", seed=0, min_givens=20)
    prompts, answers = encoder.prompts(puzzles), encoder.answers(solutions)
    assert prompts.shape == (2, 38) and answers.shape == (2, 36)
    assert torch.equal(encoder.decode(answers), solutions)
    assert encoder.solved(answers, puzzles).tolist() == [True, True]
    wrong = answers.clone()
    wrong[0, [0, 1]] = wrong[0, [1, 0]]  # breaks validity
    assert encoder.solved(wrong, puzzles).tolist() == [False, True]
    relabelled = encoder.answers(augment_grids(solutions, torch.Generator().manual_seed(3)))
    keeps = ((puzzles == 0) | (encoder.decode(relabelled) == puzzles)).all(1)
    assert encoder.solved(relabelled, puzzles).tolist() == keeps.tolist()  # a valid grid that drops givens fails
