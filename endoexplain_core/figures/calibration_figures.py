"""Figure 2: (A) reliability of raw vs temperature-scaled scores on the test split; (B) CAM
failure (peak outside the lesion) vs the score threshold, with eligible counts.

Inputs: ``<run_dir>/calibration/reliability_test.csv`` (02_calibration: checkpoint_id, split,
score = "Raw" | "Temperature-scaled", bin, lower, upper, count, mean_score,
observed_frequency) and ``<run_dir>/robustness/threshold_sensitivity.csv`` (05_robustness:
score_threshold, method, n_eligible, failure_rate, ci_low, ci_high).
Method: docs/maps_and_scores.md, "Figures".
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from endoexplain_core.methods import BASELINE_METHODS, CAM_METHODS, METHOD_COLOURS, method_label
from endoexplain_core.marks import EIGEN_FOOTNOTE
from endoexplain_core.analysis import calibration, stats
from endoexplain_core.figures import style
from endoexplain_core import artefacts

RELIABILITY_COLUMNS = ("score", "count", "mean_score", "observed_frequency")
THRESHOLD_COLUMNS = ("score_threshold", "method", "n_eligible", "failure_rate", "ci_low", "ci_high")
ECE_COLUMNS = ("score", "n", "ece", "ci_low", "ci_high")   # 02: table_s2_ece_intervals
SCORE_COLOURS = {"Raw": "#999999", "Temperature-scaled": "#1f4e79"}


def read_checked_csv(path: str | Path, columns: tuple[str, ...], producer: str) -> pd.DataFrame:
    """Read a CSV artefact; name the file and the notebook that writes it on any problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run {producer} first")
    table = pd.read_csv(path)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing} (written by {producer})")
    if table.empty:
        raise ValueError(f"{path}: has no rows (written by {producer})")
    return table


AXIS_MARGIN = 0.03   # axes run from -margin to 1 + margin so points at 0 and 1 are not clipped


MIN_BIN_COUNT = 5   # a bin with fewer images is drawn open and left off the line


def _runs_of_adjacent_bins(part: pd.DataFrame) -> list[pd.DataFrame]:
    """``part`` split where the bin index jumps: a line is never drawn across a skipped bin."""
    bins = part["bin"].to_numpy()
    breaks = np.flatnonzero(np.diff(bins) != 1) + 1
    return [part.iloc[a:b] for a, b in zip([0, *breaks], [*breaks, len(part)])]


def draw_reliability(ax, reliability: pd.DataFrame, ece_intervals: pd.DataFrame | None = None) -> None:
    """Observed positive frequency vs mean score per non-empty bin, raw and scaled, each point with
    its Wilson 95% interval; lines join adjacent bins of at least ``MIN_BIN_COUNT`` images, smaller
    bins are open markers; legend entries give each ECE (with its interval from ``ece_intervals``,
    ``calibration.ece_intervals``, when given) and the legend's title the change from scaling;
    images per bin printed above the axes."""
    ax.plot([0, 1], [0, 1], color="black", linewidth=0.7, linestyle=":", label="Perfect calibration")
    for kind, nudge in (("Raw", -0.006), ("Temperature-scaled", 0.006)):
        part = reliability[(reliability["score"] == kind) & (reliability["count"] > 0)]
        colour = SCORE_COLOURS[kind]
        ece = calibration.ece_from_bins(part)
        label = f"{kind} score (ECE {ece:.3f})"
        if ece_intervals is not None and kind in set(ece_intervals["score"]):
            row = ece_intervals[ece_intervals["score"] == kind].iloc[0]
            label = f"{kind} score (ECE {row['ece']:.3f}, 95% CI {row['ci_low']:.3f} to {row['ci_high']:.3f})"
        x = part["mean_score"] + nudge
        for run in _runs_of_adjacent_bins(part[part["count"] >= MIN_BIN_COUNT]):
            ax.plot(run["mean_score"] + nudge, run["observed_frequency"], linewidth=1.0,
                    color=colour, clip_on=False)
        enough = part["count"] >= MIN_BIN_COUNT
        ax.plot(x[enough], part.loc[enough, "observed_frequency"], marker="o", markersize=3,
                linestyle="none", color=colour, label=label, clip_on=False)
        ax.plot(x[~enough], part.loc[~enough, "observed_frequency"], marker="o", markersize=3.5,
                linestyle="none", markerfacecolor="white", color=colour, clip_on=False)
        if len(part):
            positives = np.round(part["observed_frequency"] * part["count"]).astype(int)
            low, high = stats.wilson_interval(positives.to_numpy(), part["count"].to_numpy())
            ax.vlines(x, low, high, color=colour, linewidth=0.8, alpha=0.7)
    scaled = reliability[reliability["score"] == "Temperature-scaled"]
    counts_transform = ax.get_xaxis_transform()          # x in data, y in axes fraction
    ax.text(-AXIS_MARGIN, 1.03, "n:", transform=counts_transform, ha="right", va="bottom",
            fontsize=6, color=SCORE_COLOURS["Temperature-scaled"])
    n_bins = int(reliability["bin"].max()) + 1 if "lower" not in scaled else None
    centres = ((scaled["lower"] + scaled["upper"]) / 2 if n_bins is None
               else (scaled["bin"] + 0.5) / max(n_bins, 10))
    for centre, n in zip(centres, scaled["count"]):
        if n > 0:
            ax.text(centre, 1.03, f"{int(n)}", transform=counts_transform,
                    ha="center", va="bottom", fontsize=6, color=SCORE_COLOURS["Temperature-scaled"])
    ax.set_xlim(-AXIS_MARGIN, 1 + AXIS_MARGIN)
    ax.set_ylim(-AXIS_MARGIN, 1 + AXIS_MARGIN)
    ax.set_aspect("equal")
    ax.set_xlabel("Mean score in bin")
    ax.set_ylabel("Observed frequency of target")
    title = f"open: bin of < {MIN_BIN_COUNT} images; bars: Wilson 95% CI"
    change = (ece_intervals[ece_intervals["score"].str.startswith("Change")]
              if ece_intervals is not None else [])
    if len(change):
        row = change.iloc[0]
        title += (f"\nECE change after scaling {row['ece']:+.3f} (95% CI {row['ci_low']:+.3f} to "
                  f"{row['ci_high']:+.3f}; n = {int(row['n'])}, paired image bootstrap)")
    ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, fontsize=7,
              title=title, title_fontsize=6)


def draw_threshold_sensitivity(ax, sensitivity: pd.DataFrame, not_validated=(),
                               score_threshold: float | None = None) -> None:
    """Peak-outside-lesion rate (95% CI) vs score threshold per map, n eligible on top; methods in
    ``not_validated`` carry the validity gate's mark; thresholds without an eligible image get only
    "n=0"."""
    counts = sensitivity.groupby("score_threshold")["n_eligible"].max()
    thresholds = np.sort(counts.index[counts > 0].to_numpy())
    order = [m for m in (*CAM_METHODS, *BASELINE_METHODS) if m in set(sensitivity["method"])]
    spacing = float(np.min(np.diff(np.sort(counts.index)))) if len(counts) > 1 else 0.05
    spread = 0.6 * spacing
    offsets = np.linspace(-spread / 2, spread / 2, len(order)) if len(order) > 1 else [0.0]
    for offset, method in zip(offsets, order):
        part = sensitivity[(sensitivity["method"] == method) & sensitivity["score_threshold"].isin(thresholds)]
        part = part.sort_values("score_threshold")
        if part.empty:        # an empty line would still claim a bounding box at the origin
            continue
        errors = style.error_extents(part["failure_rate"], part["ci_low"], part["ci_high"])
        # reference maps on top: a CAM at the random map's rate must not hide it
        ax.errorbar(part["score_threshold"] + offset, part["failure_rate"], yerr=errors, marker="o",
                    markersize=3, linewidth=1.0, capsize=1.5, elinewidth=0.6,
                    color=METHOD_COLOURS.get(method, "black"),
                    linestyle="--" if method in BASELINE_METHODS else "-",
                    label=method_label(method, not_validated), clip_on=False,
                    zorder=4 if method in BASELINE_METHODS else 2)
    if score_threshold is not None and len(thresholds):
        ax.axvline(score_threshold, color="0.6", linewidth=0.7, linestyle=":", zorder=1,
                   label=f"primary threshold ({score_threshold:.2f})")
    for threshold in (counts.index if len(thresholds) else []):
        n = int(counts.loc[threshold])
        ax.annotate(f"n={n}" if n else f"n=0 at\n\u2265 {threshold:.2f}", (threshold, 1.0),
                    xycoords=("data", "axes fraction"), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7, color="black" if n else "dimgrey")
    every = np.sort(counts.index.to_numpy())
    ax.set_xlim(every.min() - spacing * 0.6, every.max() + spacing * 0.6)
    ax.set_xticks(thresholds)
    ax.set_xticklabels([f"{t:.2f}" for t in thresholds])
    ax.set_ylim(-AXIS_MARGIN, 1 + AXIS_MARGIN)
    ax.set_xlabel("Temperature-scaled score threshold")
    ax.set_ylabel("Peak outside lesion (95% CI)")
    if len(thresholds) == 0:
        ax.set_xticks(every)
        ax.set_xticklabels([f"{t:.2f}" for t in every])
        ax.text(0.5, 0.5, "n = 0 at every threshold:\nno image to estimate from",
                transform=ax.transAxes, ha="center", va="center", fontsize=8, color="dimgrey",
                in_layout=False)
    if len(thresholds):
        ax.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))


@artefacts.computed_by
def figure2_calibration_threshold(reliability: pd.DataFrame, sensitivity: pd.DataFrame,
                                  not_validated=(), score_threshold: float | None = None,
                                  ece_intervals: pd.DataFrame | None = None):
    """Figure 2 with panels A (reliability) and B (failure vs threshold); 183 mm wide.
    ``not_validated``: CAM methods whose labels carry the validity gate's mark;
    ``ece_intervals``: 02's ``table_s2_ece_intervals`` (the ECEs with their intervals)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(style.DOUBLE_COLUMN_INCHES - 0.2, 3.6),
                                      layout="constrained", gridspec_kw={"width_ratios": [1, 1.25]})
    draw_reliability(left, reliability, ece_intervals)
    draw_threshold_sensitivity(right, sensitivity, not_validated, score_threshold)
    for ax, letter, title in ((left, "A", "Reliability"), (right, "B", "Failure by threshold")):
        style.panel_title(ax, letter, title, pad=14)
    style.footnote(fig, EIGEN_FOOTNOTE)
    return fig


def figure2_caption(reliability: pd.DataFrame, sensitivity: pd.DataFrame) -> str:
    """One-line caption computed from the two tables (test n; eligible n per threshold)."""
    n_test = int(reliability.loc[reliability["score"] == "Raw", "count"].sum())
    counts = sensitivity.groupby("score_threshold")["n_eligible"].max()
    eligible = ", ".join(f"{int(n)} at ≥ {t:.2f}" for t, n in counts.items())
    return (f"Figure 2. A: reliability of raw and temperature-scaled scores on the test split "
            f"(n = {n_test} images, 10 equal-width bins; numbers are bin counts). B: share of "
            f"high-score masked images whose CAM peak lies outside the lesion, with 95% "
            f"bootstrap CIs; eligible images: {eligible}.")


@artefacts.computed_by
def plot_reliability_with_counts(reliability: pd.DataFrame, ece_intervals: pd.DataFrame | None = None):
    """Figure: (A) reliability raw vs temperature-scaled (``draw_reliability``, as Figure 2A), (B)
    images per score bin. ``reliability``: ``reliability_raw_vs_scaled`` output; ``ece_intervals``
    (optional): ``calibration.ece_intervals`` of the same split."""
    fig, (curve_ax, count_ax) = plt.subplots(1, 2, figsize=(7.2, 3.8), layout="constrained",
                                             gridspec_kw={"width_ratios": [1, 1.1]})
    draw_reliability(curve_ax, reliability, ece_intervals)
    style.panel_title(curve_ax, "A", "Reliability", pad=14)
    width = 0.045
    for offset, kind in ((-width / 2, "Raw"), (width / 2, "Temperature-scaled")):
        part = reliability[reliability["score"] == kind]
        centres = (part["lower"] + part["upper"]) / 2 + offset
        count_ax.bar(centres, part["count"], width=width, color=SCORE_COLOURS[kind],
                     label=f"{kind} score")
        for centre, n in zip(centres, part["count"]):
            if n > 0:
                count_ax.text(centre, n, f"{int(n)}", ha="center", va="bottom", fontsize=6,
                              color=SCORE_COLOURS[kind])
    count_ax.set(xlim=(0, 1), ylim=(0, reliability["count"].max() * 1.12 + 1),
                 xlabel="Score bin", ylabel="Images in bin")
    style.panel_title(count_ax, "B", "Bin counts")
    count_ax.legend(frameon=False, loc="upper center")
    return fig
