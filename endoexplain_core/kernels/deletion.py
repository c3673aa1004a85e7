"""Deletion response: how much the positive logit falls when a set of pixels is removed.

A removed pixel is 0 in every channel of the normalised input (the ImageNet mean colour). Drops
are ``reference - deleted`` (positive: the evidence was in the removed pixels), for the positive
logit and for z = logit_pos - logit_neg. The random control's masks are counter-based: they
depend only on (sample id, repetition), on any device.
Method: docs/maps_and_scores.md, "Deletion and the random-deletion control".
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def sample_key(sample_id: str) -> int:
    """Stable non-negative 63-bit integer of a sample id (first 8 bytes of its SHA-256)."""
    digest = hashlib.sha256(str(sample_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & (2 ** 63 - 1)


def repetition_seed(key: int, repetition: int) -> int:
    """Seed of random deletion ``repetition`` of the sample with ``key`` (SHA-256 derived,
    so it never coincides with the random heat map's seed ``key``)."""
    return sample_key(f"random-deletion/{int(key)}/{int(repetition)}")


def _check_keep(images: torch.Tensor, keep: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise ValueError(f"images must be a float tensor (B, C, H, W); got "
                         f"{tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__}")
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool:
        raise ValueError("keep must be a bool tensor (True = pixel to delete)")
    if keep.shape[-3:] != (images.shape[0], *images.shape[-2:]):
        raise ValueError(f"keep {tuple(keep.shape)} does not match images {tuple(images.shape)} "
                         "(expected (..., B, H, W))")


def delete_pixels(images: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Copy of ``images`` (B, C, H, W) with the pixels where ``keep`` (bool (B, H, W)) is True
    set to 0 in every channel (normalised space: the ImageNet mean colour)."""
    _check_keep(images, keep)
    if keep.dim() != 3:
        raise ValueError(f"keep must be (B, H, W); got {tuple(keep.shape)}")
    return images.masked_fill(keep[:, None], 0.0)


def deletion_logits(model: nn.Module, images: torch.Tensor, keeps: torch.Tensor,
                    chunk_size: int | None = None) -> torch.Tensor:
    """Logits after each of M deletions: float (M, B, K).

    images : (B, C, H, W) normalised input. keeps : bool (M, B, H, W), True = delete.
    chunk_size : at most this many deleted images per no-grad forward (whole deletions, at least
    one per forward); None: one deletion (B images) per forward. Puts the model in eval mode.
    """
    _check_keep(images, keeps)
    if keeps.dim() != 4:
        raise ValueError(f"keeps must be (M, B, H, W); got {tuple(keeps.shape)}")
    n_deletions, batch = keeps.shape[:2]
    chunk_size = batch if chunk_size is None else chunk_size
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")
    model.eval()
    per_forward = max(1, chunk_size // batch)
    outputs = []
    with torch.no_grad():
        for start in range(0, n_deletions, per_forward):
            chunk = keeps[start:start + per_forward]
            deleted = images[None].masked_fill(chunk[:, :, None], 0.0)  # (m, B, C, H, W)
            logits = model(deleted.flatten(0, 1))
            outputs.append(logits.reshape(chunk.shape[0], batch, -1))
    return torch.cat(outputs)


def deletion_response(model: nn.Module, images: torch.Tensor, keep: torch.Tensor,
                      target_class: int = 1) -> torch.Tensor:
    """Drop of the ``target_class`` logit when the ``keep`` pixels are deleted: float (B,).

    images : (B, C, H, W) normalised input. keep : bool (B, H, W), True = delete (e.g.
    ``threshold.top_fraction_mask(maps, 0.2)``). Two no-grad forwards (the images as given, then
    with the pixels deleted); positive = the evidence was in the deleted pixels. Puts the model in
    eval mode. For M deletions of one batch in one call, use ``deletion_logits``.
    """
    _check_keep(images, keep)
    if keep.dim() != 3:
        raise ValueError(f"keep must be (B, H, W); got {tuple(keep.shape)}")
    model.eval()
    with torch.no_grad():
        reference = model(images)
    return logit_drops(reference, deletion_logits(model, images, keep[None])[0], target_class)


def logit_drops(reference_logits: torch.Tensor, deleted_logits: torch.Tensor,
                target_class: int = 1) -> torch.Tensor:
    """Drop of the ``target_class`` logit: reference (B, K) minus deleted (..., B, K) -> (..., B)."""
    return reference_logits[:, target_class] - deleted_logits[..., target_class]


def logit_difference(logits: torch.Tensor, positive_class: int = 1, negative_class: int = 0) -> torch.Tensor:
    """Binary logit difference z = logit_pos - logit_neg of (..., K) logits -> (...)."""
    return logits[..., positive_class] - logits[..., negative_class]


def logit_difference_drops(reference_logits: torch.Tensor, deleted_logits: torch.Tensor) -> torch.Tensor:
    """Drop of z = logit_pos - logit_neg: reference (B, K) vs deleted (..., B, K) -> (..., B)."""
    return logit_difference(reference_logits) - logit_difference(deleted_logits)


_MASK32 = 0xFFFFFFFF


def _mul32(values: torch.Tensor, constant: int) -> torch.Tensor:
    """(values * constant) mod 2^32 for int64 ``values`` in [0, 2^32), without int64 overflow
    (the constant is split into 16-bit halves, so no product exceeds 2^48)."""
    low = values * (constant & 0xFFFF)
    high = ((values * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def mix32(values: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (the "lowbias32" finaliser: xor-shift, multiply, xor-shift,
    multiply, xor-shift) of int64 ``values`` in [0, 2^32), elementwise, on their device.

    Only integer shifts, xors, masks and overflow-free products: identical on every device."""
    values = values ^ (values >> 16)
    values = _mul32(values, 0x7FEB352D)
    values = values ^ (values >> 15)
    values = _mul32(values, 0x846CA68B)
    return values ^ (values >> 16)


def random_deletion_sort_keys(stream_key: torch.Tensor, n_total: int) -> torch.Tensor:
    """Counter-based random sort keys: int64 (B, N) for B streams and N pixels, distinct and
    non-negative within a stream, on ``stream_key``'s device. ``stream_key``: int64 (B,) 63-bit
    keys (``repetition_seed``)."""
    index_bits = n_total.bit_length()
    random_bits = 62 - index_bits
    if random_bits < 16:
        raise ValueError(f"{n_total} pixels are too many for the 62-bit random sort keys")
    stream_low = (stream_key & _MASK32)[:, None]
    stream_high = (stream_key >> 32)[:, None]
    index = torch.arange(n_total, dtype=torch.int64, device=stream_key.device)[None]
    high_word = mix32(mix32(index ^ stream_low) ^ stream_high)
    low_word = mix32(mix32(index ^ stream_high) ^ stream_low ^ 0x85EBCA6B)
    draw = ((high_word << 31) | (low_word >> 1)) >> (63 - random_bits)
    return (draw << index_bits) | index


def random_deletion_masks(sample_keys, n_pixels, height: int, width: int,
                          repetitions: int, device=None) -> torch.Tensor:
    """bool (R, B, H, W): for each repetition r and sample b exactly ``n_pixels[b]`` pixels, those with
    the lowest ``random_deletion_sort_keys`` of ``repetition_seed(key_b, r)``; the masks depend
    only on (sample id, repetition), not on the batch, the number of repetitions or the device."""
    sample_keys = [int(key) for key in sample_keys]
    n_pixels = torch.as_tensor(n_pixels, dtype=torch.int64).reshape(-1).cpu()
    n_total = height * width
    if n_pixels.numel() != len(sample_keys):
        raise ValueError(f"{len(sample_keys)} sample keys but {n_pixels.numel()} pixel counts")
    if ((n_pixels < 0) | (n_pixels > n_total)).any():
        raise ValueError(f"pixel counts must lie in [0, {n_total}]; got {n_pixels.tolist()}")
    if repetitions < 1:
        raise ValueError(f"repetitions must be positive; got {repetitions}")
    device = torch.device("cpu") if device is None else torch.device(device)
    largest_count = int(n_pixels.max()) if len(sample_keys) else 0
    counts = n_pixels.to(device)
    keep = torch.zeros(repetitions, len(sample_keys), n_total, dtype=torch.bool, device=device)
    if largest_count == 0:
        return keep.reshape(repetitions, len(sample_keys), height, width)
    wanted = torch.arange(largest_count, device=device)[None] < counts[:, None]   # (B, k)
    for r in range(repetitions):  # one (B, N) key array at a time: memory independent of R
        streams = torch.tensor([repetition_seed(key, r) for key in sample_keys],
                               dtype=torch.int64).to(device)
        sort_keys = random_deletion_sort_keys(streams, n_total)
        lowest = torch.topk(sort_keys, largest_count, dim=-1, largest=False, sorted=True).indices
        keep[r].scatter_(-1, lowest, wanted)
    return keep.reshape(repetitions, len(sample_keys), height, width)
