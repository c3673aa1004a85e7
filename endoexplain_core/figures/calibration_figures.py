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


def _ece_label(kind: str, part: pd.DataFrame, ece_intervals: pd.DataFrame | None, *, short: bool) -> str:
    """Legend label of one score kind: its ECE, with its 95% interval unless ``short`` (the
    interval then goes to the caption, ``figure2_caption``)."""
    name = "Scaled" if short and kind == "Temperature-scaled" else kind
    row = _ece_row(ece_intervals, kind)
    if row is None:
        return f"{name} (ECE {calibration.ece_from_bins(part):.3f})"
    if short:
        return f"{name} (ECE {row['ece']:.3f})"
    return f"{kind} score (ECE {row['ece']:.3f}, 95% CI {row['ci_low']:.3f} to {row['ci_high']:.3f})"


def _ece_row(ece_intervals: pd.DataFrame | None, kind: str):
    """The row of ``ece_intervals`` whose score starts with ``kind`` (None when absent)."""
    if ece_intervals is None:
        return None
    rows = ece_intervals[ece_intervals["score"].astype(str).str.startswith(kind)]
    return rows.iloc[0] if len(rows) else None


def _draw_bin_counts(ax, reliability: pd.DataFrame) -> None:
    """Images per bin of the scaled score above the axes; the count of a bin whose left
    neighbour has a count too is printed one line higher (two adjacent bins of 3 and 32 images
    printed "3 32", as one number)."""
    scaled = reliability[reliability["score"] == "Temperature-scaled"]
    counts_transform = ax.get_xaxis_transform()          # x in data, y in axes fraction
    colour = SCORE_COLOURS["Temperature-scaled"]
    ax.text(-AXIS_MARGIN, 1.03, "n:", transform=counts_transform, ha="right", va="bottom",
            fontsize=6, color=colour)
    n_bins = int(reliability["bin"].max()) + 1 if "lower" not in scaled else None
    centres = ((scaled["lower"] + scaled["upper"]) / 2 if n_bins is None
               else (scaled["bin"] + 0.5) / max(n_bins, 10))
    raised_before, previous_bin = True, None
    for bin_index, centre, n in zip(scaled["bin"], centres, scaled["count"]):
        if n <= 0:
            continue
        raised = previous_bin == bin_index - 1 and not raised_before
        ax.text(centre, 1.03 + (0.05 if raised else 0.0), f"{int(n)}", transform=counts_transform,
                ha="center", va="bottom", fontsize=6, color=colour)
        raised_before, previous_bin = raised, bin_index


def draw_reliability(ax, reliability: pd.DataFrame, ece_intervals: pd.DataFrame | None = None, *,
                     legend: str = "below") -> None:
    """Observed positive frequency vs mean score per non-empty bin, raw and scaled, each point with
    its Wilson 95% interval; lines join adjacent bins of at least ``MIN_BIN_COUNT`` images, smaller
    bins are open markers; images per bin printed above the axes. ``legend="below"``: the legend
    under the axes gives each ECE with its interval (``ece_intervals``,
    ``calibration.ece_intervals``, when given) and its title the change from scaling;
    ``"inside"``: a short legend inside the axes (ECEs only), so the panel keeps its width
    beside another (Figure 2; the intervals are in ``figure2_caption``)."""
    short = legend == "inside"
    ax.plot([0, 1], [0, 1], color="black", linewidth=0.7, linestyle=":",
            label="Perfect" if short else "Perfect calibration")
    for kind, nudge in (("Raw", -0.006), ("Temperature-scaled", 0.006)):
        part = reliability[(reliability["score"] == kind) & (reliability["count"] > 0)]
        colour = SCORE_COLOURS[kind]
        x = part["mean_score"] + nudge
        for run in _runs_of_adjacent_bins(part[part["count"] >= MIN_BIN_COUNT]):
            ax.plot(run["mean_score"] + nudge, run["observed_frequency"], linewidth=1.0,
                    color=colour, clip_on=False)
        enough = part["count"] >= MIN_BIN_COUNT
        ax.plot(x[enough], part.loc[enough, "observed_frequency"], marker="o", markersize=3,
                linestyle="none", color=colour, clip_on=False,
                label=_ece_label(kind, part, ece_intervals, short=short))
        ax.plot(x[~enough], part.loc[~enough, "observed_frequency"], marker="o", markersize=3.5,
                linestyle="none", markerfacecolor="white", color=colour, clip_on=False)
        if len(part):
            positives = np.round(part["observed_frequency"] * part["count"]).astype(int)
            low, high = stats.wilson_interval(positives.to_numpy(), part["count"].to_numpy())
            ax.vlines(x, low, high, color=colour, linewidth=0.8, alpha=0.7)
    ax.set_xlim(-AXIS_MARGIN, 1 + AXIS_MARGIN)
    ax.set_ylim(-AXIS_MARGIN, 1 + AXIS_MARGIN)
    ax.set_aspect("equal")
    ax.set_xlabel("Mean score in bin")
    ax.set_ylabel("Observed frequency of target")
    _draw_bin_counts(ax, reliability)
    if short:
        ax.legend(frameon=False, loc="best", fontsize=6.5, handlelength=1.2,   # clear of the points
                  borderaxespad=0.2)
        return
    title = f"open: bin of < {MIN_BIN_COUNT} images; bars: Wilson 95% CI"
    change = _ece_row(ece_intervals, "Change")
    if change is not None:
        title += (f"\nECE change after scaling {change['ece']:+.3f} (95% CI {change['ci_low']:+.3f} to "
                  f"{change['ci_high']:+.3f}; n = {int(change['n'])}, paired image bootstrap)")
    ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, fontsize=7,
              title=title, title_fontsize=6)


def draw_threshold_sensitivity(ax, sensitivity: pd.DataFrame, not_validated=(),
                               score_threshold: float | None = None) -> None:
    """Peak-outside-lesion rate (95% CI) vs score threshold per map, baselines dashed; each
    tick says its threshold and the eligible n under it (the n never collide, however narrow the
    panel); methods in ``not_validated`` carry the validity gate's mark; a threshold without an
    eligible image is a tick with the count 0 and no point."""
    counts = sensitivity.groupby("score_threshold")["n_eligible"].max()
    thresholds = np.sort(counts.index[counts > 0].to_numpy())
    order = [m for m in (*CAM_METHODS, *BASELINE_METHODS) if m in set(sensitivity["method"])]
    every = np.sort(counts.index.to_numpy())
    spacing = float(np.min(np.diff(every))) if len(counts) > 1 else 0.05
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
    ax.set_xlim(every.min() - spacing * 0.6, every.max() + spacing * 0.6)
    ax.set_xticks(every)
    # the bare count under each threshold: "n = 110" four times under a narrow panel touched
    ax.set_xticklabels([f"{t:.2f}\n{int(counts.loc[t])}" for t in every])
    for tick, t in zip(ax.get_xticklabels(), every):
        if counts.loc[t] == 0:
            tick.set_color("dimgrey")
    ax.set_ylim(-AXIS_MARGIN, 1 + AXIS_MARGIN)
    ax.set_xlabel("Temperature-scaled score threshold\n(under each: eligible images n)")
    ax.set_ylabel("Peak outside lesion (95% CI)")
    if len(thresholds) == 0:
        ax.text(0.5, 0.5, "n = 0 at every threshold:\nno image to estimate from",
                transform=ax.transAxes, ha="center", va="center", fontsize=8, color="dimgrey",
                in_layout=False)
    else:
        ax.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))


@artefacts.computed_by
def figure2_calibration_threshold(reliability: pd.DataFrame, sensitivity: pd.DataFrame,
                                  not_validated=(), score_threshold: float | None = None,
                                  ece_intervals: pd.DataFrame | None = None):
    """Figure 2 with panels A (reliability) and B (failure vs threshold); 183 mm wide.
    ``not_validated``: CAM methods whose labels carry the validity gate's mark;
    ``ece_intervals``: 02's ``table_s2_ece_intervals`` (the ECEs; their intervals and the change
    from scaling are in ``figure2_caption``, outside the image). Panel A is square and keeps
    about 40% of the width: its legend sits inside it, panel B's beside B."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(style.DOUBLE_COLUMN_INCHES - 0.2, 3.4),
                                      layout="constrained", gridspec_kw={"width_ratios": [1, 1.05]})
    draw_reliability(left, reliability, ece_intervals, legend="inside")
    draw_threshold_sensitivity(right, sensitivity, not_validated, score_threshold)
    for ax, letter, title in ((left, "A", "Reliability"), (right, "B", "Failure by threshold")):
        style.panel_title(ax, letter, title, pad=22)   # above the two rows of bin counts
    if "eigencam" in set(sensitivity["method"]):     # the asterisk's note
        style.footnote(fig, EIGEN_FOOTNOTE)
    return fig


def figure2_caption(reliability: pd.DataFrame, sensitivity: pd.DataFrame,
                    ece_intervals: pd.DataFrame | None = None) -> str:
    """Figure 2's caption, computed from its tables (test n; ECEs with their intervals and the
    change from scaling when ``ece_intervals`` is given; eligible n per threshold): what the
    image no longer carries in its own text."""
    n_test = int(reliability.loc[reliability["score"] == "Raw", "count"].sum())
    counts = sensitivity.groupby("score_threshold")["n_eligible"].max()
    eligible = ", ".join(f"{int(n)} at ≥ {t:.2f}" for t, n in counts.items())
    eces = ""
    if ece_intervals is not None:
        parts = [f"{kind.lower()} {row['ece']:.3f} (95% CI {row['ci_low']:.3f} to {row['ci_high']:.3f})"
                 for kind in ("Raw", "Temperature-scaled") if (row := _ece_row(ece_intervals, kind)) is not None]
        change = _ece_row(ece_intervals, "Change")
        eces = (" ECE: " + "; ".join(parts)
                + (f"; change after scaling {change['ece']:+.3f} (95% CI {change['ci_low']:+.3f} to "
                   f"{change['ci_high']:+.3f}, paired image bootstrap, n = {int(change['n'])})"
                   if change is not None else "") + ".")
    return (f"Figure 2. A: reliability of raw and temperature-scaled scores on the test split "
            f"(n = {n_test} images, 10 equal-width bins; numbers above the panel are the scaled "
            f"score's bin counts; open markers: bins of fewer than {MIN_BIN_COUNT} images; bars: "
            f"Wilson 95% CIs).{eces} B: share of high-score masked images whose map's peak lies "
            f"outside the lesion, with 95% bootstrap CIs; CAMs solid, the baselines they are "
            f"judged against (random heatmap, centre and salience baselines) dashed; eligible "
            f"images: {eligible}. {EIGEN_FOOTNOTE}")


@artefacts.computed_by
def plot_reliability_with_counts(reliability: pd.DataFrame, ece_intervals: pd.DataFrame | None = None):
    """Figure: (A) reliability raw vs temperature-scaled (``draw_reliability``, as Figure 2A), (B)
    images per score bin. ``reliability``: ``reliability_raw_vs_scaled`` output; ``ece_intervals``
    (optional): ``calibration.ece_intervals`` of the same split."""
    fig, (curve_ax, count_ax) = plt.subplots(1, 2, figsize=(7.2, 3.8), layout="constrained",
                                             gridspec_kw={"width_ratios": [1, 1.1]})
    draw_reliability(curve_ax, reliability, ece_intervals)
    style.panel_title(curve_ax, "A", "Reliability", pad=22)   # above the two rows of bin counts
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
