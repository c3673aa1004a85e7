"""ROAD (RemOve And Debias) and the symmetric relevance gain (SRG) of a saliency map.

Per map and fraction f, the ``round(f * |B|)`` most- (MoRF) or least-salient (LeRF) pixels of
the field of view B (ties by ``threshold.tie_break_priority``) are filled by noisy linear
imputation (``imputation``) and re-scored. Drops are z/T(intact) - z/T(filled) in float64
(z = logit_pos - logit_neg); SRG = mean over the fractions of drop(MoRF) - drop(LeRF). An
image's imputation noise depends on (sample, order, fraction), not on the map.
Method: docs/maps_and_scores.md, "ROAD and SRG".
"""

from __future__ import annotations

import time

import torch
from torch import nn

from endoexplain_core.kernels import deletion, imputation
from endoexplain_core.kernels.threshold import tie_break_priority

ORDERS = ("morf", "lerf")


def _check_maps_fov(maps: torch.Tensor, fov: torch.Tensor) -> None:
    if not isinstance(maps, torch.Tensor) or maps.dim() != 3 or not maps.is_floating_point():
        shape = tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__
        raise ValueError(f"maps must be a float tensor (B, H, W); got {shape}")
    if not isinstance(fov, torch.Tensor) or fov.dtype != torch.bool or fov.shape != maps.shape:
        raise ValueError(f"fov must be a bool tensor of shape {tuple(maps.shape)}")
    if torch.isnan(maps).any():
        raise ValueError("maps contain NaN values")


def removal_counts(fov: torch.Tensor, fractions) -> torch.Tensor:
    """int64 (F, B): ``round(f * |B|)`` field-of-view pixels removed at each fraction f."""
    if not all(0 < f <= 1 for f in fractions):
        raise ValueError(f"fractions must lie in (0, 1]; got {list(fractions)}")
    areas = fov.flatten(1).sum(dim=1).tolist()
    return torch.tensor([[round(f * area) for area in areas] for f in fractions], dtype=torch.int64)


def removal_order(maps: torch.Tensor, fov: torch.Tensor, order: str) -> torch.Tensor:
    """int64 (B, H*W): flattened pixel indices in removal order for ``order`` ("morf" or
    "lerf"); field-of-view pixels first, ties by the fixed priority, then the rest."""
    _check_maps_fov(maps, fov)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}; got {order!r}")
    batch, height, width = maps.shape
    n_pixels = height * width
    values = maps.double() if order == "morf" else -maps.double()
    values = torch.where(fov, values, torch.full_like(values, -torch.inf)).reshape(batch, n_pixels)
    by_priority = torch.argsort(tie_break_priority(n_pixels, maps.device), stable=True)
    ranked = torch.sort(values[:, by_priority], dim=1, descending=True, stable=True).indices
    return by_priority[ranked]


def road_removal_masks(maps: torch.Tensor, fov: torch.Tensor, order: str,
                       fractions) -> torch.Tensor:
    """bool (F, B, H, W): the pixels removed at each fraction for ``order``; nested (the 2%
    set contains the 1% set) and inside the field of view."""
    ranked = removal_order(maps, fov, order)
    counts = removal_counts(fov, fractions).to(maps.device)            # (F, B)
    batch, height, width = maps.shape
    position = torch.empty_like(ranked)
    position.scatter_(1, ranked, torch.arange(height * width, device=maps.device).expand(batch, -1))
    return (position[None] < counts[:, :, None]).reshape(len(fractions), batch, height, width)


def road_noise_key(sample_key: int, order: str, fraction: float) -> int:
    """Imputation-noise seed of one (sample, order, fraction), shared by all of its maps."""
    return deletion.sample_key(f"road/{int(sample_key)}/{order}/{fraction:.6f}")


def scaled_logit_difference(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """z / T of (..., K) logits, float64 -> (...)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    return deletion.logit_difference(logits.double()) / temperature


def forward_scaled_z(model: nn.Module, images: torch.Tensor, temperature: float,
                     chunk_size: int) -> torch.Tensor:
    """float64 (N,): z / T of ``images`` (N, C, H, W), ``chunk_size`` images per no-grad forward."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")
    model.eval()
    with torch.no_grad():
        return torch.cat([scaled_logit_difference(model(images[start:start + chunk_size]), temperature)
                          for start in range(0, images.shape[0], chunk_size)])


def _add_time(timings: dict | None, key: str, started: float, device: torch.device) -> None:
    if timings is None:
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timings[key] = timings.get(key, 0.0) + time.perf_counter() - started


def impute_and_score(model: nn.Module, images: torch.Tensor, removed: torch.Tensor, noise_keys,
                     *, temperature: float, noise_std: float, chunk_size: int,
                     timings: dict | None = None) -> torch.Tensor:
    """z / T after filling ``removed`` (bool (N, H, W); ``images`` (N, C, H, W) already
    expanded to one row per removal) by noisy linear imputation. Returns float64 (N,).
    ``timings`` (optional dict) accumulates ``imputation_s``, ``forward_s`` and ``forwards``."""
    started = time.perf_counter()
    filled, _ = imputation.noisy_linear_imputation(images, removed, noise_keys=noise_keys,
                                                   noise_std=noise_std)
    _add_time(timings, "imputation_s", started, images.device)
    started = time.perf_counter()
    scores = forward_scaled_z(model, filled, temperature, chunk_size)
    _add_time(timings, "forward_s", started, images.device)
    if timings is not None:
        timings["forwards"] = timings.get("forwards", 0) + images.shape[0]
    return scores


def road_drops(model: nn.Module, images: torch.Tensor, maps: dict[str, torch.Tensor],
               fov: torch.Tensor, sample_keys, *, temperature: float,
               fractions, noise_std: float,
               chunk_size: int | None = None, reference_z: torch.Tensor | None = None,
               timings: dict | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """ROAD drops of every map: ``{method: {"morf": (F, B), "lerf": (F, B)}}`` float64, in z/T.

    images : (B, C, H, W) normalised input on the model's device. maps : method -> float
    (B, H, W). fov : bool (B, H, W). sample_keys : B ints (``deletion.sample_key``).
    chunk_size : images per forward (default B). reference_z : z / T of the intact images (B,),
    if already known (saves a forward).
    """
    batch = images.shape[0]
    keys = [int(key) for key in sample_keys]
    if len(keys) != batch:
        raise ValueError(f"{len(keys)} sample keys for {batch} images")
    chunk_size = batch if chunk_size is None else chunk_size
    if reference_z is None:
        reference_z = forward_scaled_z(model, images, temperature, chunk_size)
    reference_z = reference_z.double().to(images.device)
    noise_keys = [road_noise_key(key, order, fraction)
                  for order in ORDERS for fraction in fractions for key in keys]
    expanded = images[None].expand(len(ORDERS) * len(fractions), *images.shape).flatten(0, 1)
    drops: dict[str, dict[str, torch.Tensor]] = {}
    for method, method_maps in maps.items():
        _check_maps_fov(method_maps, fov)
        removed = torch.cat([road_removal_masks(method_maps, fov, order, fractions)
                             for order in ORDERS]).flatten(0, 1)           # (2F*B, H, W)
        scores = impute_and_score(model, expanded, removed, noise_keys, temperature=temperature,
                                  noise_std=noise_std, chunk_size=chunk_size, timings=timings)
        scores = scores.reshape(len(ORDERS), len(fractions), batch)
        drops[method] = {order: reference_z[None] - scores[index]
                         for index, order in enumerate(ORDERS)}
    return drops


def symmetric_relevance_gain(morf_drops: torch.Tensor, lerf_drops: torch.Tensor) -> torch.Tensor:
    """SRG per image: mean over the fraction axis (0) of ``morf - lerf``; (F, B) -> (B,)."""
    if morf_drops.shape != lerf_drops.shape:
        raise ValueError(f"MoRF {tuple(morf_drops.shape)} and LeRF {tuple(lerf_drops.shape)} differ")
    return (morf_drops - lerf_drops).mean(dim=0)
