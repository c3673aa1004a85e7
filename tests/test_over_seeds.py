"""Table 4 over training seeds (analysis.over_seeds): hand-computed cases and scipy's intervals."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from endoexplain_core.analysis import over_seeds
from endoexplain_core.methods import MAP_METHODS


def _audit(checkpoint, seed, failures, n=12, high=None, tied=None):
    """Audit-like rows: method m fails (peak outside) on the first failures[m] of n images; the
    first ``high`` images (all by default) score 0.95, the rest 0.5 (outside panel A); method m's
    maximum is tied over 4 pixels on the last tied[m] images."""
    high = n if high is None else high
    tied = tied or {}
    rows = []
    for i in range(n):
        for method in MAP_METHODS:
            rows.append({"checkpoint_id": checkpoint, "seed": seed, "sample_id": f"s{i:02d}",
                         "method": method, "scaled_score": 0.95 if i < high else 0.5,
                         "constant_map": method == "eigencam" and i == n - 1,
                         "max_multiplicity": 4 if i >= n - tied.get(method, 0) else 1,
                         "peak_outside_mask": i < failures.get(method, 0)})
    return pd.DataFrame(rows)


def _per_seed(rates: dict[str, list[float]], n=100):
    """A per-seed table with the given rates per method (one entry per seed), n images each."""
    rows = []
    for method, values in rates.items():
        for k, rate in enumerate(values):
            rows.append({"checkpoint_id": f"c{k}", "seed": k, "is_primary": k == 0, "method": method,
                         "label": method, "n": n, "n_constant": 0, "peak_failure": rate})
    return pd.DataFrame(rows)


def test_per_seed_reads_each_checkpoint_on_its_own_high_score_images():
    tables = pd.concat([_audit("a", 1, {"gradcam": 6, "centre": 3}),
                        _audit("b", 2, {"gradcam": 2, "centre": 4}, high=8),   # 8 images in panel A
                        _audit("c", 3, {"gradcam": 5}, high=0)])               # no panel A
    per_seed = over_seeds.table4_per_seed(tables, ["a", "b", "c"], 0.9, primary_id="a")
    assert list(per_seed.columns) == list(over_seeds.PER_SEED_COLUMNS)
    assert len(per_seed) == 3 * len(MAP_METHODS)
    keyed = per_seed.set_index(["checkpoint_id", "method"])
    assert keyed.loc[("a", "gradcam"), "peak_failure"] == pytest.approx(6 / 12)
    assert keyed.loc[("b", "gradcam"), ["n", "peak_failure"]].tolist() == [8, pytest.approx(2 / 8)]
    assert keyed.loc[("b", "centre"), "peak_failure"] == pytest.approx(4 / 8)
    # a constant map counts as a failure, as in Table 4
    assert keyed.loc[("a", "eigencam"), ["n_constant", "peak_failure"]].tolist() == [1, pytest.approx(1 / 12)]
    assert keyed.loc[("c", "gradcam"), "n"] == 0 and np.isnan(keyed.loc[("c", "gradcam"), "peak_failure"])
    assert per_seed.loc[per_seed["is_primary"], "checkpoint_id"].unique().tolist() == ["a"]


def test_primary_architecture_seeds_are_the_learned_non_control_checkpoints_of_its_architecture():
    learning = pd.DataFrame({"checkpoint_id": ["e3", "e1", "e2", "r1", "e1_shuffled"],
                             "arch": ["eff", "eff", "eff", "res", "eff"], "seed": [3, 1, 2, 1, 1],
                             "control": ["none", "none", "none", "none", "shuffled_labels"],
                             "learned": [True, True, False, True, True]})
    assert over_seeds.primary_architecture_seeds(learning, "e1") == ["e1", "e3"]
    with pytest.raises(ValueError, match="not in the learning table"):
        over_seeds.primary_architecture_seeds(learning, "x")


def test_the_mean_over_seeds_has_scipys_t_interval_when_the_seeds_scatter():
    rates = [0.30, 0.50, 0.40]
    over = over_seeds.table4_over_seeds(_per_seed({"gradcam": rates, "centre": [0.5, 0.5, 0.5]}))
    row = over.set_index("method").loc["gradcam"]
    low, high = scipy_stats.t.interval(0.95, 2, loc=np.mean(rates), scale=scipy_stats.sem(rates))
    assert row["n_seeds"] == 3 and row["n_images"] == 300
    assert row["peak_failure"] == pytest.approx(0.4)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert row["seed_sd"] == pytest.approx(0.1)
    assert (row["seed_min"], row["seed_max"]) == (0.30, 0.50)
    assert list(over.columns) == list(over_seeds.OVER_SEEDS_COLUMNS)


def test_seeds_that_agree_claim_no_more_than_the_binomial_error_of_their_images():
    over = over_seeds.table4_over_seeds(_per_seed({"gradcam": [0.5, 0.5, 0.5], "centre": [0.4] * 3}, n=20))
    row = over.set_index("method").loc["gradcam"]
    half = scipy_stats.t.ppf(0.975, 2) * np.sqrt(0.25 / 60)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    # the paired difference is floored likewise, at the two rates' binomial error
    diff_half = scipy_stats.t.ppf(0.975, 2) * np.sqrt((0.25 + 0.24) / 60)
    assert row["difference_ci_low"] == pytest.approx(0.1 - diff_half)
    assert row["versus_centre"] == "inconclusive"


def test_share_below_centre_is_paired_within_seed_with_its_clopper_pearson_interval():
    method, centre = [0.3, 0.6, 0.2, 0.7], [0.4, 0.5, 0.5, 0.8]
    over = over_seeds.table4_over_seeds(_per_seed({"gradcam": method, "centre": centre}))
    row = over.set_index("method").loc["gradcam"]
    # seeds 0, 2, 3 lie below their own centre; against the centre's mean (0.55) only two would
    assert (row["n_paired"], row["n_below_centre"], row["share_below_centre"]) == (4, 3, 0.75)
    exact = scipy_stats.binomtest(3, 4).proportion_ci(0.95, method="exact")
    assert row["share_below_centre_ci_low"] == pytest.approx(exact.low)
    assert row["share_below_centre_ci_high"] == pytest.approx(exact.high)
    differences = np.subtract(method, centre)
    low, high = scipy_stats.t.interval(0.95, 3, loc=differences.mean(), scale=scipy_stats.sem(differences))
    assert row["difference_from_centre"] == pytest.approx(differences.mean())
    assert (row["difference_ci_low"], row["difference_ci_high"]) == (pytest.approx(low), pytest.approx(high))
    new = scipy_stats.t.ppf(0.9, 3) * differences.std(ddof=1) * np.sqrt(1 + 1 / 4)
    assert row["one_new_seed_difference_low"] == pytest.approx(differences.mean() - new)
    centre_row = over.set_index("method").loc["centre"]
    assert centre_row["versus_centre"] == "" and np.isnan(centre_row["share_below_centre"])


def test_verdicts_against_centre_never_need_every_seed_to_agree():
    # one seed of six lies below the centre, yet the mean difference is clearly above it
    above = [0.80, 0.75, 0.85, 0.70, 0.78, 0.45]
    over = over_seeds.table4_over_seeds(_per_seed({"gradcam": above, "centre": [0.5] * 6}))
    row = over.set_index("method").loc["gradcam"]
    assert row["versus_centre"] == "above centre" and row["n_below_centre"] == 1
    assert row["versus_centre_rule"].startswith("paired difference") and row["note"] == ""
    # a bimodal method is read by its share of seeds below the centre
    bimodal = over_seeds.table4_over_seeds(_per_seed({"hirescam": [0.09, 0.99, 0.08, 0.10, 0.07, 0.12],
                                                       "centre": [0.5] * 6}))
    row = bimodal.set_index("method").loc["hirescam"]
    assert "bimodal" in row["note"] and "5 of 6" in row["note"]
    assert row["versus_centre_rule"].startswith("share of seeds")
    assert row["versus_centre"] == "inconclusive"   # 5 of 6: Clopper-Pearson 0.36 to 1.00 holds 1/2
    all_below = over_seeds.table4_over_seeds(_per_seed({"hirescam": [0.09, 0.99 - 0.6, 0.08, 0.10, 0.07, 0.95],
                                                         "centre": [0.5, 0.5, 0.5, 0.5, 0.5, 0.97]}))
    row = all_below.set_index("method").loc["hirescam"]
    assert row["n_below_centre"] == 6 and row["versus_centre"] == "below centre"   # CP 0.54 to 1
    one = over_seeds.table4_over_seeds(_per_seed({"gradcam": [0.3], "centre": [0.5]}))
    row = one.set_index("method").loc["gradcam"]
    assert row["versus_centre"] == "not estimable" and np.isnan(row["ci_low"]) and row["n_seeds"] == 1


def test_no_seed_gives_one_row_per_map_method_and_no_numbers():
    over = over_seeds.table4_over_seeds(over_seeds.table4_per_seed(pd.DataFrame(), [], 0.9))
    assert over["method"].tolist() == list(MAP_METHODS)
    assert (over["n_seeds"] == 0).all() and over["peak_failure"].isna().all()
    seeds_without_panel = pd.concat([_audit("a", 1, {}, high=0)])
    over = over_seeds.table4_over_seeds(over_seeds.table4_per_seed(seeds_without_panel, ["a"], 0.9))
    assert (over["n_seeds"] == 0).all()
    assert "no learned seed" in over_seeds.describe(over, over_seeds.table4_per_seed(seeds_without_panel, ["a"], 0.9), "a")


def test_per_seed_marks_a_cams_degenerate_maps_on_that_checkpoint_only():
    # b's Grad-CAM ties its maximum on 7 of 12 maps (> half: degenerate), a's on 6 (not more
    # than half); the rule reads every audited map, the 4 outside b's panel A included
    tables = pd.concat([_audit("a", 1, {"gradcam": 6}, tied={"gradcam": 6, "random": 12}),
                        _audit("b", 2, {"gradcam": 2}, high=8, tied={"gradcam": 7})])
    per_seed = over_seeds.table4_per_seed(tables, ["a", "b"], 0.9, primary_id="a").set_index(
        ["checkpoint_id", "method"])
    assert per_seed.loc[("b", "gradcam"), "degenerate"]
    assert "7 of 12 maps with tied maxima" in per_seed.loc[("b", "gradcam"), "degenerate_why"]
    assert not per_seed.loc[("a", "gradcam"), "degenerate"]
    # baselines are references, never checked (a's random map ties everywhere)
    assert not per_seed.loc[("a", "random"), "degenerate"]
    assert not per_seed.loc[("b", "xgradcam"), "degenerate"]


def test_degenerate_seeds_are_left_out_of_a_methods_mean_and_counted():
    per_seed = _per_seed({"gradcam": [0.2, 0.9, 0.3, 0.25], "centre": [0.5, 0.5, 0.5, 0.5]})
    per_seed["degenerate"] = (per_seed["method"] == "gradcam") & (per_seed["checkpoint_id"] == "c1")
    per_seed["degenerate_why"] = ""
    # a CSV round trip turns the bools into strings; the reading must not change
    for table in (per_seed, per_seed.assign(degenerate=per_seed["degenerate"].astype(str))):
        over = over_seeds.table4_over_seeds(table).set_index("method")
        assert over.loc["gradcam", ["n_seeds", "n_degenerate", "n_images"]].tolist() == [3, 1, 300]
        assert over.loc["gradcam", "peak_failure"] == pytest.approx(0.25)
        proper = over_seeds.table4_over_seeds(_per_seed({"gradcam": [0.2, 0.3, 0.25],
                                                          "centre": [0.5, 0.5, 0.5]})).set_index("method")
        assert over.loc["gradcam", "ci_high"] == pytest.approx(proper.loc["gradcam", "ci_high"])
        assert over.loc["centre", ["n_seeds", "n_degenerate"]].tolist() == [4, 0]
    text = over_seeds.describe_degenerate_seeds(per_seed)
    assert "Grad-CAM on c1" in text


def test_a_method_degenerate_on_every_seed_has_no_estimate():
    per_seed = _per_seed({"hirescam": [0.9, 0.95], "centre": [0.5, 0.5]})
    per_seed["degenerate"] = per_seed["method"] == "hirescam"
    over = over_seeds.table4_over_seeds(per_seed).set_index("method")
    assert over.loc["hirescam", ["n_seeds", "n_degenerate"]].tolist() == [0, 2]
    assert np.isnan(over.loc["hirescam", "peak_failure"])
    assert over.loc["hirescam", "versus_centre"] == "not estimable"
