"""The marks a table or figure of the record can carry, and the footnote each one needs.

One owner for every mark: a table whose cells carry a mark carries its footnote wherever it
goes (``notes_for``, used by ``artefacts.save_table`` for every saved table), so no reader meets
a dagger without its meaning.

  †  a CAM method the planted-truth validity gate does not validate (03_validity_gate)
  ‡  a verdict that did not hold under a perturbed seed (05_robustness)
  §  a CAM method whose maps on this checkpoint are degenerate (04_spatial_audit)
  *  Eigen-CAM, which is class-agnostic
  "not estimable"  an odds ratio or gap whose estimate or interval is unbounded
  synthetic  the run used the embedded synthetic cohort, not patient data
"""

from __future__ import annotations

import pandas as pd

NOT_VALIDATED_MARK = "\u2020"   # dagger
UNSTABLE_MARK = "\u2021"        # double dagger
DEGENERATE_MARK = "\u00a7"      # section sign
CLASS_AGNOSTIC_LABEL = "Eigen-CAM*"

GATE_FOOTNOTE = (f"{NOT_VALIDATED_MARK} not validated by the planted-truth gate at this architecture, "
                 "layer and input size (table_validity_gate: fails, or inconclusive because the interval over "
                 "model draws of a trained model's or a control's rate straddles its bar, or too few "
                 "gate replicates learned; its reason column says which): its peaks are not shown to find planted evidence, so its failure "
                 "rates say nothing about lesion localisation.")
UNSTABLE_FOOTNOTE = (f"{UNSTABLE_MARK} unstable: this verdict did not hold under a perturbed seed "
                     "(table_verdict_stability), so it is not a finding either way.")
DEGENERATE_FOOTNOTE = (f"{DEGENERATE_MARK} degenerate maps on this checkpoint (table_map_degeneracy: "
                       "peaks piled on the feature grid's border ring, tied maxima on most maps, or maps "
                       "anti-correlated with Grad-CAM's class evidence; its why column says which): its "
                       "rates are not read as localisation, whatever the validity gate's verdict.")
EIGEN_FOOTNOTE = "* Eigen-CAM is class-agnostic (no target class)."
NOT_ESTIMABLE_NOTE = ("not estimable: the maximum-likelihood estimate is infinite (separation), "
                      "or a bound of the image-cluster bootstrap interval is 0 or infinite; the "
                      "Firth column of Table 5 gives a finite penalised estimate.")
SYNTHETIC_FOOTER = "Synthetic cohort: generated frames, not patient data."


def notes_for(table: pd.DataFrame, synthetic: bool) -> list[str]:
    """The footnotes ``table`` needs, read from its header and cells, in a fixed order: the
    gate's dagger, the instability mark, the degenerate-maps mark, Eigen-CAM's asterisk, "not
    estimable", and the synthetic cohort (when ``synthetic``)."""
    cells = " ".join(str(v) for column in table.columns for v in [column, *table[column].tolist()])
    notes = []
    if NOT_VALIDATED_MARK in cells:
        notes.append(GATE_FOOTNOTE)
    if UNSTABLE_MARK in cells:
        notes.append(UNSTABLE_FOOTNOTE)
    if DEGENERATE_MARK in cells:
        notes.append(DEGENERATE_FOOTNOTE)
    if CLASS_AGNOSTIC_LABEL in cells:
        notes.append(EIGEN_FOOTNOTE)
    if "not estimable" in cells:
        notes.append(NOT_ESTIMABLE_NOTE)
    if synthetic:
        notes.append(SYNTHETIC_FOOTER)
    return notes
