"""Stability of the headline verdicts (analysis.stability): hand-made audits with known answers."""

import numpy as np
import pandas as pd
import pytest

from endoexplain_core.analysis import over_seeds, stability
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS


def _audit(checkpoint, failures, n=12, score=0.95):
    """Audit-like rows: method m fails (peak outside) on the first failures[m] of n images."""
    rows = []
    for i in range(n):
        for method in MAP_METHODS:
            rows.append({"checkpoint_id": checkpoint, "sample_id": f"s{i:02d}", "method": method,
                         "scaled_score": score, "constant_map": False,
                         "peak_outside_mask": i < failures.get(method, 0),
                         "lesion_area_fraction": 0.05 + 0.01 * (i % 5),
                         "lesion_centre_distance": 0.1 + 0.02 * (i % 7)})
    return pd.DataFrame(rows)


def _over_seeds(rates: dict[str, list[float]], centre: list[float], n=60):
    """``over_seeds.table4_over_seeds`` of hand-made seed rates (n images per seed)."""
    rows = [{"checkpoint_id": f"c{k}", "seed": k, "is_primary": k == 0, "method": method, "label": method,
             "n": n, "n_constant": 0, "peak_failure": rate}
            for method, values in {**rates, "centre": centre}.items() for k, rate in enumerate(values)]
    return over_seeds.table4_over_seeds(pd.DataFrame(rows))


def test_table4_verdicts_are_read_over_seeds_and_held_by_one_new_seed():
    centre = [0.5] * 6
    over = _over_seeds({"gradcam": [0.80, 0.75, 0.85, 0.70, 0.78, 0.45],     # one seed below: still above
                        "gradcampp": [0.20, 0.25, 0.22, 0.18, 0.24, 0.21],   # below, tight
                        "xgradcam": [0.30, 0.70, 0.55, 0.40, 0.62, 0.48],    # inconclusive
                        "hirescam": [0.09, 0.99, 0.08, 0.10, 0.07, 0.12],    # bimodal, 5 of 6 below
                        "eigencam": [0.9, 0.95, 0.9, 0.92, 0.88, 0.91]}, centre)
    gate = pd.DataFrame({"method": list(CAM_METHODS), "verdict": "passes",
                         "one_new_draw": "lesion model peak-inside 0.62-0.91 (bar >= 0.312)", "held": True})
    signs = {"p": {m: "higher odds" for m in CAM_METHODS[1:]},
             "o": {m: "higher odds" if m != "xgradcam" else "lower odds" for m in CAM_METHODS[1:]}}
    table = stability.stability_table(
        gate_stability=gate, table4_over_seeds=over, table5=signs, primary_id="p",
        selection={"share_same": 0.6, "replicates_used": 100, "runner_up": "o"})
    keyed = table.set_index(["part", "subject"])
    part = stability.TABLE4_PART
    assert keyed.loc[(part, "gradcam"), "verdict"] == "above centre"
    # the 80% interval of one new seed's difference reaches below 0: the verdict does not hold for a new seed
    assert not keyed.loc[(part, "gradcam"), "held"]
    assert keyed.loc[(part, "gradcampp"), "verdict"] == "below centre" and keyed.loc[(part, "gradcampp"), "held"]
    assert keyed.loc[(part, "eigencam"), "verdict"] == "above centre" and keyed.loc[(part, "eigencam"), "held"]
    assert keyed.loc[(part, "xgradcam"), "verdict"] == "inconclusive" and pd.isna(keyed.loc[(part, "xgradcam"), "held"])
    assert keyed.loc[(part, "hirescam"), "verdict"] == "inconclusive"
    assert "5 of 6 seeds below centre" in keyed.loc[(part, "hirescam"), "under_perturbation"]
    assert not keyed.loc[("Table 5 term vs Grad-CAM", "xgradcam"), "held"]
    assert keyed.loc[("Table 5 term vs Grad-CAM", "hirescam"), "held"]
    assert not keyed.loc[("primary selection", "p"), "held"]   # 60% < SELECTION_HOLDS_AT
    assert keyed.loc[("validity gate", "gradcam"), "held"]
    assert stability.unstable_subjects(table, part) == ["gradcam"]
    marked = stability.mark_unstable(pd.DataFrame({"map": ["HiResCAM", "Grad-CAM", "HiResCAM\u2020"]}),
                                     ["hirescam"])
    assert marked["map"].tolist() == ["HiResCAM\u2021", "Grad-CAM", "HiResCAM\u2021\u2020"]


def test_a_share_read_verdict_holds_when_a_new_seed_lands_on_its_side_with_probability_0_8():
    def row_for(rates, centre):
        table = stability.stability_table(gate_stability=None, table4_over_seeds=_over_seeds({"hirescam": rates}, centre),
                                          table5={}, primary_id="p",
                                          selection={"share_same": 1.0, "replicates_used": 10, "runner_up": ""})
        return table.set_index(["part", "subject"]).loc[(stability.TABLE4_PART, "hirescam")]
    six = [0.09, 0.95, 0.08, 0.10, 0.07, 0.12]
    row = row_for(six, [0.5, 0.97, 0.5, 0.5, 0.5, 0.5])   # 6 of 6 below their own centre
    assert row["verdict"] == "below centre" and row["held"]   # Clopper-Pearson 0.54 to 1; (6 + 1) / 8 = 0.875
    # 15 of 20 below: Clopper-Pearson 0.51 to 0.91 decides, but (15 + 1) / 22 = 0.73 < 0.80
    twenty = [0.05] * 15 + [0.95] * 5
    row = row_for(twenty, [0.5] * 20)
    assert row["verdict"] == "below centre" and not row["held"]


def test_without_seeds_the_table4_verdicts_are_not_estimable_never_held():
    table = stability.stability_table(gate_stability=None, table4_over_seeds=_over_seeds({"gradcam": [0.3]}, [0.5]),
                                      table5={"p": {}}, primary_id="p",
                                      selection={"share_same": 1.0, "replicates_used": 10, "runner_up": ""})
    rows = table[table["part"] == stability.TABLE4_PART]
    assert rows["held"].isna().all() and (rows["verdict"] == "not estimable").all()
    none = stability.stability_table(gate_stability=None, table4_over_seeds=None, table5={}, primary_id="p",
                                     selection={"share_same": 1.0, "replicates_used": 10, "runner_up": ""})
    assert (none.loc[none["part"] == stability.TABLE4_PART, "verdict"] == "not estimable").all()


def test_selection_stability_counts_resamples_that_pick_the_primary():
    rng = np.random.default_rng(0)
    targets = np.r_[np.ones(30), np.zeros(70)]
    strong = targets * 3 + rng.normal(size=100)        # separates well
    weak = targets * 0.3 + rng.normal(size=100)        # barely
    rows = []
    for checkpoint, seed, z in (("strong", 1, strong), ("weak", 2, weak)):
        rows.append(pd.DataFrame({"checkpoint_id": checkpoint, "seed": seed,
                                  "sample_id": [f"v{i}" for i in range(100)], "target": targets,
                                  "logit_neg": 0.0, "logit_pos": z}))
    result = stability.selection_stability(pd.concat(rows), "strong", replicates=200, seed=1, tie_auprc=0.01)
    assert result["share_same"] == 1.0 and result["replicates_used"] == 200
    assert result["tied_share"] == 0.0                                  # won on AUPRC, never by the tie
    tied = stability.selection_stability(pd.concat([rows[0], rows[0].assign(checkpoint_id="twin", seed=0)]),
                                         "strong", replicates=50, seed=1, tie_auprc=0.01)
    assert tied["share_same"] == 0.0 and tied["runner_up"] == "twin"   # same NLL: the lowest seed
    assert tied["tied_share"] == 1.0
    table = stability.stability_table(gate_stability=None, selection=tied, table4_over_seeds=None,
                                      table5={}, primary_id="twin")
    assert "in 100% of them several checkpoints tied" in table.iloc[0]["under_perturbation"]
    # a near-twin a little better on every resample is still tied within 0.01: the lower seed wins
    near = rows[0].assign(checkpoint_id="near", seed=0, logit_pos=strong * 1.0 - 0.0)
    near.loc[near["target"] == 1, "logit_pos"] += 0.05
    within = stability.selection_stability(pd.concat([rows[0].assign(seed=5), near]), "near",
                                           replicates=50, seed=1, tie_auprc=0.01)
    assert within["share_same"] == 1.0
    # a tie goes to the lower validation NLL on each resample: the same ranks, scores centred
    # on the decision boundary (NLL 0.31 against 0.65 on all images)
    centred = rows[0].assign(checkpoint_id="centred", seed=9, logit_pos=strong - 1.5)
    by_nll = stability.selection_stability(pd.concat([rows[0], centred]), "centred",
                                           replicates=50, seed=1, tie_auprc=0.01)
    assert by_nll["tied_share"] == 1.0 and by_nll["share_same"] == 1.0
