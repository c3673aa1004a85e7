"""Issue 50, items 4 and 5: text from data is drawn as written, and ``--check`` probes what it
used to take on trust (weights files, the scheduler, list lengths, long names, unreadable roots,
an output root inside the data root). Each case failed on c4591d0."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from endoexplain_core.figures import case_figures  # noqa: E402
from endoexplain_core.methods import CAM_METHODS  # noqa: E402

MATH_NAMES = ("price $5 and $6.png", r"math_$\alpha^{$.png", r"back\slash $x$ \$.png")


def _drawn_case(role: str, sample_id: str) -> dict:
    """One Figure 3 row in ``draw_figure3``'s format, from fixed arrays."""
    rng = np.random.default_rng(0)
    mask = np.zeros((16, 16), dtype=bool)
    mask[4:10, 4:10] = True
    return {"role": role, "sample_id": sample_id, "score": 0.95, "rgb": rng.random((16, 16, 3)),
            "mask": mask, "maps": {m: rng.random((16, 16)) for m in CAM_METHODS},
            "rows": {m: {"iou": 0.5, "constant_map": False, "peak_outside_mask": True, "distance": 3.0}
                     for m in CAM_METHODS}}


def _drawn_strings(fig) -> list[tuple[str, bool]]:
    """(the string Matplotlib draws, whether as mathtext) for every Text of ``fig``, after
    drawing it (a mathtext error would raise here)."""
    fig.canvas.draw()
    return [text._preprocess_math(text.get_text()) for text in fig.findobj(matplotlib.text.Text)]


@pytest.mark.parametrize("name", MATH_NAMES)
def test_a_case_named_with_dollars_and_backslashes_is_drawn_as_written(name):
    """Before: "price $5 and $6.png" drawn as mathtext ("price 5*and*6"), and
    "math_$\\alpha^{$.png" stopped the figure with a mathtext error."""
    fig = case_figures.draw_figure3([_drawn_case("miss", name), _drawn_case("consensus", "plain.png")],
                                    top_fraction=0.2)
    drawn = _drawn_strings(fig)
    naming = [(shown, is_math) for shown, is_math in drawn if "plain.png" in shown]
    assert len(naming) == 1, drawn                                  # the footer lists the cases
    shown, is_math = naming[0]
    assert not is_math and f"A = {name}" in shown.replace("\n", " ")


def test_data_in_panel_titles_and_tick_labels_is_drawn_as_written():
    """A panel title (bold mathtext letter + text) and a forest plot's tick labels that carry a
    name from data: before, the title stopped the figure with a mathtext error and the tick
    label was drawn as math."""
    import matplotlib.pyplot as plt

    from endoexplain_core.figures import faithfulness_figures, style

    fig, (titled, forest) = plt.subplots(1, 2)
    style.panel_title(titled, "A", MATH_NAMES[1])
    faithfulness_figures._forest(forest, [MATH_NAMES[0]], [0.1], [0.0], [0.2], ["black"])
    drawn = _drawn_strings(fig)
    # after the bold letter (mathtext) the name's dollars are escaped: drawn as written
    assert (r"$\mathbf{A}$  " + style.as_written(MATH_NAMES[1]), True) in drawn
    assert (MATH_NAMES[0], False) in drawn
    plt.close(fig)
