"""Image grids and small plots for the demo report (matplotlib, Agg backend)."""

import numpy as np


def save_image_grid(images: np.ndarray, path: str, rows: int, scale: int = 4, row_labels: list[str] | None = None):
    r"""
    Save `images` as one PNG grid.

    Args:
        images (`np.ndarray` of shape `(N, H, W, C)`): values in [0, 1]; `N` must be a multiple of `rows`.
        path (`str`): output PNG file.
        rows (`int`): number of grid rows (images fill the grid row by row).
        scale (`int`, defaults to 4): nearest-neighbour upscaling so small images stay visible.
        row_labels (`list[str]`, *optional*): a label drawn left of each row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, h, w, c = images.shape
    if n % rows:
        raise ValueError(f"`images` has {n} images, not a multiple of `rows` {rows}.")
    cols = n // rows
    pad = 1
    grid = np.ones((rows * (h + pad) + pad, cols * (w + pad) + pad, c), dtype=np.float32)
    for i, image in enumerate(images):
        r, k = divmod(i, cols)
        grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + k * (w + pad) : pad + k * (w + pad) + w] = image
    grid = np.kron(grid, np.ones((scale, scale, 1), dtype=np.float32))
    fig, ax = plt.subplots(figsize=(max(2.0, grid.shape[1] / 60), max(2.0, grid.shape[0] / 60)), dpi=80)
    ax.imshow(grid.squeeze(-1) if c == 1 else grid, cmap="gray" if c == 1 else None, vmin=0, vmax=1)
    ax.set_xticks([])
    if row_labels:
        ax.set_yticks([(pad + r * (h + pad) + h / 2) * scale for r in range(rows)], row_labels)
    else:
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def save_bar_plot(values: dict[str, float], path: str, title: str, ylabel: str, reference: float | None = None):
    """Save a bar chart of `values` (label -> value), with an optional dashed reference line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    ax.bar(list(values), list(values.values()), color="#4a78b5")
    if reference is not None:
        ax.axhline(reference, color="#c33", linestyle="--", linewidth=1)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def save_confusion_matrix(matrix: np.ndarray, path: str, title: str):
    """Save a confusion matrix (rows: conditioning class, columns: classifier verdict) as a heat map."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 3.6), dpi=100)
    ax.imshow(matrix, cmap="Blues")
    for (i, j), v in np.ndenumerate(matrix):
        if v:
            ax.text(j, i, int(v), ha="center", va="center", fontsize=7, color="white" if v > matrix.max() / 2 else "k")
    ax.set_xlabel("classifier verdict")
    ax.set_ylabel("conditioning class")
    ax.set_xticks(range(matrix.shape[1]))
    ax.set_yticks(range(matrix.shape[0]))
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
