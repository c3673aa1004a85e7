"""The validity gate on one screen: per method its verdict and one plain sentence saying why,
read from the gate's tables (``validity_gate.gate_table``, ``gate_clause_table``,
``gate_replicate_table``). Used by the run record and ``summary.md``.
Method: docs/statistics_and_gate.md, "Validity gate".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from endoexplain_core.methods import method_label

# What each clause's model must do, in a reader's words (the clause's ``model`` / ``target``).
_WHAT = {("lesion", "lesion"): "the lesion model's peaks in the polyp",
         ("shortcut", "cue"): "the shortcut model's peaks on the cue",
         ("untrained", "lesion"): "the untrained networks' peaks in the polyp",
         ("untrained", "cue"): "the untrained networks' peaks on the cue",
         ("shuffled", "lesion"): "the shuffled-label control's peaks in the polyp",
         ("shuffled", "cue"): "the shuffled-label control's peaks on the cue"}


def _interval(low: float, high: float) -> str:
    return f"95% CI {low:.2f}-{high:.2f}" if np.isfinite(low) and np.isfinite(high) else "no interval"


def _clause_text(clause) -> str:
    """"the lesion model's peaks in the polyp 0.31 (95% CI 0.12-0.50; 2 of 3 draws reach
    the bar 0.38)"."""
    what = _WHAT.get((clause.model, clause.target), clause.clause)
    side = "stay under" if clause.side == "<" else "reach"
    return (f"{what} {clause.rate:.2f} ({_interval(clause.ci_low, clause.ci_high)}; "
            f"{int(clause.draws_right_side)} of {int(clause.replicates_used)} draws {side} the bar "
            f"{clause.bar:.2f})")


def gate_sentence(row: pd.Series, clauses: pd.DataFrame) -> str:
    """One plain sentence on why ``row`` (a ``gate_table`` row) got its verdict, from its
    clauses (``gate_clause_table`` rows of the same method): the clause that failed it (with how
    far its bound lies from the bar), the clauses left open, or what a pass rests on. A verdict
    the clauses cannot explain (no usable replicate, one replicate) repeats the table's reason."""
    of_method = clauses[clauses["method"] == row["method"]]
    verdict = row["verdict"]
    failing = of_method[of_method["decides"] == "fail side"]
    open_ = of_method[of_method["decides"] == "open"]
    if verdict == "fails" and len(failing):
        first = failing.iloc[0]
        bound = first.strict_low if first.side == "<" else first.strict_high
        gap = abs(bound - first.bar)
        wrong = "clears" if first.side == "<" else "falls short of"
        return (f"fails: {_clause_text(first)}: even the Bonferroni-corrected bound {bound:.2f} "
                f"{wrong} the bar by {gap:.2f}.")
    if verdict == "inconclusive" and len(open_) and int(row.get("replicates_used", 0)) >= 2:
        first = open_.iloc[0]
        more = f" (and {len(open_) - 1} more test{'s' * (len(open_) > 2)})" if len(open_) > 1 else ""
        return f"inconclusive: {_clause_text(first)} straddles its bar{more}."
    if verdict == "passes":
        trained = of_method[of_method["side"] == ">="]
        return ("passes: " + " and ".join(_clause_text(c) for c in trained.itertuples())
                + "; every control stays under its bar.")
    return f"{verdict}: {row['reason']}"


def gate_overview(gate: pd.DataFrame, clauses: pd.DataFrame,
                  replicates: pd.DataFrame | None = None) -> pd.DataFrame:
    """The gate on one screen, one row per method: ``map`` (display label), ``verdict``,
    ``why`` (``gate_sentence``), ``lesion model per draw`` and ``shortcut model per draw``
    (each used replicate's rate, "/"-separated; an excluded replicate marked), and
    ``ceiling lesion / cue`` (the resolution ceiling: share of frames whose CAM-grid node
    nearest the region's centroid lies inside it)."""
    per_draw = {}
    if replicates is not None:
        for method, rows in replicates.groupby("method", sort=False):
            marks = ["" if str(ok).lower() == "true" else " (excluded)" for ok in rows["models_ok"]]
            per_draw[method] = (" / ".join(f"{v:.2f}{m}" for v, m in zip(rows["lesion_rate"], marks)),
                                " / ".join(f"{v:.2f}{m}" for v, m in zip(rows["cue_rate"], marks)))
    return pd.DataFrame({
        "map": [method_label(m) for m in gate["method"]],
        "verdict": gate["verdict"].tolist(),
        "why": [gate_sentence(row, clauses) for _, row in gate.iterrows()],
        "lesion model per draw": [per_draw.get(m, ("", ""))[0] for m in gate["method"]],
        "shortcut model per draw": [per_draw.get(m, ("", ""))[1] for m in gate["method"]],
        "ceiling lesion / cue": [f"{lo:.2f} / {cu:.2f}" if np.isfinite(lo) and np.isfinite(cu) else ""
                                 for lo, cu in zip(gate["lesion_ceiling"], gate["cue_ceiling"])],
    })


def contradictions(gate: pd.DataFrame, stability: pd.DataFrame | None = None) -> list[str]:
    """Fields of the gate's tables that contradict each other (empty: none): ``passes`` must be
    ``verdict == "passes"``; a "passes" row's reason is "passes" and a "fails" or
    "inconclusive" row's is not; the stability table's verdict is the gate's."""
    problems = []
    for row in gate.itertuples():
        passes = str(row.passes).lower() == "true"
        if passes != (row.verdict == "passes"):
            problems.append(f"{row.method}: passes={row.passes} but verdict {row.verdict}")
        if (row.verdict == "passes") != (str(row.reason) == "passes"):
            problems.append(f"{row.method}: verdict {row.verdict} but reason {str(row.reason)[:60]!r}")
    if stability is not None:
        said = dict(zip(stability["method"], stability["verdict"]))
        problems += [f"{m}: stability says {said[m]}, gate says {v}"
                     for m, v in zip(gate["method"], gate["verdict"]) if m in said and said[m] != v]
    return problems
