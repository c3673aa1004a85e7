"""Whether a checkpoint learned: the rule that keeps an unlearned checkpoint's maps out of the
robustness and subgroup analyses (they are audited, listed and marked, never pooled).

A checkpoint learned when both hold:

- its validation AUPRC is at least ``MIN_VAL_AUPRC`` (0.95): a converged classifier, not one
  that is merely better than chance;
- on the audited images, every CAM method gives a non-constant map on at least
  ``MIN_NONCONSTANT_SHARE`` (95%) of them: a model whose maps are flat has nothing to point
  with, however well it scores (a barely trained ResNet-34 once scored 0.86 with Grad-CAM
  constant on 90 of 90 images).

The first check is known after training (03 shows it); the second after the audits (05 writes
``table_checkpoint_learning`` with both). A checkpoint that fails the first is not audited
(unless asked for), so it has no map share and stays not learned.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from endoexplain_core.methods import CAM_METHODS

MIN_VAL_AUPRC = 0.95
MIN_NONCONSTANT_SHARE = 0.95
LEARNING_RULE = (f"a checkpoint learned when its validation AUPRC is at least {MIN_VAL_AUPRC:.2f} "
                 f"and every CAM method's map is non-constant on at least "
                 f"{MIN_NONCONSTANT_SHARE:.0%} of its audited images")


def learning_status(val_auprc) -> pd.Series:
    """bool per checkpoint: validation AUPRC >= ``MIN_VAL_AUPRC`` (NaN: False)."""
    values = pd.Series(val_auprc, dtype=float)
    return values >= MIN_VAL_AUPRC


def learning_table(registry: pd.DataFrame, manifest: pd.DataFrame) -> pd.DataFrame:
    """Registry rows (and ``is_primary`` when the registry has it) with the AUPRC check:
    ``val_prevalence`` (an uninformative score's
    AUPRC, for reference), ``min_val_auprc``, ``auprc_ok`` and ``learned`` (= ``auprc_ok``
    until ``with_map_check`` adds the maps).

    ``registry``: checkpoints/registry.csv (checkpoint_id, arch, seed, control, val_auprc);
    ``manifest``: the run's manifest (prevalence from its ``val`` rows).
    """
    val = manifest[manifest["role"] == "val"]
    if val.empty:
        raise ValueError("the manifest has no validation rows: cannot judge learning")
    columns = ["checkpoint_id", "arch", "seed", "control", "val_auprc"]
    table = registry[columns + (["is_primary"] if "is_primary" in registry.columns else [])].copy()
    table["val_prevalence"] = float(val["target"].mean())
    table["min_val_auprc"] = MIN_VAL_AUPRC
    table["auprc_ok"] = learning_status(table["val_auprc"].to_numpy()).to_numpy()
    table["learned"] = table["auprc_ok"]
    return table


def nonconstant_shares(audit_rows: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint: the smallest share, over the CAM methods, of audited images whose map is
    not constant (``nonconstant_share``), the method that sets it (``flattest_method``) and
    the number of audited images (``n_audited``). ``audit_rows``: audit case rows
    (checkpoint_id, sample_id, method, constant_map)."""
    cams = audit_rows[audit_rows["method"].isin(CAM_METHODS)]
    share = (1.0 - cams.groupby(["checkpoint_id", "method"])["constant_map"].mean()).rename("share")
    rows = []
    for checkpoint_id, shares in share.groupby(level="checkpoint_id"):
        flattest = shares.droplevel("checkpoint_id").idxmin()
        rows.append({"checkpoint_id": checkpoint_id, "nonconstant_share": float(shares.min()),
                     "flattest_method": flattest,
                     "n_audited": int(cams.loc[cams["checkpoint_id"] == checkpoint_id, "sample_id"].nunique())})
    return pd.DataFrame(rows, columns=["checkpoint_id", "nonconstant_share", "flattest_method", "n_audited"])


def with_map_check(learning: pd.DataFrame, audit_rows: pd.DataFrame) -> pd.DataFrame:
    """``learning_table`` with the map check: ``nonconstant_share``, ``flattest_method``,
    ``n_audited``, ``maps_ok`` (share >= ``MIN_NONCONSTANT_SHARE``; False when not audited)
    and ``learned`` = ``auprc_ok`` and ``maps_ok``; ``not_learned_because`` says which check
    failed ("" when learned)."""
    table = learning.drop(columns=["nonconstant_share", "flattest_method", "n_audited", "maps_ok",
                                   "not_learned_because"], errors="ignore")
    table = table.merge(nonconstant_shares(audit_rows), on="checkpoint_id", how="left")
    table["maps_ok"] = (table["nonconstant_share"] >= MIN_NONCONSTANT_SHARE).fillna(False).astype(bool)
    table["learned"] = table["auprc_ok"].astype(bool) & table["maps_ok"]
    reasons = []
    for row in table.itertuples():
        failed = []
        if not row.auprc_ok:
            failed.append(f"validation AUPRC {row.val_auprc:.3f} < {MIN_VAL_AUPRC:.2f}")
        if np.isnan(row.nonconstant_share):
            failed.append("not audited")
        elif not row.maps_ok:
            failed.append(f"{row.flattest_method} maps constant on "
                          f"{1 - row.nonconstant_share:.0%} of {int(row.n_audited)} images")
        reasons.append("; ".join(failed))
    table["not_learned_because"] = reasons
    return table


def other_checkpoints_to_audit(learning: pd.DataFrame, primary_id: str, audit_unlearned: bool) -> list[str]:
    """Checkpoint ids (registry order) that 05 audits besides the primary (whose audit is
    04's): every one with ``audit_unlearned``, else those that passed the AUPRC check and the
    controls, which are audited whatever they scored. ``learning``: ``learning_table``."""
    chosen = audit_unlearned | learning["auprc_ok"].astype(bool) | (learning["control"] != "none")
    return [c for c in learning.loc[chosen, "checkpoint_id"] if c != primary_id]
