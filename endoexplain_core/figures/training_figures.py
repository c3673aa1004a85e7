"""Figure S1: training loss and validation AUPRC per epoch for every checkpoint of the matrix.

Input: ``<run_dir>/checkpoints/training_curves.csv`` (01_training: checkpoint_id, arch, seed,
control, epoch, train_loss, val_auprc). Method: docs/maps_and_scores.md, "Figures".
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from endoexplain_core.figures import style
from endoexplain_core.models.training import CONTROL_NONE
from endoexplain_core import artefacts


DODGE = 0.12   # largest sideways shift of a run, in epochs


@artefacts.computed_by
def plot_training_curves(curves: pd.DataFrame, primary_id: str | None = None):
    """Figure: training loss (A) and validation AUPRC (B) per epoch, one line per run: architecture
    by grey level and marker, seed by line style, the shuffled-label control in the random
    reference's colour; ``primary_id`` (the validation-selected checkpoint) drawn thicker and
    starred at its best validation AUPRC. Returns the Matplotlib figure."""
    dashes = ["-", "--", ":"]
    fig, (loss_ax, auprc_ax) = plt.subplots(1, 2, figsize=(style.DOUBLE_COLUMN_INCHES - 1.0, 3.0),
                                            layout="constrained")
    seeds = sorted(curves.loc[curves["control"] == CONTROL_NONE, "seed"].unique())
    runs = list(curves.groupby("checkpoint_id", sort=False))
    for index, (checkpoint, run) in enumerate(runs):
        shift = DODGE * (index / max(len(runs) - 1, 1) - 0.5) * 2
        control = run["control"].iloc[0] != CONTROL_NONE
        arch, seed = run["arch"].iloc[0], run["seed"].iloc[0]
        label = (f"{style.ARCH_LABELS.get(arch, arch)} shuffled labels" if control
                 else f"{style.ARCH_LABELS.get(arch, arch)} s{seed}")
        primary = checkpoint == primary_id
        line = {"color": style.RANDOM_REFERENCE["color"] if control else style.ARCH_COLOURS.get(arch, "grey"),
                "linestyle": "none" if len(run) == 1 else ("-." if control else dashes[seeds.index(seed) % len(dashes)]),
                "marker": "x" if control else style.ARCH_MARKERS.get(arch, "o"), "markersize": 2.5, "linewidth": 2.2 if primary else 1.0,
                "label": label + (" (primary)" if primary else ""), "clip_on": False,
                "zorder": 3 if primary else 2}
        loss_ax.plot(run["epoch"] + shift, run["train_loss"], **line)
        auprc_ax.plot(run["epoch"] + shift, run["val_auprc"], **line)
        if primary:
            best = run.loc[run["val_auprc"].idxmax()]
            auprc_ax.plot(best["epoch"] + shift, best["val_auprc"], marker="*", markersize=11,
                          color=line["color"], markeredgecolor="black", linestyle="none",
                          clip_on=False, zorder=4, label="Primary: best validation epoch")
    loss_ax.set(xlabel="Epoch", ylabel="Training loss (label-smoothed CE)")
    style.panel_title(loss_ax, "A", "Training loss")
    style.panel_title(auprc_ax, "B", "Validation AUPRC")
    auprc_ax.set(xlabel="Epoch", ylabel="Validation AUPRC", ylim=(0, 1.03))
    for ax in (loss_ax, auprc_ax):
        ax.set_xticks(sorted(curves["epoch"].unique()))
    auprc_ax.legend(frameon=False, fontsize=6.5, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return fig
