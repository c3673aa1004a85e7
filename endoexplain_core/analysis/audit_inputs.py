"""The audit's inputs: the masked pool of a run, its cases read from disk and prepared at the
model's input size, in batches.

A case is (sample_id, uint8 (h, w, 3) RGB image, bool (H, W) mask), read lazily one at a time.
Preparation resizes the image (area/bilinear, then ImageNet normalisation, as ``data`` does for
training) and the mask (nearest-neighbour) to the input size; a mask empty at that size is
excluded and counted, never scored. ``input_digest`` hashes every byte an audit reads, so a
changed mask makes the next run re-audit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import cv2
import numpy as np
import pandas as pd
import torch

from endoexplain_core import files
from endoexplain_core.data.datasets import resize_rgb, to_normalised_tensor
from endoexplain_core.data.imageio import read_image_and_mask, same_frame


def masked_pool(manifest: pd.DataFrame) -> pd.DataFrame:
    """Manifest rows of the masked audit pool: role ``spatial_audit`` with a ``mask_path``."""
    if "mask_path" not in manifest.columns:
        raise ValueError("manifest has no mask_path column: cannot find the masked audit pool")
    pool = manifest[(manifest["role"] == "spatial_audit") & (manifest["mask_path"] != "")]
    return pool.reset_index(drop=True)


def manifest_cases(pool: pd.DataFrame, data_root: str | Path, *, decode_size: int | None
                   ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Yield (sample_id, uint8 (h, w, 3) RGB image, bool (H, W) mask) for each pool row.

    ``decode_size``: the model input side the images go to (large JPEGs decoded at a reduced
    scale, as in training: ``imageio.read_rgb``); None for the full frame (h, w = H, W).
    Files are read lazily, one at a time, so memory does not grow with the pool; unreadable
    files and mask/image size mismatches raise errors naming the files.
    """
    data_root = Path(data_root)
    for row in pool.itertuples(index=False):
        image, mask = read_image_and_mask(data_root / row.path, data_root / row.mask_path,
                                          decode_size=decode_size)
        yield str(row.sample_id), image, mask


def input_digest(pool: pd.DataFrame, data_root: str | Path, negatives: pd.DataFrame | None = None) -> str:
    """SHA-256 over the bytes of every file an audit reads: each pool image and its mask, and
    each held-out negative image (``negatives``), in pool order. Part of the audit's reuse key,
    so changing one byte of one mask makes the next run re-audit (the manifest records image
    digests only)."""
    data_root = Path(data_root)
    lines = [f"{row.sample_id}:{files.sha256_file(data_root / row.path)}:"
             f"{files.sha256_file(data_root / row.mask_path)}" for row in pool.itertuples(index=False)]
    if negatives is not None:
        lines += [f"{row.sample_id}:{files.sha256_file(data_root / row.path)}:"
                  for row in negatives.itertuples(index=False)]
    return files.sha256_bytes("\n".join(lines).encode())


def prepare_case(sample_id: str, image: np.ndarray, mask: np.ndarray, image_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Resize one case: float32 (3, S, S) normalised image and bool (S, S) mask. The image
    is the mask's frame, at full size or decoded at a reduced scale (``imageio.same_frame``)."""
    if not same_frame(image.shape, mask.shape):
        raise ValueError(f"sample {sample_id}: mask size {mask.shape[:2]} differs from "
                         f"image size {image.shape[:2]}")
    resized_mask = cv2.resize(mask.astype(np.uint8), (image_size, image_size),
                              interpolation=cv2.INTER_NEAREST).astype(bool)
    return to_normalised_tensor(resize_rgb(image, image_size)), torch.from_numpy(resized_mask)


def pool_images(pool: pd.DataFrame, data_root: str | Path, image_size: int) -> tuple[list[str], torch.Tensor]:
    """(sample ids, normalised float32 (N, 3, S, S) images) of a masked pool, as the audit
    prepares them; cases whose mask is empty at this size are left out, as in the audit."""
    ids, images = [], []
    for sample_id, image, mask in manifest_cases(pool, data_root, decode_size=image_size):
        tensor, resized_mask = prepare_case(sample_id, image, mask, image_size)
        if resized_mask.any():
            ids.append(sample_id)
            images.append(tensor)
    return ids, torch.stack(images)


def prepared_batches(cases: Iterable, image_size: int, batch_size: int, excluded: list[str]):
    """Group prepared cases into batches; empty masks go to ``excluded`` instead.

    Yields ``(sample_ids, images (B, 3, S, S), masks (B, S, S) bool)`` with B <= batch_size.
    """
    ids, images, masks = [], [], []
    for sample_id, image, mask in cases:
        image_tensor, mask_tensor = prepare_case(sample_id, image, mask, image_size)
        if not mask_tensor.any():
            excluded.append(sample_id)
            continue
        ids.append(sample_id)
        images.append(image_tensor)
        masks.append(mask_tensor)
        if len(ids) == batch_size:
            yield ids, torch.stack(images), torch.stack(masks)
            ids, images, masks = [], [], []
    if ids:
        yield ids, torch.stack(images), torch.stack(masks)


def read_cases(pool: pd.DataFrame, data_root: str | Path, sample_ids, *,
               decode_size: int | None) -> dict:
    """sample_id -> (uint8 RGB image, bool mask) for the requested pool members
    (``decode_size`` as in ``manifest_cases``)."""
    wanted = set(sample_ids)
    return {sample_id: (image, mask) for sample_id, image, mask
            in manifest_cases(pool[pool["sample_id"].isin(wanted)], data_root,
                              decode_size=decode_size)}
