"""Where a CAM's grid lands on the image: node positions and the resolution ceiling.

A CAM is computed on the target layer's (h, w) grid and resized bilinearly to the input size
(half-pixel centres, ``align_corners=False``, as ``kernels.cams`` and cv2.resize do). Bilinear
interpolation is a convex combination of the four surrounding nodes, so the upsampled map's
maximum always lies on a node: node (i, j) sits at pixel ((i + 0.5) H / h - 0.5,
(j + 0.5) W / w - 0.5) (pixel centres at integer coordinates). A peak can therefore only land
on these h x w pixels, whatever the model does.

The **resolution ceiling** of a region is whether the node nearest its centroid lies inside
it: a map that puts its maximum on the cell that holds the region's centre scores a hit only
when that holds. Its mean over images bounds what a perfect coarse map can reach, and it is
printed beside the gate's rates (``analysis.validity_gate``).
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
