"""Stability of the headline verdicts: do they hold when a seed is perturbed?

Validity gate, primary selection, Table 4 panel A against the centre baseline and Table 5's
signs, each rerun under a perturbed seed from what the run computed; ``stability_table`` (columns
part, subject, verdict, under_perturbation, held) collects them and ``mark_unstable`` marks
the verdicts that did not hold. Method: docs/statistics_and_gate.md, "Stability of the
headline verdicts".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score

from endoexplain_core import marks
from endoexplain_core.analysis import adjusted_model, stats, summaries
from endoexplain_core.methods import CAM_METHODS, method_label
from endoexplain_core.models.training import PRIMARY_TIE_AUPRC, primary_candidates

SELECTION_HOLDS_AT = 0.90   # share of validation resamples that must pick the same primary


def selection_stability(validation: pd.DataFrame, primary_id: str, *, replicates: int,
                        seed: int, tie_auprc: float) -> dict:
    """How often a resampled validation set selects the same primary.

    ``validation``: logits rows of the candidate checkpoints on the validation split (columns
    checkpoint_id, seed, sample_id, target, logit_neg, logit_pos). Images are resampled with
    replacement ``replicates`` times (replicates without both classes are skipped). Returns
    {"primary", "share_same", "runner_up", "replicates_used"}.
    """
    wide = validation.assign(z=validation["logit_pos"] - validation["logit_neg"]).pivot(
        index="sample_id", columns="checkpoint_id", values="z")
    targets = validation.groupby("sample_id")["target"].first().reindex(wide.index).to_numpy()
    seeds = validation.groupby("checkpoint_id")["seed"].first()
    order = sorted(wide.columns, key=lambda c: int(seeds[c]))   # ties: lowest seed wins
    scores = wide[order].to_numpy()
    picks = []
    for rows in stats.bootstrap_indices(len(targets), replicates, seed):
        sample_targets = targets[rows]
        if sample_targets.min() == sample_targets.max():
            continue
        auprc = np.array([average_precision_score(sample_targets, scores[rows, j]) for j in range(len(order))])
        # select_primary's rule: within tie_auprc of the best is a tie, the lowest seed wins
        picks.append(order[int(np.flatnonzero(auprc >= auprc.max() - tie_auprc)[0])])
    counts = pd.Series(picks).value_counts()
    others = counts.drop(primary_id, errors="ignore")
    return {"primary": primary_id, "share_same": float(counts.get(primary_id, 0) / len(picks)),
            "runner_up": str(others.index[0]) if len(others) else "", "replicates_used": len(picks)}


def panel_a_against_centre(table: pd.DataFrame, score_threshold: float) -> pd.DataFrame:
    """Per CAM: peak-failure rate on this checkpoint's high-score images beside the centre
    baseline's on the same images, and the verdict "above centre" / "not above centre"
    ("no panel A" when no image reaches the threshold). A constant map counts as a failure."""
    ids = summaries.high_score_ids(table, score_threshold)
    rows = table[table["sample_id"].isin(ids)]
    centre = summaries.failure_rate(rows[rows["method"] == "centre"])
    result = []
    for method in CAM_METHODS:
        rate = summaries.failure_rate(rows[rows["method"] == method])
        verdict = ("no panel A" if not ids or np.isnan(rate) or np.isnan(centre) else
                   "above centre" if rate > centre else "not above centre")
        result.append({"method": method, "n": len(ids), "peak_failure": rate,
                       "centre_peak_failure": centre, "verdict": verdict})
    return pd.DataFrame(result)


def table5_signs(table: pd.DataFrame, score_threshold: float, *, replicates: int,
                 seed: int) -> dict[str, str]:
    """CAM term -> "higher odds" / "lower odds" than Grad-CAM, or "not estimable", from Table 5
    fitted on this checkpoint's high-score images (only the point estimate's sign is read)."""
    fitted, _ = adjusted_model.adjusted_table(adjusted_model.model_frame(table, score_threshold),
                                               replicates=replicates, seed=seed)
    by_term = fitted.set_index("term")
    signs = {}
    for method in CAM_METHODS[1:]:
        term = adjusted_model.TERMS[method]
        odds = by_term.loc[term, "odds_ratio"] if term in by_term.index else np.nan
        estimable = term in by_term.index and bool(by_term.loc[term, "estimable"])
        signs[method] = ("not estimable" if not estimable or not np.isfinite(odds) else
                         "higher odds" if odds > 1 else "lower odds" if odds < 1 else "equal odds")
    return signs


def stability_table(*, gate_stability: pd.DataFrame | None, selection: dict,
                    panel_a: dict[str, pd.DataFrame], table5: dict[str, dict[str, str]],
                    primary_id: str) -> pd.DataFrame:
    """One row per headline verdict: part, subject, verdict (this run), under_perturbation (what
    the perturbed reruns said) and held (bool; NaN when nothing could be rerun).

    ``panel_a`` / ``table5``: checkpoint id -> ``panel_a_against_centre`` / ``table5_signs``,
    the primary's included. A perturbed rerun that cannot judge ("no panel A", "not estimable")
    neither confirms nor breaks a verdict; a primary verdict that is itself not estimable is
    never counted as held.
    """
    rows = []
    if gate_stability is not None:
        for row in gate_stability.itertuples():
            if row.method in CAM_METHODS:
                rows.append({"part": "validity gate", "subject": row.method, "verdict": row.verdict,
                             "under_perturbation": f"one new model draw (80% prediction interval): {row.one_new_draw}",
                             "held": row.held})
    share = selection["share_same"]
    rows.append({"part": "primary selection", "subject": primary_id, "verdict": "selected",
                 "under_perturbation": (f"selected in {share:.0%} of {selection['replicates_used']} "
                                        f"validation resamples (runner-up {selection['runner_up'] or 'none'})"),
                 "held": share >= SELECTION_HOLDS_AT})
    others = [c for c in panel_a if c != primary_id]
    for part, results, undecided in (
            ("Table 4 panel A vs centre", {c: dict(zip(t["method"], t["verdict"])) for c, t in panel_a.items()},
             "no panel A"),
            ("Table 5 term vs Grad-CAM", table5, "not estimable")):
        for method in CAM_METHODS:
            if method not in results[primary_id]:
                continue
            verdict = results[primary_id][method]
            perturbed = {c: results[c][method] for c in others}
            decided = [v for v in perturbed.values() if v != undecided]
            held = (np.nan if verdict == undecided or not decided
                    else all(v == verdict for v in decided))
            rows.append({"part": part, "subject": method, "verdict": verdict,
                         "under_perturbation": "; ".join(f"{c}: {v}" for c, v in perturbed.items())
                         or "no other learned seed",
                         "held": held})
    table = pd.DataFrame(rows)
    table.insert(2, "label", [method_label(s) if s in CAM_METHODS else s for s in table["subject"]])
    return table


def headline_stability(*, tables: pd.DataFrame, registry: pd.DataFrame, learning: pd.DataFrame,
                       logits: pd.DataFrame, gate_stability: pd.DataFrame | None,
                       primary_id: str, score_threshold: float, selection_replicates: int,
                       seed: int) -> pd.DataFrame:
    """``stability_table`` from a run's artefacts.

    ``tables``: audit rows of every checkpoint (``audit.read_audits``); ``registry``: the
    checkpoint registry; ``learning``: ``learning.learning_table``; ``logits``: the logits
    table of 01 (validation rows are used); ``gate_stability``: 03's replicate table (None
    when the gate did not run). The perturbed seeds are the other learned, non-control
    checkpoints of the primary's architecture. Table 5 is refitted for its signs only (point
    estimates; 20 cluster replicates, whose CIs are not read).
    """
    by_id = registry.set_index("checkpoint_id")
    arch = by_id.loc[primary_id, "arch"]
    same_recipe = [c for c in registry["checkpoint_id"]
                   if by_id.loc[c, "arch"] == arch and by_id.loc[c, "control"] == "none"]
    learned = set(learning.loc[learning["learned"].astype(bool), "checkpoint_id"])
    compared = [c for c in same_recipe if c == primary_id or c in learned]
    panel_a, signs = {}, {}
    for checkpoint in compared:
        table = tables[tables["checkpoint_id"] == checkpoint]
        panel_a[checkpoint] = panel_a_against_centre(table, score_threshold)
        signs[checkpoint] = table5_signs(table, score_threshold, replicates=20, seed=seed)
    # the candidates select_primary chose from (learned by validation alone, if any were)
    candidates = primary_candidates(registry)["checkpoint_id"]
    validation = logits[(logits["role"] == "val") & logits["checkpoint_id"].isin(list(candidates))]
    selection = selection_stability(validation, primary_id, replicates=selection_replicates, seed=seed,
                                    tie_auprc=PRIMARY_TIE_AUPRC)
    return stability_table(gate_stability=gate_stability, selection=selection, panel_a=panel_a,
                           table5=signs, primary_id=primary_id)


def read_stability_table(figures_dir) -> pd.DataFrame | None:
    """``table_verdict_stability.csv`` of a run (05_robustness), or None when absent."""
    path = Path(figures_dir) / "table_verdict_stability.csv"
    return pd.read_csv(path) if path.is_file() else None


def unstable_subjects(stability: pd.DataFrame | None, part: str) -> list[str]:
    """Subjects (methods) of ``part`` whose verdict did not hold (``held`` false)."""
    if stability is None:
        return []
    rows = stability[(stability["part"] == part)]
    held = rows["held"].map(lambda v: str(v).lower())
    return rows.loc[held == "false", "subject"].tolist()


def mark_unstable(table: pd.DataFrame, methods) -> pd.DataFrame:
    """Copy of a formatted table with ``marks.UNSTABLE_MARK`` after every text cell that starts with
    the display label of one of ``methods`` (e.g. "HiResCAM" -> "HiResCAM‡")."""
    table = table.copy()
    labels = [method_label(m) for m in methods]
    if not labels:
        return table

    def mark(value):
        if isinstance(value, str):
            for label in labels:
                if value == label or value.startswith(label + "\u2020") or value.startswith(label + " "):
                    return value.replace(label, label + marks.UNSTABLE_MARK, 1)
        return value
    for column in table.columns:
        if pd.api.types.is_object_dtype(table[column]) or pd.api.types.is_string_dtype(table[column]):
            table[column] = table[column].map(mark)
    return table


def describe(table: pd.DataFrame) -> str:
    """How many headline verdicts of ``headline_stability`` held, which did not, how many
    could not be assessed."""
    held = table["held"].map(lambda v: str(v).lower())
    unstable = table.loc[held == "false", "part"] + " " + table.loc[held == "false", "label"]
    return (f"{int((held == 'true').sum())} of {len(table)} headline verdicts held under a perturbed seed; "
            f"unstable: {', '.join(unstable) or 'none'}; not assessable: {int((~held.isin(['true', 'false'])).sum())}.")
