"""Image grids and small plots for the demo report (matplotlib, Agg backend).

Every figure is laid out for the width at which the report shows it (`DISPLAY_WIDTH`, the page's largest image
width): an image grid is upscaled by the largest whole factor that fits, and text is sized so that it is at least
`MIN_TEXT_PX` pixels tall once the browser has shrunk a wider figure. `save_figure` measures what was drawn and
stores the result in the PNG's text chunks (`displayed_min_text_px`, `texts_outside_figure`), so that the report's
figures can be checked at their displayed size (tests/test_demo_report.py).
"""

import numpy as np


#: widest an image is shown in the report, in CSS pixels (report.STYLE uses it)
DISPLAY_WIDTH = 1000
#: smallest font size, in displayed pixels, of any text in a figure
MIN_TEXT_PX = 11
_DPI = 100


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str):
    """Save `fig` as PNG, with the displayed size of its smallest text and the number of texts it clips.

    The displayed size is the font size in the file's pixels times the factor by which the report shrinks a figure
    wider than `DISPLAY_WIDTH`; an axes (with its tick labels, labels and title) or a figure text counts as clipped
    when what is drawn of it leaves the figure.
    """
    plt = pyplot()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width_px, height_px = fig.get_size_inches() * fig.dpi
    shrink = min(1.0, DISPLAY_WIDTH / width_px)

    def leaves_figure(box) -> bool:
        return box.x0 < -0.5 or box.y0 < -0.5 or box.x1 > width_px + 0.5 or box.y1 > height_px + 0.5

    sizes = [
        text.get_fontsize() * fig.dpi / 72 * shrink
        for text in fig.findobj(lambda artist: hasattr(artist, "get_fontsize") and hasattr(artist, "get_text"))
        if text.get_visible() and text.get_text().strip()
    ]
    # What is drawn: each axes' tight box (its tick labels in view, labels, title, legend) and the figure's texts.
    outside = sum(leaves_figure(ax.get_tightbbox(renderer)) for ax in fig.axes if ax.get_visible())
    outside += sum(leaves_figure(t.get_window_extent(renderer)) for t in fig.texts if t.get_text().strip())
    metadata = {
        "displayed_min_text_px": f"{min(sizes):.2f}" if sizes else "",
        "texts_outside_figure": str(outside),
    }
    fig.savefig(path, metadata=metadata)
    plt.close(fig)


def save_image_grid(
    images: np.ndarray, path: str, rows: int, scale: int | None = None, row_labels: list[str] | None = None
):
    r"""
    Save `images` as one PNG grid, laid out for the report's display width.

    Args:
        images (`np.ndarray` of shape `(N, H, W, C)`): values in [0, 1]; `N` must be a multiple of `rows`.
        path (`str`): output PNG file.
        rows (`int`): number of grid rows (images fill the grid row by row).
        scale (`int`, *optional*): nearest-neighbour upscaling; by default the largest factor (at most 8) at which the
            grid and its labels fit `DISPLAY_WIDTH`.
        row_labels (`list[str]`, *optional*): a label drawn left of each row.
    """
    plt = pyplot()
    n, h, w, c = images.shape
    if n % rows:
        raise ValueError(f"`images` has {n} images, not a multiple of `rows` {rows}.")
    if row_labels is not None and len(row_labels) != rows:
        raise ValueError(f"`row_labels` has {len(row_labels)} labels for {rows} rows.")
    cols = n // rows
    pad = 1
    grid = np.ones((rows * (h + pad) + pad, cols * (w + pad) + pad, c), dtype=np.float32)
    for i, image in enumerate(images):
        r, k = divmod(i, cols)
        grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + k * (w + pad) : pad + k * (w + pad) + w] = image

    fig = plt.figure(dpi=_DPI)
    font_px = MIN_TEXT_PX + 1
    margin = 0.0
    if row_labels:
        # The labels' width at the displayed font size, measured by the renderer.
        renderer = fig.canvas.get_renderer()
        probe = [fig.text(0, 0, label, fontsize=font_px * 72 / _DPI) for label in row_labels]
        margin = max(t.get_window_extent(renderer).width for t in probe) + font_px
        for t in probe:
            t.remove()
    if scale is None:
        scale = int(max(1, min(8, (DISPLAY_WIDTH - margin) // grid.shape[1])))
    grid = np.kron(grid, np.ones((scale, scale, 1), dtype=np.float32))
    # A grid wider than the display is shrunk by the browser: enlarge the labels (and their margin) to match.
    grow = max(1.0, (margin + grid.shape[1]) / DISPLAY_WIDTH)
    font_px, margin = font_px * grow, margin * grow
    width, height = margin + grid.shape[1], float(grid.shape[0])
    fig.set_size_inches(width / _DPI, height / _DPI)
    ax = fig.add_axes((margin / width, 0.0, grid.shape[1] / width, 1.0))
    ax.imshow(grid.squeeze(-1) if c == 1 else grid, cmap="gray" if c == 1 else None, vmin=0, vmax=1)
    ax.set_axis_off()
    for r, label in enumerate(row_labels or []):
        centre = 1.0 - (pad + r * (h + pad) + h / 2) * scale / height
        fig.text((margin - font_px / 2) / width, centre, label, ha="right", va="center", fontsize=font_px * 72 / _DPI)
    save_figure(fig, path)


def save_bar_plot(values: dict[str, float], path: str, title: str, ylabel: str, reference: float | None = None):
    """Save a bar chart of `values` (label -> value), with an optional dashed reference line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    ax.bar(list(values), list(values.values()), color="#4a78b5")
    if reference is not None:
        ax.axhline(reference, color="#c33", linestyle="--", linewidth=1)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    save_figure(fig, path)


def save_confusion_matrix(matrix: np.ndarray, path: str, title: str):
    """Save a confusion matrix (rows: conditioning class, columns: classifier verdict) as a heat map."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 3.6), dpi=100)
    ax.imshow(matrix, cmap="Blues")
    for (i, j), v in np.ndenumerate(matrix):
        if v:
            ax.text(j, i, int(v), ha="center", va="center", fontsize=8, color="white" if v > matrix.max() / 2 else "k")
    ax.set_xlabel("classifier verdict")
    ax.set_ylabel("conditioning class")
    ax.set_xticks(range(matrix.shape[1]))
    ax.set_yticks(range(matrix.shape[0]))
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path)
