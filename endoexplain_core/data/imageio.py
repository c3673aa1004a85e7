"""Reading images and lesion masks, with errors that name the offending file.

Conventions used by every stage:

- An image is a uint8 array of shape (H, W, 3) in RGB order (greyscale, palette and RGBA
  files are converted to RGB; alpha is dropped).
- A mask is a bool array of shape (H, W), True = lesion. Masks are stored as greyscale or RGB
  files with white = lesion; they are converted to 8-bit greyscale and a pixel is lesion when
  its value is >= ``threshold`` (default 128). The threshold is needed because JPEG masks
  (HyperKvasir, PolypGen) carry compression noise around the edge and are never exactly 0/255.
- A mask belongs to one image and must have the same height and width.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

MASK_THRESHOLD = 128
# Pillow modes of more than 8 bits per channel: converting them to 8 bits clips (65535 -> 255),
# so they are refused rather than silently changed.
HIGH_BIT_DEPTH_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")


class ImageReadError(OSError):
    """An image or mask file is missing, unreadable or not decodable."""


class MaskSizeError(ValueError):
    """A mask's height and width differ from those of its image."""


def _open_decoded(path: Path, mode: str) -> np.ndarray:
    """Decode ``path`` fully into a numpy array in Pillow ``mode`` ("RGB" or "L")."""
    if not path.is_file():
        raise ImageReadError(f"{path}: file does not exist")
    try:
        with Image.open(path) as image:
            image.load()  # decode now so that truncated files fail here, not later
            if image.mode in HIGH_BIT_DEPTH_MODES:
                raise ImageReadError(f"{path}: {image.mode} image with more than 8 bits per "
                                     f"channel; convert it to 8-bit first (values would be clipped)")
            return np.asarray(image.convert(mode), dtype=np.uint8).copy()
    except ImageReadError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise ImageReadError(f"{path}: cannot decode image file ({error})") from error


def read_rgb(path: str | Path) -> np.ndarray:
    """Read an image file as uint8 (H, W, 3) RGB.

    Raises ``ImageReadError`` naming ``path`` when the file is missing or cannot be decoded.
    """
    return _open_decoded(Path(path), "RGB")


def read_mask(path: str | Path, threshold: int = MASK_THRESHOLD) -> np.ndarray:
    """Read a lesion mask as bool (H, W): greyscale value >= ``threshold`` is lesion.

    ``threshold`` is on the 0-255 scale. Raises ``ImageReadError`` naming ``path`` when the
    file is missing or cannot be decoded.
    """
    if not 0 < threshold <= 255:
        raise ValueError(f"mask threshold must be in 1..255, got {threshold}")
    return _open_decoded(Path(path), "L") >= threshold


def check_mask_size(image_path: str | Path, image_shape: tuple[int, ...],
                    mask_path: str | Path, mask_shape: tuple[int, ...]) -> None:
    """Raise ``MaskSizeError`` naming both files if the (H, W) of image and mask differ."""
    if tuple(image_shape[:2]) != tuple(mask_shape[:2]):
        raise MaskSizeError(
            f"mask {mask_path} is {mask_shape[1]}x{mask_shape[0]} (WxH) but its image "
            f"{image_path} is {image_shape[1]}x{image_shape[0]}")


def read_image_and_mask(image_path: str | Path, mask_path: str | Path,
                        threshold: int = MASK_THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """Read an image (uint8 H x W x 3) and its mask (bool H x W), checking the sizes agree."""
    image = read_rgb(image_path)
    mask = read_mask(mask_path, threshold)
    check_mask_size(image_path, image.shape, mask_path, mask.shape)
    return image, mask
