"""Issue 10 reporting rules outside the statistics module: the paper profile's ImageNet
weights, calibration flags and per-category intervals, and the paper-vs-run table."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from endoexplain_core.analysis import calibration, paper_comparison, stats
from endoexplain_core.methods import CAM_METHODS
from endoexplain_core.models import networks, training

SEED = 20260721  # the profiles' shared seed: bootstrap draws as in a run

REPO = Path(__file__).resolve().parents[1]


def test_paper_profile_without_local_weights_fails_naming_the_expected_file(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))     # an empty hub cache
    profile = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    setting = profile["stages"]["01_training"]["imagenet_weights"]
    assert setting == "auto"                          # the paper profile asks for weights
    for arch in profile["shared"]["architectures"]:
        with pytest.raises(training.MissingImageNetWeights) as error:
            training.imagenet_weights_path(arch, setting)
        message = str(error.value)
        assert str(tmp_path / "checkpoints") in message and ".pth" in message
        assert "imagenet_weights: none" in message    # how to train from scratch on purpose
    # From scratch only when the profile says so; a mapping must name every architecture.
    assert training.imagenet_weights_path("resnet34", "none") is None
    assert training.imagenet_weights_path("resnet34", {"resnet34": "none"}) is None
    with pytest.raises(training.MissingImageNetWeights, match="names no file for convnext_tiny"):
        training.imagenet_weights_path("convnext_tiny", {"resnet34": "none"})
    (tmp_path / "checkpoints").mkdir()
    cached = tmp_path / "checkpoints" / "resnet34-b627a593.pth"
    cached.write_bytes(b"")                           # an empty (interrupted) download
    with pytest.raises(networks.WeightsHashMismatch, match="does not start with b627a593"):
        training.imagenet_weights_path("resnet34", "auto")


def _scores(temperature):
    rng = np.random.default_rng(0)
    rows = []
    for role in ("val", "test"):
        for i in range(40):
            target = int(i < 16)
            source = ("polyps" if i < 4 else "dyed-lifted-polyps") if target else ("cecum" if i % 2 else "bbps-2-3")
            z = (2.0 if target else -2.0) + rng.normal()
            rows.append({"checkpoint_id": "c", "role": role, "target": target, "source": source,
                         "logit_neg": 0.0, "logit_pos": z})
    logits = pd.DataFrame(rows)
    return calibration.add_scores(logits, pd.DataFrame({"checkpoint_id": ["c"], "temperature": [temperature]}))


def test_temperature_at_bound_is_flagged_in_table3_rows():
    flagged = calibration.calibration_table(_scores(calibration.TEMPERATURE_BOUNDS[1]), "c", n_bins=10)
    assert flagged.loc[flagged["score"] == "Temperature-scaled", "temperature_at_bound"].all()
    assert not flagged.loc[flagged["score"] == "Raw", "temperature_at_bound"].any()
    assert not calibration.calibration_table(_scores(0.83), "c", n_bins=10)["temperature_at_bound"].any()


def test_temperature_at_bound_reaches_table4_and_the_table5_footnote():
    from endoexplain_core.analysis import adjusted_model, summaries
    bound = calibration.TEMPERATURE_BOUNDS[1]
    pinned = pd.DataFrame({"temperature": [bound, bound]})
    inside = pd.DataFrame({"temperature": [0.83, 0.83]})
    assert summaries.temperature_at_bound(pinned) and not summaries.temperature_at_bound(inside)
    assert summaries.temperature_statement(pinned).startswith("WARNING")
    assert "inside its search bounds" in summaries.temperature_statement(inside)
    shown = summaries.format_spatial_audit_summary(pd.DataFrame({
        "panel": ["A"], "label": ["Grad-CAM"], "n": [3], "temperature_at_bound": [True],
        **{f"{o}{s}": [0.5] for o in ("peak_failure", "iou", "energy_in_mask", "logit_drop")
           for s in ("", "_ci_low", "_ci_high")}}))
    assert shown["Panel"].iloc[0] == "A (T at bound)"
    table5 = pd.DataFrame({"term": ["x"], "estimable": [True], "note": [""], "separated_replicates": [0]})
    assert adjusted_model.footnote(table5, 10, summaries.temperature_statement(pinned)).startswith("WARNING")


def test_source_category_audit_has_wilson_intervals_per_category():
    table = calibration.source_category_audit(_scores(1.0), "c", "test", 0.5, replicates=2000, seed=SEED).set_index("source")
    standard = table.loc["polyps"]
    k = round(standard["sensitivity"] * standard["n"])
    assert (standard["sensitivity_ci_low"], standard["sensitivity_ci_high"]) == pytest.approx(
        stats.wilson_interval(k, int(standard["n"])))
    negative = table.loc["cecum"]
    assert negative["false_positive_rate_ci_low"] <= negative["false_positive_rate"] <= negative["false_positive_rate_ci_high"]
    assert np.isnan(negative["sensitivity_ci_low"])
    assert standard["mean_scaled_score_ci_low"] <= standard["mean_scaled_score"] <= standard["mean_scaled_score_ci_high"]


def test_paper_values_ship_with_the_manifest_facts_and_compare_to_a_run(tmp_path):
    paper = paper_comparison.read_paper_values(REPO / "data_manifest" / "paper")
    facts = paper.set_index("key")["paper_value"]
    assert facts["manifest_rows"] == "7210" and facts["manifest_digest_prefix"] == "6b12b62f7c72"
    assert [facts[f"role_{r}"] for r in ("train", "val", "test", "spatial_audit")] == ["4348", "930", "932", "1000"]
    assert facts["or_hirescam"] == "0.058" and facts["test_scaled_ece"] == "0.0115"
    values = {"manifest_rows": 7210, "manifest_digest_prefix": "6b12b62f7c72", "role_train": 4348,
              "role_val": 930, "role_test": 932, "role_spatial_audit": 1000, "test_scaled_ece": 0.01154,
              "primary_test_auprc": 0.9,
              "or_xgradcam": "not estimable (59/59 failed; quasi-complete separation)"}
    table = paper_comparison.comparison_table(paper, values).set_index("key")
    assert table.loc["test_scaled_ece", "agreement"] == "agrees"          # 0.01154 -> 0.0115
    assert table.loc["test_scaled_ece", "run_value"] == "0.0115"          # the paper's precision
    assert table.loc["primary_test_auprc", "agreement"] == "differs"
    assert table.loc["or_xgradcam", "agreement"] == "differs"
    assert table.loc["panel_a_failure_gradcam", "run_value"] == ""        # no counterpart: blank
    assert table.loc["panel_a_failure_gradcam", "agreement"] == ""
    assert "matches the paper's cohort" in paper_comparison.same_cohort_statement(table.reset_index())
    # the tolerance: one unit of the last printed digit, no more
    values.update(test_scaled_ece=0.0116, primary_test_auprc=0.9695, or_hirescam=0.062, or_gradcampp=0.8)
    table = paper_comparison.comparison_table(paper, values).set_index("key")
    assert table.loc["test_scaled_ece", "agreement"] == "agrees"          # 0.0116 vs 0.0115
    assert table.loc["primary_test_auprc", "agreement"] == "differs"      # 0.970 vs 0.968
    assert table.loc["or_hirescam", "direction_agrees"] is True           # both below 1
    assert table.loc["or_gradcampp", "direction_agrees"] is False         # 0.8 vs the paper's 1.628
    # another cohort: only the manifest facts are compared, the rest is not comparable
    values["manifest_rows"] = 136
    other = paper_comparison.comparison_table(paper, values).set_index("key")
    assert "does NOT use the paper's cohort" in paper_comparison.same_cohort_statement(other.reset_index())
    assert other.loc["manifest_rows", "agreement"] == "differs" and other.loc["role_train", "agreement"] == "agrees"
    assert other.loc["test_scaled_ece", "agreement"] == paper_comparison.NOT_COMPARABLE
    assert other.loc["or_gradcampp", "direction_agrees"] is False         # still shown: informative
    with pytest.raises(FileNotFoundError, match="paper_reported_values.csv"):
        paper_comparison.read_paper_values(tmp_path)


def test_run_record_keeps_producing_run_timings_shows_headline_tables_and_hides_resume_files(tmp_path):
    import json

    from endoexplain_core import artefacts
    from endoexplain_core.analysis import adjusted_model
    from endoexplain_core.pipeline import record

    run_dir, figures_dir = tmp_path / "runs" / "smoke", tmp_path / "figures" / "smoke"
    (run_dir / "stamps").mkdir(parents=True)
    (run_dir / "notebooks").mkdir()
    html_page = run_dir / "notebooks" / "05_robustness.html"
    html_page.write_text("<html></html>")
    (run_dir / "stamps" / "05_robustness.json").write_text(json.dumps(
        {"digest": "d", "seconds": 248.4, "figure_files": [], "finished": "2026-11-30T23:10:02"}))
    table5 = pd.DataFrame({"term": list(adjusted_model.TERMS.values()), "odds_ratio": 1.5,
                           "ci_low": 1.1, "ci_high": 2.0, "estimable": True, "note": "",
                           "separated_replicates": 0})
    table5.loc[1, ["odds_ratio", "ci_low", "ci_high", "estimable", "note"]] = [
        np.nan, np.nan, np.nan, False, "not estimable (59/59 failed; quasi-complete separation)"]
    artefacts.save_table(adjusted_model.format_table(table5), "table5_adjusted_model_formatted", figures_dir)
    stage = {"stage": "05_robustness", "notebook": "notebooks/05_robustness.ipynb", "status": "skipped",
             "seconds": 0.0, "last_run_seconds": 248.4, "parameters": {},
             "executed_notebook": str(run_dir / "notebooks" / "05_robustness.ipynb"), "html": str(html_page),
             "figure_files": ["table5_adjusted_model_formatted.csv"]}
    assert record.stage_timing(stage) == ("skipped: unchanged since the run finished 2026-11-30T23:10:02", 248.4)
    provenance = {"profile": "smoke", "stages": [stage],
                  "checkpoints": {"efficientnet_b0_s1129": "ab", "efficientnet_b0_s1129.resume": "cd"}}
    page = record.write_run_index(run_dir, figures_dir, provenance).read_text()
    assert "248.4" in page and "0.0</td>" not in page
    assert "efficientnet_b0_s1129.resume" not in page and "efficientnet_b0_s1129" in page
    assert "Table 5: adjusted failure model" in page and "not estimable (59/59 failed" in page
    assert 'href="../notebooks/05_robustness.html"' in page or "05_robustness.html" in page
    final = record.collect_final_tables(figures_dir, names={"table5_adjusted_model_formatted": "05_robustness"})
    assert list(final["table5_adjusted_model_formatted"].columns) == ["Term", "Odds ratio (95% CI)"]


def test_a_cam_with_grad_cams_outcome_on_every_image_gets_odds_ratio_one_and_says_so():
    # Default run, 2026-12-05: Grad-CAM++ hit or missed exactly where Grad-CAM did on all 109
    # panel-A images; the ridge fit gave OR 0.99983 (0.99940 to 0.99990), and the stability
    # check read its sign as "lower odds".
    from endoexplain_core.analysis import adjusted_model, stats
    rng = np.random.default_rng(5)
    n = 60
    images = [f"img{i:03d}" for i in range(n)]
    covariates = {"lesion_area_per_0_10": rng.uniform(0.5, 3.0, n),
                  "centre_distance_per_0_10": rng.uniform(0.0, 4.0, n),
                  "score_per_0_10": rng.uniform(9.0, 10.0, n)}
    reference = (rng.uniform(size=n) < 0.3).astype(float)
    outcomes = {"gradcam": reference, "gradcampp": reference.copy(),
                **{m: (rng.uniform(size=n) < 0.5).astype(float) for m in ("xgradcam", "hirescam", "eigencam")}}
    frame = pd.concat([pd.DataFrame({"sample_id": images, "method": method, "failure": failure,
                                     "intercept": 1.0, **covariates})
                       for method, failure in outcomes.items()], ignore_index=True)
    for method in CAM_METHODS[1:]:
        frame[method] = (frame["method"] == method).astype(float)
    frame = frame.sort_values(["sample_id", "method"]).reset_index(drop=True)
    table = adjusted_model.odds_ratios(frame, replicates=40, seed=3).set_index("term")
    same = table.loc[adjusted_model.TERMS["gradcampp"]]
    assert (same["odds_ratio"], same["ci_low"], same["ci_high"]) == (1.0, 1.0, 1.0)
    assert same["note"] == "the same outcome as Grad-CAM on all 60 images: odds ratio 1 by construction"
    assert all(table.loc[adjusted_model.TERMS[m], "note"] == "" for m in ("xgradcam", "hirescam", "eigencam"))
    # What the rule replaces is the penalty's pull only: the ridge estimate sits next to 1.
    terms = ["intercept", *adjusted_model.TERMS]
    ridge = stats.fit_ridge_logistic(frame[terms].to_numpy(), frame["failure"].to_numpy())
    assert abs(ridge[terms.index("gradcampp")]) < 1e-2
    printed = adjusted_model.format_table(table.reset_index()).set_index("Term")["Odds ratio (95% CI)"]
    assert printed[adjusted_model.TERMS["gradcampp"]].startswith("the same outcome as Grad-CAM")


def test_table5_heading_gives_the_observed_ranges_and_flags_a_per_0_10_extrapolation():
    # Default run, 2026-12-05: panel A's scaled scores spanned 0.917 to 0.974, and "Scaled score
    # per 0.10" printed an odds ratio above 1,000 with nothing saying why.
    from endoexplain_core.analysis import adjusted_model
    frame = pd.DataFrame({"sample_id": ["a", "b", "c"], "lesion_area_per_0_10": [0.2, 1.5, 3.0],
                          "centre_distance_per_0_10": [0.0, 2.0, 4.0],
                          "score_per_0_10": [9.17, 9.5, 9.74]})
    text = adjusted_model.heading(frame)
    assert "scaled score 0.917 to 0.974" in text and "lesion area 0.020 to 0.300" in text
    assert "Scaled score spans less than 0.10 here, so an odds ratio per 0.10 extrapolates" in text
    wide = frame.assign(score_per_0_10=[8.5, 9.5, 10.0])
    assert "extrapolates" not in adjusted_model.heading(wide)
