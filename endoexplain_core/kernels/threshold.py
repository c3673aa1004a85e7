"""Exact top-area rule: keep a fixed number of the highest-valued pixels of each map.

Each H x W = N pixel map keeps exactly ``round(fraction * N)`` pixels (Python's ``round``),
ranked by value, highest first, ties by the fixed priority ``(i * 1_000_003) % N`` of the
row-major index i, lower first: the same for every map and device. Rule: docs/protocol.md,
"Maps and the top-area rule"; method: docs/maps_and_scores.md, "Top-area rule".
"""

from __future__ import annotations

import torch

TIE_BREAK_MULTIPLIER = 1_000_003  # a prime: the priority is a permutation unless N is a multiple


def _check_maps(maps: torch.Tensor, name: str = "maps") -> None:
    if not isinstance(maps, torch.Tensor) or maps.dim() != 3:
        shape = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise ValueError(f"{name} must be a tensor (B, H, W); got {shape}")
    if not maps.is_floating_point():
        raise ValueError(f"{name} must be floating point; got {maps.dtype}")
    if torch.isnan(maps).any():
        raise ValueError(f"{name} contain NaN values (batch indices "
                         f"{torch.isnan(maps).flatten(1).any(1).nonzero().flatten().tolist()})")


def kept_pixel_count(top_fraction: float, height: int, width: int) -> int:
    """Number of pixels the rule keeps: ``round(top_fraction * height * width)``.

    Raises ValueError when top_fraction is outside (0, 1] or the count would be zero.
    """
    if not 0 < top_fraction <= 1:
        raise ValueError(f"top_fraction must be in (0, 1]; got {top_fraction}")
    count = round(top_fraction * height * width)
    if count == 0:
        raise ValueError(f"top_fraction {top_fraction} of a {height}x{width} map keeps no pixel")
    return count


def tie_break_priority(n_pixels: int, device=None) -> torch.Tensor:
    """int64 (N,): priority ``(i * 1_000_003) % N`` of flattened pixel i (lower wins a tie)."""
    return (torch.arange(n_pixels, dtype=torch.int64, device=device) * TIE_BREAK_MULTIPLIER) % n_pixels


def rank_order(maps: torch.Tensor) -> torch.Tensor:
    """int64 (B, N): flattened pixel indices from highest to lowest, ties by priority."""
    batch, height, width = maps.shape
    n_pixels = height * width
    # Visit pixels in priority order, then sort by value with a stable sort: among equal
    # values the priority order survives.
    by_priority = torch.argsort(tie_break_priority(n_pixels, maps.device), stable=True)
    values = maps.reshape(batch, n_pixels)[:, by_priority]
    order = torch.sort(values, dim=1, descending=True, stable=True).indices
    return by_priority[order]


def top_fraction_mask(maps: torch.Tensor, top_fraction: float) -> torch.Tensor:
    """Keep the top ``round(top_fraction * H * W)`` pixels of every map.

    maps : float (B, H, W), any range, no NaN. top_fraction : in (0, 1].
    Returns bool (B, H, W) on the maps' device with exactly that many True per map.
    """
    _check_maps(maps)
    batch, height, width = maps.shape
    count = kept_pixel_count(top_fraction, height, width)
    kept_indices = rank_order(maps)[:, :count]
    keep = torch.zeros(batch, height * width, dtype=torch.bool, device=maps.device)
    keep.scatter_(1, kept_indices, True)
    return keep.reshape(batch, height, width)


def tie_diagnostics(maps: torch.Tensor, top_fraction: float) -> dict[str, torch.Tensor]:
    """How much the top-area rule depended on tie-breaking: a dict of (B,) tensors on the maps'
    device, ``constant`` (bool: all pixels equal), ``max_multiplicity`` (int64: pixels equal to the
    maximum) and ``boundary_ties`` (int64: pixels equal to the last kept value, inside and outside
    the kept set; 1 = an unambiguous boundary)."""
    _check_maps(maps)
    batch, height, width = maps.shape
    count = kept_pixel_count(top_fraction, height, width)
    flat = maps.reshape(batch, height * width)
    maximum = flat.amax(dim=1, keepdim=True)
    boundary_value = torch.topk(flat, count, dim=1).values[:, -1:]
    return {
        "constant": flat.amin(dim=1) == maximum[:, 0],
        "max_multiplicity": (flat == maximum).sum(dim=1),
        "boundary_ties": (flat == boundary_value).sum(dim=1),
    }
