"""The demo's figures are laid out for the width the report shows them at (diffusers_ext/demo/plots.py)."""

import numpy as np
import pytest
from PIL import Image

from diffusers_ext.demo.plots import DISPLAY_WIDTH, MIN_TEXT_PX, pyplot, save_bar_plot, save_figure, save_image_grid


def _displayed(path):
    with Image.open(path) as png:
        return png.size, float(png.text["displayed_min_text_px"]), int(png.text["texts_outside_figure"])


@pytest.mark.parametrize(
    "shape, rows, labels",
    [
        ((16, 8, 24, 1), 4, ["divide_and_denoise", "averaging", "multidiffusion", "multidiffusion_oracle"]),
        ((36, 32, 32, 3), 6, ["ground truth", "baseline", "none", "warped", "iterative", "warped+iterative"]),
        ((100, 8, 8, 1), 10, [str(c) for c in range(10)]),
        ((2 * 40, 32, 32, 3), 2, ["real render", "mosaic-t2i"]),  # wider than the display at scale 1
    ],
)
def test_image_grids_fit_the_display_with_readable_unclipped_labels(tmp_path, shape, rows, labels):
    path = tmp_path / "grid.png"
    save_image_grid(np.random.default_rng(0).random(shape, dtype=np.float32), str(path), rows=rows, row_labels=labels)
    (width, _), text_px, outside = _displayed(path)
    assert outside == 0 and text_px >= MIN_TEXT_PX
    n, h, w, _ = shape
    grid_width = (n // rows) * (w + 1) + 1
    if grid_width * 2 < DISPLAY_WIDTH:
        assert width <= DISPLAY_WIDTH and width >= 2 * grid_width  # upscaled, and not past the display width


def test_save_figure_measures_what_the_page_shows(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(20, 2), dpi=100)  # 2000 px wide: shown at half size
    ax.set_title("title", fontsize=10)  # 13.9 file px -> 6.9 displayed px
    fig.tight_layout()
    fig.text(1.2, 0.5, "off the edge")
    save_figure(fig, str(tmp_path / "wide.png"))
    _, text_px, outside = _displayed(tmp_path / "wide.png")
    assert text_px == pytest.approx(10 * 100 / 72 * DISPLAY_WIDTH / 2000, abs=0.01)
    assert outside == 1
    save_bar_plot({"a": 1.0, "b": 0.5}, str(tmp_path / "bars.png"), "t", "y")
    _, text_px, outside = _displayed(tmp_path / "bars.png")
    assert text_px >= MIN_TEXT_PX and outside == 0


def test_row_labels_must_match_the_rows(tmp_path):
    with pytest.raises(ValueError, match="`row_labels` has 3 labels for 2 rows"):
        save_image_grid(
            np.zeros((4, 8, 8, 1), np.float32), str(tmp_path / "g.png"), rows=2, row_labels=["a", "b", "c"]
        )
