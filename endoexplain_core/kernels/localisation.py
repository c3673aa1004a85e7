"""Threshold-free and chance-normalised localisation scores, batched over images.

Conventions, shared by every function:
  maps    float (B, H, W), non-negative (CAMs are in [0, 1]); no NaN.
  masks   bool (B, H, W) (or 0/1), True = lesion M; every mask must be non-empty.
  fov     bool (B, H, W), True = the frame's visible area B (``field_of_view``); the lesion is
          always taken inside it (M := M & B), and a map only counts inside it (S := map * B).
  images  float (B, 3, H, W) or (B, H, W) in any per-channel affine scaling (raw [0, 1] or
          ImageNet-normalised); the grey level is the channel mean.
Results are tensors on the inputs' device; distances and radii are in pixels of the maps.
Scores: ``iou_curve`` / ``auc_iou`` (raw integral, maximum 0.9), ``top_k_sweep``,
``energy_lift_bits`` (bits; 0 = a uniform map), ``pointing_hits`` (hits and chance
|D_r| / |B|), ``dog_conspicuity``, ``soft_iou`` / ``c_score``.
Method: docs/maps_and_scores.md, "Threshold-free and chance-normalised scores".
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from endoexplain_core.kernels.cams import minmax_per_map
from endoexplain_core.kernels.metrics import as_masks, check_maps
from endoexplain_core.kernels.threshold import rank_order, kept_pixel_count

# 0.05, 0.10, ..., 0.95: the threshold grid of the area under the IoU curve.
DEFAULT_IOU_THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20))
FOV_RELATIVE_THRESHOLD = 0.02  # a pixel is "lit" above 2% of its image's intensity range
TOP_K_FRACTIONS = tuple(round(0.05 * i, 2) for i in range(1, 11))  # 5%, 10%, ..., 50%


def _check_fov(fov: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(fov, torch.Tensor) or fov.shape != like.shape:
        shape = tuple(fov.shape) if isinstance(fov, torch.Tensor) else type(fov).__name__
        raise ValueError(f"fov must be a bool tensor of shape {tuple(like.shape)}; got {shape}")
    fov = fov != 0 if fov.dtype != torch.bool else fov
    empty = (~fov.flatten(1).any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"field of view is empty at batch indices {empty}")
    return fov


def _grey(images: torch.Tensor) -> torch.Tensor:
    """float32 (B, H, W) grey level: the channel mean of (B, C, H, W), or (B, H, W) as is."""
    if not isinstance(images, torch.Tensor) or images.dim() not in (3, 4) or not images.is_floating_point():
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be a float tensor (B, C, H, W) or (B, H, W); got {shape}")
    return (images.mean(dim=1) if images.dim() == 4 else images).float()


# --- threshold-free IoU ---------------------------------------------------------------------------

def iou_curve(maps: torch.Tensor, masks: torch.Tensor, thresholds=DEFAULT_IOU_THRESHOLDS) -> torch.Tensor:
    """float32 (B, T): IoU of ``maps >= t`` with the lesion, for each threshold t (ascending or
    not; columns follow ``thresholds``). An all-zero map keeps no pixel at t > 0 (IoU 0)."""
    masks = as_masks(masks)
    check_maps(maps, masks)
    levels = torch.as_tensor(tuple(thresholds), dtype=maps.dtype, device=maps.device)
    if levels.dim() != 1 or levels.numel() == 0:
        raise ValueError(f"thresholds must be a non-empty 1-D sequence; got {thresholds!r}")
    # One pass: bucket k of a pixel = number of thresholds <= its value, so the pixel is kept
    # at threshold j exactly when its bucket is > j; per-image bucket counts (all pixels and
    # lesion pixels) summed from the top give every threshold's kept and intersection counts.
    order = torch.argsort(levels)
    sorted_levels = levels[order]
    buckets = torch.bucketize(maps, sorted_levels, right=True).flatten(1)       # (B, N) in 0..T
    batch, count = buckets.shape[0], sorted_levels.numel() + 1
    offsets = (torch.arange(batch, device=maps.device) * count)[:, None]
    flat = (buckets + offsets).flatten()
    kept = torch.bincount(flat, minlength=batch * count).reshape(batch, count)
    inside = torch.bincount(flat, weights=masks.flatten().double(), minlength=batch * count).reshape(batch, count)
    kept_at = kept.flip(1).cumsum(1).flip(1)[:, 1:].double()                    # (B, T) sorted order
    inside_at = inside.flip(1).cumsum(1).flip(1)[:, 1:]
    mask_area = masks.sum(dim=(1, 2)).double()[:, None]
    curve = (inside_at / (kept_at + mask_area - inside_at)).float()
    return curve[:, torch.argsort(order)]


def auc_iou(maps: torch.Tensor, masks: torch.Tensor, thresholds=None) -> torch.Tensor:
    """float32 (B,): trapezoid integral of ``iou_curve`` over ``thresholds`` (default: the 19
    thresholds 0.05..0.95). Raw integral, not divided by the threshold span: its maximum is
    the span (0.9 by default), reached by a binary map equal to the mask."""
    thresholds = DEFAULT_IOU_THRESHOLDS if thresholds is None else tuple(thresholds)
    if len(thresholds) < 2 or any(b <= a for a, b in zip(thresholds, thresholds[1:])):
        raise ValueError(f"auc_iou needs at least two increasing thresholds; got {thresholds}")
    curve = iou_curve(maps, masks, thresholds)
    levels = torch.as_tensor(thresholds, dtype=curve.dtype, device=curve.device)
    return torch.trapezoid(curve, levels, dim=1)


# --- field of view and tolerance zone -------------------------------------------------------------

def field_of_view(images: torch.Tensor, masks: torch.Tensor | None = None,
                  relative_threshold: float = FOV_RELATIVE_THRESHOLD) -> torch.Tensor:
    """bool (B, H, W): the visible area B of each endoscopy frame: pixels whose grey level exceeds
    the image's minimum by more than ``relative_threshold`` of its range, holes filled, largest
    8-connected region kept; ``masks``, when given, are joined in. A frame with no range is all in
    view. Returned on the images' device (connectivity computed on the CPU)."""
    if not 0 <= relative_threshold < 1:
        raise ValueError(f"relative_threshold must be in [0, 1); got {relative_threshold}")
    grey = _grey(images)
    low = grey.amin(dim=(1, 2), keepdim=True)
    span = grey.amax(dim=(1, 2), keepdim=True) - low
    lit = (grey - low > relative_threshold * span) | (span <= 0)
    eight_connected = np.ones((3, 3), dtype=bool)
    frames = []
    for frame in lit.cpu().numpy():
        filled = ndimage.binary_fill_holes(frame)
        labels, count = ndimage.label(filled, structure=eight_connected)
        if count > 1:
            sizes = np.bincount(labels.ravel())
            sizes[0] = 0
            filled = labels == int(sizes.argmax())
        frames.append(filled)
    fov = torch.from_numpy(np.stack(frames)).to(grey.device)
    if masks is not None:
        masks = as_masks(masks)
        if masks.shape != fov.shape:
            raise ValueError(f"masks {tuple(masks.shape)} and images {tuple(fov.shape)} differ in size")
        fov = fov | masks
    return fov


def _disc_kernel(radius_px: float, device) -> torch.Tensor:
    """float32 (1, 1, 2R+1, 2R+1): 1 where dy^2 + dx^2 <= radius^2 (Euclidean disc)."""
    reach = int(math.floor(radius_px))
    offsets = torch.arange(-reach, reach + 1, dtype=torch.float32, device=device)
    disc = (offsets[:, None] ** 2 + offsets[None, :] ** 2) <= radius_px ** 2
    return disc.float()[None, None]


def tolerance_zone(masks: torch.Tensor, fov: torch.Tensor, radius_px: float) -> torch.Tensor:
    """bool (B, H, W): D_r, the lesion dilated by a Euclidean disc of ``radius_px`` pixels
    (pixel centres at distance <= r from a lesion pixel centre), kept inside the field of
    view. ``radius_px = 0`` gives D_0 = the lesion inside B. Runs on the masks' device."""
    masks = as_masks(masks)
    fov = _check_fov(fov, masks)
    if radius_px < 0 or not math.isfinite(radius_px):
        raise ValueError(f"radius_px must be a finite number >= 0; got {radius_px}")
    lesion = masks & fov
    if radius_px < 1:
        return lesion
    kernel = _disc_kernel(radius_px, masks.device)
    reach = kernel.shape[-1] // 2
    dilated = F.conv2d(lesion.float()[:, None], kernel, padding=reach)[:, 0] > 0.5
    return dilated & fov


# --- chance-normalised scores ---------------------------------------------------------------------

def saliency_free(maps: torch.Tensor, fov: torch.Tensor) -> torch.Tensor:
    """bool (B,): the map has no positive value inside the field of view (scored as uniform)."""
    check_maps(maps)
    fov = _check_fov(fov, maps)
    return ~((maps.clamp(min=0) * fov) > 0).flatten(1).any(dim=1)


def energy_lift_bits(maps: torch.Tensor, masks: torch.Tensor, fov: torch.Tensor,
                     alpha: float) -> torch.Tensor:
    """float32 (B,): energy lift lambda_E in bits, computed in float64. S = max(map, 0) inside B;
    M = mask inside B. Maps with no saliency inside B score 0 bits (uniform; ``saliency_free``);
    a lesion covering all of B scores NaN (no background)."""
    masks = as_masks(masks)
    check_maps(maps, masks)
    fov = _check_fov(fov, masks)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 (it keeps lambda_E finite); got {alpha}")
    lesion = masks & fov
    # Elementwise work in the maps' precision, sums accumulated in float64.
    saliency = maps.clamp(min=0) * fov
    total = saliency.sum(dim=(1, 2), dtype=torch.float64)
    lesion_area = lesion.sum(dim=(1, 2), dtype=torch.float64)
    fov_area = fov.sum(dim=(1, 2), dtype=torch.float64)
    background_area = fov_area - lesion_area
    if (lesion_area == 0).any():
        raise ValueError("masks have no pixel inside the field of view at batch indices "
                         f"{(lesion_area == 0).nonzero().flatten().tolist()}")
    pi = lesion_area / fov_area
    share = (saliency * lesion).sum(dim=(1, 2), dtype=torch.float64) / torch.where(total > 0, total, torch.ones_like(total))
    share = torch.where(total > 0, share, pi)  # no saliency in B: a uniform map's share
    mixed = (share + alpha * pi) / (1 + alpha)
    lift = torch.log2((mixed / lesion_area) / ((1 - mixed) / background_area))
    lift = torch.where(total > 0, lift, torch.zeros_like(lift))
    return torch.where(background_area > 0, lift, torch.full_like(lift, float("nan"))).float()


def gaussian_smooth(maps: torch.Tensor, sigma_px: float, edges: str = "replicate") -> torch.Tensor:
    """float32 (B, H, W): separable Gaussian blur, kernel radius ceil(3 sigma). ``edges``:
    "replicate" (the border pixel repeated) or "wrap" (periodic). ``sigma_px = 0`` returns the
    maps unchanged (as float32)."""
    if sigma_px < 0 or not math.isfinite(sigma_px):
        raise ValueError(f"sigma_px must be a finite number >= 0; got {sigma_px}")
    if edges not in ("replicate", "wrap"):
        raise ValueError(f"edges must be 'replicate' or 'wrap'; got {edges!r}")
    maps = maps.float()
    if sigma_px == 0:
        return maps
    reach = max(1, int(math.ceil(3 * sigma_px)))
    if edges == "wrap" and reach >= min(maps.shape[-2:]):
        raise ValueError(f"sigma_px {sigma_px} is too wide to wrap around a "
                         f"{maps.shape[-2]}x{maps.shape[-1]} map (kernel radius {reach} px must be "
                         f"smaller than both sides)")
    mode = "replicate" if edges == "replicate" else "circular"
    offsets = torch.arange(-reach, reach + 1, dtype=torch.float32, device=maps.device)
    weights = torch.exp(-offsets ** 2 / (2 * sigma_px ** 2))
    weights = weights / weights.sum()
    planes = maps[:, None]
    planes = F.conv2d(F.pad(planes, (reach, reach, 0, 0), mode=mode), weights.view(1, 1, 1, -1))
    planes = F.conv2d(F.pad(planes, (0, 0, reach, reach), mode=mode), weights.view(1, 1, -1, 1))
    return planes[:, 0]


def pointing_hits(maps: torch.Tensor, masks: torch.Tensor, fov: torch.Tensor, *,
                  radius_px: float, smooth_sigma_px: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(hits bool (B,), chance float32 (B,)): the pointing game against its chance level.

    The peak is the first row-major maximum inside B of the map smoothed by ``smooth_sigma_px``
    (edges wrapped; 0 = none); a hit is a peak inside ``tolerance_zone(masks, fov, radius_px)``;
    chance = |D_r| / |B|. A map constant inside B has an arbitrary peak (the first pixel of B).
    """
    masks = as_masks(masks)
    check_maps(maps, masks)
    fov = _check_fov(fov, masks)
    zone = tolerance_zone(masks, fov, radius_px)
    return peak_in_zone(maps, zone, fov, smooth_sigma_px=smooth_sigma_px), pointing_chance(zone, fov)


def pointing_chance(zone: torch.Tensor, fov: torch.Tensor) -> torch.Tensor:
    """float32 (B,): |D_r| / |B|, the hit rate of a peak drawn uniformly in the field of view."""
    return zone.flatten(1).sum(dim=1).float() / fov.flatten(1).sum(dim=1).float()


def peak_in_zone(maps: torch.Tensor, zone: torch.Tensor, fov: torch.Tensor, *,
                 smooth_sigma_px: float) -> torch.Tensor:
    """bool (B,): the smoothed map's (edges wrapped) first row-major maximum inside ``fov`` lies in
    ``zone`` (a precomputed ``tolerance_zone``: ``pointing_hits`` without recomputing it per map)."""
    smoothed = gaussian_smooth(maps, smooth_sigma_px, edges="wrap")
    restricted = torch.where(fov, smoothed, torch.full_like(smoothed, -math.inf)).flatten(1)
    batch, n_pixels = restricted.shape
    index = torch.arange(n_pixels, device=maps.device).expand(batch, -1)
    at_max = restricted == restricted.amax(dim=1, keepdim=True)
    peak = torch.where(at_max, index, n_pixels).amin(dim=1)
    return zone.flatten(1).gather(1, peak[:, None])[:, 0]


# --- a classifier-free reference map --------------------------------------------------------------

def dog_conspicuity(images: torch.Tensor, sigma_small_px: float, sigma_large_px: float,
                    fov: torch.Tensor | None = None) -> torch.Tensor:
    """float32 (B, H, W) in [0, 1]: difference-of-Gaussians conspicuity max(0, I * g_small -
    I * g_large) of the grey level I, no classifier, min-max per image (no positive value: all
    zeros). With ``fov`` both blurs are normalised inside the field of view and D is 0 outside it;
    without, edges are replicated. Needs 0 < ``sigma_small_px`` < ``sigma_large_px``."""
    if not 0 < sigma_small_px < sigma_large_px:
        raise ValueError(f"need 0 < sigma_small_px < sigma_large_px; got {sigma_small_px}, {sigma_large_px}")
    grey = _grey(images)
    if fov is None:
        difference = gaussian_smooth(grey, sigma_small_px) - gaussian_smooth(grey, sigma_large_px)
    else:
        fov = _check_fov(fov, grey).float()
        weight_small = gaussian_smooth(fov, sigma_small_px).clamp(min=1e-6)
        weight_large = gaussian_smooth(fov, sigma_large_px).clamp(min=1e-6)
        difference = (gaussian_smooth(grey * fov, sigma_small_px) / weight_small
                      - gaussian_smooth(grey * fov, sigma_large_px) / weight_large) * fov
    return minmax_per_map(difference.clamp(min=0))


# --- top-k sweep ----------------------------------------------------------------------------------

def top_k_sweep(maps: torch.Tensor, masks: torch.Tensor, fractions=TOP_K_FRACTIONS
                ) -> dict[str, torch.Tensor]:
    """IoU and energy of the top-k set for each fraction k: ``{"iou": (B, K), "energy": (B, K)}``
    float32. The top-k set is ``threshold.top_fraction_mask``'s (exact count, same tie-break);
    energy is the share of its saliency inside the lesion (no saliency: its lesion pixel share)."""
    masks = as_masks(masks)
    check_maps(maps, masks)
    return _sweep_from_ranking(_Ranking(maps, masks), fractions)


class _Ranking:
    """One ranking of every map's pixels (``threshold.rank_order``: value, then tie-break
    priority) with running sums over it: every top-k set and every ``map >= t`` set is a
    prefix, so its lesion count and saliency sums are read off without building a mask."""

    def __init__(self, maps: torch.Tensor, masks: torch.Tensor):
        self.shape = maps.shape
        order = rank_order(maps)
        self.values = maps.flatten(1).gather(1, order)                          # (B, N) descending
        weights = self.values.double().clamp(min=0)
        in_lesion = masks.flatten(1).gather(1, order)
        self.lesion_running = in_lesion.double().cumsum(1)
        self.weight_running = weights.cumsum(1)
        self.lesion_weight_running = (weights * in_lesion).cumsum(1)
        self.mask_area = masks.flatten(1).sum(dim=1).double()

    def lesion_in_prefix(self, counts: torch.Tensor) -> torch.Tensor:
        """float64 (B, K): lesion pixels among the first ``counts`` (B, K) ranked pixels."""
        padded = F.pad(self.lesion_running, (1, 0))                            # prefix of 0 -> 0
        return padded.gather(1, counts)


def _sweep_from_ranking(ranking: _Ranking, fractions) -> dict[str, torch.Tensor]:
    batch, height, width = ranking.shape
    device = ranking.values.device
    counts = [kept_pixel_count(float(fraction), height, width) for fraction in fractions]
    last = torch.as_tensor(counts, device=device) - 1                          # (K,) prefix ends
    intersection = ranking.lesion_running[:, last]                             # (B, K)
    kept_count = torch.as_tensor(counts, dtype=torch.float64, device=device)[None, :]
    iou = intersection / (kept_count + ranking.mask_area[:, None] - intersection)
    kept = ranking.weight_running[:, last]
    inside = ranking.lesion_weight_running[:, last]
    energy = torch.where(kept > 0, inside / kept.clamp(min=1e-300), intersection / kept_count)
    return {"iou": iou.float(), "energy": energy.float()}


def curve_and_sweep(maps: torch.Tensor, masks: torch.Tensor, thresholds=DEFAULT_IOU_THRESHOLDS,
                    fractions=TOP_K_FRACTIONS) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(``iou_curve(maps, masks, thresholds)``, ``top_k_sweep(maps, masks, fractions)``) from
    one ranking of the pixels: ``map >= t`` keeps the prefix of pixels with value >= t, so the
    curve's counts come from the same running sums as the sweep (equal values, one sort)."""
    masks = as_masks(masks)
    check_maps(maps, masks)
    ranking = _Ranking(maps, masks)
    levels = torch.as_tensor(tuple(thresholds), dtype=maps.dtype, device=maps.device)
    if levels.dim() != 1 or levels.numel() == 0:
        raise ValueError(f"thresholds must be a non-empty 1-D sequence; got {thresholds!r}")
    # number of ranked values >= t = position of -t in the ascending sequence -values
    kept = torch.searchsorted(-ranking.values, (-levels).expand(len(maps), -1).contiguous(), right=True)
    inside = ranking.lesion_in_prefix(kept)
    curve = (inside / (kept.double() + ranking.mask_area[:, None] - inside)).float()
    return curve, _sweep_from_ranking(ranking, fractions)


# --- consistency across images --------------------------------------------------------------------

def soft_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32 (...): soft IoU sum min(a, b) / sum max(a, b) over the last two dimensions of
    two non-negative maps of the same shape (..., H, W). Two all-zero maps agree fully (1)."""
    if a.shape != b.shape or a.dim() < 2:
        raise ValueError(f"soft_iou needs two maps of one shape (..., H, W); got {tuple(a.shape)}, {tuple(b.shape)}")
    if (a < 0).any() or (b < 0).any():
        raise ValueError("soft_iou needs non-negative maps")
    low = torch.minimum(a, b).double().sum(dim=(-2, -1))
    high = torch.maximum(a, b).double().sum(dim=(-2, -1))
    return torch.where(high > 0, low / high.clamp(min=1e-300), torch.ones_like(high)).float()


def c_score(maps: torch.Tensor, weights: torch.Tensor, resolution: int = 64,
            block_size: int = 256) -> float:
    """Confidence-weighted mean pairwise soft IoU of N maps (N, H, W) -> float in [0, 1].

    weights : (N,) finite, >= 0, positive on at least two maps; N >= 2. Maps are area-resized to
    ``resolution`` x ``resolution`` first and all-zero maps count as uniform; L1 distances are
    taken ``block_size`` rows at a time (memory O(block_size * N)).
    """
    check_maps(maps)
    weights = torch.as_tensor(weights, dtype=torch.float64, device=maps.device).flatten()
    count = maps.shape[0]
    if count < 2 or weights.numel() != count:
        raise ValueError(f"c_score needs N >= 2 maps and N weights; got {count} maps, {weights.numel()} weights")
    if (weights < 0).any() or not torch.isfinite(weights).all():
        raise ValueError("c_score weights must be finite and >= 0")
    if (maps < 0).any():
        raise ValueError("c_score needs non-negative maps")
    pair_total = (weights.sum() ** 2 - (weights ** 2).sum()) / 2
    if pair_total <= 0:
        raise ValueError("c_score needs a positive weight on at least two maps")
    weighted_sum = torch.zeros((), dtype=torch.float64, device=maps.device)
    for start, stop, similarity in _soft_iou_blocks(maps, resolution, block_size):
        pair_weights = weights[start:stop, None] * weights[None, :]
        upper = torch.arange(start, stop, device=maps.device)[:, None] < torch.arange(count, device=maps.device)[None, :]
        weighted_sum += (similarity * pair_weights * upper).sum()
    return float(weighted_sum / pair_total)


def _soft_iou_blocks(maps: torch.Tensor, resolution: int | None, block_size: int):
    """Yield (start, stop, soft IoU of maps[start:stop] with every map (b, N), float64) after
    the C-Score's preparation: all-zero maps count as uniform, maps area-resized to
    ``resolution`` (None: as they are)."""
    count = maps.shape[0]
    constant = maps.amax(dim=(1, 2)) <= 0
    maps = torch.where(constant[:, None, None], torch.ones_like(maps), maps)
    if resolution is not None and maps.shape[-2:] != (resolution, resolution):
        maps = F.adaptive_avg_pool2d(maps[:, None].float(), resolution)[:, 0]
    flat = maps.reshape(count, -1).double()
    mass = flat.sum(dim=1)
    for start in range(0, count, block_size):
        stop = min(start + block_size, count)
        distance = torch.cdist(flat[start:stop], flat, p=1)               # (b, N)
        both = mass[start:stop, None] + mass[None, :]
        yield start, stop, (both - distance) / (both + distance).clamp(min=1e-300)


def pairwise_soft_iou(maps: torch.Tensor, resolution: int | None = 64, block_size: int = 256) -> torch.Tensor:
    """float64 (N, N): the soft IoU of every pair of N non-negative maps (N, H, W), prepared as
    ``c_score`` prepares them (all-zero maps uniform, area-resized to ``resolution``; None keeps
    the native size); the diagonal is 1. ``c_score`` is its weighted mean over the pairs i < j;
    the matrix is what a bootstrap over images needs (``analysis.stats.weighted_pair_mean_ci``).
    Memory O(N^2)."""
    check_maps(maps)
    if (maps < 0).any():
        raise ValueError("pairwise_soft_iou needs non-negative maps")
    matrix = torch.empty((maps.shape[0], maps.shape[0]), dtype=torch.float64, device=maps.device)
    for start, stop, similarity in _soft_iou_blocks(maps, resolution, block_size):
        matrix[start:stop] = similarity
    return matrix
