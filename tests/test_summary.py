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
    assert summary.readme_results_block(readme) == expected, (
        "README results block differs from tests/expected/default/summary.md: run "
        ".venv/bin/python scripts/readme_results.py")


def test_reference_summary_has_headline_and_machine_parts():
    text = REFERENCE.read_text()
    headline = summary.headline_part(text)
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

    from endoexplain_core.methods import CAM_METHODS

    def save(name, rows):
        pd.DataFrame(rows).to_csv(tmp_path / f"{name}.csv", index=False)

    save("table_validity_gate", {"method": [*CAM_METHODS, "random"],
                                 "verdict": ["passes", "passes", "inconclusive", "fails", "passes", "fails"]})
    save("table_s1_training", {"checkpoint_id": ["a", "b"], "primary": [False, True], "test_auprc": [0.5, 0.91],
                               "test_auprc_ci_low": [0.4, 0.85], "test_auprc_ci_high": [0.6, 0.95], "n_test": [50, 50]})
    save("table4_spatial_audit", {"panel": ["A"] * 7 + ["B"], "method": [*CAM_METHODS, "random", "centre", "gradcam"],
                                  "n": [12] * 8, "peak_failure": [0.1, 0.2, 0.3, 0.4, 0.5, 1.0, 0.25, 0.6]})
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
    assert "On the 12 audit images" in lines[2] and "for 0.10-0.50 of maps, by method" in lines[2]
    assert "centre baseline 0.25, random map 1.00" in lines[2]
    assert "0.08-0.20; its 95% CI lies above the centre baseline's IoU in 1 of 2" in lines[3]
    assert lines[4] == ("**Stability**: 2 of 4 headline verdicts held under a perturbed seed; 1 did not and "
                        "are printed as UNSTABLE; 1 could not be rerun.")
    assert lines[5].startswith("**Data**: every number comes from the synthetic cohort the package generates")
    assert len(summary.verdict_lines(tmp_path, synthetic=False)) == 5
    save("table4_spatial_audit", {"panel": ["A"] * 7, "method": [*CAM_METHODS, "random", "centre"],
                                  "n": [27] * 7, "peak_failure": [1.0] * 6 + [0.26]})
    assert "for 1.00 of maps for every method (centre" in summary.verdict_lines(tmp_path, synthetic=True)[2]
    assert summary.verdict_lines(tmp_path / "missing", synthetic=False) == [
        "The validity gate did not run: no CAM method is validated."]
