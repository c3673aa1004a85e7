"""Seeded placement of a region's translated copies inside the field of view.

regions, fov, avoid : bool (B, H, W). A valid translation (dy, dx) (rows down and columns right
positive) moves every pixel of the region inside the frame and the field of view B, none onto
an ``avoid`` pixel when given, and is not the zero shift (``exclude_identity``). Up to ``count``
are drawn per image by a CPU generator seeded from (purpose, sample); with fewer valid ones, all
are used and the rest marked not placed.
Method: docs/maps_and_scores.md, "Lesion-specific reliance and shape-preserving deletion".
"""

from __future__ import annotations

import torch

from endoexplain_core.kernels.deletion import sample_key


def _check(regions: torch.Tensor, fov: torch.Tensor, avoid: torch.Tensor | None) -> None:
    for name, value in (("regions", regions), ("fov", fov), ("avoid", avoid)):
        if value is None:
            continue
        if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or value.dim() != 3:
            raise ValueError(f"{name} must be a bool tensor (B, H, W)")
        if value.shape != regions.shape:
            raise ValueError(f"{name} {tuple(value.shape)} differs from regions {tuple(regions.shape)}")


def _correlation(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """(B, 2H, 2W) counts c[s] = sum_p first(p) second(p + s), shift s stored at s mod (2H, 2W);
    zero padding makes every shift of up to H-1 / W-1 exact (no wrap-around)."""
    height, width = first.shape[-2:]
    size = (2 * height, 2 * width)
    spectrum = torch.fft.rfft2(first.double(), s=size).conj() * torch.fft.rfft2(second.double(), s=size)
    return torch.fft.irfft2(spectrum, s=size).round()


def valid_translations(regions: torch.Tensor, fov: torch.Tensor, *,
                       avoid: torch.Tensor | None = None,
                       exclude_identity: bool = True) -> list[torch.Tensor]:
    """Per image, int64 (K, 2) of every valid (dy, dx) (module docstring), ordered by dy then
    dx. An empty region has no valid translation. Computed on the CPU."""
    _check(regions, fov, avoid)
    regions, fov = regions.cpu(), fov.cpu()
    batch, height, width = regions.shape
    area = regions.flatten(1).sum(dim=1).double()
    landing = _correlation(regions, fov)                               # (B, 2H, 2W)
    valid = landing == area[:, None, None]
    if avoid is not None:
        valid &= _correlation(regions, avoid.cpu()) == 0
    shifts_y = torch.arange(-(height - 1), height)
    shifts_x = torch.arange(-(width - 1), width)
    valid = valid[:, shifts_y % (2 * height)][:, :, shifts_x % (2 * width)]   # (B, 2H-1, 2W-1)
    if exclude_identity:
        valid[:, height - 1, width - 1] = False
    valid &= (area > 0)[:, None, None]
    result = []
    for image_valid in valid:
        rows, cols = image_valid.nonzero(as_tuple=True)
        result.append(torch.stack([shifts_y[rows], shifts_x[cols]], dim=1))
    return result


def translate(region: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """bool (H, W) region moved by (dy, dx); pixels pushed past the frame are dropped."""
    height, width = region.shape
    moved = torch.zeros_like(region)
    src_rows = slice(max(0, -dy), min(height, height - dy))
    src_cols = slice(max(0, -dx), min(width, width - dx))
    dst_rows = slice(max(0, dy), min(height, height + dy))
    dst_cols = slice(max(0, dx), min(width, width + dx))
    moved[dst_rows, dst_cols] = region[src_rows, src_cols]
    return moved


def seeded_translations(regions: torch.Tensor, fov: torch.Tensor, sample_keys, *, count: int,
                        purpose: str, avoid: torch.Tensor | None = None,
                        exclude_identity: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``count`` seeded translated copies of each image's region.

    regions, fov, avoid : bool (B, H, W). sample_keys : B ints. purpose : names the control in
    the seed (e.g. "lsr", "shape-deletion/gradcam"), so two controls draw independently.
    Returns (moved regions bool (count, B, H, W), placed bool (count, B)); unplaced copies are
    all False. Outputs are on the regions' device.
    """
    if count < 1:
        raise ValueError(f"count must be positive; got {count}")
    keys = [int(key) for key in sample_keys]
    if len(keys) != regions.shape[0]:
        raise ValueError(f"{len(keys)} sample keys for {regions.shape[0]} regions")
    candidates = valid_translations(regions, fov, avoid=avoid, exclude_identity=exclude_identity)
    moved = torch.zeros(count, *regions.shape, dtype=torch.bool)
    placed = torch.zeros(count, regions.shape[0], dtype=torch.bool)
    cpu_regions = regions.cpu()
    for image, (key, shifts) in enumerate(zip(keys, candidates)):
        if len(shifts) == 0:
            continue
        generator = torch.Generator().manual_seed(sample_key(f"placement/{purpose}/{key}"))
        chosen = torch.randperm(len(shifts), generator=generator)[:count]
        for slot, index in enumerate(chosen.tolist()):
            dy, dx = shifts[index].tolist()
            moved[slot, image] = translate(cpu_regions[image], dy, dx)
            placed[slot, image] = True
    return moved.to(regions.device), placed.to(regions.device)
