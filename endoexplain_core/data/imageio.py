"""Reading images and lesion masks, with errors that name the offending file.

- ``read_rgb``: uint8 (H, W, 3) RGB (greyscale, palette and RGBA converted; alpha dropped).
  With ``decode_size=S`` a JPEG is decoded at the largest DCT scale (1/2, 1/4, 1/8) that keeps
  both sides >= ``DECODE_MARGIN`` x S: ceil(W/k) x ceil(H/k) of a W x H file (``same_frame``),
  so a mask is checked against the header's full size.
- ``read_mask``: bool (H, W), True = lesion: 8-bit grey level >= ``threshold``
  (``MASK_THRESHOLD``); a mask must have its image's height and width (``MaskSizeError``).
- ``ImageReadError`` naming the file: missing or undecodable, EXIF orientation other than 1,
  above ``MAX_PIXELS`` pixels (checked before decoding), more than 8 bits per channel.
  ``MaskFormatError``: a binary mask whose foreground is below the threshold (0/1), a mask
  with transparency, a colour mask (over ``COLOUR_MASK_SHARE`` of pixels with a channel spread
  above ``COLOUR_MASK_SPREAD``). A near-black mask with many grey levels is empty, not refused.

Design: docs/data_models_runs.md, "Reading images and masks"; decoding for the input size:
docs/protocol.md, "Dataset layouts".
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

MASK_THRESHOLD = 128
DECODE_MARGIN = 2   # a reduced JPEG decode keeps both sides >= DECODE_MARGIN x the model input side
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp")   # any case
MAX_PIXELS = 64_000_000          # 8000 x 8000; the largest real frames are about 2 MP
COLOUR_MASK_SPREAD = 48          # max - min over R, G, B of a pixel (0-255 scale)
COLOUR_MASK_SHARE = 0.001        # share of pixels above that spread that makes a colour mask
EXIF_ORIENTATION = 0x0112
# Pillow modes of more than 8 bits per channel: converting them to 8 bits clips (65535 -> 255),
# so they are refused rather than silently changed.
HIGH_BIT_DEPTH_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")


# Kinds of bad file a reader records when given a ``problems`` list (``note_problem``).
UNPAIRED, UNREADABLE, WRONG_SIZE = "image without a mask", "unreadable file", "mask of another size"
MASK_FORMAT, EMPTY_MASK = "mask that reads as something else", "empty mask"


def note_problem(problems: list | None, path, error: Exception, kind: str | None = None) -> None:
    """Raise ``error``; or, with a ``problems`` list (readers that go on past bad files so that
    the preflight can list them all), append ``(path, kind, message)``. ``kind`` defaults to
    the error's: wrong size, mask format, unreadable, else unpaired."""
    if problems is None:
        raise error
    if kind is None:
        kind = (WRONG_SIZE if isinstance(error, MaskSizeError) else
                MASK_FORMAT if isinstance(error, MaskFormatError) else
                UNREADABLE if isinstance(error, ImageReadError) else UNPAIRED)
    problems.append((str(path), kind, str(error)))


class ImageReadError(OSError):
    """An image or mask file is missing, unreadable or not decodable."""


class MaskSizeError(ValueError):
    """A mask's height and width differ from those of its image."""


class MaskFormatError(ImageReadError):
    """A mask file that would read as something other than what it shows (module docstring)."""


def is_image_file(path: Path) -> bool:
    """True for a visible file with an image suffix (``IMAGE_SUFFIXES``, any case); hidden
    files (AppleDouble ``._<name>.jpg``) never."""
    path = Path(path)
    return path.is_file() and not path.name.startswith(".") and path.suffix.lower() in IMAGE_SUFFIXES


@contextlib.contextmanager
def _opened(path: Path, check=None):
    """``Image.open(path)`` after the header checks (exists, a known format, at most
    ``MAX_PIXELS`` pixels, ``check(image)``); decoding errors in the block name ``path``."""
    if not path.is_file():
        raise ImageReadError(f"{path}: file does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                if width * height > MAX_PIXELS:
                    raise ImageReadError(f"{path}: {width}x{height} pixels, above the limit of "
                                         f"{MAX_PIXELS:,} (a decompression bomb, or far larger "
                                         f"than an endoscopy frame); not decoded")
                if check is not None:
                    check(image)
                yield image
    except ImageReadError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ImageReadError(f"{path}: refused as a decompression bomb ({error})") from error
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise ImageReadError(f"{path}: cannot decode image file ({error})") from error


def _open_decoded(path: Path, check=None, decode_size: int | None = None) -> Image.Image:
    """The decoded image at ``path`` (8 bits per channel), after ``_opened``'s checks; a JPEG
    at the DCT scale that keeps both sides >= ``decode_size`` when it is given."""
    with _opened(path, check) as image:
        if decode_size is not None and image.format == "JPEG":
            side = DECODE_MARGIN * int(decode_size)
            image.draft("RGB", (side, side))
        image.load()  # decode now so that truncated files fail here, not later
        if image.mode in HIGH_BIT_DEPTH_MODES:
            raise ImageReadError(f"{path}: {image.mode} image with more than 8 bits per "
                                 f"channel; convert it to 8-bit first (values would be clipped)")
        return image.copy()


def _check_orientation(path: Path):
    def check(image: Image.Image) -> None:
        orientation = image.getexif().get(EXIF_ORIENTATION, 1)
        if orientation != 1:
            raise ImageReadError(
                f"{path}: EXIF orientation {orientation} (viewers rotate this image, its pixels "
                f"are not rotated); apply it to the pixels (PIL.ImageOps.exif_transpose) and "
                f"turn its mask the same way, or remove the tag")
    return check


def read_rgb(path: str | Path, decode_size: int | None = None) -> np.ndarray:
    """Read an image file as uint8 (H, W, 3) RGB; with ``decode_size`` (the side the caller
    will resize to) a large JPEG is decoded at a reduced scale (module docstring).

    Raises ``ImageReadError`` naming ``path`` when the file is missing, cannot be decoded,
    carries an EXIF orientation other than 1, or is above ``MAX_PIXELS``.
    """
    path = Path(path)
    return np.asarray(_open_decoded(path, _check_orientation(path), decode_size).convert("RGB"),
                      dtype=np.uint8).copy()


def same_frame(image_shape: tuple[int, ...], full_shape: tuple[int, ...]) -> bool:
    """True when an (H, W) image is the frame of ``full_shape`` decoded at a DCT scale 1/k
    (k in 1, 2, 4, 8): its sides are ceil(full side / k)."""
    height, width = image_shape[:2]
    full_height, full_width = full_shape[:2]
    return any(height == -(-full_height // k) and width == -(-full_width // k) for k in (1, 2, 4, 8))


def check_image_header(path: str | Path) -> tuple[int, int]:
    """(width, height) of an image file from its header, after the checks ``read_rgb`` makes
    before decoding (exists, a known format, pixel limit, EXIF orientation); nothing decoded."""
    path = Path(path)
    with _opened(path, _check_orientation(path)) as image:
        return image.size


def mask_levels(path: str | Path, image: Image.Image, threshold: int = MASK_THRESHOLD) -> np.ndarray:
    """uint8 (H, W) grey levels of a decoded mask file, after the refusals of the module
    docstring (``MaskFormatError`` naming ``path``)."""
    if "A" in image.getbands() or "transparency" in image.info:
        alpha = np.asarray(image.convert("RGBA"), dtype=np.uint8)[..., 3]
        if alpha.min() < 255:
            raise MaskFormatError(f"{path}: the mask uses transparency (alpha below 255 at "
                                  f"{np.mean(alpha < 255):.0%} of pixels); save the lesion as white "
                                  f"(255) on black (0) without an alpha channel")
    if image.mode not in ("1", "L", "LA"):
        rgb = np.asarray(image.convert("RGB"), dtype=np.int16)
        spread = rgb.max(axis=2) - rgb.min(axis=2)
        share = float(np.mean(spread > COLOUR_MASK_SPREAD))
        if share > COLOUR_MASK_SHARE:
            raise MaskFormatError(f"{path}: a colour mask ({share:.0%} of pixels are coloured, not "
                                  f"grey); save the lesion as white (255) on black (0) greyscale")
    grey = np.asarray(image.convert("L"), dtype=np.uint8)
    values = np.unique(grey)
    if len(values) == 2 and values[0] == 0 and values[1] < threshold:
        raise MaskFormatError(f"{path}: a binary mask with values 0 and {values[1]} (every pixel "
                              f"would be background at the threshold {threshold}); save the "
                              f"lesion as 255")
    return grey


def read_mask(path: str | Path, threshold: int = MASK_THRESHOLD) -> np.ndarray:
    """Read a lesion mask as bool (H, W): greyscale value >= ``threshold`` is lesion.

    ``threshold`` is on the 0-255 scale. Raises ``ImageReadError`` naming ``path`` when the
    file is missing or cannot be decoded, ``MaskFormatError`` for the masks the module
    docstring refuses (0/1, transparency, colour).
    """
    if not 0 < threshold <= 255:
        raise ValueError(f"mask threshold must be in 1..255, got {threshold}")
    path = Path(path)
    return mask_levels(path, _open_decoded(path), threshold) >= threshold


def check_mask_size(image_path: str | Path, image_shape: tuple[int, ...],
                    mask_path: str | Path, mask_shape: tuple[int, ...]) -> None:
    """Raise ``MaskSizeError`` naming both files if the (H, W) of image and mask differ."""
    if tuple(image_shape[:2]) != tuple(mask_shape[:2]):
        raise MaskSizeError(
            f"mask {mask_path} is {mask_shape[1]}x{mask_shape[0]} (WxH) but its image "
            f"{image_path} is {image_shape[1]}x{image_shape[0]}")


def read_image_and_mask(image_path: str | Path, mask_path: str | Path,
                        threshold: int = MASK_THRESHOLD, *, decode_size: int | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Read an image (uint8 h x w x 3) and its mask (bool H x W), checking that the mask has
    the image file's size. Without ``decode_size`` h, w = H, W; with it the image may be the
    reduced decode of the module docstring (``same_frame``)."""
    image = read_rgb(image_path, decode_size)
    mask = read_mask(mask_path, threshold)
    full_shape = image.shape if decode_size is None else check_image_header(image_path)[::-1]
    check_mask_size(image_path, full_shape, mask_path, mask.shape)
    return image, mask
