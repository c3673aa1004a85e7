"""Controls of a subgroup gap: is it the image's, the classifier's or the map's?

Per contrast, crude and on the same images as the gap: the pointing chance level, the DoG
conspicuity map (and each method minus it) and the randomised network (and trained minus it),
each one Welch t interval on per-image values (pointing in pp), checkpoints averaged first.
Method: docs/statistics_and_gate.md, "Subgroup controls".
"""

from __future__ import annotations

import pandas as pd

from endoexplain_core.analysis import subgroups

CHANCE, DOG, METHOD_MINUS_DOG = "chance level", "DoG conspicuity map", "method minus DoG"
RANDOMISED, TRAINED_MINUS_RANDOMISED = "randomised network", "trained minus randomised"
TESTED_CONTROLS = (CHANCE, METHOD_MINUS_DOG, TRAINED_MINUS_RANDOMISED)   # in the secondary family


def _row(contrast: str, control: str, outcome: str, method: str, values: pd.DataFrame,
         column: str, scale: float) -> dict:
    sub = values.loc[values["subgroup"] == 1, column].dropna().to_numpy(float) * scale
    ref = values.loc[values["subgroup"] == 0, column].dropna().to_numpy(float) * scale
    return {"contrast": contrast, "control": control, "outcome": outcome,
            "unit": subgroups.OUTCOME_UNITS[outcome], "method": method,
            **subgroups.welch_gap(sub, ref), "n_subgroup": len(sub), "n_reference": len(ref),
            "holm_family": _control_family(contrast, control)}


def _control_family(contrast: str, control: str) -> str:
    """The secondary family for a tested control, except the lesion-size contrast's chance
    level: the pointing game's chance is the lesion share, so small lesions have the lower
    chance by construction; a test that cannot fail spends no Holm slot (descriptive, "")."""
    if control == CHANCE and contrast == subgroups.LESION_SIZE_CONTRAST:
        return ""
    return subgroups.SECONDARY_FAMILY if control in TESTED_CONTROLS else ""


def control_gaps(contrast: str, frame: pd.DataFrame, randomised: pd.DataFrame | None = None
                 ) -> pd.DataFrame:
    """The control rows of one contrast.

    ``frame``: the contrast's long case table (``subgroups.audit_contrasts``: one row per image,
    checkpoint and CAM method with ``cluster``, ``subgroup``, ``energy_lift``,
    ``pointing_hit``, ``pointing_chance`` and ``dog_lift``). ``randomised``: the same outcomes
    of the randomised networks (``dataset``, ``sample_id``, ``checkpoint_id``, ``method``,
    ``energy_lift``, ``pointing_hit``) or None (no randomised-network rows). Columns: contrast,
    control, outcome, unit, method ("" for the chance level, "dog" for the DoG map), gap,
    ci_low, ci_high, p, n_subgroup, n_reference, n_checkpoints, holm_family.
    """
    data = frame.assign(lift_minus_dog=frame["energy_lift"] - frame["dog_lift"])
    columns = ["energy_lift", "pointing_hit", "pointing_chance", "dog_lift", "lift_minus_dog"]
    if randomised is not None:
        data = data.merge(randomised[["dataset", "sample_id", "checkpoint_id", "method",
                                      "energy_lift", "pointing_hit"]],
                          on=["dataset", "sample_id", "checkpoint_id", "method"], how="left",
                          suffixes=("", "_randomised"), validate="one_to_one")
        data["lift_minus_randomised"] = data["energy_lift"] - data["energy_lift_randomised"]
        data["hit_minus_randomised"] = data["pointing_hit"] - data["pointing_hit_randomised"]
        columns += ["energy_lift_randomised", "pointing_hit_randomised", "lift_minus_randomised",
                    "hit_minus_randomised"]
    per_image = subgroups.per_image_means(data, columns)
    any_method = per_image.drop_duplicates("cluster")   # chance and DoG do not depend on the map
    rows = [_row(contrast, CHANCE, "pointing_hit", "", any_method, "pointing_chance", 100.0),
            _row(contrast, DOG, "energy_lift", "dog", any_method, "dog_lift", 1.0)]
    for method, values in per_image.groupby("method", sort=False):
        rows.append(_row(contrast, METHOD_MINUS_DOG, "energy_lift", method, values, "lift_minus_dog", 1.0))
        if randomised is None:
            continue
        for outcome, own, difference, scale in (
                ("energy_lift", "energy_lift_randomised", "lift_minus_randomised", 1.0),
                ("pointing_hit", "pointing_hit_randomised", "hit_minus_randomised", 100.0)):
            rows.append(_row(contrast, RANDOMISED, outcome, method, values, own, scale))
            rows.append(_row(contrast, TRAINED_MINUS_RANDOMISED, outcome, method, values,
                             difference, scale))
    table = pd.DataFrame(rows)
    table["n_checkpoints"] = int(frame["checkpoint_id"].nunique())
    table["interval"] = "Welch t on per-image values"
    return table

