"""The notebook sections (``endoexplain_core.sections``): each section's saved tables are its
analysis functions' tables unchanged, its statement counts what the tables hold, and
``presentation.report`` saves, records and shows a section. The notebooks that call them run in
tests/test_end_to_end.py."""

import json

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from endoexplain_core import artefacts, presentation  # noqa: E402
from endoexplain_core.analysis import adjusted_model, summaries  # noqa: E402
from endoexplain_core.figures.audit_report import AuditSummary  # noqa: E402
from endoexplain_core.presentation import Section  # noqa: E402
from endoexplain_core.figures import audit_report  # noqa: E402
from endoexplain_core.sections import robustness  # noqa: E402
from tests.test_summaries import FAILURES, SCORES, SEED, crafted_table, random_deletion_rows  # noqa: E402


def learning_rows(learned: dict[str, bool], arch: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({"checkpoint_id": list(learned), "arch": [arch[c] for c in learned],
                         "control": "none", "learned": list(learned.values())})


def test_report_saves_every_table_and_figure_records_files_and_shows_in_order(tmp_path, monkeypatch):
    import IPython.display
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda item: shown.append(item))
    written = artefacts.Written(tmp_path / "run", tmp_path / "figures", synthetic=False)
    figure, axes = plt.subplots()
    axes.plot([0, 1], [0, 1])
    kept = tmp_path / "run" / "cases.parquet"
    section = Section(tables={"table_a": pd.DataFrame({"x": [0.123456]}), "table_b": pd.DataFrame({"y": [1.5]})},
                      float_formats={"table_a": "{:.4f}"}, figures={"figure_a": figure}, files=[kept],
                      views=["first view", pd.DataFrame({"z": [7]})], statement="the finding")
    presentation.report(section, written)
    names = sorted(p.name for p in written.paths)
    assert names == sorted(["table_a.csv", "table_a.md", "table_a.tex", "table_b.csv", "table_b.md", "table_b.tex",
                            "figure_a.png", "figure_a.pdf", "cases.parquet"])
    assert "0.1235" in (tmp_path / "figures" / "table_a.md").read_text()      # its own float format
    assert "1.500" in (tmp_path / "figures" / "table_b.md").read_text()       # the default
    assert (tmp_path / "figures" / "figure_a.png").stat().st_size > 0
    assert not plt.fignum_exists(figure.number)                               # shown once, then closed
    sidecar = json.loads((tmp_path / "figures" / "provenance" / "table_a.json").read_text())
    assert sidecar["writer"].startswith(__name__)      # the caller of report, not report itself
    assert [type(item).__name__ for item in shown] == ["Figure", "Markdown", "DataFrame", "Markdown"]
    assert shown[0] is figure and shown[1].data == "first view" and shown[3].data == "the finding"


def test_threshold_sensitivity_section_is_the_summary_table_and_its_run_folder_copy(tmp_path):
    primary = crafted_table(SCORES, FAILURES)
    section = robustness.threshold_sensitivity(primary, [0.9, 0.95], tmp_path / "sensitivity.csv")
    expected = summaries.failure_by_threshold(primary, [0.9, 0.95])
    pd.testing.assert_frame_equal(section.tables["table_threshold_sensitivity"], expected)
    pd.testing.assert_frame_equal(pd.read_csv(section.files[0]), expected, check_dtype=False)
    assert section.statement == "Eligible images per threshold: 0.90: 3, 0.95: 2."   # 0.95, 0.91, 0.97 / 0.95, 0.97


def test_checkpoint_sections_keep_a_checkpoint_that_did_not_learn_out_of_the_ranges():
    primary = crafted_table(SCORES, FAILURES).assign(temperature=1.0)
    other = crafted_table(SCORES, {m: [1] * 6 for m in FAILURES}, checkpoint_id="resnet34_s1",
                          arch="resnet34").assign(temperature=1.0)
    tables = pd.concat([primary, other], ignore_index=True)
    deletions = pd.concat([random_deletion_rows(6), random_deletion_rows(6, "resnet34_s1")])
    learning = learning_rows({"efficientnet_b0_s1": True, "resnet34_s1": False},
                             {"efficientnet_b0_s1": "efficientnet_b0", "resnet34_s1": "resnet34"})
    identical = {"efficientnet_b0": [], "resnet34": [("gradcam", "hirescam")]}
    rows, matrix = robustness.checkpoint_robustness(tables, deletions, learning, None, "efficientnet_b0_s1", 0.90,
                                                    identical, audit_unlearned=True)
    expected = summaries.checkpoint_robustness(tables, deletions, "efficientnet_b0_s1", 0.90,
                                               identical_by_arch=identical)
    pd.testing.assert_frame_equal(rows[expected.columns], expected)
    assert dict(zip(rows["checkpoint_id"], rows["learned"])) == {"efficientnet_b0_s1": True, "resnet34_s1": False}
    assert "resnet34_s1 (flagged learned = False" in matrix.statement
    learned_rows, ranges = robustness.failure_ranges(rows, learning, None, identical)
    assert set(learned_rows["checkpoint_id"]) == {"efficientnet_b0_s1"}
    table = ranges.tables["table_checkpoint_failure_ranges"]
    gradcam = table[(table["subset"] == "own high-score subset") & (table["method"] == "gradcam")].iloc[0]
    assert gradcam["min"] == gradcam["max"] == pytest.approx(1 / 3)     # the primary's own rate only
    assert ranges.statement.startswith("Identical by construction: resnet34: gradcam = hirescam.")
    assert ranges.statement.endswith("Excluded from the ranges (did not learn): resnet34_s1.")


def test_lesion_and_secondary_sections_report_the_summaries_tables():
    primary = crafted_table(SCORES, FAILURES)
    strata = robustness.lesion_strata(primary, 0.90)
    pd.testing.assert_frame_equal(strata.tables["table_lesion_strata_high_score"],
                                  summaries.lesion_strata_high_score(primary, 0.90))
    assert (strata.tables["table_lesion_tertiles"]["population"] == "all masked images (tertiles of this pool)").all()
    assert "Images per tertile: " in strata.statement
    primary["iou_below_0_10"] = primary["iou"] < 0.10
    primary["centre_of_mass_distance"] = 0.2
    primary["score_drop"] = np.where(primary["method"].isin(["random", "centre"]), np.nan, 0.1)
    secondary = robustness.secondary_outcomes(primary, 0.90, replicates=50, seed=SEED)
    pd.testing.assert_frame_equal(secondary.tables["table_secondary_outcomes"],
                                  summaries.secondary_outcomes(primary, 0.90, replicates=50, seed=SEED))
    assert secondary.statement == "Secondary outcomes on 3 high-score and 6 audit images."


def test_adjusted_model_section_holds_table5_and_firth_as_the_model_functions_give_them():
    rng = np.random.default_rng(3)
    n = 40
    failures = {m: list(rng.integers(0, 2, n)) for m in FAILURES}
    primary = crafted_table(list(rng.uniform(0.9, 1.0, n)), failures, areas=list(rng.uniform(0.01, 0.3, n)))
    centre_distance = dict(zip(primary["sample_id"].unique(), rng.uniform(0, 0.5, n)))  # one per image
    primary = primary.assign(temperature=1.0, lesion_centre_distance=primary["sample_id"].map(centre_distance))
    learning = learning_rows({"efficientnet_b0_s1": True}, {"efficientnet_b0_s1": "efficientnet_b0"})
    section = robustness.adjusted_model(primary, learning, None, "efficientnet_b0_s1", 0.90, replicates=20, seed=SEED)
    frame = adjusted_model.model_frame(primary, 0.90)
    table5, status = adjusted_model.adjusted_table(frame, replicates=20, seed=SEED)
    pd.testing.assert_frame_equal(section.tables["table5_adjusted_model"], table5)
    pd.testing.assert_frame_equal(section.tables["table5_firth"], adjusted_model.firth_odds_ratios(frame))
    assert section.statement.startswith(f"Table 5 (score ≥ 0.9): {status}.")


def test_the_ties_description_counts_the_ties_table():
    ties = pd.DataFrame({"method": ["gradcam", "eigencam"], "maps": [10, 10], "constant_maps": [1, 2],
                         "boundary_ties": [0, 3]})
    assert audit_report.describe_ties(ties) == "3 constant maps and 3 maps with boundary ties among 20 maps."


def test_table4_is_saved_whole_by_panel_and_formatted_and_described_from_its_counts():
    summary_rows = pd.DataFrame({"panel": ["A", "A", "B", "B"], "method": ["gradcam", "random"] * 2,
                                 "n": [0, 0, 12, 12]})
    summary = AuditSummary(summary=summary_rows, formatted=pd.DataFrame({"x": [1]}), ties=pd.DataFrame(),
                           identical=[], identical_statement="")
    saved = audit_report.table4_files(summary)
    assert list(saved) == ["table4_spatial_audit", "table4_panel_a", "table4_panel_b",
                           "table4_spatial_audit_formatted"]
    assert set(saved["table4_panel_a"]["panel"]) == {"A"} and len(saved["table4_panel_b"]) == 2
    text = audit_report.describe_table4(summary, pd.DataFrame({"temperature": [1.5]}), None, score_threshold=0.9)
    assert text.startswith("Panel A: 0 of 12 images with temperature-scaled score ≥ 0.9; panel B: all 12. "
                           "Panel A is EMPTY")
    assert text.endswith("The validity gate has not been run.")


def test_the_case_figure_description_says_when_nothing_qualifies_and_else_the_iou_check():
    check = pd.DataFrame({"rendered_iou": [0.5, 0.25], "table_iou": [0.5, 0.2]})
    assert audit_report.describe_case_figure({"miss": None, "hit": None}, check).endswith(
        "No high-score case qualifies for either row: the figure says so.")
    assert audit_report.describe_case_figure({"miss": "a", "hit": None}, check).endswith("difference: 5.00e-02.")


def test_paired_tests_run_on_each_non_empty_panel_and_say_their_sizes():
    primary = crafted_table(SCORES, FAILURES)
    panels = summaries.audit_panels(primary, 0.96)
    paired = summaries.paired_tests_by_panel(primary, panels, replicates=20, seed=SEED)
    assert set(paired["panel"]) == {p for p, ids in panels.items() if ids}
    expected = pd.concat([summaries.paired_tests(primary, ids, replicates=20, seed=SEED).assign(panel=p)
                          for p, ids in panels.items() if ids], ignore_index=True)
    pd.testing.assert_frame_equal(paired, expected)
    assert summaries.describe_paired_tests(paired, panels).startswith(
        f"Paired tests on panels {sorted(set(paired['panel']))} (n = "
        + ", ".join(str(len(panels[p])) for p in sorted(set(paired["panel"]))) + ")")


def test_a_disabled_check_is_a_statement_and_nothing_saved():
    layer = robustness.layer_check("run", "data", pd.DataFrame(), pd.DataFrame(), None, enabled=False, image_size=64,
                                   score_threshold=0.9, top_fraction=0.2, batch_size=4, device="cpu",
                                   replicates=10, seed=SEED)
    resolution = robustness.resolution_check("run", "data", pd.DataFrame(), pd.DataFrame(), None, "c", native_size=64,
                                             check_size=0, score_threshold=0.9, top_fraction=0.2, repetitions=1,
                                             batch_size=4, device="cpu", replicates=10, seed=SEED)
    for section in (layer, resolution):
        assert not section.tables and not section.figures and "disabled" in section.statement


def test_subgroup_gaps_section_saves_the_four_subgroup_tables_and_counts_the_m1_rows():
    from endoexplain_core.analysis import subgroup_audit
    from endoexplain_core.sections import faithfulness as faithfulness_sections
    from tests.test_subgroup_controls import case_frame

    cases = case_frame(n=40, checkpoints=("a", "b"), seed=5)
    randomised = cases.assign(energy_lift=0.0, pointing_hit=0.0)
    section = faithfulness_sections.subgroup_gaps(cases, randomised, None, "a", (), min_images=8)
    gaps, crude, controls, skipped = subgroup_audit.subgroup_table(cases, min_images=8, randomised=randomised,
                                                                   faithfulness=None, faithfulness_checkpoint="a")
    for name, expected in (("table_s_faithfulness_subgroups", gaps), ("table_s_faithfulness_subgroups_crude", crude),
                           ("table_s_faithfulness_subgroup_controls", controls),
                           ("table_s_faithfulness_subgroups_skipped", skipped)):
        pd.testing.assert_frame_equal(section.tables[name], expected)
    main = gaps[(gaps["model"] == "M1") & (gaps["slopes"] == "shared")]
    assert section.statement.startswith(f"M1: {int(main['gap'].notna().sum())} of {len(main)} gaps estimable")
    assert list(section.figures) == ["figure_s_faithfulness_subgroups"]
    plt.close("all")


def test_notebook_07_descriptions_read_their_tables():
    """What notebook 07 says beside its tables (``extended_localisation.describe_*``)."""
    from endoexplain_core.analysis import extended_localisation as ext

    scores = pd.DataFrame({"sample_id": ["a", "a", "b", "c"], "scaled_score": [0.95, 0.95, 0.5, 0.91]})
    subsets = ext.panel_subsets(scores, 0.9)
    assert set(subsets["panel A"]["sample_id"]) == {"a", "c"} and subsets["all images"] is scores
    run = {"checkpoint_id": "efficientnet_b0_s1", "n_audited": 3, "n_empty_masks_excluded": 1,
           "cam_seconds": 2.0, "metric_seconds": 1.0}
    assert ext.describe_scored(run, subsets, 0.9) == (
        "`efficientnet_b0_s1`: 3 masked images scored (1 empty after resizing, excluded); panel A: 2 images "
        "at scaled score ≥ 0.90.")
    assert ext.describe_cost([run, {**run, "metric_seconds": 3.0}]) == (
        "Extended metrics / CAM computation: 100.0% (primary: 50.0%).")
    # ranks (1 = highest mean), as rankings_by_subset gives them
    ranked = pd.DataFrame({"subset": ["all images"] * 2 + ["panel A"], "method": ["gradcam", "dog", "gradcam"],
                           "auc_iou": [2, 1, 9], "top20_iou": [1, 2, 0]})
    assert ext.describe_rankings(ranked, 0.2) == (
        "**All images, ranking by AUC-IoU:** DoG conspicuity > Grad-CAM.\n\n"
        "**By top-20% IoU:** Grad-CAM > DoG conspicuity.")
    noted = ext.noted({"t": pd.DataFrame({"x": [1]})})
    assert list(noted["t"]["note"]) == [ext.CONSTANT_NOTE]
