"""Does the classifier use the lesion, and does a CAM's region matter beyond its shape?

``lesion_specific_reliance``: LSR = drop(D_r filled) - mean over up to ``n_regions``
comparison regions k of drop(region_k filled), drops in z / T (intact minus filled), fills by
noisy linear imputation, the regions D_r translated to seeded places in the field of view that
do not overlap it; NaN without a comparison region. ``shape_preserving_deletion``: a CAM's
top-area region deleted as the deletion test deletes, in place and at ``repetitions`` seeded
translations. Method: docs/maps_and_scores.md, "Lesion-specific reliance and shape-preserving
deletion".
"""

from __future__ import annotations

import torch
from torch import nn

from endoexplain_core.kernels import deletion, placement, road



def lsr_noise_key(sample_key: int, slot: int) -> int:
    """Imputation-noise seed of the zone (slot 0) or comparison region ``slot`` of a sample."""
    return deletion.sample_key(f"lsr/{int(sample_key)}/{int(slot)}")


def lesion_specific_reliance(model: nn.Module, images: torch.Tensor, zones: torch.Tensor,
                             fov: torch.Tensor, sample_keys, *, temperature: float,
                             n_regions: int, noise_std: float,
                             chunk_size: int | None = None,
                             reference_z: torch.Tensor | None = None,
                             timings: dict | None = None) -> dict[str, torch.Tensor]:
    """LSR of every image.

    images : (B, C, H, W) normalised, on the model's device. zones : bool (B, H, W), D_r.
    fov : bool (B, H, W). sample_keys : B ints. Returns float64/int64 (B,) tensors (CPU):
    ``zone_drop``, ``region_drop_mean`` (NaN without a region), ``n_regions`` and ``lsr``,
    plus ``region_drops`` (n_regions, B) with NaN for unplaced regions.
    """
    batch = images.shape[0]
    keys = [int(key) for key in sample_keys]
    chunk_size = batch if chunk_size is None else chunk_size
    if reference_z is None:
        reference_z = road.forward_scaled_z(model, images, temperature, chunk_size)
    regions, placed = placement.seeded_translations(zones, fov, keys, count=n_regions,
                                                    purpose="lsr", avoid=zones)
    removed = torch.cat([zones[None], regions])                           # (1 + R, B, H, W)
    slots = removed.shape[0]
    # Only images with a placed region need that slot's solve and forward.
    wanted = torch.cat([torch.ones(1, batch, dtype=torch.bool, device=placed.device), placed])
    flat_wanted = wanted.flatten().cpu()
    expanded = images[None].expand(slots, *images.shape).flatten(0, 1)[flat_wanted.to(images.device)]
    noise_keys = [lsr_noise_key(key, slot) for slot in range(slots) for key in keys]
    noise_keys = [k for k, keep in zip(noise_keys, flat_wanted.tolist()) if keep]
    scores = road.impute_and_score(model, expanded, removed.flatten(0, 1)[flat_wanted.to(removed.device)],
                                   noise_keys, temperature=temperature, noise_std=noise_std,
                                   chunk_size=chunk_size, timings=timings)
    all_scores = torch.full((slots * batch,), float("nan"), dtype=torch.float64)
    all_scores[flat_wanted] = scores.cpu()
    drops = reference_z.double().cpu()[None] - all_scores.reshape(slots, batch)
    region_drops = drops[1:]
    n_placed = placed.sum(dim=0).cpu()
    region_mean = torch.where(n_placed > 0, region_drops.nan_to_num(0.0).sum(dim=0)
                              / n_placed.clamp(min=1), torch.full((batch,), float("nan"), dtype=torch.float64))
    return {"zone_drop": drops[0], "region_drops": region_drops, "region_drop_mean": region_mean,
            "n_regions": n_placed.long(), "lsr": drops[0] - region_mean}


def shape_preserving_deletion(model: nn.Module, images: torch.Tensor, top_regions: torch.Tensor,
                              fov: torch.Tensor, sample_keys, *, method: str,
                              repetitions: int,
                              reference_logits: torch.Tensor | None = None,
                              chunk_size: int | None = None) -> dict[str, torch.Tensor]:
    """Deletion of one CAM's top region and of its seeded translations.

    top_regions : bool (B, H, W), the CAM's top-area pixels. method : the CAM's name (in the
    seed). Returns CPU float64 drops of the positive logit: ``cam_drop`` (B,), ``shifted_drops``
    (R, B; NaN where not placed), ``shifted_drop_mean``, ``n_shifts`` and, in z, ``cam_z_drop``
    and ``shifted_z_drop_mean``.
    """
    batch = images.shape[0]
    keys = [int(key) for key in sample_keys]
    model.eval()
    if reference_logits is None:
        with torch.no_grad():
            reference_logits = model(images)
    shifted, placed = placement.seeded_translations(top_regions, fov, keys, count=repetitions,
                                                    purpose=f"shape-deletion/{method}")
    keeps = torch.cat([top_regions[None], shifted])                      # (1 + R, B, H, W)
    logits = deletion.deletion_logits(model, images, keeps, chunk_size=chunk_size).double().cpu()
    reference = reference_logits.double().cpu()
    positive_drop = deletion.logit_drops(reference, logits)             # (1 + R, B)
    z_drop = deletion.logit_difference_drops(reference, logits)
    valid = torch.cat([torch.ones(1, batch, dtype=torch.bool), placed.cpu()])
    positive_drop = torch.where(valid, positive_drop, torch.nan)
    z_drop = torch.where(valid, z_drop, torch.nan)
    n_shifts = placed.sum(dim=0).cpu()

    def mean_shifted(values: torch.Tensor) -> torch.Tensor:
        total = values[1:].nan_to_num(0.0).sum(dim=0)
        return torch.where(n_shifts > 0, total / n_shifts.clamp(min=1), torch.nan)

    return {"cam_drop": positive_drop[0], "shifted_drops": positive_drop[1:],
            "shifted_drop_mean": mean_shifted(positive_drop), "n_shifts": n_shifts.long(),
            "cam_z_drop": z_drop[0], "shifted_z_drop_mean": mean_shifted(z_drop)}
