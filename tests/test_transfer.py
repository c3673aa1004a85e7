"""Frozen transfer: hash audit, summaries against hand/independent references, Figure 5."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from scipy import stats as scipy_stats  # noqa: E402

from endoexplain_core.methods import CAM_METHODS, MAP_METHODS
from endoexplain_core.analysis import transfer  # noqa: E402
from endoexplain_core.figures import transfer_figures  # noqa: E402

from endoexplain_core.analysis import audit_schema

from endoexplain_core.data import cohorts

SEED = 20260721  # the profiles' shared seed: bootstrap draws as in a run

REPO = Path(__file__).resolve().parent.parent


def case_table(dataset: str, rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame([{"dataset": dataset, "sample_id": s, "image_path": f"{dataset}/{s}.png",
                          "sha256": sha, "ahash": ah, "lesion_pixels": 5} for s, sha, ah in rows])


def test_hash_audit_finds_exact_and_ahash_overlaps_and_excludes_them():
    manifest = pd.DataFrame({"sample_id": ["hk1", "hk2", "hk3"], "role": ["train", "test", "val"],
                             "sha256": ["s1", "s2", "s3"], "ahash": ["a1", "a2", "a3"]})
    etis = case_table("etis", [("1", "s1", "a1"),      # byte copy of a training image
                               ("2", "x2", "a2"),      # near duplicate (same average hash)
                               ("3", "x3", "b3")])     # external
    polypgen = case_table("polypgen", [("C1/a", "x3", "c1"), ("C1/b", "y", "d")])
    overlaps = transfer.hash_audit({"etis": etis, "polypgen": polypgen}, manifest)
    as_tuples = set(overlaps.itertuples(index=False, name=None))
    assert as_tuples == {("etis", "1", "hyperkvasir", "hk1", "train", "sha256"),
                         ("etis", "2", "hyperkvasir", "hk2", "test", "ahash"),
                         ("etis", "3", "polypgen", "C1/a", "", "sha256")}
    summary = transfer.hash_audit_summary({"etis": etis, "polypgen": polypgen}, overlaps)
    assert summary.to_dict("records") == [
        {"dataset": "ETIS-LaribPolypDB", "cases_hashed": 3, "exact_overlap_hyperkvasir": 1,
         "ahash_only_overlap_hyperkvasir": 1, "overlap_other_cohorts": 1},
        {"dataset": "PolypGen", "cases_hashed": 2, "exact_overlap_hyperkvasir": 0,
         "ahash_only_overlap_hyperkvasir": 0, "overlap_other_cohorts": 1}]
    report = cohorts.CohortReport("etis", Path("ETIS-LaribPolypDB"), rows_read=3)
    kept = transfer.exclude_manifest_overlap(etis, overlaps, report)
    assert list(kept["sample_id"]) == ["3"]
    assert report.excluded_count(transfer.OVERLAP_REASON) == 2
    assert report.summary()["cases"] == 1


def audit_rows(dataset: str, iou_by_method: dict[str, list[float]], scores: list[float],
               peaks_out: list[bool]) -> pd.DataFrame:
    """A minimal valid audit table: every required column, crafted iou/score/peak columns."""
    rows = []
    for method, ious in iou_by_method.items():
        for index, iou in enumerate(ious):
            row = {column: 0 for column in audit_schema.REQUIRED_COLUMNS}
            row.update(dataset=dataset, sample_id=f"s{index}", checkpoint_id="efficientnet_b0_s1129",
                       arch="efficientnet_b0", method=method, threshold=0.2, iou=iou,
                       scaled_score=scores[index], peak_outside_mask=peaks_out[index],
                       calibration="scaled", temperature=1.5)
            rows.append(row)
    return pd.DataFrame(rows)


def crafted_audit() -> pd.DataFrame:
    methods = MAP_METHODS
    etis = audit_rows("etis", {m: [0.1 * (k + 1), 0.2, 0.3, 0.0] for k, m in enumerate(methods)},
                      scores=[0.95, 0.5, 0.91, 0.2], peaks_out=[True, False, False, True])
    polypgen = audit_rows("polypgen", {m: [0.5, 0.25] for m in methods}, scores=[0.1, 0.3],
                          peaks_out=[False, False])
    return pd.concat([etis, polypgen], ignore_index=True)


def independent_bootstrap(values, replicates, seed):
    """Reference percentile bootstrap written out with a loop (not the vectorised core)."""
    draws = np.random.default_rng(seed).integers(0, len(values), size=(replicates, len(values)))
    means = [np.mean(np.asarray(values)[row]) for row in draws]
    return np.percentile(means, [2.5, 97.5])


def test_transfer_summary_against_hand_values():
    summary = transfer.transfer_summary(crafted_audit(), score_threshold=0.90, top_fraction=0.2,
                                        replicates=300, seed=7)
    etis = summary[summary["dataset"] == "etis"].set_index("method")
    assert list(etis.index) == list(MAP_METHODS)
    assert etis.loc["gradcam", "n_cases"] == 4 and etis.loc["gradcam", "n_eligible"] == 2
    assert etis.loc["gradcam", "mean_iou"] == pytest.approx((0.1 + 0.2 + 0.3 + 0.0) / 4)
    assert etis.loc["gradcampp", "mean_iou_high_score"] == pytest.approx((0.2 + 0.3) / 2)
    assert etis.loc["gradcam", "peak_outside_high_score"] == pytest.approx(0.5)
    assert etis.loc["eigencam", "centre_baseline_iou"] == pytest.approx((0.7 + 0.5) / 4)
    # four cases: below stats.MIN_BOOTSTRAP_N a mean takes Student's t interval (scipy's)
    values = np.array([0.1, 0.2, 0.3, 0.0])
    low, high = scipy_stats.t.interval(0.95, 3, loc=values.mean(), scale=scipy_stats.sem(values))
    assert etis.loc["gradcam", ["ci_low", "ci_high"]].tolist() == pytest.approx([low, high])
    polypgen = summary[summary["dataset"] == "polypgen"].set_index("method")
    assert polypgen.loc["hirescam", "n_eligible"] == 0
    assert np.isnan(polypgen.loc["hirescam", "mean_iou_high_score"])
    assert np.isnan(polypgen.loc["hirescam", "peak_outside_high_score"])
    assert np.isnan(polypgen.loc["hirescam", "mean_iou_high_score_ci_low"])
    table = transfer.table_transfer(summary)
    assert "Eigen-CAM*" in set(table["method"]) and set(table["cohort"]) == {
        "ETIS-LaribPolypDB", "PolypGen"}


def test_chance_iou_matches_random_top_area_sets_drawn_at_random():
    """The analytic chance level against an independent Monte Carlo: random subsets of exactly
    the top fraction of pixels of a 64 x 64 frame, lesions of several sizes (and none)."""
    rng = np.random.default_rng(3)
    pixels, top = 64 * 64, 0.2
    for lesion_pixels in (0, 40, 205, 800, 2500):
        mask = np.zeros(pixels, bool)
        mask[:lesion_pixels] = True
        ious = []
        for _ in range(400):
            chosen = np.zeros(pixels, bool)
            chosen[rng.choice(pixels, int(top * pixels), replace=False)] = True
            ious.append((chosen & mask).sum() / (chosen | mask).sum())
        expected = transfer.chance_top_fraction_iou(np.array([lesion_pixels / pixels]), top)[0]
        assert expected == pytest.approx(np.mean(ious), abs=0.004), lesion_pixels
    assert transfer.chance_top_fraction_iou(np.array([1.0]), top)[0] == pytest.approx(top)


def test_summary_rejects_mixed_checkpoints():
    table = crafted_audit()
    table.loc[table["dataset"] == "polypgen", "checkpoint_id"] = "resnet34_s1129"
    with pytest.raises(ValueError, match="one \\(frozen\\) checkpoint"):
        transfer.transfer_summary(table, score_threshold=0.9, top_fraction=0.2, replicates=10, seed=SEED)


def test_breakdown_by_centre():
    table = crafted_audit()
    table = table[table["dataset"] == "polypgen"]
    cases = pd.DataFrame({"sample_id": ["s0", "s1"], "centre": ["C1", "C2"], "modality": ["", ""]})
    by_centre = transfer.breakdown(table, cases, "centre", score_threshold=0.2, replicates=50, seed=SEED)
    assert list(by_centre.columns) == list(transfer.BREAKDOWN_COLUMNS)
    assert by_centre["method"].tolist()[:len(MAP_METHODS)] == list(MAP_METHODS)   # protocol order
    gradcam = by_centre[by_centre["method"] == "gradcam"].set_index("group")
    assert gradcam.loc["C1", "mean_iou"] == 0.5 and gradcam.loc["C2", "mean_iou"] == 0.25
    assert gradcam.loc["C2", "n_eligible"] == 1 and gradcam.loc["C1", "n_eligible"] == 0
    assert transfer.breakdown(table, cases, "modality", score_threshold=0.2, replicates=2000, seed=SEED).empty


def test_figure5_bars_and_centre_segments():
    summary = transfer.transfer_summary(crafted_audit(), score_threshold=0.90, top_fraction=0.2, replicates=50, seed=SEED)
    fig = transfer_figures.figure5_transfer(summary, score_threshold=0.90, top_fraction=0.2)
    ax = fig.axes[0]
    bars = [p for p in ax.patches if p.get_height() > 0 or p.get_width() > 0]
    random_bars = [p for p in bars if p.get_linestyle() == "--"]
    cam_bars = [p for p in bars if not p.get_hatch() and p not in random_bars]
    centre_bars = [p for p in bars if p.get_hatch()]
    # the random heatmap is its own dashed bar per cohort; the chance level a tick on it
    assert sorted(p.get_height() for p in random_bars) == pytest.approx(
        sorted(summary.loc[summary["method"] == "random", "mean_iou"]))
    ticks = [line for line in ax.lines if line.get_label().startswith("Chance") or
             (len(line.get_xdata()) == 2 and line.get_color() == "black")]
    assert sorted(line.get_ydata()[0] for line in ticks) == pytest.approx(
        sorted(summary.drop_duplicates("dataset")["chance_iou"]))
    expected = summary[summary["method"].isin(CAM_METHODS)]["mean_iou"]
    assert sorted(round(p.get_height(), 6) for p in cam_bars) == sorted(round(v, 6) for v in expected)
    # the centre baseline is its own hatched bar per cohort, at the cohort's centre-baseline mean
    centre_levels = sorted(p.get_height() for p in centre_bars)
    assert centre_levels == pytest.approx(sorted(summary.drop_duplicates("dataset")["centre_baseline_iou"]))
    assert "Eigen-CAM*" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert "n = 4 (2 at score ≥ 0.90)" in ax.get_xticklabels()[0].get_text()
    caption = transfer_figures.figure5_caption(summary, score_threshold=0.90)
    assert "ETIS-LaribPolypDB: n = 4, 2 at scaled score ≥ 0.90, CAM mean IoU 0.150–0.250" in caption
    plt.close(fig)


def test_no_negatives_statement_is_computed():
    text = transfer.no_negatives_statement({"etis": case_table("etis", [("1", "a", "b")]),
                                            "polypdb": case_table("polypdb", [("2", "c", "d")])})
    assert text.startswith("The 2 analysed external cases (ETIS-LaribPolypDB, PolypDB)")
    assert "0 negative images" in text and "no external AUPRC, specificity or calibration" in text


def test_read_external_reads_required_and_present_cohorts_and_drops_manifest_overlaps(tmp_path, monkeypatch):
    """One rule for 06, 07, 08 and the case browser: required cohorts first, then the optional
    ones whose folder exists; manifest overlaps excluded and counted; absent optional cohorts
    left out."""
    manifest = pd.DataFrame({"sample_id": ["hk1"], "role": ["train"], "sha256": ["s1"], "ahash": ["a1"]})
    tables = {"etis": case_table("etis", [("1", "s1", "a1"), ("2", "x2", "b2")]),
              "polypgen": case_table("polypgen", [("C1/a", "y1", "c1")])}
    monkeypatch.setattr(transfer, "load_manifest", lambda path: manifest)
    monkeypatch.setattr(cohorts, "read_cohort", lambda name, root: (
        tables[name], cohorts.CohortReport(name, Path(cohorts.DATASET_FOLDERS[name]), rows_read=len(tables[name]))))
    (tmp_path / cohorts.DATASET_FOLDERS["polypgen"]).mkdir(parents=True)
    external = transfer.read_external(tmp_path / "run", tmp_path, required=["etis"],
                                      optional=["polypdb", "polypgen"])
    assert list(external.cases) == ["etis", "polypgen"]          # polypdb's folder is absent
    assert list(external.cases["etis"]["sample_id"]) == ["2"]    # the byte copy of hk1 is out
    assert len(external.read_cases["etis"]) == 2
    assert external.reports["etis"].excluded_count(transfer.OVERLAP_REASON) == 1
    assert list(transfer.external_cases(tmp_path / "run", tmp_path, ["polypdb", "polypgen"])) == ["polypgen"]
    assert transfer.read_external(tmp_path / "run", tmp_path, optional=["polypdb"]).cases == {}
