"""Deletion response: pixel removal, batched forwards, random controls, a toy model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from endoexplain_core.kernels import deletion, threshold


class RegionSumModel(nn.Module):
    """Logits (B, 2): positive = sum of channel 0 over rows 0-1 and cols 0-1 (a 2x2 region),
    negative = 0.5 * sum of channel 1 over the whole image. Hand-computable drops."""

    def forward(self, images):
        positive = images[:, 0, 0:2, 0:2].sum(dim=(1, 2))
        negative = 0.5 * images[:, 1].sum(dim=(1, 2))
        return torch.stack([negative, positive], dim=1)


def test_sample_key_is_stable():
    assert deletion.sample_key("polyp_001") == deletion.sample_key("polyp_001")
    assert deletion.sample_key("polyp_001") != deletion.sample_key("polyp_002")
    # first 8 bytes of sha256(b"abc") = ba7816bf8f01cfea, top bit cleared
    assert deletion.sample_key("abc") == 0xBA7816BF8F01CFEA & (2 ** 63 - 1)


def test_delete_pixels_sets_exactly_k_pixels_to_zero_in_all_channels():
    images = torch.rand(2, 3, 8, 8) + 1.0  # no zeros before deletion
    original = images.clone()
    keep = threshold.top_fraction_mask(torch.rand(2, 8, 8), 0.2)
    deleted = deletion.delete_pixels(images, keep)
    changed = (deleted != images)
    assert torch.equal(changed.all(dim=1), keep) and torch.equal(changed.any(dim=1), keep)
    assert changed.all(dim=1).sum(dim=(1, 2)).tolist() == [13, 13]
    assert (deleted[keep[:, None].expand_as(deleted)] == 0).all()
    assert torch.equal(images, original)  # the input is not modified in place


def test_toy_model_gives_hand_computed_drops():
    images = torch.ones(2, 3, 4, 4)
    images[1, 0] = 2.0
    keep = torch.zeros(2, 4, 4, dtype=torch.bool)
    keep[0, 0, 0] = True  # one pixel of the region: positive drop 1
    keep[1, 0:2, 0:2] = True  # whole region at value 2: positive drop 8
    reference = RegionSumModel()(images)
    deleted = deletion.deletion_logits(RegionSumModel(), images, keep[None])
    assert deletion.logit_drops(reference, deleted[0], 1).tolist() == [1.0, 8.0]
    # z = pos - neg; deleting also removes channel 1 (0.5 per pixel): z drop = pos drop - 0.5 * k
    assert deletion.logit_difference_drops(reference, deleted)[0].tolist() == [0.5, 6.0]
    outside = torch.zeros(2, 4, 4, dtype=torch.bool)
    outside[:, 3, 3] = True  # outside the region: no positive drop
    deleted_outside = deletion.deletion_logits(RegionSumModel(), images, outside[None])[0]
    assert deletion.logit_drops(reference, deleted_outside, 1).tolist() == [0.0, 0.0]


def test_deletion_response_gives_the_hand_computed_drops_in_one_call():
    images = torch.ones(3, 3, 4, 4)
    images[1, 0] = 2.0
    keep = torch.zeros(3, 4, 4, dtype=torch.bool)
    keep[0, 0, 0] = True          # one pixel of the 2x2 region at value 1: drop 1
    keep[1, 0:2, 0:2] = True      # the whole region at value 2: drop 8
    keep[2, 2:, 2:] = True        # outside the region: drop 0
    drops = deletion.deletion_response(RegionSumModel(), images, keep, target_class=1)
    assert drops.shape == (3,) and drops.tolist() == [1.0, 8.0, 0.0]
    # the negative logit is 0.5 x channel 1's sum: deleting k pixels drops it by 0.5 k
    assert deletion.deletion_response(RegionSumModel(), images, keep, target_class=0).tolist() == [0.5, 2.0, 2.0]
    with pytest.raises(ValueError, match=r"keep must be \(B, H, W\)"):
        deletion.deletion_response(RegionSumModel(), images, keep[None])


def test_deletion_logits_chunks_agree_with_single_forwards():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 2))
    images = torch.randn(3, 3, 8, 8)
    keeps = torch.rand(5, 3, 8, 8, generator=torch.Generator().manual_seed(1)) < 0.3
    stacked = deletion.deletion_logits(model, images, keeps, chunk_size=7)  # 2 deletions per forward
    assert stacked.shape == (5, 3, 2)
    with torch.no_grad():
        for m in range(5):
            assert torch.allclose(stacked[m], model(deletion.delete_pixels(images, keeps[m])), atol=1e-6)


def test_random_deletion_masks_exact_reproducible_and_varied():
    keys = [deletion.sample_key(name) for name in ("a", "b", "c")]
    masks = deletion.random_deletion_masks(keys, [5, 0, 16], 4, 4, repetitions=6)
    assert masks.shape == (6, 3, 4, 4) and masks.dtype == torch.bool
    assert masks.sum(dim=(2, 3)).tolist() == [[5, 0, 16]] * 6
    again = deletion.random_deletion_masks(keys[::-1], [16, 0, 5], 4, 4, repetitions=6)
    assert torch.equal(masks, again.flip(1))  # independent of batch order
    distinct = {tuple(masks[r, 0].flatten().tolist()) for r in range(6)}
    assert len(distinct) == 6  # repetitions differ (C(16,5) = 4368 possibilities)
    bigger = deletion.random_deletion_masks(keys, [5, 0, 16], 4, 4, repetitions=8)
    assert torch.equal(bigger[:6], masks)  # repetition r does not depend on how many are drawn


def test_bad_input_gives_clear_errors():
    images = torch.rand(2, 3, 4, 4)
    with pytest.raises(ValueError, match="bool"):
        deletion.delete_pixels(images, torch.ones(2, 4, 4))
    with pytest.raises(ValueError, match="does not match"):
        deletion.delete_pixels(images, torch.ones(2, 5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(M, B, H, W\)"):
        deletion.deletion_logits(RegionSumModel(), images, torch.ones(2, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="pixel counts"):
        deletion.random_deletion_masks([1, 2], [3, 17], 4, 4, repetitions=2)
    with pytest.raises(ValueError, match="sample keys"):
        deletion.random_deletion_masks([1, 2], [3], 4, 4, repetitions=2)


# --- counter-based random masks: independent pure-Python reference, device parity ------------

def _python_mix32(value: int) -> int:
    """lowbias32 in plain Python integers (the reference for ``deletion.mix32``)."""
    value ^= value >> 16
    value = (value * 0x7FEB352D) & 0xFFFFFFFF
    value ^= value >> 15
    value = (value * 0x846CA68B) & 0xFFFFFFFF
    return value ^ (value >> 16)


def _python_deletion_mask(sample_id: str, repetition: int, n_pixels: int, n_total: int) -> set[int]:
    """The documented rule written out with Python integers, pixel by pixel."""
    stream = deletion.repetition_seed(deletion.sample_key(sample_id), repetition)
    low, high = stream & 0xFFFFFFFF, stream >> 32
    index_bits = n_total.bit_length()
    random_bits = 62 - index_bits
    keys = []
    for i in range(n_total):
        high_word = _python_mix32(_python_mix32(i ^ low) ^ high)
        low_word = _python_mix32(_python_mix32(i ^ high) ^ low ^ 0x85EBCA6B)
        draw = ((high_word << 31) | (low_word >> 1)) >> (63 - random_bits)
        keys.append(((draw << index_bits) | i, i))
    return {i for _, i in sorted(keys)[:n_pixels]}


def test_mix32_matches_python_integers_on_edge_values():
    values = [0, 1, 2, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF, 123456789]
    ours = deletion.mix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert ours == [_python_mix32(v) for v in values]


def test_random_masks_follow_the_counter_based_rule_exactly():
    """CPU half of the device parity: the torch kernel equals the rule computed in Python."""
    ids = ["case_001", "case_002"]
    masks = deletion.random_deletion_masks([deletion.sample_key(s) for s in ids], [13, 40], 9, 11,
                                           repetitions=3)
    for b, sample_id in enumerate(ids):
        for r in range(3):
            expected = _python_deletion_mask(sample_id, r, [13, 40][b], 99)
            assert set(masks[r, b].flatten().nonzero().flatten().tolist()) == expected


def test_random_masks_are_roughly_uniform_over_pixels():
    keys = [deletion.sample_key(f"s{i}") for i in range(200)]
    masks = deletion.random_deletion_masks(keys, [16] * 200, 8, 8, repetitions=5)
    frequency = masks.float().mean(dim=(0, 1)).flatten()          # expected 16/64 = 0.25
    assert frequency.min() > 0.20 and frequency.max() < 0.30     # 1,000 draws: sd 0.014


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_random_masks_identical_on_cuda_and_cpu():
    keys = [deletion.sample_key(f"img{i}") for i in range(16)]
    cpu = deletion.random_deletion_masks(keys, [13107] * 16, 256, 256, repetitions=4)
    gpu = deletion.random_deletion_masks(keys, [13107] * 16, 256, 256, repetitions=4, device="cuda")
    assert gpu.device.type == "cuda" and torch.equal(cpu, gpu.cpu())
