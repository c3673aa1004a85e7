"""The validity gate, map-prior diagnostics, constant-map handling and the learning rule.

Hand-made cases with known answers: a map that reads the planted lesion / cue must pass, an
untrained-looking model and a fixed corner prior must fail; constant maps count as misses
or a miss; prior-map and identity diagnostics on maps whose overlaps are known by hand.
"""

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as scipy_stats

from endoexplain_core.models.learning import learning_status, other_checkpoints_to_audit, with_map_check
from endoexplain_core import config
from endoexplain_core.analysis import map_diagnostics, stats, summaries, validity_gate
from endoexplain_core.kernels import map_priors
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS

SEED = 20260721  # the profiles' shared seed: bootstrap draws as in a run

SIZE = 32


def _masks(n):
    """Lesion in the top-left quadrant's centre, cue in the bottom-right quadrant, per image."""
    lesion = np.zeros((SIZE, SIZE), bool)
    lesion[4:12, 4:12] = True      # area share 64 / 1024
    cue = np.zeros((SIZE, SIZE), bool)
    cue[20:28, 20:28] = True
    return {f"s{i}": lesion for i in range(n)}, {f"s{i}": cue for i in range(n)}


def _case_rows(peaks_by_model, n=40, constant=None, centre_peaks=True, salience=None):
    """Audit-like rows: every method of a model peaks where ``peaks_by_model[model](i)`` says,
    the centre baseline at the frame centre (with ``centre_peaks``; else as the others), the
    salience baseline, which sees only the frame, at ``salience(i)`` on every model's rows
    (default ``_scattered``: neither lesion nor cue).

    A peak is (row, col) or None for a constant map.
    """
    lesion, cue = _masks(n)
    rows = []
    for model, where in peaks_by_model.items():
        for i in range(n):
            sample = f"s{i}"
            for method in MAP_METHODS:
                # the centre baseline peaks at the frame centre whatever the model
                peak = (SIZE // 2, SIZE // 2) if method == "centre" and centre_peaks else where(i, method)
                if method == "salience":   # model-free: the same peak on every model's rows
                    peak = (salience or _scattered)(i, method)
                is_constant = peak is None
                r, c = (0, 0) if is_constant else peak
                rows.append({"model": model, "sample_id": sample, "method": method,
                             "peak_row": r, "peak_col": c, "constant_map": is_constant,
                             "peak_outside_mask": not lesion[sample][r, c],
                             "lesion_area_fraction": lesion[sample].mean()})
    return validity_gate.add_cue_columns(pd.DataFrame(rows), cue)


def _facts(ok=True):
    return pd.DataFrame({"model": list(validity_gate.GATE_MODELS),
                         "accuracy_ok": [ok, ok, True, True]})


def _scattered(i, method):
    """A peak that wanders over the frame, hitting neither lesion nor cue."""
    return (14 + i % 4, 2 + (7 * i) % 28)


READER = {"lesion": lambda i, m: (8, 8), "shortcut": lambda i, m: (24, 24),
          "untrained": _scattered, "shuffled": _scattered}


def _gate(case_rows, facts):
    return validity_gate.gate_table(case_rows, facts, margin=0.25)


def _draws(models_by_seed, rows=None):
    """Case rows and model facts of several replicate draws: seed -> peaks_by_model (or the same
    prepared ``rows`` for every seed)."""
    cases = pd.concat([(rows if rows is not None else _case_rows(models)).assign(gate_seed=seed, draw=0)
                       for seed, models in models_by_seed.items()], ignore_index=True)
    facts = pd.concat([_facts().assign(gate_seed=seed) for seed in models_by_seed], ignore_index=True)
    return cases, facts


def _gate_of(models, k=3):
    """The gate over ``k`` replicate draws that all show ``models``'s peaks."""
    return _gate(*_draws({seed: models for seed in range(1, k + 1)})).set_index("method")


def _cue_draws(cue_hits):
    """One replicate per entry: the shortcut model's maps reach the cue in that many of 40."""
    return _draws({seed: dict(READER, shortcut=lambda i, m, h=hits: (24, 24) if i < h else (8, 8))
                   for seed, hits in enumerate(cue_hits, start=1)})


def test_a_method_must_beat_the_centre_baseline():
    """Lesions around the frame centre: the centre baseline hits 30 of 40, so a method whose
    lesion model hits 26 of 40 (far above chance + margin, 0.31) does not pass; its bar is the
    centre's 0.75, and the centre baseline itself cannot pass its own bar."""
    lesion = np.zeros((SIZE, SIZE), bool)
    lesion[12:20, 12:20] = True
    rows = _case_rows({"lesion": lambda i, m: (16, 16) if m == "centre" else ((14, 14) if i < 26 else (2, 2)),
                       "shortcut": lambda i, m: (24, 24), "untrained": _scattered, "shuffled": _scattered},
                      centre_peaks=False)
    rows["peak_outside_mask"] = [not lesion[r, c] for r, c in zip(rows["peak_row"], rows["peak_col"])]
    rows["peak_outside_mask"] |= (rows["method"] == "centre") & (rows["sample_id"].str[1:].astype(int) >= 30)
    rows = validity_gate.add_cue_columns(rows.drop(columns=["peak_defined", "peak_inside_lesion", "peak_on_cue",
                                                            "cue_area_fraction"]), _masks(40)[1])
    gate = _gate(*_draws({1: None, 2: None, 3: None}, rows=rows)).set_index("method")
    assert gate.loc["gradcam", "centre_lesion_rate"] == 0.75 and gate.loc["gradcam", "lesion_bar"] == 0.75
    assert gate.loc["gradcam", "lesion_rate"] == 0.65 and gate.loc["gradcam", "verdict"] != "passes"
    assert gate.loc["centre", "verdict"] != "passes"


def _salient(i, method):
    """The frame's salience peak: on the planted polyp in 28 of 40 frames (0.70), elsewhere
    (neither lesion nor cue) in the rest."""
    return (8, 8) if i < 28 else _scattered(i, method)


def test_a_method_must_beat_salience_not_only_the_centre():
    """A method whose lesion-model maps only follow the frame's salience peaks inside the
    lesion in 0.70 of frames, far above chance + margin (0.3125) and the centre baseline
    (0.0), and its shortcut model finds the cue: under a bar of chance and centre alone it
    would pass. The salience baseline hits the same 0.70, so the bar is 0.70, set by the
    salience baseline, and the method does not pass."""
    follows_salience = dict(READER, lesion=_salient)
    cases, facts = _draws({seed: None for seed in (1, 2, 3)},
                          rows=_case_rows(follows_salience, salience=_salient))
    gate = _gate(cases, facts).set_index("method")
    row = gate.loc["gradcam"]
    assert row["salience_lesion_rate"] == pytest.approx(0.70) and row["centre_lesion_rate"] == 0.0
    assert row["salience_cue_rate"] == 0.0
    assert row["lesion_bar"] == pytest.approx(0.70) and row["lesion_bar_set_by"] == "salience baseline"
    assert row["cue_bar"] == pytest.approx(64 / 1024 + 0.25) and row["cue_bar_set_by"] == "chance + margin"
    assert row["lesion_rate"] == pytest.approx(0.70) and row["verdict"] != "passes"
    assert "the bar 0.700 (salience baseline)" in row["reason"]
    # The same maps without the salience baseline: only chance and centre in the bar, and it passes.
    without = _gate(cases[cases["method"] != "salience"], facts).set_index("method")
    assert without.loc["gradcam", "lesion_bar"] == pytest.approx(64 / 1024 + 0.25)
    assert without.loc["gradcam", "verdict"] == "passes"
    assert gate.loc["salience", "verdict"] != "passes"   # the baseline cannot beat its own bar


def test_gate_passes_a_map_that_reads_the_planted_evidence():
    verdict = _gate_of(READER)
    assert verdict.loc["gradcam", "passes"] and verdict.loc["gradcam", "reason"] == "passes"
    assert verdict.loc["gradcam", "verdict"] == "passes"
    assert verdict.loc["gradcam", "lesion_rate"] == 1.0 and verdict.loc["gradcam", "cue_rate"] == 1.0
    assert verdict.loc["gradcam", "lesion_chance"] == pytest.approx(64 / 1024)
    assert verdict.loc["gradcam", "replicates_used"] == 3 and verdict.loc["gradcam", "n"] == 120
    assert validity_gate.failing_methods(verdict.reset_index()) == []


def test_one_replicate_decides_nothing():
    """One draw of each model says nothing about the spread between draws: no interval, no verdict."""
    gate = _gate(_case_rows(READER), _facts()).set_index("method")
    assert (gate["verdict"] == "inconclusive").all()
    assert gate.loc["gradcam", "reason"].startswith("one usable replicate")


def test_gate_fails_when_the_models_did_not_learn():
    cases, facts = _draws({1: READER, 2: READER})
    gate = _gate(cases, facts.assign(accuracy_ok=facts["model"].isin(["untrained", "shuffled"])))
    assert not gate["passes"].any()
    assert (gate["verdict"] == "inconclusive").all()   # nothing learned: no evidence either way
    assert gate["reason"].str.contains("accuracy rule").all()


def test_gate_fails_an_untrained_looking_model_and_a_fixed_corner_prior():
    untrained = {m: _scattered for m in validity_gate.GATE_MODELS}
    assert not _gate_of(untrained)["passes"].any()
    corner = {m: (lambda i, method: (31, 31)) for m in validity_gate.GATE_MODELS}
    gate = _gate_of(corner)
    assert not gate["passes"].any()
    assert (gate["lesion_rate"] == 0).all() and (gate["cue_rate"] == 0).all()


def test_gate_fails_when_a_control_finds_the_lesion_too():
    # An edge detector: the untrained control peaks on the lesion as often as the trained one.
    gate = _gate_of(dict(READER, untrained=lambda i, m: (8, 8)))
    assert gate.loc["gradcam", "verdict"] == "fails"
    assert ("untrained control peak-inside 1.000 (mean of 3 draws: 1.00, 1.00, 1.00; 95% CI "
            "1.000-1.000; 120 maps): lower bound 1.000 (Bonferroni over 6 tests) clears the bar 0.312"
            ) in gate.loc["gradcam", "reason"]


def test_the_rate_is_the_mean_of_the_draws_with_an_interval_at_least_as_wide_as_plain_t():
    """Shortcut draws reaching the cue in 20, 28 and 36 of 40 frames: the cue rate is their mean
    0.70; its interval contains the plain t interval over the three rates (2 df)."""
    gate = _gate(*_cue_draws([20, 28, 36])).set_index("method")
    rates = np.array([0.5, 0.7, 0.9])
    low, high = scipy_stats.t.interval(0.95, 2, loc=rates.mean(), scale=scipy_stats.sem(rates))
    assert gate.loc["gradcam", "cue_rate"] == pytest.approx(0.7)
    assert gate.loc["gradcam", "cue_ci_low"] <= low + 1e-12 and gate.loc["gradcam", "cue_ci_high"] >= min(1, high) - 1e-12
    assert gate.loc["gradcam", "cue_sd"] == pytest.approx(0.2)
    # three draws this far apart straddle the bar (0.31); six draws of the same spread decide
    assert gate.loc["gradcam", "verdict"] == "inconclusive"
    assert _gate(*_cue_draws([20, 28, 36] * 2)).set_index("method").loc["gradcam", "verdict"] == "passes"


def test_no_draw_needs_to_agree_a_draw_below_the_bar_is_part_of_the_spread():
    """Six shortcut draws: one reaches the cue in 8 of 40 frames (0.20, below the bar 0.31), five
    in 32 of 40. The old agreement rule called this inconclusive; over draws the mean 0.70 has
    lower bound 0.44 and passes, and the clause table shows 5 of 6 draws on the right side."""
    cases, facts = _cue_draws([8, 32, 32, 32, 32, 32])
    gate = _gate(cases, facts).set_index("method")
    assert gate.loc["gradcam", "verdict"] == "passes"
    clauses = validity_gate.gate_clause_table(cases, facts, margin=0.25)
    cue = clauses[(clauses["method"] == "gradcam") & (clauses["model"] == "shortcut")].iloc[0]
    assert cue["draws_right_side"] == 5 and cue["replicates_used"] == 6 and cue["replicates_excluded"] == 0
    assert (cue["draws_right_low"], cue["draws_right_high"]) == pytest.approx(stats.clopper_pearson_interval(5, 6))
    assert cue["between_draw_sd"] == pytest.approx(np.std([0.2] + [0.8] * 5, ddof=1))
    assert cue["prediction_low"] < cue["bar"] < cue["prediction_high"]   # one new draw could miss
    stability = validity_gate.gate_stability(clauses, gate.reset_index()).set_index("method")
    assert stability.loc["gradcam", "held"] == False  # noqa: E712 (the 80% interval reaches below the bar)
    assert "shortcut model peak-on-cue" in stability.loc["gradcam", "one_new_draw"]


def test_verdict_has_three_states_and_fails_only_at_the_bonferroni_level():
    # Six draws, bar 64/1024 + 0.25 = 0.3125 over 40 frames each. 30/40 in every draw: passes.
    # 13/40 (0.325) is above the bar as a point but its interval straddles it: inconclusive.
    # 4/40 (0.10): the Bonferroni interval (over the six tests) lies below the bar: fails.
    expected = {13: "inconclusive", 30: "passes", 4: "fails", 12: "inconclusive"}
    for hits, verdict in expected.items():
        gate = _gate(*_cue_draws([hits] * 6)).set_index("method")
        assert gate.loc["gradcam", "verdict"] == verdict, hits
        assert gate.loc["gradcam", "passes"] == (verdict == "passes")
    reason = _gate(*_cue_draws([4] * 6)).set_index("method").loc["gradcam", "reason"]
    assert reason.startswith("shortcut model peak-on-cue 0.100 (mean of 6 draws")
    assert "upper bound" in reason and "(Bonferroni over 6 tests) below the bar 0.312" in reason
    # At three draws the same 4/40 is only inconclusive: the corrected t(2) interval is too wide.
    assert _gate(*_cue_draws([4] * 3)).set_index("method").loc["gradcam", "verdict"] == "inconclusive"


def test_untrained_draws_of_a_replicate_pool_into_its_rate():
    """Two untrained initialisations per replicate: one peaks on the lesion, one scatters; the
    replicate's untrained rate is their pooled 0.5, and the gate counts both draws."""
    parts = []
    for seed in (1, 2, 3):
        first = _case_rows({"untrained": lambda i, m: (8, 8)}).assign(gate_seed=seed, draw=1)
        second = _case_rows({"untrained": _scattered}).assign(gate_seed=seed, draw=2)
        others = _case_rows({k: v for k, v in READER.items() if k != "untrained"}).assign(gate_seed=seed, draw=0)
        parts += [first, second, others]
    facts = pd.concat([_facts().assign(gate_seed=seed) for seed in (1, 2, 3)], ignore_index=True)
    gate = _gate(pd.concat(parts, ignore_index=True), facts).set_index("method")
    assert gate.loc["gradcam", "untrained_lesion_rate"] == 0.5
    assert gate.loc["gradcam", "untrained_initialisations"] == 2
    # 0.5 sits above the bar 0.31 in every draw: no pass; three draws do not reach "fails" at the
    # Bonferroni level (the t(2) quantile is 10.9)
    assert gate.loc["gradcam", "verdict"] == "inconclusive"


def test_untrained_initialisations_have_their_own_seeds():
    seeds = {validity_gate.untrained_seed(replicate, draw) for replicate in (1, 2, 3) for draw in (1, 2, 3, 4)}
    assert len(seeds) == 12 and not seeds & {1, 2, 3}
    assert validity_gate.untrained_seed(2, 1) == validity_gate.untrained_seed(2, 1)


def test_a_replicate_whose_models_did_not_learn_is_left_out():
    good_cases, good_facts = _draws({1: READER, 2: READER})
    corner = {m: (lambda i, method: (31, 31)) for m in validity_gate.GATE_MODELS}
    bad = (_case_rows(corner).assign(gate_seed=3, draw=0), _facts(ok=False).assign(gate_seed=3))
    facts = pd.concat([good_facts, bad[1]])
    gate = _gate(pd.concat([good_cases, bad[0]]), facts).set_index("method")
    assert gate.loc["gradcam", "verdict"] == "passes"
    assert gate.loc["gradcam", "replicates_used"] == 2 and gate.loc["gradcam", "n_replicates"] == 3
    assert gate.loc["gradcam", "replicates_excluded"] == 1
    assert validity_gate.usable_replicates(facts) == [1, 2]


def test_constant_maps_count_as_misses_as_in_table4():
    # Half the lesion model's maps are constant: 20 hits of 40 maps, not 20 of 20.
    gate = _gate_of(dict(READER, lesion=lambda i, m: None if i % 2 else (8, 8)))
    assert gate.loc["gradcam", "lesion_rate"] == 0.5
    assert gate.loc["gradcam", "n_constant_lesion"] == 60      # 20 per draw, three draws
    gate = _gate_of(dict(READER, shortcut=lambda i, m: None))
    assert gate.loc["gradcam", "cue_rate"] == 0.0 and gate.loc["gradcam", "verdict"] == "fails"
    assert "peak-on-cue 0.000 (mean of 3 draws: 0.00, 0.00, 0.00" in gate.loc["gradcam", "reason"]
    # a control whose maps are half constant and half in the lesion: 20 of 40, not 20 of 20
    gate = _gate_of(dict(READER, shuffled=lambda i, m: None if i % 2 else (8, 8)))
    assert gate.loc["gradcam", "shuffled_lesion_rate"] == 0.5


def test_the_replicate_table_reads_each_draw_at_its_points_and_never_votes():
    cases, facts = _cue_draws([8, 32, 32])
    spread = validity_gate.gate_replicate_table(cases, facts, margin=0.25)
    of_gradcam = spread[spread["method"] == "gradcam"]
    assert of_gradcam["cue_rate"].tolist() == [0.2, 0.8, 0.8]
    assert of_gradcam["point_reading"].tolist() == ["fails", "passes", "passes"]
    assert "verdict" not in spread.columns


def test_planted_frames_keep_cue_and_lesion_apart():
    pool = validity_gate.gate_pool(6, 64, seed=3)
    for case in pool:
        assert case["lesion_mask"].any() and case["cue_mask"].any()
        assert not (case["lesion_mask"] & case["cue_mask"]).any()
        blue = case["image"][case["cue_mask"]].astype(float).mean(axis=0)
        assert blue[2] > blue[0]   # the cue is blue dye on red mucosa
    images, labels = validity_gate.task_frames("shortcut", 4, 32, seed=0)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="unknown planted task"):
        validity_gate.task_frames("colour", 4, 32, seed=0)


def test_mark_table_adds_daggers_and_verdicts():
    gate = pd.DataFrame({"method": list(CAM_METHODS) + ["random"],
                         "passes": [True, False, False, True, True, False]})
    table = pd.DataFrame({"method": ["gradcam", "xgradcam", "random"],
                          "label": ["Grad-CAM", "XGrad-CAM", "Random heatmap"]})
    marked = validity_gate.mark_table(table, gate)
    assert marked["label"].tolist() == ["Grad-CAM", "XGrad-CAM\u2020", "Random heatmap"]
    assert marked["validity_gate"].tolist() == ["passes", "fails", "reference"]
    assert validity_gate.mark_table(table, None)["validity_gate"].tolist() == ["not run", "not run", "reference"]
    # An inconclusive method is not validated: it carries the dagger and says why.
    gate["verdict"] = ["passes", "fails", "inconclusive", "passes", "passes", "fails"]
    marked = validity_gate.mark_table(table, gate)
    assert marked["label"].tolist() == ["Grad-CAM", "XGrad-CAM\u2020", "Random heatmap"]
    assert marked["validity_gate"].tolist() == ["passes", "inconclusive", "reference"]


def test_learning_rule_needs_auprc_095_and_non_constant_maps():
    assert learning_status([0.5, 0.949, 0.95, 1.0, float("nan")]).tolist() == [False, False, True, True, False]
    learning = pd.DataFrame({"checkpoint_id": ["a", "b", "c", "d"], "val_auprc": [0.99, 0.97, 0.90, 0.99],
                             "auprc_ok": [True, True, False, True]})
    rows = []
    # a: XGrad-CAM flat on 8 of 40 (a method property, reported, not deciding); b: Grad-CAM flat on 6
    for checkpoint_id, flat in (("a", {"xgradcam": 8}), ("b", {"gradcam": 6}), ("c", {})):   # d: not audited
        for image in range(40):
            for method in (*CAM_METHODS, "random"):
                rows.append({"checkpoint_id": checkpoint_id, "sample_id": f"s{image}", "method": method,
                             "constant_map": image < flat.get(method, 0)})
    table = with_map_check(learning, pd.DataFrame(rows)).set_index("checkpoint_id")
    assert table["map_check_share"].round(3).tolist()[:3] == [1.0, 0.85, 1.0]   # b: 34 of 40
    assert table["nonconstant_share"].round(3).tolist()[:3] == [0.8, 0.85, 1.0]
    assert table.loc["a", "flattest_method"] == "xgradcam"
    assert table["learned"].tolist() == [True, False, False, False]
    assert table.loc["b", "not_learned_because"] == ("Grad-CAM or Eigen-CAM maps constant on 15% of the "
                                                     "40 audited images it calls positive")
    assert table.loc["c", "not_learned_because"] == "validation AUPRC 0.900 < 0.95"
    assert table.loc["d", "not_learned_because"] == "not audited"
    assert table.loc["a", "not_learned_because"] == ""
    # only the images a checkpoint calls positive (z >= 0) are read: b's flat Grad-CAM maps are
    # on the 6 images it calls negative (a subtle polyp it misses holds no positive evidence)
    audit = pd.DataFrame(rows).assign(z=lambda t: np.where(t["sample_id"].isin([f"s{i}" for i in range(6)]), -1.0, 2.0))
    called = with_map_check(learning, audit).set_index("checkpoint_id")
    assert called.loc["b", ["map_check_share", "n_called_positive", "n_audited"]].tolist() == [1.0, 34, 40]
    assert called.loc["b", "learned"]
    none_called = with_map_check(learning, audit.assign(z=-1.0)).set_index("checkpoint_id")
    assert not none_called.loc["a", "learned"]
    assert none_called.loc["a", "not_learned_because"] == "calls none of its 40 audited images positive"


# --- map priors -------------------------------------------------------------------------------

def test_border_ring_and_corner_cells_on_a_4x4_grid():
    rows = torch.tensor([0, 40, 40, 127, 100])
    cols = torch.tensor([0, 40, 127, 127, 50])
    # cells (0,0) corner, (1,1) inner, (1,3) edge, (3,3) corner, (3,1) edge at 128 px / 4x4
    assert map_priors.border_ring(rows, cols, 128, (4, 4)).tolist() == [True, False, True, True, True]
    assert map_priors.corner_cell(rows, cols, 128, (4, 4)).tolist() == [True, False, False, True, False]
    assert map_priors.border_ring_share((4, 4)) == 0.75
    assert map_priors.border_ring_share((8, 8)) == pytest.approx(28 / 64)


def test_prior_top_iou_and_prior_table_on_hand_made_maps():
    size = 10
    prior = torch.zeros(size, size)
    prior[:2, :] = 1.0                      # top-20% set = the first two rows
    same = prior.clone()[None]
    other = torch.zeros(1, size, size)
    other[:, -2:, :] = 1.0                     # the last two rows: disjoint
    half = torch.zeros(1, size, size)
    half[:, 1:3, :] = 1.0                      # rows 1-2: 10 shared of 30 in the union
    iou = map_priors.top_set_iou(torch.cat([same, other, half]), prior, 0.2)
    assert iou.tolist() == pytest.approx([1.0, 0.0, 10 / 30])

    cases = pd.DataFrame({"method": ["gradcam"] * 2, "constant_map": [False, True],
                          "peak_border_ring": [True, True], "peak_corner_cell": [True, False],
                          "prior_top_iou": [0.8, np.nan], "lesion_logit_drop": [2.0, 4.0],
                          "logit_drop": [0.1, 0.5]})
    negatives = pd.DataFrame({"method": ["gradcam"] * 3, "constant_map": [False, False, False],
                              "peak_border_ring": [True, True, False],
                              "peak_corner_cell": [True, False, False], "prior_top_iou": [1.0, 0.5, 0.0]})
    table = map_diagnostics.prior_table(cases, negatives, (4, 4)).set_index("method")
    row = table.loc["gradcam"]
    assert row["border_ring_positive"] == 1.0 and row["n_constant_positive"] == 1
    assert row["border_ring_negative"] == pytest.approx(2 / 3) and row["corner_negative"] == pytest.approx(1 / 3)
    assert row["prior_top_iou_negative_median"] == 0.5
    assert row["lesion_logit_drop_mean"] == 3.0 and row["cam_top_logit_drop_mean"] == 0.1


def test_prior_maps_average_negatives_and_find_the_corner_prior():
    class CornerModel(torch.nn.Module):
        """Activation peaks in the top-left cell whatever the image (a pure position prior)."""

        def __init__(self):
            super().__init__()
            self.features = torch.nn.Conv2d(3, 2, 8, stride=8)

        def forward(self, x):
            bias = torch.zeros(1, 2, 4, 4)
            bias[..., 0, 0] = 5.0
            activation = self.features(x) * 0 + bias + 0.01 * x[:, :2, ::8, ::8]
            return activation.mean(dim=(2, 3))

    model = CornerModel()
    images = torch.randn(3, 3, 32, 32)
    priors, rows = map_diagnostics.prior_maps(model, model.features, images, ["a", "b", "c"], grid=(4, 4),
                                                 top_fraction=0.2, batch_size=2)
    gradcam = rows[rows["method"] == "gradcam"]
    assert gradcam["peak_corner_cell"].all() and gradcam["peak_border_ring"].all()
    assert priors["gradcam"].shape == (32, 32)
    assert tuple(map(int, divmod(int(priors["gradcam"].argmax()), 32))) < (8, 8)


def test_practical_identity_flags_pairs_over_the_thresholds():
    agreement = pd.DataFrame({"sample_id": ["a", "b"] * 2, "first": ["gradcam"] * 4,
                              "second": ["gradcampp"] * 2 + ["hirescam"] * 2,
                              "pearson": [0.995, 0.999, 0.2, 0.3], "top_iou": [0.5, 0.6, 0.1, 0.2],
                              "same_peak": [True, True, False, True]})
    identity = map_diagnostics.practical_identity(agreement, identical_groups=[("gradcam", "hirescam")])
    flags = identity.set_index("second")
    assert flags.loc["gradcampp", "identical_in_practice"] and not flags.loc["gradcampp", "independent_evidence"]
    assert not flags.loc["hirescam", "identical_in_practice"]
    assert flags.loc["hirescam", "identical_by_construction"] and not flags.loc["hirescam", "independent_evidence"]
    assert flags.loc["hirescam", "same_peak_share"] == 0.5 and flags.loc["hirescam", "peak_disagreements"] == 1


def test_a_pair_is_identical_in_practice_by_correlation_and_peak_outcome_share():
    """Median Pearson >= 0.98 and the same peak outcome on >= 95% of the images: one piece of
    evidence even when the peak pixels part on a few images (the default run's Grad-CAM vs
    Grad-CAM++: 108 of 110 shared peaks, 0.99997). Below either bar: two pieces of evidence.
    Without outcomes a parted peak counts as a different outcome; a constant map's image counts
    for neither."""
    n = 40
    agreement = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "first": "gradcam",
                              "second": "gradcampp", "pearson": 0.999, "top_iou": 0.95,
                              "same_peak": [0.0, 0.0] + [1.0] * (n - 3) + [np.nan]})
    row = map_diagnostics.practical_identity(agreement).iloc[0]
    assert row["peak_disagreements"] == 2 and row["n_outcome"] == n - 1
    assert row["same_outcome_share"] == pytest.approx(37 / 39) and not row["identical_in_practice"]
    outcomes = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)] * 2,
                             "method": ["gradcam"] * n + ["gradcampp"] * n,
                             "peak_outside": [False] * n + [True] + [False] * (n - 1)})
    row = map_diagnostics.practical_identity(agreement, outcomes=outcomes).iloc[0]
    assert row["outcome_disagreements"] == 1 and row["same_outcome_share"] == pytest.approx(39 / 40)
    assert row["identical_in_practice"] and not row["independent_evidence"]
    assert row["identical_maps"] == "Grad-CAM = Grad-CAM++"
    below = map_diagnostics.practical_identity(agreement.assign(pearson=0.97), outcomes=outcomes).iloc[0]
    assert not below["identical_in_practice"] and below["independent_evidence"]


def _identity_rows(identical_pairs, by_construction=()):
    """``practical_identity``-like rows of every CAM pair, identical in practice where listed."""
    from itertools import combinations
    rows = [{"first": a, "second": b, "pair": f"{a} vs {b}", "median_pearson": 0.5, "n_outcome": 10,
             "outcome_disagreements": 3, "same_outcome_share": 0.7,
             "identical_in_practice": (a, b) in identical_pairs,
             "identical_by_construction": (a, b) in by_construction} for a, b in combinations(CAM_METHODS, 2)]
    return pd.DataFrame(rows)


def test_identity_groups_are_connected_components_of_identical_pairs():
    """Grad-CAM ~ Grad-CAM++ and Grad-CAM++ ~ Eigen-CAM chain into one group (components, so
    the groups never overlap); a by-construction pair joins the groups as well."""
    identity = _identity_rows({("gradcam", "gradcampp"), ("gradcampp", "eigencam")})
    groups = map_diagnostics.identity_groups(identity)
    assert groups == [("gradcam", "gradcampp", "eigencam")]
    assert map_diagnostics.group_label(groups[0]) == "Grad-CAM = Grad-CAM++ = Eigen-CAM*"
    both = _identity_rows({("gradcam", "gradcampp")}, by_construction={("xgradcam", "hirescam")})
    assert map_diagnostics.identity_groups(both) == [("gradcam", "gradcampp"), ("xgradcam", "hirescam")]
    assert map_diagnostics.identity_groups(_identity_rows(set())) == []
    table4 = pd.DataFrame({"method": [*CAM_METHODS, "random"]})
    marked = map_diagnostics.mark_identity_groups(table4, groups).set_index("method")["identical_maps"]
    assert marked["eigencam"] == marked["gradcam"] == "Grad-CAM = Grad-CAM++ = Eigen-CAM*"
    assert marked["xgradcam"] == "" and marked["random"] == ""


def test_no_pair_inside_a_group_is_independent_evidence_and_the_statement_names_the_group():
    """The chained pair Grad-CAM vs Eigen-CAM fails the rule itself but sits in the group: not
    independent evidence, in the identity table and in the paired tests."""
    n = 20
    ids = [f"s{i}" for i in range(n)]
    frames = []
    for first, second, pearson in (("gradcam", "gradcampp", 0.999), ("gradcam", "eigencam", 0.9),
                                   ("gradcampp", "eigencam", 0.99), ("gradcam", "xgradcam", 0.1),
                                   ("gradcampp", "xgradcam", 0.1), ("xgradcam", "eigencam", 0.1)):
        frames.append(pd.DataFrame({"sample_id": ids, "first": first, "second": second, "pearson": pearson,
                                    "top_iou": 0.5, "same_peak": 1.0}))
    identity = map_diagnostics.practical_identity(pd.concat(frames, ignore_index=True))
    pairs = identity.set_index(["first", "second"])
    assert not pairs.loc[("gradcam", "eigencam"), "identical_in_practice"]
    assert not pairs.loc[("gradcam", "eigencam"), "independent_evidence"]
    assert pairs.loc[("gradcam", "xgradcam"), "independent_evidence"]
    statement = map_diagnostics.identity_statement(identity)
    assert statement.startswith("Grad-CAM = Grad-CAM++ = Eigen-CAM* on this checkpoint")
    assert "weakest pair Grad-CAM vs Eigen-CAM*: median Pearson 0.900" in statement and "not 3" in statement
    paired = pd.DataFrame({"first": ["gradcam", "gradcam"], "second": ["eigencam", "xgradcam"],
                           "identical_by_construction": [False, False]})
    flagged = map_diagnostics.flag_pairs(paired, identity).set_index("second")
    assert not flagged.loc["eigencam", "independent_evidence"] and flagged.loc["xgradcam", "independent_evidence"]
    assert flagged.loc["eigencam", "identical_maps"] == "Grad-CAM = Grad-CAM++ = Eigen-CAM*"


def test_peak_outcomes_count_a_constant_map_as_outside():
    cases = pd.DataFrame({"sample_id": ["a", "a", "b"], "method": ["gradcam", "random", "gradcam"],
                          "peak_outside_mask": [False, False, False], "constant_map": [True, False, False]})
    outcomes = map_diagnostics.peak_outcomes(cases)
    assert outcomes["peak_outside"].tolist() == [True, False] and set(outcomes["method"]) == {"gradcam"}


def test_pearson_per_map_is_nan_for_constant_maps():
    maps = torch.rand(2, 5, 5)
    result = map_priors.pearson_per_map(maps, torch.stack([2 * maps[0] + 1, torch.zeros(5, 5)]))
    assert result[0].item() == pytest.approx(1.0) and np.isnan(result[1].item())


def test_gradcampp_epsilon_share_by_hand():
    activation = torch.ones(1, 1, 2, 2)          # S_c = 4
    gradient = torch.tensor([[[[1e-5, 1.0], [0.0, -1e-4]]]])
    # 2g^2 + 4 g^3: 2e-10 (< 1e-6, dominated), 6 (not), g = 0 (not counted), 2e-8 - 4e-12 (dominated)
    share = map_priors.gradcampp_epsilon_share(activation, gradient)
    assert share.item() == pytest.approx(2 / 3)


# --- constant maps in the summaries -------------------------------------------------------------

def _audit_rows(constant_for=("xgradcam",), n=4):
    rows = []
    for i in range(n):
        for method in MAP_METHODS:
            constant = method in constant_for and i < 2
            rows.append({"dataset": "d", "checkpoint_id": "c", "sample_id": f"s{i}", "method": method,
                         "scaled_score": 0.95, "constant_map": constant,
                         "peak_outside_mask": True if constant else i % 2 == 0,
                         "iou": 0.0 if constant else 0.5, "energy_in_mask": 0.1,
                         "logit_drop": 1.0 if method in CAM_METHODS else np.nan})
    return pd.DataFrame(rows)


def test_constant_maps_count_as_failures_in_table4_and_the_defined_rate_is_beside_it():
    table = _audit_rows()
    random_deletion = pd.DataFrame({"sample_id": [f"s{i}" for i in range(4)], "logit_drop_mean": 0.2})
    panel = summaries.panel_summary(table, random_deletion, [f"s{i}" for i in range(4)], replicates=200, seed=SEED)
    row = panel.set_index("method").loc["xgradcam"]
    # Images s2, s3 have a peak: failures at s2 only -> 0.5; counting the constant ones: 3 / 4.
    assert row["n"] == 4 and row["n_constant"] == 2 and row["n_defined"] == 2
    assert row["peak_failure"] == 0.75 and row["peak_failure_defined"] == 0.5
    # every method of the panel is scored on the same four images (the constant maps' IoU too)
    assert row["iou"] == pytest.approx(0.25)
    assert (row["peak_failure_ci_low"], row["peak_failure_ci_high"]) == pytest.approx(
        stats.wilson_interval(3, 4))
    grad = panel.set_index("method").loc["gradcam"]
    assert grad["n_constant"] == 0 and grad["peak_failure"] == 0.5
    shown = summaries.format_spatial_audit_summary(panel.assign(panel="A"))
    assert "Constant maps" in shown.columns


def test_failure_by_threshold_counts_constant_maps_and_paired_tests_skip_them():
    table = _audit_rows()
    sensitivity = summaries.failure_by_threshold(table, thresholds=(0.9,))
    row = sensitivity.set_index("method").loc["xgradcam"]
    assert row["n_constant"] == 2 and row["failure_rate"] == 0.75
    paired = summaries.paired_tests(table, [f"s{i}" for i in range(4)], replicates=200, seed=SEED)
    pair = paired[(paired["first"] == "gradcam") & (paired["second"] == "xgradcam")].iloc[0]
    assert pair["n"] == 2 and pair["n_constant_excluded"] == 2


def test_gate_smoke_run_fails_for_models_that_cannot_learn(tmp_path):
    """The whole gate on a tiny budget: 2 steps cannot train EfficientNet-B0, so nothing passes.
    The shuffled control is trained once (replicate 1) and reused, judged and audited in
    replicate 2 on that replicate's own frames."""
    # A pool of 4 is below the profile's minimum (8): built without validation, for speed.
    section = config.ValidityGateSettings.model_construct(
        train_images=8, val_images=8, pool_images=4, steps=2, batch_size=4,
        random_deletion_repetitions=1, replicate_seeds=[1, 2], shuffled_control_per_replicate=False)
    settings = validity_gate.GateSettings(section, image_size=64, channels_last=True)
    result = validity_gate.run_gate(tmp_path, arch="efficientnet_b0", settings=settings,
                                    batch_size=4, top_fraction=0.20)
    assert result["layer"] == "features.8.0"
    assert not result["gate"]["passes"].any()
    assert set(result["cases"]["model"]) == set(validity_gate.GATE_MODELS)
    assert set(result["cases"]["gate_seed"]) == {1, 2} and result["cases"]["sample_id"].nunique() == 8
    assert set(result["replicates"]["gate_seed"]) == {1, 2}
    cases = result["cases"]
    assert (cases["feature_grid_height"] == 2).all()          # 64 px / 32
    assert cases["lesion_logit_drop"].notna().all()
    facts = result["models"].set_index(["gate_seed", "model"])
    assert facts.loc[(2, "shuffled"), "trained_with_seed"] == 1
    assert np.isnan(facts.loc[(2, "shuffled"), "train_accuracy"])
    assert facts.loc[(2, "lesion"), "trained_with_seed"] == 2 and facts.loc[(1, "shuffled"), "trained_with_seed"] == 1
    assert not np.isnan(facts.loc[(1, "shuffled"), "train_accuracy"])
    shuffled_maps = cases[cases["model"] == "shuffled"].groupby("gate_seed")["sample_id"].nunique()
    assert shuffled_maps.to_dict() == {1: 4, 2: 4}   # audited on each replicate's own pool


def test_constant_maps_never_make_two_methods_agree():
    maps = {m: torch.zeros(2, 8, 8) for m in CAM_METHODS}
    maps["eigencam"] = torch.rand(2, 8, 8)
    identity = map_diagnostics.practical_identity(map_diagnostics.map_agreement(maps, ["a", "b"], 0.2))
    assert not identity["identical_in_practice"].any()
    assert identity.set_index(["first", "second"]).loc[("gradcam", "hirescam"), "n_constant_pairs"] == 2


def test_display_labels_of_failing_methods_get_a_dagger():
    gate = pd.DataFrame({"method": list(CAM_METHODS), "passes": [True, True, False, True, True]})
    table = pd.DataFrame({"Map": ["Grad-CAM", "XGrad-CAM", "Random heatmap"], "n": [1, 2, 3]})
    marked = validity_gate.mark_display_labels(table, gate)
    assert marked["Map"].tolist() == ["Grad-CAM", "XGrad-CAM\u2020", "Random heatmap"]
    assert marked["n"].tolist() == [1, 2, 3]


def test_05_audits_learned_checkpoints_and_controls_besides_the_primary():
    learning = pd.DataFrame({"checkpoint_id": ["e1", "e2", "c1", "shuffled"],
                             "auprc_ok": [True, True, False, False],
                             "control": ["none", "none", "none", "shuffled_labels"]})
    assert other_checkpoints_to_audit(learning, "e1", False) == ["e2", "shuffled"]
    assert other_checkpoints_to_audit(learning, "e1", True) == ["e2", "c1", "shuffled"]


def test_a_layer_the_gate_did_not_run_at_gets_no_verdict():
    """The layer check repeats Table 4 at the neighbouring layer: the gate's verdicts belong to
    the protocol layer; at the other layer every CAM is "not run at this layer" and daggered."""
    gate = pd.DataFrame({"method": ["gradcam", "eigencam"], "verdict": ["passes", "inconclusive"],
                         "passes": [True, False]})
    table = pd.DataFrame({"layer": ["features.8.0", "features.8.0", "features.8", "features.8", "features.8"],
                          "method": ["gradcam", "eigencam", "gradcam", "eigencam", "random"],
                          "label": ["Grad-CAM", "Eigen-CAM", "Grad-CAM", "Eigen-CAM", "Random heatmap"]})
    marked = validity_gate.mark_layer_table(table, gate, "features.8.0")
    assert marked["validity_gate"].tolist() == ["passes", "inconclusive", validity_gate.NOT_RUN_AT_LAYER,
                                                validity_gate.NOT_RUN_AT_LAYER, "reference"]
    dagger = validity_gate.DAGGER
    assert marked["label"].tolist() == ["Grad-CAM", f"Eigen-CAM{dagger}", f"Grad-CAM{dagger}",
                                        f"Eigen-CAM{dagger}", "Random heatmap"]


def test_gate_at_layers_audits_the_same_models_at_each_layer(tmp_path):
    """Two layers, one set of model draws: the model facts are one table, the first layer's gate
    equals a plain run_gate at that layer (same seeds), and the second layer's maps sit on its
    own (coarser or finer) grid."""
    section = config.ValidityGateSettings.model_construct(   # tiny, below the profile minima
        train_images=8, val_images=8, pool_images=4, steps=2, batch_size=4,
        random_deletion_repetitions=1, replicate_seeds=[1, 2], untrained_initialisations=1,
        shuffled_control_per_replicate=True)
    settings = validity_gate.GateSettings(section, image_size=64, channels_last=False)
    keywords = dict(arch="resnet18", settings=settings, batch_size=4, top_fraction=0.20)
    layers = validity_gate.run_gate_at_layers(tmp_path / "layers", layer_names=["layer4.1", "layer3.1"],
                                              **keywords)
    plain = validity_gate.run_gate(tmp_path / "plain", layer_name="layer4.1", **keywords)
    gate = layers["gate"]
    assert gate["target_layer"].drop_duplicates().tolist() == ["layer4.1", "layer3.1"]
    pd.testing.assert_frame_equal(gate[gate["target_layer"] == "layer4.1"].drop(columns="target_layer")
                                  .reset_index(drop=True), plain["gate"])
    assert len(layers["models"]) == len(plain["models"])
    grids = {name: set(cases["feature_grid_height"]) for name, cases in layers["cases"].items()}
    assert grids == {"layer4.1": {2}, "layer3.1": {4}}           # 64 px / 32 and / 16
    assert (tmp_path / "layers" / "layer3.1" / "seed_2").is_dir()
    with pytest.raises(ValueError, match="distinct layer names"):
        validity_gate.run_gate_at_layers(tmp_path, layer_names=["layer4.1", "layer4.1"], **keywords)


@pytest.mark.parametrize("held_out, met", [(0.50, True), (0.75, True), (0.25, True), (0.8125, False),
                                           (0.104, False), (0.24, False)])
def test_shuffled_control_must_stay_near_chance_on_both_sides(held_out, met):
    """ResNet-18 at 128 px: replicate 2's control reached 0.81 (learnt the lesion), replicate 3's
    0.10 (learnt it inverted; its maps follow the lesion just the same): neither is a control."""
    assert validity_gate.control_accuracy_rule(held_out, 0.75) == ("0.25-0.75", met)
