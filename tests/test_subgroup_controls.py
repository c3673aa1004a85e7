"""Subgroup controls, Holm families and pooled checkpoints (analysis.subgroup_controls,
subgroups, subgroup_audit): each checked against SciPy/statsmodels on small constructed data."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests

from endoexplain_core.analysis import subgroup_audit, subgroup_controls, subgroups
from tests.test_subgroups import add_holm_and_tost


def case_frame(n: int = 40, checkpoints=("a",), seed: int = 0, effect: float = -0.6) -> pd.DataFrame:
    """Long localisation outcomes: n images (half PolypGen C1, half C2), two methods, one row
    per (image, checkpoint, method); C1 maps lose ``effect`` bits of lift, the DoG map 0.2."""
    rng = np.random.default_rng(seed)
    centre = np.where(np.arange(n) < n // 2, "C1", "C2")
    subgroup = (centre == "C1").astype(float)
    image = {"sample_id": [f"s{i:03d}" for i in range(n)], "centre": centre, "modality": "",
             "dataset": "polypgen", "log_lesion_area": rng.normal(-3, 0.5, n),
             "centrality": rng.random(n), "fov_area": 0.8 + 0.1 * rng.random(n),
             "dog_lift": 1.0 - 0.2 * subgroup + 0.3 * rng.normal(size=n),
             "pointing_chance": 0.05 + 0.02 * subgroup + 0.01 * rng.random(n)}
    rows = []
    for k, checkpoint in enumerate(checkpoints):
        for method, offset in (("gradcam", 0.0), ("eigencam", -0.3)):
            lift = 1.5 + offset + 0.2 * k + effect * subgroup + 0.4 * rng.normal(size=n)
            rows.append(pd.DataFrame({**image, "checkpoint_id": checkpoint, "method": method,
                                      "energy_lift": lift,
                                      "pointing_hit": (rng.random(n) < 0.6 - 0.2 * subgroup).astype(float),
                                      "z": rng.normal(2, 1, n), "margin": rng.random(n),
                                      "correct": (rng.random(n) < 0.9).astype(float)}))
    return pd.concat(rows, ignore_index=True)


def labelled(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(subgroup=(frame["centre"] == "C1").astype(int),
                        cluster="polypgen/" + frame["sample_id"])


def test_method_minus_dog_is_welch_on_per_image_differences_and_the_difference_of_crude_gaps():
    frame = labelled(case_frame())
    controls = subgroup_controls.control_gaps("C1", frame).set_index(["control", "method"])
    crude = subgroups.crude_gaps(frame, outcomes=("energy_lift",)).set_index("method")
    dog = controls.loc[(subgroup_controls.DOG, "dog")]
    for method in ("gradcam", "eigencam"):
        row = controls.loc[(subgroup_controls.METHOD_MINUS_DOG, method)]
        assert row["gap"] == pytest.approx(crude.loc[method, "crude_gap"] - dog["gap"])
        part = frame[frame["method"] == method]
        difference = part["energy_lift"] - part["dog_lift"]
        expected = scipy_stats.ttest_ind(difference[part["subgroup"] == 1], difference[part["subgroup"] == 0],
                                         equal_var=False)
        assert row["p"] == pytest.approx(expected.pvalue)
        assert row["ci_low"] == pytest.approx(expected.confidence_interval().low)
        assert row["holm_family"] == subgroups.SECONDARY_FAMILY
    chance = controls.loc[(subgroup_controls.CHANCE, "")]
    per_image = frame.drop_duplicates("cluster")
    assert chance["gap"] == pytest.approx(100 * (per_image.loc[per_image["subgroup"] == 1, "pointing_chance"].mean()
                                                 - per_image.loc[per_image["subgroup"] == 0, "pointing_chance"].mean()))
    assert chance["n_subgroup"] == 20 and dog["holm_family"] == ""


def test_trained_minus_randomised_pairs_each_image_with_its_own_randomised_map():
    frame = labelled(case_frame())
    randomised = frame.assign(energy_lift=0.1, pointing_hit=0.0)   # a flat randomised network
    controls = subgroup_controls.control_gaps("C1", frame, randomised).set_index(["control", "outcome", "method"])
    trained = subgroups.crude_gaps(frame).set_index(["outcome", "method"])
    for outcome in ("energy_lift", "pointing_hit"):
        row = controls.loc[(subgroup_controls.TRAINED_MINUS_RANDOMISED, outcome, "gradcam")]
        # the randomised network has no gap here, so the difference is the trained gap itself
        assert row["gap"] == pytest.approx(trained.loc[(outcome, "gradcam"), "crude_gap"])
        assert controls.loc[(subgroup_controls.RANDOMISED, outcome, "gradcam"), "gap"] == pytest.approx(0.0)
    with pytest.raises(Exception):   # one randomised row per trained row, or the pairing is wrong
        subgroup_controls.control_gaps("C1", frame, pd.concat([randomised, randomised]))


def test_holm_runs_over_the_union_of_a_family_across_tables():
    first = pd.DataFrame({"holm_family": ["primary", "secondary", "secondary", ""],
                          "p": [0.01, 0.02, 0.04, 0.001]})
    second = pd.DataFrame({"holm_family": ["secondary", "secondary", "primary"], "p": [0.03, np.nan, 0.02]})
    first, second = subgroups.add_holm(first, second)
    secondary = multipletests([0.02, 0.04, 0.03], method="holm")[1]
    primary = multipletests([0.01, 0.02], method="holm")[1]
    np.testing.assert_allclose(first["p_holm"].iloc[:3], [primary[0], secondary[0], secondary[1]])
    np.testing.assert_allclose(second["p_holm"].iloc[[0, 2]], [secondary[2], primary[1]])
    assert np.isnan(first["p_holm"].iloc[3]) and np.isnan(second["p_holm"].iloc[1])


def test_families_follow_the_density_audit_design():
    assert subgroups.holm_family("energy_lift", "M1", "shared") == "primary"
    assert subgroups.holm_family("pointing_hit", "M1", "shared") == "secondary"
    assert subgroups.holm_family("srg", "M1", "shared") == "secondary"
    assert subgroups.holm_family("energy_lift", "M1", "method-specific").startswith("sensitivity")
    assert subgroups.holm_family("energy_lift", "M0", "shared") == "sensitivity: energy_lift M0 shared"


def test_pooled_checkpoints_add_a_checkpoint_term_and_recover_the_shared_gap():
    frame = labelled(case_frame(n=120, checkpoints=("a", "b", "c"), seed=3))
    contrast = subgroups.Contrast("C1", "C1", "other")
    gaps = subgroups.contrast_gaps(frame, contrast, outcomes=("energy_lift",), models=("M0",),
                                   sensitivity_model="")
    assert (gaps["n_checkpoints"] == 3).all() and (gaps["n_images"] == 120).all()
    for _, row in gaps.iterrows():
        assert row["ci_low"] < -0.6 < row["ci_high"]
    result, design = subgroups.fit_gee(frame, "energy_lift", [subgroups.CHECKPOINT_TERM])
    # the density audit's design: one intercept per (method, checkpoint) = 2 x 3, plus one
    # subgroup coefficient per method
    assert len(design.column_names) == 2 * 3 + 2
    cells = {name for name in design.column_names if name.startswith(f"C({subgroups.CELL_COLUMN})[")}
    assert cells == {f"C({subgroups.CELL_COLUMN})[{m}/{c}]" for m in ("gradcam", "eigencam") for c in "abc"}
    crude = subgroups.crude_gaps(frame, outcomes=("pointing_hit",))
    assert (crude["crude_interval"] == "Welch t").all() and (crude["n_subgroup"] == 60).all()
    single = subgroups.crude_gaps(frame[frame["checkpoint_id"] == "a"], outcomes=("pointing_hit",))
    assert (single["crude_interval"] == "Newcombe hybrid score").all()


def test_subgroup_table_adds_srg_lsr_and_controls_with_one_primary_family():
    cases = case_frame(n=40, checkpoints=("a", "b"), seed=5)
    rng = np.random.default_rng(2)
    images = cases.drop_duplicates("sample_id")
    srg = pd.concat([images[["dataset", "sample_id"]].assign(method=m, srg=rng.normal(0.2, 0.1, len(images)))
                     for m in ("gradcam", "eigencam")], ignore_index=True)
    lsr = images[["dataset", "sample_id"]].assign(lsr=rng.normal(0.1, 0.1, len(images)))
    lsr.loc[lsr.index[0], "lsr"] = np.nan   # no comparison region: left out
    gaps, crude, controls, skipped = subgroup_audit.subgroup_table(
        cases, min_images=8, models=("M0", "M1"), randomised=cases.assign(energy_lift=0.0, pointing_hit=0.0),
        faithfulness={"srg": srg, "lsr": lsr}, faithfulness_checkpoint="a")
    assert set(gaps["outcome"]) == {"energy_lift", "pointing_hit", "srg", "lsr"}
    primary = gaps[gaps["holm_family"] == "primary"]
    assert set(primary["outcome"]) == {"energy_lift"} and set(primary["model"]) == {"M1"}
    lsr_rows = gaps[gaps["outcome"] == "lsr"]
    assert set(lsr_rows["method"]) == {subgroups.LSR_METHOD} and (lsr_rows["n_images"] == 39).all()
    assert (gaps.loc[gaps["outcome"] == "srg", "n_checkpoints"] == 1).all()
    tested = controls[controls["holm_family"] == "secondary"]
    assert set(tested["control"]) == set(subgroup_controls.TESTED_CONTROLS)
    assert tested["p_holm"].notna().all() and (tested["p_holm"] >= tested["p"] - 1e-12).all()
    assert gaps.loc[gaps["outcome"].isin(["srg", "lsr"]), "tost_p"].isna().all()
    assert {"srg", "lsr"} <= set(crude["outcome"]) and skipped.empty


def test_a_checkpoint_that_never_hits_is_left_out_of_the_pooled_logistic_fit_not_the_whole_fit():
    """A checkpoint with 0 hits in a contrast has an infinite intercept and no information on
    the gap: it is named and left out, and the others' gap equals the fit without it."""
    frame = labelled(case_frame(n=80, checkpoints=("a", "b", "c"), seed=11))
    frame.loc[frame["checkpoint_id"] == "c", "pointing_hit"] = 0.0
    contrast = subgroups.Contrast("C1", "C1", "other")
    gaps = subgroups.contrast_gaps(frame, contrast, outcomes=("pointing_hit",), models=("M0",),
                                   sensitivity_model="")
    assert gaps["estimable"].all() and not gaps["separated"].any()
    assert gaps["note"].str.contains("left out, outcome constant in this contrast: "
                                     "eigencam/c \\(0/80 hits\\), gradcam/c \\(0/80 hits\\)").all()
    assert (gaps["n_checkpoints"] == 2).all()
    without = subgroups.contrast_gaps(frame[frame["checkpoint_id"] != "c"], contrast,
                                      outcomes=("pointing_hit",), models=("M0",), sensitivity_model="")
    np.testing.assert_allclose(gaps["gap"], without["gap"])
    kept, note = subgroups.fit_population(frame, "pointing_hit")
    assert set(kept["checkpoint_id"]) == {"a", "b"} and "gradcam/c (0/80 hits)" in note


@pytest.mark.parametrize("hits, expected_thin", [(1, True), (2, True), (3, False)])
def test_a_side_with_one_or_two_hit_images_is_too_thin_and_never_enters_holm_or_tost(hits, expected_thin):
    """PolypGen C1 in the default run had Grad-CAM++ 1/48 hits (8 images x 6 checkpoints) and TOST
    called the gap equivalent: one image decided it. Images count once however many checkpoints hit."""
    frame = labelled(case_frame(n=40, checkpoints=("a", "b"), seed=2))
    sub = frame["subgroup"] == 1
    frame.loc[sub, "pointing_hit"] = 0.0
    hit_images = frame.loc[sub, "sample_id"].unique()[:hits]
    frame.loc[sub & frame["sample_id"].isin(hit_images), "pointing_hit"] = 1.0   # every checkpoint hits them
    gaps = add_holm_and_tost(subgroups.contrast_gaps(
        frame, subgroups.Contrast("C1", "C1", "other"), outcomes=("pointing_hit",), models=("M0",),
        sensitivity_model=""))
    assert (gaps["too_thin"] == expected_thin).all()
    if expected_thin:
        assert gaps["gap"].isna().all() and gaps["p_holm"].isna().all() and not gaps["tost_equivalent"].any()
        assert gaps["note"].str.contains(f"the subgroup has {hits} image\\(s\\) with a hit").all()
    else:
        assert gaps["estimable"].all()


def test_prepare_subgroup_cohorts_puts_the_audit_pool_first_with_blank_labels(monkeypatch):
    from endoexplain_core.analysis import faithfulness
    from endoexplain_core.data import cohorts

    def frames(table, data_root, decode_size):
        for sample_id in table["sample_id"]:
            mask = np.zeros((16, 16), bool)
            mask[4:10, 4:10] = True
            yield sample_id, np.full((16, 16, 3), 120, np.uint8), mask

    monkeypatch.setattr(cohorts, "iter_cases", frames)
    pool = faithfulness.prepare_cases(frames(pd.DataFrame({"sample_id": ["p1", "p2"]}), None, 16), 16)
    external = {"polypgen": pd.DataFrame({"sample_id": ["C1/a"], "centre": ["C1"], "modality": ["WLI"],
                                          "image_path": ["x"]})}
    prepared, labels = subgroup_audit.prepare_subgroup_cohorts(pool, external, "/data", 16)
    assert list(prepared) == ["hyperkvasir", "polypgen"] and prepared["hyperkvasir"] is pool
    assert prepared["polypgen"].sample_ids == ["C1/a"] and prepared["polypgen"].images.shape == (1, 3, 16, 16)
    assert labels["hyperkvasir"].to_dict("list") == {"sample_id": ["p1", "p2"], "centre": ["", ""],
                                                      "modality": ["", ""]}
    assert list(labels["polypgen"].columns) == ["sample_id", "centre", "modality"]


def test_the_lesion_size_contrast_leaves_the_primary_family_and_its_chance_control_spends_no_test():
    """The energy lift's ceiling depends on the lesion share, which the size contrast defines:
    its M1 gaps form their own Holm family; its chance-level control (true by construction,
    the chance is the lesion share) is descriptive. Other contrasts keep their families."""
    assert subgroups.holm_family("energy_lift", "M1", "shared", subgroups.LESION_SIZE_CONTRAST) == \
        subgroups.LESION_SIZE_FAMILY
    assert subgroups.holm_family("energy_lift", "M1", "shared", "PolypGen: C1 vs other centres") == \
        subgroups.PRIMARY_FAMILY
    assert subgroups.holm_family("energy_lift", "M2", "shared", subgroups.LESION_SIZE_CONTRAST).startswith("sensitivity")
    assert subgroup_controls._control_family(subgroups.LESION_SIZE_CONTRAST, subgroup_controls.CHANCE) == ""
    assert subgroup_controls._control_family("PolypGen: C1 vs other centres", subgroup_controls.CHANCE) == \
        subgroups.SECONDARY_FAMILY


def test_crude_and_model_gaps_read_the_same_maps_and_hits_count_images():
    """Issue 35, item 8: a (method, checkpoint) cell that never hits leaves the model fit and
    the crude gap alike (one population per comparison); ``hits`` counts images (an image's
    share of hit maps over its checkpoints), with the map counts beside; every gap row carries
    the size of its fit's design; the crude table names its unit."""
    frame = labelled(case_frame(n=80, checkpoints=("a", "b", "c"), seed=11))
    never = (frame["checkpoint_id"] == "c") & (frame["method"] == "gradcam")
    frame.loc[never, "pointing_hit"] = 0.0
    contrast = subgroups.Contrast("C1", "C1", "other")
    gaps = subgroups.contrast_gaps(frame, contrast, outcomes=("pointing_hit",), models=("M0",),
                                   sensitivity_model="").set_index("method")
    crude = subgroups.crude_gaps(frame, outcomes=("pointing_hit",)).set_index("method")
    assert gaps.loc["gradcam", "n_checkpoints"] == crude.loc["gradcam", "n_checkpoints"] == 2
    assert gaps.loc["eigencam", "n_checkpoints"] == crude.loc["eigencam", "n_checkpoints"] == 3
    by_hand = subgroups.crude_gaps(frame[~never], outcomes=("pointing_hit",)).set_index("method")
    assert crude.loc["gradcam", "crude_gap"] == pytest.approx(by_hand.loc["gradcam", "crude_gap"])
    assert set(crude["unit"]) == {"pp"}
    # the design: 2 x 3 intercepts less the dropped cell, 2 subgroup coefficients, 80 images
    assert set(gaps["n_parameters"]) == {2 * 3 - 1 + 2} and set(gaps["n_clusters"]) == {80}
    sub = frame[(frame["method"] == "gradcam") & (frame["subgroup"] == 1) & ~never]
    shares = sub.groupby("cluster")["pointing_hit"].mean()
    expected = f"{shares.sum():.1f}/40 subgroup"
    assert gaps.loc["gradcam", "hits"].startswith(expected)
    assert f"{int(sub['pointing_hit'].sum())}/80" in gaps.loc["gradcam", "hits"]


def test_hits_of_one_checkpoint_are_whole_images():
    frame = pd.DataFrame({"cluster": list("abcdef"), "method": "gradcam", "checkpoint_id": "x",
                          "subgroup": [1, 1, 1, 0, 0, 0], "pointing_hit": [1, 0, 1, 0, 0, 1]})
    assert subgroups.hit_counts(frame, "pointing_hit", "gradcam") == "2/3 subgroup, 1/3 reference images"
    two = pd.concat([frame, frame.assign(checkpoint_id="y", pointing_hit=[1, 1, 0, 0, 0, 0])])
    assert subgroups.hit_counts(two, "pointing_hit", "gradcam") == (
        "2.0/3 subgroup, 0.5/3 reference images (4/6, 1/6 maps)")


def test_too_few_clusters_for_the_intercepts_leaves_no_p_and_says_the_design():
    """One intercept per (method, checkpoint): 8 checkpoints x 2 methods on 24 images leave
    fewer than MIN_SPARE_CLUSTERS clusters beyond the parameters."""
    frame = labelled(case_frame(n=24, checkpoints=tuple("abcdefgh"), seed=4))
    gaps = subgroups.contrast_gaps(frame, subgroups.Contrast("C1", "C1", "other"),
                                   outcomes=("energy_lift",), models=("M0",), sensitivity_model="")
    assert gaps["p"].isna().all() and not gaps["estimable"].any()
    assert gaps["note"].str.contains("too few clusters: 24 clusters for 18 parameters").all()
    assert set(gaps["n_parameters"]) == {18} and set(gaps["n_clusters"]) == {24}


def test_the_table_scan_finds_a_p_its_row_cannot_carry(tmp_path):
    """The scan the smoke and thin-data runs pass (tests/table_scan.py) does fail: a p beside
    'not estimable', beside an unconverged fit, from a GEE with too few clusters, or from a GEE
    row that does not say its design size."""
    from tests import table_scan

    base = {"model": "M1", "slopes": "shared", "se": 0.1, "gap": 0.2, "estimable": True, "note": "",
            "n_clusters": 40, "n_parameters": 20, "p": 0.03}
    rows = [base,
            {**base, "estimable": False},
            {**base, "note": "not estimable (too few clusters: 12 clusters for 10 parameters)"},
            {**base, "note": "did not converge"},
            {**base, "note": "refit under independence working correlation (exchangeable did not converge)"},
            {**base, "n_clusters": 25},
            {**base, "n_parameters": np.nan},
            {**base, "estimable": False, "p": np.nan}]
    pd.DataFrame(rows).to_csv(tmp_path / "table_gaps.csv", index=False)
    found = table_scan.unsupported_p_values(tmp_path)
    assert [line.split(":")[0] for line in found] == [f"table_gaps.csv row {i}" for i in (1, 2, 3, 5, 6)]
