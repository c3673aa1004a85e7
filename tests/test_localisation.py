"""Localisation kernels against hand-computed cases and independent references (SciPy, NumPy)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import ndimage

from endoexplain_core import config, kernels
from endoexplain_core.kernels import localisation as loc

SEED = 20260721  # the profiles' shared seed: bootstrap draws as in a run

H = W = 40
ALPHA = 0.01  # the profile's shared.localisation.energy_alpha


def disc(radius: float, centre=(20, 20), size=(H, W)) -> torch.Tensor:
    """bool (H, W): pixel centres within ``radius`` of ``centre`` (pixel-index coordinates)."""
    rows = torch.arange(size[0], dtype=torch.float64)[:, None]
    cols = torch.arange(size[1], dtype=torch.float64)[None, :]
    return (rows - centre[0]) ** 2 + (cols - centre[1]) ** 2 <= radius ** 2


def full_fov(batch: int = 1) -> torch.Tensor:
    return torch.ones(batch, H, W, dtype=torch.bool)


def test_public_names_are_exposed_from_kernels():
    for name in ("iou_curve", "auc_iou", "field_of_view", "tolerance_zone", "energy_lift_bits",
                 "pointing_hits", "dog_conspicuity", "soft_iou", "c_score", "top_k_sweep"):
        assert getattr(kernels, name) is getattr(loc, name)


# --- AUC-IoU --------------------------------------------------------------------------------------

def test_auc_iou_of_binary_map_equal_to_mask_is_0_9():
    mask = disc(6)[None]
    assert loc.auc_iou(mask.float(), mask).item() == pytest.approx(0.9, abs=1e-6)
    assert loc.iou_curve(mask.float(), mask).shape == (1, 19)


def test_iou_curve_and_auc_against_numpy():
    generator = torch.Generator().manual_seed(0)
    maps = torch.rand(3, H, W, generator=generator)
    masks = torch.stack([disc(5), disc(9, (12, 25)), disc(3, (30, 8))])
    thresholds = loc.DEFAULT_IOU_THRESHOLDS
    curve = loc.iou_curve(maps, masks).numpy()
    for b in range(3):
        m, k = masks[b].numpy(), maps[b].numpy()
        expected = [np.logical_and(k >= t, m).sum() / np.logical_or(k >= t, m).sum() for t in thresholds]
        np.testing.assert_allclose(curve[b], expected, rtol=1e-6)
        assert loc.auc_iou(maps[b:b + 1], masks[b:b + 1]).item() == pytest.approx(
            np.trapezoid(expected, thresholds), rel=1e-6)
    # A hand case: a map of 0.5 on the mask, 0 elsewhere -> IoU 1 up to t = 0.5 (10 thresholds)
    half = masks[:1].float() * 0.5
    assert loc.auc_iou(half, masks[:1]).item() == pytest.approx(0.45 + 0.025, abs=1e-6)


def test_auc_iou_rejects_bad_thresholds():
    mask = disc(4)[None]
    with pytest.raises(ValueError, match="increasing"):
        loc.auc_iou(mask.float(), mask, thresholds=[0.5, 0.3])


# --- field of view and tolerance zone -------------------------------------------------------------

def test_field_of_view_is_the_lit_disc_with_dark_lumen_kept_and_border_text_dropped():
    image = torch.zeros(1, 3, H, W)
    lit = disc(15)
    image[0, :, lit] = 0.6
    image[0, :, disc(3)] = 0.0            # dark lumen inside the disc: still in view
    image[0, :, 0:2, 0:3] = 1.0           # burnt-in text on the black border: not in view
    fov = loc.field_of_view(image)
    assert torch.equal(fov[0], lit)
    # ImageNet-style per-channel normalisation does not change the rule
    normalised = (image - torch.tensor([0.485, 0.456, 0.406])[:, None, None]) / torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    assert torch.equal(loc.field_of_view(normalised)[0], lit)
    # masks are joined in
    outside = torch.zeros(1, H, W, dtype=torch.bool)
    outside[0, 38, 38] = True
    assert loc.field_of_view(image, outside)[0, 38, 38]


def test_tolerance_zone_matches_scipy_distance_transform():
    mask = disc(4, (18, 22))[None]
    fov = disc(15)[None]
    for radius in (0, 1, 2.5, 5):
        zone = loc.tolerance_zone(mask, fov, radius)[0].numpy()
        distance = ndimage.distance_transform_edt(~mask[0].numpy())
        assert np.array_equal(zone, (distance <= radius) & fov[0].numpy()), radius


# --- energy lift ----------------------------------------------------------------------------------

@pytest.mark.parametrize("radius", [2, 5, 10])
def test_uniform_map_has_zero_lift_at_any_lesion_size(radius):
    mask = disc(radius)[None]
    fov = disc(18)[None]
    assert loc.energy_lift_bits(torch.full((1, H, W), 0.3), mask, fov, ALPHA).item() == pytest.approx(0, abs=1e-6)
    # all-zero map: no saliency in B -> uniform (0 bits), flagged
    zero = torch.zeros(1, H, W)
    assert loc.energy_lift_bits(zero, mask, fov, ALPHA).item() == 0
    assert loc.saliency_free(zero, fov).item()


@pytest.mark.parametrize("radius", [2, 5, 10])
def test_map_equal_to_mask_reaches_the_geometry_ceiling(radius):
    mask = disc(radius)[None]
    fov = disc(18)[None]
    pi = mask.sum().item() / fov.sum().item()
    ceiling = math.log2(1 + 1 / (0.01 * pi))
    assert loc.energy_lift_bits(mask.float(), mask, fov, ALPHA).item() == pytest.approx(ceiling, rel=1e-6)
    # any other map scores lower
    generator = torch.Generator().manual_seed(radius)
    other = mask.float() * 0.9 + 0.1 * torch.rand(1, H, W, generator=generator)
    assert loc.energy_lift_bits(other, mask, fov, ALPHA).item() < ceiling


def test_all_saliency_outside_a_small_lesion_sits_at_the_alpha_floor():
    mask = torch.zeros(1, H, W, dtype=torch.bool)
    mask[0, 20, 20] = True
    fov = full_fov()
    value = loc.energy_lift_bits((~mask).float(), mask, fov, ALPHA).item()
    assert value == pytest.approx(-6.7, abs=0.05)
    pi = 1 / (H * W)
    assert value == pytest.approx(math.log2(0.01 * (1 - pi) / (1 + 0.01 - 0.01 * pi)), rel=1e-6)


def test_energy_lift_hand_case_and_fov_restriction():
    # lesion 4 px in a 16-px field of view; the map puts half its mass on the lesion
    fov = torch.zeros(1, H, W, dtype=torch.bool)
    fov[0, :4, :4] = True
    mask = torch.zeros_like(fov)
    mask[0, :2, :2] = True
    maps = torch.zeros(1, H, W)
    maps[0, :2, :2] = 3.0
    maps[0, 2:4, :4] = 1.5
    maps[0, 30:, 30:] = 100.0  # outside B: ignored
    e_in, pi, alpha = 0.5, 4 / 16, 0.01
    mixed = (e_in + alpha * pi) / (1 + alpha)
    expected = math.log2((mixed / 4) / ((1 - mixed) / 12))
    assert loc.energy_lift_bits(maps, mask, fov, ALPHA).item() == pytest.approx(expected, rel=1e-6)
    assert math.isnan(loc.energy_lift_bits(maps, fov, fov, ALPHA).item())  # lesion = B: no background


# --- pointing game --------------------------------------------------------------------------------

def test_peak_one_pixel_outside_the_mask_hits_at_r1_and_misses_at_r0():
    mask = disc(4)[None]
    maps = torch.zeros(1, H, W)
    maps[0, 20, 25] = 1.0  # (20, 24) is the mask's edge pixel
    assert not mask[0, 20, 25] and mask[0, 20, 24]
    for radius, expected in ((0, False), (1, True), (3, True)):
        hits, _ = loc.pointing_hits(maps, mask, full_fov(), radius_px=radius, smooth_sigma_px=0)
        assert hits.item() is expected, radius


def test_pointing_chance_on_a_drawn_disc():
    # a one-pixel lesion dilated by r is exactly the drawn disc of radius r
    point = disc(0, (20, 20))[None]
    fov = disc(16)[None]
    for radius in (0, 2, 4, 7.5):
        _, chance = loc.pointing_hits(torch.rand(1, H, W), point, fov, radius_px=radius, smooth_sigma_px=1)
        assert chance.item() == pytest.approx(disc(radius).sum().item() / fov.sum().item(), rel=1e-6)
    # a disc lesion: |D_r| counted by brute force over all pixel pairs
    lesion = disc(3, (20, 20))
    points = lesion.nonzero().double()
    grid = torch.stack(torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij"), -1).double().reshape(-1, 2)
    for radius in (0, 2, 4):
        near = (torch.cdist(grid, points).amin(dim=1) <= radius).reshape(H, W) & fov[0]
        _, chance = loc.pointing_hits(torch.rand(1, H, W), lesion[None], fov, radius_px=radius, smooth_sigma_px=0)
        assert chance.item() == pytest.approx(near.sum().item() / fov.sum().item(), rel=1e-6)


def test_pointing_peak_is_restricted_to_the_field_of_view_and_smoothed():
    fov = disc(15)[None]
    mask = disc(3, (20, 10))[None]
    maps = torch.zeros(1, H, W)
    maps[0, 0, 0] = 5.0                  # outside B: ignored
    maps[0, 20, 10] = 1.0                # inside the lesion
    hits, _ = loc.pointing_hits(maps, mask, fov, radius_px=0, smooth_sigma_px=0)
    assert hits.item()
    # a single spike outside the lesion loses to a broad bump on it once smoothed
    maps = 0.6 * torch.exp(-((torch.arange(H)[:, None] - 20.0) ** 2 + (torch.arange(W)[None] - 10.0) ** 2) / 20)[None]
    maps[0, 20, 28] = 1.0
    unsmoothed, _ = loc.pointing_hits(maps, mask, fov, radius_px=0, smooth_sigma_px=0)
    smoothed, _ = loc.pointing_hits(maps, mask, fov, radius_px=0, smooth_sigma_px=2)
    assert not unsmoothed.item() and smoothed.item()


@pytest.mark.parametrize("edges, scipy_mode", [("replicate", "nearest"), ("wrap", "wrap")])
def test_gaussian_smooth_matches_scipy(edges, scipy_mode):
    generator = torch.Generator().manual_seed(1)
    maps = torch.rand(2, H, W, generator=generator)
    ours = loc.gaussian_smooth(maps, 1.5, edges=edges).numpy()
    reference = np.stack([ndimage.gaussian_filter(m, 1.5, mode=scipy_mode, truncate=3.0) for m in maps.numpy()])
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_pointing_peaks_of_noise_maps_are_uniform_so_they_hit_at_chance():
    # The random-heatmap reference must hit the tolerance zone at |D_r| / |B|. Replicated edges
    # drew 89% of these peaks into the 3-px frame border, which covers 23% of the frame.
    size, count = 48, 600
    maps = torch.rand(count, size, size, generator=torch.Generator().manual_seed(2))
    fov = torch.ones(count, size, size, dtype=torch.bool)
    lesion = torch.zeros(count, size, size, dtype=torch.bool)
    lesion[:, 10:30, 14:34] = True
    hits, chance = loc.pointing_hits(maps, lesion, fov, radius_px=2, smooth_sigma_px=1.6)
    expected = float(chance[0]) * count
    spread = math.sqrt(expected * (1 - float(chance[0])))
    assert abs(int(hits.sum()) - expected) < 4 * spread
    smoothed = loc.gaussian_smooth(maps, 1.6, edges="wrap").flatten(1).argmax(dim=1)
    rows, cols = smoothed // size, smoothed % size
    near_edge = (torch.minimum(rows, size - 1 - rows) < 3) | (torch.minimum(cols, size - 1 - cols) < 3)
    border_share = 1 - (size - 6) ** 2 / size ** 2
    assert abs(float(near_edge.float().mean()) - border_share) < 0.08


# --- DoG conspicuity ------------------------------------------------------------------------------

def test_dog_marks_a_small_bright_spot_and_ignores_the_frame_rim():
    fov = disc(17)[None]
    image = torch.zeros(1, 3, H, W)
    image[0, :, fov[0]] = 0.4
    image[0, :, disc(2, (14, 24))] = 0.9
    with_fov = loc.dog_conspicuity(image, 1.0, 6.0, fov=fov)
    assert with_fov.shape == (1, H, W) and with_fov.min() >= 0 and with_fov.max() == 1
    row, col = divmod(int(with_fov.flatten().argmax()), W)
    assert math.hypot(row - 14, col - 24) <= 2
    assert with_fov[0][~fov[0]].abs().max() == 0
    # reference: SciPy blurs of the grey image, difference, ReLU, min-max (no field of view)
    grey = image[0].mean(0).numpy()
    difference = (ndimage.gaussian_filter(grey, 1.0, mode="nearest", truncate=3.0)
                  - ndimage.gaussian_filter(grey, 6.0, mode="nearest", truncate=3.0)).clip(min=0)
    np.testing.assert_allclose(loc.dog_conspicuity(image, 1.0, 6.0)[0].numpy(),
                               difference / difference.max(), atol=1e-5)
    with pytest.raises(ValueError, match="sigma"):
        loc.dog_conspicuity(image, 6.0, 1.0)


# --- top-k sweep ----------------------------------------------------------------------------------

def test_top_k_sweep_20_percent_equals_the_audit_iou():
    from endoexplain_core.kernels import metrics, threshold
    generator = torch.Generator().manual_seed(2)
    maps = torch.rand(2, H, W, generator=generator)
    masks = torch.stack([disc(6), disc(10, (15, 15))])
    sweep = loc.top_k_sweep(maps, masks)
    assert sweep["iou"].shape == (2, 10) and sweep["energy"].shape == (2, 10)
    column = loc.TOP_K_FRACTIONS.index(0.2)
    audit_iou = metrics.top_fraction_iou(threshold.top_fraction_mask(maps, 0.2), masks)
    assert torch.allclose(sweep["iou"][:, column], audit_iou)
    # energy of the top-k set of a binary mask map: everything kept is in the lesion while k <= |M|
    exact = loc.top_k_sweep(masks[:1].float(), masks[:1], fractions=[0.05])
    assert exact["energy"].item() == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(6))
def test_top_k_sweep_matches_a_mask_per_k_reference(seed):
    """The running-sum sweep equals building each top-k mask with the audit's rule, on random
    maps with many ties (quantised to 5 levels, some all-zero) and random disc lesions."""
    from endoexplain_core.kernels import threshold
    generator = torch.Generator().manual_seed(100 + seed)
    maps = (torch.rand(4, H, W, generator=generator) * 5).floor() / 4
    maps[0] = 0.0
    masks = torch.stack([disc(3 + 2 * i, (8 + 3 * i, 12 + i)) for i in range(4)])
    fractions = (0.01, 0.05, 0.2, 0.35, 0.5, 1.0)
    sweep = loc.top_k_sweep(maps, masks, fractions=fractions)
    for column, fraction in enumerate(fractions):
        keep = threshold.top_fraction_mask(maps, fraction)
        intersection = (keep & masks).sum(dim=(1, 2)).double()
        union = (keep | masks).sum(dim=(1, 2)).double()
        kept = (maps.double() * keep).sum(dim=(1, 2))
        inside = (maps.double() * (keep & masks)).sum(dim=(1, 2))
        energy = torch.where(kept > 0, inside / kept.clamp(min=1e-300), intersection / keep.sum(dim=(1, 2)))
        torch.testing.assert_close(sweep["iou"][:, column], (intersection / union).float())
        torch.testing.assert_close(sweep["energy"][:, column], energy.float())


# --- soft IoU and C-Score -------------------------------------------------------------------------

def test_soft_iou_hand_cases():
    a = torch.tensor([[[1.0, 0.5], [0.0, 0.0]]])
    b = torch.tensor([[[0.5, 0.5], [0.5, 0.0]]])
    assert loc.soft_iou(a, b).item() == pytest.approx(1.0 / 2.0)
    assert loc.soft_iou(a, a).item() == 1


def test_c_score_identical_maps_is_1_and_disjoint_binary_maps_0():
    generator = torch.Generator().manual_seed(3)
    one = torch.rand(1, H, W, generator=generator)
    assert loc.c_score(one.expand(5, H, W), torch.rand(5, generator=generator) + 0.1) == pytest.approx(1.0)
    disjoint = torch.zeros(4, 64, 64)
    for i in range(4):
        disjoint[i, i * 16:(i + 1) * 16] = 1.0
    assert loc.c_score(disjoint, torch.ones(4)) == pytest.approx(0.0)


def test_c_score_matches_the_weighted_pair_loop_and_is_block_invariant():
    generator = torch.Generator().manual_seed(4)
    maps = torch.rand(9, 32, 32, generator=generator) ** 3
    maps[2] = 0  # a constant map counts as uniform
    weights = torch.rand(9, generator=generator)
    resized = torch.nn.functional.adaptive_avg_pool2d(torch.where(
        maps.amax(dim=(1, 2), keepdim=True) > 0, maps, torch.ones_like(maps))[:, None], 16)[:, 0]
    numerator = denominator = 0.0
    for i in range(9):
        for j in range(i + 1, 9):
            w = (weights[i] * weights[j]).item()
            numerator += w * loc.soft_iou(resized[i], resized[j]).item()
            denominator += w
    expected = numerator / denominator
    for block in (1, 4, 256):
        assert loc.c_score(maps, weights, resolution=16, block_size=block) == pytest.approx(expected, rel=1e-5)
    # normalising the weights changes nothing
    assert loc.c_score(maps, weights / weights.sum(), resolution=16) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="N >= 2"):
        loc.c_score(maps[:1], weights[:1])


def test_pairwise_soft_iou_is_the_c_scores_pair_matrix():
    generator = torch.Generator().manual_seed(5)
    maps = torch.rand(7, 24, 24, generator=generator) ** 2
    maps[4] = 0
    weights = torch.rand(7, generator=generator).double()
    matrix = loc.pairwise_soft_iou(maps, resolution=12, block_size=3)
    assert torch.allclose(matrix, matrix.T) and torch.allclose(torch.diagonal(matrix), torch.ones(7, dtype=torch.float64))
    prepared = torch.where(maps.amax(dim=(1, 2), keepdim=True) > 0, maps, torch.ones_like(maps))
    resized = torch.nn.functional.adaptive_avg_pool2d(prepared[:, None], 12)[:, 0]
    assert matrix[1, 5].item() == pytest.approx(loc.soft_iou(resized[1], resized[5]).item(), rel=1e-6)
    upper = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)
    pair_weights = weights[:, None] * weights[None, :]
    assert loc.c_score(maps, weights, resolution=12) == pytest.approx(
        float((matrix * pair_weights)[upper].sum() / pair_weights[upper].sum()), rel=1e-9)
    native = loc.pairwise_soft_iou(maps, resolution=None)          # no pooling
    assert native[1, 5].item() == pytest.approx(loc.soft_iou(prepared[1], prepared[5]).item(), rel=1e-6)


# --- the analysis of notebook 07 ------------------------------------------------------------------

def _cases(count: int, size: int = 64, seed: int = 0):
    """(sample_id, uint8 RGB disc frame with a bright polyp, bool polyp mask) test cases."""
    generator = np.random.default_rng(seed)
    frames = []
    for index in range(count):
        image = np.zeros((size, size, 3), dtype=np.uint8)
        view = disc(size * 0.45, (size / 2, size / 2), (size, size)).numpy()
        image[view] = (120 + generator.integers(0, 20, size=(view.sum(), 3))).astype(np.uint8)
        centre = tuple(generator.uniform(size * 0.3, size * 0.7, size=2))
        polyp = disc(size * generator.uniform(0.06, 0.15), centre, (size, size)).numpy()
        image[polyp] = (200, 150, 140)
        frames.append((f"case{index:02d}", image, polyp))
    return frames


@pytest.fixture(scope="module")
def scored():
    from endoexplain_core.analysis import extended_localisation as ext
    from tests.kernel_fixtures import nondegenerate_model
    model = nondegenerate_model("resnet34", seed=7, image_size=64)
    metadata = {"checkpoint_id": "resnet34_s7", "arch": "resnet34", "seed": 7}
    return ext.score_checkpoint(model, metadata, 1.0, _cases(7), dataset="toy", image_size=64,
                                settings=config.LocalisationSettings(), batch_size=4, replicates=2000, seed=SEED)


def test_score_checkpoint_rows_columns_and_consistency_with_kernels(scored):
    from endoexplain_core.analysis import extended_localisation as ext
    table, c_scores, summary = scored
    assert len(table) == 7 * len(ext.EXTENDED_METHODS)
    assert set(table["method"]) == set(ext.EXTENDED_METHODS) and "layercam" in set(table["method"])
    assert summary["n_audited"] == 7 and summary["cam_seconds"] > 0 and summary["metric_seconds"] > 0
    # the centre map is one map for every image: its C-Score is 1; uniform-lift sanity
    centre = c_scores.set_index("method").loc["centre"]
    if centre["n_gold"] >= 2:
        assert centre["c_score"] == pytest.approx(1.0)
        rows = c_scores.set_index("method")
        assert (rows["c_score_ci_low"] <= rows["c_score"] + 1e-12).all()
        assert (rows["c_score"] <= rows["c_score_ci_high"] + 1e-12).all()
        # the random reference without pooling sits below the pooled one (its noise is not averaged)
        assert rows.loc["random", "c_score_native"] < rows.loc["random", "c_score"]
        assert rows.drop(index="random")["c_score_native"].isna().all()
    assert table["auc_iou"].between(0, 0.9 + 1e-6).all()
    assert table["pointing_chance"].between(0, 1).all()
    assert (table.loc[table["saliency_free"], "energy_lift_bits"] == 0).all()
    # the 0.05-step columns integrate to the stored AUC-IoU
    columns = [ext.iou_column(t) for t in loc.DEFAULT_IOU_THRESHOLDS]
    np.testing.assert_allclose(np.trapezoid(table[columns].to_numpy(), loc.DEFAULT_IOU_THRESHOLDS, axis=1),
                               table["auc_iou"], rtol=1e-5)
    # the DoG map finds the bright polyp better than chance on these frames
    dog = table[table["method"] == "dog"]
    assert dog["energy_lift_bits"].mean() > 1


def test_summaries_rankings_and_tests(scored):
    from endoexplain_core.analysis import extended_localisation as ext
    table = scored[0]
    summary = ext.auc_iou_table(table, top_fraction=0.2, replicates=2000, seed=SEED)
    assert list(summary["method"]) == list(ext.EXTENDED_METHODS) and (summary["n"] == 7).all()
    row = summary.iloc[0]
    assert row["rel_diff_0.5_pct"] == pytest.approx((row["auc_iou"] - row["iou_at_0.5"]) / row["iou_at_0.5"] * 100)
    ranks, agreement = ext.ranking_table(summary, ext.ranking_metrics(0.2))
    assert agreement.set_index("metric").loc["auc_iou", "kendall_tau_vs_auc_iou"] == pytest.approx(1.0)
    assert agreement.set_index("metric").loc["auc_iou", "reversed_pairs"] == 0
    tests = ext.pairwise_wilcoxon(table)
    assert len(tests) == 15 and (tests["p_holm"] >= tests["p_value"]).all()
    # the by-subset forms are the same tables with a subset column, empty subsets left out
    subsets = {"all images": table, "panel A": table[table["sample_id"] == table["sample_id"].iloc[0]],
               "none": table.iloc[:0]}
    by_subset = ext.auc_iou_by_subset(subsets, top_fraction=0.2, replicates=100, seed=1)
    assert list(by_subset["subset"].unique()) == ["all images", "panel A"]
    pd.testing.assert_frame_equal(
        by_subset[by_subset["subset"] == "all images"].drop(columns="subset").reset_index(drop=True),
        ext.auc_iou_table(table, top_fraction=0.2, replicates=100, seed=1))
    rankings, _ = ext.rankings_by_subset(by_subset, top_fraction=0.2)
    assert set(rankings["n"]) == {7, 1}
    assert list(ext.wilcoxon_by_subset(subsets)["subset"].unique()) == ["all images"]
    chance = ext.chance_table(table, replicates=200, seed=SEED)
    assert set(chance["size_tertile"]) == {"all", "small", "medium", "large"}
    everything = chance[chance["size_tertile"] == "all"].set_index("method")
    assert everything.loc["dog", "n"] == 7 and np.isnan(everything.loc["dog", "lambda_e_minus_dog"])
    assert len(ext.iou_curves(table)) == 19 * len(ext.EXTENDED_METHODS)


def test_the_top_area_metric_follows_top_fraction(scored):
    """Notebook 07's top-area IoU is the profile's top_fraction, not a literal 20%: at 0.30 the
    column is top30_iou and holds the mean of the 30% sweep column; a fraction outside the sweep
    is refused by name."""
    from endoexplain_core.analysis import extended_localisation as ext
    table = scored[0]
    summary = ext.auc_iou_table(table, top_fraction=0.30, replicates=50, seed=1).set_index("method")
    expected = table.groupby("method")[ext.topk_column("iou", 0.30)].mean()
    np.testing.assert_allclose(summary["top30_iou"], expected[summary.index], rtol=1e-6)
    assert "top20_iou" not in summary.columns
    assert "top30_iou" in ext.auc_iou_by_size(table, top_fraction=0.30).columns
    assert ext.ranking_metrics(0.30)[-1] == "top30_iou" and ext.ranking_column("top30_iou") == "topk_iou_30"
    with pytest.raises(ValueError, match="top_fraction 0.33 is not in the top-k sweep"):
        ext.auc_iou_table(table, top_fraction=0.33, replicates=50, seed=1)


def test_ranking_reversal_count_on_a_hand_case():
    from endoexplain_core.analysis import extended_localisation as ext
    summary = pd.DataFrame({"method": ["a", "b", "c"], "auc_iou": [0.3, 0.2, 0.1],
                            "iou_at_0.3": [0.1, 0.2, 0.3], "iou_at_0.5": [0.3, 0.2, 0.1],
                            "iou_at_0.7": [0.2, 0.3, 0.1], "top20_iou": [0.3, 0.2, 0.1]})
    ranks, agreement = ext.ranking_table(summary, ext.ranking_metrics(0.2))
    assert ranks["auc_iou"].tolist() == [1, 2, 3] and ranks["auc_iou"].dtype.kind == "i"
    tied = ext.ranking_table(summary.assign(auc_iou=[0.3, 0.3, 0.1]), ext.ranking_metrics(0.2))[0]["auc_iou"]
    assert tied.tolist() == [1.5, 1.5, 3.0]
    reversed_pairs = agreement.set_index("metric")["reversed_pairs"]
    assert reversed_pairs["iou_at_0.3"] == 3 and reversed_pairs["iou_at_0.7"] == 1
    assert agreement.set_index("metric").loc["iou_at_0.3", "kendall_tau_vs_auc_iou"] == pytest.approx(-1)


@pytest.mark.parametrize("seed", range(6))
def test_curve_and_sweep_from_one_ranking_equal_the_separate_kernels(seed):
    """The shared-ranking path equals iou_curve (bucket counts) and top_k_sweep on random maps
    with ties at and between the thresholds (values on a 0.05 grid, all-zero and all-one maps)."""
    generator = torch.Generator().manual_seed(200 + seed)
    maps = (torch.rand(5, H, W, generator=generator) * 20).round() / 20
    maps[0], maps[1] = 0.0, 1.0
    masks = torch.stack([disc(2 + 3 * i, (10 + 4 * i, 20)) for i in range(5)])
    curve, sweep = loc.curve_and_sweep(maps, masks)
    torch.testing.assert_close(curve, loc.iou_curve(maps, masks))
    reference = loc.top_k_sweep(maps, masks)
    torch.testing.assert_close(sweep["iou"], reference["iou"])
    torch.testing.assert_close(sweep["energy"], reference["energy"])


def test_wrapped_blur_refuses_a_kernel_wider_than_the_map():
    with pytest.raises(ValueError, match="too wide to wrap"):
        loc.gaussian_smooth(torch.rand(1, 8, 8), 3.0, edges="wrap")
    assert loc.gaussian_smooth(torch.rand(1, 8, 8), 3.0).shape == (1, 8, 8)  # replicated: any width


def test_binary_map_relative_difference_is_minus_ten_percent_by_construction():
    """The kernel's AUC-IoU of any binary map is 0.9 x its IoU: the reference row says so."""
    from endoexplain_core.analysis import extended_localisation as ext
    mask = disc(6.0)[None]
    for offset in (0, 4, 9):                                   # overlapping, partly, barely
        binary = disc(7.0, centre=(20 + offset, 20))[None].float()
        iou = loc.iou_curve(binary, mask)[0, 0].item()
        assert loc.auc_iou(binary, mask).item() == pytest.approx(0.9 * iou, rel=1e-5)
    row = ext.binary_map_reference().iloc[0]
    for level in ext.IOU_LEVELS:
        assert row[f"rel_diff_{level:.1f}_pct"] == pytest.approx(-10.0)


def test_auc_iou_intervals_are_paired_bootstrap_of_the_means(scored):
    from endoexplain_core.analysis import extended_localisation as ext
    from endoexplain_core.analysis import stats
    table = scored[0]
    summary = ext.auc_iou_table(table, top_fraction=0.2, replicates=300, seed=5).set_index("method")
    wide = table.pivot(index="sample_id", columns="method", values="auc_iou")[list(ext.EXTENDED_METHODS)]
    reference = stats.bootstrap_mean_ci(wide.to_numpy(), replicates=300, seed=5)
    np.testing.assert_allclose(summary.loc[list(ext.EXTENDED_METHODS), "auc_iou_ci_low"], reference["ci_low"])
    assert (summary["auc_iou_ci_low"] <= summary["auc_iou"] + 1e-12).all()
    assert (summary["top20_iou"] <= summary["top20_iou_ci_high"] + 1e-12).all()


def test_ranking_stability_counts_how_often_a_reversal_holds():
    """Two methods, 40 images: on AUC-IoU "a" beats "b" on every image; at IoU 0.5 "b" wins by a
    wide margin (a reversal that holds in every replicate) and at 0.3 by a hair on one image."""
    from endoexplain_core.analysis import extended_localisation as ext
    rows = []
    for i in range(40):
        for method, auc, iou3, iou5 in (("a", 0.5, 0.30, 0.1), ("b", 0.2, 0.30 + (0.01 if i == 0 else 0.0), 0.6)):
            rows.append({"dataset": "d", "checkpoint_id": "c", "sample_id": f"s{i}", "method": method,
                         "auc_iou": auc, ext.iou_column(0.3): iou3, ext.iou_column(0.5): iou5,
                         ext.iou_column(0.7): iou5, ext.topk_column("iou", 0.20): auc})
    tau, reversals = ext.ranking_stability(pd.DataFrame(rows), ext.ranking_metrics(0.2), methods=("a", "b"),
                                           replicates=400, seed=3)
    by_metric = reversals.set_index("metric")
    assert by_metric.loc["iou_at_0.5", "share_reversed"] == 1.0
    # image s0 is the only one where b > a at 0.3: replicates without it tie (no reversal)
    share = by_metric.loc["iou_at_0.3", "share_reversed"]
    assert share == pytest.approx(1 - (1 - 1 / 40) ** 40, abs=0.06)
    assert "top20_iou" not in by_metric.index
    assert tau.set_index("metric").loc["auc_iou", "kendall_tau_vs_auc_iou"] == pytest.approx(1.0)


def test_threshold_bias_tests_match_scipy_and_holm(scored):
    from scipy import stats as scipy_stats
    from endoexplain_core.analysis import extended_localisation as ext
    from endoexplain_core.analysis import stats
    table = scored[0]
    result = ext.threshold_bias_tests(table, methods=("gradcam", "eigencam"), thresholds=(0.3, 0.5))
    assert len(result) == 4
    row = result.set_index(["method", "iou_threshold"]).loc[("gradcam", 0.3)]
    part = table[table["method"] == "gradcam"]
    auc, iou = part["auc_iou"].to_numpy(), part[ext.iou_column(0.3)].to_numpy()
    if np.count_nonzero(auc / 0.9 - iou):     # the test is of the reported quantity
        assert row["p_value"] == pytest.approx(scipy_stats.wilcoxon(auc / 0.9, iou).pvalue)
    assert row["grid_mean_difference"] == pytest.approx(np.mean(auc / 0.9 - iou))
    near_zero = table.assign(**{ext.iou_column(0.5): 0.01})
    relative = ext.threshold_bias_tests(near_zero, methods=("gradcam",), thresholds=(0.5,))
    assert np.isnan(relative["rel_diff_pct"].iloc[0])     # no ratio of near-zero IoUs
    np.testing.assert_allclose(result["p_holm"], stats.holm_adjust(result["p_value"].to_numpy()))


# --- the negative class's C-Score -----------------------------------------------------------------

def _normalised(frames) -> tuple[list[str], torch.Tensor]:
    """(sample ids, normalised (B, 3, S, S) images) of (sample_id, uint8 RGB, ...) frames."""
    from endoexplain_core.data.datasets import to_normalised_tensor
    return [f[0] for f in frames], torch.stack([to_normalised_tensor(f[1]) for f in frames])


def test_negative_class_gold_list_weights_and_c_score_by_hand(monkeypatch):
    """Four negatives with z = logit1 - logit0 = -2, -1, 0, 3 and T = 2: negative-class
    confidences sigmoid(-z / 2) = 0.731, 0.622, 0.5, 0.182, so G(0) = the first three (0.5 counts).
    CAMs: the left half on images 0, 1 (and 3), the right half on image 2, so the only
    agreeing gold pair is (0, 1): C = w0 w1 / (w0 w1 + w0 w2 + w1 w2) -- not the unweighted 1/3.
    LayerCAM is all zeros (constant maps: no C-Score, "constant")."""
    from endoexplain_core.analysis import extended_localisation as ext
    from endoexplain_core.kernels import cams
    size, z = 64, torch.tensor([-2.0, -1.0, 0.0, 3.0])
    left = torch.zeros(size, size)
    left[:, :size // 2] = 1
    hand_maps = torch.stack([left, left, 1 - left, left])
    seen = []

    def fake_cams(model, layer, images, *, target_class, methods, return_logits):
        start = sum(seen)
        seen.append(len(images))
        assert target_class == 0 and tuple(methods) == ext.MODEL_METHODS and return_logits
        rows = slice(start, start + len(images))
        maps = {m: hand_maps[rows].clone() for m in methods}
        maps["layercam"] = torch.zeros(len(images), size, size)
        return maps, torch.stack([torch.zeros(len(images)), z[rows]], dim=1)

    monkeypatch.setattr(cams, "compute_cams", fake_cams)
    monkeypatch.setattr(ext.networks, "resolve_target_layer", lambda model, arch, layer: ("hand", None))
    frames = [(f"neg{i}", np.full((size, size, 3), 100 + 20 * i, np.uint8)) for i in range(4)]
    ids, images = _normalised(frames)
    batches = [(ids[:2], images[:2]), (ids[2:], images[2:])]          # the gold list spans batches
    metadata = {"checkpoint_id": "hand", "arch": "resnet34", "seed": 1}
    rows = ext.negative_class_c_scores(torch.nn.Identity(), metadata, 2.0, batches, dataset="toy",
                                       settings=config.LocalisationSettings(), replicates=2000, seed=SEED).set_index("method")
    assert seen == [2, 2]
    assert list(rows.index) == list(ext.EXTENDED_METHODS) and set(rows["class"]) == {"negative"}
    assert (rows["n_gold"] == 3).all() and (rows["n_audited"] == 4).all()
    w = torch.sigmoid(-z[:3] / 2).double().numpy()
    expected = w[0] * w[1] / (w[0] * w[1] + w[0] * w[2] + w[1] * w[2])
    assert rows.loc["gradcam", "c_score"] == pytest.approx(expected, rel=1e-6)
    assert abs(expected - 1 / 3) > 0.05
    assert rows.loc["gradcam", "n_constant"] == 0 and rows.loc["layercam", "n_constant"] == 3
    assert np.isnan(rows.loc["layercam", "c_score"]) and rows.loc["layercam", "c_score_note"] == "constant"
    assert rows.loc["centre", "c_score"] == pytest.approx(1.0)          # identical, not flat, maps
    assert rows.loc["gradcam", "c_score_ci_low"] <= expected <= rows.loc["gradcam", "c_score_ci_high"]
    assert np.isfinite(rows.loc["random", "c_score_native"])


def test_negative_rows_carry_the_polyp_rows_columns_and_class(scored):
    from endoexplain_core.analysis import extended_localisation as ext
    from tests.kernel_fixtures import nondegenerate_model
    polyp = scored[1]
    assert set(polyp["class"]) == {"polyp"}
    model = nondegenerate_model("resnet34", seed=7, image_size=64)
    metadata = {"checkpoint_id": "resnet34_s7", "arch": "resnet34", "seed": 7}
    ids, images = _normalised(_cases(6, seed=1))
    batches = [(ids[:4], images[:4]), (ids[4:], images[4:])]
    negative = ext.negative_class_c_scores(model, metadata, 1.0, batches, dataset="toy",
                                           settings=config.LocalisationSettings(), replicates=2000, seed=SEED)
    assert list(negative.columns) == list(polyp.columns)
    assert set(negative["class"]) == {"negative"} and list(negative["method"]) == list(ext.EXTENDED_METHODS)
    assert (negative["n_audited"] == 6).all() and negative["n_gold"].between(0, 6).all()
    # the logits' sign alone decides each image's class: every image is in one of the two gold lists
    positive = ext.score_checkpoint(model, metadata, 1.0, _cases(6, seed=1), dataset="toy", image_size=64,
                                    settings=config.LocalisationSettings(), replicates=2000, seed=SEED,
                                    batch_size=16)[1]
    assert positive["n_gold"].iloc[0] + negative["n_gold"].iloc[0] == 6


def test_negative_batches_read_the_manifest_rows_in_batches(tmp_path):
    from PIL import Image
    from endoexplain_core.analysis import extended_localisation as ext
    from endoexplain_core.data.datasets import resize_rgb, to_normalised_tensor
    frames = [np.full((80, 96, 3), 40 * i, np.uint8) for i in range(3)]
    for index, frame in enumerate(frames):
        Image.fromarray(frame).save(tmp_path / f"n{index}.png")
    rows = pd.DataFrame({"sample_id": ["n0", "n1", "n2"], "path": ["n0.png", "n1.png", "n2.png"]})
    batches = list(ext.negative_batches(rows, tmp_path, image_size=32, batch_size=2))
    assert [ids for ids, _ in batches] == [["n0", "n1"], ["n2"]]
    assert batches[0][1].shape == (2, 3, 32, 32)
    torch.testing.assert_close(batches[1][1][0], to_normalised_tensor(resize_rgb(frames[2], 32)))


def test_a_c_score_of_constant_maps_is_not_given():
    """Identical flat maps agree perfectly: the C-Score would be 1.000 (1.000 to 1.000) and say
    nothing; the row says "constant" instead. Real maps get a number."""
    from endoexplain_core.analysis import extended_localisation as ext
    weights = np.ones(4) / 4
    flat = ext.c_score_with_interval(torch.zeros(4, 64, 64), weights, replicates=50, seed=1)
    assert np.isnan(flat["c_score"]) and flat["c_score_note"] == "constant"
    maps = torch.rand(4, 64, 64, generator=torch.Generator().manual_seed(3))
    real = ext.c_score_with_interval(maps, weights, replicates=50, seed=1)
    assert 0 < real["c_score"] < 1 and real["c_score_note"] == ""
