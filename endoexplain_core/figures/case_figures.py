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
Each row's title counts its own CAM peaks outside the lesion (``row_title``).
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

from endoexplain_core.methods import CAM_METHODS, MAP_METHODS, method_label
from endoexplain_core.marks import EIGEN_FOOTNOTE
from endoexplain_core.figures.style import (ARCH_COLOURS, ARCH_LABELS, ARCH_MARKERS, CONTOUR_COLOUR,
                                            DOUBLE_COLUMN_INCHES, HEATMAP_CMAP, PEAK_COLOUR,
                                            RANDOM_REFERENCE, as_written, checkpoint_label, footnote,
                                            panel_title, error_extents, two_line_label)

HEATMAP_ALPHA = 0.55
MISS_MARGIN_FRACTION = 0.05   # a typical miss: median CAM peak this share of the side outside
FIGURE3_WIDTH_INCHES = 7.2    # 183 mm, a journal's double column


def select_figure3_cases(table: pd.DataFrame, score_threshold: float,
                         image_size: int | None = None) -> dict[str, str | None]:
    """Sample ids of the typical-miss, discordant and consensus cases (None when no case
    qualifies), in drawing order. ``table``: the primary checkpoint's audit rows on one
    dataset. ``image_size``: the input side behind ``peak_lesion_distance``; a clear miss is a
    defined CAM peak at least ``MISS_MARGIN_FRACTION`` of it outside the lesion (without it, or
    in a table without distances, any peak outside the lesion counts).
    """
    cam_rows = table[table["method"].isin(CAM_METHODS) & (table["scaled_score"] >= score_threshold)]
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


def row_title(role: str, rows: dict) -> str:
    """A Figure 3 row's title, read from the row's own maps: the role, then how many of its
    CAM peaks lie outside the lesion (a constant map has no peak and is counted apart), e.g.
    "High-score miss: 4 of 5 CAM peaks outside the lesion"."""
    cams = [rows[m] for m in CAM_METHODS if m in rows]
    constant = sum(bool(info["constant_map"]) for info in cams)
    outside = sum(bool(info["peak_outside_mask"]) and not info["constant_map"] for info in cams)
    title = (f"{ROLE_TITLES.get(role, role.capitalize())}: {outside} of {len(cams) - constant} "
             "CAM peaks outside the lesion")
    return title + (f" ({constant} constant map{'s' if constant > 1 else ''})" if constant else "")


def format_score(score: float) -> str:
    """A scaled score for a caption: three decimals, never a rounded "1.000"."""
    return ">0.999" if score > 0.999 else "<0.001" if score < 0.001 else f"{score:.3f}"


PANEL_TITLES = {"random": "Random", "centre": "Centre", "salience": "Salience"}   # Figure 3's narrow columns


def _panel_note(info: dict) -> str:
    """Under a map: its IoU and where its peak is ("in", or how many pixels "out")."""
    if info["constant_map"]:
        return f"IoU {info['iou']:.2f}\nconstant"
    if not info["peak_outside_mask"]:
        return f"IoU {info['iou']:.2f}\nin"
    distance = info.get("distance")
    far = f" {distance:.0f} px" if distance is not None and np.isfinite(distance) else ""
    return f"IoU {info['iou']:.2f}\nout{far}"


def draw_figure3(drawn: list[dict], roles=("miss", "discordant", "consensus"), *,
                 top_fraction: float, not_validated=()):
    """Draw Figure 3 from prepared rows (no model needed; tested from fixed arrays).

    ``drawn``: one dict per drawn case: role, sample_id, score, rgb (float (S, S, 3) in
    [0, 1]), mask (bool/float (S, S)), maps (method -> float (S, S) in [0, 1]; the CAMs and,
    when present, the centre, random and salience baselines), tops (method -> bool (S, S) top
    area; optional), rows (method -> {"iou", "constant_map", "peak_outside_mask",
    "distance"}). Each role of ``roles`` is one row, lettered A, B, C..., titled with its role
    and score; a role with no case gets a full-width note saying why instead of empty panels.
    Panels: the frame with the lesion contour, then each map over the greyscale frame (inferno,
    one colour scale), cyan lesion contour, dashed white top-area outline (not for the random
    heatmap, whose top area is scattered pixels), white peak marker
    (never clipped at the frame edge); the sample ids are listed in the footer. 183 mm wide.
    Methods in ``not_validated`` (the validity gate's failing methods) carry its mark.
    """
    by_role = {row["role"]: row for row in drawn}
    methods = [m for m in MAP_METHODS if any(m in row["maps"] for row in drawn)] or list(CAM_METHODS)
    n_columns = 1 + len(methods)
    heights = [1.0 if role in by_role else 0.18 for role in roles]
    # ids are file names; escaped, not parse_math=False: Matplotlib's wrap measures words as mathtext
    ids = [f"{chr(ord('A') + index)} = {as_written(by_role[role]['sample_id'])}"
           for index, role in enumerate(roles) if role in by_role]
    caption = _figure3_caption(methods, ids, top_fraction)
    # The caption's wrapped lines get their own height: a short figure (one drawn row) with a
    # long caption otherwise squeezes the panels to nothing under constrained layout.
    caption_inches = _wrapped_line_count(caption, FIGURE3_WIDTH_INCHES, 6.5) * 6.5 * 1.3 / 72
    fig = plt.figure(figsize=(FIGURE3_WIDTH_INCHES, 0.55 + 1.45 * sum(heights) + caption_inches),
                     layout="constrained")
    subfigures = np.atleast_1d(fig.subfigures(len(roles), 1, height_ratios=heights))
    for index, (subfigure, role) in enumerate(zip(subfigures, roles)):
        letter = chr(ord("A") + index)
        title = ROLE_TITLES.get(role, role.capitalize())
        if role not in by_role:
            ax = subfigure.subplots()
            ax.axis("off")
            ax.text(0.0, 0.5, rf"$\mathbf{{{letter}}}$" + f"  {title}: not drawn \u2013 "
                    f"{MISSING_ROW_REASONS.get(role, 'no case meets the selection rule')}.",
                    transform=ax.transAxes, ha="left", va="center", fontsize=7)
            continue
        case = by_role[role]
        title = row_title(role, case["rows"])
        subfigure.suptitle(rf"$\mathbf{{{letter}}}$  {title} (scaled score {format_score(case['score'])})",
                           x=0.0, ha="left", fontsize=8, fontweight="bold")
        axes = subfigure.subplots(1, n_columns)
        grey = np.asarray(case["rgb"]) @ np.array([0.299, 0.587, 0.114])
        mask = np.asarray(case["mask"], dtype=float)
        axes[0].imshow(case["rgb"])
        axes[0].contour(mask, levels=[0.5], colors=CONTOUR_COLOUR, linewidths=0.8)
        axes[0].set_title("Frame", fontsize=7)
        for ax, method in zip(axes[1:], methods):
            ax.set_title(PANEL_TITLES.get(method, method_label(method, not_validated)), fontsize=7)
            if method in case["maps"]:
                _draw_map_panel(ax, method, case, grey, mask)
            else:
                ax.axis("off")
        for ax in axes:
            ax.set_xticks([])
            ax.set_yticks([])
        last_row = (subfigure, axes)
    if by_role:   # one colour scale for every map: its bar beside the last drawn row
        scale = matplotlib.cm.ScalarMappable(norm=matplotlib.colors.Normalize(0, 1), cmap=HEATMAP_CMAP)
        colour_bar = last_row[0].colorbar(scale, ax=last_row[1], shrink=0.7, pad=0.01, aspect=12)
        colour_bar.set_label("map value", fontsize=6)
        colour_bar.ax.tick_params(labelsize=6)
    fig.supxlabel(caption, fontsize=6.5, x=0.0, ha="left", wrap=True)
    return fig


def _figure3_caption(methods, ids: list[str], top_fraction: float) -> str:
    """Figure 3's caption: the marks, the baselines, the scale, the notes its methods call for
    and the drawn cases' ids."""
    return (f"Cyan: lesion contour; dashed white: the map's top {top_fraction:.0%} area; "
            "white \u00d7: peak (first maximum); in / out k px: the peak inside the lesion or "
            "k pixels from it; constant: a constant map has no peak; IoU of the top area with "
            "the lesion; k px at the input size (a CAM is upsampled from the target layer's "
            "coarse grid, so several CAMs can share one peak). The small box at the lower left "
            "of some frames is the scope-position overlay of the frame, not an annotation. "
            "Random: random heatmap; Centre: centre baseline; Salience: the frame's smoothed "
            "gradient magnitude (no model). Maps "
            "min-max normalised on one inferno scale (dark = 0, yellow = 1). "
            + ("\n" + HIRESCAM_NOTE if "hirescam" in methods else "")
            + EIGEN_FOOTNOTE + (" Cases: " + "; ".join(ids) + "." if ids else ""))


def _wrapped_line_count(text: str, width_inches: float, fontsize: float) -> int:
    """Lines ``text`` takes when wrapped to ``width_inches`` at ``fontsize`` points (about 0.52 em
    per character, DejaVu Sans, as ``artefacts.wrap_to_width`` assumes)."""
    characters = max(20, int(width_inches * 72 / (0.52 * fontsize)))
    return sum(max(1, -(-len(line) // characters)) for line in text.split("\n"))


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
    if not info["constant_map"]:
        peak_row, peak_col = np.unravel_index(int(np.argmax(rendered)), rendered.shape)
        # A peak on the frame edge is half outside the image: a dark outline keeps the
        # white marker visible on the white page as well.
        ax.plot(peak_col, peak_row, marker="x", color=PEAK_COLOUR, markersize=5, mew=1.3,
                clip_on=False, zorder=5,
                path_effects=[patheffects.withStroke(linewidth=2.5, foreground="black")])
    ax.set_xlabel(_panel_note(info), fontsize=6.5, labelpad=2)


def figure4(robustness: pd.DataFrame, *, n_images: int | None = None, not_validated=(), left_out=()):
    """Figure 4: failure on own (A) and fixed (B) subsets, logit drop over all images (C).

    ``robustness``: ``summaries.checkpoint_robustness`` output (controls are left out). Points
    are architecture means over seeds, whiskers the seed min-max; CAM methods on the x axis.
    Colour and marker encode the architecture only (tick labels stay black). An
    architecture with no eligible image in a panel is left out of that panel and named in it.
    Open markers: the method is identical by construction to another CAM at that
    architecture's layer (``identical_with``). Panel C ends with each checkpoint's own
    random-deletion control (``random_deletion_mean``, logits), drawn like the CAMs in the
    reference colour, so every architecture's CAM drops sit beside their own reference.
    ``n_images``: images of the audit pool (panel C's n; from the table if None).
    ``not_validated``: CAM methods whose labels carry the validity gate's mark; ``left_out``:
    checkpoint ids not drawn (they did not learn), named in the note. 183 mm wide.
    """
    matrix = robustness[(robustness["control"] == "none") & robustness["method"].isin(CAM_METHODS)]
    archs = sorted(set(matrix["arch"]), key=lambda a: (list(ARCH_LABELS).index(a)
                                                      if a in ARCH_LABELS else len(ARCH_LABELS), a))
    per_checkpoint = matrix.drop_duplicates("checkpoint_id")
    own_n = per_checkpoint["n_own"]
    fixed_n = int(per_checkpoint["n_fixed"].max()) if len(per_checkpoint) else 0
    own_text = (f"n = {own_n.min()}\u2013{own_n.max()} per checkpoint" if own_n.min() != own_n.max()
                else f"n = {own_n.min()} per checkpoint")
    pool = n_images if n_images is not None else "all"
    panels = (("A", "failure_own", "Own high-score subset", own_text,
               "Peak outside lesion (share)"),
              ("B", "failure_fixed", "Primary's high-score subset", f"n = {fixed_n} images",
               "Peak outside lesion (share)"),
              ("C", "logit_drop_all", "Logit drop, all images", f"n = {pool} images",
               "Mean drop of the target logit (logits)"))
    has_random = "random_deletion_mean" in matrix.columns and matrix["random_deletion_mean"].notna().any()
    fig, axes = plt.subplots(1, 3, figsize=(DOUBLE_COLUMN_INCHES, 3.3), layout="constrained",
                             gridspec_kw={"width_ratios": [1.0, 1.0, 1.3 if has_random else 1.0]})
    offsets = np.linspace(-0.22, 0.22, max(len(archs), 1))
    has_identical = "identical_with" in matrix.columns and (matrix["identical_with"].fillna("") != "").any()
    tick_labels = [two_line_label(method_label(m, not_validated)) for m in CAM_METHODS]
    for ax, (letter, column, title, n_text, ylabel) in zip(axes, panels):
        absent = []
        for k, arch in enumerate(archs):
            of_arch = matrix[matrix["arch"] == arch]
            if of_arch[column].notna().sum() == 0:
                absent.append(ARCH_LABELS.get(arch, arch))
                continue
            _draw_architecture(ax, of_arch, arch, column, offsets[k], first=k == 0,
                               has_identical=has_identical, has_random=has_random)
        if archs and len(absent) == len(archs):
            n_text = "n = 0: no eligible image"
        elif absent:
            n_text = textwrap.fill(f"{n_text}; no eligible image: {', '.join(absent)}", width=34)
        if archs and len(absent) == len(archs):
            ax.text(0.5, 0.5, "no eligible images\nin any checkpoint", transform=ax.transAxes,
                    ha="center", color="dimgrey", in_layout=False)
        ticks, labels = np.arange(len(CAM_METHODS)), list(tick_labels)
        if column == "logit_drop_all":
            ax.axhline(0.0, color="grey", lw=0.5)
            if has_random:
                ax.axvline(len(CAM_METHODS) - 0.35, color="0.8", lw=0.6)
                ticks, labels = np.append(ticks, len(CAM_METHODS) + 0.3), labels + ["Random\ndeletion"]
            ax.set_xlim(-0.5, len(CAM_METHODS) + (0.8 if has_random else -0.5))
        else:
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlim(-0.5, len(CAM_METHODS) - 0.5)
        # Two-line horizontal labels: rotated labels would run into each other.
        ax.set_xticks(ticks, labels, fontsize=6.5)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylabel(ylabel, fontsize=7.5)
        panel_title(ax, letter, f"{title}\n{n_text}", fontsize=7.5)
    _shared_legend(fig, axes, archs)
    footnote(fig, " ".join(_figure4_notes(matrix, has_random=has_random,
                                          has_identical=has_identical, left_out=left_out)))
    return fig


def _draw_architecture(ax, of_arch: pd.DataFrame, arch: str, column: str, offset: float, *,
                       first: bool, has_identical: bool, has_random: bool) -> None:
    """One architecture in one Figure 4 panel: seed mean (filled, or open when identical by
    construction) with min-max whiskers per CAM; in panel C its random-deletion control."""
    values = of_arch.groupby("method")[column].agg(["mean", "min", "max"]).reindex(list(CAM_METHODS))
    identical = (of_arch.groupby("method")["identical_with"].first().reindex(list(CAM_METHODS))
                 .fillna("") != "") if has_identical else pd.Series(False, index=list(CAM_METHODS))
    seeds = of_arch.loc[of_arch[column].notna(), "checkpoint_id"].nunique()
    x = np.arange(len(CAM_METHODS)) + offset
    colour = ARCH_COLOURS.get(arch, "grey")
    ax.errorbar(x, values["mean"], yerr=error_extents(values["mean"], values["min"], values["max"]),
                fmt="none", ecolor=colour, capsize=2, elinewidth=0.8, clip_on=False)
    for filled in (True, False):
        chosen = (~identical.to_numpy()) if filled else identical.to_numpy()
        if chosen.any():
            ax.plot(x[chosen], values["mean"].to_numpy()[chosen], linestyle="none",
                    marker=ARCH_MARKERS.get(arch, "o"), ms=4, color=colour,
                    markerfacecolor=colour if filled else "white", clip_on=False,
                    label=f"{ARCH_LABELS.get(arch, arch)} ({seeds} seed{'' if seeds == 1 else 's'})" if filled else None)
    if column == "logit_drop_all" and has_random:
        # this architecture's checkpoints, each against its own random-deletion control
        controls = of_arch.drop_duplicates("checkpoint_id")["random_deletion_mean"].dropna()
        reference_x = len(CAM_METHODS) + 0.3 + offset
        ax.errorbar([reference_x], [controls.mean()],
                    yerr=error_extents([controls.mean()], [controls.min()], [controls.max()]),
                    fmt="none", ecolor=RANDOM_REFERENCE["color"], capsize=2, elinewidth=0.8)
        ax.plot([reference_x], [controls.mean()], linestyle="none", marker=ARCH_MARKERS.get(arch, "o"),
                ms=4, color=RANDOM_REFERENCE["color"],
                label="Random deletion (own control)" if first else None)


def _shared_legend(fig, axes, archs: list[str]) -> None:
    """One legend above the panels, architectures in their order, then the references."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    order = [ARCH_LABELS.get(a, a) for a in archs]
    labels = sorted(entries, key=lambda l: next((i for i, a in enumerate(order) if l.startswith(a)), len(order)))
    if labels:   # no learned checkpoint: the panels say so, there is nothing to key
        fig.legend([entries[l] for l in labels], labels, loc="outside upper center", ncol=len(labels),
                   frameon=False, fontsize=7)


def _figure4_notes(matrix: pd.DataFrame, *, has_random: bool, has_identical: bool,
                   left_out) -> list[str]:
    """Figure 4's footnote sentences: what points and whiskers are, the random control, the
    identical-by-construction groups, the left-out checkpoints and bound temperatures."""
    notes = ["Points: architecture mean over seeds; whiskers: seed minimum to maximum."]
    if has_random:
        notes.append("C, right: each checkpoint's random-deletion control (same area, random pixels), "
                     "marker by architecture.")
    if has_identical:
        groups = []
        for arch, rows in matrix[matrix["identical_with"].fillna("") != ""].groupby("arch", sort=False):
            first = rows.drop_duplicates("method").iloc[0]
            # identical_with holds display labels in the run's tables (method keys in older ones)
            keys = {method_label(m): m for m in CAM_METHODS}
            names = {first["method"], *(keys.get(n, n) for n in first["identical_with"].split(" = "))}
            names = sorted(names, key=lambda m: list(CAM_METHODS).index(m) if m in CAM_METHODS else len(CAM_METHODS))
            groups.append(f"{' = '.join(method_label(m) for m in names)} at {ARCH_LABELS.get(arch, arch)}")
        notes.append("Open markers: identical by construction at the target layer ("
                     + "; ".join(groups) + ").")
    if left_out:
        notes.append("Left out (did not learn: validation AUPRC or flat maps, table_checkpoint_learning): " + ", ".join(checkpoint_label(c) for c in left_out) + ".")
    if "temperature_at_bound" in matrix.columns and matrix["temperature_at_bound"].any():
        bound = sorted(matrix.loc[matrix["temperature_at_bound"].astype(bool), "checkpoint_id"].unique())
        notes.append("Temperature at its search bound (own subset set by the bound): "
                     + ", ".join(checkpoint_label(c) for c in bound) + ".")
    notes.append(EIGEN_FOOTNOTE)
    return notes
