"""The generator's ``downloaded`` layout (the mirror as unpacked downloads sit on disk) read by
the run's own readers: every layout and quirk of ``mirror.rearrange_as_downloaded`` is found,
paired, matched or counted, never refused."""

from __future__ import annotations

import numpy as np
import pytest

from endoexplain_core import config
from endoexplain_core.data import cohorts, hyperkvasir, imageio, mirror, synthetic

SMALL = dict(frame_size=96, n_segmented=8, n_development_polyps=2, n_audit_near_duplicates=2,
             n_development_duplicates=1, n_development_near_duplicates=1, etis_count=4,
             etis_duplicates=1, polypgen_counts=[2, 3, 3, 1, 1, 1], polypgen_empty_per_centre=1,
             polypgen_duplicates=1, polypdb_per_cell=3,
             category_counts={"cecum": 3, "bbps-2-3": 3, "dyed-lifted-polyps": 4})


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("downloaded") / "data"
    summary = synthetic.generate_cohort(root, seed=7, design=config.RolesSettings(
        synthetic_layout="downloaded", **SMALL))
    return root, summary


def test_hyperkvasir_nested_folders_and_segmented_twins_by_pixels(downloaded):
    root, summary = downloaded
    index = hyperkvasir.index_hyperkvasir(root, progress=False)
    assert index.summary["folders"]["labeled-images"] == (
        "hyper-kvasir/hyper-kvasir-labeled-images/labeled-images")
    # every segmented image was re-encoded (other bytes): all twins are found by their pixels
    assert summary["downloaded"]["segmented_reencoded"] == SMALL["n_segmented"]
    assert (index.summary["segmented_matched_by_sha256"], index.summary["segmented_matched_by_ahash"],
            index.summary["segmented_without_twin"]) == (0, SMALL["n_segmented"], [])
    # ... and on the labelled frame with the same pixels, not on its re-encoded near-duplicate
    segmented = root / index.summary["folders"]["segmented-images"] / "images"
    for row in index.images[index.images["mask_path"] != ""].itertuples():
        twin = segmented / (row.mask_path.rsplit("/", 1)[1])
        assert np.array_equal(imageio.read_rgb(root / row.path), imageio.read_rgb(twin))


def test_etis_polypgen_and_polypdb_as_downloaded(downloaded):
    root, summary = downloaded
    etis, etis_report = cohorts.read_etis(root)
    assert len(etis) == SMALL["etis_count"] and "PraNet" in etis_report.summary()["notes"]
    polypgen, polypgen_report = cohorts.read_polypgen(root)
    renamed = summary["downloaded"]["polypgen_renamed"]
    assert any(path.endswith("_.jpg") for path in renamed) and any(" " in path for path in renamed)
    assert set(renamed) <= set(polypgen["image_path"])                  # both paired with masks
    assert mirror.POLYPGEN_TOP_FOLDER in polypgen_report.summary()["notes"]
    with_lesion = sum(SMALL["polypgen_counts"]) - 6 * SMALL["polypgen_empty_per_centre"]
    assert len(polypgen) == with_lesion
    polypdb, polypdb_report = cohorts.read_polypdb(root)
    assert polypdb_report.exclusions == [(summary["downloaded"]["polypdb_without_mask"], cohorts.NO_MASK)]
    assert len(polypdb) == 8 * SMALL["polypdb_per_cell"] - 1


def test_a_jpeg_comment_changes_the_bytes_not_the_pixels(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    data = synthetic.encode_image(pixels, "JPEG")
    commented = mirror.jpeg_with_comment(data, b"note")
    (tmp_path / "a.jpg").write_bytes(data)
    (tmp_path / "b.jpg").write_bytes(commented)
    assert commented != data
    assert np.array_equal(imageio.read_rgb(tmp_path / "a.jpg"), imageio.read_rgb(tmp_path / "b.jpg"))
    with pytest.raises(ValueError, match="not a JPEG"):
        mirror.jpeg_with_comment(b"\x89PNG", b"note")
