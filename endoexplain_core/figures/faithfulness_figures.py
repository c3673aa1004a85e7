"""Figures of the faithfulness and sanity controls (notebook 08).

Inputs are the tables of ``analysis.faithfulness`` and ``analysis.subgroups``:
  road curves      checkpoint_id, method, order, fraction, drop, ci_low, ci_high
  SRG              checkpoint_id, method, srg, ci_low, ci_high
  shape deletion   checkpoint_id, method, cam_minus_shifted, ci_low, ci_high
                   (+ cam_minus_pixel_random, pixel_ci_low, pixel_ci_high)
  randomisation    step, block, method, spearman, top_iou
  subgroup gaps    contrast, outcome, model, slopes, method, gap, ci_low, ci_high,
                   ci90_low, ci90_high, tost_equivalent
Each function returns a Matplotlib figure; saving is the notebook's job.
Method: docs/maps_and_scores.md, "Figures".
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from endoexplain_core.methods import METHOD_COLOURS, method_label
from endoexplain_core.marks import EIGEN_FOOTNOTE
from endoexplain_core.figures import style

REFERENCE_COLOUR = style.RANDOM_REFERENCE["color"]   # the random heatmap, as in every figure


def _colour(method: str) -> str:
    return METHOD_COLOURS.get(method, "grey")


def coinciding_curves(curves: pd.DataFrame, tolerance: float = 1e-9) -> dict[str, list[str]]:
    """method -> methods whose MoRF and LeRF curves equal its own (max |difference| of the mean
    drop <= ``tolerance`` at every order and fraction), for the first method of each group in
    table order; e.g. Grad-CAM and XGrad-CAM at a GAP + linear head. Singletons are left out."""
    wide = curves.pivot_table(index=["order", "fraction"], columns="method", values="drop", sort=False)
    methods = list(dict.fromkeys(curves["method"]))
    groups: dict[str, list[str]] = {}
    taken: set[str] = set()
    for position, method in enumerate(methods):
        if method in taken:
            continue
        same = [other for other in methods[position + 1:] if other not in taken
                and (wide[method] - wide[other]).abs().max() <= tolerance]
        if same:
            groups[method] = same
            taken.update(same)
    return groups


def road_curves_figure(curves: pd.DataFrame, not_validated=()):
    """MoRF and LeRF curves of one checkpoint: mean drop of z/T against the share of the field of
    view filled, per method with 95% bands, the random heatmap dashed; coinciding curves
    (``coinciding_curves``) drawn once, labelled together. ``not_validated``: methods marked with
    the validity gate's dagger."""
    groups = coinciding_curves(curves)
    hidden = {other for same in groups.values() for other in same}
    fig, axes = plt.subplots(1, 2, figsize=(style.DOUBLE_COLUMN_INCHES - 0.3, 3.0), sharey=True,
                             layout="constrained")
    for ax, letter, order, title in zip(axes, "AB", ("morf", "lerf"),
                                        ("Most relevant first (MoRF)", "Least relevant first (LeRF)")):
        part = curves[(curves["order"] == order) & ~curves["method"].isin(hidden)]
        for method, rows in part.groupby("method", sort=False):
            rows = rows.sort_values("fraction")
            x = 100 * rows["fraction"].to_numpy()
            colour = REFERENCE_COLOUR if method == "random" else _colour(method)
            label = " = ".join(method_label(m, not_validated) for m in [method, *groups.get(method, [])])
            ax.plot(x, rows["drop"], label=label, **style.method_line(method, colour))
            ax.fill_between(x, rows["ci_low"], rows["ci_high"], color=colour, alpha=0.12, linewidth=0)
        ax.axhline(0, color="grey", linewidth=0.6)
        ax.set_xscale("log")
        ax.set_xticks([1, 2, 5, 10, 20])
        ax.set_xticklabels(["1", "2", "5", "10", "20"])
        ax.set_xlabel("Field of view filled by imputation (%)")
        style.panel_title(ax, letter, title)
    axes[0].set_ylabel("Drop of z/T (mean, 95% CI)")
    axes[1].legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    note = " 'A = B': identical curves, drawn once." if groups else ""
    shown = curves[~curves["method"].isin(hidden)]
    wide = shown.pivot_table(index=["order", "fraction"], columns="method", values="drop", sort=False)
    tolerance = 0.02 * float(np.nanmax(np.abs(wide.to_numpy()))) if wide.size else 0.0
    coinciding = style.coincidence_note(wide, tolerance, lambda m: method_label(m, not_validated))
    note += coinciding + (" Told apart by line style and marker." if coinciding else "")
    style.footnote(fig, EIGEN_FOOTNOTE + " Dashed: random heatmap (reference map). z/T: the "
                   "temperature-scaled logit difference; a drop is its decrease after imputation "
                   "(ROAD: removed pixels filled from their neighbours). A negative LeRF drop: "
                   "imputing the least relevant pixels raises the score." + note)
    return fig


def _forest(ax, labels, estimates, lows, highs, colours, *, zero: float = 0.0) -> None:
    y = np.arange(len(labels))[::-1]
    for position, estimate, low, high, colour in zip(y, estimates, lows, highs, colours):
        ax.plot([low, high], [position, position], color=colour, linewidth=1.2)
        ax.plot([estimate], [position], marker="o", color=colour, markersize=4)
    ax.axvline(zero, color="grey", linewidth=0.7, linestyle=":")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, **style.AS_WRITTEN)   # labels may name data (subgroups, checkpoints)


def srg_shape_figure(srg: pd.DataFrame, shape: pd.DataFrame, not_validated=()):
    """Left: SRG per map (95% CI; > 0 = the map ranks the pixels the model uses). Right: CAM
    deletion minus the shape-preserving random deletion (filled) and minus the pixel-wise
    random deletion (open), positive logit. ``not_validated``: methods marked with the validity
    gate's dagger."""
    fig, axes = plt.subplots(1, 2, figsize=(style.DOUBLE_COLUMN_INCHES - 0.2, 2.8), layout="constrained")
    labels = [method_label(m, not_validated) for m in srg["method"]]
    _forest(axes[0], labels, srg["srg"], srg["ci_low"], srg["ci_high"],
            [REFERENCE_COLOUR if m == "random" else _colour(m) for m in srg["method"]])
    axes[0].set_xlabel("SRG: drop(MoRF) \u2212 drop(LeRF), z/T")
    style.panel_title(axes[0], "A", "Symmetric relevance gain")
    y = np.arange(len(shape))[::-1]
    for position, row in zip(y, shape.itertuples(index=False)):
        colour = _colour(row.method)
        axes[1].plot([row.ci_low, row.ci_high], [position + 0.12] * 2, color=colour, linewidth=1.2)
        axes[1].plot([row.cam_minus_shifted], [position + 0.12], "o", color=colour, markersize=4)
        if "cam_minus_pixel_random" in shape.columns and pd.notna(row.cam_minus_pixel_random):
            axes[1].plot([row.pixel_ci_low, row.pixel_ci_high], [position - 0.12] * 2, color=colour,
                         linewidth=0.8, linestyle="--")
            axes[1].plot([row.cam_minus_pixel_random], [position - 0.12], "o", markersize=4,
                         markerfacecolor="white", color=colour)
    axes[1].axvline(0, color="grey", linewidth=0.7, linestyle=":")
    axes[1].set_yticks(y)
    axes[1].set_yticklabels([method_label(m, not_validated) for m in shape["method"]])
    axes[1].set_xlabel("CAM deletion \u2212 control deletion (logit)")
    style.panel_title(axes[1], "B", "Deletion beyond random controls")
    style.footnote(fig, "Filled: shape-preserving random control; open: pixel-wise random control. "
                   "Bars: 95% image-bootstrap CIs. " + EIGEN_FOOTNOTE)
    return fig


def randomisation_figure(table: pd.DataFrame, not_validated=()):
    """Similarity of each CAM to the trained model's map after cascading randomisation, block by
    block from the head (left) to the stem: Spearman rank correlation (A) and top-20% IoU (B).
    ``not_validated``: methods marked with the validity gate's dagger. 183 mm wide."""
    steps = table.drop_duplicates("step").sort_values("step")
    fig, axes = plt.subplots(1, 2, figsize=(style.DOUBLE_COLUMN_INCHES - 0.3, 3.1), sharex=True,
                             layout="constrained")
    for ax, letter, column, title, short in zip(axes, "AB", ("spearman", "top_iou"),
                                                ("Spearman rank correlation", "Top-20% IoU"),
                                                ("Spearman \u03c1", "Top-20% IoU")):
        for method, rows in table.groupby("method", sort=False):
            rows = rows.sort_values("step")
            ax.plot(rows["step"], rows[column], marker="o", markersize=3, color=_colour(method),
                    label=method_label(method, not_validated))
        style.panel_title(ax, letter, title)
        ax.set_ylabel(f"{short} with the trained map", fontsize=7.5)
        ax.set_ylim(-1.05 if column == "spearman" else 0, 1.05)  # rank correlations can turn negative
        ax.axhline(0, color="grey", linewidth=0.6)
        ax.set_xticks(steps["step"])
        ax.set_xticklabels(steps["block"], rotation=90, fontsize=6.5, **style.AS_WRITTEN)
    images = f"{int(table['images'].max())} images. " if "images" in table.columns else ""
    style.footnote(fig, images + EIGEN_FOOTNOTE + " Eigen-CAM does not use the classifier "
                   "head, so randomising the head alone leaves it unchanged. Blocks randomised cumulatively from the head (left) towards the stem (right); "
                  "\"trained\": no block randomised (the reference, 1 by construction). A map that "
                  "stays near 1 as the weights are randomised does not depend on what the model "
                   "learned.")
    axes[1].legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def subgroup_forest_figure(gaps: pd.DataFrame, *, model: str = "M1", slopes: str = "shared",
                           margins: dict | None = None, not_validated=()):
    """Forest plot of the adjusted subgroup gaps of ``model``: energy lift (bits, grey band
    +-0.5 bit) and pointing (pp, band +-10 pp); thick bar 90% CI (the TOST interval), thin bar
    95% CI; an open marker where TOST rates the gap equivalent to 0. ``not_validated``: methods
    marked with the validity gate's dagger."""
    margins = margins or {"energy_lift": 0.5, "pointing_hit": 10.0}
    part = gaps[(gaps["model"] == model) & (gaps["slopes"] == slopes)]
    outcomes = [o for o in ("energy_lift", "pointing_hit") if o in set(part["outcome"])]
    rows = part[part["outcome"] == outcomes[0]][["contrast", "method"]].drop_duplicates() if outcomes else part
    height = 1.0 + 0.18 * max(1, len(rows))
    fig, axes = plt.subplots(1, max(1, len(outcomes)), figsize=(style.DOUBLE_COLUMN_INCHES - 0.1, height), sharey=True,
                             layout="constrained", squeeze=False)
    labels = [f"{c} \u2014 {method_label(m, not_validated)}" for c, m in zip(rows["contrast"], rows["method"])]
    y = np.arange(len(rows))[::-1]
    for index, (ax, outcome) in enumerate(zip(axes[0], outcomes)):
        if len(outcomes) > 1:
            style.panel_title(ax, "AB"[index], "Energy lift" if outcome == "energy_lift" else "Pointing game")
        data = part[part["outcome"] == outcome].set_index(["contrast", "method"]).reindex(
            list(zip(rows["contrast"], rows["method"])))
        margin = margins[outcome]
        ax.axvspan(-margin, margin, color="0.9", zorder=0)
        ax.axvline(0, color="grey", linewidth=0.7)
        for position, ((_, method), row) in zip(y, data.iterrows()):
            if not np.isfinite(row["gap"]):
                ax.text(0, position, "not estimable", fontsize=6, va="center", ha="center",
                        color="grey", bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
                continue
            colour = _colour(method)
            ax.plot([row["ci_low"], row["ci_high"]], [position] * 2, color=colour, linewidth=0.7)
            ax.plot([row["ci90_low"], row["ci90_high"]], [position] * 2, color=colour, linewidth=2.2)
            ax.plot([row["gap"]], [position], "o", markersize=4, color=colour,
                    markerfacecolor="white" if bool(row["tost_equivalent"]) else colour)
        unit = "bit" if outcome == "energy_lift" else "pp"
        ax.set_xlabel(("Energy-lift gap" if outcome == "energy_lift" else "Pointing-hit gap")
                      + f" ({unit})\nsubgroup \u2212 reference")
    axes[0][0].set_yticks(y)
    axes[0][0].set_yticklabels(labels, fontsize=6.5, **style.AS_WRITTEN)   # contrasts name subgroups
    pooled = int(part["n_checkpoints"].max()) if "n_checkpoints" in part and len(part) else 1
    fig.suptitle(f"Adjusted subgroup gaps ({model}, {slopes} slopes"
                 + (f"; maps of {pooled} checkpoints pooled" if pooled > 1 else "")
                 + "); grey band: equivalence margin", fontsize=8, **style.AS_WRITTEN)
    style.footnote(fig, "Thick bar: 90% CI (TOST); thin bar: 95% CI; open marker: equivalent to 0. "
                   + EIGEN_FOOTNOTE)
    return fig
