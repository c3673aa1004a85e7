"""Do two runs of one profile reach the same verdicts?

``compare_runs(figures_dir, reference_dir)``: one row (check, ok, detail) per check of the
``HEADLINE_TABLES`` against a reference (default ``tests/expected/default/``): the same gate
verdict per CAM, the same learned checkpoints, the same primary, panel A's size within
``PANEL_A_TOLERANCE``, every Table 4 peak-failure rate inside the other run's 95% interval
both ways. ``python -m endoexplain_core.pipeline.verdicts FIGURES_DIR [REFERENCE_DIR]`` prints
them; exit 1 when a check fails, 2 when a table is missing.

Design: docs/data_models_runs.md, "Run summary and verdicts".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from endoexplain_core.config import REPO_ROOT
from endoexplain_core.methods import CAM_METHODS

HEADLINE_TABLES = ("table_validity_gate", "table4_spatial_audit", "table_checkpoint_learning")
DEFAULT_REFERENCE = REPO_ROOT / "tests" / "expected" / "default"
PANEL_A_TOLERANCE = 0.10


def _read(folder: Path, name: str) -> pd.DataFrame:
    path = Path(folder) / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the run did not write its {name} table")
    return pd.read_csv(path)


def gate_check(gate: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """Same verdict for every CAM method."""
    ours = gate.set_index("method")["verdict"]
    theirs = reference.set_index("method")["verdict"]
    differ = [f"{m}: {ours.get(m)} vs {theirs.get(m)}" for m in CAM_METHODS if ours.get(m) != theirs.get(m)]
    return {"check": "gate verdicts", "ok": not differ,
            "detail": "; ".join(differ) or ", ".join(f"{m} {ours.get(m)}" for m in CAM_METHODS)}


def learned_check(learning: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """The same checkpoints learned."""
    ours = set(learning.loc[learning["learned"].astype(bool), "checkpoint_id"])
    theirs = set(reference.loc[reference["learned"].astype(bool), "checkpoint_id"])
    differ = sorted(ours ^ theirs)
    return {"check": "learned checkpoints", "ok": not differ,
            "detail": (f"differ: {', '.join(differ)}" if differ else f"{len(ours)} learned in both")}


def primary_check(learning: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """The same primary checkpoint (``is_primary`` of the learning table)."""
    def primary(table: pd.DataFrame) -> str:
        chosen = table.loc[table["is_primary"].map(lambda v: str(v).lower() == "true"), "checkpoint_id"]
        return chosen.iloc[0] if len(chosen) else "none"
    ours, theirs = primary(learning), primary(reference)
    return {"check": "primary", "ok": ours == theirs, "detail": f"{ours} vs {theirs}"}


def panel_a_check(table4: pd.DataFrame, reference: pd.DataFrame,
                  tolerance: float = PANEL_A_TOLERANCE) -> dict:
    """Panel A's image count within ``tolerance`` (relative to the reference)."""
    ours = int(table4.loc[table4["panel"] == "A", "n"].max())
    theirs = int(reference.loc[reference["panel"] == "A", "n"].max())
    ok = abs(ours - theirs) <= tolerance * theirs
    return {"check": "panel A size", "ok": bool(ok),
            "detail": f"{ours} vs {theirs} images (tolerance {tolerance:.0%})"}


def table4_check(table4: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """Every peak-failure rate inside the other run's 95% interval, both ways."""
    columns = ["panel", "method", "peak_failure", "peak_failure_ci_low", "peak_failure_ci_high"]
    both = table4[columns].merge(reference[columns], on=["panel", "method"], suffixes=("", "_reference"))
    both = both.dropna(subset=["peak_failure", "peak_failure_reference"])
    outside = []
    for row in both.itertuples():
        inside_theirs = row.peak_failure_ci_low_reference <= row.peak_failure <= row.peak_failure_ci_high_reference
        inside_ours = row.peak_failure_ci_low <= row.peak_failure_reference <= row.peak_failure_ci_high
        if not (inside_theirs and inside_ours):
            outside.append(f"{row.panel}/{row.method}: {row.peak_failure:.3f} vs {row.peak_failure_reference:.3f}")
    compared = len(both)
    return {"check": "Table 4 peak failure within CIs", "ok": bool(compared) and not outside,
            "detail": "; ".join(outside) or f"{compared} rates compared, all inside"}


def compare_runs(figures_dir: str | Path, reference_dir: str | Path = DEFAULT_REFERENCE) -> pd.DataFrame:
    """One row per check (check, ok, detail) of a run's figures folder against a reference
    folder holding the ``HEADLINE_TABLES`` as CSV."""
    figures_dir, reference_dir = Path(figures_dir), Path(reference_dir)
    ours = {name: _read(figures_dir, name) for name in HEADLINE_TABLES}
    theirs = {name: _read(reference_dir, name) for name in HEADLINE_TABLES}
    rows = [gate_check(ours["table_validity_gate"], theirs["table_validity_gate"]),
            learned_check(ours["table_checkpoint_learning"], theirs["table_checkpoint_learning"]),
            primary_check(ours["table_checkpoint_learning"], theirs["table_checkpoint_learning"]),
            panel_a_check(ours["table4_spatial_audit"], theirs["table4_spatial_audit"]),
            table4_check(ours["table4_spatial_audit"], theirs["table4_spatial_audit"])]
    return pd.DataFrame(rows, columns=["check", "ok", "detail"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m endoexplain_core.pipeline.verdicts",
        description="Compare a run's headline verdicts with a reference run's tables.")
    parser.add_argument("figures_dir", help="the run's figures folder, e.g. figures/default")
    parser.add_argument("reference_dir", nargs="?", default=str(DEFAULT_REFERENCE),
                        help="folder with the reference tables (default tests/expected/default)")
    args = parser.parse_args(argv)
    try:
        result = compare_runs(args.figures_dir, args.reference_dir)
    except FileNotFoundError as error:
        print(f"verdicts: {error}", file=sys.stderr)
        return 2
    for row in result.itertuples():
        print(f"{'same' if row.ok else 'DIFFERENT':9} {row.check}: {row.detail}")
    return 0 if bool(np.all(result["ok"])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
