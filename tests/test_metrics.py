"""Spatial metrics on hand-computed cases, and the baselines."""

from __future__ import annotations

import math

import pytest
import torch

from endoexplain_core.kernels import baselines, metrics


def _mask(height, width, rows, cols):
    mask = torch.zeros(1, height, width, dtype=torch.bool)
    mask[0, rows, cols] = True
    return mask


def test_peak_location_is_first_row_major_maximum():
    maps = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]],
                         [[0.2, 0.1, 0.0], [0.0, 0.0, 0.9]]])
    rows, cols = metrics.peak_location(maps)
    assert rows.tolist() == [0, 1] and cols.tolist() == [1, 2]


def test_peak_outside_mask_hand_case():
    maps = torch.zeros(2, 4, 4)
    maps[0, 1, 1] = 1.0
    maps[1, 3, 3] = 1.0
    masks = torch.zeros(2, 4, 4, dtype=torch.bool)
    masks[:, 0:2, 0:2] = True
    assert metrics.peak_outside_mask(maps, masks).tolist() == [False, True]


def test_iou_hand_case():
    keep = _mask(4, 4, slice(0, 2), slice(0, 2))  # 4 pixels
    lesion = _mask(4, 4, slice(1, 3), slice(1, 3))  # 4 pixels, 1 shared
    assert metrics.top_fraction_iou(keep, lesion).item() == pytest.approx(1 / 7)


def test_energy_in_mask_hand_case_and_zero_map():
    maps = torch.tensor([[[1.0, 3.0], [0.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]]])
    masks = torch.tensor([[[True, False], [False, True]]] * 2)
    energy = metrics.energy_in_mask(maps, masks)
    assert energy[0].item() == pytest.approx(5 / 8)
    # a constant (all-zero) map is uniform: its share is the lesion area, 2 of 4 pixels
    assert energy[1].item() == pytest.approx(2 / 4)


def test_constant_map_centre_of_mass_is_the_frame_centre():
    maps = torch.zeros(1, 4, 6)
    lesion = torch.zeros(1, 4, 6, dtype=torch.bool)
    lesion[0, 3, 5] = True  # pixel centre (3.5, 5.5); frame centre (2, 3); diagonal sqrt(52)
    distance = metrics.centre_of_mass_distance(maps, lesion)
    assert distance.item() == pytest.approx(math.hypot(1.5, 2.5) / math.sqrt(52), rel=1e-6)


def test_centre_of_mass_distance_hand_case():
    # 4 x 6 frame (diagonal sqrt(52)); map mass at pixel (0, 0), lesion is pixel (3, 4):
    # distance between centres (0.5, 0.5) and (3.5, 4.5) is 5.
    maps = torch.zeros(1, 4, 6)
    maps[0, 0, 0] = 0.7
    lesion = _mask(4, 6, 3, 4)
    distance = metrics.centre_of_mass_distance(maps, lesion)
    assert distance.item() == pytest.approx(5 / math.sqrt(52), rel=1e-6)


def test_lesion_area_and_centre_distance_hand_cases():
    centred = _mask(4, 4, slice(1, 3), slice(1, 3))  # centroid (2, 2) = frame centre
    corner = _mask(4, 4, 0, 0)  # centroid (0.5, 0.5): distance sqrt(4.5) of half-diagonal sqrt(8)
    masks = torch.cat([centred, corner])
    assert metrics.lesion_area_fraction(masks).tolist() == pytest.approx([4 / 16, 1 / 16])
    assert metrics.lesion_centre_distance(masks).tolist() == pytest.approx([0.0, math.sqrt(4.5) / math.sqrt(8)])


def test_spatial_metrics_bundle_is_consistent():
    generator = torch.Generator().manual_seed(0)
    maps = torch.rand(3, 10, 10, generator=generator)
    masks = torch.zeros(3, 10, 10, dtype=torch.bool)
    masks[:, 2:6, 3:8] = True
    out = metrics.spatial_metrics(maps, masks, 0.2)
    assert set(out) == set(metrics.SPATIAL_METRIC_KEYS)
    assert all(value.shape == (3,) for value in out.values())
    assert torch.equal(out["iou_below_0_10"], out["iou"] < 0.10)
    rows, cols = out["peak_row"], out["peak_col"]
    assert torch.equal(out["peak_outside_mask"], ~masks[torch.arange(3), rows, cols])


def test_empty_masks_and_bad_input_give_clear_errors():
    maps = torch.rand(3, 4, 4)
    masks = torch.ones(3, 4, 4, dtype=torch.bool)
    masks[0] = False
    masks[2] = False
    with pytest.raises(ValueError, match=r"empty at batch indices \[0, 2\]"):
        metrics.peak_outside_mask(maps, masks)
    with pytest.raises(ValueError, match="binary"):
        metrics.energy_in_mask(maps, torch.full((3, 4, 4), 0.5))
    with pytest.raises(ValueError, match="differ in shape"):
        metrics.energy_in_mask(maps, torch.ones(3, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(B, H, W\)"):
        metrics.lesion_area_fraction(torch.ones(4, 4, dtype=torch.bool))
    # 0/1 integer masks are accepted as binary
    assert metrics.lesion_area_fraction(torch.ones(1, 2, 2, dtype=torch.uint8)).item() == 1.0


def test_random_heatmaps_seeded_per_sample():
    first = baselines.random_heatmaps([11, 22, 33], 5, 6)
    again = baselines.random_heatmaps([33, 11], 5, 6)
    assert first.shape == (3, 5, 6) and first.dtype == torch.float32
    assert torch.equal(first[2], again[0]) and torch.equal(first[0], again[1])
    assert not torch.equal(first[0], first[1])
    assert 0.0 <= float(first.min()) and float(first.max()) < 1.0


def test_centre_gaussian_hand_values():
    gaussian = baselines.centre_gaussian(2, 4, 4, sigma_fraction=0.25)  # sigma = 1 pixel
    assert gaussian.shape == (2, 4, 4)
    # pixel (1, 1) sits at (1.5, 1.5): d^2 = 0.5 from the centre; pixel (0, 0): d^2 = 4.5
    assert gaussian[0, 1, 1].item() == pytest.approx(1.0)
    assert gaussian[0, 0, 0].item() == pytest.approx(math.exp(-4.0 / 2), rel=1e-6)
    assert torch.equal(gaussian, gaussian.flip(1)) and torch.equal(gaussian, gaussian.flip(2))


def _square_frame(size=64, background=0.4, square=1.0):
    """float32 (1, 3, S, S) grey frame: a black 2-px rim (the scope's field of view ends there),
    a flat ``background`` and one bright square, rows 20-39 and columns 24-43."""
    frame = torch.full((1, 3, size, size), background)
    frame[..., :2, :] = frame[..., -2:, :] = 0.0
    frame[..., :, :2] = frame[..., :, -2:] = 0.0
    frame[..., 20:40, 24:44] = square
    return frame


def test_salience_map_hand_values_without_smoothing():
    """sigma -> 0 leaves M = |central-difference gradient| / max. One step of 0.6 between the
    background and the square: a side pixel (inside or just outside it) has one component
    0.3, an inner corner pixel two (0.3 * sqrt(2), the maximum), a pixel across the corner
    none; the rim of the field of view is no edge."""
    salience = baselines.salience_map(_square_frame(), sigma_fraction=1e-4)[0]
    assert salience.max().item() == pytest.approx(1.0)
    for row, col in ((20, 24), (20, 43), (39, 24), (39, 43)):
        assert salience[row, col].item() == pytest.approx(1.0)
    for row, col in ((19, 30), (20, 30), (39, 30), (40, 30), (30, 23), (30, 24), (30, 43), (30, 44),
                     (19, 24), (20, 23)):
        assert salience[row, col].item() == pytest.approx(1 / math.sqrt(2), rel=1e-5)
    assert salience[19, 23].item() == 0.0 and salience[30, 34].item() == 0.0
    assert salience[:4].abs().max().item() == 0.0 and salience[:, :4].abs().max().item() == 0.0


def test_salience_map_peaks_on_the_square_outline_and_is_a_proper_map():
    frames = torch.cat([_square_frame(), torch.full((1, 3, 64, 64), 0.5)])   # + a flat frame
    salience = baselines.salience_map(frames)
    assert salience.shape == (2, 64, 64) and salience.dtype == torch.float32
    assert salience.min().item() == 0.0 and salience[0].max().item() == pytest.approx(1.0)
    assert salience[1].abs().max().item() == 0.0           # no gradient: a constant map
    peak = divmod(int(salience[0].argmax()), 64)
    # the square's outline runs over rows 19-20 / 39-40 and columns 23-24 / 43-44
    on_outline = (19 <= peak[0] <= 40 and 23 <= peak[1] <= 44
                  and not (21 <= peak[0] <= 38 and 25 <= peak[1] <= 42))
    assert on_outline, peak
    # sigma = 0.03 * 64 = 1.92 px, kernel radius 6 px: nothing further than 7 px from the outline
    assert salience[0, 30, 34].item() == 0.0 and salience[0, 5, 5].item() == 0.0
    around = salience[0, 10:50, 14:54]    # symmetric about the square's own axes
    torch.testing.assert_close(around, around.flip(0), atol=1e-6, rtol=0)
    torch.testing.assert_close(around, around.flip(1), atol=1e-6, rtol=0)
    # any per-channel affine scaling of a grey frame (the audit passes ImageNet-normalised
    # frames) changes the grey level affinely: the same map
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    torch.testing.assert_close(baselines.salience_map((frames[:1] - mean) / std), salience[:1],
                               atol=1e-5, rtol=0)


def test_peak_lesion_distance_hand_cases():
    maps = torch.zeros(3, 6, 6)
    maps[0, 2, 2] = 1.0            # peak inside the lesion
    maps[1, 0, 0] = 1.0            # peak at (0, 0); nearest lesion pixel (3, 4): distance 5
    masks = torch.zeros(3, 6, 6, dtype=torch.bool)
    masks[0, 1:4, 1:4] = True
    masks[1, 3:6, 4:6] = True
    masks[2, 0, 0] = True          # map 2 is constant: no peak
    distance = metrics.peak_lesion_distance(maps, masks)
    assert distance[0].item() == 0.0 and distance[1].item() == 5.0 and math.isnan(distance[2].item())


def test_peak_lesion_distance_matches_scipy_distance_transform_on_random_inputs():
    from scipy import ndimage

    generator = torch.Generator().manual_seed(7)
    for trial in range(40):
        height, width = 5 + trial % 7, 4 + (trial * 3) % 9
        maps = torch.rand(4, height, width, generator=generator)
        maps[0] = torch.round(maps[0] * 3)                        # ties: the first maximum counts
        masks = torch.rand(4, height, width, generator=generator) < 0.15
        masks[:, height // 2, width // 2] = True                  # never empty
        rows, cols = metrics.peak_location(maps)
        expected = [ndimage.distance_transform_edt(~masks[i].numpy())[rows[i], cols[i]] for i in range(4)]
        assert metrics.peak_lesion_distance(maps, masks).tolist() == pytest.approx(expected, abs=1e-5)
