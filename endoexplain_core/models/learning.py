"""Whether a checkpoint learned: the rule that keeps an unlearned checkpoint's maps out of the
robustness and subgroup analyses (they are audited, listed and marked, never pooled).

A checkpoint learned when its validation AUPRC is at least halfway from the validation
prevalence (what a score without information reaches) to a perfect 1.
"""

from __future__ import annotations

import pandas as pd

LEARNING_RULE = ("a checkpoint learned when its validation AUPRC is at least halfway from the "
                 "validation prevalence (an uninformative score) to 1: AUPRC >= prevalence + "
                 "0.5 x (1 - prevalence)")


def learning_status(val_auprc, prevalence: float) -> pd.Series:
    """bool per checkpoint: validation AUPRC >= prevalence + 0.5 * (1 - prevalence).

    The AUPRC of a score that carries no information equals the positive prevalence; halfway
    to a perfect 1 is far outside the spread of an uninformative score on the validation split
    (the shuffled-label control lands near the prevalence) and still well below what a trained
    detector reaches. ``prevalence`` in (0, 1).
    """
    if not 0 < prevalence < 1:
        raise ValueError(f"validation prevalence must be in (0, 1); got {prevalence}")
    values = pd.Series(val_auprc, dtype=float)
    return values >= prevalence + 0.5 * (1.0 - prevalence)


def learning_table(registry: pd.DataFrame, manifest: pd.DataFrame) -> pd.DataFrame:
    """Registry rows with ``val_prevalence``, ``learning_threshold`` and ``learned`` added.

    ``registry``: checkpoints/registry.csv (checkpoint_id, arch, seed, control, val_auprc);
    ``manifest``: the run's manifest (prevalence from its ``val`` rows).
    """
    val = manifest[manifest["role"] == "val"]
    if val.empty:
        raise ValueError("the manifest has no validation rows: cannot judge learning")
    prevalence = float(val["target"].mean())
    table = registry[["checkpoint_id", "arch", "seed", "control", "val_auprc"]].copy()
    table["val_prevalence"] = prevalence
    table["learning_threshold"] = prevalence + 0.5 * (1.0 - prevalence)
    table["learned"] = learning_status(table["val_auprc"].to_numpy(), prevalence).to_numpy()
    return table


def other_checkpoints_to_audit(learning: pd.DataFrame, primary_id: str, audit_unlearned: bool) -> list[str]:
    """Checkpoint ids (registry order) that 05 audits besides the primary (whose audit is
    04's): every one with ``audit_unlearned``, else those that learned and the controls, which
    are audited whatever they scored. ``learning``: ``learning_table``."""
    chosen = audit_unlearned | learning["learned"].astype(bool) | (learning["control"] != "none")
    return [c for c in learning.loc[chosen, "checkpoint_id"] if c != primary_id]
