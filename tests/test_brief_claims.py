"""Every claim the brief makes is kept (issue 52, item 3): summary.md is read back against the
tables it was written from. The marks it announces are printed where it says, the primary's
selection says it was a tie and how the tie was broken, the source-category finding is the
table's, each deletion number has its unit with the lesion-deletion reference beside it, and
practically identical maps are one group in the brief and in Table 4."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from endoexplain_core import marks
from endoexplain_core.methods import CAM_METHODS, method_label
from endoexplain_core.pipeline import summary
from endoexplain_core.models import training as training_module

GROUP = "Grad-CAM = Grad-CAM++ = Eigen-CAM*"


def _identity_table() -> pd.DataFrame:
    """``table4_map_identity`` rows: Grad-CAM, Grad-CAM++ and Eigen-CAM identical in practice."""
    grouped = {"gradcam", "gradcampp", "eigencam"}
    rows = []
    for i, first in enumerate(CAM_METHODS):
        for second in CAM_METHODS[i + 1:]:
            same = {first, second} <= grouped
            rows.append({"first": first, "second": second, "median_pearson": 0.999 if same else 0.3,
                         "same_outcome_share": 1.0 if same else 0.6, "identical_in_practice": same,
                         "identical_by_construction": False})
    return pd.DataFrame(rows)


@pytest.fixture()
def run_tables(tmp_path):
    """The tables of a small run written to ``tmp_path``, as the stages write them."""
    def save(name, rows):
        pd.DataFrame(rows).to_csv(tmp_path / f"{name}.csv", index=False)

    save("table_validity_gate", {"method": [*CAM_METHODS, "random"], "verdict": ["passes"] * 5 + ["fails"],
                                 "lesion_rate": 0.6, "lesion_ci_low": 0.5, "lesion_ci_high": 0.7,
                                 "cue_rate": 0.6, "cue_ci_low": 0.5, "cue_ci_high": 0.7, "replicates_used": 3,
                                 "n_replicates": 3, "n": 64, "lesion_bar": 0.4, "cue_bar": 0.3, "margin": 0.25})
    save("table_s1_training", {
        "checkpoint_id": ["eff_s1", "eff_s2", "eff_s3", "res_s1"], "arch": ["efficientnet_b0"] * 3 + ["resnet18"],
        "seed": [1129, 2089, 3253, 1129], "control": "none", "val_auprc": [1.0, 1.0, 0.998, 0.99],
        "val_nll": [0.02, 0.05, 0.02, float("nan")], "primary": [True, False, False, False], "n_test": 112, "test_auprc": 0.98, "test_auprc_ci_low": 0.95,
        "test_auprc_ci_high": 1.0, "test_accuracy_at_0.5": 0.9, "test_accuracy_at_0.5_ci_low": 0.85,
        "test_accuracy_at_0.5_ci_high": 0.95})
    methods = [*CAM_METHODS, "random", "centre", "random_deletion"]
    panel_a = pd.DataFrame({
        "panel": "A", "method": methods, "label": [method_label(m) for m in methods], "n": 109, "n_constant": 0,
        "peak_failure": [0.26, 0.26, 0.29, 0.99, 0.26, 0.88, 0.5, None],
        "peak_failure_ci_low": [0.18, 0.18, 0.22, 0.95, 0.18, 0.81, 0.41, None],
        "peak_failure_ci_high": [0.35, 0.35, 0.38, 1.0, 0.35, 0.93, 0.6, None],
        "logit_drop": [0.08, 0.08, 0.08, -0.01, 0.08, None, None, -0.01],
        "logit_drop_ci_low": [0.06, 0.06, 0.05, -0.02, 0.06, None, None, -0.012],
        "logit_drop_ci_high": [0.1, 0.1, 0.1, -0.001, 0.1, None, None, 0.0],
        "identical_maps": [GROUP, GROUP, "", "", GROUP, "", "", ""]})
    pd.concat([panel_a, panel_a.assign(panel="B", n=110)]).to_csv(tmp_path / "table4_spatial_audit.csv", index=False)
    _identity_table().to_csv(tmp_path / "table4_map_identity.csv", index=False)
    save("table_s_map_priors", {"method": list(CAM_METHODS), "n_positive": 110, "lesion_logit_drop_mean": 0.45,
                                "cam_top_logit_drop_mean": [0.075, 0.076, 0.08, -0.01, 0.074]})
    save("table_s_faithfulness_lsr", {"lsr": [8.14], "ci_low": [7.9], "ci_high": [8.34], "n": [68]})
    save("table_source_category", {"target": [1, 1, 0, 0], "source": ["polyps", "dyed-lifted-polyps",
                                                                     "dyed-resection-margins", "cecum"],
                                   "false_negatives": [0, 2, 0, 0], "false_positives": [0, 0, 6, 0]})
    save("table_verdict_stability", {
        "part": ["validity gate", "validity gate", "primary selection", "Table 4 panel A vs centre",
                 "Table 4 panel A vs centre"],
        "subject": ["gradcampp", "gradcam", "eff_s1", "xgradcam", "gradcam"],
        "label": ["Grad-CAM++", "Grad-CAM", "eff_s1", "XGrad-CAM", "Grad-CAM"],
        "verdict": ["passes", "passes", "selected", "not above centre", "above centre"],
        "held": [False, True, True, False, True]})
    return tmp_path


def _brief_and_headline(figures_dir) -> tuple[str, str]:
    text = summary.summary_text(figures_dir, figures_dir, "test", synthetic=True)
    brief = text.split(summary.BRIEF_HEADING, 1)[1].split("\n## ", 1)[0]
    headline = text.split("## Headline numbers", 1)[1].split(summary.MACHINE_HEADING, 1)[0]
    return brief, headline


def _table_block(headline: str, title: str) -> str:
    """The Markdown table under the headline paragraph that starts with ``title``."""
    after = headline.split(title, 1)[1]
    return "\n".join(line for line in after.split("\n\n", 2)[1].splitlines() if line.startswith("|"))


def test_unstable_verdicts_are_marked_where_the_brief_says(run_tables):
    """The brief says unstable verdicts are listed as UNSTABLE and marked in the headline tables:
    each row of table_verdict_stability with held = False is, and no stable one is."""
    brief, headline = _brief_and_headline(run_tables)
    stability = pd.read_csv(run_tables / "table_verdict_stability.csv")
    unstable = stability[stability["held"].astype(str).str.lower() == "false"]
    claim = next(line for line in brief.splitlines() if line.startswith("- **Stability**"))
    assert f"{len(unstable)} did not" in claim and "listed as UNSTABLE" in claim and marks.UNSTABLE_MARK in claim
    stability_line = next(line for line in headline.splitlines() if line.startswith("**Stability under"))
    tables = {"validity gate": _table_block(headline, "**Validity gate**"),
              "Table 4 panel A vs centre": _table_block(headline, "**Table 4 panel A**")}
    for row in unstable.itertuples():
        assert f"{row.part}: {row.label} ({row.verdict})" in stability_line.split("UNSTABLE:")[1]
        assert f"| {row.label}{marks.UNSTABLE_MARK} |" in tables[row.part]
        if row.part == "validity gate":   # a gate verdict that did not hold marks the method everywhere
            assert f"| {row.label}{marks.UNSTABLE_MARK} |" in tables["Table 4 panel A vs centre"]
    assert f"| Grad-CAM{marks.UNSTABLE_MARK} |" not in headline and f"| Grad-CAM |" in headline
    assert f"eff_s1{marks.UNSTABLE_MARK}" not in headline


def test_the_primary_selection_says_it_was_a_tie_and_how_it_was_broken(run_tables):
    brief, _ = _brief_and_headline(run_tables)
    training = pd.read_csv(run_tables / "table_s1_training.csv")
    primary = training[training["primary"]].iloc[0]
    tied = training[(training["arch"] == primary["arch"])
                    & (training["val_auprc"] >= training["val_auprc"].max() - summary.PRIMARY_TIE_AUPRC)]
    # the stated tie-break is the one applied: lowest validation NLL, then lowest seed
    assert primary["checkpoint_id"] == training_module.tie_break_order(tied).iloc[0]["checkpoint_id"]
    claim = next(line for line in brief.splitlines() if line.startswith("- **Classifier**"))
    assert f"selected in a tie: {len(tied)} seeds of EfficientNet-B0" in claim
    assert all(f"{r.checkpoint_id} {r.val_auprc:.3f}" in claim for r in tied.itertuples())
    assert "broken by the lowest validation NLL (eff_s1 0.020, eff_s2 0.050, eff_s3 0.020" in claim
    assert "res_s1" not in claim
    assert "broken by the lowest seed" in summary._selection_clause(training.drop(columns="val_nll"))
    single = training.assign(val_auprc=[1.0, 0.95, 0.94, 0.99])
    assert "selected on validation AUPRC (1.000; the next, eff_s2, 0.950" in summary._selection_clause(single)


def test_the_source_category_finding_is_the_tables(run_tables):
    brief, _ = _brief_and_headline(run_tables)
    sources = pd.read_csv(run_tables / "table_source_category.csv")
    claim = next(line for line in brief.splitlines() if line.startswith("- **Errors by source category**"))
    assert "all of the 6 false positives are dyed-resection-margins frames" in claim
    assert int(sources["false_positives"].sum()) == 6
    assert "all of the 2 false negatives are dyed-lifted-polyps frames" in claim
    mixed = sources.assign(false_positives=[0, 0, 4, 2])
    assert "4 of the 6 false positives are dyed-resection-margins frames (67%)" in summary._sources_sentence(mixed)
    assert "no false negatives" in summary._sources_sentence(sources.assign(false_negatives=0))


def test_rq3_gives_each_deletion_its_unit_and_the_lesion_reference(run_tables):
    brief, _ = _brief_and_headline(run_tables)
    claim = next(line for line in brief.splitlines() if line.startswith("- **RQ3"))
    assert f"the logit drop ({summary.LOGIT_DROP_UNIT}) after deleting the top 20% of each map" in claim
    assert "deleting the lesion itself drops the same logit by 0.45 on average over the 110 audited images" in claim
    assert "carries -0.02 to 0.18 of the lesion's effect" in claim   # HiResCAM -0.01 / 0.45 to 0.08 / 0.45
    assert claim.index("after deleting the same area at random") < claim.index("deleting the lesion itself")
    lsr = claim[claim.index("lesion-specific reliance"):]
    assert "8.14 (7.90 to 8.34) in units of the temperature-scaled logit difference z / T" in lsr
    assert "not the unit of the deletions above" in lsr


def test_practically_identical_maps_are_one_group_in_the_brief_and_table4(run_tables):
    brief, headline = _brief_and_headline(run_tables)
    claim = next(line for line in brief.splitlines() if line.startswith("- **Identical maps**"))
    assert f"on the primary {GROUP} (3 methods, one piece of evidence)" in claim
    assert "never independent evidence" in claim
    table4 = _table_block(headline, "**Table 4 panel A**")
    assert re.search(r"\| identical maps \|$", table4.splitlines()[0])
    assert sum(line.endswith(f"| {GROUP} |") for line in table4.splitlines()) == 3
    alone = _identity_table().assign(identical_in_practice=False)
    assert summary._identity_sentence(alone) is None


def test_rq3_says_when_the_primarys_temperature_sits_on_its_bound(run_tables):
    """z / T with T on the search bound (a perfectly separated validation set) is the bound's
    number as much as the reliance's: the brief says so beside it, and only then."""
    lsr = pd.read_csv(run_tables / "table_s_faithfulness_lsr.csv").assign(checkpoint_id="eff_s1")
    lsr.to_csv(run_tables / "table_s_faithfulness_lsr.csv", index=False)
    calibration = pd.DataFrame({"checkpoint_id": ["eff_s1", "eff_s1"], "split": ["Validation", "Test"],
                                "score": "Temperature-scaled", "temperature": 0.05,
                                "temperature_at_bound": True})
    calibration.to_csv(run_tables / "table3_calibration.csv", index=False)
    claim = next(line for line in _brief_and_headline(run_tables)[0].splitlines() if line.startswith("- **RQ3"))
    assert "T = 0.050 sits on the search bound, so z / T is 20 times the raw logit difference" in claim
    calibration.assign(temperature=0.8, temperature_at_bound=False).to_csv(
        run_tables / "table3_calibration.csv", index=False)
    claim = next(line for line in _brief_and_headline(run_tables)[0].splitlines() if line.startswith("- **RQ3"))
    assert "search bound" not in claim


def test_figures_name_the_identity_groups_in_their_footer(tmp_path):
    """Figures 2, 3 and 4 draw the grouped methods side by side: their footer says the group is
    one piece of evidence, read back from the CSV the run writes (flags as text there)."""
    from endoexplain_core.analysis import map_diagnostics

    assert map_diagnostics.read_identity_table(tmp_path) is None
    assert map_diagnostics.identity_footer(None) == ""
    _identity_table().to_csv(tmp_path / "table4_map_identity.csv", index=False)
    identity = map_diagnostics.read_identity_table(tmp_path)
    assert identity["identical_in_practice"].dtype == bool
    footer = map_diagnostics.identity_footer(identity)
    assert footer.startswith("Practically identical maps on the primary") and GROUP in footer
    alone = _identity_table().assign(identical_in_practice=False)
    alone.to_csv(tmp_path / "table4_map_identity.csv", index=False)
    assert map_diagnostics.identity_footer(map_diagnostics.read_identity_table(tmp_path)) == ""
