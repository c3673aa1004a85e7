"""Table 4 panels, paired tests, sensitivity summaries and Table 5 on crafted audit tables."""

import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests
import statsmodels.api as sm

from endoexplain_core import presentation
from endoexplain_core.analysis import adjusted_model, summaries
from endoexplain_core.analysis.audit_schema import REQUIRED_COLUMNS, validate_audit_table
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS

SEED = 20260721  # the profiles' shared seed: bootstrap draws as in a run


def crafted_table(scores, failures, checkpoint_id="efficientnet_b0_s1", arch="efficientnet_b0",
                  seed=1, areas=None):
    """Audit rows: ``failures[method]`` lists 0/1 per image; IoU = 0.5 - 0.4 * failure."""
    rows = []
    for i, score in enumerate(scores):
        for method in MAP_METHODS:
            failed = bool(failures[method][i])
            rows.append({"dataset": "d", "sample_id": f"s{i:02d}", "checkpoint_id": checkpoint_id,
                         "arch": arch, "seed": seed, "control": "none", "method": method,
                         "top_fraction": 0.2, "scaled_score": score, "peak_outside_mask": failed,
                         "iou": 0.5 - 0.4 * failed + 0.01 * i, "energy_in_mask": 0.3,
                         "lesion_area_fraction": 0.05 * (i + 1) if areas is None else areas[i],
                         "lesion_centre_distance": 0.1,
                         "logit_drop": float(i) if method in CAM_METHODS else np.nan})
    table = pd.DataFrame(rows)
    for column in REQUIRED_COLUMNS:
        if column not in table:
            table[column] = 0
    return validate_audit_table(table)


SCORES = [0.95, 0.91, 0.5, 0.2, 0.97, 0.85]
FAILURES = {
    "gradcam":   [1, 0, 1, 1, 0, 0],
    "gradcampp": [1, 1, 1, 1, 1, 0],
    "xgradcam":  [1, 0, 1, 1, 0, 0],
    "hirescam":  [0, 0, 0, 1, 0, 0],
    "eigencam":  [0, 0, 1, 0, 0, 1],
    "random":    [1, 1, 1, 1, 1, 1],
    "centre":    [0, 1, 0, 1, 0, 1],
    "salience":  [1, 0, 0, 1, 1, 0],
}


def random_deletion_rows(n, checkpoint_id="efficientnet_b0_s1"):
    return pd.DataFrame({"sample_id": [f"s{i:02d}" for i in range(n)], "checkpoint_id": checkpoint_id,
                         "logit_drop_mean": np.arange(n) * 0.5})


def test_table4_panels_use_the_right_images_and_hand_means():
    table = crafted_table(SCORES, FAILURES)
    result = summaries.spatial_audit_summary(table, random_deletion_rows(6), score_threshold=0.90, replicates=200, seed=SEED)
    panel_a = result[result["panel"] == "A"].set_index("method")
    panel_b = result[result["panel"] == "B"].set_index("method")
    assert (panel_a["n"] == 3).all() and (panel_b["n"] == 6).all()       # images 0, 1, 4
    assert panel_a.loc["gradcam", "peak_failure"] == pytest.approx(1 / 3)
    assert panel_b.loc["gradcampp", "peak_failure"] == pytest.approx(5 / 6)
    assert panel_a.loc["gradcam", "logit_drop"] == pytest.approx((0 + 1 + 4) / 3)
    assert panel_a.loc["random_deletion", "logit_drop"] == pytest.approx((0 + 0.5 + 2) / 3)
    assert np.isnan(panel_a.loc["random_deletion", "peak_failure"])
    assert np.isnan(panel_b.loc["centre", "logit_drop"])
    assert panel_a.loc["eigencam", "label"] == "Eigen-CAM*"
    low, high = panel_b.loc["gradcam", ["peak_failure_ci_low", "peak_failure_ci_high"]]
    assert 0 <= low <= 0.5 <= high <= 1


def test_an_empty_high_score_panel_is_reported_not_raised():
    table = crafted_table(SCORES, FAILURES)
    result = summaries.spatial_audit_summary(table, random_deletion_rows(6), score_threshold=0.99, replicates=50, seed=SEED)
    panel_a = result[result["panel"] == "A"]
    assert (panel_a["n"] == 0).all() and panel_a["peak_failure"].isna().all()


def test_paired_tests_match_scipy_and_statsmodels():
    table = crafted_table(SCORES, FAILURES)
    ids = sorted(table["sample_id"].unique())
    result = summaries.paired_tests(table, ids, identical_groups=[("gradcam", "xgradcam")],
                                    replicates=100, seed=SEED).set_index(["first", "second"])
    row = result.loc[("gradcam", "gradcampp")]
    # Grad-CAM fails alone on none, Grad-CAM++ alone on images 1 and 4.
    assert (row["discordant_first_only"], row["discordant_second_only"]) == (0, 2)
    assert row["failure_p"] == pytest.approx(scipy_stats.binomtest(0, 2).pvalue)
    assert row["failure_difference"] == pytest.approx(-2 / 6)
    np.testing.assert_allclose(result["failure_p_holm"],
                               multipletests(result["failure_p"], method="holm")[1])
    np.testing.assert_allclose(result["iou_p_holm"], multipletests(result["iou_p"], method="holm")[1])
    assert result.loc[("gradcam", "xgradcam"), "identical_by_construction"]
    assert result.loc[("gradcam", "xgradcam"), "failure_p"] == 1.0
    assert not result.loc[("gradcam", "hirescam"), "identical_by_construction"]


def test_failure_by_threshold_counts_eligible_images():
    table = crafted_table(SCORES, FAILURES)
    result = summaries.failure_by_threshold(table, thresholds=(0.80, 0.90, 0.96))
    counts = result.groupby("score_threshold")["n_eligible"].first()
    assert counts.to_dict() == {0.80: 4, 0.90: 3, 0.96: 1}
    gradcam = result[(result["method"] == "gradcam")].set_index("score_threshold")["failure_rate"]
    assert gradcam[0.80] == pytest.approx(1 / 4) and gradcam[0.96] == 0.0
    assert list(result.columns) == ["score_threshold", "method", "n_eligible", "n_constant", "failure_rate",
                                    "ci_low", "ci_high"]


def test_lesion_tertiles_split_images_by_area():
    table = crafted_table(SCORES, FAILURES, areas=[0.30, 0.01, 0.20, 0.02, 0.10, 0.40])
    result = summaries.lesion_tertiles(table)
    centre = result[result["method"] == "centre"].set_index("tertile")
    # small: images 1, 3 (areas .01, .02); medium: 4, 2; large: 0, 5.
    assert centre.loc["small", "failure_rate"] == 1.0
    assert centre.loc["medium", "failure_rate"] == 0.0
    assert centre.loc["large", "failure_rate"] == 0.5
    assert (result["n"] == 2).all()


def test_checkpoint_robustness_uses_the_primary_fixed_subset():
    primary = crafted_table(SCORES, FAILURES)
    other_scores = [0.1, 0.1, 0.95, 0.95, 0.1, 0.1]       # its own subset: images 2, 3
    other = crafted_table(other_scores, FAILURES, checkpoint_id="resnet34_s1", arch="resnet34")
    deletions = pd.concat([random_deletion_rows(6), random_deletion_rows(6, "resnet34_s1")])
    result = summaries.checkpoint_robustness(pd.concat([primary, other]), deletions,
                                             "efficientnet_b0_s1", 0.90)
    row = result[(result["checkpoint_id"] == "resnet34_s1") & (result["method"] == "hirescam")].iloc[0]
    assert row["n_own"] == 2 and row["failure_own"] == 0.5          # images 2, 3
    assert row["n_fixed"] == 3 and row["failure_fixed"] == 0.0      # images 0, 1, 4
    assert row["logit_drop_all"] == pytest.approx(2.5)
    assert row["random_deletion_mean"] == pytest.approx(1.25)
    identical = {"resnet34": [("gradcam", "hirescam")], "efficientnet_b0": []}
    deletion_all = summaries.deletion_all_images(result, identical)
    assert list(deletion_all.index) == ["efficientnet_b0_s1", "resnet34_s1"]
    assert deletion_all.loc["resnet34_s1", "hirescam"] == pytest.approx(2.5)
    assert deletion_all.loc["resnet34_s1", "random_deletion"] == pytest.approx(1.25)
    assert deletion_all.loc["resnet34_s1", "identical_by_construction"] == "gradcam = hirescam"
    assert deletion_all.loc["efficientnet_b0_s1", "identical_by_construction"] == ""


def test_table5_recovers_known_odds_ratios_on_simulated_cases():
    rng = np.random.default_rng(11)
    n_images = 600
    area = rng.uniform(0.02, 0.4, n_images)
    distance = rng.uniform(0.0, 0.6, n_images)
    log_odds_method = {"gradcam": 0.0, "gradcampp": np.log(2.0), "xgradcam": 0.0,
                       "hirescam": np.log(0.25), "eigencam": np.log(0.5)}
    rows = []
    for i in range(n_images):
        for method, effect in log_odds_method.items():
            eta = -0.5 + effect + 0.3 * (distance[i] / 0.1) - 0.2 * (area[i] / 0.1)
            rows.append({"sample_id": f"s{i:03d}", "method": method,
                         "peak_outside_mask": rng.uniform() < 1 / (1 + np.exp(-eta)),
                         "lesion_area_fraction": area[i], "lesion_centre_distance": distance[i],
                         "scaled_score": 0.95, "dataset": "d", "checkpoint_id": "c",
                         "constant_map": False})
    frame = adjusted_model.model_frame(pd.DataFrame(rows), score_threshold=0.90)
    assert len(frame) == 5 * n_images
    # Constant score: drop it from this check (it is collinear with the intercept).
    frame["score_per_0_10"] = rng.normal(size=len(frame))
    result = adjusted_model.odds_ratios(frame, replicates=100, seed=SEED).set_index("term")
    expected = {"Grad-CAM++ versus Grad-CAM": 2.0, "HiResCAM versus Grad-CAM": 0.25,
                "Eigen-CAM* versus Grad-CAM": 0.5, "Lesion-centre distance per 0.10": np.exp(0.3),
                "Lesion area per 0.10 frame fraction": np.exp(-0.2)}
    for term, odds_ratio in expected.items():
        assert result.loc[term, "ci_low"] < odds_ratio < result.loc[term, "ci_high"], term
    with pytest.raises(ValueError, match="no high-score"):
        adjusted_model.odds_ratios(frame.iloc[0:0], replicates=500, seed=SEED)
    with pytest.raises(ValueError, match="constant"):
        adjusted_model.odds_ratios(frame.assign(failure=1.0), replicates=500, seed=SEED)


def test_tie_counts_count_maps_with_ties():
    table = crafted_table(SCORES, FAILURES)
    table["max_multiplicity"] = 1
    table["boundary_ties"] = 1                          # 1 = unambiguous boundary
    table["constant_map"] = False
    table.loc[table["method"] == "hirescam", "constant_map"] = [True] + [False] * 5
    table.loc[table["method"] == "gradcam", "max_multiplicity"] = [3, 1, 1, 2, 1, 1]
    table.loc[table["method"] == "centre", "boundary_ties"] = 4
    result = summaries.tie_counts(table).set_index("method")
    assert result.loc["hirescam", "constant_maps"] == 1 and result["constant_maps"].sum() == 1
    assert result.loc["gradcam", "tied_maximum"] == 2 and result["tied_maximum"].sum() == 2
    assert result.loc["centre", "boundary_ties"] == 6 and result["boundary_ties"].sum() == 6
    assert (result["maps"] == 6).all()


def test_format_spatial_audit_summary_prints_estimates_with_intervals_and_dashes():
    table = summaries.spatial_audit_summary(crafted_table(SCORES, FAILURES), random_deletion_rows(6), 0.90,
                             replicates=50, seed=SEED)
    shown = summaries.format_spatial_audit_summary(table).set_index(["Panel", "Map"])
    assert shown.loc[("A", "Grad-CAM"), "Peak failure"].startswith("0.333 (")
    assert shown.loc[("A", "Random deletion"), "Peak failure"] == "\u2013"
    assert shown.loc[("B", "Centre baseline"), "Logit drop"] == "\u2013"
    assert presentation.estimate_with_ci(0.5, 0.25, 0.75, digits=2) == "0.50 (0.25 to 0.75)"
    assert presentation.estimate_with_ci(float("nan"), 0.1, 0.2, missing="\u2013") == "\u2013"
    assert "Identical maps" not in shown.columns


def test_table4_shows_practically_identical_methods_as_one_group():
    """Table 4 as printed carries each method's identity group (map_diagnostics), so Grad-CAM,
    Grad-CAM++ and Eigen-CAM read as one piece of evidence, baselines and XGrad-CAM as none."""
    from endoexplain_core.analysis import map_diagnostics

    table = summaries.spatial_audit_summary(crafted_table(SCORES, FAILURES), random_deletion_rows(6), 0.90,
                                            replicates=50, seed=SEED)
    grouped = map_diagnostics.mark_identity_groups(table, [("gradcam", "gradcampp", "eigencam")])
    shown = summaries.format_spatial_audit_summary(grouped).set_index(["Panel", "Map"])["Identical maps"]
    assert shown[("A", "Eigen-CAM*")] == shown[("B", "Grad-CAM")] == "Grad-CAM = Grad-CAM++ = Eigen-CAM*"
    assert shown[("A", "XGrad-CAM")] == "" and shown[("A", "Random heatmap")] == ""


def test_adjusted_model_table_always_returns_the_terms():
    frame = adjusted_model.model_frame(crafted_table(SCORES, FAILURES), score_threshold=0.99)
    table, status = adjusted_model.adjusted_table(frame, replicates=500, seed=SEED)
    assert list(table["term"]) == list(adjusted_model.TERMS.values())
    assert table["odds_ratio"].isna().all() and "no image reached" in status
    constant = adjusted_model.model_frame(crafted_table(SCORES, {m: [1] * 6 for m in FAILURES}), 0.90)
    assert "constant" in adjusted_model.adjusted_table(constant, replicates=500, seed=SEED)[1]


# --------------------------------------------------------------------------- issue 10

def _separated_frame(n_images=59, seed=16):
    """High-score CAM rows where XGrad-CAM and HiResCAM fail on every image (the default run's case)."""
    rng = np.random.default_rng(seed)
    area = rng.uniform(0.02, 0.4, n_images)
    distance = rng.uniform(0.0, 0.6, n_images)
    rows = []
    for i in range(n_images):
        for method in CAM_METHODS:
            failed = True if method in ("xgradcam", "hirescam") else rng.uniform() < (0.3 if method != "eigencam" else 0.6)
            rows.append({"sample_id": f"s{i:03d}", "method": method, "peak_outside_mask": failed,
                         "lesion_area_fraction": area[i], "lesion_centre_distance": distance[i],
                         "scaled_score": 0.9 + 0.1 * rng.uniform(), "dataset": "d", "checkpoint_id": "c",
                         "constant_map": False})
    return adjusted_model.model_frame(pd.DataFrame(rows), score_threshold=0.90)


def test_separated_term_is_reported_not_estimable_and_left_out_of_the_fit():
    frame = _separated_frame()
    found = adjusted_model.detect_separation(frame)
    assert set(found["separated"]) == {"xgradcam", "hirescam"} and not found["unresolved"]
    table, status = adjusted_model.adjusted_table(frame, replicates=60, seed=SEED)
    by_term = table.set_index("term")
    for term in ("XGrad-CAM versus Grad-CAM", "HiResCAM versus Grad-CAM"):
        assert not by_term.loc[term, "estimable"] and np.isnan(by_term.loc[term, "odds_ratio"])
        assert by_term.loc[term, "note"] == "not estimable (59/59 failed; quasi-complete separation)"
    assert "not estimable" in status and "XGrad-CAM" in status
    # The remaining estimates are the (near-unpenalised) MLE fitted without the separated rows.
    kept = frame[~frame["method"].isin(["xgradcam", "hirescam"])]
    columns = ["intercept", "gradcampp", "eigencam", "lesion_area_per_0_10",
               "centre_distance_per_0_10", "score_per_0_10"]
    reference = sm.Logit(kept["failure"].to_numpy(), kept[columns].to_numpy()).fit(disp=0).params
    assert by_term.loc["Grad-CAM++ versus Grad-CAM", "odds_ratio"] == pytest.approx(np.exp(reference[1]), rel=1e-3)
    shown = adjusted_model.format_table(table).set_index("Term")["Odds ratio (95% CI)"]
    assert shown["XGrad-CAM versus Grad-CAM"].startswith("not estimable (59/59")
    numbers = [float(x) for cell in shown for x in re.findall(r"(?<![<>\d.])\d[\d,]*\.\d+", cell.replace(",", ""))]
    assert all(1e-3 <= x <= 1e3 for x in numbers)                     # no penalty-set number printed
    assert "quasi-complete separation" in adjusted_model.footnote(table, 60)


def test_odds_ratio_formatting_never_prints_extreme_values():
    assert adjusted_model.format_odds_ratio(26490.767) == ">1,000"
    assert adjusted_model.format_odds_ratio(np.inf) == ">1,000"
    assert adjusted_model.format_odds_ratio(0.0) == "<0.001"
    assert adjusted_model.format_odds_ratio(1.628) == "1.628"


def test_firth_table_is_finite_for_separated_terms_and_matches_firthmodels():
    from firthmodels import FirthLogisticRegression

    frame = _separated_frame()
    firth = adjusted_model.firth_odds_ratios(frame).set_index("term")
    assert firth.loc["XGrad-CAM versus Grad-CAM", "separated_in_mle"]
    assert np.isfinite(firth["odds_ratio"]).all() and (firth["ci_low"] < firth["odds_ratio"]).all()
    terms = list(adjusted_model.TERMS)
    reference = FirthLogisticRegression(backend="numpy", max_iter=200).fit(frame[terms].to_numpy(),
                                                                          frame["failure"].astype(int))
    np.testing.assert_allclose(firth["odds_ratio"].to_numpy(), np.exp(reference.coef_), rtol=1e-6)


def test_firth_table_reports_a_fit_that_did_not_converge_instead_of_stopping(monkeypatch):
    """A sensitivity analysis that cannot be fitted is printed as not converged (NaN odds
    ratios), never as numbers and never as a stopped stage."""
    import firthmodels

    original = firthmodels.FirthLogisticRegression.fit

    def no_convergence(self, *args, **kwargs):
        fitted = original(self, *args, **kwargs)
        fitted.converged_ = False
        return fitted

    monkeypatch.setattr(firthmodels.FirthLogisticRegression, "fit", no_convergence)
    firth = adjusted_model.firth_odds_ratios(_separated_frame())
    assert firth["odds_ratio"].isna().all()
    assert (firth["interval"] == "not converged in 200 iterations").all()


def test_firth_table_reports_a_rank_deficient_design_as_not_estimable():
    """Three images, all with the same score: the score term is collinear with the intercept
    (the 3-image panel A of another machine's default run). Firth is not estimable, the stage
    goes on."""
    frame = _separated_frame(n_images=3)
    frame["score_per_0_10"] = frame["score_per_0_10"].iloc[0]
    firth = adjusted_model.firth_odds_ratios(frame)
    assert firth["odds_ratio"].isna().all()
    assert firth["interval"].str.startswith("not estimable: design rank 7 of 8").all()


def test_firth_table_reports_a_solver_refusal_as_not_estimable(monkeypatch):
    import firthmodels

    def refuse(self, *args, **kwargs):
        raise ValueError("Weighted design matrix is rank deficient")

    monkeypatch.setattr(firthmodels.FirthLogisticRegression, "fit", refuse)
    firth = adjusted_model.firth_odds_ratios(_separated_frame())
    assert firth["odds_ratio"].isna().all()
    assert (firth["interval"] == "not estimable: Weighted design matrix is rank deficient").all()


def test_lesion_strata_cut_the_high_score_subset_at_full_pool_cut_points():
    areas = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]          # tertiles: {1,2}, {3,4}, {5,6}
    scores = [0.95, 0.5, 0.97, 0.96, 0.2, 0.91]           # high score: images 0, 2, 3, 5
    table = crafted_table(scores, FAILURES, areas=areas)
    assert summaries.lesion_area_cut_points(table) == (0.02, 0.04)
    strata = summaries.lesion_strata_high_score(table, 0.90)
    n = strata.groupby("stratum", sort=False)["n"].first().to_dict()
    assert n == {"small": 1, "medium": 2, "large": 1}
    gradcam = strata[strata["method"] == "gradcam"].set_index("stratum")
    # Grad-CAM fails on images 2 and 3 (medium) and on 0 (small), not on 5 (large).
    assert gradcam["failure_rate"].to_dict() == {"small": 1.0, "medium": 1.0, "large": 0.0}
    assert gradcam.loc["medium", "interval"] == "Wilson score"
    assert gradcam.loc["medium", "ci_low"] == pytest.approx(0.342, abs=1e-3)   # Wilson 2/2
    assert (strata["population"] == "scaled score >= 0.90").all()


def test_secondary_outcomes_and_checkpoint_ranges():
    table = crafted_table(SCORES, FAILURES)
    table["iou_below_0_10"] = table["iou"] < 0.10
    table["centre_of_mass_distance"] = 0.2
    table["score_drop"] = np.where(table["method"].isin(CAM_METHODS), 0.1, np.nan)
    secondary = summaries.secondary_outcomes(table, 0.90, replicates=50, seed=SEED)
    rate = secondary[(secondary["panel"] == "B") & (secondary["outcome"] == "iou_below_0_10")
                     & (secondary["method"] == "gradcam")].iloc[0]
    expected = np.mean(0.5 - 0.4 * np.array(FAILURES["gradcam"]) + 0.01 * np.arange(6) < 0.10)
    assert rate["estimate"] == pytest.approx(expected) and rate["n"] == 6
    assert set(secondary.loc[secondary["outcome"] == "score_drop", "method"]) == set(CAM_METHODS)

    other = crafted_table(SCORES, {m: [1] * 6 for m in FAILURES}, checkpoint_id="resnet34_s1",
                          arch="resnet34")
    both = pd.concat([table.assign(temperature=1.0), other.assign(temperature=20.0)], ignore_index=True)
    deletion = pd.concat([random_deletion_rows(6), random_deletion_rows(6, "resnet34_s1")])
    identical = {"resnet34": [("gradcam", "hirescam", "xgradcam")], "efficientnet_b0": []}
    robustness = summaries.checkpoint_robustness(both, deletion, "efficientnet_b0_s1", 0.90,
                                                 identical_by_arch=identical)
    assert robustness.loc[robustness["checkpoint_id"] == "resnet34_s1", "temperature_at_bound"].all()
    assert (robustness.set_index(["checkpoint_id", "method"]).loc[("resnet34_s1", "gradcam"), "identical_with"]
            == "HiResCAM = XGrad-CAM")
    ranges = summaries.checkpoint_failure_ranges(robustness, identical, non_learning={"resnet34_s1"})
    row = ranges[(ranges["subset"] == "own high-score subset") & (ranges["method"] == "gradcam")].iloc[0]
    assert (row["min"], row["max"]) == (pytest.approx(1 / 3), 1.0)
    assert row["max_checkpoint"] == "resnet34_s1" and row["identical_by_construction_in"] == "resnet34"
    assert row["non_learning_checkpoints"] == "resnet34_s1"
    assert row["temperature_at_bound_checkpoints"] == "resnet34_s1"


def test_a_term_whose_bootstrap_interval_is_unbounded_is_printed_not_estimable_beside_firth():
    # Separated replicates count as infinite estimates, so a percentile bound they reach is
    # exactly 0 or inf (the default run's Grad-CAM++ row: OR 1.000, CI 0 to 1.000).
    table = pd.DataFrame({"term": ["Grad-CAM++ versus Grad-CAM", "HiResCAM versus Grad-CAM",
                                   "XGrad-CAM versus Grad-CAM"],
                          "odds_ratio": [0.9997, 116.67, 1.699], "ci_low": [0.0, 40.9, 0.734],
                          "ci_high": [0.9998, np.inf, 60.1], "estimable": True, "note": "",
                          "separated_replicates": [18, 67, 22]})
    assert [adjusted_model.interval_unbounded(lo, hi) for lo, hi in zip(table["ci_low"], table["ci_high"])] == [
        True, True, False]
    firth = pd.DataFrame({"term": table["term"], "odds_ratio": [1.0, 45.3, np.nan],
                          "ci_low": [0.143, 5.32, np.nan], "ci_high": [6.995, 887.4, np.nan],
                          "separated_in_mle": False,
                          "interval": ["profile penalised likelihood (rows independent)"] * 2
                          + ["not converged in 200 iterations"]})
    shown = adjusted_model.format_table(table, firth=firth).set_index("Term")
    assert shown.loc["Grad-CAM++ versus Grad-CAM", "Odds ratio (95% CI)"] == (
        "not estimable (bootstrap interval unbounded: 18 replicates separated)")
    assert shown.loc["HiResCAM versus Grad-CAM", "Odds ratio (95% CI)"].startswith("not estimable")
    # 22 separated replicates split between the two directions leave both bounds finite
    assert shown.loc["XGrad-CAM versus Grad-CAM", "Odds ratio (95% CI)"] == "1.699 (0.734 to 60.100)"
    assert shown.loc["HiResCAM versus Grad-CAM", "Firth odds ratio (95% profile CI)"] == "45.300 (5.320 to 887.400)"
    assert shown.loc["XGrad-CAM versus Grad-CAM", "Firth odds ratio (95% profile CI)"] == "not converged in 200 iterations"
    footnote = adjusted_model.footnote(table, 500)
    assert "Grad-CAM++ versus Grad-CAM, HiResCAM versus Grad-CAM." in footnote and "Firth column" in footnote


def test_table5_heading_states_outcome_n_and_reference():
    frame = pd.DataFrame({"sample_id": ["a"] * 5 + ["b"] * 5})
    heading = adjusted_model.heading(frame)
    assert "n = 2 high-score images x 5 CAMs = 10 rows" in heading and "reference: Grad-CAM" in heading
    assert heading.startswith("Outcome: the CAM's peak lies outside the lesion")
