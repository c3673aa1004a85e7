"""Temperature scaling and calibration metrics against hand-computed cases and statsmodels."""

import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from sklearn.metrics import average_precision_score

from endoexplain_core.analysis import calibration
from endoexplain_core.figures import calibration_figures

SEED = 20260721  # the profiles' shared seed: bootstrap draws as in a run


def test_nll_and_brier_hand_computed():
    # z = 0 -> score 0.5 (positive); z = ln 3 -> score 0.75 (negative).
    z = np.array([0.0, math.log(3.0)])
    target = np.array([1, 0])
    assert calibration.nll(z, target) == pytest.approx((math.log(2) + math.log(4)) / 2, abs=1e-12)
    scores = calibration.scaled_score(z)
    np.testing.assert_allclose(scores, [0.5, 0.75])
    assert calibration.brier(scores, target) == pytest.approx((0.5**2 + 0.75**2) / 2, abs=1e-12)
    # Temperature 2 on z = ln 3: score = sigmoid(ln(3)/2) = sqrt(3) / (1 + sqrt(3)).
    scaled = calibration.scaled_score(np.array([math.log(3.0)]), 2.0)[0]
    assert scaled == pytest.approx(math.sqrt(3) / (1 + math.sqrt(3)), abs=1e-12)


def test_nll_stays_finite_for_saturated_wrong_scores():
    # Score rounds to exactly 1.0 for z = 50, but the NLL of a negative is ~50, not inf.
    assert calibration.nll(np.array([50.0]), np.array([0])) == pytest.approx(50.0, abs=1e-9)


def test_ece_and_reliability_hand_computed():
    scores = np.array([0.05, 0.15, 0.15, 0.95, 1.0])
    target = np.array([0, 1, 0, 1, 1])
    # bin 0: |0.05 - 0| x1; bin 1: |0.15 - 0.5| x2; bin 9: |0.975 - 1| x2; over 5 images.
    assert calibration.ece(scores, target, 10) == pytest.approx((0.05 + 2 * 0.35 + 2 * 0.025) / 5)
    table = calibration.reliability_table(scores, target, 10)
    assert list(table["count"]) == [1, 2, 0, 0, 0, 0, 0, 0, 0, 2]
    assert table.loc[9, "mean_score"] == pytest.approx(0.975)
    assert table.loc[1, "observed_frequency"] == pytest.approx(0.5)
    assert np.isnan(table.loc[5, "mean_score"])
    np.testing.assert_allclose(table["lower"], np.arange(10) / 10)


def test_bin_edges_are_left_closed_and_one_goes_to_last_bin():
    np.testing.assert_array_equal(calibration.bin_index(np.array([0.0, 0.1, 0.0999, 0.9, 1.0]), 10),
                                  [0, 1, 0, 9, 9])
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        calibration.bin_index(np.array([1.2]), 10)


def _logits_with_temperature(true_temperature, n=20000, seed=0):
    rng = np.random.default_rng(seed)
    calibrated_z = rng.normal(0.0, 3.0, n)
    target = (rng.random(n) < 1 / (1 + np.exp(-calibrated_z))).astype(int)
    return calibrated_z * true_temperature, target


@pytest.mark.parametrize("true_temperature", [0.4, 2.5])
def test_fit_temperature_recovers_known_temperature(true_temperature):
    z, target = _logits_with_temperature(true_temperature)
    fitted = calibration.fit_temperature(z, target)
    assert fitted == pytest.approx(true_temperature, rel=0.05)
    # Independent reference: logistic regression of y on z without intercept has slope 1/T.
    slope = sm.Logit(target, z[:, None]).fit(disp=0).params[0]
    assert fitted == pytest.approx(1.0 / slope, rel=1e-4)
    assert not calibration.at_bound(fitted)


def test_fit_temperature_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        calibration.fit_temperature(np.array([1.0, 2.0]), np.array([1, 1]))


def test_perfect_separation_runs_to_the_bound_and_says_so():
    fitted = calibration.fit_temperature(np.array([-5.0, -4.0, 4.0, 5.0]), np.array([0, 0, 1, 1]))
    assert calibration.at_bound(fitted)


def test_scaling_keeps_auprc_and_the_half_decision():
    rng = np.random.default_rng(3)
    z = rng.normal(0, 2, 500)
    target = (rng.random(500) < 1 / (1 + np.exp(-z))).astype(int)
    raw = calibration.scaled_score(z)
    for temperature in (0.3, 4.0):
        scaled = calibration.scaled_score(z, temperature)
        assert average_precision_score(target, scaled) == average_precision_score(target, raw)
        np.testing.assert_array_equal(scaled >= 0.5, raw >= 0.5)
        np.testing.assert_array_equal(scaled >= 0.5, z >= 0)


def _scores_frame():
    """Two checkpoints, val + test rows, with logits from known temperatures."""
    frames = []
    for checkpoint, temperature, seed in (("efficientnet_b0_s1", 2.0, 1), ("resnet34_s1", 0.5, 2)):
        for role, n in (("val", 4000), ("test", 3000)):
            z, target = _logits_with_temperature(temperature, n=n, seed=seed + len(role))
            frames.append(pd.DataFrame({"checkpoint_id": checkpoint, "role": role,
                                        "source": np.where(target == 1, "polyps", "cecum"),
                                        "target": target, "logit_neg": -z / 2, "logit_pos": z / 2}))
    return pd.concat(frames, ignore_index=True)


def test_fit_temperatures_uses_validation_rows_only():
    logits = _scores_frame()
    temperatures = calibration.fit_temperatures(logits)
    # Corrupting every test logit must not move any temperature.
    corrupted = logits.copy()
    corrupted.loc[corrupted["role"] == "test", "logit_pos"] *= -7
    pd.testing.assert_frame_equal(temperatures, calibration.fit_temperatures(corrupted))
    by_id = temperatures.set_index("checkpoint_id")["temperature"]
    assert by_id["efficientnet_b0_s1"] == pytest.approx(2.0, rel=0.1)
    assert by_id["resnet34_s1"] == pytest.approx(0.5, rel=0.1)


def test_add_scores_and_calibration_table():
    logits = _scores_frame()
    temperatures = calibration.fit_temperatures(logits)
    scores = calibration.add_scores(logits, temperatures)
    assert list(scores.columns[-4:]) == ["z", "temperature", "raw_score", "scaled_score"]
    row = scores.iloc[0]
    assert row["scaled_score"] == pytest.approx(1 / (1 + math.exp(-row["z"] / row["temperature"])))
    table = calibration.calibration_table(scores, "efficientnet_b0_s1", n_bins=10)
    assert list(table["split"]) == ["Validation", "Validation", "Test", "Test"]
    assert list(table["score"]) == ["Raw", "Temperature-scaled"] * 2
    test_part = scores[(scores["checkpoint_id"] == "efficientnet_b0_s1") & (scores["role"] == "test")]
    scaled_row = table.iloc[3]
    assert scaled_row["nll"] == pytest.approx(
        calibration.nll(test_part["z"], test_part["target"], scaled_row["temperature"]))
    assert scaled_row["ece"] == pytest.approx(calibration.ece(test_part["scaled_score"], test_part["target"], 10))
    # Logits were generated over-confident (T = 2): scaling must lower the validation NLL.
    assert table.iloc[1]["nll"] < table.iloc[0]["nll"]
    with pytest.raises(ValueError, match="no temperature"):
        calibration.add_scores(logits, temperatures.iloc[:1])


def test_source_category_audit_hand_computed():
    scores = pd.DataFrame({
        "checkpoint_id": "m", "role": "test",
        "source": ["polyps", "polyps", "dyed-lifted-polyps", "dyed-lifted-polyps",
                   "dyed-lifted-polyps", "dyed-resection-margins", "dyed-resection-margins", "cecum"],
        "target": [1, 1, 1, 1, 1, 0, 0, 0],
        "scaled_score": [0.2, 0.6, 0.9, 0.95, 0.4, 0.7, 0.1, 0.3],
    })
    table = calibration.source_category_audit(scores, "m", "test", 0.5, replicates=2000, seed=SEED).set_index("source")
    assert table.loc["polyps", "sensitivity"] == pytest.approx(0.5)
    assert table.loc["polyps", "mean_scaled_score"] == pytest.approx(0.4)
    assert table.loc["dyed-lifted-polyps", "sensitivity"] == pytest.approx(2 / 3)
    assert table.loc["polyps", "false_negatives"] == 1
    assert table.loc["polyps", "share_of_errors"] == pytest.approx(0.5)
    assert table.loc["dyed-resection-margins", "false_positive_rate"] == pytest.approx(0.5)
    assert table.loc["dyed-resection-margins", "share_of_errors"] == pytest.approx(1.0)
    assert table.loc["cecum", "false_positives"] == 0
    assert np.isnan(table.loc["cecum", "sensitivity"])
    assert list(table["target"]) == [1, 1, 0, 0]  # positives listed first


def test_reliability_raw_vs_scaled_and_its_figure():
    scores = calibration.add_scores(_scores_frame(), calibration.fit_temperatures(_scores_frame()))
    reliability = calibration.reliability_raw_vs_scaled(scores, "resnet34_s1", "test", 10)
    assert list(reliability["score"].unique()) == ["Raw", "Temperature-scaled"]
    assert reliability.groupby("score")["count"].sum().tolist() == [3000, 3000]
    fig = calibration_figures.plot_reliability_with_counts(reliability)
    count_ax = fig.axes[1]
    heights = [patch.get_height() for patch in count_ax.patches]
    assert heights == reliability["count"].tolist()


@pytest.mark.parametrize("seed", range(8))
def test_bootstrap_ece_equals_ece_of_each_resample(seed):
    """The closed form sum_b |drawn scores - drawn targets| / n against the definition applied
    to each resampled image set (bins fixed by the scores)."""
    from endoexplain_core.analysis import stats

    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 60))
    score = rng.uniform(size=n) ** rng.uniform(0.3, 3)
    target = (rng.uniform(size=n) < score).astype(int)
    counts = stats.bootstrap_draw_counts(n, 25, seed)
    fast = calibration.bootstrap_ece(score, target, 10, counts.astype(float))
    reference = [calibration.ece(np.repeat(score, row), np.repeat(target, row), 10) for row in counts]
    np.testing.assert_allclose(fast, reference, rtol=1e-12, atol=1e-12)


def test_ece_intervals_are_paired_and_cover_their_estimates():
    rng = np.random.default_rng(3)
    n = 120
    z = rng.normal(0, 3, size=n)
    target = (rng.uniform(size=n) < 1 / (1 + np.exp(-z / 2))).astype(int)
    scores = pd.DataFrame({"checkpoint_id": "m", "role": "test", "target": target,
                           "raw_score": 1 / (1 + np.exp(-z)), "scaled_score": 1 / (1 + np.exp(-z / 2))})
    table = calibration.ece_intervals(scores, "m", "test", 10, replicates=400, seed=1)
    assert list(table["score"]) == ["Raw", "Temperature-scaled", "Change (scaled - raw)"]
    raw, scaled, change = table.to_dict("records")
    assert raw["ece"] == pytest.approx(calibration.ece(scores["raw_score"], target, 10))
    assert change["ece"] == pytest.approx(scaled["ece"] - raw["ece"])
    for row in (raw, scaled, change):
        assert row["ci_low"] <= row["ece"] <= row["ci_high"] and row["n"] == n
    # paired: the change's interval is the percentiles of scaled - raw on the same resamples
    from endoexplain_core.analysis import stats
    counts = stats.bootstrap_draw_counts(n, 400, 1).astype(float)
    difference = (calibration.bootstrap_ece(scores["scaled_score"], target, 10, counts)
                  - calibration.bootstrap_ece(scores["raw_score"], target, 10, counts))
    np.testing.assert_allclose([change["ci_low"], change["ci_high"]], stats.percentile_interval(difference))
    with pytest.raises(ValueError, match="no rows for split"):
        calibration.ece_intervals(scores, "m", "val", 10, replicates=10, seed=1)
