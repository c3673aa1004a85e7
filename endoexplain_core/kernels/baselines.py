"""Reference heat maps that carry no information from the model.

``random_heatmaps`` (seeded uniform noise, one stream per sample, the same on any device) and
``centre_gaussian`` (an isotropic Gaussian on the frame centre); both float32 (B, H, W) in
[0, 1], like the CAMs. Method: docs/maps_and_scores.md, "Spatial metrics and reference maps".
"""

from __future__ import annotations

import torch


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
