"""Exact top-area rule and its tie diagnostics."""

from __future__ import annotations

import pytest
import torch

from endoexplain_core.kernels import threshold


def _priority_reference(values: list[float], count: int) -> set[int]:
    """Plain-Python reference: sort by (-value, (i * 1_000_003) % N)."""
    n = len(values)
    order = sorted(range(n), key=lambda i: (-values[i], (i * 1_000_003) % n))
    return set(order[:count])


@pytest.mark.parametrize("height,width,fraction", [(7, 11, 0.20), (5, 5, 0.33), (3, 7, 0.5), (13, 1, 0.9), (4, 4, 1.0)])
def test_exact_counts_for_fractions_that_do_not_divide(height, width, fraction):
    maps = torch.rand(3, height, width, generator=torch.Generator().manual_seed(1))
    keep = threshold.top_fraction_mask(maps, fraction)
    assert keep.dtype == torch.bool and keep.shape == maps.shape
    expected = round(fraction * height * width)
    assert keep.sum(dim=(1, 2)).tolist() == [expected] * 3
    # the kept pixels are the highest ones: min kept >= max dropped
    for b in range(3):
        assert maps[b][keep[b]].min() >= maps[b][~keep[b]].max() if expected < height * width else True


def test_hand_computed_tie_break_on_all_tied_map():
    # N = 10, priorities (i * 1_000_003) % 10 = (3 i) % 10 -> i: 0..9 -> 0,3,6,9,2,5,8,1,4,7.
    # The two lowest priorities are 0 (i = 0) and 1 (i = 7).
    maps = torch.ones(1, 2, 5)
    keep = threshold.top_fraction_mask(maps, 0.2)
    assert keep.flatten().nonzero().flatten().tolist() == [0, 7]


def test_all_tied_and_two_level_ties_match_reference():
    n_rows, n_cols = 6, 9
    values = [float(v) for v in (torch.arange(n_rows * n_cols) % 2)]  # two levels, 27 each
    maps = torch.tensor(values).reshape(1, n_rows, n_cols)
    for fraction in (0.2, 0.5, 0.75):
        count = round(fraction * n_rows * n_cols)
        kept = set(threshold.top_fraction_mask(maps, fraction).flatten().nonzero().flatten().tolist())
        assert kept == _priority_reference(values, count)
    flat_map = torch.full((1, n_rows, n_cols), 0.3)
    kept = set(threshold.top_fraction_mask(flat_map, 0.2).flatten().nonzero().flatten().tolist())
    assert kept == _priority_reference([0.3] * (n_rows * n_cols), round(0.2 * n_rows * n_cols))


def test_tie_diagnostics_hand_case():
    maps = torch.tensor([
        [[5.0, 5.0, 1.0], [2.0, 2.0, 2.0], [0.0, 0.0, 0.0]],  # k = round(0.2*9) = 2: boundary value 5
        [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]],  # constant
        [[9.0, 3.0, 3.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]],  # boundary value 3, tied 3 times
    ])
    diagnostics = threshold.tie_diagnostics(maps, 0.2)
    assert diagnostics["constant"].tolist() == [False, True, False]
    assert diagnostics["max_multiplicity"].tolist() == [2, 9, 1]
    assert diagnostics["boundary_ties"].tolist() == [2, 9, 3]
    assert diagnostics["max_multiplicity"].dtype == torch.int64


def test_deterministic_across_calls_and_batch_composition():
    maps = torch.randint(0, 4, (5, 16, 16), generator=torch.Generator().manual_seed(3)).float()
    first = threshold.top_fraction_mask(maps, 0.2)
    assert torch.equal(first, threshold.top_fraction_mask(maps, 0.2))
    assert torch.equal(first[2:3], threshold.top_fraction_mask(maps[2:3], 0.2))
    for b in range(5):
        values = maps[b].flatten().tolist()
        kept = set(first[b].flatten().nonzero().flatten().tolist())
        assert kept == _priority_reference(values, round(0.2 * 256))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_same_mask_on_cuda():
    maps = torch.randint(0, 3, (4, 32, 32), generator=torch.Generator().manual_seed(4)).float()
    assert torch.equal(threshold.top_fraction_mask(maps.cuda(), 0.2).cpu(), threshold.top_fraction_mask(maps, 0.2))


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01])
def test_fraction_outside_unit_interval_is_rejected(fraction):
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        threshold.top_fraction_mask(torch.rand(1, 4, 4), fraction)


def test_bad_maps_are_rejected():
    with pytest.raises(ValueError, match=r"\(B, H, W\)"):
        threshold.top_fraction_mask(torch.rand(4, 4), 0.2)
    with pytest.raises(ValueError, match="floating"):
        threshold.top_fraction_mask(torch.ones(1, 4, 4, dtype=torch.int64), 0.2)
    with pytest.raises(ValueError, match="NaN"):
        threshold.top_fraction_mask(torch.tensor([[[0.0, float("nan")]]]), 0.5)
    with pytest.raises(ValueError, match="keeps no pixel"):
        threshold.top_fraction_mask(torch.rand(1, 2, 2), 0.1)
