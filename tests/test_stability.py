"""Stability of the headline verdicts (analysis.stability): hand-made audits with known answers."""

import numpy as np
import pandas as pd
import pytest

from endoexplain_core.analysis import stability
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


def test_panel_a_against_centre_compares_on_the_same_images():
    table = _audit("a", {"gradcam": 8, "gradcampp": 3, "centre": 5})
    result = stability.panel_a_against_centre(table, 0.9).set_index("method")
    assert result.loc["gradcam", "verdict"] == "above centre"
    assert result.loc["gradcampp", "verdict"] == "not above centre"
    assert result.loc["gradcam", "peak_failure"] == pytest.approx(8 / 12)
    assert result.loc["gradcam", "centre_peak_failure"] == pytest.approx(5 / 12)
    empty = stability.panel_a_against_centre(_audit("a", {}, score=0.5), 0.9)
    assert (empty["verdict"] == "no panel A").all() and (empty["n"] == 0).all()


def test_stability_table_marks_a_verdict_that_flips_on_another_seed():
    primary = stability.panel_a_against_centre(_audit("p", {"gradcam": 8, "hirescam": 8, "centre": 5}), 0.9)
    other = stability.panel_a_against_centre(_audit("o", {"gradcam": 9, "hirescam": 2, "centre": 5}), 0.9)
    signs = {"p": {m: "higher odds" for m in CAM_METHODS[1:]},
             "o": {m: "higher odds" if m != "xgradcam" else "lower odds" for m in CAM_METHODS[1:]}}
    gate = pd.DataFrame({"method": list(CAM_METHODS), "verdict": "passes",
                         "one_new_draw": "lesion model peak-inside 0.62-0.91 (bar >= 0.312)", "held": True})
    table = stability.stability_table(
        gate_stability=gate, panel_a={"p": primary, "o": other}, table5=signs, primary_id="p",
        selection={"share_same": 0.6, "replicates_used": 100, "runner_up": "o"})
    keyed = table.set_index(["part", "subject"])
    assert keyed.loc[("Table 4 panel A vs centre", "gradcam"), "held"]
    assert not keyed.loc[("Table 4 panel A vs centre", "hirescam"), "held"]
    assert not keyed.loc[("Table 5 term vs Grad-CAM", "xgradcam"), "held"]
    assert keyed.loc[("Table 5 term vs Grad-CAM", "hirescam"), "held"]
    assert not keyed.loc[("primary selection", "p"), "held"]   # 60% < SELECTION_HOLDS_AT
    assert stability.unstable_subjects(table, "Table 4 panel A vs centre") == ["hirescam"]
    marked = stability.mark_unstable(pd.DataFrame({"map": ["HiResCAM", "Grad-CAM", "HiResCAM\u2020"]}),
                                     ["hirescam"])
    assert marked["map"].tolist() == ["HiResCAM\u2021", "Grad-CAM", "HiResCAM\u2021\u2020"]


def test_an_undecided_primary_verdict_is_never_counted_as_held():
    primary = stability.panel_a_against_centre(_audit("p", {}, score=0.5), 0.9)   # no panel A
    other = stability.panel_a_against_centre(_audit("o", {"gradcam": 9, "centre": 5}), 0.9)
    table = stability.stability_table(gate_stability=None, panel_a={"p": primary, "o": other},
                                      table5={"p": {}, "o": {}}, primary_id="p",
                                      selection={"share_same": 1.0, "replicates_used": 10, "runner_up": ""})
    rows = table[table["part"] == "Table 4 panel A vs centre"]
    assert rows["held"].isna().all()


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
    tied = stability.selection_stability(pd.concat([rows[0], rows[0].assign(checkpoint_id="twin", seed=0)]),
                                         "strong", replicates=50, seed=1, tie_auprc=0.01)
    assert tied["share_same"] == 0.0 and tied["runner_up"] == "twin"   # ties go to the lowest seed
    # a near-twin a little better on every resample is still tied within 0.01: the lower seed wins
    near = rows[0].assign(checkpoint_id="near", seed=0, logit_pos=strong * 1.0 - 0.0)
    near.loc[near["target"] == 1, "logit_pos"] += 0.05
    within = stability.selection_stability(pd.concat([rows[0].assign(seed=5), near]), "near",
                                           replicates=50, seed=1, tie_auprc=0.01)
    assert within["share_same"] == 1.0
