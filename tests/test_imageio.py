"""Image and mask reading: conversions, the mask threshold and errors naming the files."""

import numpy as np
import pytest
from PIL import Image

from endoexplain_core.data.imageio import (ImageReadError, MaskSizeError, check_mask_size,
                                      read_image_and_mask, read_mask, read_rgb)


def test_read_rgb_converts_greyscale_and_rgba_to_uint8_rgb(tmp_path):
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    Image.fromarray(grey).save(tmp_path / "grey.png")
    rgba = np.zeros((3, 4, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 10
    Image.fromarray(rgba).save(tmp_path / "rgba.png")

    from_grey, from_rgba = read_rgb(tmp_path / "grey.png"), read_rgb(tmp_path / "rgba.png")
    assert from_grey.dtype == np.uint8 and from_grey.shape == (3, 4, 3)
    np.testing.assert_array_equal(from_grey[..., 1], grey)
    np.testing.assert_array_equal(from_rgba[..., 0], 200)  # alpha dropped, colour kept


def test_read_mask_thresholds_at_128_inclusive(tmp_path):
    values = np.array([[0, 127, 128, 255]], dtype=np.uint8)
    Image.fromarray(values).save(tmp_path / "mask.png")
    np.testing.assert_array_equal(read_mask(tmp_path / "mask.png"), [[False, False, True, True]])
    np.testing.assert_array_equal(read_mask(tmp_path / "mask.png", threshold=255),
                                  [[False, False, False, True]])


def test_jpeg_mask_is_binary_after_threshold(tmp_path):
    yy, xx = np.mgrid[:32, :32]
    mask = np.where((yy - 15.3) ** 2 + (xx - 16.1) ** 2 < 81, 255, 0).astype(np.uint8)
    Image.fromarray(mask).save(tmp_path / "mask.jpg", quality=75)
    raw = np.asarray(Image.open(tmp_path / "mask.jpg"))
    assert len(np.unique(raw)) > 2  # JPEG noise: the file itself is not binary
    read = read_mask(tmp_path / "mask.jpg")
    assert read.dtype == bool
    np.testing.assert_array_equal(read, mask > 0)


def test_missing_and_corrupt_files_are_named(tmp_path):
    with pytest.raises(ImageReadError, match="nothere.png.*does not exist"):
        read_rgb(tmp_path / "nothere.png")
    (tmp_path / "broken.jpg").write_bytes(b"not an image at all")
    with pytest.raises(ImageReadError, match="broken.jpg.*cannot decode"):
        read_mask(tmp_path / "broken.jpg")
    good = tmp_path / "truncated.png"
    Image.fromarray(np.full((64, 64, 3), 90, dtype=np.uint8)).save(good)
    good.write_bytes(good.read_bytes()[:60])
    with pytest.raises(ImageReadError, match="truncated.png"):
        read_rgb(good)


def test_mask_size_mismatch_names_both_files(tmp_path):
    Image.fromarray(np.zeros((10, 12, 3), dtype=np.uint8)).save(tmp_path / "frame.png")
    Image.fromarray(np.zeros((10, 10), dtype=np.uint8)).save(tmp_path / "frame_mask.png")
    with pytest.raises(MaskSizeError, match=r"frame_mask\.png is 10x10.*frame\.png is 12x10"):
        read_image_and_mask(tmp_path / "frame.png", tmp_path / "frame_mask.png")
    check_mask_size("a", (5, 6, 3), "b", (5, 6))  # equal sizes pass silently
