"""Spatial agreement between a heat map and a lesion mask, batched over images.

Conventions, shared by all functions:
  maps   float (B, H, W), non-negative (CAMs are in [0, 1]); no NaN.
  masks  bool (B, H, W) (or a 0/1 tensor), True = lesion; every mask must be non-empty:
         an empty mask raises ValueError naming the batch indices.
  Pixel (r, c) sits at (r + 0.5, c + 0.5) in continuous coordinates; the frame centre is
  (H / 2, W / 2). Results are (B,) tensors on the inputs' device.
Method: docs/maps_and_scores.md, "Spatial metrics and reference maps".
"""

from __future__ import annotations

import torch

from endoexplain_core.kernels.threshold import tie_diagnostics, top_fraction_mask

IOU_FAILURE_LEVEL = 0.10  # "IoU < 0.10": the top area barely touches the lesion

SPATIAL_METRIC_KEYS = (
    "peak_row", "peak_col", "peak_outside_mask", "iou", "iou_below_0_10", "energy_in_mask",
    "centre_of_mass_distance", "lesion_area_fraction", "lesion_centre_distance",
    "constant_map", "max_multiplicity", "boundary_ties", "peak_lesion_distance",
)


def as_masks(masks: torch.Tensor, name: str = "masks") -> torch.Tensor:
    """Validate (B, H, W) binary masks and return them as bool."""
    if not isinstance(masks, torch.Tensor) or masks.dim() != 3:
        shape = tuple(masks.shape) if isinstance(masks, torch.Tensor) else type(masks).__name__
        raise ValueError(f"{name} must be a tensor (B, H, W); got {shape}")
    if masks.dtype != torch.bool:
        if not ((masks == 0) | (masks == 1)).all():
            raise ValueError(f"{name} must be binary (bool or 0/1 values)")
        masks = masks != 0
    empty = (~masks.flatten(1).any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"{name} are empty at batch indices {empty}")
    return masks


def check_maps(maps: torch.Tensor, like: torch.Tensor | None = None) -> None:
    """Refuse anything but float (B, H, W) maps, shaped as ``like`` when given."""
    if not isinstance(maps, torch.Tensor) or maps.dim() != 3 or not maps.is_floating_point():
        shape = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise ValueError(f"maps must be a float tensor (B, H, W); got {shape}")
    if like is not None and maps.shape != like.shape:
        raise ValueError(f"maps {tuple(maps.shape)} and masks {tuple(like.shape)} differ in shape")


def _pixel_centres(height: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.arange(height, device=device, dtype=torch.float64) + 0.5
    cols = torch.arange(width, device=device, dtype=torch.float64) + 0.5
    return rows, cols


def _weighted_centre(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Centre (row, col) of (B, H, W) non-negative weights in pixel units; zero total -> NaN."""
    weights = weights.double()
    rows, cols = _pixel_centres(weights.shape[1], weights.shape[2], weights.device)
    total = weights.sum(dim=(1, 2))
    row = (weights.sum(dim=2) * rows).sum(dim=1) / total
    col = (weights.sum(dim=1) * cols).sum(dim=1) / total
    return row, col


def peak_location(maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) int64 (B,) of each map's first maximum in row-major order."""
    check_maps(maps)
    batch, height, width = maps.shape
    flat = maps.reshape(batch, -1)
    index = torch.arange(height * width, device=maps.device).expand(batch, -1)
    at_max = flat == flat.amax(dim=1, keepdim=True)
    first = torch.where(at_max, index, height * width).amin(dim=1)
    return first // width, first % width


def peak_lesion_distance(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """float32 (B,): Euclidean distance in pixels from the map's peak (``peak_location``) to the
    nearest lesion pixel, 0 when the peak is inside; NaN for a constant map and an empty mask."""
    masks = as_masks(masks)
    check_maps(maps, masks)
    rows, cols = peak_location(maps)
    batch, height, width = masks.shape
    grid_rows = torch.arange(height, device=masks.device, dtype=torch.float64).view(1, height, 1)
    grid_cols = torch.arange(width, device=masks.device, dtype=torch.float64).view(1, 1, width)
    squared = ((grid_rows - rows.view(batch, 1, 1)) ** 2 + (grid_cols - cols.view(batch, 1, 1)) ** 2)
    nearest = torch.where(masks, squared, torch.inf).reshape(batch, -1).amin(dim=1).sqrt()
    flat = maps.reshape(batch, -1)
    undefined = (flat.amax(dim=1) == flat.amin(dim=1)) | ~masks.reshape(batch, -1).any(dim=1)
    return torch.where(undefined, torch.nan, nearest).float()


def peak_outside_mask(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """bool (B,): the map's first row-major maximum lies outside the lesion."""
    masks = as_masks(masks)
    check_maps(maps, masks)
    rows, cols = peak_location(maps)
    batch = torch.arange(maps.shape[0], device=maps.device)
    return ~masks[batch, rows, cols]


def top_fraction_iou(keep: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """float32 (B,): intersection over union of the kept pixels (bool (B, H, W)) and the lesion."""
    masks = as_masks(masks)
    keep = as_masks(keep, "keep")
    if keep.shape != masks.shape:
        raise ValueError(f"keep {tuple(keep.shape)} and masks {tuple(masks.shape)} differ in shape")
    intersection = (keep & masks).sum(dim=(1, 2))
    union = (keep | masks).sum(dim=(1, 2))
    return intersection.float() / union.float()


def _uniform_if_constant(maps: torch.Tensor) -> torch.Tensor:
    """Maps (B, H, W) as weights, with all-zero (constant) maps replaced by ones (a uniform map)."""
    constant = maps.amax(dim=(1, 2)) <= 0
    return torch.where(constant[:, None, None], torch.ones_like(maps), maps)


def energy_in_mask(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """float32 (B,): share of the map's total value inside the lesion, in [0, 1].

    An all-zero (constant) map counts as uniform: its share equals the lesion area fraction.
    """
    masks = as_masks(masks)
    check_maps(maps, masks)
    weights = _uniform_if_constant(maps.double())
    total = weights.sum(dim=(1, 2))
    inside = (weights * masks).sum(dim=(1, 2))
    return (inside / total).float()


def centre_of_mass_distance(maps: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """float32 (B,): distance from the map's centre of mass (map values as weights) to the
    lesion centroid, divided by the image diagonal sqrt(H^2 + W^2). An all-zero (constant) map
    counts as uniform: its centre of mass is the frame centre."""
    masks = as_masks(masks)
    check_maps(maps, masks)
    map_row, map_col = _weighted_centre(_uniform_if_constant(maps))
    lesion_row, lesion_col = _weighted_centre(masks)
    height, width = maps.shape[1:]
    diagonal = (height ** 2 + width ** 2) ** 0.5
    return (torch.hypot(map_row - lesion_row, map_col - lesion_col) / diagonal).float()


def lesion_area_fraction(masks: torch.Tensor) -> torch.Tensor:
    """float32 (B,): share of the frame's pixels inside the lesion."""
    masks = as_masks(masks)
    return masks.float().mean(dim=(1, 2))


def lesion_centre_distance(masks: torch.Tensor) -> torch.Tensor:
    """float32 (B,): distance from the lesion centroid to the frame centre, divided by the
    half-diagonal sqrt(H^2 + W^2) / 2, so 0 = centred and values stay below 1."""
    masks = as_masks(masks)
    height, width = masks.shape[1:]
    row, col = _weighted_centre(masks)
    half_diagonal = (height ** 2 + width ** 2) ** 0.5 / 2
    return (torch.hypot(row - height / 2, col - width / 2) / half_diagonal).float()


def spatial_metrics(maps: torch.Tensor, masks: torch.Tensor, top_fraction: float,
                    keep: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """All per-(image, map) spatial quantities of the audit, keys ``SPATIAL_METRIC_KEYS``.

    ``keep`` (bool (B, H, W)) may be passed when the top-``top_fraction`` mask is already
    computed; otherwise it is computed with ``threshold.top_fraction_mask``. Tie diagnostics
    come from ``threshold.tie_diagnostics`` (``constant`` is returned as ``constant_map``).
    """
    masks = as_masks(masks)
    check_maps(maps, masks)
    if keep is None:
        keep = top_fraction_mask(maps, top_fraction)
    rows, cols = peak_location(maps)
    iou = top_fraction_iou(keep, masks)
    ties = tie_diagnostics(maps, top_fraction)
    return {
        "peak_row": rows,
        "peak_col": cols,
        "peak_outside_mask": peak_outside_mask(maps, masks),
        "iou": iou,
        "iou_below_0_10": iou < IOU_FAILURE_LEVEL,
        "energy_in_mask": energy_in_mask(maps, masks),
        "centre_of_mass_distance": centre_of_mass_distance(maps, masks),
        "lesion_area_fraction": lesion_area_fraction(masks),
        "lesion_centre_distance": lesion_centre_distance(masks),
        "constant_map": ties["constant"],
        "max_multiplicity": ties["max_multiplicity"],
        "boundary_ties": ties["boundary_ties"],
        "peak_lesion_distance": peak_lesion_distance(maps, masks),
    }
