"""The synthetic cohort: frame knobs, layouts, study structure and byte-determinism."""

import hashlib

import imagehash
import numpy as np
import pytest
from PIL import Image

from endoexplain_core import config
from endoexplain_core.data import synthetic
from endoexplain_core.data.imageio import read_mask

# A tiny cohort design: the 00 profile section, its other keys at their config defaults.
TINY = config.RolesSettings(
    frame_size=48, category_counts={"cecum": 4, "bbps-2-3": 3, "dyed-lifted-polyps": 4, "dyed-resection-margins": 3},
    n_segmented=3, n_development_polyps=1, n_audit_near_duplicates=1, n_development_duplicates=1,
    n_development_near_duplicates=1, etis_count=3, etis_duplicates=1, polypgen_counts=[2, 1, 1, 1, 1, 1],
    polypgen_empty_per_centre=1, polypgen_duplicates=1, polypdb_per_cell=1)


def _tree_digests(root):
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_render_frame_shapes_mask_and_border():
    image, mask = synthetic.render_frame(np.random.default_rng(0), (60, 80))
    assert image.dtype == np.uint8 and image.shape == (60, 80, 3)
    assert mask.dtype == bool and mask.shape == (60, 80) and 0 < mask.mean() < 0.3
    assert image[0, 0].max() == 0 and image[-1, -1].max() == 0  # black field corners
    ys, xs = np.nonzero(mask)
    assert ys.min() > 0 and xs.min() > 0  # the polyp lies inside the field of view
    _, no_lesion = synthetic.render_frame(np.random.default_rng(0), 48, lesion=False)
    assert not no_lesion.any()


def test_render_frame_is_a_function_of_the_generator_state():
    first = synthetic.render_frame(np.random.default_rng(5), 40, dye=True)
    again = synthetic.render_frame(np.random.default_rng(5), 40, dye=True)
    other = synthetic.render_frame(np.random.default_rng(6), 40, dye=True)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], other[0])


def test_conspicuity_controls_lesion_contrast_and_dye_is_blue():
    visible, mask = synthetic.render_frame(np.random.default_rng(3), 96, conspicuity=1.0)
    hidden, same_mask = synthetic.render_frame(np.random.default_rng(3), 96, conspicuity=0.0)
    assert np.array_equal(mask, same_mask)
    outside = ~mask
    contrast = lambda im: abs(im[mask].astype(float).mean() - im[outside & (im.sum(2) > 0)].mean())
    assert contrast(visible) > 3 * contrast(hidden)

    dyed, dye_mask = synthetic.render_frame(np.random.default_rng(4), 96, dye=True, dye_strength=1.0)
    plain, _ = synthetic.render_frame(np.random.default_rng(4), 96, dye=True, dye_strength=0.0)
    ring = np.zeros_like(dye_mask)
    ys, xs = np.nonzero(dye_mask)
    ring[max(0, ys.min() - 6):ys.max() + 7, max(0, xs.min() - 6):xs.max() + 7] = True
    ring &= ~dye_mask
    blueness = lambda im: (im[ring][:, 2].astype(float) - im[ring][:, 0]).mean()
    assert blueness(dyed) > blueness(plain) + 20


def test_bad_knobs_are_rejected():
    with pytest.raises(ValueError, match="conspicuity"):
        synthetic.render_frame(np.random.default_rng(0), 32, conspicuity=1.5)


def test_cohort_is_byte_deterministic_and_has_the_real_layouts(tmp_path):
    summary = synthetic.generate_cohort(tmp_path / "a", seed=42, design=TINY)
    synthetic.generate_cohort(tmp_path / "b", seed=42, design=TINY)
    first, second = _tree_digests(tmp_path / "a"), _tree_digests(tmp_path / "b")
    assert first == second
    synthetic.generate_cohort(tmp_path / "c", seed=43, design=TINY)
    assert first != _tree_digests(tmp_path / "c")

    paths = set(first)
    assert "ETIS-LaribPolypDB/ETIS-LaribPolypDB/4.tif" in paths  # 3 frames + 1 duplicate
    assert "ETIS-LaribPolypDB/Ground Truth/p4.tif" in paths
    assert "PolypGen/data_C3/masks_C3/C3_0001_mask.jpg" in paths
    assert "PolypDB/PolypDB_center_wise/BKAI/NBI/images/BKAI_NBI_001.jpg" not in paths
    assert "PolypDB/PolypDB_center_wise/Karolinska/NBI/masks/Karolinska_NBI_001.png" in paths
    labelled = [p for p in paths if p.startswith("hyper-kvasir/labeled-images/lower-gi-tract/")]
    assert len(labelled) == summary["hyper-kvasir"]["labelled_total"] == 4 + 3 + 4 + 3 + 5 + 2
    assert first["ETIS-LaribPolypDB/ETIS-LaribPolypDB/4.tif"] in {
        first[f"ETIS-LaribPolypDB/ETIS-LaribPolypDB/{n}.tif"] for n in (1, 2, 3)}
    assert not read_mask(tmp_path / "a/PolypGen/data_C1/masks_C1/C1_0001_mask.jpg").any()


def test_cohort_mirrors_the_study_structure(tmp_path):
    root = tmp_path / "cohort"
    synthetic.generate_cohort(root, seed=7, design=TINY)
    digests = _tree_digests(root)
    polyps = {p: d for p, d in digests.items() if "/pathological-findings/polyps/" in p}
    segmented = {p: d for p, d in digests.items() if "segmented-images/images/" in p}
    assert len(polyps) == 3 + 1 + 1 and len(segmented) == 3
    assert set(segmented.values()) <= set(polyps.values())  # byte-identical copies
    names = {p.rsplit("/", 1)[1] for p in segmented} & {p.rsplit("/", 1)[1] for p in polyps}
    assert not names  # matched by content, not by name
    for path in segmented:
        assert read_mask(root / path.replace("/images/", "/masks/")).any()

    def ahash(path):
        return str(imagehash.average_hash(Image.open(root / path), hash_size=16))
    unsegmented = [p for p, d in polyps.items() if d not in set(segmented.values())]
    segmented_hashes = {ahash(p) for p in segmented}
    near = [p for p in unsegmented if ahash(p) in segmented_hashes]
    assert len(near) == 1  # the audit near-duplicate: other bytes, same average hash
    negatives = [p for p in digests if "/cecum/" in p or "/bbps-2-3/" in p or "resection" in p]
    assert len(negatives) == 4 + 3 + 3 + 2
    assert len({digests[p] for p in negatives}) == len(negatives) - 1  # one byte copy


def test_existing_foreign_folder_is_not_overwritten(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        synthetic.generate_cohort(tmp_path / "mine", seed=1, design=TINY)
    assert (tmp_path / "mine" / "precious.txt").read_text() == "keep"


def test_contact_sheet_is_written(tmp_path):
    synthetic.generate_cohort(tmp_path / "cohort", seed=1, design=TINY)
    out = synthetic.contact_sheet(tmp_path / "cohort", tmp_path / "sheet.png", per_row=2, thumb=24)
    with Image.open(out) as sheet:
        label_width = sheet.width - 2 * 28
        assert 150 < label_width < 400   # as wide as the longest label at 16 px
        rows = 5 + 1 + 1 + 6 + 8  # labelled categories (polyps too), segmented, ETIS, PolypGen, PolypDB
        assert sheet.height == rows * 28
    with Image.open(synthetic.contact_sheet(tmp_path / "cohort", tmp_path / "default.png")) as sheet:
        assert sheet.height == rows * (128 + 4)   # default thumbnails >= 120 px


def test_generated_masks_have_the_papers_lesion_geometry(tmp_path):
    """docs/protocol.md, "Synthetic lesion geometry": on 300 segmented masks of a generated
    cohort, a random peak misses the polyp about as often as in the paper (0.832), the frame
    centre misses about as often (0.519), and far more often in the small-lesion tertile than in
    the large one (paper 0.761 vs 0.185). Bounds: the paper's values +- 3 binomial SEs."""
    design = TINY.model_copy(update={"frame_size": 96, "n_segmented": 300, "n_audit_near_duplicates": 0})
    root = tmp_path / "cohort"
    synthetic.generate_cohort(root, seed=20260721, design=design)
    masks = np.stack([read_mask(p) for p in sorted((root / "hyper-kvasir/segmented-images/masks").iterdir())])
    assert len(masks) == 300
    area = masks.mean(axis=(1, 2))
    centre_hit = masks[:, 47:49, 47:49].any(axis=(1, 2))
    assert 0.80 <= 1 - area.mean() <= 0.87
    assert 0.43 <= 1 - centre_hit.mean() <= 0.61
    small, large = area <= np.quantile(area, 1 / 3), area >= np.quantile(area, 2 / 3)
    assert 1 - centre_hit[small].mean() >= 0.62 and 1 - centre_hit[large].mean() <= 0.33
    # off-centre: the lesion centroids spread over the field, not a central cluster
    rows = np.array([np.nonzero(m)[0].mean() for m in masks])
    assert rows.std() >= 0.12 * 96


def test_standard_polyps_conspicuity_factor_follows_floor_and_power():
    # the factor is floor + (1 - floor) x U^power; power 1 draws exactly as rng.uniform(floor, 1)
    knobs = {"conspicuity": 1.0, "dye_strength": 0.8, "standard_conspicuity_floor": 0.1,
             "standard_conspicuity_power": 2.0}
    uniform = [synthetic._polyp_knobs(np.random.default_rng(s), knobs, 0.1, 1.0)["conspicuity"]
               for s in range(2000)]
    assert uniform == [np.random.default_rng(s).uniform(0.1, 1.0) for s in range(2000)]
    skewed = np.array([synthetic._polyp_knobs(np.random.default_rng(s), knobs, 0.1, 2.0)["conspicuity"]
                       for s in range(2000)])
    assert skewed.min() >= 0.1 and skewed.max() <= 1.0
    # median of U^2 is 0.25: most standard polyps lie near the floor
    assert np.median(skewed) == pytest.approx(0.1 + 0.9 * 0.25, abs=0.03)
    assert "standard_conspicuity_floor" not in synthetic._polyp_knobs(np.random.default_rng(0), knobs)


def test_a_subtle_standard_polyp_design_is_recorded_and_keeps_dyed_polyps_conspicuous(tmp_path):
    subtle = TINY.model_copy(update={"standard_conspicuity_floor": 0.0, "standard_conspicuity_power": 2.0})
    parameters = synthetic.generate_cohort(tmp_path / "subtle", seed=7, design=subtle)["parameters"]
    assert parameters["standard_conspicuity_floor"] == 0.0 and parameters["standard_conspicuity_power"] == 2.0
    default = synthetic.generate_cohort(tmp_path / "default", seed=7, design=TINY)["parameters"]
    assert "standard_conspicuity_floor" not in default and "standard_conspicuity_power" not in default
    before, after = _tree_digests(tmp_path / "default"), _tree_digests(tmp_path / "subtle")
    dyed = [p for p in before if "/dyed-lifted-polyps/" in p]
    standard = [p for p in before if "/pathological-findings/polyps/" in p]
    assert dyed and all(before[p] == after[p] for p in dyed)          # same draws, same frames
    assert any(before[p] != after[p] for p in standard)
