"""The HyperKvasir adapter on a tiny tree with the real folder and category names."""

import shutil

import numpy as np
import pytest
from PIL import Image

from endoexplain_core.data.hyperkvasir import HyperKvasirError, canonical_category, index_hyperkvasir
from endoexplain_core.data.imageio import ImageReadError, MaskSizeError

LOWER = "hyper-kvasir/labeled-images/lower-gi-tract"


def _save(path, seed, size=(24, 24)):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG" if path.suffix.lower() == ".jpg" else "PNG")


def _mask(path, size=(24, 24), lesion=True):
    path.parent.mkdir(parents=True, exist_ok=True)
    mask = np.zeros(size, dtype=np.uint8)
    if lesion:
        mask[5:15, 6:16] = 255
    Image.fromarray(mask).save(path, format="JPEG")


@pytest.fixture
def tree(tmp_path):
    """Real names: 2 polyps (one segmented), 1 dyed-lifted, negatives incl. an upper-case
    extension, an upper-GI image, a stray text file."""
    root = tmp_path / "data"
    files = {
        "pathological-findings/polyps/p1.jpg": 1,
        "pathological-findings/polyps/p2.jpg": 2,
        "pathological-findings/ulcerative-colitis-grade-2-3/u1.jpg": 3,
        "therapeutic-interventions/dyed-lifted-polyps/d1.jpg": 4,
        "therapeutic-interventions/dyed-resection-margins/r1.jpg": 5,
        "anatomical-landmarks/cecum/c1.JPG": 6,
        "quality-of-mucosal-views/bbps-2-3/b1.png": 7,
    }
    for relative, seed in files.items():
        _save(root / LOWER / relative, seed)
    (root / LOWER / "anatomical-landmarks/cecum/notes.txt").write_text("not an image")
    _save(root / "hyper-kvasir/labeled-images/upper-gi-tract/anatomical-landmarks/pylorus/x.jpg", 8)
    segmented = root / "hyper-kvasir/segmented-images"
    segmented.joinpath("images").mkdir(parents=True)
    shutil.copyfile(root / LOWER / "pathological-findings/polyps/p1.jpg",
                    segmented / "images/cju0seg.jpg")
    _mask(segmented / "masks/cju0seg.jpg")
    return root


def test_index_reads_lower_gi_with_targets_and_masks(tree):
    index = index_hyperkvasir(tree, progress=False)
    images = index.images.set_index("sample_id")
    assert sorted(images.index) == ["b1", "c1", "d1", "p1", "p2", "r1", "u1"]
    assert images["target"].to_dict() == {"b1": 0, "c1": 0, "d1": 1, "p1": 1, "p2": 1, "r1": 0,
                                          "u1": 0}
    assert images.loc["u1", "source"] == "ulcerative-colitis-grade-2-3"
    assert images.loc["d1", "group"] == "therapeutic-interventions"
    assert images.loc["c1", "path"] == f"{LOWER}/anatomical-landmarks/cecum/c1.JPG"
    assert images.loc["p1", "mask_path"] == "hyper-kvasir/segmented-images/masks/cju0seg.jpg"
    assert (images.drop(index="p1")["mask_path"] == "").all()
    assert (images["width"] == 24).all() and images["ahash"].str.len().eq(64).all()
    assert index.summary["upper_gi_excluded"] == 1
    assert index.summary["ignored_files"] == [f"{LOWER}/anatomical-landmarks/cecum/notes.txt"]
    assert index.summary["segmented_matched_by_sha256"] == 1


def test_category_names_are_tolerated():
    assert canonical_category("Dyed_Lifted_Polyps") == "dyed-lifted-polyps"
    assert canonical_category("polyp") == "polyps"
    assert canonical_category("hemorroids") == "hemorrhoids"
    assert canonical_category("normal-cecum") == "cecum"
    assert canonical_category("esophagitis-a") is None


def test_unknown_category_is_an_error(tree):
    _save(tree / LOWER / "pathological-findings/mystery-finding/m.jpg", 9)
    with pytest.raises(HyperKvasirError, match="mystery-finding"):
        index_hyperkvasir(tree, progress=False)


def test_missing_data_root_and_folders(tree, tmp_path):
    with pytest.raises(HyperKvasirError, match="nowhere: data root does not exist"):
        index_hyperkvasir(tmp_path / "nowhere", progress=False)
    shutil.rmtree(tree / "hyper-kvasir/segmented-images")
    with pytest.raises(HyperKvasirError, match="segmented-images folder not found"):
        index_hyperkvasir(tree, progress=False)
    shutil.rmtree(tree / "hyper-kvasir/labeled-images")
    with pytest.raises(HyperKvasirError, match="labeled-images folder not found"):
        index_hyperkvasir(tree, progress=False)


def test_unreadable_image_is_named(tree):
    (tree / LOWER / "anatomical-landmarks/cecum/c2.jpg").write_bytes(b"\xff\xd8\xff broken")
    with pytest.raises(ImageReadError, match="c2.jpg"):
        index_hyperkvasir(tree, progress=False)


def test_mask_size_mismatch_is_an_error(tree):
    _mask(tree / "hyper-kvasir/segmented-images/masks/cju0seg.jpg", size=(20, 24))
    with pytest.raises(MaskSizeError, match="masks/cju0seg.jpg.*images/cju0seg.jpg"):
        index_hyperkvasir(tree, progress=False)


def test_empty_mask_is_an_error(tree):
    _mask(tree / "hyper-kvasir/segmented-images/masks/cju0seg.jpg", lesion=False)
    with pytest.raises(HyperKvasirError, match="cju0seg.jpg has no lesion pixel"):
        index_hyperkvasir(tree, progress=False)


def test_missing_mask_is_an_error(tree):
    (tree / "hyper-kvasir/segmented-images/masks/cju0seg.jpg").unlink()
    with pytest.raises(HyperKvasirError, match="cju0seg.jpg has no mask"):
        index_hyperkvasir(tree, progress=False)


def test_segmented_twins_are_found_by_bytes_then_by_pixels(tree):
    """Real segmented images carry other names than their labelled twins and maybe other bytes:
    a PNG holding the decoded pixels of p2.jpg is its twin by average hash."""
    segmented = tree / "hyper-kvasir/segmented-images"
    pixels = np.asarray(Image.open(tree / LOWER / "pathological-findings/polyps/p2.jpg"))
    Image.fromarray(pixels).save(segmented / "images/cju1seg.png")
    _mask(segmented / "masks/cju1seg.jpg")
    index = index_hyperkvasir(tree, progress=False)
    images = index.images.set_index("sample_id")
    assert images.loc["p2", "mask_path"] == "hyper-kvasir/segmented-images/masks/cju1seg.jpg"
    assert (index.summary["segmented_matched_by_sha256"], index.summary["segmented_matched_by_ahash"],
            index.summary["segmented_with_masks"]) == (1, 1, 2)


def test_a_segmented_image_without_twin_is_left_out_unless_a_near_copy_could_leak(tree):
    segmented = tree / "hyper-kvasir/segmented-images"
    _save(segmented / "images/cju0other.jpg", 99)                # unrelated pixels: no twin
    _mask(segmented / "masks/cju0other.jpg")
    index = index_hyperkvasir(tree, progress=False)
    assert index.summary["segmented_without_twin"] == ["hyper-kvasir/segmented-images/images/cju0other.jpg"]
    assert index.summary["segmented_with_masks"] == 1 and (index.images["mask_path"] != "").sum() == 1
    # A near-copy of the negative u1 (a few pixels changed): no twin by bytes or by hash, yet
    # close enough to a labelled image that the roles could put the same picture in development.
    pixels = np.asarray(Image.open(tree / LOWER / "pathological-findings/ulcerative-colitis-grade-2-3/u1.jpg")).copy()
    pixels[:3, :3] = 255 - pixels[:3, :3]
    Image.fromarray(pixels).save(segmented / "images/cju0near.png")
    _mask(segmented / "masks/cju0near.jpg")
    with pytest.raises(HyperKvasirError, match=r"near-copy.*cju0near.png.*u1.jpg differs in \d+ of 256"):
        index_hyperkvasir(tree, progress=False)


def test_labelled_and_segmented_folders_one_level_deeper(tree):
    """Zips extracted into folders of their own name: found, and the summary says where."""
    root = tree / "hyper-kvasir"
    (root / "hyper-kvasir-labeled-images").mkdir()
    shutil.move(root / "labeled-images", root / "hyper-kvasir-labeled-images" / "labeled-images")
    (root / "segmented" / "hyper-kvasir-segmented-images").mkdir(parents=True)
    shutil.move(root / "segmented-images",
                root / "segmented" / "hyper-kvasir-segmented-images" / "segmented-images")
    index = index_hyperkvasir(tree, progress=False)
    assert index.summary["folders"] == {
        "labeled-images": "hyper-kvasir/hyper-kvasir-labeled-images/labeled-images",
        "segmented-images": "hyper-kvasir/segmented/hyper-kvasir-segmented-images/segmented-images"}
    assert index.summary["segmented_with_masks"] == 1 and len(index.images) == 7
    shutil.copytree(root / "hyper-kvasir-labeled-images", root / "copy")
    with pytest.raises(HyperKvasirError, match="several 'labeled-images' folders"):
        index_hyperkvasir(tree, progress=False)


def test_repeated_stem_is_an_error(tree):
    _save(tree / LOWER / "anatomical-landmarks/ileum/p2.jpg", 12)
    with pytest.raises(HyperKvasirError, match="repeated.*p2.jpg"):
        index_hyperkvasir(tree, progress=False)
