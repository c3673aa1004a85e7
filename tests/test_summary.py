"""summary.md and the README's generated results block.

The README's results block must be exactly the committed reference summary of the default run
(``tests/expected/default/summary.md``), rendered by ``pipeline.summary.readme_block``: the
README's numbers are generated from a run, never typed.
"""

from pathlib import Path

import pytest

from endoexplain_core.pipeline import summary

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "expected" / "default" / "summary.md"


def test_readme_results_block_is_the_reference_default_summary():
    readme = (ROOT / "README.md").read_text()
    expected = summary.readme_block(REFERENCE.read_text())
    start, end = readme.find(summary.README_BEGIN), readme.find(summary.README_END)
    assert 0 <= start < end, "README has no results block"
    assert readme[start:end + len(summary.README_END)] == expected, (
        "README results block differs from tests/expected/default/summary.md: run "
        ".venv/bin/python scripts/readme_results.py")


def test_reference_summary_has_headline_and_machine_parts():
    text = REFERENCE.read_text()
    headline = text.split(summary.MACHINE_HEADING)[0]
    for section in ("**Training**", "**Primary**", "**Validity gate**", "**Table 4 panel A**",
                    "**Table 5**", "**Transfer**", "**Stability under a perturbed seed**"):
        assert section in headline
    assert summary.MACHINE_HEADING not in headline
    assert "CPU pin: on" in text.split(summary.MACHINE_HEADING)[1]


def test_replace_readme_block_keeps_the_rest_and_refuses_a_readme_without_markers():
    readme = f"intro\n{summary.README_BEGIN}\nold\n{summary.README_END}\noutro\n"
    updated = summary.replace_readme_block(readme, "# Run summary\n\n## Headline numbers\n\nx = 1\n")
    assert updated.startswith("intro\n") and updated.endswith("\noutro\n")
    assert "### Run summary" in updated and "#### Headline numbers" in updated and "old" not in updated
    assert summary.replace_readme_block(updated, "# Run summary\n\n## Headline numbers\n\nx = 1\n") == updated
    with pytest.raises(ValueError, match="no results block"):
        summary.replace_readme_block("no markers here", "x")


def test_the_brief_reads_each_verdict_from_its_table(tmp_path):
    import pandas as pd

    from endoexplain_core.analysis.over_seeds import table4_over_seeds
    from endoexplain_core.methods import CAM_METHODS

    def save(name, rows):
        pd.DataFrame(rows).to_csv(tmp_path / f"{name}.csv", index=False)

    save("table_validity_gate", {"method": [*CAM_METHODS, "random"],
                                 "verdict": ["passes", "passes", "inconclusive", "fails", "passes", "fails"]})
    save("table_s1_training", {"checkpoint_id": ["a", "b"], "primary": [False, True], "test_auprc": [0.5, 0.91],
                               "test_auprc_ci_low": [0.4, 0.85], "test_auprc_ci_high": [0.6, 0.95], "n_test": [50, 50]})
    failure = [0.1, 0.2, 0.3, 0.4, 0.5, 1.0, 0.25, None, 0.6]
    save("table4_spatial_audit", {
        "panel": ["A"] * 8 + ["B"], "method": [*CAM_METHODS, "random", "centre", "random_deletion", "gradcam"],
        "n": [12] * 9, "peak_failure": failure,
        "peak_failure_ci_low": [None if f is None else f / 2 for f in failure],
        "peak_failure_ci_high": [None if f is None else (1 + f) / 2 for f in failure],
        "logit_drop": [2.0, 1.9, 0.4, 0.3, 2.1, None, None, 0.5, 1.8],
        "logit_drop_ci_low": [1.7, 1.6, 0.1, 0.0, 1.8, None, None, 0.3, 1.5],
        "logit_drop_ci_high": [2.3, 2.2, 0.7, 0.6, 2.4, None, None, 0.7, 2.1]})
    save("table_transfer", {"cohort": ["ETIS-LaribPolypDB", "PolypGen"], "method": ["Grad-CAM", "Grad-CAM"],
                            "mean_iou": [0.08, 0.2], "ci_low": [0.06, 0.17], "ci_high": [0.1, 0.23],
                            "centre_baseline_iou": [0.08, 0.15]})
    save("table_verdict_stability", {"held": [True, True, False, "not assessed"]})
    lines = summary.verdict_lines(tmp_path, synthetic=True)
    assert lines[0].startswith("**Validity gate**: 3 of 5 CAM methods find planted truth")
    assert "(Grad-CAM, Grad-CAM++, Eigen-CAM*); 1 inconclusive, 1 fail." in lines[0] and "\u2020" in lines[0]
    assert "test AUPRC 0.910 (0.850 to 0.950) (n = 50" in lines[1]
    assert summary._with_ci(1.0 - 2e-16, 1.0, 1.0) == "1.000 (the same in every bootstrap resample: no interval)"
    assert summary._with_ci(0.95, 0.9, 1.0) == "0.950 (0.900 to 1.000)"
    # RQ1: every map with its interval and gate mark, the baselines beside them
    # RQ1 without a table over seeds: says so, and labels the primary's numbers one checkpoint's audit
    assert lines[2].startswith("**RQ1, high score, where does the map look?** No estimate over seeds")
    assert "One checkpoint's audit (the primary, on the 12 audit images" in lines[2]
    assert "Grad-CAM 0.10 (0.05 to 0.55)" in lines[2] and "XGrad-CAM\u2020 0.30 (0.15 to 0.65)" in lines[2]
    assert "Centre baseline 0.25 (0.12 to 0.62)" in lines[2]
    assert "Wilson 95% CIs conditional on this checkpoint" in lines[2]
    # RQ2: its tables are missing here, and it says so
    assert lines[3] == "**RQ2, does it persist?** could not be computed (its table is missing)."
    # RQ3: deletion against the random control; the maps whose interval lies above it are named
    assert "In one checkpoint's audit (the primary, Table 4 panel A) the logit drop" in lines[4]
    assert "after deleting the same area at random 0.50 (0.30 to 0.70)" in lines[4]
    assert "3 of 5 maps' intervals lie above the random control's (Grad-CAM, Grad-CAM++, Eigen-CAM*)" in lines[4]
    assert "lesion-specific reliance" not in lines[4]  # no LSR table in this run
    assert "ETIS-LaribPolypDB 0.08 (0.06 to 0.10) (centre 0.08)" in lines[5]
    assert "its 95% CI lies above the centre baseline's IoU in 1 of 2" in lines[5]
    assert lines[6] == ("**Stability**: 2 of 4 headline verdicts held under a perturbed seed; 1 did not: each "
                        "is listed as UNSTABLE under \"Stability under a perturbed seed\" below, and its method's "
                        "rows carry \u2021 in the headline tables here and in the record's final tables; 1 could "
                        "not be rerun.")
    assert lines[7].startswith("**Data**: every number comes from the synthetic cohort the package generates")
    assert len(summary.verdict_lines(tmp_path, synthetic=False)) == 7
    save("table_threshold_sensitivity", {"score_threshold": [0.8, 0.95, 0.8], "method": ["gradcam", "gradcam", "random"],
                                         "n_eligible": [40, 9, 40], "failure_rate": [0.3, 0.2, 0.9],
                                         "ci_low": [0.2, 0.05, 0.8], "ci_high": [0.45, 0.52, 0.95]})
    save("table_lesion_tertiles", {"population": ["all masked images"] * 2, "tertile": ["small", "large"],
                                   "method": ["gradcam"] * 2, "n": [10, 11], "failure_rate": [0.6, 0.1],
                                   "ci_low": [0.3, 0.02], "ci_high": [0.85, 0.4]})
    save("table_s_faithfulness_lsr", {"lsr": [7.2], "ci_low": [7.0], "ci_high": [7.4], "n": [68]})
    lines = summary.verdict_lines(tmp_path, synthetic=True)
    assert lines[3] == ("**RQ2, does it persist?** In one checkpoint's audit (the primary) Grad-CAM's peak "
                        "failure is 0.30 (0.20 to 0.45) at score threshold 0.80 (n 40) and 0.20 (0.05 to "
                        "0.52) at score threshold 0.95 (n 9); 0.60 (0.30 to 0.85) in the smallest lesion-area "
                        "tertile (n 10) against 0.10 (0.02 to 0.40) in the largest (n 11) (95% CIs).")
    # with the table over seeds: RQ1 and RQ2 lead with the mean over seeds and its t interval
    seed_rates = {"gradcam": [0.26, 0.53, 0.58], "gradcampp": [0.2, 0.3, 0.25], "xgradcam": [0.4, 0.5, 0.45],
                  "hirescam": [0.99, 0.09, 0.10], "eigencam": [0.6, 0.7, 0.65], "random": [0.8, 0.85, 0.83],
                  "centre": [0.5, 0.51, 0.505]}
    per_seed = pd.DataFrame([{"checkpoint_id": f"e{k}", "seed": k, "is_primary": k == 0, "method": m, "label": m,
                              "n": 40, "n_constant": 0, "peak_failure": rate}
                             for m, rates in seed_rates.items() for k, rate in enumerate(rates)])
    over = table4_over_seeds(per_seed)
    over.to_csv(tmp_path / "table4_over_seeds.csv", index=False)
    gradcam = over.set_index("method").loc["gradcam"]
    lines = summary.verdict_lines(tmp_path, synthetic=True)
    expected = summary._with_ci(gradcam["peak_failure"], gradcam["ci_low"], gradcam["ci_high"], 2)
    assert lines[2].startswith("**RQ1, high score, where does the map look?** Over the 3 learned seeds of the "
                               "primary's architecture, each on its own high-score images (120 images in all)")
    assert f"Grad-CAM {expected}" in lines[2] and "Student t 95% CIs over the seeds whose maps" in lines[2]
    assert "HiResCAM\u2020 bimodal over seeds (2 of 3 seeds below the centre baseline)" in lines[2]
    assert lines[2].index("Over the 3 learned seeds") < lines[2].index("One checkpoint's audit (the primary")
    assert lines[3].startswith(f"**RQ2, does it persist?** Over 3 learned seeds of the primary's architecture "
                               f"Grad-CAM's peak failure is {expected} with a between-seed SD of 0.17, 1 of 3 "
                               "seeds below the centre baseline on their own images (over seeds: inconclusive); "
                               "in one checkpoint's audit (the primary)")
    assert "ranges" not in lines[3] and "learned checkpoints" not in lines[3]
    headline = "\n".join(summary._over_seeds_lines(tmp_path))
    assert "**Table 4 over seeds** (panel A of each of the 3 learned seeds" in headline
    assert "bimodal: read by the share below centre" in headline
    # degenerate seeds: left out of a method's mean, and named; none left: no estimate
    per_seed["degenerate"] = (per_seed["method"] == "hirescam") | (
        (per_seed["method"] == "gradcam") & (per_seed["checkpoint_id"] == "e1"))
    table4_over_seeds(per_seed).to_csv(tmp_path / "table4_over_seeds.csv", index=False)
    degenerate_lines = summary.verdict_lines(tmp_path, synthetic=True)
    assert "(2 proper seeds; 1 degenerate left out)" in degenerate_lines[2]
    assert "no estimate over seeds for HiResCAM\u2020 (maps degenerate on 3 of 3 seeds)" in degenerate_lines[2]
    headline = "\n".join(summary._over_seeds_lines(tmp_path))
    assert "| Grad-CAM | 2 (+1 degenerate) |" in headline
    (tmp_path / "table4_over_seeds.csv").unlink()
    assert ("filling in ordinary tissue of the same shape) is 7.20 (7.00 to 7.40) in units of the "
            "temperature-scaled logit difference z / T") in lines[4] and "(n 68 images)" in lines[4]
    save("table4_spatial_audit", {"panel": ["A"] * 7, "method": [*CAM_METHODS, "random", "centre"],
                                  "n": [27] * 7, "peak_failure": [None] * 7, "logit_drop": [None] * 7})
    (tmp_path / "table_s_faithfulness_lsr.csv").unlink()
    empty = summary.verdict_lines(tmp_path, synthetic=True)
    assert "panel A is empty: not estimable" in empty[2] and "panel A is empty: not estimable" in empty[4]
    # a failing Grad-CAM carries its mark in every sentence that names it
    save("table_validity_gate", {"method": list(CAM_METHODS), "verdict": ["fails"] + ["passes"] * 4})
    marked = summary.verdict_lines(tmp_path, synthetic=True)
    assert "Grad-CAM\u2020's peak failure" in marked[3] and "Grad-CAM\u2020's mean IoU" in marked[5]
    missing = summary.verdict_lines(tmp_path / "missing", synthetic=False)
    assert missing[0] == "The validity gate did not run: no CAM method is validated."
    assert all("could not be computed (its table is missing)" in line for line in missing[1:])
    assert [line.split("**")[1] for line in missing[1:]] == [
        "RQ1, high score, where does the map look?", "RQ2, does it persist?",
        "RQ3, do the maps cover what the model uses?", "RQ4, transfer:"]


def test_the_brief_says_when_the_primary_fails_the_learning_rule_on_its_audited_images():
    import pandas as pd

    training = pd.DataFrame({"checkpoint_id": ["p", "q"], "primary": [True, False], "test_auprc": [0.97, 0.9],
                             "test_auprc_ci_low": [0.94, 0.8], "test_auprc_ci_high": [0.99, 0.95],
                             "n_test": [100, 100]})
    learning = pd.DataFrame({"checkpoint_id": ["p", "q", "p_shuffled"], "arch": ["efficientnet_b0"] * 3,
                             "seed": [1, 2, 1], "control": ["none", "none", "shuffled"],
                             "learned": [True, True, False], "not_learned_because": [None, None, "chance"]})
    learned = summary._classifier_sentence(training, learning)
    assert "2 of 2 checkpoints learned" in learned and "fails this rule" not in learned
    learning.loc[0, ["learned", "not_learned_because"]] = [False, "Grad-CAM or Eigen-CAM maps constant on 10% of 110 images"]
    failed = summary._classifier_sentence(training, learning)
    assert "1 of 2 checkpoints learned" in failed
    assert ("**The primary itself fails this rule** (Grad-CAM or Eigen-CAM maps constant on 10% of "
            "110 images): the audit tables below") in failed
    assert summary._classifier_sentence(training, None).endswith("(n = 100 held-out test images, 95% CI).")
    # a perfect test ranking has no interval, and the sentence does not name one
    training.loc[0, ["test_auprc", "test_auprc_ci_low", "test_auprc_ci_high"]] = [1.0, 1.0, 1.0]
    assert summary._classifier_sentence(training, None).endswith(
        "AUPRC 1.000 (the same in every bootstrap resample: no interval) (n = 100 held-out test images).")
