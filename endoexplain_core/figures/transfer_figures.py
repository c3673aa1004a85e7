"""Figure 5: frozen transfer of the primary checkpoint to the external polyp cohorts.

Input: the per-cohort summary of ``analysis.transfer.transfer_summary`` (dataset, method,
n_cases, n_eligible, mean_iou, ci_low, ci_high, centre_baseline_iou, chance_iou).
Method: docs/maps_and_scores.md, "Figures".
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from endoexplain_core.methods import CAM_METHODS, METHOD_COLOURS, method_label
from endoexplain_core.marks import EIGEN_FOOTNOTE
from endoexplain_core.figures import style


def figure5_caption(summary: pd.DataFrame, *, score_threshold: float, synthetic: bool = False) -> str:
    """One-line caption computed from the summary: per cohort n, eligible count, CAM IoU range,
    the centre-baseline and random-heatmap means and the chance level."""
    parts = []
    for dataset, part in summary.groupby("dataset", sort=False):
        cams = part[part["method"].isin(CAM_METHODS)]["mean_iou"]
        random_iou = part.loc[part["method"] == "random", "mean_iou"]
        references = f"centre baseline {part['centre_baseline_iou'].iloc[0]:.3f}"
        if len(random_iou):
            references += f", random heatmap {random_iou.iloc[0]:.3f}"
        if "chance_iou" in part.columns:
            references += f", chance {part['chance_iou'].iloc[0]:.3f}"
        parts.append(f"{style.cohort_label(dataset, synthetic=synthetic)}: n = {part['n_cases'].iloc[0]}, "
                     f"{part['n_eligible'].iloc[0]} at scaled score ≥ {score_threshold:.2f}, "
                     f"CAM mean IoU {cams.min():.3f}–{cams.max():.3f}, {references}")
    return ("Figure 5. Mean top-20% IoU over all masked cases per cohort (95% image-bootstrap "
            "CIs; hatched bar: centre baseline; dashed bar: random heatmap; black tick: chance). "
            + "; ".join(parts) + ".")


def figure5_transfer(summary: pd.DataFrame, *, score_threshold: float, top_fraction: float,
                     synthetic: bool = False, not_validated=(),
                     methods: tuple[str, ...] = CAM_METHODS):
    """Grouped bars: mean top-fraction IoU per CAM and cohort with 95% CIs, then the centre baseline
    (hatched) and random heatmap (dashed) with theirs and the chance level (``chance_iou``) as a
    black tick; n cases and eligible counts under each cohort. ``synthetic``: cohorts named
    "Synthetic ETIS-like" etc.; ``not_validated``: CAMs with the gate's dagger. 183 mm wide."""
    datasets = list(dict.fromkeys(summary["dataset"]))
    references = [m for m in ("centre", "random") if m in set(summary["method"])]
    drawn = (*methods, *references)
    width = 0.84 / len(drawn)
    fig, ax = plt.subplots(figsize=(style.DOUBLE_COLUMN_INCHES - 0.1, 3.2), layout="constrained")
    for offset, method in enumerate(drawn):
        part = summary[summary["method"] == method].set_index("dataset").reindex(datasets)
        x = np.arange(len(datasets)) - 0.42 + width * (offset + 0.5)
        errors = style.error_extents(part["mean_iou"], part["ci_low"], part["ci_high"])
        if method == "centre":
            look = {"color": "white", "edgecolor": "black", "hatch": "////"}
        elif method == "random":
            look = {"color": "white", "edgecolor": style.RANDOM_REFERENCE["color"],
                    "linestyle": style.RANDOM_REFERENCE["linestyle"], "linewidth": 1.0}
        else:
            look = {"color": METHOD_COLOURS[method], "edgecolor": "none"}
        ax.bar(x, part["mean_iou"], width=width * 0.92, label=method_label(method, not_validated),
               yerr=errors, capsize=1.5, error_kw={"elinewidth": 0.7, "capthick": 0.7},
               **{"linewidth": 0.6, **look})
        if method == "random" and "chance_iou" in part.columns:
            for centre_x, chance in zip(x, part["chance_iou"]):
                ax.plot([centre_x - width * 0.46, centre_x + width * 0.46], [chance] * 2, color="black",
                        linewidth=1.6, solid_capstyle="butt",
                        label=f"Chance (random top {top_fraction:.0%})" if centre_x == x[0] else None)
    if not references:   # older summaries: the centre mean only, drawn beside the group
        for position, dataset in enumerate(datasets):
            value = summary.loc[summary["dataset"] == dataset, "centre_baseline_iou"].iloc[0]
            ax.plot([position + 0.45], [value], marker="_", markersize=12, color="black")
    counts = summary.drop_duplicates("dataset").set_index("dataset")
    ax.set_xticks(np.arange(len(datasets)))
    ax.set_xticklabels([f"{style.cohort_label(d, synthetic=synthetic)}\nn = {counts.loc[d, 'n_cases']:,} "
                        f"({counts.loc[d, 'n_eligible']:,} at score \u2265 {score_threshold:.2f})"
                        for d in datasets], fontsize=7)
    ax.set_ylabel(f"Mean top-{top_fraction:.0%} CAM\u2013mask IoU (95% CI)", fontsize=7.5)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_ylim(0, max(0.05, float(np.nanmax(summary["ci_high"].to_numpy())) * 1.12))
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("Chance"))   # chance last
    ax.legend([handles[i] for i in order], [labels[i] for i in order], frameon=False, fontsize=7,
              ncol=1, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    style.footnote(fig, EIGEN_FOOTNOTE + " Hatched: centre baseline (model-free); dashed: random "
                  "heatmap; black tick: chance, the expected IoU of a uniformly random top area "
                  "given each image's lesion size. Eligible: temperature-scaled score \u2265 "
                  f"{score_threshold:.2f}. No negatives in these cohorts.")
    return fig
