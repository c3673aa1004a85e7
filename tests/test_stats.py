"""Statistics against hand cases, scipy and statsmodels."""

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests
import statsmodels.api as sm

from endoexplain_core.analysis import stats

SEED = 20260721  # the profiles' shared seed: bootstrap draws as in a run


def test_bootstrap_is_deterministic_and_matches_a_loop_over_the_same_indices():
    values = np.random.default_rng(0).normal(size=37)
    first = stats.bootstrap_mean_ci(values, replicates=300, seed=SEED)
    second = stats.bootstrap_mean_ci(values, replicates=300, seed=SEED)
    assert first == second
    # Independent reference: a per-replicate loop with the same seeded generator.
    rng = np.random.default_rng(SEED)
    index = rng.integers(0, values.size, size=(300, values.size))
    means = np.array([values[row].mean() for row in index])
    assert first["estimate"] == pytest.approx(values.mean())
    assert first["ci_low"] == pytest.approx(np.percentile(means, 2.5))
    assert first["ci_high"] == pytest.approx(np.percentile(means, 97.5))
    other_seed = stats.bootstrap_mean_ci(values, replicates=300, seed=1)
    assert other_seed["ci_low"] != first["ci_low"]


def test_bootstrap_interval_agrees_with_scipy_percentile_bootstrap():
    values = np.random.default_rng(1).exponential(size=400)
    ours = stats.bootstrap_mean_ci(values, replicates=5000, seed=SEED)
    reference = scipy_stats.bootstrap((values,), np.mean, n_resamples=5000, method="percentile",
                                      random_state=np.random.default_rng(2)).confidence_interval
    # Different random draws: intervals agree to Monte-Carlo error.
    assert ours["ci_low"] == pytest.approx(reference.low, abs=0.015)
    assert ours["ci_high"] == pytest.approx(reference.high, abs=0.015)


def test_two_dimensional_bootstrap_resamples_columns_with_the_same_images():
    column = np.arange(10.0)
    result = stats.bootstrap_mean_ci(np.stack([column, column + 1.0], axis=1), replicates=200, seed=SEED)
    np.testing.assert_allclose(result["ci_low"][1] - result["ci_low"][0], 1.0)
    np.testing.assert_allclose(result["ci_high"][1] - result["ci_high"][0], 1.0)
    single = stats.bootstrap_mean_ci(column, replicates=200, seed=SEED)
    assert single["ci_low"] == pytest.approx(result["ci_low"][0])


def test_bootstrap_of_an_empty_population_is_nan_and_nan_values_are_rejected():
    empty = stats.bootstrap_mean_ci(np.array([]), replicates=2000, seed=SEED)
    assert empty["n"] == 0 and np.isnan(empty["estimate"]) and np.isnan(empty["ci_low"])
    with pytest.raises(ValueError, match="NaN"):
        stats.bootstrap_mean_ci(np.array([1.0, np.nan]), replicates=2000, seed=SEED)


def test_paired_difference_of_a_constant_shift_is_exact():
    first = np.random.default_rng(3).normal(size=50)
    result = stats.paired_difference_ci(first + 0.25, first, replicates=100, seed=SEED)
    assert result["estimate"] == pytest.approx(0.25)
    assert result["ci_low"] == pytest.approx(0.25) and result["ci_high"] == pytest.approx(0.25)
    with pytest.raises(ValueError):
        stats.paired_difference_ci(first, first[:-1], replicates=2000, seed=SEED)


def test_exact_paired_binomial_hand_case():
    # 2 images fail only under the first method, 8 only under the second, 5 under both.
    first = np.array([1] * 2 + [0] * 8 + [1] * 5 + [0] * 5, dtype=bool)
    second = np.array([0] * 2 + [1] * 8 + [1] * 5 + [0] * 5, dtype=bool)
    result = stats.exact_paired_binomial(first, second)
    assert (result["first_only"], result["second_only"]) == (2, 8)
    # Two-sided exact: 2 * P(X <= 2), X ~ Bin(10, 1/2) = 2 * 56 / 1024.
    assert result["p_value"] == pytest.approx(112 / 1024)
    assert result["p_value"] == pytest.approx(scipy_stats.binomtest(2, 10).pvalue)
    assert stats.exact_paired_binomial(first, first)["p_value"] == 1.0


def test_paired_wilcoxon_matches_scipy_and_handles_identical_maps():
    rng = np.random.default_rng(4)
    first, second = rng.uniform(size=30), rng.uniform(size=30)
    result = stats.paired_wilcoxon(first, second)
    reference = scipy_stats.wilcoxon(first, second)
    assert result["p_value"] == pytest.approx(reference.pvalue)
    assert result["statistic"] == pytest.approx(reference.statistic)
    same = stats.paired_wilcoxon(first, first)
    assert same["p_value"] == 1.0 and same["n_nonzero"] == 0


def test_holm_matches_hand_case_and_statsmodels():
    p = np.array([0.01, 0.04, 0.03, 0.20])
    # Sorted 0.01, 0.03, 0.04, 0.20 -> 0.04, 0.09, max(0.09, 0.08)=0.09, max(0.09, 0.20)=0.20.
    np.testing.assert_allclose(stats.holm_adjust(p), [0.04, 0.09, 0.09, 0.20])
    random_p = np.random.default_rng(5).uniform(size=12) ** 3
    np.testing.assert_allclose(stats.holm_adjust(random_p),
                               multipletests(random_p, method="holm")[1])
    with pytest.raises(ValueError):
        stats.holm_adjust([0.5, 1.5])


def test_holm_over_defined_tests_leaves_untestable_pairs_out_of_the_family():
    # The NaN (no test possible) is not a member: the other three are adjusted as a family of 3.
    adjusted = stats.holm_adjust_defined([0.01, np.nan, 0.03, 0.20])
    np.testing.assert_allclose(adjusted, [0.03, np.nan, 0.06, 0.20])
    assert np.isnan(stats.holm_adjust_defined([np.nan, np.nan])).all()


def _simulated_logistic(n, coefficients, seed):
    rng = np.random.default_rng(seed)
    design = np.column_stack([np.ones(n), rng.normal(size=(n, len(coefficients) - 1))])
    probability = 1.0 / (1.0 + np.exp(-design @ coefficients))
    return design, (rng.uniform(size=n) < probability).astype(float)


def test_ridge_logistic_recovers_known_odds_ratios_and_matches_statsmodels():
    truth = np.array([-0.5, 1.0, -0.7, 0.3])
    design, outcome = _simulated_logistic(20000, truth, seed=6)
    beta = stats.fit_ridge_logistic(design, outcome)
    np.testing.assert_allclose(beta, truth, atol=0.06)
    reference = sm.Logit(outcome, design).fit(disp=0).params
    np.testing.assert_allclose(beta, reference, atol=1e-3)


def test_ridge_logistic_stays_finite_under_separation():
    design = np.column_stack([np.ones(6), [-3.0, -2.0, -1.0, 1.0, 2.0, 3.0]])
    beta = stats.fit_ridge_logistic(design, np.array([0, 0, 0, 1, 1, 1.0]), penalty=1e-2)
    assert np.all(np.isfinite(beta)) and beta[1] > 1.0


def test_weighted_fit_equals_fit_on_duplicated_rows():
    design, outcome = _simulated_logistic(200, np.array([0.2, 0.8]), seed=7)
    weights = np.random.default_rng(8).integers(0, 3, size=200).astype(float)
    repeated = np.repeat(np.arange(200), weights.astype(int))
    np.testing.assert_allclose(stats.fit_ridge_logistic(design, outcome, weights=weights),
                               stats.fit_ridge_logistic(design[repeated], outcome[repeated]),
                               atol=1e-8)


def test_cluster_bootstrap_odds_ratios_cover_the_truth_and_are_deterministic():
    truth = np.array([0.0, np.log(3.0), np.log(0.5)])
    design, outcome = _simulated_logistic(3000, truth, seed=9)
    clusters = np.repeat(np.arange(1000), 3)            # three rows per "image"
    names = ["intercept", "a", "b"]
    result = stats.cluster_bootstrap_odds_ratios(design, outcome, clusters, names, replicates=200, seed=SEED)
    again = stats.cluster_bootstrap_odds_ratios(design, outcome, clusters, names, replicates=200, seed=SEED)
    np.testing.assert_array_equal(result["ci_low"], again["ci_low"])
    assert list(result["term"]) == ["a", "b"]
    assert np.all(result["ci_low"] < np.exp(truth[1:])) and np.all(np.exp(truth[1:]) < result["ci_high"])
    assert np.all(result["ci_low"] < result["odds_ratio"]) and np.all(result["odds_ratio"] < result["ci_high"])


def test_ridge_logistic_is_finite_when_every_outcome_is_one():
    design = np.column_stack([np.ones(5), np.arange(5.0)])
    beta = stats.fit_ridge_logistic(design, np.ones(5))
    assert np.all(np.isfinite(beta)) and beta[0] > 5


def test_ridge_logistic_converges_when_every_outcome_of_a_replicate_is_one():
    # A bootstrap replicate that draws only failures (HiResCAM fails on 108 of 109 panel-A
    # images) leaves the intercept with curvature of about its penalty, 1e-8: the default
    # run's stability check stopped there ("did not converge", gradient norm 3e-13).
    rng = np.random.default_rng(21)
    design = np.column_stack([np.ones(300), rng.integers(0, 2, (300, 2))]).astype(float)
    every_one, every_zero = (stats.fit_ridge_logistic(design, np.full(300, value)) for value in (1.0, 0.0))
    np.testing.assert_allclose(every_one, -every_zero, rtol=1e-6)
    probability = 1.0 / (1.0 + np.exp(-design @ every_one))
    ridge = np.r_[stats.INTERCEPT_PENALTY, np.full(2, stats.RIDGE_PENALTY)]
    assert np.abs((1.0 - probability) @ design - ridge * every_one).max() < 1e-9
    # In a batch of replicates, the one that drew only outcome-1 rows is that subset's fit.
    outcome = (rng.uniform(size=300) < 0.9).astype(float)
    weights = np.stack([np.ones(300), outcome])
    batch = stats.fit_ridge_logistic(design, outcome, weights=weights)
    ones = outcome == 1.0
    np.testing.assert_allclose(batch[1], stats.fit_ridge_logistic(design[ones], outcome[ones]), rtol=1e-6)
    np.testing.assert_allclose(batch[0], stats.fit_ridge_logistic(design, outcome), rtol=1e-6)


# --------------------------------------------------------------------------- issue 10: what the data support

def test_wilson_rate_intervals_match_statsmodels_over_many_counts():
    from statsmodels.stats.proportion import proportion_confint

    rng = np.random.default_rng(22)
    cases = [(59, 59), (0, 59), (3, 46), (1, 6), (18, 147), (5, 5), (0, 1), (1, 1)]
    cases += [(int(k), int(n)) for n in rng.integers(1, 400, 60) for k in [rng.integers(0, n + 1)]]
    for k, n in cases:
        reference = proportion_confint(k, n, alpha=0.05, method="wilson")
        assert stats.wilson_interval(k, n) == pytest.approx(reference, abs=1e-10)
        outcomes = np.r_[np.ones(k), np.zeros(n - k)]
        rate = stats.rate_ci(rng.permutation(outcomes))
        assert (rate["ci_low"], rate["ci_high"]) == pytest.approx(reference, abs=1e-10)
        assert rate["estimate"] == pytest.approx(k / n) and rate["successes"] == k and rate["n"] == n
        assert rate["interval"] == stats.WILSON
    assert np.isnan(stats.wilson_interval(0, 0)[0]) and np.isnan(stats.rate_ci(np.zeros(0))["estimate"])
    # the endpoints are exact, so an error bar drawn from (estimate - low, high - estimate) is
    # never negative (rounding put the upper bound of 80/80 at 1 - 1e-16)
    counts = np.arange(1, 400)
    assert (stats.wilson_interval(counts, counts)[1] == 1.0).all()
    assert (stats.wilson_interval(0 * counts, counts)[0] == 0.0).all()


@pytest.mark.parametrize("n", [5, 16, 59, 172])
def test_rate_interval_bounds_rise_with_the_count(n):
    """The issue's counter-examples: a percentile bootstrap gave 0.0212 for 0/172 but 0.0174
    for 1/172. Under the one rule both bounds rise strictly with k at fixed n."""
    columns = np.array([np.r_[np.ones(k), np.zeros(n - k)] for k in range(n + 1)]).T
    rate = stats.rate_ci(columns)                     # one column per k, same n images
    assert np.all(np.diff(rate["ci_low"]) > 0) and np.all(np.diff(rate["ci_high"]) > 0)
    assert rate["ci_low"][0] == 0.0 and rate["ci_high"][-1] == 1.0
    assert np.all(rate["ci_low"] <= rate["estimate"]) and np.all(rate["estimate"] <= rate["ci_high"])
    assert (rate["interval"] == stats.WILSON).all()


def test_rate_refuses_undefined_or_non_binary_outcomes():
    with pytest.raises(ValueError, match="0/1"):
        stats.rate_ci(np.array([1.0, np.nan, 0.0]))
    with pytest.raises(ValueError, match="0/1"):
        stats.rate_ci(np.array([0.5, 1.0]))


def test_bootstrap_of_means_is_a_percentile_interval_and_stays_a_point_when_constant():
    mixed = np.r_[np.ones(10), np.zeros(10)]
    matrix = stats.bootstrap_mean_ci(np.column_stack([np.full(20, 0.3), mixed]), replicates=200, seed=SEED)
    assert list(matrix["interval"]) == [stats.PERCENTILE_BOOTSTRAP] * 2
    assert matrix["ci_low"][0] == pytest.approx(0.3) and matrix["ci_high"][0] == pytest.approx(0.3)
    same = stats.paired_difference_ci(np.ones(12), np.ones(12), replicates=50, seed=SEED)
    assert same["ci_low"] == same["ci_high"] == 0.0


@pytest.mark.parametrize("n", [2, 3, 5, 9])
def test_a_mean_of_fewer_than_ten_images_gets_students_t_interval_or_none(n):
    """The percentile bootstrap undercovers at small n: below MIN_BOOTSTRAP_N a mean takes the
    t interval (scipy's), and values without spread or a single image get no interval."""
    values = np.random.default_rng(n).normal(size=n)
    result = stats.bootstrap_mean_ci(values, replicates=200, seed=SEED)
    low, high = scipy_stats.t.interval(0.95, n - 1, loc=values.mean(), scale=scipy_stats.sem(values))
    assert (result["ci_low"], result["ci_high"]) == pytest.approx((low, high))
    assert result["interval"] == stats.STUDENT_T
    constant = stats.bootstrap_mean_ci(np.full(n, 0.4), replicates=200, seed=SEED)
    assert constant["estimate"] == pytest.approx(0.4) and np.isnan(constant["ci_low"])
    assert constant["interval"] == stats.NO_INTERVAL
    single = stats.bootstrap_mean_ci(np.array([0.7]), replicates=200, seed=SEED)
    assert np.isnan(single["ci_high"]) and single["interval"] == stats.NO_INTERVAL


def test_a_small_sample_mean_score_interval_stays_within_the_scores_range():
    # five scores, two of them near 0: Student's t reaches past 1 (the default run's standard
    # polyps on the test split: 0.025 to 1.120), clipped to [0, 1] when the range is given
    scores = np.array([0.01, 0.02, 0.99, 0.99, 0.995])
    plain = stats.bootstrap_mean_ci(scores, replicates=200, seed=SEED)
    assert plain["ci_high"] > 1 and plain["ci_low"] < 0
    clipped = stats.bootstrap_mean_ci(scores, replicates=200, seed=SEED, bounds=(0.0, 1.0))
    assert (clipped["ci_low"], clipped["ci_high"]) == (0.0, 1.0)
    assert clipped["estimate"] == pytest.approx(scores.mean())


def test_separation_directions_agree_with_firthmodels_detector():
    from firthmodels import detect_separation

    rng = np.random.default_rng(12)
    for case in range(6):
        x = rng.normal(size=(40, 2))
        y = (rng.uniform(size=40) < 0.5).astype(float)
        if case % 2:                                   # quasi-complete: indicator with all y = 1
            indicator = (np.arange(40) < 8).astype(float)
            y[indicator == 1] = 1.0
            x = np.column_stack([x, indicator])
        design = np.column_stack([np.ones(40), x])
        ours = stats.separation_directions(design, y)
        reference = detect_separation(x, y).directions        # intercept last there
        np.testing.assert_array_equal(ours, np.r_[reference[-1], reference[:-1]])
        assert (ours[-1] == 1) == bool(case % 2)


def test_newton_raises_with_the_gradient_norm_when_it_cannot_converge():
    design = np.column_stack([np.ones(6), [-3.0, -2.0, -1.0, 1.0, 2.0, 3.0]])
    separated = np.array([0, 0, 0, 1, 1, 1.0])
    with pytest.raises(stats.ConvergenceError, match=r"largest gradient norm \d"):
        stats.fit_ridge_logistic(design, separated, penalty=0.0, intercept_penalty=0.0, max_iterations=30)
    # With step halving the penalised log-likelihood never decreases, even from a bad start
    # where a full Newton step overshoots (huge curvature change): the fit still converges.
    x = np.column_stack([np.ones(200), np.linspace(-30, 30, 200)])
    y = (np.random.default_rng(13).uniform(size=200) < 1 / (1 + np.exp(-0.4 * x[:, 1]))).astype(float)
    beta = stats.fit_ridge_logistic(x, y, penalty=0.0, intercept_penalty=0.0)
    assert beta == pytest.approx(sm.Logit(y, x).fit(disp=0).params, abs=1e-5)


def test_cluster_bootstrap_is_wider_than_row_bootstrap_with_correlated_clusters():
    # 150 images x 5 rows; the covariate and a random effect are shared by all rows of an
    # image, so rows of one image are strongly correlated. Resampling rows ignores that and
    # understates the uncertainty; resampling images (clusters) does not.
    rng = np.random.default_rng(14)
    n_images, rows_per_image = 150, 5
    covariate = np.repeat(rng.normal(size=n_images), rows_per_image)
    effect = np.repeat(rng.normal(scale=2.5, size=n_images), rows_per_image)
    outcome = (rng.uniform(size=n_images * rows_per_image)
               < 1 / (1 + np.exp(-(0.5 * covariate + effect)))).astype(float)
    design = np.column_stack([np.ones_like(covariate), covariate])
    clusters = np.repeat(np.arange(n_images), rows_per_image)
    names = ["intercept", "x"]
    by_image = stats.cluster_bootstrap_odds_ratios(design, outcome, clusters, names, replicates=300, seed=SEED)
    by_row = stats.cluster_bootstrap_odds_ratios(design, outcome, np.arange(len(outcome)), names,
                                                 replicates=300, seed=SEED)
    assert by_image["odds_ratio"] == pytest.approx(by_row["odds_ratio"])     # same point estimate
    width_image = np.log(by_image["ci_high"] / by_image["ci_low"])[0]
    width_row = np.log(by_row["ci_high"] / by_row["ci_low"])[0]
    assert width_image > 1.6 * width_row


def test_cluster_bootstrap_counts_separated_replicates_as_infinite():
    # A rare event in one group: some replicates draw none of its events (separated).
    design = np.column_stack([np.ones(60), np.r_[np.ones(20), np.zeros(40)]])
    outcome = np.r_[np.ones(1), np.zeros(19), (np.arange(40) % 2 == 0).astype(float)]
    result = stats.cluster_bootstrap_odds_ratios(design, outcome, np.arange(60), ["intercept", "g"],
                                                 replicates=300, seed=SEED)
    assert result["separated_replicates"][0] > 0.025 * 300   # about e^-1 of replicates
    assert result["ci_low"][0] == 0.0 and np.isfinite(result["ci_high"][0])


def test_classifier_intervals_weighted_ap_matches_sklearn_and_rates_take_wilson():
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(15)
    target = rng.integers(0, 2, 80)
    z = np.round(rng.normal(size=80) + 1.5 * target, 1)                # ties on purpose
    weights = rng.integers(0, 3, size=(4, 80)).astype(float)
    np.testing.assert_allclose(stats.weighted_average_precision(z, target, weights),
                               [average_precision_score(target, z, sample_weight=w) for w in weights])
    result = stats.classifier_metric_intervals(np.abs(z) + 0.1, target, replicates=500, seed=SEED)
    assert result["sensitivity"]["estimate"] == 1.0                    # every z >= 0: all called positive
    assert result["sensitivity"]["interval"] == stats.WILSON
    assert result["sensitivity"]["ci_low"] == pytest.approx(
        stats.wilson_interval(int(target.sum()), int(target.sum()))[0])
    correct = int(((np.abs(z) + 0.1 >= 0) == target).sum())
    assert (result["accuracy_at_0.5"]["ci_low"], result["accuracy_at_0.5"]["ci_high"]) == pytest.approx(
        stats.wilson_interval(correct, len(z)))
    auprc = result["auprc"]
    assert auprc["ci_low"] <= auprc["estimate"] <= auprc["ci_high"]


def test_weighted_pair_mean_bootstrap_matches_a_loop_over_distinct_drawn_pairs():
    """Independent reference: each replicate written out as a double loop over the drawn list,
    pairing positions that hold different images, with the same multinomial draws."""
    rng = np.random.default_rng(2)
    n = 9
    similarity = rng.uniform(0, 1, (n, n))
    similarity = (similarity + similarity.T) / 2
    np.fill_diagonal(similarity, 1.0)
    weights = rng.uniform(0.5, 1.0, n)
    result = stats.weighted_pair_mean_ci(similarity, weights, replicates=300, seed=11)
    iu = np.triu_indices(n, 1)
    pair_weights = np.outer(weights, weights)
    assert result["estimate"] == pytest.approx((similarity * pair_weights)[iu].sum() / pair_weights[iu].sum())
    counts = np.random.default_rng(11).multinomial(n, np.full(n, 1.0 / n), size=300)
    means = []
    for row in counts:
        drawn = np.repeat(np.arange(n), row)
        numerator = denominator = 0.0
        for a in range(len(drawn)):
            for b in range(a + 1, len(drawn)):
                i, j = drawn[a], drawn[b]
                if i != j:
                    numerator += weights[i] * weights[j] * similarity[i, j]
                    denominator += weights[i] * weights[j]
        means.append(numerator / denominator)
    assert [result["ci_low"], result["ci_high"]] == pytest.approx(np.percentile(means, [2.5, 97.5]))
    assert result["replicates_used"] == 300
    assert np.isnan(stats.weighted_pair_mean_ci(similarity[:1, :1], weights[:1], replicates=2000, seed=SEED)["ci_low"])


@pytest.mark.parametrize("seed", range(40))
def test_replicate_dispersion_is_the_quasi_binomial_scale_of_statsmodels(seed):
    """Over random replicate counts: the dispersion equals Pearson X^2 / df of a binomial GLM
    fitted by statsmodels with scale="X2" (floored at 1), and the interval is Wilson's at n /
    dispersion (Wilson's own when the replicates agree)."""
    rng = np.random.default_rng(seed)
    groups = int(rng.integers(2, 6))
    n = rng.integers(5, 80, size=groups)
    hits = rng.binomial(n, rng.uniform(0.05, 0.95, size=groups))
    if hits.sum() in (0, n.sum()):
        return
    fit = sm.GLM(hits / n, np.ones((groups, 1)), family=sm.families.Binomial(), var_weights=n).fit(scale="X2")
    dispersion = stats.replicate_dispersion(hits, n)
    assert dispersion == pytest.approx(max(1.0, fit.scale), rel=1e-9)
    rate, low, high, reported = stats.replicate_wilson_interval(hits, n)
    effective = n.sum() / dispersion
    assert (rate, reported) == (pytest.approx(hits.sum() / n.sum()), dispersion)
    assert (low, high) == pytest.approx(stats.wilson_interval(rate * effective, effective))
    assert low <= rate <= high


def test_replicate_dispersion_hand_cases():
    assert stats.replicate_dispersion([20, 20, 40], [40, 40, 40]) == pytest.approx(15.0)
    assert stats.replicate_dispersion([10, 10, 10], [40, 40, 40]) == 1.0      # perfect agreement
    assert stats.replicate_dispersion([0, 0], [40, 40]) == 1.0                # no spread possible
    assert stats.replicate_dispersion([7], [40]) == 1.0                       # one replicate
    assert stats.replicate_wilson_interval([12], [40])[1:3] == pytest.approx(stats.wilson_interval(12, 40))
    assert np.isnan(stats.replicate_wilson_interval([0, 0], [0, 0])[0])


def _newcombe_reference(r, s, t, u, z=1.959963984540054):
    """Newcombe (1998) method 10 written out from the 2x2 counts (r both, s first only, t second
    only, u neither), as biostatUZH's confIntPairedProportion does it in R."""
    n = r + s + t + u

    def wilson(x):
        p = x / n
        centre, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)

    p1, p2 = (r + s) / n, (r + t) / n
    (l1, u1), (l2, u2) = wilson(r + s), wilson(r + t)
    a = (r + s) * (t + u) * (r + t) * (s + u)
    b = r * u - s * t
    c = b - n / 2 if b > n / 2 else (b if b < 0 else 0)
    phi = c / np.sqrt(a) if a > 0 else 0
    d = p1 - p2
    return (d - np.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2),
            d + np.sqrt((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))


@pytest.mark.parametrize("seed", range(30))
def test_newcombe_paired_interval_equals_the_written_out_formula(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 120))
    first = rng.random(n) < rng.uniform(0.05, 0.95)
    second = np.where(rng.random(n) < 0.6, first, rng.random(n) < 0.5)
    r, s = int(np.sum(first & second)), int(np.sum(first & ~second))
    t, u = int(np.sum(~first & second)), int(np.sum(~first & ~second))
    if min(r + s, t + u, r + t, s + u) == 0:
        return
    result = stats.newcombe_paired_interval(first, second)
    assert (result["ci_low"], result["ci_high"]) == pytest.approx(_newcombe_reference(r, s, t, u))
    assert result["ci_low"] <= result["estimate"] <= result["ci_high"]
    swapped = stats.newcombe_paired_interval(second, first)
    assert (swapped["ci_low"], swapped["ci_high"]) == pytest.approx((-result["ci_high"], -result["ci_low"]))


def test_newcombe_paired_interval_agrees_with_mcnemar_where_the_bootstrap_did_not():
    """The review's case: 0 vs 4 discordant images of 20. McNemar's exact p = 0.125; the
    percentile bootstrap excluded 0, the paired score interval does not."""
    first, second = np.r_[np.ones(4), np.zeros(16)].astype(bool), np.zeros(20, bool)
    assert stats.exact_paired_binomial(first, second)["p_value"] == pytest.approx(0.125)
    result = stats.newcombe_paired_interval(first, second)
    assert result["estimate"] == pytest.approx(0.2) and result["ci_low"] < 0 < result["ci_high"]
    bootstrap = stats.paired_difference_ci(first.astype(float), second.astype(float), 2000, SEED)
    assert bootstrap["ci_low"] > 0                      # what the review saw


def test_newcombe_paired_interval_covers_about_95_percent():
    """Coverage by simulation (the independent check of an interval): 2,000 paired samples of 40
    images with p1 = 0.30, p2 = 0.45 and correlated outcomes."""
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(2000):
        latent = rng.random(40)
        first = latent < 0.30
        second = np.where(rng.random(40) < 0.5, latent < 0.45, rng.random(40) < 0.45)
        result = stats.newcombe_paired_interval(first, second)
        covered += result["ci_low"] <= -0.15 <= result["ci_high"]
    assert 0.93 <= covered / 2000 <= 0.985


# --- expectations over model draws (the validity gate) ----------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_draw_mean_interval_is_students_t_over_the_draws_when_they_scatter(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 12))
    rates = rng.uniform(0.05, 0.95, k)
    n_maps = 10_000 * k          # binomial floor far below the between-draw spread
    result = stats.draw_mean_interval(rates, n_maps)
    low, high = scipy_stats.t.interval(0.95, k - 1, loc=rates.mean(), scale=scipy_stats.sem(rates))
    assert result["mean"] == pytest.approx(rates.mean())
    assert result["low"] == pytest.approx(max(0.0, low)) and result["high"] == pytest.approx(min(1.0, high))
    assert result["sd"] == pytest.approx(rates.std(ddof=1)) and result["df"] == k - 1


def test_draw_mean_interval_is_never_narrower_than_the_binomial_error_of_its_maps():
    # Three draws that agree exactly: no spread, but 3 x 40 maps still carry binomial error.
    result = stats.draw_mean_interval([0.5, 0.5, 0.5], 120)
    t = scipy_stats.t.ppf(0.975, 2)
    assert result["se"] == pytest.approx(np.sqrt(0.25 / 120))
    assert (result["low"], result["high"]) == pytest.approx((0.5 - t * np.sqrt(0.25 / 120), 0.5 + t * np.sqrt(0.25 / 120)))
    # ... and at least as wide as a plain t interval over the rates
    rates = [0.30, 0.55, 0.62]
    plain = scipy_stats.t.interval(0.95, 2, loc=np.mean(rates), scale=scipy_stats.sem(rates))
    wide = stats.draw_mean_interval(rates, 150)
    assert wide["low"] <= plain[0] + 1e-12 and wide["high"] >= min(1.0, plain[1]) - 1e-12


def test_draw_mean_interval_with_fewer_than_two_draws_has_no_interval():
    one = stats.draw_mean_interval([0.4], 40)
    assert one["mean"] == 0.4 and np.isnan(one["low"]) and np.isnan(one["high"]) and one["k"] == 1
    none = stats.draw_mean_interval([], 0)
    assert np.isnan(none["mean"]) and none["k"] == 0
    assert stats.draw_mean_interval([0.2, np.nan, 0.4], 80)["k"] == 2   # an undefined draw is left out


def test_draw_prediction_interval_by_hand():
    rates = np.array([0.2, 0.4, 0.6])
    half = scipy_stats.t.ppf(0.9, 2) * 0.2 * np.sqrt(1 + 1 / 3)
    assert stats.draw_prediction_interval(rates, 0.80) == pytest.approx((max(0, 0.4 - half), min(1, 0.4 + half)))
    assert all(np.isnan(stats.draw_prediction_interval([0.3])))


@pytest.mark.parametrize("n", [1, 3, 6, 10, 25])
def test_clopper_pearson_matches_statsmodels_over_every_count(n):
    from statsmodels.stats.proportion import proportion_confint

    for successes in range(n + 1):
        low, high = proportion_confint(successes, n, alpha=0.05, method="beta")
        assert stats.clopper_pearson_interval(successes, n) == pytest.approx((low, high), abs=1e-12)
    assert all(np.isnan(stats.clopper_pearson_interval(0, 0)))
