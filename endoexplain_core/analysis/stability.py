"""Stability of the headline verdicts: do they hold when a seed is perturbed?

Validity gate, primary selection, Table 4 panel A against the centre baseline and Table 5's
signs, each rerun under a perturbed seed from what the run computed; ``stability_table`` (columns
part, subject, verdict, under_perturbation, held) collects them and ``mark_unstable`` marks
the verdicts that did not hold. The gate and Table 4 are read over model draws (the gate's
replicates, ``over_seeds.table4_over_seeds``), never by asking every draw to agree. Method:
docs/statistics_and_gate.md, "Stability of the headline verdicts".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score

from endoexplain_core import marks, presentation
from endoexplain_core.analysis import adjusted_model, over_seeds, stats
from endoexplain_core.methods import CAM_METHODS, method_label
from endoexplain_core.models.training import (PRIMARY_TIE_AUPRC, primary_candidates, tie_break_order,
                                              validation_nll)

SELECTION_HOLDS_AT = 0.90   # share of validation resamples that must pick the same primary
TABLE4_PART = "Table 4 panel A vs centre"


def selection_stability(validation: pd.DataFrame, primary_id: str, *, replicates: int,
                        seed: int, tie_auprc: float) -> dict:
    """How often a resampled validation set selects the same primary.

    ``validation``: logits rows of the candidate checkpoints on the validation split (columns
    checkpoint_id, seed, sample_id, target, logit_neg, logit_pos). Images are resampled with
    replacement ``replicates`` times (replicates without both classes are skipped). Returns
    {"primary", "share_same", "runner_up", "replicates_used", "tied_share"}; ``tied_share``: the
    share of resamples in which more than one checkpoint was within ``tie_auprc`` of the best, so
    that the tie rule (lowest validation NLL on the resample, then lowest seed), not a higher
    AUPRC, made the pick.
    """
    wide = validation.assign(z=validation["logit_pos"] - validation["logit_neg"]).pivot(
        index="sample_id", columns="checkpoint_id", values="z")
    targets = validation.groupby("sample_id")["target"].first().reindex(wide.index).to_numpy()
    seeds = validation.groupby("checkpoint_id")["seed"].first()
    order = sorted(wide.columns, key=lambda c: int(seeds[c]))
    scores = wide[order].to_numpy()
    picks, tied = [], 0
    for rows in stats.bootstrap_indices(len(targets), replicates, seed):
        sample_targets = targets[rows]
        if sample_targets.min() == sample_targets.max():
            continue
        auprc = np.array([average_precision_score(sample_targets, scores[rows, j]) for j in range(len(order))])
        # select_primary's rule: within tie_auprc of the best is a tie, broken by the lowest
        # validation NLL, then the lowest seed
        within = np.flatnonzero(auprc >= auprc.max() - tie_auprc)
        tied += len(within) > 1
        candidates = pd.DataFrame({"position": within, "seed": [int(seeds[order[j]]) for j in within],
                                   "val_nll": [validation_nll(scores[rows, j], sample_targets) for j in within]})
        picks.append(order[int(tie_break_order(candidates).iloc[0]["position"])])
    counts = pd.Series(picks).value_counts()
    others = counts.drop(primary_id, errors="ignore")
    return {"primary": primary_id, "share_same": float(counts.get(primary_id, 0) / len(picks)),
            "runner_up": str(others.index[0]) if len(others) else "", "replicates_used": len(picks),
            "tied_share": float(tied / len(picks))}


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


def table4_stability_rows(over: pd.DataFrame | None) -> list[dict]:
    """The "Table 4 panel A vs centre" rows of ``stability_table``, one per CAM, read from
    ``over_seeds.table4_over_seeds`` (None: no over-seeds table, every row "not estimable").

    verdict: the over-seeds ``versus_centre`` ("above centre" / "below centre" /
    "inconclusive" / "not estimable"). held, for a decided verdict, says whether it holds for
    one new seed: a verdict read from the paired t interval holds when the 80% prediction
    interval of one new seed's difference from the centre lies on the verdict's side of 0; one
    read from the share of seeds below the centre (a bimodal method) holds when the probability
    that one new seed lands on the verdict's side, (x + 1) / (k + 2) for x of k seeds there
    (Laplace's rule of succession, the predictive probability under a uniform prior), reaches
    ``over_seeds.ONE_NEW_SEED_LEVEL``. NaN for "inconclusive" and "not estimable". No seed has to
    agree with another: a seed on the other side is part of the spread."""
    rows = []
    by_method = over.set_index("method") if over is not None else None
    for method in CAM_METHODS:
        if by_method is None or method not in by_method.index:
            rows.append({"part": TABLE4_PART, "subject": method, "verdict": "not estimable",
                         "under_perturbation": "no table over seeds", "held": np.nan})
            continue
        row = by_method.loc[method]
        verdict = str(row["versus_centre"])
        k = int(row["n_paired"])
        text = (f"over {k} seeds: difference from centre "
                f"{presentation.estimate_with_ci(row['difference_from_centre'], row['difference_ci_low'], row['difference_ci_high'], 2, missing='n/a')}; "
                f"one new seed (80%): {presentation.number_text(row['one_new_seed_difference_low'], 2, missing='n/a')} to "
                f"{presentation.number_text(row['one_new_seed_difference_high'], 2, missing='n/a')}; "
                f"{int(row['n_below_centre'])} of {k} seeds below centre")
        held = np.nan
        if verdict in ("above centre", "below centre"):
            if "share" in str(row["versus_centre_rule"]):
                on_side = int(row["n_below_centre"]) if verdict == "below centre" else k - int(row["n_below_centre"])
                held = bool((on_side + 1) / (k + 2) >= over_seeds.ONE_NEW_SEED_LEVEL)
            elif verdict == "above centre":
                held = bool(row["one_new_seed_difference_low"] > 0)
            else:
                held = bool(row["one_new_seed_difference_high"] < 0)
        rows.append({"part": TABLE4_PART, "subject": method, "verdict": verdict,
                     "under_perturbation": text, "held": held})
    return rows


def _tie_text(tied_share: float) -> str:
    """What a pick by the tie rule means: selection by seed order, not a better model."""
    if not tied_share:
        return ""
    return (f"; in {tied_share:.0%} of them several checkpoints tied within the tie margin and the "
            "lowest seed won: a pick by the tie rule, not evidence of a better model")


def stability_table(*, gate_stability: pd.DataFrame | None, selection: dict,
                    table4_over_seeds: pd.DataFrame | None, table5: dict[str, dict[str, str]],
                    primary_id: str) -> pd.DataFrame:
    """One row per headline verdict: part, subject, verdict (this run), under_perturbation (what
    the perturbed reruns said) and held (bool; NaN when nothing could be rerun).

    Gate rows: 03's ``gate_stability``. Table 4 rows: ``table4_stability_rows`` of
    ``table4_over_seeds`` (verdicts over seeds, not the primary's point estimate). ``table5``:
    checkpoint id -> ``table5_signs``, the primary's included. A perturbed rerun that cannot
    judge ("not estimable") neither confirms nor breaks a Table 5 verdict; a primary verdict
    that is itself not estimable is never counted as held.
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
                                        f"validation resamples (runner-up {selection['runner_up'] or 'none'})"
                                        + _tie_text(selection.get("tied_share", 0.0))),
                 "held": share >= SELECTION_HOLDS_AT})
    rows += table4_stability_rows(table4_over_seeds)
    others = [c for c in table5 if c != primary_id]
    undecided = "not estimable"
    for method in CAM_METHODS:
        if method not in table5.get(primary_id, {}):
            continue
        verdict = table5[primary_id][method]
        perturbed = {c: table5[c][method] for c in others}
        decided = [v for v in perturbed.values() if v != undecided]
        held = (np.nan if verdict == undecided or not decided
                else all(v == verdict for v in decided))
        rows.append({"part": "Table 5 term vs Grad-CAM", "subject": method, "verdict": verdict,
                     "under_perturbation": "; ".join(f"{c}: {v}" for c, v in perturbed.items())
                     or "no other learned seed",
                     "held": held})
    table = pd.DataFrame(rows)
    table.insert(2, "label", [method_label(s) if s in CAM_METHODS else s for s in table["subject"]])
    return table


def headline_stability(*, tables: pd.DataFrame, registry: pd.DataFrame, learning: pd.DataFrame,
                       logits: pd.DataFrame, gate_stability: pd.DataFrame | None,
                       primary_id: str, score_threshold: float, selection_replicates: int,
                       seed: int, table4_over_seeds: pd.DataFrame | None = None) -> pd.DataFrame:
    """``stability_table`` from a run's artefacts.

    ``tables``: audit rows of every checkpoint (``audit.read_audits``); ``registry``: the
    checkpoint registry; ``learning``: ``learning.learning_table``; ``logits``: the logits
    table of 01 (validation rows are used); ``gate_stability``: 03's replicate table (None
    when the gate did not run); ``table4_over_seeds``: ``over_seeds.table4_over_seeds`` of
    this run (None: built here from ``tables`` over the learned seeds of the primary's
    architecture). The perturbed seeds of Table 5 are the other learned, non-control
    checkpoints of the primary's architecture; it is refitted for its signs only (point
    estimates; 20 cluster replicates, whose CIs are not read).
    """
    by_id = registry.set_index("checkpoint_id")
    arch = by_id.loc[primary_id, "arch"]
    same_recipe = [c for c in registry["checkpoint_id"]
                   if by_id.loc[c, "arch"] == arch and by_id.loc[c, "control"] == "none"]
    learned = set(learning.loc[learning["learned"].astype(bool), "checkpoint_id"])
    compared = [c for c in same_recipe if c == primary_id or c in learned]
    signs = {}
    for checkpoint in compared:
        table = tables[tables["checkpoint_id"] == checkpoint]
        signs[checkpoint] = table5_signs(table, score_threshold, replicates=20, seed=seed)
    if table4_over_seeds is None:
        seeds = over_seeds.primary_architecture_seeds(learning, primary_id)
        table4_over_seeds = over_seeds.table4_over_seeds(
            over_seeds.table4_per_seed(tables, seeds, score_threshold, primary_id))
    # the candidates select_primary chose from (learned by validation alone, if any were)
    candidates = primary_candidates(registry)["checkpoint_id"]
    validation = logits[(logits["role"] == "val") & logits["checkpoint_id"].isin(list(candidates))]
    selection = selection_stability(validation, primary_id, replicates=selection_replicates, seed=seed,
                                    tie_auprc=PRIMARY_TIE_AUPRC)
    return stability_table(gate_stability=gate_stability, selection=selection,
                           table4_over_seeds=table4_over_seeds, table5=signs, primary_id=primary_id)


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
