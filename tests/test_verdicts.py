"""Verdict-level agreement between two runs (pipeline.verdicts): each check can fail."""

from __future__ import annotations

import pandas as pd
import pytest
from scipy import stats as scipy_stats

from endoexplain_core.analysis.over_seeds import table4_over_seeds
from endoexplain_core.methods import CAM_METHODS
from endoexplain_core.pipeline import verdicts


def _tables(verdict="passes", n_a=60, learned=(True, True), primary="a", seed_rates=(0.30, 0.40, 0.50),
            over_seeds=True, verdicts_by_method=None, training_seeds=(1, 2), arches=("effnet", "effnet")):
    """Headline tables of a toy run; ``seed_rates``: every CAM's panel-A rate on each of three seeds
    (60 images each), from which its table4_per_seed and table4_over_seeds are built."""
    gate = pd.DataFrame({"method": list(CAM_METHODS),
                         "verdict": [(verdicts_by_method or {}).get(m, verdict) for m in CAM_METHODS]})
    table4 = pd.DataFrame({"panel": ["A", "A", "B"], "method": ["gradcam", "random", "gradcam"],
                           "n": [n_a, n_a, 90], "peak_failure": [0.3, 0.85, 0.5],
                           "peak_failure_ci_low": [0.2, 0.75, 0.4], "peak_failure_ci_high": [0.4, 0.93, 0.6]})
    learning = pd.DataFrame({"checkpoint_id": ["a", "b"], "arch": list(arches), "seed": list(training_seeds),
                             "control": "none", "learned": list(learned),
                             "is_primary": [primary == "a", primary == "b"]})
    tables = {"table_validity_gate": gate, "table4_spatial_audit": table4, "table_checkpoint_learning": learning}
    if over_seeds:
        per_seed = pd.DataFrame([{"checkpoint_id": f"s{k}", "seed": k, "is_primary": k == 0, "method": m,
                                  "label": m, "n": 60, "n_constant": 0, "peak_failure": rate}
                                 for k, rate in enumerate(seed_rates) for m in (*CAM_METHODS, "centre")])
        tables["table4_per_seed"] = per_seed
        tables["table4_over_seeds"] = table4_over_seeds(per_seed)
    return tables


def _write(folder, tables):
    folder.mkdir()
    for name, table in tables.items():
        table.to_csv(folder / f"{name}.csv", index=False)
    return folder


def test_the_same_run_agrees_with_itself(tmp_path):
    reference = _write(tmp_path / "ref", _tables())
    result = verdicts.compare_runs(_write(tmp_path / "run", _tables()), reference)
    assert result["ok"].all() and not result["skipped"].any() and len(result) == 5
    assert verdicts.main([str(tmp_path / "run"), str(reference)]) == 0


def test_each_check_can_fail(tmp_path):
    reference = _write(tmp_path / "ref", _tables())
    cases = {"gate verdicts": _tables(verdicts_by_method={"xgradcam": "fails"}),   # passes vs fails
             "learned checkpoints": _tables(learned=(True, False)),
             "primary": _tables(primary="b"),
             "panel A size": _tables(n_a=53),                      # 12% fewer images
             "Table 4 means over seeds within the Welch bound": _tables(seed_rates=(0.75, 0.85, 0.80))}
    for index, (check, tables) in enumerate(cases.items()):
        result = verdicts.compare_runs(_write(tmp_path / f"run{index}", tables), reference).set_index("check")
        assert not result.loc[check, "ok"], check
        assert result.drop(index=check)["ok"].all(), check
    assert verdicts.main([str(tmp_path / "run0"), str(reference)]) == 1


def test_seed_means_differ_by_less_than_the_bonferroni_welch_bound_from_scipy(tmp_path):
    reference = _tables()["table4_over_seeds"].set_index("method").loc["gradcam"]
    bound = verdicts.welch_bound(reference, reference)
    # the bound itself: the difference at which scipy's Welch test reaches alpha = 0.05 / 5
    sd = verdicts._effective_sd(reference)
    shifted = reference.copy()
    shifted["peak_failure"] = reference["peak_failure"] + bound["bound"]
    p = scipy_stats.ttest_ind_from_stats(float(shifted["peak_failure"]), sd, 3, float(reference["peak_failure"]),
                                         sd, 3, equal_var=False).pvalue
    assert p == pytest.approx(0.01) and verdicts.SEED_MEANS_ALPHA == pytest.approx(0.01)
    # seed rates 0.30 / 0.40 / 0.50: SD 0.10, so the bound is t(0.995, 4) * 0.1 * sqrt(2 / 3)
    assert bound["bound"] == pytest.approx(scipy_stats.t.ppf(0.995, 4) * 0.1 * (2 / 3) ** 0.5)
    ref = _write(tmp_path / "ref", _tables())
    within = _tables(seed_rates=(0.45, 0.55, 0.65))       # mean 0.55: 0.15 from 0.40, bound 0.38
    assert verdicts.compare_runs(_write(tmp_path / "within", within), ref)["ok"].all()
    beyond = _tables(seed_rates=(0.75, 0.85, 0.80))       # mean 0.80: 0.40 from 0.40, SD 0.05
    result = verdicts.compare_runs(_write(tmp_path / "beyond", beyond), ref).set_index("check")
    assert "gradcam: 0.800 vs 0.400" in result.iloc[-1]["detail"]


def test_passes_against_inconclusive_is_compatible_and_said(tmp_path):
    reference = _write(tmp_path / "ref", _tables())
    run = _write(tmp_path / "run", _tables(verdicts_by_method={"xgradcam": "inconclusive"}))
    result = verdicts.compare_runs(run, reference).set_index("check")
    assert result["ok"].all()
    assert "compatible" in result.loc["gate verdicts", "detail"] and "xgradcam: inconclusive vs passes" in \
        result.loc["gate verdicts", "detail"]
    both_ways = _write(tmp_path / "fails", _tables(verdicts_by_method={"gradcam": "fails"}))
    assert not verdicts.compare_runs(reference, both_ways).set_index("check").loc["gate verdicts", "ok"]


def test_a_reference_without_the_over_seeds_table_skips_that_check_and_says_so(tmp_path, capsys):
    reference = _write(tmp_path / "ref", _tables(over_seeds=False))
    run = _write(tmp_path / "run", _tables(seed_rates=(0.9, 0.95, 0.92)))
    result = verdicts.compare_runs(run, reference).set_index("check")
    row = result.loc["Table 4 means over seeds within the Welch bound"]
    assert row["skipped"] and row["detail"].startswith("skipped: the reference has no table4_over_seeds.csv")
    assert verdicts.main([str(run), str(reference)]) == 0
    assert "SKIPPED   Table 4 means over seeds" in capsys.readouterr().out
    # the run must write the table when the reference has it
    assert verdicts.main([str(reference), str(run)]) == 2
    assert "table4_over_seeds.csv is missing" in capsys.readouterr().err


def test_a_per_seed_table_that_does_not_add_up_to_the_over_seeds_table_is_refused(tmp_path, capsys):
    tables = _tables()
    tables["table4_per_seed"].loc[0, "peak_failure"] = 0.9
    reference = _write(tmp_path / "ref", _tables())
    run = _write(tmp_path / "run", tables)
    assert verdicts.main([str(run), str(reference)]) == 2
    assert "does not add up to table4_over_seeds for gradcam" in capsys.readouterr().err


def test_a_degenerate_seed_left_out_of_the_mean_still_adds_up(tmp_path, capsys):
    tables = _tables()
    per_seed = tables["table4_per_seed"]
    per_seed["degenerate"] = (per_seed["method"] == "gradcam") & (per_seed["checkpoint_id"] == "s0")
    per_seed.loc[per_seed["degenerate"], "peak_failure"] = 0.97   # not in the mean
    tables["table4_over_seeds"] = table4_over_seeds(per_seed)
    reference = _write(tmp_path / "ref", _tables())
    assert verdicts.main([str(_write(tmp_path / "run", tables)), str(reference)]) == 0
    # the same rates without the flag do not add up to that table
    tables["table4_per_seed"] = per_seed.drop(columns="degenerate")
    assert verdicts.main([str(_write(tmp_path / "unflagged", tables)), str(reference)]) == 2
    assert "does not add up to table4_over_seeds for gradcam" in capsys.readouterr().err


def _reseeded(**changes):
    """A toy run trained on other seeds: its checkpoints are named after them."""
    tables = _tables(training_seeds=(7, 8), **changes)
    tables["table_checkpoint_learning"]["checkpoint_id"] = ["a7", "b8"]
    return tables


def test_a_reseeded_run_is_compared_by_architecture_not_by_checkpoint_name(tmp_path):
    reference = _write(tmp_path / "ref", _tables(arches=("effnet", "resnet")))
    same = verdicts.compare_runs(_write(tmp_path / "same", _reseeded(arches=("effnet", "resnet"))),
                                 reference).set_index("check")
    assert same["ok"].all()
    assert same.loc["primary", "detail"] == "reseeded, architecture effnet vs effnet (a7 vs a)"
    assert same.loc["learned checkpoints", "detail"] == ("reseeded, learned per architecture: "
                                                         "effnet 1, resnet 1 in both")
    fewer = verdicts.compare_runs(_write(tmp_path / "fewer", _reseeded(arches=("effnet", "resnet"),
                                                                       learned=(True, False))),
                                  reference).set_index("check")
    assert not fewer.loc["learned checkpoints", "ok"]
    assert fewer.loc["learned checkpoints", "detail"].endswith("effnet 1 vs effnet 1, resnet 1")
    other_arch = verdicts.compare_runs(_write(tmp_path / "other", _reseeded(arches=("effnet", "resnet"),
                                                                            primary="b")),
                                       reference).set_index("check")
    assert not other_arch.loc["primary", "ok"] and other_arch.drop(index="primary")["ok"].all()


def test_the_same_seeds_compare_checkpoints_by_name(tmp_path):
    """Without a reseed the stronger check holds: the very checkpoints, not their counts."""
    reference = _write(tmp_path / "ref", _tables(learned=(True, False)))
    swapped = verdicts.compare_runs(_write(tmp_path / "run", _tables(learned=(False, True), primary="b")),
                                    reference).set_index("check")
    assert not swapped.loc["learned checkpoints", "ok"] and not swapped.loc["primary", "ok"]
    assert swapped.loc["learned checkpoints", "detail"] == "differ: a, b"


def test_panel_a_within_ten_percent_agrees(tmp_path):
    reference = _write(tmp_path / "ref", _tables())
    near = _tables(n_a=55)   # 8% fewer
    assert verdicts.compare_runs(_write(tmp_path / "run", near), reference)["ok"].all()


def test_a_missing_table_is_named(tmp_path, capsys):
    reference = _write(tmp_path / "ref", _tables())
    run = _write(tmp_path / "run", {k: v for k, v in _tables().items() if k != "table_validity_gate"})
    assert verdicts.main([str(run), str(reference)]) == 2
    assert "table_validity_gate.csv is missing" in capsys.readouterr().err


def test_a_missing_folder_or_a_run_folder_is_named_in_one_line(tmp_path, capsys):
    reference = _write(tmp_path / "ref", _tables())
    assert verdicts.main([str(tmp_path / "nowhere"), str(reference)]) == 2
    assert capsys.readouterr().err.strip().endswith("is not a folder: give a run's figures folder, e.g. figures/default")
    run_folder = tmp_path / "runs" / "default"
    run_folder.mkdir(parents=True)
    (run_folder / "provenance.json").write_text("{}")
    assert verdicts.main([str(run_folder), str(reference)]) == 2
    assert "is a run folder (runs/<profile>); the tables are in its figures folder" in capsys.readouterr().err
