"""What the notebooks' sections say and save: ``presentation.report`` saves, records and shows a
``Section``; each ``describe_*`` beside a table's function counts what the table holds. The
notebooks that call them run in tests/test_end_to_end.py."""

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
    # named, not stack-walked: the computing function only when a marked function made the table
    assert set(sidecar) == {"artefact", "kind", "files", "stage", "execution_count", "computed_by"}
    assert sidecar["computed_by"] is None
    assert [type(item).__name__ for item in shown] == ["Figure", "Markdown", "DataFrame", "Markdown"]
    assert shown[0] is figure and shown[1].data == "first view" and shown[3].data == "the finding"


def test_threshold_sensitivity_is_described_by_its_eligible_counts():
    primary = crafted_table(SCORES, FAILURES)
    sensitivity = summaries.failure_by_threshold(primary, [0.9, 0.95])
    # scores 0.95, 0.91, 0.97 reach 0.90; 0.95, 0.97 reach 0.95
    assert summaries.describe_threshold_sensitivity(sensitivity) == "Eligible images per threshold: 0.90: 3, 0.95: 2."


def test_a_checkpoint_that_did_not_learn_stays_out_of_the_ranges_and_is_named():
    from endoexplain_core.models.learning import not_learned_ids

    primary = crafted_table(SCORES, FAILURES).assign(temperature=1.0, temperature_at_bound=False)
    other = crafted_table(SCORES, {m: [1] * 6 for m in FAILURES}, checkpoint_id="resnet34_s1",
                          arch="resnet34").assign(temperature=1.0, temperature_at_bound=False)
    tables = pd.concat([primary, other], ignore_index=True)
    deletions = pd.concat([random_deletion_rows(6), random_deletion_rows(6, "resnet34_s1")])
    learning = learning_rows({"efficientnet_b0_s1": True, "resnet34_s1": False},
                             {"efficientnet_b0_s1": "efficientnet_b0", "resnet34_s1": "resnet34"})
    identical = {"efficientnet_b0": [], "resnet34": [("gradcam", "hirescam")]}
    rows = summaries.checkpoint_robustness(tables, deletions, "efficientnet_b0_s1", 0.90, identical_by_arch=identical)
    rows = rows.merge(learning[["checkpoint_id", "learned"]], on="checkpoint_id", how="left")
    assert not_learned_ids(learning) == ["resnet34_s1"]
    assert "resnet34_s1 (flagged learned = False" in summaries.describe_checkpoint_robustness(
        rows, not_learned_ids(learning), learning_rule="rule", audit_unlearned=True)
    learned_rows = rows[rows["learned"].astype(bool)]
    table = summaries.checkpoint_failure_ranges(learned_rows, identical)
    gradcam = table[(table["subset"] == "own high-score subset") & (table["method"] == "gradcam")].iloc[0]
    assert gradcam["min"] == gradcam["max"] == pytest.approx(1 / 3)     # the primary's own rate only
    statement = summaries.describe_failure_ranges(rows, identical, not_learned_ids(learning))
    assert statement.startswith("Identical by construction: resnet34: gradcam = hirescam.")
    assert statement.endswith("Excluded from the ranges (did not learn): resnet34_s1.")


def test_lesion_strata_and_secondary_outcomes_are_described_by_their_sizes():
    primary = crafted_table(SCORES, FAILURES)
    strata = summaries.lesion_strata_high_score(primary, 0.90)
    tertiles = summaries.lesion_tertiles(primary)
    statement = summaries.describe_lesion_strata(strata, tertiles, 0.90)
    assert statement.startswith("High-score images (scaled score ≥ 0.9) per stratum") and "Images per tertile: " in statement
    primary["iou_below_0_10"] = primary["iou"] < 0.10
    primary["centre_of_mass_distance"] = 0.2
    primary["score_drop"] = np.where(primary["method"].isin(["random", "centre"]), np.nan, 0.1)
    secondary = summaries.secondary_outcomes(primary, 0.90, replicates=50, seed=SEED)
    assert summaries.describe_secondary_outcomes(secondary) == "Secondary outcomes on 3 high-score and 6 audit images."


def test_table5_is_described_with_its_status_and_an_empty_frame_says_so():
    statement = adjusted_model.describe("fitted", score_threshold=0.9, primary_id="efficientnet_b0_s1", learned=True,
                                        not_learned=["resnet34_s1"], failing_methods=["eigencam"])
    assert statement.startswith("Table 5 (score ≥ 0.9): fitted. It models the primary `efficientnet_b0_s1` only "
                                "(learned: True); checkpoints that did not learn never enter it (excluded: resnet34_s1).")
    assert statement.endswith("Failing: eigencam.")
    assert adjusted_model.heading(adjusted_model.model_frame(crafted_table(SCORES, FAILURES), 0.999)) == (
        "No high-score image: Table 5 is empty.")


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


def test_the_layer_and_stability_descriptions_read_their_tables():
    from endoexplain_core.analysis import layer_sensitivity, stability

    layers = pd.DataFrame({"layer": ["features.8.0", "features.8"], "ill_posed": [True, False]})
    assert layer_sensitivity.describe(layers).endswith("at: features.8.0.")
    verdicts = pd.DataFrame({"part": ["gate", "table4", "primary"], "label": ["Grad-CAM", "Eigen-CAM", "selection"],
                             "held": [True, False, "not assessable"]})
    assert stability.describe(verdicts) == ("1 of 3 headline verdicts held under a perturbed seed; unstable: "
                                            "table4 Eigen-CAM; not assessable: 1.")


def test_the_subgroup_descriptions_count_the_m1_rows_and_name_skipped_contrasts():
    from endoexplain_core.analysis import subgroup_audit
    from tests.test_subgroup_controls import case_frame

    cases = case_frame(n=40, checkpoints=("a", "b"), seed=5)
    gaps, _, _, _ = subgroup_audit.subgroup_table(cases, min_images=8, randomised=cases.assign(energy_lift=0.0),
                                                  faithfulness=None, faithfulness_checkpoint="a")
    main = subgroup_audit.main_gaps(gaps)
    assert set(main["model"]) == {"M1"} and set(main["slopes"]) == {"shared"}
    assert subgroup_audit.describe_gaps(main).startswith(
        f"M1: {int(main['gap'].notna().sum())} of {len(main)} gaps estimable")
    nested = subgroup_audit.nested_lift_gaps(gaps)
    assert set(nested.columns) == {"M0", "M1", "M2", "M3", "Mc"}
    skipped = pd.DataFrame({"contrast": ["ETIS: x vs y"], "n_subgroup": [2], "n_reference": [30], "reason": ["few"]})
    assert subgroup_audit.describe_skipped(skipped) == "Skipped contrasts (too few images on one side): ETIS: x vs y (2 vs 30)"


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
