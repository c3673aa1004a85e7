"""Verdict-level agreement between two runs (pipeline.verdicts): each check can fail."""

from __future__ import annotations

import pandas as pd

from endoexplain_core.methods import CAM_METHODS
from endoexplain_core.pipeline import verdicts


def _tables(verdict="passes", n_a=60, rate=0.30, low=0.20, high=0.40, learned=(True, True), primary="a"):
    gate = pd.DataFrame({"method": list(CAM_METHODS), "verdict": verdict})
    table4 = pd.DataFrame({"panel": ["A", "A", "B"], "method": ["gradcam", "random", "gradcam"],
                           "n": [n_a, n_a, 90], "peak_failure": [rate, 0.85, 0.5],
                           "peak_failure_ci_low": [low, 0.75, 0.4], "peak_failure_ci_high": [high, 0.93, 0.6]})
    learning = pd.DataFrame({"checkpoint_id": ["a", "b"], "learned": list(learned),
                             "is_primary": [primary == "a", primary == "b"]})
    return {"table_validity_gate": gate, "table4_spatial_audit": table4, "table_checkpoint_learning": learning}


def _write(folder, tables):
    folder.mkdir()
    for name, table in tables.items():
        table.to_csv(folder / f"{name}.csv", index=False)
    return folder


def test_the_same_run_agrees_with_itself(tmp_path):
    reference = _write(tmp_path / "ref", _tables())
    result = verdicts.compare_runs(_write(tmp_path / "run", _tables()), reference)
    assert result["ok"].all() and len(result) == 5
    assert verdicts.main([str(tmp_path / "run"), str(reference)]) == 0


def test_each_check_can_fail(tmp_path):
    reference = _write(tmp_path / "ref", _tables())
    cases = {"gate verdicts": _tables(verdict="inconclusive"),
             "learned checkpoints": _tables(learned=(True, False)),
             "primary": _tables(primary="b"),
             "panel A size": _tables(n_a=53),                      # 12% fewer images
             "Table 4 peak failure within CIs": _tables(rate=0.45, low=0.35, high=0.55)}
    for index, (check, tables) in enumerate(cases.items()):
        result = verdicts.compare_runs(_write(tmp_path / f"run{index}", tables), reference).set_index("check")
        assert not result.loc[check, "ok"], check
        assert result.drop(index=check)["ok"].all(), check
    assert verdicts.main([str(tmp_path / "run0"), str(reference)]) == 1


def test_panel_a_within_ten_percent_and_rates_inside_each_others_interval_agree(tmp_path):
    reference = _write(tmp_path / "ref", _tables())
    near = _tables(n_a=55, rate=0.35, low=0.26, high=0.45)   # 8% fewer; 0.35 in [0.2, 0.4], 0.30 in [0.26, 0.45]
    assert verdicts.compare_runs(_write(tmp_path / "run", near), reference)["ok"].all()


def test_a_missing_table_is_named(tmp_path, capsys):
    reference = _write(tmp_path / "ref", _tables())
    run = _write(tmp_path / "run", {k: v for k, v in _tables().items() if k != "table_validity_gate"})
    assert verdicts.main([str(run), str(reference)]) == 2
    assert "table_validity_gate.csv is missing" in capsys.readouterr().err
