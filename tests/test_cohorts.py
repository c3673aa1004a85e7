"""External cohort adapters on tiny fixtures written with the datasets' real folder names."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import imagehash
import numpy as np
import pytest
from PIL import Image

from endoexplain_core.data import cohorts, imageio

HEIGHT, WIDTH = 24, 32


def write_frame(path: Path, seed: int, size=(HEIGHT, WIDTH)) -> None:
    """A noise RGB frame; distinct seeds give distinct bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(*size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def write_mask(path: Path, box, size=(HEIGHT, WIDTH)) -> np.ndarray:
    """A white rectangle (rows r0:r1, cols c0:c1) on black; ``box=None`` writes an empty mask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mask = np.zeros(size, dtype=bool)
    if box is not None:
        r0, r1, c0, c1 = box
        mask[r0:r1, c0:c1] = True
    Image.fromarray(mask.astype(np.uint8) * 255).save(path)
    return mask


def make_etis(data_root: Path, mask_folder: str = "Ground Truth") -> None:
    root = data_root / "ETIS-LaribPolypDB"
    for n, seed in ((1, 11), (2, 12), (10, 13)):
        write_frame(root / "ETIS-LaribPolypDB" / f"{n}.tif", seed)
    # Frame 3 is a byte copy of frame 1 with a different mask: one case, union of masks.
    shutil.copyfile(root / "ETIS-LaribPolypDB" / "1.tif", root / "ETIS-LaribPolypDB" / "3.tif")
    write_mask(root / mask_folder / "p1.tif", (2, 10, 2, 10))     # 64 px
    write_mask(root / mask_folder / "p3.tif", (6, 14, 6, 14))     # 64 px, 16 shared with p1
    write_mask(root / mask_folder / "p2.tif", (0, 5, 0, 4))       # 20 px
    write_mask(root / mask_folder / "p10.tif", (10, 20, 10, 20))  # 100 px


def test_etis_collapses_byte_identical_frames_with_mask_union(tmp_path):
    make_etis(tmp_path)
    cases, report = cohorts.read_etis(tmp_path)
    assert list(cases["sample_id"]) == ["1", "2", "10"]          # natural order
    assert report.rows_read == 4 and report.duplicates_collapsed == 1
    assert report.summary()["cases"] == 3
    first = cases.set_index("sample_id").loc["1"]
    assert first["frame_paths"] == ("ETIS-LaribPolypDB/ETIS-LaribPolypDB/1.tif",
                                    "ETIS-LaribPolypDB/ETIS-LaribPolypDB/3.tif")
    assert first["mask_paths"] == ("ETIS-LaribPolypDB/Ground Truth/p1.tif",
                                   "ETIS-LaribPolypDB/Ground Truth/p3.tif")
    assert first["lesion_pixels"] == 64 + 64 - 16
    image, mask = cohorts.load_case(first, tmp_path)
    assert image.shape == (HEIGHT, WIDTH, 3) and image.dtype == np.uint8
    assert mask.sum() == 112 and mask[2, 2] and mask[13, 13] and not mask[2, 13]
    assert list(cases["lesion_pixels"]) == [112, 20, 100]


def test_hashes_match_hashlib_and_imagehash(tmp_path):
    make_etis(tmp_path)
    cases, _ = cohorts.read_etis(tmp_path)
    path = tmp_path / "ETIS-LaribPolypDB" / "ETIS-LaribPolypDB" / "2.tif"
    row = cases.set_index("sample_id").loc["2"]
    assert row["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert row["ahash"] == str(imagehash.average_hash(Image.open(path), hash_size=16))
    assert len(row["ahash"]) == 64 and (row["height"], row["width"]) == (HEIGHT, WIDTH)


def test_etis_groundtruth_variant_and_ambiguous_folders(tmp_path):
    make_etis(tmp_path, mask_folder="GroundTruth")
    cases, report = cohorts.read_etis(tmp_path)
    assert len(cases) == 3 and "GroundTruth" in report.summary()["notes"]
    shutil.copytree(tmp_path / "ETIS-LaribPolypDB" / "GroundTruth",
                    tmp_path / "ETIS-LaribPolypDB" / "Ground Truth")
    with pytest.raises(cohorts.CohortError, match="several mask folders"):
        cohorts.read_etis(tmp_path)


def test_missing_masks_name_the_image(tmp_path):
    make_etis(tmp_path)
    for name in ("p2.tif", "p10.tif"):
        (tmp_path / "ETIS-LaribPolypDB" / "Ground Truth" / name).unlink()
    # 2 of 4 frames without a mask: more than one and more than MAX_UNPAIRED_SHARE
    with pytest.raises(cohorts.CohortError, match=r"2\.tif: no mask \(2 of 4 frames"):
        cohorts.read_etis(tmp_path)


def test_one_frame_without_a_mask_in_a_large_cohort_is_excluded_and_counted(tmp_path):
    """The real PolypDB ships one frame without a mask: excluded with its path, as empty masks."""
    folder = tmp_path / "PolypDB" / "PolypDB_center_wise" / "Simula" / "LCI"
    for index in range(25):
        write_frame(folder / "images" / f"{index}.jpg", 200 + index)
        if index != 7:
            write_mask(folder / "masks" / f"{index}.png", (1, 5, 1, 5))
    problems = []
    cases, report = cohorts.read_polypdb(tmp_path, problems)
    assert problems == [] and len(cases) == 24 and report.rows_read == 25
    assert report.exclusions == [("PolypDB/PolypDB_center_wise/Simula/LCI/images/7.jpg", cohorts.NO_MASK)]
    assert report.summary()["cases"] == 24 and f"{cohorts.NO_MASK}: 1" in report.summary()["exclusion_reasons"]
    assert len(cohorts.read_polypdb(tmp_path)[0]) == 24                     # the run reads the same
    (folder / "masks" / "3.png").unlink()                                  # 2 of 25: more than 5%
    problems = []
    cases, report = cohorts.read_polypdb(tmp_path, problems)
    assert sorted(Path(path).name for path, kind, _ in problems if kind == cohorts.UNPAIRED) == [
        "3.jpg", "7.jpg"]
    assert report.excluded_count(cohorts.NO_MASK) == 0 and len(cases) == 23


def test_etis_in_pranets_images_and_masks_layout(tmp_path):
    root = tmp_path / "ETIS-LaribPolypDB"
    for n in (1, 2, 10):
        write_frame(root / "images" / f"{n}.png", 60 + n)
        write_mask(root / "masks" / f"{n}.png", (1, 6, 1, 6))
    cases, report = cohorts.read_etis(tmp_path)
    assert list(cases["sample_id"]) == ["1", "2", "10"] and set(cases["lesion_pixels"]) == {25}
    assert cases.iloc[0]["mask_paths"] == ("ETIS-LaribPolypDB/masks/1.png",)
    assert "PraNet" in report.summary()["notes"]
    make_etis(tmp_path)                                   # both layouts: one would be read twice
    with pytest.raises(cohorts.CohortError, match="two layouts at once"):
        cohorts.read_etis(tmp_path)


def test_polypgen_published_top_folder_trailing_underscore_and_spaces(tmp_path):
    """As the v3 zip extracts: PolypGen/PolypGen2021_MultiCenterData_v3/data_C<k>; the published
    frame 'C3_EndoCV2021_00489_.jpg' has its mask at 'C3_EndoCV2021_00489_mask.jpg'."""
    centre = tmp_path / "PolypGen" / "PolypGen2021_MultiCenterData_v3" / "data_C3"
    for stem, seed in (("C3_EndoCV2021_00488", 71), ("C3_EndoCV2021_00489_", 72), ("C3 frame 5", 73)):
        write_frame(centre / "images_C3" / f"{stem}.jpg", seed)
    write_mask(centre / "masks_C3" / "C3_EndoCV2021_00488_mask.jpg", (2, 8, 2, 8))
    write_mask(centre / "masks_C3" / "C3_EndoCV2021_00489_mask.jpg", (2, 8, 2, 8))
    write_mask(centre / "masks_C3" / "C3 frame 5_mask.jpg", (2, 8, 2, 8))
    cases, report = cohorts.read_polypgen(tmp_path)
    assert list(cases["sample_id"]) == ["C3/C3 frame 5", "C3/C3_EndoCV2021_00488",
                                        "C3/C3_EndoCV2021_00489_"]
    assert cases.set_index("sample_id").loc["C3/C3_EndoCV2021_00489_", "mask_paths"] == (
        "PolypGen/PolypGen2021_MultiCenterData_v3/data_C3/masks_C3/C3_EndoCV2021_00489_mask.jpg",)
    assert "PolypGen2021_MultiCenterData_v3" in report.summary()["notes"]
    assert cohorts.polypgen_mask_stems("a_") == ("a__mask", "a_mask")
    (tmp_path / "PolypGen" / "copy" / "data_C1").mkdir(parents=True)
    with pytest.raises(cohorts.CohortError, match="several sub-folders"):
        cohorts.read_polypgen(tmp_path)


def test_mask_of_another_size_names_both_files(tmp_path):
    make_etis(tmp_path)
    write_mask(tmp_path / "ETIS-LaribPolypDB" / "Ground Truth" / "p10.tif", (0, 4, 0, 4),
               size=(HEIGHT + 2, WIDTH))
    with pytest.raises(imageio.MaskSizeError, match=r"p10\.tif.*10\.tif"):
        cohorts.read_etis(tmp_path)


def test_with_a_problems_list_every_bad_frame_is_recorded_and_the_rest_are_read(tmp_path):
    make_etis(tmp_path)
    masks = tmp_path / "ETIS-LaribPolypDB" / "Ground Truth"
    (masks / "p2.tif").unlink()                                            # unpaired
    write_frame(tmp_path / "ETIS-LaribPolypDB" / "ETIS-LaribPolypDB" / "12.tif", 14)  # unpaired
    write_mask(masks / "p10.tif", (0, 4, 0, 4), size=(HEIGHT + 2, WIDTH))  # wrong size
    (tmp_path / "ETIS-LaribPolypDB" / "ETIS-LaribPolypDB" / "11.tif").write_bytes(b"broken")
    write_mask(masks / "p11.tif", (0, 4, 0, 4))                            # its frame is unreadable
    problems = []
    cases, report = cohorts.read_etis(tmp_path, problems)
    kinds = {Path(path).name: kind for path, kind, _ in problems}
    assert kinds == {"2.tif": cohorts.UNPAIRED, "12.tif": cohorts.UNPAIRED,
                     "10.tif": cohorts.WRONG_SIZE, "11.tif": cohorts.UNREADABLE}
    assert list(cases["sample_id"]) == ["1"] and report.rows_read == 2     # frames 1 and 3, collapsed
    with pytest.raises(cohorts.CohortError):                               # without a list: the first one
        cohorts.read_etis(tmp_path)


def test_unknown_layout_and_missing_cohort(tmp_path):
    with pytest.raises(cohorts.CohortError, match="PolypGen folder not found"):
        cohorts.read_polypgen(tmp_path)
    (tmp_path / "PolypGen" / "images").mkdir(parents=True)
    with pytest.raises(cohorts.CohortError, match=r"unknown layout.*data_C1.*\[images\]"):
        cohorts.read_polypgen(tmp_path)
    (tmp_path / "ETIS-LaribPolypDB" / "Ground Truth").mkdir(parents=True)
    with pytest.raises(cohorts.CohortError, match="frame folder 'ETIS-LaribPolypDB'.*PraNet"):
        cohorts.read_etis(tmp_path)
    with pytest.raises(cohorts.CohortError, match="unknown cohort"):
        cohorts.read_cohort("hyperkvasir", tmp_path)


def make_polypgen(data_root: Path) -> None:
    root = data_root / "PolypGen"
    for centre, seeds in (("C1", (21, 22)), ("C2", (23, 24, 25))):
        for index, seed in enumerate(seeds):
            stem = f"{centre}_frame{index}"
            write_frame(root / f"data_{centre}" / f"images_{centre}" / f"{stem}.jpg", seed)
            box = None if (centre, index) == ("C2", 1) else (3, 9, 3, 9)
            write_mask(root / f"data_{centre}" / f"masks_{centre}" / f"{stem}_mask.jpg", box)
    (root / "sequenceData").mkdir()


def test_polypgen_centres_and_empty_masks(tmp_path):
    make_polypgen(tmp_path)
    cases, report = cohorts.read_polypgen(tmp_path)
    assert report.rows_read == 5
    assert report.excluded_count(cohorts.EMPTY_MASK) == 1
    assert report.exclusions[0][0] == "PolypGen/data_C2/images_C2/C2_frame1.jpg"
    assert list(cases["sample_id"]) == ["C1/C1_frame0", "C1/C1_frame1", "C2/C2_frame0",
                                        "C2/C2_frame2"]
    assert cases.groupby("centre").size().to_dict() == {"C1": 2, "C2": 2}
    assert "sequenceData" in report.summary()["notes"]
    assert report.summary()["cases"] == 4
    # JPEG masks: compression noise is thresholded away, the square stays 6x6.
    assert set(cases["lesion_pixels"]) == {36}


def test_polypgen_missing_mask_folder(tmp_path):
    make_polypgen(tmp_path)
    shutil.rmtree(tmp_path / "PolypGen" / "data_C2" / "masks_C2")
    with pytest.raises(cohorts.CohortError, match="data_C2: unknown layout: missing folder 'masks_C2'"):
        cohorts.read_polypgen(tmp_path)


def make_polypdb(data_root: Path) -> None:
    tree = data_root / "PolypDB" / "PolypDB_center_wise"
    seed = 30
    for centre in ("BKAI", "Simula"):
        for modality in ("NBI", "WLI"):
            seed += 1
            folder = tree / centre / modality
            write_frame(folder / "images" / "1.png", seed)
            write_mask(folder / "masks" / "1.png", (1, 5, 1, 5))
    # The modality-wise tree repeats the same images and must be ignored.
    write_frame(data_root / "PolypDB" / "PolypDB_modality_wise" / "NBI" / "images" / "1.png", 31)


def test_polypdb_centre_wise_tree_only(tmp_path):
    make_polypdb(tmp_path)
    cases, report = cohorts.read_polypdb(tmp_path)
    assert report.rows_read == 4 and len(cases) == 4
    assert list(zip(cases["centre"], cases["modality"])) == [
        ("BKAI", "NBI"), ("BKAI", "WLI"), ("Simula", "NBI"), ("Simula", "WLI")]
    assert list(cases["sample_id"])[0] == "BKAI/NBI/1"
    assert "PolypDB_modality_wise" in report.summary()["notes"]
    shutil.rmtree(tmp_path / "PolypDB" / "PolypDB_center_wise")
    with pytest.raises(cohorts.CohortError, match="centre-wise tree 'PolypDB_center_wise' is missing"):
        cohorts.read_polypdb(tmp_path)


def test_kvasir_seg_and_cvc_clinicdb(tmp_path):
    for index in range(2):
        write_frame(tmp_path / "Kvasir-SEG" / "images" / f"cju{index}.jpg", 40 + index)
        write_mask(tmp_path / "Kvasir-SEG" / "masks" / f"cju{index}.jpg", (0, 6, 0, 6))
        write_frame(tmp_path / "CVC-ClinicDB" / "Original" / f"{index + 1}.png", 50 + index)
        write_mask(tmp_path / "CVC-ClinicDB" / "Ground Truth" / f"{index + 1}.png", (0, 3, 0, 3))
    kvasir, _ = cohorts.read_cohort("kvasir_seg", tmp_path)
    cvc, cvc_report = cohorts.read_cohort("cvc_clinicdb", tmp_path)
    assert list(kvasir["sample_id"]) == ["cju0", "cju1"]
    assert list(cvc["mask_paths"]) == [("CVC-ClinicDB/Ground Truth/1.png",),
                                       ("CVC-ClinicDB/Ground Truth/2.png",)]
    assert list(cvc["lesion_pixels"]) == [9, 9] and cvc_report.summary()["cases"] == 2


def test_iter_cases_streams_images_and_masks(tmp_path):
    make_polypdb(tmp_path)
    cases, _ = cohorts.read_polypdb(tmp_path)
    streamed = list(cohorts.iter_cases(cases, tmp_path, decode_size=None))
    assert [s[0] for s in streamed] == list(cases["sample_id"])
    sample_id, image, mask = streamed[-1]
    expected = imageio.read_rgb(tmp_path / "PolypDB" / "PolypDB_center_wise" / "Simula" / "WLI"
                                / "images" / "1.png")
    assert np.array_equal(image, expected) and mask.dtype == bool and mask.sum() == 16


def test_undecodable_frame_is_named(tmp_path):
    make_etis(tmp_path)
    (tmp_path / "ETIS-LaribPolypDB" / "ETIS-LaribPolypDB" / "2.tif").write_bytes(b"not a tiff")
    with pytest.raises(imageio.ImageReadError, match=r"2\.tif: cannot decode"):
        cohorts.read_etis(tmp_path)
