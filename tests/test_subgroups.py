"""Confounder-aware subgroup gaps: GEE on simulated data with a known effect, g-computation,
TOST and Holm on hand-checkable cases."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from endoexplain_core.analysis import subgroups


def add_holm_and_tost(gaps: pd.DataFrame) -> pd.DataFrame:
    """``holm_family`` (``subgroups.holm_family``), ``p_holm`` within each family over every
    contrast and method with a finite p, and the TOST columns (``subgroups.add_tost``)."""
    contrasts = gaps["contrast"] if "contrast" in gaps else pd.Series("", index=gaps.index)
    gaps = gaps.assign(holm_family=[subgroups.holm_family(o, m, s, c) for o, m, s, c in
                                    zip(gaps["outcome"], gaps["model"], gaps["slopes"], contrasts)])
    return subgroups.add_tost(subgroups.add_holm(gaps)[0])


def simulated(n: int = 300, effect: float = 0.4, seed: int = 1) -> pd.DataFrame:
    """Two methods per image; the subgroup is more common among large lesions, and lesion
    size raises the outcome, so the crude gap overstates the true subgroup effect."""
    rng = np.random.default_rng(seed)
    confounder = rng.normal(size=n)
    subgroup = (confounder + 0.7 * rng.normal(size=n) > 0).astype(int)
    image_effect = 0.3 * rng.normal(size=n)  # shared by the two methods of an image
    rows = []
    for method, offset in (("gradcam", 0.0), ("eigencam", -0.5)):
        energy = offset + effect * subgroup + 1.5 * confounder + image_effect + 0.4 * rng.normal(size=n)
        hit_probability = 1 / (1 + np.exp(-(0.2 + 1.0 * confounder)))
        rows.append(pd.DataFrame({
            "cluster": np.arange(n), "method": method, "subgroup": subgroup,
            "energy_lift": energy, "pointing_hit": (rng.random(n) < hit_probability).astype(float),
            "log_lesion_area": confounder, "centrality": rng.random(n), "fov_area": rng.random(n),
            "margin": rng.random(n), "correct": 1.0, "dog_lift": rng.normal(size=n)}))
    return pd.concat(rows, ignore_index=True)


def test_gee_recovers_the_effect_in_m1_and_not_in_m0():
    frame = simulated()
    gaps = subgroups.contrast_gaps(frame, subgroups.Contrast("sim", "a", "b"),
                                   outcomes=("energy_lift",), models=("M0", "M1"))
    m0 = gaps[(gaps["model"] == "M0") & (gaps["slopes"] == "shared")]
    m1 = gaps[(gaps["model"] == "M1") & (gaps["slopes"] == "shared")]
    for _, row in m1.iterrows():
        assert row["ci_low"] < 0.4 < row["ci_high"]
    for _, row in m0.iterrows():
        assert row["ci_low"] > 0.8  # confounded: far above the true 0.4
    sensitivity = gaps[gaps["slopes"] == "method-specific"]
    assert len(sensitivity) == 2 and sensitivity["ci_low"].lt(0.4).all() and sensitivity["ci_high"].gt(0.4).all()


def test_linear_g_computation_equals_the_coefficient_and_ols_without_clustering_effects():
    frame = simulated(n=200, seed=3)
    result, design = subgroups.fit_gee(frame, "energy_lift", ["log_lesion_area"])
    gaps = subgroups.g_computation_gaps(result, design, frame, "energy_lift", ["gradcam", "eigencam"])
    names = list(design.column_names)
    for _, row in gaps.iterrows():
        index = names.index(f"C(method)[{row['method']}]:subgroup")
        assert row["gap"] == pytest.approx(result.params.iloc[index])
        assert row["se"] == pytest.approx(np.sqrt(result.cov_params().iloc[index, index]))


def test_logistic_gap_in_percentage_points_matches_the_group_difference_without_covariates():
    rng = np.random.default_rng(5)
    n = 400
    subgroup = np.repeat([0, 1], n // 2)
    hits = (rng.random(n) < np.where(subgroup == 1, 0.3, 0.6)).astype(float)
    frame = pd.DataFrame({"cluster": np.arange(n), "method": "gradcam", "subgroup": subgroup,
                          "pointing_hit": hits})
    result, design = subgroups.fit_gee(frame, "pointing_hit", [])
    gap = subgroups.g_computation_gaps(result, design, frame, "pointing_hit", ["gradcam"]).iloc[0]
    expected = 100 * (hits[subgroup == 1].mean() - hits[subgroup == 0].mean())
    assert gap["gap"] == pytest.approx(expected, abs=1e-6)
    # Unclustered binary data: the SE is close to the two-proportion standard error.
    p1, p0 = hits[subgroup == 1].mean(), hits[subgroup == 0].mean()
    se = 100 * np.sqrt(p1 * (1 - p1) / (n // 2) + p0 * (1 - p0) / (n // 2))
    assert gap["se"] == pytest.approx(se, rel=0.05)


def test_tost_on_known_cases():
    # 90% CI = 0.1 +- 1.645 * 0.1 = (-0.064, 0.264), inside +-0.5: equivalent.
    inside = subgroups.tost(0.1, 0.1, 0.5)
    assert inside["tost_equivalent"]
    assert inside["tost_p"] == pytest.approx(scipy_stats.norm.cdf((0.1 - 0.5) / 0.1))
    # Upper 90% limit 0.4 + 1.645 * 0.1 = 0.56 > 0.5: not equivalent.
    assert not subgroups.tost(0.4, 0.1, 0.5)["tost_equivalent"]
    # Boundary: the 90% limit exactly at the margin gives p = 0.05.
    edge = subgroups.tost(0.5 - scipy_stats.norm.ppf(0.95) * 0.2, 0.2, 0.5)
    assert edge["tost_p"] == pytest.approx(0.05)


def test_holm_and_tost_columns_and_constant_terms_are_left_out():
    frame = simulated(n=150, seed=7)
    gaps = add_holm_and_tost(subgroups.contrast_gaps(frame, subgroups.Contrast("sim", "a", "b")))
    assert {"tost_equivalent", "tost_p", "p_holm"} <= set(gaps.columns)
    assert (gaps["p_holm"] >= gaps["p"] - 1e-12).all()
    assert gaps.loc[gaps["model"] == "M2", "note"].str.contains("correct").all()
    assert set(gaps["margin"]) == {0.5, 10.0}


def test_model_terms_nest_and_exclude_the_defining_covariate():
    contrast = subgroups.Contrast("size", "small", "large", exclude=("log_lesion_area",),
                                  fixed_effects=("C(dataset)",))
    terms = [subgroups.model_terms(m, contrast) for m in subgroups.MODELS]
    assert terms[0] == []
    for smaller, larger in zip(terms, terms[1:]):
        assert set(smaller) < set(larger)
    assert "log_lesion_area" not in terms[-1] and "C(dataset)" in terms[1]


def test_a_method_with_a_constant_outcome_is_not_estimable_not_equivalent():
    frame = simulated(n=120, seed=9)
    frame.loc[frame["method"] == "eigencam", "pointing_hit"] = 0.0  # e.g. constant maps
    gaps = add_holm_and_tost(subgroups.contrast_gaps(
        frame, subgroups.Contrast("sim", "a", "b"), outcomes=("pointing_hit",), models=("M0", "M1")))
    eigen = gaps[gaps["method"] == "eigencam"]
    assert eigen["gap"].isna().all() and eigen["constant_outcome"].all()
    assert not eigen["tost_equivalent"].any()
    assert gaps.loc[gaps["method"] == "gradcam", "gap"].notna().all()


def _thin_contrast(subgroup_hits: int, subgroup_n: int, reference_hits: int, reference_n: int,
                   second_method: bool = True) -> pd.DataFrame:
    """Pointing hits of one separated method (``gradcam``) and, optionally, one ordinary
    method (``eigencam``, half of each side hits) on the same images."""
    n = subgroup_n + reference_n
    subgroup = np.r_[np.ones(subgroup_n), np.zeros(reference_n)].astype(int)
    hits = np.r_[np.ones(subgroup_hits), np.zeros(subgroup_n - subgroup_hits),
                 np.ones(reference_hits), np.zeros(reference_n - reference_hits)]
    methods = [("gradcam", hits)]
    if second_method:
        methods.append(("eigencam", (np.arange(n) % 2).astype(float)))
    rng = np.random.default_rng(7)
    return pd.concat([pd.DataFrame({
        "cluster": np.arange(n), "method": method, "subgroup": subgroup, "pointing_hit": outcome,
        "energy_lift": rng.normal(size=n), "log_lesion_area": rng.normal(size=n),
        "centrality": rng.random(n), "fov_area": rng.random(n), "margin": rng.random(n),
        "correct": 1.0, "dog_lift": rng.normal(size=n)}) for method, outcome in methods],
        ignore_index=True)


@pytest.mark.parametrize("subgroup_n, reference_hits, reference_n", [(3, 45, 50), (5, 48, 50)])
def test_a_separated_subgroup_is_not_estimable_never_significant_or_equivalent(
        subgroup_n, reference_hits, reference_n):
    """The review's cases: 3 of 3 subgroup images hit against 90% of the reference gave a
    'significant' +10 pp gap (its SE came from the reference side alone); 5 of 5 against 96%
    was declared equivalent by TOST. Both are separated: no finite maximum-likelihood gap."""
    frame = _thin_contrast(subgroup_n, subgroup_n, reference_hits, reference_n)
    # min_side_images=1 isolates the separation check (the per-side minimum would stop both first)
    gaps = add_holm_and_tost(subgroups.contrast_gaps(
        frame, subgroups.Contrast("thin", "a", "b"), outcomes=("pointing_hit",), models=("M0", "M1"),
        min_side_images=1))
    separated = gaps[gaps["method"] == "gradcam"]
    assert len(separated) == 3                       # M0, M1 shared, M1 method-specific
    assert separated["separated"].all() and not separated["estimable"].any()
    assert separated["gap"].isna().all() and separated["p_holm"].isna().all()
    assert not separated["tost_equivalent"].any()
    counts = f"{subgroup_n}/{subgroup_n} subgroup, {reference_hits}/{reference_n} reference images"
    assert separated["note"].str.contains(f"not estimable ({counts}; separation)", regex=False).all()
    ordinary = gaps[gaps["method"] == "eigencam"]
    assert ordinary["estimable"].all() and not ordinary["separated"].any()
    # the crude gap keeps an honest interval: Newcombe's, wide for a side of 3 or 5
    crude = subgroups.crude_gaps(frame, outcomes=("pointing_hit",)).set_index("method").loc["gradcam"]
    from statsmodels.stats.proportion import confint_proportions_2indep
    low, high = confint_proportions_2indep(subgroup_n, subgroup_n, reference_hits, reference_n,
                                           method="newcomb")
    assert (crude["crude_ci_low"], crude["crude_ci_high"]) == pytest.approx((100 * low, 100 * high))
    assert crude["crude_ci_low"] < 0 < crude["crude_ci_high"]


def test_separation_check_agrees_with_counts_and_leaves_ordinary_contrasts_alone():
    frame = _thin_contrast(2, 4, 30, 50, second_method=False)        # 2/4 vs 30/50: not separated
    assert subgroups.separated_methods(frame, "pointing_hit", [], ["gradcam"]) == {}
    frame = _thin_contrast(0, 11, 30, 50, second_method=False)       # 0/11: the default run's C3
    found = subgroups.separated_methods(frame, "pointing_hit", [], ["gradcam"])
    assert list(found) == ["gradcam"] and "subgroup" in found["gradcam"]


def test_every_method_separated_gives_not_estimable_rows_not_an_error():
    frame = _thin_contrast(3, 3, 50, 50, second_method=False)       # 3/3 vs 50/50: the outcome is constant
    frame.loc[frame.index[:2], "pointing_hit"] = 0.0                  # 1/3 vs 50/50: reference separated
    gaps = subgroups.contrast_gaps(frame, subgroups.Contrast("thin", "a", "b"),
                                   outcomes=("pointing_hit",), models=("M0",), min_side_images=1)
    assert not gaps["estimable"].any() and gaps["separated"].all() and gaps["p"].isna().all()


def test_a_pointing_interval_beyond_the_possible_range_is_named():
    """PolypGen C1 in the default run: 2/8 against 22/30 hits gave -63.5 pp (M1), 95% CI -102
    to -25. Here 1/8 against 29/30 (M0): about -84 pp with an SE near 12 pp."""
    frame = _thin_contrast(1, 8, 29, 30, second_method=False)
    row = subgroups.contrast_gaps(frame, subgroups.Contrast("c1", "a", "b"), outcomes=("pointing_hit",),
                                  models=("M0",), sensitivity_model="", min_side_images=1).iloc[0]
    assert row["estimable"] and row["ci_low"] < -100
    assert "passes +-100 pp" in row["note"]
    # with the default per-side minimum (3 images with and without a hit) it is not fitted at all
    thin = subgroups.contrast_gaps(frame, subgroups.Contrast("c1", "a", "b"), outcomes=("pointing_hit",),
                                   models=("M0",), sensitivity_model="").iloc[0]
    assert thin["too_thin"] and not thin["estimable"] and not thin["separated"]
    assert "the subgroup has 1 image(s) with a hit and 7 without" in thin["note"]
    inside = subgroups.contrast_gaps(_thin_contrast(2, 8, 22, 30, second_method=False),
                                     subgroups.Contrast("c", "a", "b"), outcomes=("pointing_hit",),
                                     models=("M0",), sensitivity_model="", min_side_images=1).iloc[0]
    assert inside["ci_low"] > -100 and "passes" not in inside["note"]


def test_confounder_only_model_keeps_the_preceding_factors_only():
    contrast = subgroups.Contrast("pdb", "enhanced", "white light", fixed_effects=("C(centre)",))
    assert subgroups.model_terms("Mc", contrast) == ["fov_area", "C(centre)"]
    frame = simulated(n=120, seed=4)
    gaps = subgroups.contrast_gaps(frame, subgroups.Contrast("sim", "a", "b"), outcomes=("energy_lift",),
                                   sensitivity_model="")
    assert list(gaps["model"].unique()) == list(subgroups.ALL_MODELS)
    # the simulated confounder is lesion area, which Mc leaves in: Mc stays near the crude M0
    by_model = gaps[gaps["method"] == "gradcam"].set_index("model")["gap"]
    assert abs(by_model["Mc"] - by_model["M0"]) < abs(by_model["M1"] - by_model["M0"])


def test_slope_heterogeneity_detects_method_specific_slopes_only_when_present():
    contrast = subgroups.Contrast("sim", "a", "b")
    shared = simulated(n=300, seed=8)
    different = shared.copy()
    eigencam = different["method"] == "eigencam"
    different.loc[eigencam, "energy_lift"] += 2.0 * different.loc[eigencam, "log_lesion_area"]
    p_values = {}
    for name, frame in (("shared", shared), ("different", different)):
        gaps = subgroups.contrast_gaps(frame, contrast, outcomes=("energy_lift",), models=("M1",))
        specific = gaps[gaps["slopes"] == "method-specific"]
        assert specific["slope_heterogeneity_p"].nunique() == 1
        p_values[name] = specific["slope_heterogeneity_p"].iloc[0]
        assert gaps.loc[gaps["slopes"] == "shared", "slope_heterogeneity_p"].isna().all()
    assert p_values["different"] < 1e-6 < 0.05 < p_values["shared"]


def test_slope_heterogeneity_equals_statsmodels_wald_test():
    terms = ["log_lesion_area", "centrality", "fov_area"]
    result, design = subgroups.fit_gee(simulated(n=300, seed=8), "energy_lift", terms,
                                       method_specific_slopes=True)
    names = list(design.column_names)
    restriction = np.zeros((len(terms), len(names)))
    for row, term in enumerate(terms):
        restriction[row, names.index(f"C(method)[gradcam]:{term}")] = 1.0
        restriction[row, names.index(f"C(method)[eigencam]:{term}")] = -1.0
    reference = result.wald_test(restriction, scalar=True)
    mine = subgroups.slope_heterogeneity(result, design, ["gradcam", "eigencam"], terms)
    assert mine["df"] == 3
    assert mine["statistic"] == pytest.approx(float(reference.statistic))
    # p: statsmodels' F statistic (Wald / df) on the cluster-robust denominator clusters - 1
    f_reference = result.wald_test(restriction, scalar=True, use_f=True)
    clusters = len(np.unique(result.model.groups))
    assert mine["p"] == pytest.approx(float(scipy_stats.f.sf(float(f_reference.statistic), 3, clusters - 1)))
    assert mine["p"] > float(reference.pvalue)          # more cautious than the chi-square reference


def test_too_few_clusters_for_the_parameters_is_not_estimable():
    """The review's default-run case: a method-specific fit with about as many parameters as
    image clusters. 12 images, 2 methods x (intercept, subgroup, 3 slopes) = 10 parameters:
    fewer than 10 clusters to spare, so no gap, SE or p is printed."""
    frame = simulated(n=12, seed=3)
    terms = ["log_lesion_area", "centrality", "fov_area"]
    with pytest.raises(subgroups.NotEstimable, match="too few clusters: 12 clusters for 10 parameters"):
        subgroups.fit_gee(frame, "energy_lift", terms, method_specific_slopes=True)
    gaps, _, note = subgroups.fit_estimable(frame, "energy_lift", terms, ["gradcam", "eigencam"],
                                            method_specific_slopes=True)
    assert gaps[["gap", "se"]].isna().all().all() and "not estimable (too few clusters" in note
    # the same images with shared slopes: 2 x 2 + 3 = 7 parameters, still too few to spare
    gaps, _, note = subgroups.fit_estimable(simulated(n=30, seed=3), "energy_lift", terms,
                                            ["gradcam", "eigencam"], method_specific_slopes=False)
    assert gaps[["gap", "se"]].notna().all().all() and note == ""


def test_a_fit_that_does_not_converge_is_refit_under_independence_or_not_estimable(monkeypatch):
    """Convergence is read, not silenced: an exchangeable fit that did not converge is refitted
    under independence (said in the note); if that fails too, nothing is printed."""
    from statsmodels.genmod.generalized_estimating_equations import GEE

    real_fit = GEE.fit
    frame, terms = simulated(n=120, seed=5), ["log_lesion_area"]

    def exchangeable_stalls(self, *args, **kwargs):
        result = real_fit(self, *args, **kwargs)
        if type(self.cov_struct).__name__ == "Exchangeable":
            result.converged = False
        return result

    monkeypatch.setattr(GEE, "fit", exchangeable_stalls)
    gaps, _, note = subgroups.fit_estimable(frame, "pointing_hit", terms, ["gradcam", "eigencam"],
                                            method_specific_slopes=False)
    assert gaps[["gap", "se"]].notna().all().all()
    assert "refit under independence working correlation" in note

    def never_converges(self, *args, **kwargs):
        result = real_fit(self, *args, **kwargs)
        result.converged = False
        return result

    monkeypatch.setattr(GEE, "fit", never_converges)
    gaps, _, note = subgroups.fit_estimable(frame, "pointing_hit", terms, ["gradcam", "eigencam"],
                                            method_specific_slopes=False)
    assert gaps[["gap", "se"]].isna().all().all() and "not estimable (did not converge" in note


def test_a_non_positive_or_rank_deficient_wald_statistic_gives_no_p():
    class Fake:
        params = np.array([0.0, 1.0, 2.0])
        model = type("M", (), {"groups": np.arange(30)})()

        def __init__(self, covariance):
            self._covariance = covariance

        def cov_params(self):
            return self._covariance

    design = type("D", (), {"column_names": ["Intercept", "C(method)[a]:x", "C(method)[b]:x"]})()
    singular = np.zeros((3, 3))
    assert np.isnan(subgroups.slope_heterogeneity(Fake(singular), design, ["a", "b"], ["x"])["p"])
    negative = np.diag([1.0, -1.0, -1.0])            # a covariance that is not one: Wald -0.5
    assert np.isnan(subgroups.slope_heterogeneity(Fake(negative), design, ["a", "b"], ["x"])["p"])
    fine = subgroups.slope_heterogeneity(Fake(np.eye(3)), design, ["a", "b"], ["x"])
    assert fine["statistic"] == pytest.approx(0.5)   # (1 - 2)^2 / (1 + 1)
    assert fine["p"] == pytest.approx(scipy_stats.f.sf(0.5, 1, 29))


def test_tost_needs_events_on_both_sides_and_a_crude_interval_inside_the_margin():
    """The review's toy: 8 vs 24 images x 6 checkpoints, 3/48 vs 6/144 hits: the Wald GEE's
    interval sits inside +-10 pp, but there are under one hit image per side and the crude
    interval reaches +10.7 pp: not "equivalent". With events and a narrow crude interval the
    model's TOST decides."""
    gaps = pd.DataFrame({"contrast": ["toy", "toy"], "outcome": ["pointing_hit", "energy_lift"],
                         "model": ["M1", "M1"], "slopes": ["shared", "shared"], "method": ["gradcam"] * 2,
                         "gap": [0.5, 0.05], "se": [1.0, 0.05]})
    thin = pd.DataFrame({"contrast": ["toy", "toy"], "outcome": ["pointing_hit", "energy_lift"],
                         "method": ["gradcam"] * 2, "n_subgroup": [8, 8], "n_reference": [24, 24],
                         "subgroup_mean": [100 * 3 / 48, 1.0], "reference_mean": [100 * 6 / 144, 1.0],
                         "crude_ci_low": [-5.0, -0.2], "crude_ci_high": [10.7, 0.3]})
    tested = subgroups.add_tost(gaps, thin).set_index("outcome")
    assert not tested.loc["pointing_hit", "tost_equivalent"]
    assert tested.loc["pointing_hit", "tost_blocked"] == (
        "fewer than 5 hit images on a side; the crude interval reaches the margin")
    assert tested.loc["energy_lift", "tost_equivalent"] and tested.loc["energy_lift", "tost_blocked"] == ""
    rich = thin.assign(n_subgroup=[80, 8], n_reference=[240, 24], subgroup_mean=[30.0, 1.0],
                       reference_mean=[31.0, 1.0], crude_ci_low=[-8.0, -0.2], crude_ci_high=[6.0, 0.3])
    assert subgroups.add_tost(gaps, rich).set_index("outcome").loc["pointing_hit", "tost_equivalent"]


def test_a_subgroup_without_a_single_hit_is_not_estimable_and_its_crude_gap_keeps_an_interval():
    """Thin data (issue 35, item 9): 0 of 12 subgroup images hit. The model gap is separated
    (no p, no TOST, no Holm slot); the crude gap keeps Newcombe's interval, valid at 0/n."""
    frame = _thin_contrast(0, 12, 30, 50)
    gaps = add_holm_and_tost(subgroups.contrast_gaps(
        frame, subgroups.Contrast("no hits", "a", "b"), outcomes=("pointing_hit",), models=("M0", "M1")))
    none = gaps[gaps["method"] == "gradcam"]
    assert not none["estimable"].any() and none["p"].isna().all() and none["p_holm"].isna().all()
    assert not none["tost_equivalent"].any()
    assert none["note"].str.contains("0/12 subgroup, 30/50 reference images", regex=False).all()
    crude = subgroups.crude_gaps(frame, outcomes=("pointing_hit",)).set_index("method").loc["gradcam"]
    assert crude["subgroup_mean"] == 0 and crude["crude_ci_low"] < crude["crude_gap"] < crude["crude_ci_high"] < 0


def test_logistic_gap_has_no_overflow_at_extreme_predictors():
    """A near-separated fit has linear predictors beyond -709, where exp(-x) overflows (a
    RuntimeWarning in an executed notebook); the g-computation must run without one and give
    the limits 0 and 1 for the fitted probabilities."""
    import types
    import warnings

    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"cluster": np.arange(40), "method": "gradcam", "subgroup": np.repeat([0, 1], 20),
                          "pointing_hit": (rng.random(40) < 0.5).astype(float)})
    result, design = subgroups.fit_gee(frame, "pointing_hit", [])
    names = list(design.column_names)
    params = np.zeros(len(names))
    params[names.index("C(method)[gradcam]")] = -1000.0              # reference group: p = 0
    params[names.index("C(method)[gradcam]:subgroup")] = 2000.0      # subgroup: p = 1
    extreme = types.SimpleNamespace(params=params, cov_params=lambda: np.eye(len(names)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gap = subgroups.g_computation_gaps(extreme, design, frame, "pointing_hit", ["gradcam"]).iloc[0]
    assert gap["gap"] == pytest.approx(100.0) and gap["se"] == pytest.approx(0.0)
