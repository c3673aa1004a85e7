"""No paper figure prints text over text at its default size, on inputs shaped like the default
run's (tests/figure_inputs.py, ``default_*``: the figures two readers returned in issue 52), and
the check finds an overlap where there is one. Also the figure fixes a reader asked for that
are not about layout: Figure 4's gate reach and unit, Figure 3's caption outside the image,
Figure 2's notes, intervals with a missing end."""

from itertools import combinations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from endoexplain_core import presentation  # noqa: E402
from endoexplain_core.analysis import validity_gate  # noqa: E402
from endoexplain_core.figures import calibration_figures, case_figures, style  # noqa: E402
from tests import figure_inputs as inputs  # noqa: E402
from tests.test_figures import _text_objects  # noqa: E402  (the drawn texts and their boxes)

NOT_VALIDATED = ("xgradcam", "hirescam")
TOLERANCE_PIXELS = 1.0     # boxes may touch; more than a pixel in both directions is an overlap


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes overlap by more than ``TOLERANCE_PIXELS`` both ways, after
    drawing ``fig`` at its own size (empty, invisible and undrawn tick labels left out)."""
    fig.canvas.draw()
    boxes = [(text.get_text(), box) for text, box in _text_objects(fig)]
    return [(first, second) for (first, a), (second, b) in combinations(boxes, 2)
            if min(a.x1, b.x1) - max(a.x0, b.x0) > TOLERANCE_PIXELS
            and min(a.y1, b.y1) - max(a.y0, b.y0) > TOLERANCE_PIXELS]


def _default_like_figures() -> dict:
    style.apply()
    two_rows = inputs.figure3_rows(64)
    two_rows = [*two_rows, {**two_rows[0], "role": "consensus"}]
    return {
        "figure2": calibration_figures.figure2_calibration_threshold(
            inputs.default_reliability_table(), inputs.default_threshold_table(), not_validated=NOT_VALIDATED,
            score_threshold=0.90, ece_intervals=inputs.default_ece_intervals()),
        "figure_s2": calibration_figures.plot_reliability_with_counts(inputs.default_reliability_table(),
                                                                      inputs.default_ece_intervals()),
        "figure3": case_figures.draw_figure3(two_rows, top_fraction=0.2, not_validated=NOT_VALIDATED),
        "figure4": case_figures.figure4(inputs.default_robustness_table(), n_images=286,
                                        not_validated=NOT_VALIDATED, gated_arch="efficientnet_b0"),
    }


@pytest.fixture(scope="module")
def default_like():
    rendered = _default_like_figures()
    yield rendered
    for fig in rendered.values():
        plt.close(fig)


@pytest.mark.parametrize("name", ["figure2", "figure_s2", "figure3", "figure4"])
def test_no_text_overlaps_on_default_run_like_inputs(default_like, name):
    assert not overlapping_texts(default_like[name]), name


def test_the_overlap_check_fails_on_a_figure_with_colliding_labels():
    """The check can fail: the old Figure 2's "n=110n=110n=109n=95" (counts annotated above a
    narrow panel) and an axis label under a note are both found."""
    fig, ax = plt.subplots(figsize=(1.6, 2.0))
    ax.set_xlim(0.7, 1.0)
    for threshold, n in ((0.80, 110), (0.85, 110), (0.90, 109), (0.95, 95)):
        ax.annotate(f"n={n}", (threshold, 1.0), xycoords=("data", "axes fraction"), ha="center", fontsize=7)
    ax.set_xlabel("Temperature-scaled score threshold")
    ax.text(0.5, -0.12, "a note over the axis label", transform=ax.transAxes, ha="center")
    found = overlapping_texts(fig)
    plt.close(fig)
    assert ("n=110", "n=110") in found
    assert any("note" in first + second for first, second in found)


def test_figure2_has_no_note_on_layercam_and_its_caption_keeps_the_intervals():
    caption = calibration_figures.figure2_caption(inputs.default_reliability_table(),
                                                  inputs.default_threshold_table(), inputs.default_ece_intervals())
    assert "95% CI 0.031 to 0.094" in caption and "change after scaling -0.013" in caption
    assert "LayerCAM" not in style.without_layercam(validity_gate.FIGURE_GATE_NOTE)
    assert "reference maps are not tested" in style.without_layercam(validity_gate.FIGURE_GATE_NOTE)


def test_figure4_marks_the_gate_only_at_the_architecture_it_ran_at(default_like):
    fig = default_like["figure4"]
    legend = [t.get_text().replace("\n", " ") for t in fig.axes[2].get_legend().get_texts()]
    not_gated = [label for label in legend if case_figures.NOT_GATED in label]
    assert {label.split(" (")[0] for label in not_gated} == {"ResNet-18", "MobileNetV3-Large"}
    assert any(label.startswith("EfficientNet-B0") and "gated here" in label for label in legend)
    note = fig._supxlabel.get_text().replace("\n", " ")
    assert "the only architecture it ran at" in note and "0.05\u20130.87" in note


def test_figure4_shows_the_baselines_in_a_and_b_and_one_key_marker_per_architecture(default_like):
    fig = default_like["figure4"]
    for ax in fig.axes[:2]:
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert {"Random", "Centre", "Salience"} <= set(labels)
    legend = fig.axes[2].get_legend()
    keys = dict(zip([t.get_text() for t in legend.get_texts()], legend.legend_handles))
    random_key = keys[case_figures.RANDOM_DELETION_LABEL]
    # the random-deletion control is drawn with three markers: its key shows three
    markers = {line.get_marker() for line in fig.axes[2].lines
               if line.get_label() == case_figures.RANDOM_DELETION_LABEL}
    assert len(markers) == 3
    assert len(legend.get_lines()) >= 1 and random_key is not None


def test_figure4_panel_c_is_on_the_temperature_scaled_logit():
    table = inputs.default_robustness_table()
    fig = case_figures.figure4(table, n_images=286)
    cams = table[table["method"] == "gradcam"]
    drawn = [line for line in fig.axes[2].lines if line.get_marker() == "." and len(line.get_ydata())]
    expected = sorted(cams["logit_drop_all"] / cams["temperature"])
    assert sorted(v for line in drawn for v in [line.get_ydata()[0]]) == pytest.approx(expected)
    assert "z/T" in fig.axes[2].get_ylabel()
    raw = case_figures.figure4(table.drop(columns="temperature"), n_images=286)
    assert "raw logits" in raw.axes[2].get_ylabel()
    plt.close(fig)
    plt.close(raw)


def test_figure3_caption_is_outside_the_image_and_names_the_cases(default_like):
    text = " ".join(t.get_text() for t in default_like["figure3"].findobj(Text))
    assert "Cyan: lesion contour" not in text
    caption = case_figures.figure3_caption({"miss": None, "discordant": "abc", "consensus": "def"},
                                           top_fraction=0.2)
    assert "B = abc; C = def" in caption and "tied" in caption and "Salience" in caption


def test_tied_maxima_are_all_marked_and_counted():
    flat_top = np.zeros((8, 8))
    flat_top[2, 3:6] = 1.0
    assert case_figures._tied_maxima(flat_top).tolist() == [[2, 3], [2, 4], [2, 5]]
    info = {"iou": 0.2, "constant_map": False, "peak_outside_mask": True, "distance": 3.0}
    assert case_figures._panel_note(info, 3) == "IoU 0.20\nout 3 px\n3 tied peaks"
    assert case_figures._panel_note(info, 1) == "IoU 0.20\nout 3 px"


def test_an_interval_with_a_missing_end_prints_n_a_never_empty_brackets():
    assert presentation.estimate_with_ci(0.004, float("nan"), float("nan")) == "0.004 (CI n/a)"
    table = pd.DataFrame({"source": ["a"], "mean_scaled_score": [0.183], "mean_scaled_score_ci_low": [np.nan],
                          "mean_scaled_score_ci_high": [np.nan]})
    assert "( to )" not in presentation.final_table(table, 3).to_string()
