"""Figures of the extended localisation (notebook 07): tables in, Matplotlib figures out.

Inputs are the tables of ``analysis.extended_localisation``: ``iou_curves`` (method,
threshold, mean_iou, n), the case table (for the energy-lift distributions), ``top_k_table``
and the C-Score rows (checkpoint_id, method, c_score, n_gold). Scores:
docs/maps_and_scores.md, "Threshold-free and chance-normalised scores".
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from endoexplain_core.methods import BASELINE_METHODS, EXTENDED_BASELINE_METHODS, METHOD_COLOURS, method_label
from endoexplain_core.figures import style

ALPHA_FLOOR_BITS = float(np.log2(0.01 / 1.01))  # lambda_E of a map with no lesion saliency
MODEL_FREE_METHODS = BASELINE_METHODS + EXTENDED_BASELINE_METHODS   # drawn dashed, thinner


def _colour(method: str) -> str:
    return METHOD_COLOURS.get(method, "black")


def iou_threshold_curves(curves: pd.DataFrame, auc: pd.DataFrame, *, title: str = "", not_validated=()):
    """Mean IoU of ``map >= t`` against the threshold t, one line per method; the integration
    band 0.05-0.95 is shaded and the single thresholds 0.3 / 0.5 / 0.7 are marked. The legend
    gives each method's mean AUC-IoU (``auc``: method, auc_iou; raw, maximum 0.9)."""
    fig, ax = plt.subplots(figsize=(5.6, 3.6), layout="constrained")
    low, high = curves["iou_threshold"].min(), curves["iou_threshold"].max()
    ax.axvspan(low, high, color="0.93", zorder=0, label=f"AUC band {low:.2f}\u2013{high:.2f}")
    for level in (0.3, 0.5, 0.7):
        ax.axvline(level, color="0.6", linewidth=0.6, linestyle=":")
    values = auc.set_index("method")["auc_iou"]
    for position, (method, part) in enumerate(curves.groupby("method", sort=False)):
        baseline = method in MODEL_FREE_METHODS
        ax.plot(part["iou_threshold"], part["mean_iou"], linewidth=1.0 if baseline else 1.4,
                **style.method_line(method, _colour(method), position=position, every=3),
                label=f"{method_label(method, not_validated)} (AUC {values.get(method, np.nan):.3f})")
    ax.set_xlabel("Binarisation threshold t (map \u2265 t)")
    ax.set_ylabel("Mean IoU with the lesion mask")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    n = int(curves["n"].max())
    ax.set_title(title or f"IoU against threshold (n = {n} images)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    wide = curves.pivot_table(index="iou_threshold", columns="method", values="mean_iou", sort=False)
    style.footnote(fig, "Line style and marker tell the methods apart; markers on every third "
                   "threshold, staggered." + _coinciding_note(wide, not_validated))
    return fig


def _coinciding_note(wide: pd.DataFrame, not_validated, tolerance: float = 0.01) -> str:
    """" A and B nearly coincide (largest difference d)." for the curves within ``tolerance``."""
    return style.coincidence_note(wide, tolerance, lambda m: method_label(m, not_validated))


def energy_lift_distributions(table: pd.DataFrame, methods, *, title: str = "", not_validated=()):
    """Energy lift lambda_E (bits) per method: box plots (middle 50%, whiskers 5-95%) with points,
    the 0-bit chance line (a uniform map), the alpha floor and the DoG map's median."""
    data = [table.loc[table["method"] == m, "energy_lift_bits"].dropna().to_numpy() for m in methods]
    fig, ax = plt.subplots(figsize=(min(style.DOUBLE_COLUMN_INCHES - 0.2, 2.6 + 0.5 * len(methods)), 3.4),
                           layout="constrained")
    boxes = ax.boxplot(data, whis=(5, 95), showfliers=False, patch_artist=True, widths=0.6,
                       medianprops={"color": "black"})     # not the default orange (Grad-CAM++'s)
    for patch, method in zip(boxes["boxes"], methods):
        patch.set_facecolor(_colour(method))
        patch.set_alpha(0.45)
    generator = np.random.default_rng(0)
    for position, values in enumerate(data, start=1):
        ax.scatter(position + generator.uniform(-0.18, 0.18, len(values)), values, s=4,
                   color="black", alpha=0.35, linewidths=0)
    ax.axhline(0, color="black", linewidth=0.8, label="chance (uniform map) = 0 bits")
    ax.axhline(ALPHA_FLOOR_BITS, color="0.5", linewidth=0.6, linestyle=":",
               label=f"floor (\u03b1 = 0.01) = {ALPHA_FLOOR_BITS:.1f} bits")
    if "dog" in methods:
        dog_median = float(np.median(data[list(methods).index("dog")]))
        ax.axhline(dog_median, color="black", linewidth=0.8, linestyle="--",
                   label=f"DoG median = {dog_median:.2f} bits")
    ax.set_xticks(np.arange(1, len(methods) + 1))
    ax.set_xticklabels([style.two_line_label(method_label(m, not_validated)) for m in methods],
                       fontsize=6.5)
    ax.set_ylabel("Energy lift \u03bb$_E$ (bits)")
    ax.set_title(title or f"Energy lift per method (n = {max(len(d) for d in data)} images)")
    ax.legend(loc="lower left", bbox_to_anchor=(1.01, 0), frameon=False)
    style.footnote(fig, "Energy lift \u03bb_E: log2 of (the map's energy share inside the lesion / the "
                   "lesion's share of the field of view), after mixing a uniform share \u03b1 into "
                   "the map; 0 bits = a uniform map, the floor = a map with no energy on the lesion. "
                   "DoG: difference-of-Gaussians conspicuity of the image alone (no model): a CAM "
                   "below it is not explained by the model. Boxes: middle 50%; whiskers 5-95%.")
    return fig


C_SCORE_CLASSES = {"polyp": "polyp class (maps for class 1 on correctly classified polyps)",
                   "negative": "negative class (maps for class 0 on correctly classified test negatives)"}


def c_score_heatmap(c_scores: pd.DataFrame, methods, *, title: str = "", not_validated=()):
    """C-Score (confidence-weighted mean pairwise soft IoU over the gold list) as a checkpoints x
    methods heatmap with the values printed, one panel per class in ``c_scores["class"]``
    (polyp first; one panel without that column); rows say n_gold; empty cells: fewer than 2
    gold images."""
    if "class" not in c_scores.columns:
        c_scores = c_scores.assign(**{"class": "polyp"})
    classes = [c for c in C_SCORE_CLASSES if c in set(c_scores["class"])]
    panels = {c: c_scores[c_scores["class"] == c] for c in classes}
    columns = [m for m in methods if m in set(c_scores["method"])]
    n_rows = {c: part["checkpoint_id"].nunique() for c, part in panels.items()}
    width = min(style.DOUBLE_COLUMN_INCHES, 2.4 + 0.5 * len(columns))
    lines = len(textwrap.wrap(C_SCORE_NOTE, width=int(width * 20)))
    fig, axes = plt.subplots(len(classes), 1, squeeze=False, layout="constrained",
                             figsize=(width, 0.9 + sum(0.55 + 0.3 * n for n in n_rows.values()) + 0.11 * lines),
                             height_ratios=[0.55 + 0.3 * n_rows[c] for c in classes])
    any_constant = False
    for index, (ax, class_name) in enumerate(zip(axes[:, 0], classes)):
        part = panels[class_name]
        wide = part.pivot(index="checkpoint_id", columns="method", values="c_score").reindex(columns=columns)
        gold = part.drop_duplicates("checkpoint_id").set_index("checkpoint_id")["n_gold"]
        mostly_constant = (part.assign(flag=part.get("n_constant", 0) >= 0.5 * part["n_gold"])
                           .pivot(index="checkpoint_id", columns="method", values="flag")
                           .reindex(index=wide.index, columns=columns).fillna(False).to_numpy(dtype=bool))
        image = ax.imshow(wide.to_numpy(dtype=float), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for (row, column), value in np.ndenumerate(wide.to_numpy(dtype=float)):
            if np.isfinite(value):
                constant = mostly_constant[row, column]
                any_constant |= bool(constant)
                ax.text(column, row, f"{value:.2f}" + ("\nconstant" if constant else ""), ha="center",
                        va="center", fontsize=6 if constant else 7,
                        color="white" if value < 0.6 else "black")
        ax.set_xticks(np.arange(len(columns)))
        ax.set_xticklabels([style.two_line_label(method_label(m, not_validated)) for m in columns]
                           if index == len(classes) - 1 else [], fontsize=6.5)
        ax.set_yticks(np.arange(wide.shape[0]))
        ax.set_yticklabels([f"{style.checkpoint_label(c)} (n = {int(gold[c])})" for c in wide.index],
                           fontsize=6.5, **style.AS_WRITTEN)   # checkpoint ids drawn as written
        if len(classes) > 1:
            style.panel_title(ax, "AB"[index], C_SCORE_CLASSES[class_name].capitalize(), fontsize=7.5)
    fig.colorbar(image, ax=axes[:, 0].tolist(), label="C-Score", shrink=0.9, fraction=0.035, pad=0.01)
    fig.suptitle(title or "C-Score: consistency of each method across correctly classified images",
                 fontsize=8)
    native = (c_scores.loc[c_scores["method"] == "random", "c_score_native"].dropna()
              if "c_score_native" in c_scores.columns else pd.Series(dtype=float))
    native_note = (f" At the native input size (no pooling) the random heatmap scores "
                   f"{native.min():.2f}" + (f"\u2013{native.max():.2f}" if native.max() - native.min() >= 0.005 else "")
                   + "." if len(native) else "")
    constant_note = (" \"constant\": at least half of the gold maps are constant (no positive "
                     "evidence), which the C-Score counts as identical uniform maps: such a value "
                     "says nothing about consistency." if any_constant else "")
    style.footnote(fig, C_SCORE_NOTE + native_note + " n: correctly classified (gold) images per "
                   "checkpoint; 95% image-bootstrap intervals in table_s_extended_c_score."
                   + constant_note)
    return fig


# What the C-Score's references mean (a reader otherwise takes centre 1.00 for the best method).
C_SCORE_NOTE = ("C-Score: confidence-weighted mean soft IoU between the maps of different correctly "
                "classified images (1 = the same map on every image). The centre baseline is one "
                "fixed map, so it scores 1 by construction. The random heatmap is drawn with one fixed "
                "seed, so it is the same map on every image, and pooling to 64 x 64 pixels averages "
                "its noise towards a flat map: it ranks above every CAM by construction, not because "
                "it explains anything. A high C-Score means maps that look alike across images, not "
                "maps on the lesion.")


def top_k_sweep_figure(sweep: pd.DataFrame, *, title: str = "", not_validated=()):
    """Mean IoU (A) and mean in-lesion energy share (B) of each method's top-k set against
    k = 5%..50%; the audit's 20% is marked. ``not_validated``: methods marked with the validity
    gate's dagger."""
    fig, axes = plt.subplots(1, 2, figsize=(style.DOUBLE_COLUMN_INCHES - 0.4, 3.0), layout="constrained")
    for method, part in sweep.groupby("method", sort=False):
        baseline = method in MODEL_FREE_METHODS
        for ax, column in zip(axes, ("mean_iou", "mean_energy")):
            ax.plot(part["fraction"] * 100, part[column], linewidth=1.0 if baseline else 1.3,
                    **style.method_line(method, _colour(method)), label=method_label(method, not_validated))
    for ax, letter, label in zip(axes, "AB", ("Mean IoU of the top-k set", "Share of top-k saliency in the lesion")):
        style.panel_title(ax, letter)
        ax.axvline(20, color="0.6", linewidth=0.6, linestyle=":")
        ax.set_xlabel("k (% of pixels kept)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.suptitle(title or f"Top-k sweep (n = {int(sweep['n'].max())} images)")
    return fig
