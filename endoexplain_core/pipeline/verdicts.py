"""Do two runs of one profile reach the same verdicts?

``compare_runs(figures_dir, reference_dir)``: one row (check, ok, detail) per check of the
``HEADLINE_TABLES`` against a reference (default ``tests/expected/default/``): the same gate
verdict per CAM, the same learned checkpoints, the same primary, panel A's size within
``PANEL_A_TOLERANCE``, every Table 4 peak-failure rate inside the other run's 95% interval
both ways. ``python -m endoexplain_core.pipeline.verdicts FIGURES_DIR [REFERENCE_DIR]`` prints
them; exit 1 when a check fails; exit 2, one line, when the comparison cannot be made: a table
missing, or breaking its own invariants (``TABLE_COLUMNS``, unique ``TABLE_KEYS``, rows, one
primary checkpoint: ``TableInvalid``), or a folder compared with itself.

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
# What the checks read from each table; the key columns name one row each.
TABLE_COLUMNS = {"table_validity_gate": ("method", "verdict"),
                 "table4_spatial_audit": ("panel", "method", "n", "peak_failure",
                                          "peak_failure_ci_low", "peak_failure_ci_high"),
                 "table_checkpoint_learning": ("checkpoint_id", "learned", "is_primary")}
TABLE_KEYS = {"table_validity_gate": ("method",), "table4_spatial_audit": ("panel", "method"),
              "table_checkpoint_learning": ("checkpoint_id",)}
NUMERIC_COLUMNS = ("n", "peak_failure", "peak_failure_ci_low", "peak_failure_ci_high")
BOOLEAN_COLUMNS = ("learned", "is_primary")


class TableInvalid(ValueError):
    """The comparison cannot be made: a headline table that is not a readable CSV, has no
    rows, lacks a column the checks read, repeats a key, has non-numbers where numbers belong,
    not exactly one primary checkpoint or no panel A; or a folder compared with itself."""


def _read(folder: Path, name: str) -> pd.DataFrame:
    """The table ``name`` of ``folder``, checked (``check_table``); ``FileNotFoundError`` when
    it is missing, ``TableInvalid`` (one line) when it breaks an invariant."""
    path = Path(folder) / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the run did not write its {name} table")
    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError, OSError) as error:
        # ValueError covers UnicodeDecodeError (random bytes)
        detail = " ".join(str(error).split())[:160]
        raise TableInvalid(f"{path} is not a readable CSV table ({type(error).__name__}: {detail})") from None
    problem = check_table(name, table)
    if problem:
        raise TableInvalid(f"{path}: {problem}")
    return table


def _is_boolean(value) -> bool:
    return str(value).strip().lower() in ("true", "false")


def check_table(name: str, table: pd.DataFrame) -> str:
    """What makes ``table`` (headline table ``name``) unfit to compare, in a few words, or ""."""
    missing = [c for c in TABLE_COLUMNS[name] if c not in table.columns]
    if missing:
        return f"no column {', '.join(missing)} (the checks read {', '.join(TABLE_COLUMNS[name])})"
    if table.empty:
        return "no rows"
    keys = list(TABLE_KEYS[name])
    if table[keys].isna().any().any():
        return f"a row without its {'/'.join(keys)}"
    repeated = table[table.duplicated(keys, keep=False)][keys].drop_duplicates()
    if len(repeated):
        first = "/".join(str(v) for v in repeated.iloc[0])
        return f"{len(repeated)} {'/'.join(keys)} repeated (first: {first[:80]})"
    for column in (c for c in NUMERIC_COLUMNS if c in TABLE_COLUMNS[name]):
        present = table[column].dropna()
        if pd.to_numeric(present, errors="coerce").isna().any():
            return f"column {column} holds values that are not numbers"
    for column in (c for c in BOOLEAN_COLUMNS if c in TABLE_COLUMNS[name]):
        if not table[column].map(_is_boolean).all():
            return f"column {column} holds values other than True and False"
    if name == "table_checkpoint_learning":
        primaries = int(table["is_primary"].map(lambda v: str(v).strip().lower() == "true").sum())
        if primaries != 1:
            return f"{primaries} primary checkpoints (is_primary), not exactly one"
    if name == "table4_spatial_audit" and not table.loc[table["panel"] == "A", "n"].notna().any():
        return "no panel A row with its image count n"
    return ""


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
    folder holding the ``HEADLINE_TABLES`` as CSV. ``FileNotFoundError`` for a missing table;
    ``TableInvalid`` for a table that breaks its invariants (``check_table``) and for a folder
    compared with itself (every check would pass whatever it holds)."""
    figures_dir, reference_dir = Path(figures_dir), Path(reference_dir)
    if figures_dir.resolve() == reference_dir.resolve():
        raise TableInvalid(f"{figures_dir} is compared with itself ({reference_dir}): give the "
                           "reference run's folder")
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
    except (FileNotFoundError, TableInvalid) as error:   # 2: not compared; 1 means "differ"
        print(f"verdicts: {error}", file=sys.stderr)
        return 2
    for row in result.itertuples():
        print(f"{'same' if row.ok else 'DIFFERENT':9} {row.check}: {row.detail}")
    return 0 if bool(np.all(result["ok"])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
