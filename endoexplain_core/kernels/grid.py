"""Where a CAM's grid lands on the image: node positions and the resolution ceiling.

Node i of an h-node axis resized bilinearly to S pixels (half-pixel centres, as ``kernels.cams``)
sits at pixel (i + 0.5) S / h - 0.5, and the upsampled map's maximum always lies on a node. The
resolution ceiling of a region: whether the node nearest its centroid lies inside it. Rule:
docs/protocol.md, "CAM grid and resolution"; method: docs/maps_and_scores.md, "Grid nodes and
the resolution ceiling".
"""

from __future__ import annotations

import numpy as np
import torch


def node_centres(grid_size: int, image_size: int) -> np.ndarray:
    """Pixel coordinates (float, pixel centres at integers) of the ``grid_size`` nodes of a map
    resized bilinearly (half-pixel centres) to ``image_size`` pixels along one axis."""
    if grid_size < 1 or image_size < 1:
        raise ValueError(f"need positive sizes, got grid {grid_size}, image {image_size}")
    return (np.arange(grid_size) + 0.5) * image_size / grid_size - 0.5


def nearest_node_inside(masks: torch.Tensor | np.ndarray, grid_shape: tuple[int, int]
                        ) -> np.ndarray:
    """Per mask: does the grid node nearest the region's centroid lie inside the region?

    masks : bool (B, H, W) (or 0/1), at the input size. grid_shape : (h, w) of the CAM grid.
    Returns bool (B,); an empty mask gives False. The node is the nearest along each axis
    (ties to the lower index), its pixel the node coordinate rounded half up.
    """
    masks = masks.detach().cpu().numpy() if isinstance(masks, torch.Tensor) else np.asarray(masks)
    if masks.ndim != 3:
        raise ValueError(f"masks must be (B, H, W), got shape {masks.shape}")
    masks = masks.astype(bool)
    height, width = masks.shape[1:]
    rows, cols = node_centres(grid_shape[0], height), node_centres(grid_shape[1], width)
    inside = np.zeros(len(masks), dtype=bool)
    for index, mask in enumerate(masks):
        ys, xs = np.nonzero(mask)
        if ys.size == 0:
            continue
        row = rows[int(np.argmin(np.abs(rows - ys.mean())))]
        col = cols[int(np.argmin(np.abs(cols - xs.mean())))]
        inside[index] = mask[min(int(np.floor(row + 0.5)), height - 1),
                             min(int(np.floor(col + 0.5)), width - 1)]
    return inside
