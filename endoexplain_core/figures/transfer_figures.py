"""Figure 5: frozen transfer of the primary checkpoint to the external polyp cohorts.

Input: the per-cohort summary of ``analysis.transfer.transfer_summary`` (dataset, method,
n_cases, n_eligible, mean_iou, ci_low, ci_high, centre_baseline_iou).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

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
            "CIs; hatched bar: centre baseline). " + "; ".join(parts) + ".")


def figure5_transfer(summary: pd.DataFrame, *, score_threshold: float,
                     methods: tuple[str, ...] = style.CAM_METHODS):
    """Grouped bars: mean top-20% IoU per CAM and cohort with 95% CIs, and the cohort's centre
    baseline as the last, hatched bar of each group (with its CI), so no reference line
    crosses the CAM bars; n cases and eligible counts under each cohort."""
    datasets = list(dict.fromkeys(summary["dataset"]))
    has_centre = "centre" in set(summary["method"])
    drawn = (*methods, "centre") if has_centre else tuple(methods)
    width = 0.84 / len(drawn)
    fig, ax = plt.subplots(figsize=(2.3 + 1.7 * len(datasets), 3.4), layout="constrained")
    for offset, method in enumerate(drawn):
        part = summary[summary["method"] == method].set_index("dataset").reindex(datasets)
        x = np.arange(len(datasets)) - 0.42 + width * (offset + 0.5)
        errors = np.vstack([part["mean_iou"] - part["ci_low"], part["ci_high"] - part["mean_iou"]])
        centre = method == "centre"
        ax.bar(x, part["mean_iou"], width=width * 0.92,
               color="white" if centre else style.METHOD_COLOURS[method],
               edgecolor="black" if centre else "none", hatch="////" if centre else None,
               linewidth=0.6, label=style.method_label(method), yerr=errors, capsize=1.5,
               error_kw={"elinewidth": 0.7, "capthick": 0.7})
    if not has_centre:   # older summaries: the centre mean only, drawn beside the group
        for position, dataset in enumerate(datasets):
            value = summary.loc[summary["dataset"] == dataset, "centre_baseline_iou"].iloc[0]
            ax.plot([position + 0.45], [value], marker="_", markersize=12, color="black")
    counts = summary.drop_duplicates("dataset").set_index("dataset")
    ax.set_xticks(np.arange(len(datasets)))
    ax.set_xticklabels([f"{DATASET_LABELS.get(d, d)}\nn = {counts.loc[d, 'n_cases']:,}; "
                        f"{counts.loc[d, 'n_eligible']:,} at \u2265 {score_threshold:.2f}"
                        for d in datasets])
    ax.set_ylabel("Mean top-20% CAM\u2013mask IoU (95% CI)")
    ax.set_ylim(0, max(0.05, float(np.nanmax(summary["ci_high"].to_numpy())) * 1.12))
    ax.legend(frameon=False, fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.supxlabel(style.EIGEN_FOOTNOTE + " Hatched: centre baseline (model-free). Eligible: "
                  f"temperature-scaled score \u2265 {score_threshold:.2f}. No negatives in these "
                  "cohorts.", fontsize=7, x=0.01, ha="left")
    return fig
