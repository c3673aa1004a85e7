"""Reference heat maps that carry no information from the model.

``random_heatmaps`` (seeded uniform noise, one stream per sample, the same on any device),
``centre_gaussian`` (an isotropic Gaussian on the frame centre) and ``salience_map`` (the
frame's own smoothed gradient magnitude, the salience null); all float32 (B, H, W) in [0, 1],
like the CAMs. Method: docs/maps_and_scores.md, "Spatial metrics and reference maps".
"""

from __future__ import annotations

import torch

from endoexplain_core.kernels import localisation
from endoexplain_core.kernels.cams import minmax_per_map

# Smoothing scale of the salience map, as a share of the shorter side: 0.03 is about 4 px at
# 128-136 px and 7 px at 224 px, an eighth of a feature-grid cell of the audited stride-32
# layers (27-32 px). Wide enough that the map measures regional contrast (a polyp's rim, a dye
# border, a highlight cluster) rather than pixel noise; narrow enough that a salient region's
# position stays resolved finer than any CAM grid can show it.
SALIENCE_SIGMA_FRACTION = 0.03


def random_heatmaps(sample_keys, height: int, width: int, device=None) -> torch.Tensor:
    """float32 (B, H, W) of independent U[0, 1) pixels, one ``torch.Generator`` per sample.

    sample_keys : sequence of B non-negative ints (``deletion.sample_key(sample_id)``), each
    seeding its own CPU generator, so a sample's map does not depend on the batch it is in.
    """
    sample_keys = [int(key) for key in sample_keys]
    if not sample_keys:
        raise ValueError("random_heatmaps needs at least one sample key")
    draws = [torch.rand(height, width, generator=torch.Generator().manual_seed(key))
             for key in sample_keys]  # B tiny draws; the generator must be per sample
    return torch.stack(draws).to(device)


def centre_gaussian(batch: int, height: int, width: int, sigma_fraction: float = 0.25,
                    device=None) -> torch.Tensor:
    """float32 (B, H, W): exp(-d^2 / (2 sigma^2)) around the frame centre, peak 1.

    d is the distance of the pixel centre (r + 0.5, c + 0.5) from (H / 2, W / 2) in pixels and
    sigma = sigma_fraction * min(H, W). Identical for every image of the batch.
    """
    if sigma_fraction <= 0:
        raise ValueError(f"sigma_fraction must be positive; got {sigma_fraction}")
    sigma = sigma_fraction * min(height, width)
    rows = torch.arange(height, dtype=torch.float64, device=device) + 0.5 - height / 2
    cols = torch.arange(width, dtype=torch.float64, device=device) + 0.5 - width / 2
    squared = rows[:, None] ** 2 + cols[None, :] ** 2
    gaussian = torch.exp(-squared / (2 * sigma ** 2))
    return (gaussian / gaussian.max()).float().expand(batch, height, width).contiguous()


def salience_map(images: torch.Tensor, sigma_fraction: float = SALIENCE_SIGMA_FRACTION
                 ) -> torch.Tensor:
    """float32 (B, H, W) in [0, 1]: where the frame itself is salient, with no model.

    ``images``: float (B, 3, H, W) in any per-channel affine scaling (the audit passes the
    normalised frames); the grey level I is the channel mean. Steps, per image:
      1. g_r = (I[r+1, c] - I[r-1, c]) / 2 and g_c = (I[r, c+1] - I[r, c-1]) / 2 (grey units
         per pixel), taken only where both neighbours lie in the field of view B
         (``localisation.field_of_view``) and 0 elsewhere, so the rim of the scope's view and
         the frame edge are no edge;
      2. M = sqrt(g_r^2 + g_c^2);
      3. M smoothed by a Gaussian of sigma = ``sigma_fraction`` x min(H, W) pixels, normalised
         inside B (G * (M B) / G * B, as ``localisation.dog_conspicuity``) and 0 outside B;
      4. min-max per image (``cams.minmax_per_map``): a frame without any gradient in view
         gives all zeros, a constant map, like a CAM without a peak.
    A bright square on a flat background gives a band along its sides (of width about 2 sigma)
    and zero in its interior further than 3 sigma from a side.
    """
    if not sigma_fraction > 0:
        raise ValueError(f"sigma_fraction must be positive; got {sigma_fraction}")
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be a float tensor (B, C, H, W); got {shape}")
    # One image at a time: a convolution's rounding may depend on the batch it runs in, and the
    # audit's maps must not (the case browser redraws them in other batches).
    return torch.cat([_salience_of_one(images[i:i + 1], sigma_fraction) for i in range(len(images))])


def _salience_of_one(image: torch.Tensor, sigma_fraction: float) -> torch.Tensor:
    """``salience_map`` of one frame (1, C, H, W) -> (1, H, W)."""
    grey = image.float().mean(dim=1)
    inside = localisation.field_of_view(image).float()
    rows = torch.zeros_like(grey)
    cols = torch.zeros_like(grey)
    rows[:, 1:-1] = (grey[:, 2:] - grey[:, :-2]) / 2 * inside[:, 2:] * inside[:, :-2]
    cols[:, :, 1:-1] = (grey[:, :, 2:] - grey[:, :, :-2]) / 2 * inside[:, :, 2:] * inside[:, :, :-2]
    magnitude = torch.sqrt(rows ** 2 + cols ** 2) * inside
    sigma = sigma_fraction * min(grey.shape[-2:])
    weight = localisation.gaussian_smooth(inside, sigma).clamp(min=1e-6)
    smoothed = localisation.gaussian_smooth(magnitude, sigma) / weight * inside
    return minmax_per_map(smoothed)
