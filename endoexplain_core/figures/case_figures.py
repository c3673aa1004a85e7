"""Figure 3 (rule-selected cases, with rendered-IoU verification) and Figure 4 (robustness).

Figure 3 selection rule (DESIGN.md section 4), applied to the primary checkpoint's audit table
before anything is drawn, among high-score images (scaled score >= threshold), CAMs only:
- discordant: at least one CAM peak inside and one outside the mask; maximise the balance
  min(#inside, #outside), then the across-CAM IoU range (max - min), then the score;
- consensus: all five CAM peaks inside; maximise the mean IoU;
- remaining ties: the smallest sample id.
The drawn maps are recomputed from the checkpoint; the IoU of each rendered map with the
rendered mask must equal the table's within ``IOU_TOLERANCE`` or rendering raises.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from endoexplain_core.kernels import cams, metrics, threshold
from endoexplain_core.analysis.audit import CAM_METHODS, prepare_case
from endoexplain_core.data.datasets import IMAGENET_MEAN, IMAGENET_STD
from endoexplain_core.figures.style import (ARCH_LABELS, CONTOUR_COLOUR, EIGEN_FOOTNOTE, HEATMAP_CMAP,
                                    METHOD_COLOURS, PEAK_COLOUR, method_label)

IOU_TOLERANCE = 0.002
HEATMAP_ALPHA = 0.55


class RenderedIoUMismatch(AssertionError):
    """A rendered CAM's IoU differs from the audit table by more than the tolerance."""


def select_figure3_cases(table: pd.DataFrame, score_threshold: float) -> dict[str, str | None]:
    """Sample ids of the discordant and the consensus case (None when no case qualifies).

    ``table``: the primary checkpoint's audit rows on one dataset.
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
    return {"discordant": discordant["sample_id"].iloc[0] if len(discordant) else None,
            "consensus": consensus["sample_id"].iloc[0] if len(consensus) else None}


def _display_rgb(image_tensor: torch.Tensor) -> np.ndarray:
    """Normalised float (3, S, S) -> float (S, S, 3) RGB in [0, 1] (undo ImageNet scaling)."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (image_tensor.cpu() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()


def verify_rendered_iou(rendered_map: np.ndarray, rendered_mask: np.ndarray, table_iou: float,
                        top_fraction: float, label: str) -> float:
    """IoU of the top area of the drawn map with the drawn mask; raise if off the table."""
    keep = threshold.top_fraction_mask(torch.from_numpy(rendered_map)[None], top_fraction)
    rendered_iou = float(metrics.top_fraction_iou(keep, torch.from_numpy(rendered_mask)[None])[0])
    if abs(rendered_iou - table_iou) > IOU_TOLERANCE:
        raise RenderedIoUMismatch(f"{label}: rendered IoU {rendered_iou:.4f} differs from the "
                                  f"audit table's {table_iou:.4f} by more than {IOU_TOLERANCE}")
    return rendered_iou


def render_figure3(table: pd.DataFrame, selection: dict[str, str | None], model: torch.nn.Module,
                   target_layer: torch.nn.Module, cases: dict, image_size: int,
                   top_fraction: float, device: str | torch.device = "cpu"):
    """Draw the selected cases; return (figure, verification table).

    ``cases``: sample_id -> (uint8 (H, W, 3) RGB, bool (H, W) mask) for the selected ids.
    Columns per row: original frame, mask, then each CAM on a greyscale base (inferno
    activation, cyan mask contour, white peak). The verification table lists, per drawn map,
    the table IoU and the rendered IoU (checked within ``IOU_TOLERANCE``) and whether the
    drawn peak equals the table's.
    """
    drawn = [(role, sid) for role, sid in selection.items() if sid is not None]
    n_columns = 2 + len(CAM_METHODS)
    if not drawn:
        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "No high-score case meets the selection rule: nothing to draw.",
                ha="center", va="center")
        return fig, pd.DataFrame(columns=["case", "sample_id", "method", "table_iou",
                                          "rendered_iou", "peak_matches"])
    fig, axes = plt.subplots(len(drawn), n_columns, figsize=(1.6 * n_columns, 1.75 * len(drawn)),
                             squeeze=False)
    checks = []
    for row, (role, sample_id) in enumerate(drawn):
        image, mask = cases[sample_id]
        image_tensor, mask_tensor = prepare_case(sample_id, image, mask, image_size)
        maps = cams.compute_cams(model, target_layer, image_tensor[None].to(device),
                                 target_class=1, methods=CAM_METHODS)
        rgb = _display_rgb(image_tensor)
        grey = rgb @ np.array([0.299, 0.587, 0.114])
        mask_array = mask_tensor.numpy()
        rows = table[table["sample_id"] == sample_id].set_index("method")
        axes[row, 0].imshow(rgb)
        row_letter = {"discordant": "A", "consensus": "B"}.get(role, role)
        axes[row, 0].set_ylabel(f"{row_letter}: {role}\n{sample_id}", fontsize=7)
        axes[row, 1].imshow(mask_array, cmap="gray", vmin=0, vmax=1)
        for column, method in enumerate(CAM_METHODS, start=2):
            rendered = maps[method][0].cpu().numpy()
            recorded = rows.loc[method]
            rendered_iou = verify_rendered_iou(rendered, mask_array, float(recorded["iou"]),
                                               top_fraction, f"{sample_id}/{method}")
            peak_row, peak_col = np.unravel_index(int(np.argmax(rendered)), rendered.shape)
            ax = axes[row, column]
            ax.imshow(grey, cmap="gray", vmin=0, vmax=1)
            ax.imshow(rendered, cmap=HEATMAP_CMAP, vmin=0, vmax=1, alpha=HEATMAP_ALPHA)
            ax.contour(mask_array.astype(float), levels=[0.5], colors=CONTOUR_COLOUR, linewidths=0.8)
            ax.plot(peak_col, peak_row, marker="x", color=PEAK_COLOUR, markersize=6, mew=1.5)
            ax.set_title(f"{method_label(method)}\nIoU {rendered_iou:.2f}", fontsize=7)
            checks.append({"case": role, "sample_id": sample_id, "method": method,
                           "table_iou": float(recorded["iou"]), "rendered_iou": rendered_iou,
                           "peak_matches": (peak_row, peak_col) == (int(recorded["peak_row"]),
                                                                    int(recorded["peak_col"]))})
    axes[0, 0].set_title("Frame", fontsize=7)
    axes[0, 1].set_title("Mask", fontsize=7)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.text(0.01, -0.02, EIGEN_FOOTNOTE, fontsize=7)
    fig.tight_layout()
    return fig, pd.DataFrame(checks)


def figure4(robustness: pd.DataFrame, random_deletion_mean: float):
    """Figure 4: failure on own (A) and fixed (B) subsets, logit drop over all images (C).

    ``robustness``: ``summaries.checkpoint_robustness`` output (controls are left out). Points
    are architecture means over seeds, whiskers the seed min-max; CAM methods on the x axis.
    ``random_deletion_mean``: the dashed reference line in C.
    """
    matrix = robustness[(robustness["control"] == "none") & robustness["method"].isin(CAM_METHODS)]
    archs = sorted(set(matrix["arch"]), key=lambda a: (list(ARCH_LABELS).index(a)
                                                      if a in ARCH_LABELS else len(ARCH_LABELS), a))
    panels = (("A", "failure_own", "Peak failure, own high-score subset"),
              ("B", "failure_fixed", "Peak failure, primary's fixed subset"),
              ("C", "logit_drop_all", "Mean logit drop, all images"))
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    offsets = np.linspace(-0.22, 0.22, max(len(archs), 1))
    markers = ("o", "s", "^", "D")
    for ax, (letter, column, title) in zip(axes, panels):
        for k, arch in enumerate(archs):
            of_arch = matrix[matrix["arch"] == arch].groupby("method")[column]
            stats_ = of_arch.agg(["mean", "min", "max"]).reindex(list(CAM_METHODS))
            x = np.arange(len(CAM_METHODS)) + offsets[k]
            ax.errorbar(x, stats_["mean"], yerr=[stats_["mean"] - stats_["min"],
                                                 stats_["max"] - stats_["mean"]],
                        fmt=markers[k % len(markers)], capsize=2, ms=4,
                        label=ARCH_LABELS.get(arch, arch))
        if matrix[column].notna().sum() == 0:   # e.g. no image reached the score threshold
            ax.text(0.5, 0.5, "no eligible images", transform=ax.transAxes, ha="center",
                    color="grey")
        if column == "logit_drop_all":
            ax.axhline(random_deletion_mean, ls="--", color="black", lw=0.8,
                       label="Random deletion (primary)")
            ax.axhline(0.0, color="grey", lw=0.5)
        else:
            ax.set_ylim(-0.02, 1.02)
        ax.set_xticks(np.arange(len(CAM_METHODS)),
                      [method_label(m) for m in CAM_METHODS], rotation=30, ha="right")
        for tick, method in zip(ax.get_xticklabels(), CAM_METHODS):
            tick.set_color(METHOD_COLOURS.get(method, "black"))
        ax.set_title(f"{letter}  {title}", loc="left")
    handles, labels = axes[2].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=len(labels), frameon=False)
    fig.text(0.01, -0.1, EIGEN_FOOTNOTE, fontsize=7)
    return fig
