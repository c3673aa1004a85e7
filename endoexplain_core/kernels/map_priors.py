"""Map-prior and map-agreement kernels: is a CAM's peak evidence, or a property of the grid?

maps : float (B, S, S) in [0, 1] as ``cams.compute_cams`` returns them (a constant map is all
zeros). The grid cell of pixel (r, c) on an h x w feature grid is (floor(r h / S),
floor(c w / S)). Peak cells (border ring, corner), top-set IoU with a prior map, per-map Pearson
correlation and Grad-CAM++'s epsilon share.
Method: docs/maps_and_scores.md, "Map priors and practical identity".
"""

from __future__ import annotations

import torch

from endoexplain_core.kernels.threshold import top_fraction_mask

GRADCAMPP_EPS = 1e-6  # the epsilon of the Grad-CAM++ denominator (pytorch-grad-cam)


def grid_cells(rows: torch.Tensor, cols: torch.Tensor, image_size: int, grid: tuple[int, int]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Feature-grid cell (int64 (B,) row, col) of pixel positions on an S x S map."""
    height, width = grid
    return (rows.long() * height) // image_size, (cols.long() * width) // image_size


def border_ring(rows: torch.Tensor, cols: torch.Tensor, image_size: int, grid: tuple[int, int]
                ) -> torch.Tensor:
    """bool (B,): the pixel's grid cell is in the outer ring of the h x w grid
    (``border_ring_share(grid)`` is the chance level of a uniformly placed peak)."""
    cell_row, cell_col = grid_cells(rows, cols, image_size, grid)
    height, width = grid
    return (cell_row == 0) | (cell_row == height - 1) | (cell_col == 0) | (cell_col == width - 1)


def corner_cell(rows: torch.Tensor, cols: torch.Tensor, image_size: int, grid: tuple[int, int]
                ) -> torch.Tensor:
    """bool (B,): the pixel's grid cell is one of the grid's four corner cells."""
    cell_row, cell_col = grid_cells(rows, cols, image_size, grid)
    height, width = grid
    return (((cell_row == 0) | (cell_row == height - 1))
            & ((cell_col == 0) | (cell_col == width - 1)))


def border_ring_share(grid: tuple[int, int]) -> float:
    """Share of the grid's cells in its outer ring (the chance level of ``border_ring``)."""
    height, width = grid
    inner = max(height - 2, 0) * max(width - 2, 0)
    return 1.0 - inner / (height * width)


def top_set_iou(first: torch.Tensor, second: torch.Tensor, top_fraction: float) -> torch.Tensor:
    """float32 (B,): IoU of the top-``top_fraction`` pixel sets of two map batches (B, S, S).

    ``second`` may be a single map (S, S), e.g. a prior map, compared with every map of
    ``first``. Top sets follow ``threshold.top_fraction_mask`` (exact count, fixed tie-break).
    """
    if second.dim() == 2:
        second = second.expand_as(first)
    keep_first = top_fraction_mask(first, top_fraction)
    keep_second = top_fraction_mask(second.contiguous(), top_fraction)
    intersection = (keep_first & keep_second).sum(dim=(1, 2)).float()
    union = (keep_first | keep_second).sum(dim=(1, 2)).float()
    return intersection / union


def pearson_per_map(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """float64 (B,): Pearson correlation of two map batches over pixels; NaN when either map
    is constant (no variance, no correlation)."""
    a = first.double().flatten(1)
    b = second.double().flatten(1)
    a = a - a.mean(dim=1, keepdim=True)
    b = b - b.mean(dim=1, keepdim=True)
    denominator = a.norm(dim=1) * b.norm(dim=1)
    correlation = (a * b).sum(dim=1) / denominator
    return torch.where(denominator > 0, correlation, torch.full_like(correlation, float("nan")))


def gradcampp_epsilon_share(activation: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """float64 (B,): share of Grad-CAM++ denominators in which the epsilon dominates,
    |2 g^2 + S_c g^3| < ``GRADCAMPP_EPS``, over the elements with g != 0; NaN for an image whose
    gradient is zero everywhere. ``activation``, ``gradient``: (B, C, h, w) at the target layer."""
    gradient = gradient.double()
    channel_sum = activation.double().sum(dim=(2, 3), keepdim=True)
    squared = gradient.pow(2)
    rest = (2 * squared + channel_sum * squared * gradient).abs()
    considered = gradient != 0
    dominated = (rest < GRADCAMPP_EPS) & considered
    counted = considered.flatten(1).sum(dim=1).double()
    share = dominated.flatten(1).sum(dim=1).double() / counted
    return torch.where(counted > 0, share, torch.full_like(share, float("nan")))
