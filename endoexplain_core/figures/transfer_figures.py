"""Figure 5: frozen transfer of the primary checkpoint to the external polyp cohorts.

Input: the per-cohort summary of ``analysis.transfer.transfer_summary`` (dataset, method,
n_cases, n_eligible, mean_iou, ci_low, ci_high, centre_baseline_iou).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from endoexplain_core.data.cohorts import DATASET_LABELS
from endoexplain_core.figures import style


def figure5_caption(summary: pd.DataFrame, *, score_threshold: float) -> str:
    """One-line caption computed from the summary: per cohort n, eligible count, CAM IoU range
    and the centre-baseline mean."""
    parts = []
    for dataset, part in summary.groupby("dataset", sort=False):
        cams = part[part["method"].isin(style.CAM_METHODS)]["mean_iou"]
        parts.append(f"{DATASET_LABELS.get(dataset, dataset)}: n = {part['n_cases'].iloc[0]}, "
                     f"{part['n_eligible'].iloc[0]} at scaled score ≥ {score_threshold:.2f}, "
                     f"CAM mean IoU {cams.min():.3f}–{cams.max():.3f}, centre baseline "
                     f"{part['centre_baseline_iou'].iloc[0]:.3f}")
    return ("Figure 5. Mean top-20% IoU over all masked cases per cohort (95% image-bootstrap "
            "CIs; dashed: centre baseline). " + "; ".join(parts) + ".")


def figure5_transfer(summary: pd.DataFrame, *, score_threshold: float,
                     methods: tuple[str, ...] = style.CAM_METHODS):
    """Grouped bars: mean top-20% IoU per CAM and cohort with 95% CIs; a dashed segment per
    cohort at its centre-baseline mean; n cases and eligible counts under each cohort."""
    datasets = list(dict.fromkeys(summary["dataset"]))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(1.9 + 1.6 * len(datasets), 3.2))
    for offset, method in enumerate(methods):
        part = summary[summary["method"] == method].set_index("dataset").reindex(datasets)
        x = np.arange(len(datasets)) - 0.4 + width * (offset + 0.5)
        errors = np.vstack([part["mean_iou"] - part["ci_low"], part["ci_high"] - part["mean_iou"]])
        ax.bar(x, part["mean_iou"], width=width * 0.92, color=style.METHOD_COLOURS[method],
               label=style.method_label(method), yerr=errors, capsize=1.5,
               error_kw={"elinewidth": 0.7, "capthick": 0.7})
    for position, dataset in enumerate(datasets):
        centre = summary.loc[summary["dataset"] == dataset, "centre_baseline_iou"].iloc[0]
        ax.hlines(centre, position - 0.42, position + 0.42, colors="black", linestyles="--",
                  linewidth=1.0)
    counts = summary.drop_duplicates("dataset").set_index("dataset")
    ax.set_xticks(np.arange(len(datasets)))
    ax.set_xticklabels([f"{DATASET_LABELS.get(d, d)}\nn = {counts.loc[d, 'n_cases']}; "
                        f"{counts.loc[d, 'n_eligible']} at ≥ {score_threshold:.2f}"
                        for d in datasets])
    ax.set_ylabel("Mean top-20% CAM–mask IoU (95% CI)")
    ax.set_ylim(0, max(0.05, float(np.nanmax(summary["ci_high"].to_numpy())) * 1.15))
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=1.0))
    labels.append(style.method_label("centre") + " (mean)")
    ax.legend(handles, labels, frameon=False, fontsize=7, ncol=1, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    fig.text(0.01, -0.02, style.EIGEN_FOOTNOTE + " Eligible: temperature-scaled score ≥ "
             f"{score_threshold:.2f}. No negatives in these cohorts.", fontsize=7, ha="left",
             va="top")
    fig.tight_layout()
    return fig
