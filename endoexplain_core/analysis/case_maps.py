"""Maps of chosen audited cases, recomputed from the checkpoint and checked against the audit table.

A figure that shows a case's maps must show the maps the table scored. The maps are recomputed
in the very batch the audit used (``audit_batch_ids``: convolution kernels block their work by
batch size, so a map recomputed alone can move a near-tie across the top-area boundary) and
each drawn map's top-area IoU with the drawn mask must equal the table's within
``IOU_TOLERANCE``, or ``RenderedIoUMismatch`` is raised. The figures draw what this returns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from endoexplain_core.analysis.audit import batch_maps
from endoexplain_core.analysis.audit_inputs import prepare_case
from endoexplain_core.data.datasets import denormalised_rgb
from endoexplain_core.kernels import metrics, threshold
from endoexplain_core.methods import MAP_METHODS

IOU_TOLERANCE = 0.002
CHECK_COLUMNS = ["case", "sample_id", "method", "table_iou", "rendered_iou", "peak_matches"]


class RenderedIoUMismatch(AssertionError):
    """A rendered CAM's IoU differs from the audit table by more than the tolerance."""


def audit_batch_ids(table: pd.DataFrame, sample_id: str, batch_size: int | None) -> list[str]:
    """The sample ids of the audit batch that held ``sample_id``: the audit writes its table
    batch by batch in pool order, so the batches are the table's sample ids in order of first
    appearance, cut every ``batch_size``. ``None``: just ``[sample_id]``."""
    if batch_size is None:
        return [sample_id]
    order = list(dict.fromkeys(table["sample_id"]))
    start = order.index(sample_id) // batch_size * batch_size
    return order[start:start + batch_size]


def verify_rendered_iou(rendered_map: np.ndarray, rendered_mask: np.ndarray, table_iou: float,
                        top_fraction: float, label: str) -> float:
    """IoU of the top area of the drawn map with the drawn mask; raise if off the table."""
    keep = threshold.top_fraction_mask(torch.from_numpy(rendered_map)[None], top_fraction)
    rendered_iou = float(metrics.top_fraction_iou(keep, torch.from_numpy(rendered_mask)[None])[0])
    if abs(rendered_iou - table_iou) > IOU_TOLERANCE:
        raise RenderedIoUMismatch(f"{label}: rendered IoU {rendered_iou:.4f} differs from the "
                                  f"audit table's {table_iou:.4f} by more than {IOU_TOLERANCE}")
    return rendered_iou


def redraw_cases(table: pd.DataFrame, selection: dict[str, str | None], model: torch.nn.Module,
                 target_layer: torch.nn.Module, cases: dict, image_size: int, top_fraction: float,
                 device: str | torch.device = "cpu", batch_size: int | None = None
                 ) -> tuple[list[dict], pd.DataFrame]:
    """Recompute and check the maps of the selected cases; return (drawn, checks).

    ``selection``: role -> sample id (None: no case for that role). ``cases``: sample_id ->
    (uint8 (H, W, 3) RGB, bool (H, W) mask) for the selected ids and, with ``batch_size`` (the
    audit's), for every id of their audit batches. ``drawn``: one dict per selected case in
    ``figures.case_figures.draw_figure3``'s format (role, sample_id, score, rgb, mask, maps,
    tops, rows), the centre baseline, random heatmap (seeded by sample id) and salience map
    beside the CAMs.
    ``checks``: per drawn map with a table row, the table IoU, the rendered IoU (a constant map
    is checked like any other) and whether the drawn peak equals the table's.
    """
    drawn, checks = [], []
    for role, sample_id in selection.items():
        if sample_id is None:
            continue
        batch_ids = audit_batch_ids(table, sample_id, batch_size)
        prepared = {i: prepare_case(i, *cases[i], image_size) for i in batch_ids}
        image_tensor, mask_tensor = prepared[sample_id]
        batch = torch.stack([prepared[i][0] for i in batch_ids]).to(device)
        maps, _ = batch_maps(model, target_layer, batch, batch_ids)
        at = batch_ids.index(sample_id)
        maps = {method: maps[method][at][None].detach().cpu() for method in MAP_METHODS}
        mask_array = mask_tensor.numpy()
        rows = table[table["sample_id"] == sample_id].set_index("method")
        rendered_maps, map_rows, tops = {}, {}, {}
        for method in MAP_METHODS:
            rendered = maps[method][0].numpy()
            distance = float(metrics.peak_lesion_distance(maps[method], mask_tensor[None])[0])
            keep = threshold.top_fraction_mask(maps[method], top_fraction)[0].numpy()
            constant = float(np.ptp(rendered)) == 0.0
            peak_row, peak_col = np.unravel_index(int(np.argmax(rendered)), rendered.shape)
            outside = not bool(mask_array[peak_row, peak_col])
            if method in rows.index:
                recorded = rows.loc[method]
                rendered_iou = verify_rendered_iou(rendered, mask_array, float(recorded["iou"]),
                                                   top_fraction, f"{sample_id}/{method}")
                constant = constant or bool(recorded.get("constant_map", False))
                outside = bool(recorded["peak_outside_mask"])
                checks.append({"case": role, "sample_id": sample_id, "method": method,
                               "table_iou": float(recorded["iou"]), "rendered_iou": rendered_iou,
                               "peak_matches": (peak_row, peak_col) == (int(recorded["peak_row"]),
                                                                        int(recorded["peak_col"]))})
            else:
                rendered_iou = float(metrics.top_fraction_iou(torch.from_numpy(keep)[None],
                                                              mask_tensor[None])[0])
            rendered_maps[method], tops[method] = rendered, keep
            map_rows[method] = {"iou": rendered_iou, "constant_map": constant,
                                "peak_outside_mask": outside, "distance": distance}
        drawn.append({"role": role, "sample_id": sample_id,
                      "score": float(rows["scaled_score"].iloc[0]), "rgb": denormalised_rgb(image_tensor),
                      "mask": mask_array, "maps": rendered_maps, "tops": tops, "rows": map_rows})
    return drawn, pd.DataFrame(checks, columns=CHECK_COLUMNS)
