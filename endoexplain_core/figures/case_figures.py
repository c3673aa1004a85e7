"""Figure 3 (rule-selected cases) and Figure 4 (robustness).

Figure 3 selection rule (docs/protocol.md), applied to the primary checkpoint's audit table
before anything is drawn, among high-score images (scaled score >= threshold), CAMs only:
- miss: a clear miss is a CAM peak at least ``MISS_MARGIN_FRACTION`` of the input side
  outside the lesion; among the images (other than the discordant case) where more than half
  of the CAM peaks clearly miss, and of them those with the most, the one whose median miss
  distance is closest to the median over all clear misses (a typical miss, not the worst one);
- discordant: at least one CAM peak inside and one outside the mask; maximise the balance
  min(#inside, #outside), then the across-CAM IoU range (max - min), then the score;
- consensus: all five CAM peaks inside; maximise the mean IoU;
- remaining ties: the smallest sample id.
A method whose maps are degenerate on the checkpoint (``analysis.map_diagnostics``) is drawn,
marked with ``marks.DEGENERATE_MARK``, but has no vote: its peak position is the tie-break of a
flat or border-piled map, so counting it would leave no consensus case on a checkpoint where it
always "misses". Each row's title counts its own proper CAM peaks outside the lesion
(``row_title``).
The drawn maps (five CAMs, centre baseline, random heatmap, salience baseline) are recomputed
from the checkpoint and checked against the table by ``analysis.case_maps.redraw_cases``; this
module only selects and draws.
"""

from __future__ import annotations

import textwrap

import matplotlib
import matplotlib.pyplot as plt
from matplotlib import patheffects
import numpy as np
import pandas as pd

from matplotlib.legend_handler import HandlerTuple

from endoexplain_core import presentation
from endoexplain_core.methods import BASELINE_METHODS, CAM_METHODS, MAP_METHODS, METHOD_COLOURS, method_label
from endoexplain_core.marks import DEGENERATE_MARK, EIGEN_FOOTNOTE
from endoexplain_core.figures.style import (ARCH_COLOURS, ARCH_LABELS, ARCH_MARKERS, CONTOUR_COLOUR,
                                            DOUBLE_COLUMN_INCHES, HEATMAP_CMAP, PEAK_COLOUR,
                                            RANDOM_REFERENCE, REFERENCE_LINESTYLE, as_written, checkpoint_label, footnote,
                                            panel_title, error_extents, two_line_label)

HEATMAP_ALPHA = 0.55
MISS_MARGIN_FRACTION = 0.05   # a typical miss: median CAM peak this share of the side outside
FIGURE3_WIDTH_INCHES = 7.2    # 183 mm, a journal's double column


def select_figure3_cases(table: pd.DataFrame, score_threshold: float,
                         image_size: int | None = None, degenerate=()) -> dict[str, str | None]:
    """Sample ids of the typical-miss, discordant and consensus cases (None when no case
    qualifies), in drawing order. ``table``: the primary checkpoint's audit rows on one
    dataset. ``image_size``: the input side behind ``peak_lesion_distance``; a clear miss is a
    defined CAM peak at least ``MISS_MARGIN_FRACTION`` of it outside the lesion (without it, or
    in a table without distances, any peak outside the lesion counts). ``degenerate``: CAM
    methods whose maps are degenerate on this checkpoint; they do not vote.
    """
    voting = [m for m in CAM_METHODS if m not in degenerate]
    cam_rows = table[table["method"].isin(voting) & (table["scaled_score"] >= score_threshold)]
    per_image = cam_rows.groupby("sample_id").agg(
        outside=("peak_outside_mask", "sum"), n_maps=("method", "size"),
        iou_min=("iou", "min"), iou_max=("iou", "max"), iou_mean=("iou", "mean"),
        score=("scaled_score", "first")).reset_index()
    per_image["inside"] = per_image["n_maps"] - per_image["outside"]
    per_image["balance"] = np.minimum(per_image["inside"], per_image["outside"])
    per_image["iou_range"] = per_image["iou_max"] - per_image["iou_min"]
    discordant = per_image[(per_image["inside"] > 0) & (per_image["outside"] > 0)]
    discordant = discordant.sort_values(["balance", "iou_range", "score", "sample_id"],
                                        ascending=[False, False, False, True])
    consensus = per_image[per_image["outside"] == 0]
    consensus = consensus.sort_values(["iou_mean", "sample_id"], ascending=[False, True])
    discordant_id = discordant["sample_id"].iloc[0] if len(discordant) else None
    return {"miss": _typical_miss(cam_rows, image_size, exclude=discordant_id),
            "discordant": discordant_id,
            "consensus": consensus["sample_id"].iloc[0] if len(consensus) else None}


def _typical_miss(cam_rows: pd.DataFrame, image_size: int | None, exclude: str | None) -> str | None:
    """The typical high-score miss: among the images where most CAM peaks clearly miss (more
    than half of the image's defined CAM peaks; other than ``exclude``, the discordant case), those with the
    most misses, and of them the one whose median miss distance is closest to the median over
    every clear miss; ties by sample id. None when no image has a majority of clear misses."""
    defined = cam_rows[~cam_rows["constant_map"].astype(bool)] if "constant_map" in cam_rows else cam_rows
    n_cams = defined.groupby("sample_id")["method"].size()   # maps with a peak
    misses = defined[defined["peak_outside_mask"].astype(bool)]
    has_distance = "peak_lesion_distance" in misses and image_size
    if has_distance:
        misses = misses[misses["peak_lesion_distance"] >= MISS_MARGIN_FRACTION * image_size]
    distance = misses["peak_lesion_distance"] if has_distance else misses["scaled_score"]
    per_image = misses.assign(distance=distance).groupby("sample_id").agg(
        n_misses=("method", "size"), distance=("distance", "median")).reset_index()
    if per_image.empty:
        return None
    majority = 2 * per_image["n_misses"].to_numpy() > per_image["sample_id"].map(n_cams).to_numpy()
    per_image = per_image[majority & (per_image["sample_id"] != exclude).to_numpy()]
    if per_image.empty:
        return None
    most = per_image[per_image["n_misses"] == per_image["n_misses"].max()]
    most = most.assign(off=(most["distance"] - distance.median()).abs())
    return most.sort_values(["off", "sample_id"])["sample_id"].iloc[0]


# Why HiResCAM can look inverted (docs/protocol.md, "HiResCAM dark on the polyp").
HIRESCAM_NOTE = ("HiResCAM can be dark on the lesion (negative pre-activations enter it with "
                 "flipped sign); the gate decides whether it is read. ")
ROLE_TITLES = {"miss": "High-score miss", "discordant": "Discordant CAMs",
               "consensus": "Consensus"}
MISSING_ROW_REASONS = {
    "miss": "no high-score image other than the discordant case has most of its CAM peaks clearly "
            "outside the lesion",
    "discordant": "no high-score image has CAM peaks both inside and outside the lesion",
    "consensus": "no high-score image has all its CAM peaks inside the lesion",
}


def row_title(role: str, rows: dict, degenerate=()) -> str:
    """A Figure 3 row's title, read from the row's own maps: the role, then how many of its
    CAM peaks lie outside the lesion (a constant map has no peak and is counted apart; a method
    in ``degenerate`` is not counted), e.g. "High-score miss: 4 of 5 CAM peaks outside the
    lesion"."""
    cams = [rows[m] for m in CAM_METHODS if m in rows and m not in degenerate]
    constant = sum(bool(info["constant_map"]) for info in cams)
    outside = sum(bool(info["peak_outside_mask"]) and not info["constant_map"] for info in cams)
    title = (f"{ROLE_TITLES.get(role, role.capitalize())}: {outside} of {len(cams) - constant} "
             "CAM peaks outside the lesion")
    return title + (f" ({constant} constant map{'s' if constant > 1 else ''})" if constant else "")


def format_score(score: float) -> str:
    """A scaled score for a caption: three decimals, never a rounded "1.000"."""
    return ">0.999" if score > 0.999 else "<0.001" if score < 0.001 else f"{score:.3f}"


DEGENERATE_FIGURE_NOTE = (f"{DEGENERATE_MARK} degenerate maps on this checkpoint "
                          "(table_map_degeneracy): drawn, but not used to choose the cases or "
                          "counted in the row titles.")
PANEL_TITLES = {"random": "Random", "centre": "Centre", "salience": "Salience"}   # Figure 3's narrow columns


def _panel_note(info: dict, tied: int = 1) -> str:
    """Under a map: its IoU, where its peak is ("in", or how many pixels "out") and, when the
    maximum is tied, over how many pixels (the audit scores the first of them)."""
    if info["constant_map"]:
        return f"IoU {info['iou']:.2f}\nconstant"
    ties = f"\n{tied} tied peaks" if tied > 1 else ""
    if not info["peak_outside_mask"]:
        return f"IoU {info['iou']:.2f}\nin{ties}"
    distance = info.get("distance")
    far = f" {distance:.0f} px" if distance is not None and np.isfinite(distance) else ""
    return f"IoU {info['iou']:.2f}\nout{far}{ties}"


def draw_figure3(drawn: list[dict], roles=("miss", "discordant", "consensus"), *,
                 top_fraction: float, not_validated=(), degenerate=()):
    """Draw Figure 3 from prepared rows (no model needed; tested from fixed arrays).

    ``drawn``: one dict per drawn case: role, sample_id, score, rgb (float (S, S, 3) in
    [0, 1]), mask (bool/float (S, S)), maps (method -> float (S, S) in [0, 1]; the CAMs and,
    when present, the centre, random and salience baselines), tops (method -> bool (S, S) top
    area; optional), rows (method -> {"iou", "constant_map", "peak_outside_mask",
    "distance"}). Each role of ``roles`` is one row, lettered A, B, C..., titled with its role
    and score; a role with no case gets a full-width note saying why instead of empty panels.
    Panels: the frame with the lesion contour, then each map over the greyscale frame (inferno,
    one colour scale), cyan lesion contour, dashed white top-area outline (not for the random
    heatmap, whose top area is scattered pixels), white peak marker on every tied maximum
    (never clipped at the frame edge). The colour bar has its own column, so every row's panels
    line up. The caption (what the marks mean, the sample ids) is ``figure3_caption``, outside
    the image. 183 mm wide. Methods in ``not_validated`` (the validity gate's failing methods)
    carry its mark; methods in ``degenerate`` (maps degenerate on this checkpoint) carry
    ``DEGENERATE_MARK`` and are left out of the row titles' counts.
    """
    by_role = {row["role"]: row for row in drawn}
    degenerate = frozenset(degenerate)
    methods = [m for m in MAP_METHODS if any(m in row["maps"] for row in drawn)] or list(CAM_METHODS)
    heights = [1.0 if role in by_role else 0.18 for role in roles]
    fig = plt.figure(figsize=(FIGURE3_WIDTH_INCHES, 0.75 + 1.3 * sum(heights)), layout="constrained")
    rows_part, bar_part = fig.subfigures(1, 2, width_ratios=[11, 1]) if by_role else (fig, None)
    subfigures = np.atleast_1d(rows_part.subfigures(len(roles), 1, height_ratios=heights))
    for index, (subfigure, role) in enumerate(zip(subfigures, roles)):
        letter = chr(ord("A") + index)
        if role not in by_role:
            ax = subfigure.subplots()
            ax.axis("off")
            ax.text(0.0, 0.5, rf"$\mathbf{{{letter}}}$" + f"  {ROLE_TITLES.get(role, role.capitalize())}: "
                    f"not drawn \u2013 {MISSING_ROW_REASONS.get(role, 'no case meets the selection rule')}.",
                    transform=ax.transAxes, ha="left", va="center", fontsize=7)
            continue
        _draw_case_row(subfigure, letter, by_role[role], role, methods, not_validated, degenerate)
    if bar_part is not None:   # one colour scale for every map: its bar in its own column
        scale = matplotlib.cm.ScalarMappable(norm=matplotlib.colors.Normalize(0, 1), cmap=HEATMAP_CMAP)
        colour_bar = bar_part.colorbar(scale, cax=bar_part.add_axes([0.05, 0.3, 0.12, 0.4], label="<colorbar>"))
        colour_bar.set_label("map value", fontsize=6)
        colour_bar.ax.tick_params(labelsize=6)
    notes = ([EIGEN_FOOTNOTE] if "eigencam" in methods else []) + \
        ([DEGENERATE_FIGURE_NOTE] if degenerate & set(methods) else [])
    if notes:
        footnote(fig, " ".join(notes))
    return fig


def _draw_case_row(subfigure, letter: str, case: dict, role: str, methods, not_validated,
                   degenerate=()) -> None:
    """One drawn row of Figure 3: its title, the frame, then each method's map."""
    subfigure.suptitle(rf"$\mathbf{{{letter}}}$  {row_title(role, case['rows'], degenerate)} "
                       f"(scaled score {format_score(case['score'])})",
                       x=0.0, ha="left", fontsize=8, fontweight="bold")
    axes = subfigure.subplots(1, 1 + len(methods))
    grey = np.asarray(case["rgb"]) @ np.array([0.299, 0.587, 0.114])
    mask = np.asarray(case["mask"], dtype=float)
    axes[0].imshow(case["rgb"])
    axes[0].contour(mask, levels=[0.5], colors=CONTOUR_COLOUR, linewidths=0.8)
    axes[0].set_title("Frame", fontsize=7)
    for ax, method in zip(axes[1:], methods):
        title = PANEL_TITLES.get(method, method_label(method, not_validated))
        ax.set_title(title + (DEGENERATE_MARK if method in degenerate else ""), fontsize=7)
        if method in case["maps"]:
            _draw_map_panel(ax, method, case, grey, mask)
        else:
            ax.axis("off")
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])


def figure3_caption(selection: dict[str, str | None], methods=MAP_METHODS, *, top_fraction: float,
                    degenerate=()) -> str:
    """Figure 3's caption, printed beside the image (never in it): the marks, the baselines, the
    scale, the notes its methods call for (``degenerate``: methods with degenerate maps on this
    checkpoint) and the drawn cases' ids (``selection``: role -> sample id or None, in row
    order), in Markdown (an id's markup characters escaped)."""
    ids = [f"{chr(ord('A') + index)} = {presentation.markdown_literal(sample_id)}"
           for index, sample_id in enumerate(selection.values()) if sample_id]
    return ("Figure 3. High-score cases chosen by rule (rows: a typical miss by most CAMs, "
            "discordant CAMs, consensus). "
            f"Cyan: lesion contour; dashed white: the map's top {top_fraction:.0%} area; "
            "white \u00d7: peak; where the maximum is tied, every tied pixel is marked (small "
            "\u00d7) and the panel says how many (\"k tied peaks\"; the audit scores the first "
            "in row-major order); in / out k px: the peak inside the lesion or k pixels from it; "
            "constant: a constant map has no peak; IoU of the top area with the lesion; k px at "
            "the input size (a CAM is upsampled from the target layer's coarse grid, so several "
            "CAMs can share one peak). The small box at the lower left of some frames is the "
            "scope-position overlay of the frame, not an annotation. Random: random heatmap; "
            "Centre: centre baseline; Salience: the frame's smoothed gradient magnitude (no "
            "model): the baselines every CAM is judged against. Maps min-max normalised on one "
            "inferno scale (dark = 0, yellow = 1). "
            + (HIRESCAM_NOTE if "hirescam" in methods else "")
            + EIGEN_FOOTNOTE
            + (" " + DEGENERATE_FIGURE_NOTE if set(degenerate) & set(methods) else "")
            + (" Cases: " + "; ".join(ids) + "." if ids else ""))


def _draw_map_panel(ax, method: str, case: dict, grey: np.ndarray, mask: np.ndarray) -> None:
    """One map of a Figure 3 row over the greyscale frame: lesion contour, top-area outline,
    peak marker and the panel's note (in / out, IoU)."""
    rendered = np.asarray(case["maps"][method])
    info = case["rows"][method]
    ax.imshow(grey, cmap="gray", vmin=0, vmax=1)
    ax.imshow(rendered, cmap=HEATMAP_CMAP, vmin=0, vmax=1, alpha=HEATMAP_ALPHA)
    ax.contour(mask, levels=[0.5], colors=CONTOUR_COLOUR, linewidths=0.8)
    top = (case.get("tops") or {}).get(method)
    # The random map's top area is scattered pixels by design, and a constant map's is set
    # by the tie-break order alone (stripes): no outline to draw for either.
    if top is not None and method != "random" and not info["constant_map"] and top.any() and not top.all():
        ax.contour(np.asarray(top, dtype=float), levels=[0.5], colors="white",
                   linewidths=0.6, linestyles="--")
    tied = _tied_maxima(rendered) if not info["constant_map"] else np.empty((0, 2), dtype=int)
    # A peak on the frame edge is half outside the image: a dark outline keeps the white
    # marker visible on the white page as well.
    outline = [patheffects.withStroke(linewidth=2.5, foreground="black")]
    if len(tied):
        ax.plot(tied[0, 1], tied[0, 0], marker="x", color=PEAK_COLOUR, markersize=5, mew=1.3,
                clip_on=False, zorder=5, path_effects=outline)
    if len(tied) > 1:   # the other tied maxima: the first is only first in row-major order
        ax.plot(tied[1:, 1], tied[1:, 0], linestyle="none", marker="x", color=PEAK_COLOUR,
                markersize=2.5, mew=0.8, clip_on=False, zorder=5, path_effects=outline)
    ax.set_xlabel(_panel_note(info, max(len(tied), 1)), fontsize=6.5, labelpad=2)


def _tied_maxima(rendered: np.ndarray) -> np.ndarray:
    """(k, 2) row, col of every pixel equal to the map's maximum, in row-major order (the
    first is the audit's peak, ``kernels.metrics.peak_location``)."""
    return np.argwhere(rendered == rendered.max())



NOT_GATED = "not gated at this architecture"


def figure4(robustness: pd.DataFrame, *, n_images: int | None = None, not_validated=(), left_out=(),
            gated_arch: str | None = None, degeneracy: pd.DataFrame | None = None):
    """Figure 4: failure on own (A) and fixed (B) subsets, temperature-scaled logit drop over all
    images (C).

    ``robustness``: ``summaries.checkpoint_robustness`` output (controls are left out). Points
    are architecture means over seeds, small dots the seeds, whiskers the seed min-max; CAM
    methods on the x axis, then in A and B the baselines the CAMs are judged against (random
    heatmap, centre and salience baselines, when the table has them; a dashed line carries the
    centre baseline across the CAMs). Colour and marker encode the architecture only (tick
    labels stay black). An architecture with no eligible image in a panel is left out of that
    panel and named in it. Open markers: the method is identical by construction to another CAM
    at that architecture's layer (``identical_with``). Panel C: each checkpoint's drops divided
    by its temperature (``temperature``; raw logits when the table has none), so checkpoints
    whose temperatures differ twentyfold share one scale; it ends with each checkpoint's own
    random-deletion control (``random_deletion_mean``) in the reference colour.
    ``n_images``: images of the audit pool (panel C's n; from the table if None).
    ``not_validated``: CAM methods whose labels carry the validity gate's mark; ``gated_arch``:
    the architecture the gate ran at (None: not said); every other architecture's legend entry
    reads ``NOT_GATED``, so the mark is never read as their verdict. ``left_out``: checkpoint
    ids not drawn (they did not learn), named in the note. ``degeneracy``:
    ``map_diagnostics.degenerate_maps`` rows of the drawn checkpoints; a checkpoint x CAM whose
    maps are degenerate is drawn as a cross and left out of its architecture's mean and whiskers,
    as ``table4_over_seeds`` leaves it out (None: every map counts). 183 mm wide.
    """
    matrix = _mark_degenerate_rows(robustness[robustness["control"] == "none"], degeneracy)
    cams = matrix[matrix["method"].isin(CAM_METHODS)]
    baselines = [m for m in BASELINE_METHODS if m in set(matrix["method"])
                 and matrix.loc[matrix["method"] == m, ["failure_own", "failure_fixed"]].notna().any().any()]
    archs = sorted(set(cams["arch"]), key=lambda a: (list(ARCH_LABELS).index(a)
                                                    if a in ARCH_LABELS else len(ARCH_LABELS), a))
    drops, scaled = _temperature_scaled(cams)
    has_random = "random_deletion_mean" in cams.columns and cams["random_deletion_mean"].notna().any()
    has_identical = "identical_with" in cams.columns and (cams["identical_with"].fillna("") != "").any()
    fig, axes = plt.subplot_mosaic([["A", "B"], ["C", "."]], figsize=(DOUBLE_COLUMN_INCHES, 5.6),
                                   layout="constrained")
    shared = dict(archs=archs, not_validated=not_validated, has_identical=has_identical)
    for letter, spec in _figure4_panels(cams, n_images, scaled).items():
        rows = drops if letter == "C" else matrix[matrix["method"].isin((*CAM_METHODS, *baselines))]
        methods = list(CAM_METHODS) if letter == "C" else [*CAM_METHODS, *baselines]
        _draw_figure4_panel(axes[letter], letter, rows, methods, spec, has_random=has_random, **shared)
    _shared_legend(axes["C"], [axes[k] for k in "ABC"], archs, gated_arch if not_validated else None)
    footnote(fig, " ".join(_figure4_notes(cams, has_random=has_random, has_identical=has_identical,
                                          left_out=left_out, scaled=scaled, baselines=baselines,
                                          gated_arch=gated_arch if not_validated else None)))
    return fig


def _mark_degenerate_rows(matrix: pd.DataFrame, degeneracy: pd.DataFrame | None) -> pd.DataFrame:
    """``matrix`` with a boolean ``degenerate_maps`` column: True for a checkpoint x method that
    ``degeneracy`` (``map_diagnostics.degenerate_maps`` rows) flags."""
    flagged = set()
    if degeneracy is not None and len(degeneracy):
        chosen = degeneracy[degeneracy["degenerate"].astype(bool)]
        flagged = set(zip(chosen["checkpoint_id"], chosen["method"]))
    return matrix.assign(degenerate_maps=[(c, m) in flagged for c, m in zip(matrix["checkpoint_id"], matrix["method"])])


def _temperature_scaled(cams: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """(rows, scaled): the CAM rows with ``logit_drop_all`` and ``random_deletion_mean`` divided
    by each checkpoint's temperature, so that a drop is in the unit of the calibrated score
    (z/T); unchanged (scaled False) when a temperature is missing or not positive."""
    if "temperature" not in cams.columns or cams.empty or not (cams["temperature"] > 0).all():
        return cams, False
    scaled = cams.assign(logit_drop_all=cams["logit_drop_all"] / cams["temperature"])
    if "random_deletion_mean" in cams.columns:
        scaled["random_deletion_mean"] = cams["random_deletion_mean"] / cams["temperature"]
    return scaled, True


def _figure4_panels(cams: pd.DataFrame, n_images: int | None, scaled: bool) -> dict[str, tuple]:
    """Panel letter -> (column, title, n text, y label) of Figure 4."""
    per_checkpoint = cams.drop_duplicates("checkpoint_id")
    own_n = per_checkpoint["n_own"]
    fixed_n = int(per_checkpoint["n_fixed"].max()) if len(per_checkpoint) else 0
    own_text = (f"n = {own_n.min()}\u2013{own_n.max()} per checkpoint" if own_n.min() != own_n.max()
                else f"n = {own_n.min()} per checkpoint")
    pool = n_images if n_images is not None else "all"
    drop_label = ("Mean drop of z/T (temperature-scaled logit)" if scaled
                  else "Mean drop of the target logit (raw logits)")
    return {"A": ("failure_own", "Own high-score subset", own_text, "Peak outside lesion (share)"),
            "B": ("failure_fixed", "Primary's high-score subset", f"n = {fixed_n} images",
                  "Peak outside lesion (share)"),
            "C": ("logit_drop_all", "Drop after deleting the top area, all images",
                  f"n = {pool} images", drop_label)}


def _draw_figure4_panel(ax, letter: str, rows: pd.DataFrame, methods: list[str], spec: tuple, *,
                        archs, not_validated, has_identical: bool, has_random: bool) -> None:
    """One Figure 4 panel: every architecture's points, its title with n, its ticks."""
    column, title, n_text, ylabel = spec
    offsets = np.linspace(-0.22, 0.22, max(len(archs), 1))
    absent = []
    for k, arch in enumerate(archs):
        of_arch = rows[rows["arch"] == arch]
        if of_arch.loc[of_arch["method"].isin(CAM_METHODS), column].notna().sum() == 0:
            absent.append(ARCH_LABELS.get(arch, arch))
            continue
        _draw_architecture(ax, of_arch, arch, column, offsets[k], methods, first=k == 0,
                           has_identical=has_identical, has_random=has_random and letter == "C")
    if archs and len(absent) == len(archs):
        n_text = "n = 0: no eligible image"
        ax.text(0.5, 0.5, "no eligible images\nin any checkpoint", transform=ax.transAxes,
                ha="center", color="dimgrey", in_layout=False)
    elif absent:
        n_text = textwrap.fill(f"{n_text}; no eligible image: {', '.join(absent)}", width=60)
    ticks = np.arange(len(methods))
    labels = [PANEL_TITLES.get(m) or two_line_label(method_label(m, not_validated)) for m in methods]
    n_cams = len(CAM_METHODS)
    if len(methods) > n_cams or (letter == "C" and has_random):
        ax.axvline(n_cams - 0.5 + 0.15, color="0.8", lw=0.6)      # CAMs | references
    if letter == "C":
        ax.axhline(0.0, color="grey", lw=0.5)
        if has_random:
            ticks, labels = np.append(ticks, n_cams + 0.3), labels + ["Random\ndeletion"]
        ax.set_xlim(-0.5, n_cams + (0.8 if has_random else -0.5))
    else:
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlim(-0.5, len(methods) - 0.5 + (0.3 if len(methods) > n_cams else 0.0))
        _centre_guide(ax, rows, column)
    # Two-line horizontal labels: rotated labels would run into each other.
    ax.set_xticks(ticks, labels, fontsize=6.5)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_ylabel(ylabel, fontsize=7.5)
    panel_title(ax, letter, f"{title}\n{n_text}", fontsize=7.5)


def _centre_guide(ax, rows: pd.DataFrame, column: str) -> None:
    """The centre baseline's mean over checkpoints as a dashed line across the CAMs: a CAM
    above it fails more often than a fixed map at the frame's centre."""
    centre = rows.loc[rows["method"] == "centre", column].dropna()
    if len(centre):
        ax.plot([-0.5, len(CAM_METHODS) - 0.5], [centre.mean()] * 2, color=METHOD_COLOURS["centre"],
                lw=0.8, ls=REFERENCE_LINESTYLE, zorder=0, label="Centre baseline, mean over checkpoints")


def _draw_architecture(ax, of_arch: pd.DataFrame, arch: str, column: str, offset: float,
                       methods: list[str], *, first: bool, has_identical: bool, has_random: bool) -> None:
    """One architecture in one Figure 4 panel: seed mean (filled, or open when identical by
    construction) with min-max whiskers and a dot per seed for each of ``methods``; a seed whose
    maps of a method are degenerate (``degenerate_maps``) is a cross, outside the mean and the
    whiskers; with ``has_random`` (panel C) its random-deletion control."""
    degenerate = (of_arch["degenerate_maps"].astype(bool) if "degenerate_maps" in of_arch.columns
                  else pd.Series(False, index=of_arch.index))
    proper = of_arch[~degenerate]
    values = proper.groupby("method")[column].agg(["mean", "min", "max"]).reindex(methods)
    identical = (of_arch.groupby("method")["identical_with"].first().reindex(methods)
                 .fillna("") != "") if has_identical else pd.Series(False, index=methods)
    seeds = of_arch.loc[of_arch[column].notna(), "checkpoint_id"].nunique()
    x = np.arange(len(methods)) + offset
    colour = ARCH_COLOURS.get(arch, "grey")
    marker = ARCH_MARKERS.get(arch, "o")
    ax.errorbar(x, values["mean"], yerr=error_extents(values["mean"], values["min"], values["max"]),
                fmt="none", ecolor=colour, capsize=2, elinewidth=0.8, clip_on=False)
    for rows, style in ((proper, dict(marker=".", ms=2.5, alpha=0.7)),
                        (of_arch[degenerate], dict(marker="x", ms=3.5, mew=0.9, alpha=0.9))):
        per_seed = rows.pivot_table(index="checkpoint_id", columns="method", values=column).reindex(columns=methods)
        for _, seed_values in per_seed.iterrows():
            ax.plot(x, seed_values.to_numpy(), linestyle="none", color=colour, clip_on=False, **style)
    for filled in (True, False):
        chosen = (~identical.to_numpy()) if filled else identical.to_numpy()
        if chosen.any():
            ax.plot(x[chosen], values["mean"].to_numpy()[chosen], linestyle="none", marker=marker,
                    ms=4, color=colour, markerfacecolor=colour if filled else "white", clip_on=False,
                    label=f"{ARCH_LABELS.get(arch, arch)} ({seeds} seed{'' if seeds == 1 else 's'})" if filled else None)
    if has_random:
        # this architecture's checkpoints, each against its own random-deletion control
        controls = of_arch.drop_duplicates("checkpoint_id")["random_deletion_mean"].dropna()
        reference_x = len(CAM_METHODS) + 0.3 + offset
        ax.errorbar([reference_x], [controls.mean()],
                    yerr=error_extents([controls.mean()], [controls.min()], [controls.max()]),
                    fmt="none", ecolor=RANDOM_REFERENCE["color"], capsize=2, elinewidth=0.8)
        ax.plot([reference_x], [controls.mean()], linestyle="none", marker=marker, ms=4,
                color=RANDOM_REFERENCE["color"], label=RANDOM_DELETION_LABEL)


RANDOM_DELETION_LABEL = "Random deletion (own control), marker by architecture"


def _shared_legend(ax, axes, archs: list[str], gated_arch: str | None) -> None:
    """One legend for every panel, in the empty cell right of panel C: architectures in their
    order (each saying whether the gate ran at it, when ``gated_arch`` is given), then the
    references; an entry drawn with several markers (the random-deletion control, one per
    architecture) shows them all."""
    entries: dict[str, list] = {}
    for panel in axes:
        for handle, label in zip(*panel.get_legend_handles_labels()):
            entries.setdefault(label, []).append(handle)
    order = [ARCH_LABELS.get(a, a) for a in archs]
    labels = sorted(entries, key=lambda l: next((i for i, a in enumerate(order) if l.startswith(a)), len(order)))
    if not labels:   # no learned checkpoint: the panels say so, there is nothing to key
        return
    handles = [_one_per_marker(entries[label]) for label in labels]
    shown = [_gate_status(label, archs, gated_arch) for label in labels]
    legend = ax.legend(handles, shown, loc="center left", bbox_to_anchor=(1.1, 0.5), frameon=False,
                       fontsize=7, handler_map={tuple: HandlerTuple(ndivide=None, pad=0.3)})
    legend.set_in_layout(False)      # it sits in the empty cell beside C, not in C's width


def _one_per_marker(handles: list):
    """A legend handle: the single handle, or a tuple of one handle per distinct marker."""
    distinct = list({h.get_marker() if hasattr(h, "get_marker") else id(h): h for h in handles}.values())
    return distinct[0] if len(distinct) == 1 else tuple(distinct)


def _gate_status(label: str, archs: list[str], gated_arch: str | None) -> str:
    """An architecture's legend label with the gate's reach: "(gated: \u2020 marks its verdict)" at
    ``gated_arch``, ``NOT_GATED`` at every other; other labels unchanged."""
    if gated_arch is None:
        return label
    for arch in archs:
        if label.startswith(ARCH_LABELS.get(arch, arch)):
            status = "gated here: \u2020 is its verdict" if arch == gated_arch else NOT_GATED
            return f"{label[:-1]};\n{status})" if label.endswith(")") else f"{label}\n({status})"
    return label


def _figure4_notes(matrix: pd.DataFrame, *, has_random: bool, has_identical: bool,
                   left_out, scaled: bool = False, baselines=(), gated_arch: str | None = None) -> list[str]:
    """Figure 4's footnote sentences: what points and whiskers are, the baselines, panel C's
    unit, the random control, the gate's reach, the identical-by-construction groups, the
    left-out checkpoints and bound temperatures."""
    notes = ["Points: architecture mean over seeds; dots: seeds; whiskers: seed minimum to maximum."]
    if "degenerate_maps" in matrix.columns and matrix["degenerate_maps"].any():
        notes.append(f"Crosses: a seed whose maps of that method are degenerate ({DEGENERATE_MARK}, "
                     "table_map_degeneracy rules), drawn but left out of the mean and whiskers.")
    if baselines:
        notes.append("A, B, right: the baselines each CAM is judged against, per checkpoint; dashed: "
                     "the centre baseline's mean across the CAMs.")
    if scaled:
        temperatures = matrix.drop_duplicates("checkpoint_id")["temperature"]
        notes.append(f"C: each checkpoint's drops divided by its temperature T ({temperatures.min():.2f}"
                     f"\u2013{temperatures.max():.2f}): raw logits of checkpoints with different T are "
                     "not on one scale.")
    if has_random:
        notes.append("C, right: each checkpoint's random-deletion control (same area, random pixels), "
                     "marker by architecture.")
    if gated_arch is not None:
        others = [ARCH_LABELS.get(a, a) for a in dict.fromkeys(matrix["arch"]) if a != gated_arch]
        notes.append(f"\u2020: the validity gate's verdict at {ARCH_LABELS.get(gated_arch, gated_arch)}, "
                     "the only architecture it ran at" + (f"; {', '.join(others)}: {NOT_GATED}" if others else "")
                     + ".")
    if has_identical:
        notes.append(_identical_note(matrix))
    if left_out:
        notes.append("Left out (did not learn: validation AUPRC or flat maps, table_checkpoint_learning): " + ", ".join(checkpoint_label(c) for c in left_out) + ".")
    if "temperature_at_bound" in matrix.columns and matrix["temperature_at_bound"].any():
        bound = sorted(matrix.loc[matrix["temperature_at_bound"].astype(bool), "checkpoint_id"].unique())
        notes.append("Temperature at its search bound (own subset set by the bound): "
                     + ", ".join(checkpoint_label(c) for c in bound) + ".")
    notes.append(EIGEN_FOOTNOTE)
    return notes


def _identical_note(matrix: pd.DataFrame) -> str:
    """The open markers' sentence: the CAM groups identical by construction, per architecture."""
    groups = []
    for arch, rows in matrix[matrix["identical_with"].fillna("") != ""].groupby("arch", sort=False):
        first = rows.drop_duplicates("method").iloc[0]
        # identical_with holds display labels in the run's tables (method keys in older ones)
        keys = {method_label(m): m for m in CAM_METHODS}
        names = {first["method"], *(keys.get(n, n) for n in first["identical_with"].split(" = "))}
        names = sorted(names, key=lambda m: list(CAM_METHODS).index(m) if m in CAM_METHODS else len(CAM_METHODS))
        groups.append(f"{' = '.join(method_label(m) for m in names)} at {ARCH_LABELS.get(arch, arch)}")
    return "Open markers: identical by construction at the target layer (" + "; ".join(groups) + ")."
