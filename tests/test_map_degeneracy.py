"""Degenerate maps (issue 48, item 3): hand-made audit rows whose border-ring peaks, tied maxima
and correlation with Grad-CAM are known, including the shapes measured on the committed default
reference's primary (HiResCAM: 96% of peaks on the border ring of a 5x5 grid, 106 of 110 maps
with tied maxima, median Pearson -0.82 with Grad-CAM), which the rule must flag, beside a
Grad-CAM that it must not."""

import numpy as np
import pandas as pd
import pytest

from endoexplain_core import artefacts, marks
from endoexplain_core.analysis import map_diagnostics, summaries
from endoexplain_core.figures import audit_report
from endoexplain_core.methods import CAM_METHODS

N = 110


def _rows(method, *, border, tied, constant=0, n=N, grid=(5, 5), checkpoint="efficientnet_b0_s1129"):
    """``n`` audit rows of one method: the first ``constant`` maps constant (no peak, no ties),
    then ``border`` maps with a peak in the border ring and ``tied`` maps (counted from the
    first map with a peak) whose maximum is shared by 14 pixels (the edge plateau at 136 px)."""
    peak = np.arange(n) >= constant
    order = np.cumsum(peak) - 1          # index among the maps with a peak
    return pd.DataFrame({"checkpoint_id": checkpoint, "method": method, "sample_id": [f"s{i:03d}" for i in range(n)],
                         "constant_map": ~peak, "peak_border_ring": peak & (order < border),
                         "max_multiplicity": np.where(peak & (order < tied), 14, 1),
                         "feature_grid_height": grid[0], "feature_grid_width": grid[1]})


def _identity(pearson):
    """``practical_identity``-like rows: Grad-CAM against each other method with that median."""
    return pd.DataFrame([{"first": "gradcam", "second": m, "median_pearson": r} for m, r in pearson.items()])


def _reference_primary():
    """The committed default primary's shapes: HiResCAM degenerate on all three counts; the
    other CAMs, like Grad-CAM, peaking mostly inside the grid (lesions lie mostly there)."""
    cases = pd.concat([_rows("gradcam", border=30, tied=28), _rows("gradcampp", border=30, tied=28),
                       _rows("xgradcam", border=34, tied=30), _rows("hirescam", border=106, tied=106),
                       _rows("eigencam", border=25, tied=20)], ignore_index=True)
    identity = _identity({"gradcampp": 0.999, "xgradcam": 0.93, "hirescam": -0.82, "eigencam": 0.71})
    return cases, identity


def test_the_rule_flags_the_reference_primarys_hirescam_and_not_its_gradcam():
    cases, identity = _reference_primary()
    table = map_diagnostics.degenerate_maps(cases, identity).set_index("method")
    assert list(table.index) == list(CAM_METHODS)
    assert list(map_diagnostics.degenerate_maps(cases, identity).columns) == map_diagnostics.DEGENERACY_COLUMNS
    hires = table.loc["hirescam"]
    # 5x5 grid: ring 16 of 25 cells (0.64), limit 1 - 0.25 x 0.36 = 0.91
    assert hires["border_ring_chance"] == pytest.approx(0.64)
    assert hires["border_ring_limit"] == pytest.approx(0.91)
    assert hires["border_ring_share"] == pytest.approx(106 / 110)
    assert hires["tied_maxima"] == 106 and hires["tied_share"] == pytest.approx(106 / 110)
    assert hires["pearson_with_gradcam"] == pytest.approx(-0.82)
    assert hires["degenerate"]
    assert hires["why"] == ("96% of peaks on the border ring (limit 91%: interior peaks below 0.25 of the "
                            "interior's 36% area share); 106 of 110 maps with tied maxima (limit: more than "
                            "50%); median per-image Pearson with Grad-CAM -0.82 (limit -0.5): "
                            "anti-correlated with the class evidence")
    assert map_diagnostics.degenerate_methods(table.reset_index()) == ["hirescam"]
    grad = table.loc["gradcam"]
    assert not grad["degenerate"] and grad["why"] == "" and np.isnan(grad["pearson_with_gradcam"])


@pytest.mark.parametrize("changed, flagged", [
    # each rule alone, at and just past its limit
    (dict(border=100, tied=0), False),            # 100/110 = 0.909 < 0.91
    (dict(border=101, tied=0), True),             # 0.918 > 0.91
    (dict(border=0, tied=55), False),             # exactly half tied: not more than half
    (dict(border=0, tied=56), True),
    # shares are over the maps with a peak: 60 constant maps, 26 of the other 50 tied
    (dict(border=0, tied=26, constant=60), True),
    (dict(border=0, tied=25, constant=60), False),
])
def test_each_rule_fires_alone_past_its_limit(changed, flagged):
    cases = pd.concat([_rows("gradcam", border=0, tied=0), _rows("xgradcam", **changed)])
    table = map_diagnostics.degenerate_maps(cases, _identity({"xgradcam": 0.2}))
    assert table.set_index("method").loc["xgradcam", "degenerate"] == flagged


def test_anti_correlation_alone_flags_and_without_identity_is_not_read():
    cases = pd.concat([_rows("gradcam", border=0, tied=0), _rows("eigencam", border=0, tied=0)])
    for pearson, flagged in ((-0.5, False), (-0.51, True), (0.0, False)):
        table = map_diagnostics.degenerate_maps(cases, _identity({"eigencam": pearson})).set_index("method")
        assert table.loc["eigencam", "degenerate"] == flagged
    # the pair in the other order of the identity table reads the same
    other_order = pd.DataFrame([{"first": "eigencam", "second": "gradcam", "median_pearson": -0.9}])
    assert map_diagnostics.degenerate_maps(cases, other_order).set_index("method").loc["eigencam", "degenerate"]
    unread = map_diagnostics.degenerate_maps(cases).set_index("method")
    assert unread["pearson_with_gradcam"].isna().all() and not unread["degenerate"].any()


def test_grids_without_interior_are_never_flagged_by_position_and_several_checkpoints_are_kept_apart():
    assert map_diagnostics.border_ring_limit((2, 2)) == 1.0
    assert map_diagnostics.border_ring_limit((4, 4)) == pytest.approx(1 - 0.25 * 4 / 16)
    cases = pd.concat([_rows("hirescam", border=N, tied=0, grid=(2, 2), checkpoint="a"),
                       _rows("hirescam", border=N, tied=0, grid=(5, 5), checkpoint="b")])
    table = map_diagnostics.degenerate_maps(cases)
    assert table[["checkpoint_id", "degenerate"]].values.tolist() == [["a", False], ["b", True]]
    assert map_diagnostics.degenerate_methods(table, "b") == ["hirescam"]
    with pytest.raises(ValueError, match="name one"):
        map_diagnostics.degenerate_methods(table)
    with pytest.raises(ValueError, match="checkpoint_id column"):
        map_diagnostics.degenerate_maps(cases, _identity({"hirescam": 0.5}))


def test_table4_marks_a_degenerate_method_and_its_saved_table_prints_the_footnote(tmp_path):
    """Table 4's rows of a degenerate method carry the section sign and ``maps`` = "degenerate",
    whatever the gate's verdict; baselines are "reference"; the saved table prints the note."""
    cases, identity = _reference_primary()
    degeneracy = map_diagnostics.degenerate_maps(cases, identity)
    table4 = pd.DataFrame({"panel": "A", "method": list(summaries.TABLE4_ROWS),
                           "label": [m for m in summaries.TABLE4_ROWS], "n": 110})
    marked = map_diagnostics.mark_degenerate(table4, degeneracy).set_index("method")
    assert marked.loc["hirescam", "label"] == "hirescam" + marks.DEGENERATE_MARK
    assert marked.loc["hirescam", "maps"] == "degenerate" and marked.loc["gradcam", "maps"] == "proper"
    assert marked.loc["gradcam", "label"] == "gradcam"
    assert set(marked.loc[["random", "random_deletion", "centre", "salience"], "maps"]) == {"reference"}
    assert map_diagnostics.mark_degenerate(table4, None) is table4
    artefacts.save_table(marked.reset_index(), "table4_spatial_audit", tmp_path)
    assert marks.DEGENERATE_FOOTNOTE in (tmp_path / "table4_spatial_audit.md").read_text().replace("\\", "")
    assert marks.notes_for(table4, synthetic=False) == []
    assert audit_report._degenerate_line(marked.reset_index())[0].endswith("Marked: HiResCAM.")
    assert audit_report._degenerate_line(table4) == []
    statement = map_diagnostics.describe_degeneracy(degeneracy)
    assert statement.startswith("HiResCAM on efficientnet_b0_s1129 is degenerate: 96% of peaks")
