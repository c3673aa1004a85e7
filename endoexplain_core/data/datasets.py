"""Manifest datasets: the images of given study roles, resized and ImageNet-normalised.

Every stage that feeds an image to a classifier reads it with ``decode_resized``
(``imageio.read_rgb(path, decode_size=S)``, then ``resize_rgb``: uint8 (S, S, 3)) and
``to_normalised_tensor`` (float32 (3, S, S), ``(x / 255 - IMAGENET_MEAN) / IMAGENET_STD``, RGB).
Training augmentation draws from ``(seed, epoch, row index)`` only.

Design: docs/data_models_runs.md, "Model inputs".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

# albumentations asks pypi.org for a newer version on import unless this is set; the package
# never uses the network at runtime (tests/test_end_to_end.py::test_no_process_of_the_runs_reached_the_network).
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
import albumentations as A  # noqa: E402
import cv2
import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from endoexplain_core import files
from endoexplain_core.data import roles
from endoexplain_core.data.imageio import read_rgb

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NORMALISATION = {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}



class ImageDecodeError(RuntimeError):
    """An image listed in the manifest could not be read or decoded."""


def resize_rgb(rgb: np.ndarray, image_size: int) -> np.ndarray:
    """Resize a uint8 (H, W, 3) RGB image to uint8 (image_size, image_size, 3).

    Area interpolation when shrinking (no aliasing), bilinear when enlarging.
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected a uint8 (H, W, 3) RGB array, got {rgb.dtype} {rgb.shape}")
    height, width = rgb.shape[:2]
    shrinking = height >= image_size and width >= image_size
    interpolation = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    return cv2.resize(rgb, (image_size, image_size), interpolation=interpolation)


def to_normalised_tensor(rgb: np.ndarray) -> torch.Tensor:
    """uint8 (S, S, 3) RGB -> float32 (3, S, S) tensor, ImageNet mean/std normalised."""
    scaled = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float() / 255.0
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (scaled - mean) / std


def denormalised_rgb(image_tensor: torch.Tensor) -> np.ndarray:
    """Normalised float (3, S, S) -> float (S, S, 3) RGB in [0, 1]: ``to_normalised_tensor``
    undone (ImageNet mean/std), for drawing a model input."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (image_tensor.cpu() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()


def training_augmentation() -> A.Compose:
    """Flips and mild brightness/contrast (each transform applied with probability 0.5)."""
    return A.Compose([
        A.HorizontalFlip(p=0.5),
        A.VerticalFlip(p=0.5),
        A.RandomBrightnessContrast(brightness_limit=0.1, contrast_limit=0.1, p=0.5),
    ])


def load_manifest(manifest_path: str | Path) -> pd.DataFrame:
    """Read ``manifest.csv`` with ``roles.read_manifest`` after checking it against its digest
    (``manifest.sha256`` beside it) and check its roles. ``FileNotFoundError`` without it;
    ``roles.ManifestVerificationError`` naming the file without its digest or when edited
    after it; ValueError for an unknown role. (``roles.verify_manifest`` also checks files.)
    """
    manifest_path = Path(manifest_path)
    if not manifest_path.is_file():
        raise FileNotFoundError(f"manifest {manifest_path} does not exist: run notebook 00_roles first")
    digest_path = manifest_path.with_name(roles.DIGEST_FILE)
    if not digest_path.is_file():
        raise roles.ManifestVerificationError(
            f"{manifest_path}: no digest file {digest_path.name} beside it (00_roles writes both); "
            f"rerun 00_roles")
    if files.sha256_file(manifest_path) != roles.read_digest(digest_path):
        raise roles.ManifestVerificationError(
            f"{manifest_path} does not match its digest {digest_path} (changed after 00_roles "
            f"wrote it); rerun 00_roles (./run_all.sh --force --only 00_roles)")
    manifest = roles.read_manifest(manifest_path)
    unknown_roles = sorted(set(manifest["role"]) - set(roles.ROLES))
    if unknown_roles:
        raise ValueError(f"manifest {manifest_path} has unknown roles {unknown_roles}")
    return manifest


def rows_of_roles(manifest: pd.DataFrame, wanted: Sequence[str]) -> pd.DataFrame:
    """Manifest rows whose role is in ``wanted``, in manifest order, with a fresh 0..n-1 index."""
    unknown = sorted(set(wanted) - set(roles.ROLES))
    if unknown:
        raise ValueError(f"unknown roles {unknown}; known roles are {list(roles.ROLES)}")
    return manifest[manifest["role"].isin(wanted)].reset_index(drop=True)


class ImageCache:
    """Decoded, resized uint8 images kept in memory, keyed by (absolute path, image size);
    one cache per process (DataLoader workers get a copy)."""

    def __init__(self) -> None:
        self._images: dict[tuple[str, int], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._images)

    def get(self, path: Path, image_size: int) -> np.ndarray:
        """The resized uint8 (S, S, 3) image at ``path``, decoded on first use."""
        key = (str(path), image_size)
        if key not in self._images:
            self._images[key] = decode_resized(path, image_size)
        return self._images[key]


def decode_resized(path: Path, image_size: int) -> np.ndarray:
    """Read ``path`` as RGB decoded for ``image_size`` and resize it; any failure raises
    ``ImageDecodeError`` naming it."""
    try:
        rgb = read_rgb(path, decode_size=image_size)
    except Exception as error:  # any reader failure becomes one error type naming the file
        raise ImageDecodeError(f"cannot decode image {path}: {error}") from error
    return resize_rgb(rgb, image_size)


class ManifestDataset(Dataset):
    """Manifest rows as (image float32 (3, S, S) normalised, target int64 (1 = polyp family),
    index int64 position in ``rows``) triples.

    ``rows``: manifest rows, paths relative to ``data_root``; ``image_size``: S in pixels;
    ``targets``: optional int array replacing ``rows.target`` (the shuffled-label control);
    ``augment_seed``: None for evaluation images, an int for the training augmentation drawn
    from ``(augment_seed, epoch, index)`` (``set_epoch``); ``cache``: optional ``ImageCache``.
    """

    def __init__(self, rows: pd.DataFrame, data_root: str | Path, image_size: int,
                 targets: np.ndarray | None = None, augment_seed: int | None = None,
                 cache: ImageCache | None = None) -> None:
        self.rows = rows.reset_index(drop=True)
        self.data_root = Path(data_root)
        self.image_size = int(image_size)
        labels = self.rows["target"].to_numpy() if targets is None else np.asarray(targets)
        if len(labels) != len(self.rows):
            raise ValueError(f"{len(labels)} targets for {len(self.rows)} rows")
        self.targets = labels.astype(np.int64)
        self.augment_seed = augment_seed
        self.augmentation = training_augmentation() if augment_seed is not None else None
        self.cache = cache
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentation stream of ``epoch`` (call before iterating an epoch)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.rows)

    def resized_image(self, index: int) -> np.ndarray:
        """uint8 (S, S, 3) image of row ``index`` before augmentation and normalisation."""
        path = self.data_root / self.rows.at[index, "path"]
        if self.cache is not None:
            return self.cache.get(path, self.image_size)
        return decode_resized(path, self.image_size)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        rgb = self.resized_image(index)
        if self.augmentation is not None:
            # A private stream per (seed, epoch, image): reproducible under any worker count.
            stream = np.random.SeedSequence([self.augment_seed, self.epoch, index])
            self.augmentation.set_random_seed(int(stream.generate_state(1)[0]))
            rgb = self.augmentation(image=rgb)["image"]
        return to_normalised_tensor(rgb), int(self.targets[index]), index
