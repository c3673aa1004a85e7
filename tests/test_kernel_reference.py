"""The kernels against independent references over many seeded random inputs, ties included.

Every test runs ``kernel_reference.check_against_reference``: a package kernel and a small
NumPy (or pytorch-grad-cam) reference written here from the kernel's stated rule, on 20-80
seeded random cases each, most of them batches of 1-4 (continuous, few-level, on-threshold,
constant, all-zero and one-peak maps; scattered, block, one-pixel and full masks, and empty
ones where a kernel accepts them). The hand cases of the other test files pin single
values; these check the rules everywhere else, ties and edge cases first.

Shared conventions of the references (from the kernels' docstrings):
- top-area and ROAD rankings: value first, then the fixed priority ``(i * 1_000_003) % N`` of
  the flattened row-major index i, lower first (``np.lexsort``: last key is the primary one);
- "first maximum" means the lowest row-major index (``np.argmax``);
- pixel (r, c) sits at (r + 0.5, c + 0.5).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from pytorch_grad_cam.metrics.road import NoisyLinearImputer
from scipy.sparse.linalg import MatrixRankWarning

from endoexplain_core import config
from endoexplain_core.kernels import (baselines, cams, deletion, imputation, localisation, map_priors,
                                      metrics, placement, randomisation, road, threshold)
from tests.kernel_reference import MASK_KINDS, Draw, check_against_reference

ROAD_FRACTIONS = tuple(config.FaithfulnessSettings().road_fractions)  # the profile default


def priority(n_pixels: int) -> np.ndarray:
    """Tie-break priority of each flattened pixel (lower wins)."""
    return (np.arange(n_pixels, dtype=np.int64) * 1_000_003) % n_pixels


def kept_count(fraction: float, height: int, width: int) -> int:
    """The top-area count as ``threshold.kept_pixel_count`` states it: Python's round of the
    float product ``fraction * height * width``, evaluated left to right. The order matters
    at decimal halves: 0.35 * 10 * 9 = 31.5 keeps 32 pixels, 0.35 * 90 = 31.499999999999996
    would keep 31 (151 such (fraction, H, W) on the 0.05 grid with sides below 40)."""
    return round(fraction * height * width)


def ref_top_fraction_mask(maps: np.ndarray, fraction: float) -> np.ndarray:
    """bool (B, H, W): the ``kept_count`` highest pixels of each map, ties by priority."""
    batch, height, width = maps.shape
    n_pixels = height * width
    keep = np.zeros((batch, n_pixels), dtype=bool)
    for b in range(batch):
        order = np.lexsort((priority(n_pixels), -maps[b].ravel()))
        keep[b, order[:kept_count(fraction, height, width)]] = True
    return keep.reshape(maps.shape)


def batch_of(draw: Draw, low: int = 1, high: int = 12) -> tuple[int, int, int]:
    return int(draw.rng.integers(1, 5)), draw.size(low, high), draw.size(low, high)


def maps_and_masks(draw: Draw, low: int = 1, high: int = 12):
    shape = batch_of(draw, low, high)
    return draw.maps(*shape), draw.masks(*shape, offset=draw.seed // 6)


# --- threshold ------------------------------------------------------------------------------------

def test_top_fraction_mask_keeps_the_highest_pixels_with_priority_ties():
    def inputs(draw):
        maps = draw.maps(*batch_of(draw))
        return maps, draw.fraction(*maps.shape[1:])

    check_against_reference(threshold.top_fraction_mask, ref_top_fraction_mask, inputs, seeds=range(80))


def test_tie_diagnostics_count_the_ties_at_the_maximum_and_at_the_boundary():
    def reference(maps, fraction):
        flat = maps.reshape(len(maps), -1)
        boundary = -np.sort(-flat, axis=1)[:, kept_count(fraction, *maps.shape[1:]) - 1]   # k-th largest
        return {"constant": flat.min(axis=1) == flat.max(axis=1),
                "max_multiplicity": (flat == flat.max(axis=1, keepdims=True)).sum(axis=1),
                "boundary_ties": (flat == boundary[:, None]).sum(axis=1)}

    def inputs(draw):
        maps = draw.maps(*batch_of(draw))
        return maps, draw.fraction(*maps.shape[1:])

    check_against_reference(threshold.tie_diagnostics, reference, inputs)


# --- spatial metrics ------------------------------------------------------------------------------

def weighted_centre(weights: np.ndarray) -> tuple[float, float]:
    """(row, col) centre of (H, W) non-negative weights, pixel centres at +0.5."""
    rows, cols = np.indices(weights.shape) + 0.5
    weights = weights.astype(np.float64)
    return (weights * rows).sum() / weights.sum(), (weights * cols).sum() / weights.sum()


def as_weights(single_map: np.ndarray) -> np.ndarray:
    """An all-zero map counts as uniform (the metrics' convention)."""
    return np.ones_like(single_map) if single_map.max() <= 0 else single_map


def ref_peak_location(maps):
    first = maps.reshape(len(maps), -1).argmax(axis=1)          # argmax: first maximum
    return first // maps.shape[2], first % maps.shape[2]


def ref_peak_outside_mask(maps, masks):
    rows, cols = ref_peak_location(maps)
    return np.array([not masks[b, rows[b], cols[b]] for b in range(len(maps))])


def ref_top_fraction_iou(keep, masks):
    return (keep & masks).sum(axis=(1, 2)) / (keep | masks).sum(axis=(1, 2))


def ref_energy_in_mask(maps, masks):
    return np.array([as_weights(m).astype(np.float64)[k].sum() / as_weights(m).astype(np.float64).sum()
                     for m, k in zip(maps, masks)])


def ref_centre_of_mass_distance(maps, masks):
    height, width = maps.shape[1:]
    return np.array([math.dist(weighted_centre(as_weights(m)), weighted_centre(k))
                     for m, k in zip(maps, masks)]) / math.hypot(height, width)


def ref_lesion_area_fraction(masks):
    return masks.mean(axis=(1, 2))


def ref_lesion_centre_distance(masks):
    height, width = masks.shape[1:]
    return np.array([math.dist(weighted_centre(k), (height / 2, width / 2)) for k in masks]) \
        / (math.hypot(height, width) / 2)


@pytest.mark.parametrize("kernel,reference,arguments", [
    (metrics.peak_location, ref_peak_location, "maps"),
    (metrics.peak_outside_mask, ref_peak_outside_mask, "maps, masks"),
    (metrics.top_fraction_iou, ref_top_fraction_iou, "keep, masks"),
    (metrics.energy_in_mask, ref_energy_in_mask, "maps, masks"),
    (metrics.centre_of_mass_distance, ref_centre_of_mass_distance, "maps, masks"),
    (metrics.lesion_area_fraction, ref_lesion_area_fraction, "masks"),
    (metrics.lesion_centre_distance, ref_lesion_centre_distance, "masks"),
], ids=lambda value: getattr(value, "__name__", None))
def test_spatial_metrics_match_their_formulas(kernel, reference, arguments):
    def inputs(draw):
        maps, masks = maps_and_masks(draw)
        keep = draw.masks(*maps.shape, offset=3)        # any non-empty kept set
        return {"maps": (maps,), "maps, masks": (maps, masks), "keep, masks": (keep, masks),
                "masks": (masks,)}[arguments]

    check_against_reference(kernel, reference, inputs, atol=1e-6, rtol=1e-5)


# --- threshold-free IoU, top-k sweep --------------------------------------------------------------

def ref_iou_curve(maps, masks, thresholds=localisation.DEFAULT_IOU_THRESHOLDS):
    """IoU of ``map >= t`` with the mask for each t. The thresholds are compared in the maps'
    precision (the kernel casts them to the maps' dtype): a float32 map value of 0.35 is kept
    at t = 0.35, although float32(0.35) < 0.35 in float64."""
    levels = np.asarray(thresholds, dtype=maps.dtype)
    kept = maps[:, None] >= levels[None, :, None, None]                        # (B, T, H, W)
    lesion = masks[:, None]
    return (kept & lesion).sum(axis=(2, 3)) / (kept | lesion).sum(axis=(2, 3))


def test_iou_curve_and_auc_match_a_mask_per_threshold():
    thresholds = localisation.DEFAULT_IOU_THRESHOLDS

    def kernel(maps, masks):
        return localisation.iou_curve(maps, masks), localisation.auc_iou(maps, masks)

    def reference(maps, masks):
        curve = ref_iou_curve(maps, masks)
        return curve, np.trapezoid(curve, thresholds, axis=1)

    check_against_reference(kernel, reference, maps_and_masks, atol=1e-6, rtol=1e-6)


def ref_top_k_sweep(maps, masks, fractions):
    """IoU and energy of each top-k set (energy: the set's map mass in the lesion over its
    mass; a set with no mass counts as uniform: its lesion pixel share)."""
    iou, energy = [], []
    weights = maps.astype(np.float64)
    for fraction in fractions:
        keep = ref_top_fraction_mask(maps, fraction)
        inside = (keep & masks).sum(axis=(1, 2))
        iou.append(inside / (keep | masks).sum(axis=(1, 2)))
        mass = (weights * keep).sum(axis=(1, 2))
        mass_inside = (weights * (keep & masks)).sum(axis=(1, 2))
        energy.append(np.where(mass > 0, mass_inside / np.where(mass > 0, mass, 1),
                               inside / keep.sum(axis=(1, 2))))
    return {"iou": np.stack(iou, axis=1), "energy": np.stack(energy, axis=1)}


def test_top_k_sweep_and_curve_and_sweep_match_masks_built_per_k():
    """``top_k_sweep`` and ``curve_and_sweep`` read everything off one ranking; the reference
    builds each top-k set and each ``map >= t`` set from scratch."""
    fractions = localisation.TOP_K_FRACTIONS

    def kernel(maps, masks):
        curve, sweep = localisation.curve_and_sweep(maps, masks)
        return localisation.top_k_sweep(maps, masks), curve, sweep

    def reference(maps, masks):
        sweep = ref_top_k_sweep(maps, masks, fractions)
        return sweep, ref_iou_curve(maps, masks), sweep

    check_against_reference(kernel, reference, lambda draw: maps_and_masks(draw, low=5),
                            atol=1e-6, rtol=1e-6)


# --- energy lift, tolerance zone, pointing game ---------------------------------------------------

def maps_masks_fov(draw: Draw, low: int = 1, high: int = 12):
    """Maps, lesion masks and fields of view, the lesion meeting the field of view."""
    maps, masks = maps_and_masks(draw, low, high)
    fov = draw.masks(*maps.shape, offset=2)
    for b in range(len(maps)):
        if not (masks[b] & fov[b]).any():                 # give the lesion one pixel in view
            r, c = np.argwhere(fov[b])[draw.rng.integers(fov[b].sum())]
            masks[b, r, c] = True
    return maps, masks, fov


def ref_energy_lift_bits(maps, masks, fov, alpha=0.01):
    out = []
    for single_map, mask, view in zip(maps.astype(np.float64), masks, fov):
        saliency, lesion = np.maximum(single_map, 0) * view, mask & view
        lesion_area, background_area = lesion.sum(), view.sum() - lesion.sum()
        if background_area == 0:
            out.append(np.nan)                            # no background: undefined
        elif saliency.sum() == 0:
            out.append(0.0)                               # no saliency in view: uniform
        else:
            pi = lesion_area / view.sum()
            share = (saliency * lesion).sum() / saliency.sum()
            mixed = (share + alpha * pi) / (1 + alpha)
            out.append(math.log2((mixed / lesion_area) / ((1 - mixed) / background_area)))
    return np.array(out)


def test_energy_lift_bits_matches_its_formula():
    check_against_reference(lambda maps, masks, fov: localisation.energy_lift_bits(maps, masks, fov, 0.01),
                            ref_energy_lift_bits, maps_masks_fov,
                            atol=1e-5, rtol=1e-5)


RADII = (0, 0.5, 1, 1.5, 2, 2.5, 3.2, 5)


def ref_tolerance_zone(masks, fov, radius):
    """Pixels of the field of view whose centre lies within ``radius`` of a lesion pixel's
    centre (lesion taken inside the field of view), by brute force over all pairs."""
    zone = np.zeros_like(masks)
    rows, cols = np.indices(masks.shape[1:])
    for b in range(len(masks)):
        lesion = np.argwhere(masks[b] & fov[b])                                # (L, 2)
        squared = ((rows[..., None] - lesion[:, 0]) ** 2 + (cols[..., None] - lesion[:, 1]) ** 2)
        zone[b] = (squared.min(axis=-1) <= radius ** 2) & fov[b]
    return zone


def test_tolerance_zone_matches_brute_force_distances():
    def inputs(draw):
        _, masks, fov = maps_masks_fov(draw)
        return masks, fov, RADII[draw.seed % len(RADII)]

    check_against_reference(localisation.tolerance_zone, ref_tolerance_zone, inputs)


def test_pointing_hits_and_chance_without_smoothing():
    """Peak = first row-major maximum inside the field of view (ties decide it on the
    few-level and constant maps); hit = peak in the tolerance zone; chance = |D_r| / |B|."""
    def kernel(maps, masks, fov, radius):
        return localisation.pointing_hits(maps, masks, fov, radius_px=radius, smooth_sigma_px=0)

    def reference(maps, masks, fov, radius):
        zone = ref_tolerance_zone(masks, fov, radius)
        peak = np.where(fov, maps, -np.inf).reshape(len(maps), -1).argmax(axis=1)
        hits = zone.reshape(len(maps), -1)[np.arange(len(maps)), peak]
        return hits, zone.sum(axis=(1, 2)) / fov.sum(axis=(1, 2))

    def inputs(draw):
        return (*maps_masks_fov(draw), RADII[draw.seed % len(RADII)])

    check_against_reference(kernel, reference, inputs, rtol=1e-6)


# --- map agreement --------------------------------------------------------------------------------

def ref_soft_iou(a, b):
    low = np.minimum(a, b).sum(axis=(-2, -1), dtype=np.float64)
    high = np.maximum(a, b).sum(axis=(-2, -1), dtype=np.float64)
    return np.where(high > 0, low / np.where(high > 0, high, 1), 1.0)   # two zero maps agree


def test_soft_iou_and_pairwise_matrix_match_sum_min_over_sum_max():
    def kernel(first, second):
        return localisation.soft_iou(first, second), localisation.pairwise_soft_iou(first, resolution=None)

    def reference(first, second):
        uniform = np.stack([as_weights(m) for m in first])       # all-zero maps count as uniform
        pairs = np.array([[ref_soft_iou(a, b) for b in uniform] for a in uniform])
        return ref_soft_iou(first, second), pairs

    def inputs(draw):
        shape = batch_of(draw)
        return draw.maps(*shape), draw.maps(*shape, offset=1)

    check_against_reference(kernel, reference, inputs, atol=1e-6, rtol=1e-6)


def test_top_set_iou_pearson_and_spearman_per_map():
    """Agreement of two map batches: top-set IoU (also against one prior map), Pearson and
    Spearman (average ranks for ties) correlations, NaN for a constant map."""
    def average_ranks(values):
        order = np.argsort(values, kind="stable")
        ranks = np.empty(len(values))
        ranks[order] = np.arange(1, len(values) + 1)
        for value in np.unique(values):                           # ties share their mean rank
            tied = values == value
            ranks[tied] = ranks[tied].mean()
        return ranks

    def pearson(a, b):
        a, b = a - a.mean(), b - b.mean()
        norm = math.sqrt((a * a).sum() * (b * b).sum())
        return (a * b).sum() / norm if norm > 0 else np.nan

    def kernel(first, second, fraction):
        return (map_priors.top_set_iou(first, second, fraction),
                map_priors.top_set_iou(first, second[0], fraction),
                map_priors.pearson_per_map(first, second),
                randomisation.spearman_per_image(first, second),
                randomisation.top_area_iou(first, second, fraction))

    def reference(first, second, fraction):
        keep_a, keep_b = ref_top_fraction_mask(first, fraction), ref_top_fraction_mask(second, fraction)
        keep_prior = np.broadcast_to(ref_top_fraction_mask(second[:1], fraction), keep_a.shape)
        flat_a = first.reshape(len(first), -1).astype(np.float64)
        flat_b = second.reshape(len(first), -1).astype(np.float64)
        top_iou = ref_top_fraction_iou(keep_a, keep_b)
        return (top_iou, ref_top_fraction_iou(keep_a, keep_prior),
                np.array([pearson(a, b) for a, b in zip(flat_a, flat_b)]),
                np.array([pearson(average_ranks(a), average_ranks(b)) for a, b in zip(flat_a, flat_b)]),
                top_iou)

    def inputs(draw):
        shape = batch_of(draw, low=2)
        return draw.maps(*shape), draw.maps(*shape, offset=2), draw.fraction(*shape[1:])

    check_against_reference(kernel, reference, inputs, atol=1e-6, rtol=1e-6)


def test_grid_cells_border_ring_and_corner_cell():
    """Cell of pixel r on an S-pixel side cut into h cells: the number of cell boundaries
    k S / h (k = 1..h-1) at or before r, counted in integers."""
    def cell(position, size, cells):
        return sum(k * size <= position * cells for k in range(1, cells))

    def kernel(rows, cols, size, grid):
        rows, cols = rows.long(), cols.long()
        return (*map_priors.grid_cells(rows, cols, size, grid),
                map_priors.border_ring(rows, cols, size, grid),
                map_priors.corner_cell(rows, cols, size, grid))

    def reference(rows, cols, size, grid):
        cell_rows = np.array([cell(r, size, grid[0]) for r in rows])
        cell_cols = np.array([cell(c, size, grid[1]) for c in cols])
        edge_row = (cell_rows == 0) | (cell_rows == grid[0] - 1)
        edge_col = (cell_cols == 0) | (cell_cols == grid[1] - 1)
        return cell_rows, cell_cols, edge_row | edge_col, edge_row & edge_col

    def inputs(draw):
        size = draw.size(1, 64)
        rows, cols = draw.rng.integers(0, size, (2, 20))
        return rows, cols, size, (draw.size(1, 9), draw.size(1, 9))

    check_against_reference(kernel, reference, inputs)


# --- CAM post-processing and baselines ------------------------------------------------------------

def test_minmax_per_map_and_centre_gaussian():
    def kernel(maps, sigma_fraction):
        batch, height, width = maps.shape
        return (cams.minmax_per_map(maps * 7 - 3),
                baselines.centre_gaussian(batch, height, width, sigma_fraction))

    def reference(maps, sigma_fraction):
        batch, height, width = maps.shape
        scaled = []
        for single_map in maps * 7 - 3:
            span = single_map.max() - single_map.min()
            scaled.append((single_map - single_map.min()) / span if span > 0 else np.zeros_like(single_map))
        rows, cols = np.indices((height, width)) + 0.5
        sigma = sigma_fraction * min(height, width)
        gaussian = np.exp(-((rows - height / 2) ** 2 + (cols - width / 2) ** 2) / (2 * sigma ** 2))
        return np.stack(scaled), np.broadcast_to(gaussian / gaussian.max(), maps.shape)

    def inputs(draw):
        return draw.maps(*batch_of(draw)), float(draw.rng.uniform(0.05, 1.0))

    check_against_reference(kernel, reference, inputs, atol=1e-6, rtol=1e-5)


# --- deletion, ROAD removal and placement ---------------------------------------------------------

def test_cam_deletion_zeroes_exactly_the_top_area_pixels_in_every_channel():
    def kernel(images, maps, fraction):
        return deletion.delete_pixels(images, threshold.top_fraction_mask(maps, fraction))

    def reference(images, maps, fraction):
        return np.where(ref_top_fraction_mask(maps, fraction)[:, None], 0.0, images)

    def inputs(draw):
        maps = draw.maps(*batch_of(draw))
        images = draw.rng.normal(size=(len(maps), 3, *maps.shape[1:])).astype(np.float32)
        return images, maps, draw.fraction(*maps.shape[1:])

    check_against_reference(kernel, reference, inputs)


def ref_road_removal_masks(maps, fov, order, fractions):
    """bool (F, B, H, W): the first round(f |B|) field-of-view pixels by value (highest first
    for MoRF, lowest first for LeRF), ties by priority."""
    batch, height, width = maps.shape
    n_pixels = height * width
    removed = np.zeros((len(fractions), batch, n_pixels), dtype=bool)
    sign = -1.0 if order == "morf" else 1.0
    for b in range(batch):
        in_view = fov[b].ravel()
        ranked = np.lexsort((priority(n_pixels), sign * maps[b].ravel().astype(np.float64), ~in_view))
        for f, fraction in enumerate(fractions):
            removed[f, b, ranked[:round(fraction * in_view.sum())]] = True
    return removed.reshape(len(fractions), batch, height, width)


@pytest.mark.parametrize("order", road.ORDERS)
def test_road_removal_masks_rank_field_of_view_pixels_by_value_then_priority(order):
    def inputs(draw):
        maps, masks, fov = maps_masks_fov(draw, low=2)
        fractions = (*ROAD_FRACTIONS, float(draw.rng.uniform(0.01, 1.0)), 1.0)
        return maps, fov, order, fractions

    check_against_reference(road.road_removal_masks, ref_road_removal_masks, inputs)


def test_translate_and_valid_translations_match_brute_force():
    """All shifts (dy, dx) that keep the region in the frame and the field of view and off
    ``avoid`` (identity excluded), ordered by dy then dx; and one shifted copy."""
    def moved(region, dy, dx):
        out = np.zeros_like(region)
        for r, c in np.argwhere(region):
            if 0 <= r + dy < region.shape[0] and 0 <= c + dx < region.shape[1]:
                out[r + dy, c + dx] = True
        return out

    def kernel(regions, fov, avoid, shift):
        found = placement.valid_translations(regions, fov, avoid=avoid)
        return [*found, placement.translate(regions[0], *shift)]

    def reference(regions, fov, avoid, shift):
        height, width = regions.shape[1:]
        found = []
        for region, view, blocked in zip(regions, fov, avoid):
            pixels = np.argwhere(region)
            shifts = [(dy, dx) for dy in range(1 - height, height) for dx in range(1 - width, width)
                      if (dy, dx) != (0, 0) and len(pixels)
                      and ((pixels + (dy, dx)) >= 0).all() and (pixels[:, 0] + dy < height).all()
                      and (pixels[:, 1] + dx < width).all()
                      and view[pixels[:, 0] + dy, pixels[:, 1] + dx].all()
                      and not blocked[pixels[:, 0] + dy, pixels[:, 1] + dx].any()]
            found.append(np.array(shifts, dtype=np.int64).reshape(-1, 2))
        return [*found, moved(regions[0], *shift)]

    def inputs(draw):
        shape = batch_of(draw, high=7)
        regions = draw.masks(*shape, kinds=MASK_KINDS)            # empty regions: no shift
        fov = draw.masks(*shape, offset=1) | regions
        avoid = draw.masks(*shape, offset=2) & ~regions & (draw.rng.random(shape) < 0.3)
        shift = tuple(int(draw.rng.integers(-side, side + 1)) for side in shape[1:])   # (dy, dx)
        return regions, fov, avoid, shift

    check_against_reference(kernel, reference, inputs, seeds=range(40))


# --- ROAD imputation: parity with pytorch-grad-cam ------------------------------------------------

def grad_cam_imputation(images: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """pytorch-grad-cam 1.5's ``NoisyLinearImputer`` with its noise off, image by image.

    Conventions mapped here: the library imputes one (C, H, W) image at a time and its mask
    marks the *kept* pixels (1 = kept, 0 = imputed; ``RemoveMostRelevantFirst`` builds it as
    ``cam < percentile``), while the package takes a batch (B, C, H, W) with ``removed`` True
    for the imputed pixels. The library solves in float64 and returns float32 values.
    """
    imputer = NoisyLinearImputer(noise=0.0)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # 0 * randn_like still draws
        warnings.filterwarnings("ignore", message="__array_wrap__", category=DeprecationWarning)
        kept = (~removed).astype(np.float32)
        return np.stack([imputer(torch.from_numpy(image), torch.from_numpy(mask)).numpy()
                         for image, mask in zip(images, kept)])


def imputation_inputs(draw: Draw):
    """float32 images (B, C, H, W) and removal masks with every kind but "full": a frame with
    no kept pixel has no solution in the library (see the test below)."""
    batch, height, width = batch_of(draw, low=2, high=10)
    images = draw.rng.normal(size=(batch, int(draw.rng.integers(1, 4)), height, width)).astype(np.float32)
    removed = draw.masks(batch, height, width, kinds=("scattered", "block", "one_pixel", "empty"))
    # and "all but one": a single kept pixel feeds every removed one
    if draw.seed % 5 == 0:
        removed[0] = True
        removed[0, draw.rng.integers(height), draw.rng.integers(width)] = False
    return images, removed


def test_road_imputation_equals_pytorch_grad_cams_noisy_linear_imputer():
    """Same neighbour weights (1/6 for the 4 edge neighbours, 1/12 for the 4 diagonal ones,
    out-of-frame neighbours dropped from the row sum) and the same system: the library writes
    it as -A x = -b (diagonal -(sum of in-frame weights), +w for removed neighbours), the
    package as A x = b; the solutions agree to float32 rounding. The package's ROAD entry
    point with noise 0 and both of its solvers are checked."""
    def direct(images, removed):
        return imputation.noisy_linear_imputation(images, removed, noise_keys=range(len(images)),
                                                  noise_std=0.0, solver="direct")[0]

    def conjugate_gradient(images, removed):
        return imputation.solve_linear_imputation(images.double(), removed, solver="cg", tolerance=1e-10)[0]

    check_against_reference(direct, grad_cam_imputation, imputation_inputs, atol=1e-6, rtol=1e-6)
    check_against_reference(conjugate_gradient, grad_cam_imputation, imputation_inputs,
                            seeds=range(20), atol=1e-6, rtol=1e-6)


def test_fully_removed_frame_is_zero_in_the_package_and_may_be_nan_in_pytorch_grad_cam():
    """The one convention difference: with every pixel removed the system is singular (each
    row sums to 0) and its right-hand side is 0. The package sets such pixels to 0 on purpose
    (the ImageNet mean colour in normalised space, as plain deletion gives). The library's
    ``spsolve`` gets 0 too when rounding leaves the row sums a hair off zero (1 - 1/6 - ...),
    but NaN when SuperLU meets an exact zero pivot (it warns "Matrix is exactly singular"):
    on a 4 x 4 frame, not on the other sizes here. Hence the "full" kind is left out above."""
    nan_frames = 0
    for height, width in ((4, 4), (5, 6), (3, 3), (8, 8)):
        images = np.random.default_rng(height).normal(size=(1, 2, height, width)).astype(np.float32)
        removed = np.ones((1, height, width), dtype=bool)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MatrixRankWarning)
            library = grad_cam_imputation(images, removed)
        filled, _ = imputation.solve_linear_imputation(torch.from_numpy(images), torch.from_numpy(removed))
        assert (filled == 0).all(), (height, width)
        assert np.isnan(library).all() or (library == 0).all(), (height, width)
        nan_frames += int(np.isnan(library).all())
    assert nan_frames == 1      # the 4 x 4 frame, with the pinned SciPy 1.17.1's SuperLU


# --- the tester itself ----------------------------------------------------------------------------

def test_the_tester_reports_the_seed_of_a_wrong_kernel():
    """A top-area mask that breaks ties by row-major index instead of the priority must fail,
    and the message must name a seed that rebuilds the failing case."""
    def index_ties(maps, fraction):
        flat = maps.reshape(len(maps), -1)
        order = torch.sort(flat, dim=1, descending=True, stable=True).indices
        kept = order[:, :kept_count(fraction, *maps.shape[1:])]
        return torch.zeros_like(flat, dtype=torch.bool).scatter_(1, kept, True).reshape(maps.shape)

    def inputs(draw):
        maps = draw.maps(*batch_of(draw, low=3))
        return maps, draw.fraction(*maps.shape[1:])

    with pytest.raises(AssertionError, match=r"at seed \d+ \(inputs float32\["):
        check_against_reference(index_ties, ref_top_fraction_mask, inputs)
    assert check_against_reference(threshold.top_fraction_mask, ref_top_fraction_mask, inputs,
                                   seeds=range(5)) == 5
