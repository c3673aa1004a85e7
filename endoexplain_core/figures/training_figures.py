"""Figure S1: training loss and validation AUPRC per epoch for every checkpoint of the matrix.

Input: ``<run_dir>/checkpoints/training_curves.csv`` (01_training: checkpoint_id, arch, seed,
control, epoch, train_loss, val_auprc).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from endoexplain_core.figures import style
from endoexplain_core.models.training import CONTROL_NONE


def plot_training_curves(curves: pd.DataFrame):
    """Figure: training loss and validation AUPRC per epoch, one panel pair, one line per run.

    Colour = architecture, line style = seed; the shuffled-label control is drawn in black.
    Returns the Matplotlib figure.
    """
    colours = {"efficientnet_b0": "#1b9e77", "resnet34": "#d95f02", "convnext_tiny": "#7570b3"}
    dashes = ["-", "--", ":"]
    fig, (loss_ax, auprc_ax) = plt.subplots(1, 2, figsize=(8.4, 2.8))
    seeds = sorted(curves.loc[curves["control"] == CONTROL_NONE, "seed"].unique())
    for checkpoint, run in curves.groupby("checkpoint_id", sort=False):
        control = run["control"].iloc[0] != CONTROL_NONE
        arch, seed = run["arch"].iloc[0], run["seed"].iloc[0]
        label = (f"{style.ARCH_LABELS.get(arch, arch)} shuffled labels" if control
                 else f"{style.ARCH_LABELS.get(arch, arch)} s{seed}")
        line = {"color": "black" if control else colours.get(arch, "grey"),
                "linestyle": "-." if control else dashes[seeds.index(seed) % len(dashes)],
                "marker": "o", "markersize": 2.5, "linewidth": 1.0, "label": label}
        loss_ax.plot(run["epoch"], run["train_loss"], **line)
        auprc_ax.plot(run["epoch"], run["val_auprc"], **line)
    loss_ax.set(xlabel="Epoch", ylabel="Training loss (label-smoothed CE)")
    auprc_ax.set(xlabel="Epoch", ylabel="Validation AUPRC", ylim=(0, 1.02))
    for ax in (loss_ax, auprc_ax):
        ax.set_xticks(sorted(curves["epoch"].unique()))
    auprc_ax.legend(frameon=False, fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    return fig
