"""Every paper figure rendered from small fixed inputs (tests/figure_inputs.py): no two text
boxes overlap, no axes is empty without a note saying why, and the fixes a reviewer asked for
are present (n stated, constant map labelled, missing rows explained, primary marked)."""

import re
from itertools import combinations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from endoexplain_core import marks, presentation  # noqa: E402
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS, method_label
from endoexplain_core.figures import (calibration_figures, case_figures,  # noqa: E402
                                      extended_figures, faithfulness_figures, style,
                                      training_figures, transfer_figures, workflow_figure)
from tests import figure_inputs as inputs  # noqa: E402


NOT_VALIDATED = ("xgradcam", "hirescam")   # as a run's gate would return them


def _figures():
    style.apply()
    roles = {"train": 700, "val": 150, "test": 150, "spatial_audit": 150}
    gate = pd.DataFrame({"method": [*CAM_METHODS, "random"],
                         "passes": [True, True, False, False, True, False],
                         "verdict": ["passes", "passes", "inconclusive", "fails", "passes", "fails"]})
    steps = workflow_figure.workflow_steps(roles, 10, ["Synthetic ETIS-like", "Synthetic PolypGen-like",
                                                       "Synthetic PolypDB-like"], gate=gate)
    flow = workflow_figure.exclusion_flow(roles, 147, 147, 59, 0.90)
    external = [("Synthetic ETIS-like", 193, 16), ("Synthetic PolypGen-like", 1410, 342),
                ("Synthetic PolypDB-like", 3934, 748)]
    curves, auc = inputs.iou_curves()
    methods = inputs.EXTENDED_FIGURE_METHODS
    return {
        "figure1": workflow_figure.figure1_workflow(steps, flow, external),
        "figure2": calibration_figures.figure2_calibration_threshold(inputs.reliability_table(),
                                                                     inputs.threshold_table(),
                                                                     not_validated=NOT_VALIDATED),
        "figure2_no_eligible": calibration_figures.figure2_calibration_threshold(
            inputs.reliability_table(), inputs.threshold_table().assign(n_eligible=0, failure_rate=float("nan"))),
        "figure_s2": calibration_figures.plot_reliability_with_counts(inputs.reliability_table()),
        "figure3": case_figures.draw_figure3(inputs.figure3_rows(), top_fraction=0.2, not_validated=NOT_VALIDATED),
        "figure3_nothing": case_figures.draw_figure3([], top_fraction=0.2),
        "figure4": case_figures.figure4(inputs.robustness_table(), n_images=150, not_validated=NOT_VALIDATED),
        "figure4_no_eligible": case_figures.figure4(
            inputs.robustness_table().assign(failure_own=float("nan"), failure_fixed=float("nan"), n_own=0),
            n_images=20),
        "figure5": transfer_figures.figure5_transfer(inputs.transfer_summary(), score_threshold=0.90,
                                                     top_fraction=0.2, synthetic=True,
                                                     not_validated=NOT_VALIDATED),
        "figure_s1": training_figures.plot_training_curves(inputs.training_curves(), "efficientnet_b0_s2089"),
        "road": faithfulness_figures.road_curves_figure(inputs.road_curves(), not_validated=NOT_VALIDATED),
        "srg": faithfulness_figures.srg_shape_figure(inputs.srg_table(), inputs.shape_table(),
                                                     not_validated=NOT_VALIDATED),
        "randomisation": faithfulness_figures.randomisation_figure(inputs.randomisation_table(),
                                                                   not_validated=NOT_VALIDATED),
        "subgroups": faithfulness_figures.subgroup_forest_figure(inputs.subgroup_gaps(),
                                                                 not_validated=NOT_VALIDATED),
        "iou_curves": extended_figures.iou_threshold_curves(curves, auc, not_validated=NOT_VALIDATED),
        "energy_lift": extended_figures.energy_lift_distributions(inputs.energy_table(), methods,
                                                                  not_validated=NOT_VALIDATED),
        "c_score": extended_figures.c_score_heatmap(inputs.c_scores(), methods, not_validated=NOT_VALIDATED),
        "top_k": extended_figures.top_k_sweep_figure(inputs.top_k_sweep(), not_validated=NOT_VALIDATED),
    }


FIGURES = ["figure1", "figure2", "figure2_no_eligible", "figure_s2", "figure3", "figure3_nothing",
           "figure4", "figure4_no_eligible", "figure5", "figure_s1", "road", "srg", "randomisation",
           "subgroups", "iou_curves", "energy_lift", "c_score", "top_k"]
# Figures that name CAM methods: each marks the gate's failing ones.
MARKING_FIGURES = ["figure2", "figure3", "figure4", "figure5", "road", "srg", "randomisation",
                   "subgroups", "iou_curves", "energy_lift", "c_score", "top_k"]
MULTI_PANEL = ["figure2", "figure_s2", "figure3", "figure4", "figure_s1", "road", "srg", "randomisation",
               "top_k"]


@pytest.fixture(scope="module")
def figures():
    rendered = _figures()
    for fig in rendered.values():
        fig.canvas.draw()
    yield rendered
    for fig in rendered.values():
        plt.close(fig)


def _undrawn_tick_labels(fig) -> set[int]:
    """Tick labels matplotlib keeps but does not draw (ticks outside the view limits)."""
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            span = high - low
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not low - 1e-9 * span <= tick.get_loc() <= high + 1e-9 * span:
                    hidden.update({id(tick.label1), id(tick.label2)})
    return hidden


def _text_boxes(fig):
    return [(text.get_text(), box) for text, box in _text_objects(fig)]


@pytest.mark.parametrize("name", FIGURES)
def test_no_two_text_boxes_overlap(figures, name):
    boxes = _text_boxes(figures[name])
    overlaps = []
    for (first, a), (second, b) in combinations(boxes, 2):
        width = min(a.x1, b.x1) - max(a.x0, b.x0)
        height = min(a.y1, b.y1) - max(a.y0, b.y0)
        if width > 1.0 and height > 1.0:      # more than a pixel in both directions
            overlaps.append((first, second))
    assert not overlaps, f"{name}: overlapping text {overlaps[:5]}"


def _has_data(ax) -> bool:
    return bool(ax.images or ax.patches or ax.collections
                or any(len(line.get_xdata()) for line in ax.lines))


@pytest.mark.parametrize("name", FIGURES)
def test_every_axes_has_data_or_a_note(figures, name):
    for ax in figures[name].axes:
        if ax.get_label() == "<colorbar>":
            continue
        notes = [t.get_text() for t in ax.texts if t.get_text().strip()]
        assert _has_data(ax) or notes, f"{name}: an axes has neither data nor a note"


def _printed_size(fig):
    """(width in inches of the saved, tight-cropped figure; smallest text in points at that size).
    ``save_figure`` crops to the tight box, so that is the size a journal prints; a figure wider
    than two columns is shrunk to 183 mm, and its text with it."""
    from endoexplain_core import artefacts

    renderer = fig.canvas.get_renderer()
    width = fig.get_tightbbox(renderer).width + 2 * artefacts.SAVE_PAD_INCHES   # as save_figure writes it
    scale = min(1.0, style.DOUBLE_COLUMN_INCHES / width)
    sizes = [text.get_fontsize() for text, _ in _text_objects(fig)]
    return width, min(sizes) * scale


def _text_objects(fig):
    hidden = _undrawn_tick_labels(fig)
    renderer = fig.canvas.get_renderer()
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip() or id(text) in hidden:
            continue
        if text.axes is not None and not text.axes.get_visible():
            continue
        box = text.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            yield text, box


@pytest.mark.parametrize("name", FIGURES)
def test_every_figure_prints_at_one_or_two_columns_with_no_text_under_6_pt(figures, name):
    width, smallest = _printed_size(figures[name])
    assert width <= style.DOUBLE_COLUMN_INCHES + 0.05, f"{name}: {width * 25.4:.0f} mm wide"
    assert smallest >= style.SMALLEST_TEXT_POINTS - 1e-9, f"{name}: text of {smallest:.1f} pt in print"


PANEL_LETTER = re.compile(r"^\$\\mathbf\{([A-Z])\}\$")


@pytest.mark.parametrize("name", MULTI_PANEL)
def test_panel_letters_are_bold_and_in_order(figures, name):
    letters = [match.group(1) for text, _ in _text_objects(figures[name])
               if (match := PANEL_LETTER.match(text.get_text()))]
    assert len(letters) >= 2 and letters == sorted(letters), f"{name}: panel letters {letters}"
    assert letters[0] == "A" and len(set(letters)) == len(letters)


@pytest.mark.parametrize("name", MARKING_FIGURES)
def test_figures_mark_the_methods_the_gate_does_not_validate(figures, name):
    text = " ".join(t.get_text().replace("\n", "") for t, _ in _text_objects(figures[name]))
    marked = {label for label in ("XGrad-CAM\u2020", "HiResCAM\u2020") if label in text}
    assert marked, f"{name}: no dagger on a method the gate does not validate"
    assert "Grad-CAM\u2020" not in text.replace("XGrad-CAM\u2020", ""), f"{name}: a validated method marked"


def test_a_figure_without_failing_methods_carries_no_mark(figures):
    text = " ".join(t.get_text() for t, _ in _text_objects(figures["figure3_nothing"]))
    assert "\u2020" not in text


def test_figure_specific_fixes(figures):
    figure2_b = figures["figure2"].axes[1]
    # every threshold a tick, its eligible n under it (never "n=110n=110" above the panel)
    assert [t.get_text() for t in figure2_b.get_xticklabels()] == ["0.80\n70", "0.85\n64",
                                                                  "0.90\n59", "0.95\n0"]
    assert not figure2_b.texts                                            # no n printed above
    assert figure2_b.get_ylim()[1] > 1.0                                 # points at 1.0 not clipped
    figure2_a = figures["figure2"].axes[0]
    assert figure2_a.get_legend().get_bbox_to_anchor().bounds == figure2_a.bbox.bounds   # inside A
    assert "LayerCAM" not in " ".join(t.get_text() for t in figures["figure2"].findobj(Text))
    no_eligible = figures["figure2_no_eligible"].axes[1]
    assert any("n = 0 at every threshold" in t.get_text() for t in no_eligible.texts)

    figure3_text = " ".join(t.get_text() for t in figures["figure3"].findobj(Text))
    assert "IoU 0.30\nconstant" in figure3_text and "$\\mathbf{C}$  Consensus: not drawn" in figure3_text
    assert "$\\mathbf{A}$  High-score miss: not drawn" in figure3_text and "\\u2013" not in figure3_text and "score >0.999" in figure3_text
    assert "out 7 px" in figure3_text and "0a1b2c3d" not in figure3_text      # the caption is outside
    assert "tied peaks" in figure3_text
    assert any(ax.get_label() == "<colorbar>" for ax in figures["figure3"].axes)
    panels = [ax for ax in figures["figure3"].axes if any(line.get_marker() == "x" for line in ax.lines)]
    # 5 CAMs and 3 baselines, one constant; every marker drawn unclipped
    assert len(panels) == len(MAP_METHODS) - 1
    assert not any(line.get_clip_on() for ax in panels for line in ax.lines if line.get_marker() == "x")
    assert figures["figure3"].get_size_inches()[0] == pytest.approx(7.2)                   # 183 mm

    figure4 = figures["figure4"]
    titles = [ax.get_title(loc="left") for ax in figure4.axes]
    assert "no eligible image: ResNet-34" in titles[0].replace("\n", " ") and "n = 59 images" in titles[1]
    assert "n = 150 images" in titles[2] and "z/T" in figure4.axes[2].get_ylabel()
    assert {t.get_color() for ax in figure4.axes for t in ax.get_xticklabels()} == {"black"}
    legend = " ".join(t.get_text() for t in figure4.axes[2].get_legend().get_texts())
    assert "ResNet-34" in legend                                          # still in the legend once
    footnote = figure4._supxlabel.get_text()
    assert "identical by construction" in footnote and "ResNet-34 s1129" in footnote
    assert "Grad-CAM = XGrad-CAM = HiResCAM at ResNet-34" in footnote.replace("\n", " ")

    figure5 = figures["figure5"].axes[0]
    assert not [l for l in figure5.lines if l.get_linestyle() == "--"]     # no line across the bars
    assert any(p.get_hatch() for p in figure5.patches)                      # centre baseline: own bar

    figure1 = " ".join(t.get_text() for t in figures["figure1"].axes[0].texts)
    assert "random" in figure1 and "source-category" in figure1

    s1_legend = " ".join(t.get_text() for t in figures["figure_s1"].axes[1].get_legend().get_texts())
    assert "(primary)" in s1_legend


def test_a_synthetic_run_prints_its_footer_below_every_figure(tmp_path):
    from PIL import Image

    from endoexplain_core import artefacts

    assert artefacts.data_footer("") == marks.SYNTHETIC_FOOTER and artefacts.data_footer("/data") == ""
    heights = {}
    for footer in ("", artefacts.data_footer("")):
        fig, ax = plt.subplots(figsize=(3, 2), layout="constrained")
        ax.plot([0, 1], [0, 1])
        fig.supxlabel("a note at the bottom left", fontsize=7, x=0.01, ha="left")
        name = "with" if footer else "without"
        artefacts.save_figure(fig, name, tmp_path, dpi=100, footer=footer)
        texts = [t.get_text() for t in fig.texts]
        plt.close(fig)
        heights[name] = Image.open(tmp_path / f"{name}.png").size[1]
        assert (marks.SYNTHETIC_FOOTER in texts) == bool(footer)
    assert heights["with"] > heights["without"]          # below everything: the canvas grows


def test_p_values_print_as_below_0_001_never_0_000(tmp_path):
    import pandas as pd

    from endoexplain_core import artefacts

    table = pd.DataFrame({"pair": ["a", "b"], "failure_p": [0.0004, 0.2], "failure_p_holm": [0.0008, 1.0],
                          "p_value": [1e-9, float("nan")], "prop": [0.0004, 0.5]})
    artefacts.save_table(table, "tests", tmp_path)
    markdown = (tmp_path / "tests.md").read_text().splitlines()
    assert markdown[2] == "| a | <0.001 | <0.001 | <0.001 | 0.000 |"   # a rate is not a p-value
    assert markdown[3] == "| b | 0.200 | 1.000 |  | 0.500 |"
    assert "<0.001" in (tmp_path / "tests.tex").read_text()
    assert [c for c in table.columns if presentation.is_p_value_column(c)] == ["failure_p", "failure_p_holm", "p_value"]


def test_latex_tables_carry_the_dagger_as_a_command(tmp_path):
    import pandas as pd

    from endoexplain_core import artefacts

    artefacts.save_table(pd.DataFrame({"label": ["Grad-CAM\u2020", "Eigen-CAM*\u2021"], "n": [3, 4]}), "marks", tmp_path)
    tex = (tmp_path / "marks.tex").read_text()
    assert "\u2020" not in tex and "\u2021" not in tex
    assert r"Grad-CAM\dag{}" in tex and r"Eigen-CAM*\ddag{}" in tex
    assert "Grad-CAM\u2020" in (tmp_path / "marks.md").read_text()     # Markdown keeps the mark


def test_figure2a_ece_from_the_bins_equals_the_calibration_ece_and_small_bins_are_open():
    import numpy as np

    from endoexplain_core.analysis import calibration

    rng = np.random.default_rng(4)
    score = rng.uniform(size=300)
    target = (rng.uniform(size=300) < score ** 2).astype(int)
    bins = calibration.reliability_table(score, target, 10)
    assert calibration.ece_from_bins(bins) == pytest.approx(calibration.ece(score, target, 10))
    fig, ax = plt.subplots()
    table = bins.assign(score="Temperature-scaled")
    table.loc[table.index[0], "count"] = 2                         # one small bin
    calibration_figures.draw_reliability(ax, table)
    open_markers = [line for line in ax.lines if line.get_markerfacecolor() == "white" and len(line.get_xdata())]
    assert len(open_markers) == 1 and len(open_markers[0].get_xdata()) == 1
    assert any("ECE" in t.get_text() for t in ax.get_legend().get_texts())
    plt.close(fig)


def test_reliability_lines_never_cross_an_empty_bin_and_every_point_has_an_interval():
    table = pd.DataFrame({"bin": range(10), "lower": np.arange(10) / 10, "upper": np.arange(1, 11) / 10,
                          "count": [40, 6, 0, 0, 7, 8, 3, 0, 9, 50],
                          "mean_score": [0.02, 0.15, np.nan, np.nan, 0.45, 0.55, 0.66, np.nan, 0.85, 0.98],
                          "observed_frequency": [0.0, 0.17, np.nan, np.nan, 0.43, 0.5, 0.67, np.nan, 0.89, 1.0]})
    both = pd.concat([table.assign(score="Raw"), table.assign(score="Temperature-scaled")])
    ece = pd.DataFrame({"score": ["Raw", "Temperature-scaled", "Change (scaled - raw)"], "n": 123,
                        "ece": [0.1, 0.07, -0.03], "ci_low": [0.06, 0.04, -0.06], "ci_high": [0.14, 0.1, 0.0]})
    fig = calibration_figures.plot_reliability_with_counts(both, ece)
    ax = fig.axes[0]
    lines = [line for line in ax.lines if line.get_linestyle() != "None" and line.get_label() != "Perfect calibration"]
    for line in lines:   # joined points are adjacent bins of >= MIN_BIN_COUNT images
        xs = np.round(np.asarray(line.get_xdata()) * 10 - 0.5).astype(int)
        assert len(xs) >= 2 and np.all(np.diff(xs) == 1), xs
    # raw and scaled runs: bins 0-1, 4-5 and the lone 8-9 pair, twice
    assert sorted(len(line.get_xdata()) for line in lines) == [2, 2, 2, 2, 2, 2]
    intervals = [c for c in ax.collections if c.__class__.__name__ == "LineCollection"]
    assert sum(len(c.get_segments()) for c in intervals) == 2 * 7   # every non-empty bin, both kinds
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "Raw score (ECE 0.100, 95% CI 0.060 to 0.140)" in legend
    assert "ECE change after scaling -0.030 (95% CI -0.060 to +0.000; n = 123" in ax.get_legend().get_title().get_text()
    assert fig.axes[1].get_yscale() == "linear"
    plt.close(fig)


def test_every_saved_table_carries_the_footnotes_its_cells_call_for(tmp_path):
    """Not only the final tables: any table with a dagger, a double dagger, a section sign
    (degenerate maps), Eigen-CAM* or "not estimable" in its cells gets their notes below the
    Markdown and LaTeX; a synthetic run's tables say so; a table without marks of a real-data
    run gets none."""
    from endoexplain_core import artefacts, marks

    marked = pd.DataFrame({"label": ["Grad-CAM\u2020", "Eigen-CAM*", "HiResCAM\u2020\u00a7"],
                           "verdict": ["passes\u2021", "not estimable", "inconclusive"]})
    artefacts.save_table(marked, "marked", tmp_path, synthetic=True)
    markdown = (tmp_path / "marked.md").read_text()
    notes = [marks.GATE_FOOTNOTE, marks.UNSTABLE_FOOTNOTE, marks.DEGENERATE_FOOTNOTE, marks.EIGEN_FOOTNOTE,
             marks.NOT_ESTIMABLE_NOTE, marks.SYNTHETIC_FOOTER]
    positions = [markdown.index(presentation.markdown_cell(note)) for note in notes]
    assert positions == sorted(positions) and positions[0] > markdown.index("| Eigen-CAM* |")
    latex = (tmp_path / "marked.tex").read_text()
    assert "\\dag{} not validated" in latex and "Synthetic cohort" in latex
    assert "HiResCAM\\dag{}\\S{}" in latex and "\\S{} degenerate maps" in latex
    assert list(pd.read_csv(tmp_path / "marked.csv").columns) == ["label", "verdict"]   # CSV: data only
    artefacts.save_table(pd.DataFrame({"method": ["gradcam"], "n": [3]}), "plain", tmp_path)
    assert (tmp_path / "plain.md").read_text().rstrip().endswith("| gradcam | 3 |")


def test_figure1_text_stays_inside_its_box(figures):
    """A label wider than its box spills over the edge (the overlap test compares texts only)."""
    from matplotlib.patches import FancyBboxPatch

    fig = figures["figure1"]
    renderer = fig.canvas.get_renderer()
    boxes = [p.get_window_extent(renderer) for p in fig.axes[0].patches if isinstance(p, FancyBboxPatch)]
    spilled = []
    for text, extent in _text_objects(fig):
        centre = ((extent.x0 + extent.x1) / 2, (extent.y0 + extent.y1) / 2)
        for box in boxes:
            if box.contains(*centre) and not (box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1):
                spilled.append(text.get_text())
    assert boxes and not spilled, f"text wider than its box: {spilled}"


def test_a_saved_figure_with_the_longest_footer_stays_within_two_columns(tmp_path):
    """The footer (gate note + synthetic line) is wrapped to the figure's width: the PNG that
    save_figure writes is at most 183 mm wide at its stated resolution."""
    from PIL import Image

    from endoexplain_core import artefacts
    from endoexplain_core.analysis import validity_gate

    style.apply()
    figure = case_figures.figure4(inputs.robustness_table(), n_images=150, not_validated=NOT_VALIDATED)
    footer = style.footer_lines(validity_gate.FIGURE_GATE_NOTE, marks.SYNTHETIC_FOOTER)
    png, _ = artefacts.save_figure(figure, "wide", tmp_path, footer=footer)
    plt.close(figure)
    with Image.open(png) as saved:
        assert saved.size[0] / artefacts.PRINT_DPI <= style.DOUBLE_COLUMN_INCHES + 0.05


def test_error_bars_never_raise_when_an_interval_misses_its_estimate_by_rounding():
    """The float mean of equal values can exceed their max (0.1 x 3); a bar side is then 0."""
    from endoexplain_core.figures.style import error_extents

    mean = np.mean([0.1, 0.1, 0.1])
    assert mean > 0.1
    extents = error_extents([mean, 0.5], [0.1, 0.4], [0.1, 0.7])
    assert (extents >= 0).all()
    np.testing.assert_allclose(extents, [[mean - 0.1, 0.1], [0.0, 0.2]])
    fig, ax = plt.subplots()
    ax.errorbar([0, 1], [mean, 0.5], yerr=extents)   # matplotlib refuses negative yerr
    plt.close(fig)


def test_figure4_without_a_learned_checkpoint_draws_its_panels_without_a_legend():
    """The smoke run's checkpoints learn nothing (AUPRC < 0.95): Figure 4 gets no rows and must
    still be drawn (its panels say no eligible image), never stop stage 05."""
    table = inputs.robustness_table()
    figure = case_figures.figure4(table.iloc[0:0], n_images=150, not_validated=NOT_VALIDATED,
                                  left_out=sorted(table["checkpoint_id"].unique()))
    assert not figure.legends
    plt.close(figure)


def test_coinciding_curves_are_named_once_per_group():
    """Four curves on one line are one sentence (the default run's ROAD note listed six pairs),
    with the largest difference between any two of them; a far curve is left out."""
    wide = pd.DataFrame({"gradcam": [0.0, 1.0, 2.0], "gradcampp": [0.0, 1.1, 2.0],
                         "xgradcam": [0.0, 1.0, 2.2], "hirescam": [5.0, 6.0, 7.0],
                         "eigencam": [5.0, 6.0, 7.05]})
    note = style.coincidence_note(wide, 0.25, method_label)
    assert note == (" Grad-CAM, Grad-CAM++ and XGrad-CAM nearly coincide (largest pairwise difference 0.200)."
                    " HiResCAM and Eigen-CAM* nearly coincide (largest pairwise difference 0.050).")
    assert style.coincidence_note(wide, 0.01, method_label) == ""
