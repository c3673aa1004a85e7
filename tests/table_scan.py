"""Scan a run's tables for p-values their own row cannot carry (issue 35's "done when"):
a p (or Holm-adjusted p, TOST p, heterogeneity p) on a row that is not estimable, whose fit did
not converge, or whose GEE had fewer than ``MIN_SPARE_CLUSTERS`` clusters beyond its
parameters. Used on the smoke and thin-data runs (tests/test_end_to_end.py) and, by hand, on a
default run: ``python -m tests.table_scan figures/default``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from endoexplain_core.analysis.subgroups import MIN_SPARE_CLUSTERS

P_COLUMN = re.compile(r"p|p_value|p_holm|.+_p|.+_p_holm")


def _reason(row: pd.Series, gee_table: bool) -> str:
    """Why ``row`` may not print a p ("" when it may)."""
    if "estimable" in row and row["estimable"] is not np.nan and not bool(row["estimable"]):
        return "the row is not estimable"
    note = str(row.get("note", "")) if pd.notna(row.get("note", np.nan)) else ""
    if "not estimable" in note:
        return f"its note says {note[:80]!r}"
    if "did not converge" in note and "refit under independence" not in note:
        return "its fit did not converge"
    if gee_table:
        clusters, parameters = row.get("n_clusters", np.nan), row.get("n_parameters", np.nan)
        if not (np.isfinite(clusters) and np.isfinite(parameters)):
            return "the GEE row does not say its design size (n_clusters, n_parameters)"
        if clusters - parameters < MIN_SPARE_CLUSTERS:
            return f"{int(clusters)} clusters for {int(parameters)} parameters"
    return ""


def unsupported_p_values(figures_dir: str | Path) -> list[str]:
    """One line per (table, row, p column) whose finite p the row cannot carry."""
    problems = []
    for path in sorted(Path(figures_dir).glob("*.csv")):
        table = pd.read_csv(path)
        columns = [c for c in table.columns if P_COLUMN.fullmatch(c)]
        if not columns:
            continue
        gee_table = {"model", "slopes", "se"} <= set(table.columns)   # the subgroup GEE gaps
        for index, row in table.iterrows():
            printed = [c for c in columns if pd.notna(row[c])]
            reason = _reason(row, gee_table) if printed else ""
            if reason:
                problems.append(f"{path.name} row {index}: {', '.join(printed)} printed, but {reason}")
    return problems


if __name__ == "__main__":
    found = unsupported_p_values(sys.argv[1])
    print("\n".join(found) or "no p-value without support")
    sys.exit(1 if found else 0)
