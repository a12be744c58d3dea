"""6x6 sudoku completion: a task where decoding order matters and a wrong commit shows up in the model's confidence.

A 6x6 grid holds the digits 1-6 once in every row, every column and every 2x3 box. A puzzle keeps some cells of a
grid (the givens) and blanks the others (written `0`); puzzles made by [`make_puzzle`] have exactly one solution.
A masked diffusion LM reads the puzzle as its prompt and writes the whole solved grid: the blanks that the givens
pin down are easy, the others only become easy once the right cells around them are filled, so the order in which
cells are committed decides whether the grid comes out right.

Splits are by solution grid: a grid belongs to `"validation"` or `"test"` when a hash of its digits falls in a
small range ([`grid_split`]); training grids come from the same random generator with those grids rejected, so no
held-out puzzle's solution is ever trained on.
"""

import random

import torch

from ..utils import check_positive_int


SIZE = 6
BOX_ROWS, BOX_COLS = 2, 3
NUM_CELLS = SIZE * SIZE
SPLITS = ("train", "validation", "test")
_HASH_MULTIPLIER = 2654435761
# per mille of all grids in each held-out split
HELD_OUT_PER_MILLE = {"validation": 20, "test": 20}


def _peers() -> list[list[int]]:
    peers = []
    for cell in range(NUM_CELLS):
        r, c = divmod(cell, SIZE)
        box = (r // BOX_ROWS, c // BOX_COLS)
        peers.append(
            [
                other
                for other in range(NUM_CELLS)
                if other != cell
                and (
                    other // SIZE == r
                    or other % SIZE == c
                    or ((other // SIZE) // BOX_ROWS, (other % SIZE) // BOX_COLS) == box
                )
            ]
        )
    return peers


PEERS = _peers()


def is_valid_grid(grid) -> bool:
    """Whether a 36-cell grid (digits 1-6, row-major) is a solved sudoku."""
    cells = list(grid)
    if len(cells) != NUM_CELLS or any(v not in range(1, SIZE + 1) for v in cells):
        return False
    return all(cells[cell] != cells[other] for cell in range(NUM_CELLS) for other in PEERS[cell])


def grid_split(grid) -> str:
    """The split a solved grid belongs to, from a multiplicative hash of its digits."""
    value = 0
    for v in grid:
        value = (value * 7 + int(v)) % (2**61 - 1)
    bucket = (value * _HASH_MULTIPLIER) % 1000
    if bucket < HELD_OUT_PER_MILLE["validation"]:
        return "validation"
    if bucket < HELD_OUT_PER_MILLE["validation"] + HELD_OUT_PER_MILLE["test"]:
        return "test"
    return "train"


def _candidates(cells: list[int], cell: int) -> list[int]:
    used = {cells[p] for p in PEERS[cell]}
    return [v for v in range(1, SIZE + 1) if v not in used]


def _fill(cells: list[int], rng: random.Random) -> bool:
    """Fill the blanks of `cells` in place with a random solution (most constrained blank first)."""
    best, best_options = None, None
    for cell in range(NUM_CELLS):
        if cells[cell] == 0:
            options = _candidates(cells, cell)
            if best_options is None or len(options) < len(best_options):
                best, best_options = cell, options
                if len(options) <= 1:
                    break
    if best is None:
        return True
    rng.shuffle(best_options)
    for value in best_options:
        cells[best] = value
        if _fill(cells, rng):
            return True
    cells[best] = 0
    return False


def count_solutions(puzzle, limit: int = 2) -> int:
    """Solutions of a puzzle (0 = blank), counted up to `limit`."""
    cells = list(puzzle)

    def search() -> int:
        best, best_options = None, None
        for cell in range(NUM_CELLS):
            if cells[cell] == 0:
                options = _candidates(cells, cell)
                if not options:
                    return 0
                if best_options is None or len(options) < len(best_options):
                    best, best_options = cell, options
        if best is None:
            return 1
        found = 0
        for value in best_options:
            cells[best] = value
            found += search()
            if found >= limit:
                break
        cells[best] = 0
        return found

    return search()


def random_grid(rng: random.Random) -> list[int]:
    """A random solved grid (row-major digits 1-6)."""
    cells = [0] * NUM_CELLS
    _fill(cells, rng)
    return cells


def random_grids(num_grids: int, split: str, seed: int) -> torch.LongTensor:
    """`num_grids` random solved grids of `split`, shape `(num_grids, 36)`, a function of `seed` alone."""
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    check_positive_int("num_grids", num_grids, minimum=0)
    rng = random.Random(f"sudoku-{split}-{seed}")
    grids = []
    while len(grids) < num_grids:
        grid = random_grid(rng)
        if grid_split(grid) == split:
            grids.append(grid)
    return torch.tensor(grids, dtype=torch.long).reshape(num_grids, NUM_CELLS)


def make_puzzle(grid, rng: random.Random, min_givens: int = 0) -> list[int]:
    """Blank the cells of `grid` in a random order, keeping each blank only while the solution stays unique.

    Stops at `min_givens` givens; with 0 the result is a minimal puzzle (no given can be removed).
    """
    puzzle = list(grid)
    order = list(range(NUM_CELLS))
    rng.shuffle(order)
    givens = NUM_CELLS
    for cell in order:
        if givens <= min_givens:
            break
        value, puzzle[cell] = puzzle[cell], 0
        if count_solutions(puzzle, 2) == 1:
            givens -= 1
        else:
            puzzle[cell] = value
    return puzzle


def sudoku_problems(num_problems: int, split: str, seed: int = 0, min_givens: int = 0):
    """Held-out style problems: `(puzzles, solutions)`, each `(num_problems, 36)`; puzzles have unique solutions.

    Args:
        num_problems (`int`): how many.
        split (`str`): `"train"`, `"validation"` or `"test"`: the split of the solution grids.
        seed (`int`, defaults to 0): the draw.
        min_givens (`int`, defaults to 0): stop blanking at this many givens (0: minimal puzzles).
    """
    solutions = random_grids(num_problems, split, seed)
    rng = random.Random(f"sudoku-puzzle-{split}-{seed}")
    puzzles = torch.tensor([make_puzzle(g.tolist(), rng, min_givens) for g in solutions], dtype=torch.long)
    return puzzles.reshape(num_problems, NUM_CELLS), solutions


def augment_grids(grids: torch.LongTensor, generator: torch.Generator) -> torch.LongTensor:
    """Validity-preserving random symmetries of solved grids `(n, 36)`: a relabelling of the digits, a permutation of
    the row bands and of the rows in each band, of the column stacks and of the columns in each stack. A result
    that falls in a held-out split is replaced by its (training) source grid."""
    n = grids.shape[0]
    relabel = torch.cat(
        [torch.zeros(n, 1, dtype=torch.long), torch.rand(n, SIZE, generator=generator).argsort(1) + 1], 1
    )
    out = relabel.gather(1, grids)
    bands, stacks = SIZE // BOX_ROWS, SIZE // BOX_COLS
    band_order = torch.rand(n, bands, generator=generator).argsort(1)
    in_band = torch.rand(n, bands, BOX_ROWS, generator=generator).argsort(2)
    rows = (band_order.unsqueeze(2) * BOX_ROWS + in_band).reshape(n, SIZE)
    stack_order = torch.rand(n, stacks, generator=generator).argsort(1)
    in_stack = torch.rand(n, stacks, BOX_COLS, generator=generator).argsort(2)
    cols = (stack_order.unsqueeze(2) * BOX_COLS + in_stack).reshape(n, SIZE)
    index = (rows.unsqueeze(2) * SIZE + cols.unsqueeze(1)).reshape(n, NUM_CELLS)
    out = out.gather(1, index)
    held_out = torch.tensor([grid_split(g) != "train" for g in out.tolist()], dtype=torch.bool)
    return torch.where(held_out.unsqueeze(1), grids, out)


def random_givens(solutions: torch.LongTensor, min_givens: int, max_givens: int, generator: torch.Generator):
    """Training puzzles: each grid keeps a uniformly random number in `[min_givens, max_givens]` of random cells.

    Not checked for uniqueness (training teaches the posterior over completions); shape `(n, 36)`, 0 = blank.
    """
    n = solutions.shape[0]
    counts = torch.randint(min_givens, max_givens + 1, (n, 1), generator=generator)
    ranks = torch.rand(n, NUM_CELLS, generator=generator).argsort(1).argsort(1)
    return torch.where(ranks < counts, solutions, 0)


class SudokuTokens:
    """Token-id encoding for a tokenizer that spells each digit as one token (e.g. the byte-level tiny tokenizer).

    Prompt: `<bos>` + the 36 puzzle digits (0 = blank) + `=`; answer: the 36 solution digits (`gen_length` 36).
    """

    def __init__(self, tokenizer):
        ids = [tokenizer.convert_tokens_to_ids(c) for c in "0123456="]
        if any(i is None or i == tokenizer.unk_token_id for i in ids):
            raise ValueError("the tokenizer must have single tokens for the digits 0-6 and '='.")
        self.digit_ids = torch.tensor(ids[:7])
        self.equals_id = ids[7]
        self.bos_id = tokenizer.bos_token_id
        self.prompt_length = NUM_CELLS + 2
        self.gen_length = NUM_CELLS

    def prompts(self, puzzles: torch.LongTensor) -> torch.LongTensor:
        """`(n, 38)` prompt ids."""
        n = puzzles.shape[0]
        return torch.cat(
            [torch.full((n, 1), self.bos_id), self.digit_ids[puzzles], torch.full((n, 1), self.equals_id)], 1
        )

    def answers(self, solutions: torch.LongTensor) -> torch.LongTensor:
        """`(n, 36)` answer ids."""
        return self.digit_ids[solutions]

    def decode(self, sequences: torch.LongTensor) -> torch.LongTensor:
        """Answer ids back to digits; any token that is not a digit 1-6 becomes 0. Shape `(n, 36)`."""
        lookup = torch.zeros(int(max(self.digit_ids.max(), sequences.max())) + 1, dtype=torch.long)
        lookup[self.digit_ids[1:]] = torch.arange(1, SIZE + 1)
        return lookup[sequences.clamp(min=0)]

    def solved(self, sequences: torch.LongTensor, puzzles: torch.LongTensor) -> torch.BoolTensor:
        """Whether each decoded grid is a valid sudoku that keeps the puzzle's givens (the judge; needs no answer
        key, and for unique puzzles equals exact match)."""
        grids = self.decode(sequences)
        keeps = ((puzzles == 0) | (grids == puzzles)).all(1)
        valid = torch.tensor([is_valid_grid(g) for g in grids.tolist()], dtype=torch.bool)
        return keeps & valid
