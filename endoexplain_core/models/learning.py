"""Whether a checkpoint learned: the rule that keeps an unlearned checkpoint's maps out of the
robustness and subgroup analyses (they are audited, listed and marked, never pooled).

Learned = validation AUPRC >= ``MIN_VAL_AUPRC`` (``learning_table``) and Grad-CAM and Eigen-CAM
(``MAP_CHECK_METHODS``) non-constant on at least ``MIN_NONCONSTANT_SHARE`` of the audited
images the checkpoint calls positive (logit difference z >= 0, whatever the temperature;
``with_map_check``); the other CAMs' constant maps are reported, never decide. A positive-class
map of an image the model calls negative may rightly hold no positive evidence anywhere (a
subtle polyp it misses), so only the images it calls positive ask whether it can point. Table
conventions: docs/architecture.md, "Audit validity".

Design: docs/data_models_runs.md, "The learning rule".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from endoexplain_core.methods import CAM_METHODS
from endoexplain_core import artefacts

MIN_VAL_AUPRC = 0.95
MIN_NONCONSTANT_SHARE = 0.95
MAP_CHECK_METHODS = ("gradcam", "eigencam")
LEARNING_RULE = (f"a checkpoint learned when its validation AUPRC is at least {MIN_VAL_AUPRC:.2f} "
                 f"and its Grad-CAM and Eigen-CAM maps are non-constant on at least "
                 f"{MIN_NONCONSTANT_SHARE:.0%} of the audited images it calls positive")


def learning_status(val_auprc) -> pd.Series:
    """bool per checkpoint: validation AUPRC >= ``MIN_VAL_AUPRC`` (NaN: False)."""
    values = pd.Series(val_auprc, dtype=float)
    return values >= MIN_VAL_AUPRC


@artefacts.computed_by
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


SHARE_COLUMNS = ["checkpoint_id", "map_check_share", "nonconstant_share", "flattest_method",
                 "n_audited", "n_called_positive"]


def nonconstant_shares(audit_rows: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint, over the audited images it calls positive (``z`` >= 0; every audited
    image when the rows have no ``z``): the share whose map is not constant for the methods
    that decide (``map_check_share``: the smaller of Grad-CAM's and Eigen-CAM's), the smallest
    share over all five CAMs (``nonconstant_share``) and the method that sets it
    (``flattest_method``); ``n_audited`` (all audited images) and ``n_called_positive``. The
    shares are NaN when no image is called positive. ``audit_rows``: audit case rows
    (checkpoint_id, sample_id, method, constant_map, z)."""
    cams = audit_rows[audit_rows["method"].isin(CAM_METHODS)]
    rows = []
    for checkpoint_id, of_checkpoint in cams.groupby("checkpoint_id", sort=True):
        called = of_checkpoint[of_checkpoint["z"] >= 0] if "z" in of_checkpoint.columns else of_checkpoint
        shares = 1.0 - called.groupby("method")["constant_map"].mean()
        rows.append({"checkpoint_id": checkpoint_id,
                     "map_check_share": float(shares.reindex(list(MAP_CHECK_METHODS)).min()),
                     "nonconstant_share": float(shares.min()) if len(shares) else np.nan,
                     "flattest_method": shares.idxmin() if len(shares) else "",
                     "n_audited": int(of_checkpoint["sample_id"].nunique()),
                     "n_called_positive": int(called["sample_id"].nunique())})
    return pd.DataFrame(rows, columns=SHARE_COLUMNS)


@artefacts.computed_by
def with_map_check(learning: pd.DataFrame, audit_rows: pd.DataFrame) -> pd.DataFrame:
    """``learning_table`` with the map check: the ``nonconstant_shares`` columns, ``maps_ok``
    (``map_check_share`` >= ``MIN_NONCONSTANT_SHARE``; False when not audited) and ``learned``
    = ``auprc_ok`` and ``maps_ok``; ``not_learned_because`` says which check failed ("" when
    learned)."""
    table = learning.drop(columns=SHARE_COLUMNS[1:] + ["maps_ok", "not_learned_because"], errors="ignore")
    table = table.merge(nonconstant_shares(audit_rows), on="checkpoint_id", how="left")
    table["maps_ok"] = (table["map_check_share"] >= MIN_NONCONSTANT_SHARE).fillna(False).astype(bool)
    table["learned"] = table["auprc_ok"].astype(bool) & table["maps_ok"]
    reasons = []
    for row in table.itertuples():
        failed = []
        if not row.auprc_ok:
            failed.append(f"validation AUPRC {row.val_auprc:.3f} < {MIN_VAL_AUPRC:.2f}")
        if pd.isna(row.n_audited):
            failed.append("not audited")
        elif np.isnan(row.map_check_share):
            failed.append(f"calls none of its {int(row.n_audited)} audited images positive")
        elif not row.maps_ok:
            failed.append(f"Grad-CAM or Eigen-CAM maps constant on {1 - row.map_check_share:.0%} of "
                          f"the {int(row.n_called_positive)} audited images it calls positive")
        reasons.append("; ".join(failed))
    table["not_learned_because"] = reasons
    return table


def other_checkpoints_to_audit(learning: pd.DataFrame, primary_id: str, audit_unlearned: bool) -> list[str]:
    """Checkpoint ids (registry order) that 05 audits besides the primary (whose audit is
    04's): every one with ``audit_unlearned``, else those that passed the AUPRC check and the
    controls, which are audited whatever they scored. ``learning``: ``learning_table``."""
    chosen = audit_unlearned | learning["auprc_ok"].astype(bool) | (learning["control"] != "none")
    return [c for c in learning.loc[chosen, "checkpoint_id"] if c != primary_id]


def not_learned_ids(learning: pd.DataFrame) -> list[str]:
    """Sorted ids of the non-control checkpoints that did not learn (``learning_table``)."""
    return sorted(learning.loc[~learning["learned"] & (learning["control"] == "none"), "checkpoint_id"])
