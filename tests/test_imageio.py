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


# --- decoding for the model input size -----------------------------------------------------------

DECODE_MEAN_TOLERANCE = 1.5   # grey levels: mean |reduced - full| of the S x S model input (worst seen 1.05)
DECODE_P99_TOLERANCE = 30     # grey levels: 99th percentile (edges move by under one block; worst seen 24)


def _mirror_frame(tmp_path, name="frame.jpg", size=(1080, 1920)):
    """A real-sized JPEG frame and its PNG mask, dressed as the mirror layout writes them."""
    from endoexplain_core.data import mirror, synthetic

    rng = np.random.default_rng(5)
    image, mask = synthetic.render_frame(rng, 128)
    image, mask = mirror.dress_frame(rng, image, mask, [size], text=True)
    Image.fromarray(image).save(tmp_path / name, quality=92)
    Image.fromarray(mask.astype(np.uint8) * 255).save(tmp_path / "mask.png")
    return tmp_path / name, tmp_path / "mask.png"


def _mirror_sizes():
    from endoexplain_core.data import mirror

    return sorted(set(mirror.HYPERKVASIR_SIZES) | set(mirror.ETIS_SIZES)
                  | {s for sizes in mirror.POLYPGEN_SIZES.values() for s in sizes}
                  | {s for sizes in mirror.POLYPDB_SIZES.values() for s in sizes})


@pytest.mark.parametrize("size", [128, 256, 512])
def test_reduced_jpeg_decode_matches_full_decode_within_the_stated_tolerance(tmp_path, size):
    """Every published frame size of the mirror, as JPEG, at the profiles' input sizes."""
    from endoexplain_core.data.datasets import decode_resized, resize_rgb
    from endoexplain_core.data.imageio import DECODE_MARGIN

    reduced_any = False
    for frame_size in _mirror_sizes():
        path, _ = _mirror_frame(tmp_path, size=frame_size)
        reduced = read_rgb(path, decode_size=size)
        assert min(reduced.shape[:2]) >= min(DECODE_MARGIN * size, *frame_size)   # never below 2 S
        reduced_any |= reduced.shape[:2] != frame_size
        difference = np.abs(decode_resized(path, size).astype(int)
                            - resize_rgb(read_rgb(path), size).astype(int))
        assert difference.mean() < DECODE_MEAN_TOLERANCE, frame_size
        assert np.percentile(difference, 99) <= DECODE_P99_TOLERANCE, frame_size
    assert reduced_any == (size < 512)            # 1920x1080 at 512 px keeps its full size


def test_decode_size_leaves_small_jpegs_and_other_formats_untouched(tmp_path):
    path, _ = _mirror_frame(tmp_path, size=(400, 500))                  # under 4 S: no reduction
    np.testing.assert_array_equal(read_rgb(path, decode_size=128), read_rgb(path))
    png = tmp_path / "frame.png"
    Image.open(path).save(png)
    np.testing.assert_array_equal(read_rgb(png, decode_size=32), read_rgb(png))


def test_same_frame_accepts_dct_scales_only():
    from endoexplain_core.data.imageio import same_frame

    assert same_frame((1080, 1920), (1080, 1920)) and same_frame((135, 240), (1080, 1920))
    assert same_frame((121, 154), (966, 1225))                      # ceil(966/8), ceil(1225/8)
    assert not same_frame((120, 154), (966, 1225)) and not same_frame((540, 961), (1080, 1920))


def test_every_model_input_path_sees_identical_pixels(tmp_path):
    """Training and logit export (datasets.decode_resized) and the audits (manifest_cases +
    prepare_case, cohorts.iter_cases) feed a checkpoint the same tensor; the mask is checked
    against the file's full size."""
    import pandas as pd
    import torch

    from endoexplain_core.analysis import audit_inputs
    from endoexplain_core.data import cohorts
    from endoexplain_core.data.datasets import decode_resized, to_normalised_tensor

    path, mask_path = _mirror_frame(tmp_path)
    pool = pd.DataFrame({"sample_id": ["a"], "path": [path.name], "mask_path": [mask_path.name]})
    (sample_id, image, mask), = audit_inputs.manifest_cases(pool, tmp_path, decode_size=256)
    assert image.shape[:2] != mask.shape and mask.shape == (1080, 1920)
    audited, _ = audit_inputs.prepare_case(sample_id, image, mask, 256)
    torch.testing.assert_close(audited, to_normalised_tensor(decode_resized(path, 256)), rtol=0, atol=0)
    case = {"sample_id": "a", "image_path": path.name, "mask_paths": (mask_path.name,)}
    (_, external, _), = cohorts.iter_cases(pd.DataFrame([case]), tmp_path, decode_size=256)
    np.testing.assert_array_equal(external, image)
    Image.fromarray(np.zeros((1080, 1900), np.uint8)).save(mask_path)   # a mask of another size
    with pytest.raises(MaskSizeError, match="1900x1080"):
        list(audit_inputs.manifest_cases(pool, tmp_path, decode_size=256))
