"""Data roots that a careless or hostile user could hand the run (issue 50, "Twins and masks by
content and role"): each is refused in one line naming the files, by the run's own readers and
by ``--check`` alike (what the preflight accepts, the run accepts), or read correctly.

- a segmented image that copies a negative labelled frame (bytes or average hash);
- a segmented set re-encoded as JPEG (its twins matched as re-encodings and counted);
- two masks with one stem, in HyperKvasir and in every external cohort;
- a copy of a cohort at another depth beside the full download (PolypGen, HyperKvasir).

The readers are called as the run calls them (``index_hyperkvasir(root)`` in 00_roles,
``read_cohort(name, root)`` in 06_transfer: no problems list) and as ``--check`` calls them
(``preflight``; exit 2 at the front door).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from endoexplain_core import config
from endoexplain_core.data import cohorts, hyperkvasir, roles, synthetic
from endoexplain_core.pipeline import orchestrator, preflight
from tests.test_cohorts import write_frame, write_mask
from tests.test_synthetic import TINY

SEGMENTED = "hyper-kvasir/segmented-images"
LOWER = "hyper-kvasir/labeled-images/lower-gi-tract"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The TINY synthetic data root (48-px frames, every cohort but Kvasir-SEG and CVC), written
    once; tests work on a copy (``data_root``)."""
    root = tmp_path_factory.mktemp("hostile-data") / "data"
    synthetic.generate_cohort(root, seed=3, design=TINY)
    return root


@pytest.fixture
def data_root(generated, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(generated, root)
    return root


def _check(root: Path, tmp_path: Path) -> tuple[str, int]:
    """``--check``'s report (text, exit code) for the smoke profile on ``root``."""
    findings = preflight.run_preflight(config.load_profile("smoke"), str(root), tmp_path / "runs")
    return preflight.report(findings)


def _problem_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[problem]")]


def _first_segmented(root: Path) -> tuple[Path, Path]:
    image = sorted((root / SEGMENTED / "images").glob("*.jpg"))[0]
    return image, root / SEGMENTED / "masks" / image.name


# --- a segmented image must be a polyp's twin -------------------------------------------------

@pytest.mark.parametrize("copy", ["bytes", "average hash"])
def test_a_segmented_copy_of_a_negative_is_refused_naming_both(data_root, tmp_path, capsys, copy):
    """A cecum frame copied into the segmented set with a mask: before, READY and the negative
    got the audit role and a lesion mask (bytes), or a refusal as a "near-copy" that differs in
    0 bits (hash); now a refusal that says a negative was copied, naming both files."""
    cecum = sorted((data_root / LOWER / "anatomical-landmarks/cecum").glob("*.jpg"))[0]
    _, some_mask = _first_segmented(data_root)
    if copy == "bytes":
        planted = data_root / SEGMENTED / "images/cjnegative.jpg"
        shutil.copyfile(cecum, planted)
    else:   # the same pixels in another format: other bytes, the same average hash
        planted = data_root / SEGMENTED / "images/cjnegative.png"
        Image.open(cecum).convert("RGB").save(planted)
        assert roles.hash_image_bytes(planted.read_bytes())["ahash"] == roles.hash_image_bytes(
            cecum.read_bytes())["ahash"]
    shutil.copyfile(some_mask, data_root / SEGMENTED / "masks/cjnegative.jpg")

    with pytest.raises(hyperkvasir.HyperKvasirError) as refused:          # the run (00_roles)
        hyperkvasir.index_hyperkvasir(data_root, progress=False)
    message = str(refused.value)
    assert "\n" not in message and "copies of negative labelled images" in message
    assert planted.name in message and cecum.name in message and "(cecum)" in message

    code = orchestrator.main(["--profile", "smoke", "--data-root", str(data_root),
                              "--output-root", str(tmp_path / "out"), "--check"])
    out = capsys.readouterr().out
    assert code == 2 and "preflight: NOT READY" in out
    assert any(planted.name in line and cecum.name in line for line in _problem_lines(out))


def test_a_reencoded_segmented_set_is_matched_and_counted(data_root, tmp_path):
    """Every segmented image re-saved as JPEG quality 85 (pixels differ slightly, and the average
    hash of some moves a few bits): before, those were refused as near-copies and the data root
    could not run; now each is matched to its polyp as a re-encoding and counted as such."""
    images = sorted((data_root / SEGMENTED / "images").glob("*.jpg"))
    labelled = hyperkvasir.index_hyperkvasir(data_root, progress=False).images
    original_ahash = {}
    for path in images:
        original_ahash[path.name] = roles.hash_image_bytes(path.read_bytes())["ahash"]
        buffer = io.BytesIO()
        Image.open(path).convert("RGB").save(buffer, format="JPEG", quality=85)
        path.write_bytes(buffer.getvalue())
    polyp_hashes = set(labelled.loc[labelled["target"] == 1, "ahash"])
    moved = [p.name for p in images if roles.hash_image_bytes(p.read_bytes())["ahash"] not in polyp_hashes]
    assert moved, "no average hash moved: the case needs another quality or frame size"

    index = hyperkvasir.index_hyperkvasir(data_root, progress=False)          # the run (00_roles)
    summary = index.summary
    assert summary["segmented_matched_by_reencoding"] == len(moved)
    assert summary["segmented_with_masks"] == len(images) and summary["segmented_without_twin"] == []
    assert summary["segmented_matched_by_sha256"] == 0
    # each mask lies on the picture its segmented image re-encodes (the original or its labelled
    # re-encoded copy, which shares the original's average hash)
    masked = index.images[index.images["mask_path"] != ""]
    assert len(masked) == len(images) and (masked["target"] == 1).all()
    for row in masked.itertuples():
        assert row.ahash == original_ahash[Path(row.mask_path).name]

    text, code = _check(data_root, tmp_path)                                   # --check
    assert code == 0, text
    assert f"re-encodings {len(moved)}" in text


def test_an_edited_polyp_picture_near_in_hash_is_still_refused(data_root):
    """A guard (it passes before and after): the re-encoding rule compares pixels, not only
    hashes. A polyp frame with its contrast raised by 30% (average hash a few bits away, block
    means about 9 levels apart) is no re-encoding and stays a refused near-copy."""
    image, _ = _first_segmented(data_root)
    original = np.asarray(Image.open(image).convert("RGB")).astype(float)
    pixels = np.clip((original - original.mean()) * 1.3 + original.mean(), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    image.unlink()
    image.with_suffix(".png").write_bytes(buffer.getvalue())
    with pytest.raises(hyperkvasir.HyperKvasirError, match=r"near-copy.*differs in \d+ of 256"):
        hyperkvasir.index_hyperkvasir(data_root, progress=False)


# --- two masks with one stem ------------------------------------------------------------------

def _second_mask(mask: Path, suffix: str) -> Path:
    """Another mask with the same stem and another extension (another lesion: a smaller square)."""
    other = np.zeros(np.asarray(Image.open(mask).convert("L")).shape, dtype=np.uint8)
    other[2:6, 2:6] = 255
    twin = mask.with_suffix(suffix)
    Image.fromarray(other).save(twin)
    return twin


def _paired_cohort(root: Path, dataset: str) -> None:
    """A minimal Kvasir-SEG or CVC-ClinicDB (absent from the synthetic cohort)."""
    folder = root / cohorts.DATASET_FOLDERS[dataset]
    images, masks = ("images", "masks") if dataset == "kvasir_seg" else ("Original", "Ground Truth")
    suffix = ".jpg" if dataset == "kvasir_seg" else ".tif"
    for n in (1, 2):
        write_frame(folder / images / f"{n}{suffix}", 300 + n)
        write_mask(folder / masks / f"{n}.png" if dataset == "kvasir_seg" else folder / masks / f"{n}{suffix}",
                   (2, 12, 2, 12))


MASK_CASES = {   # cohort -> (mask glob under its folder, the second mask's extension)
    "etis": ("Ground Truth/*.tif", ".bmp"),
    "polypgen": ("data_C1/masks_C1/*.jpg", ".png"),
    "polypdb": ("PolypDB_center_wise/Simula/WLI/masks/*", ".bmp"),
    "kvasir_seg": ("masks/*.png", ".jpg"),
    "cvc_clinicdb": ("Ground Truth/*.tif", ".png"),
}


@pytest.mark.parametrize("dataset", list(MASK_CASES))
def test_two_masks_with_one_stem_are_refused_in_every_cohort(data_root, tmp_path, dataset):
    """e.g. ETIS ``p3.tif`` beside ``p3.bmp``: before, READY and whichever sorted first was the
    mask (a case dropped as empty, or audited against the wrong lesion); now the run and --check
    refuse, naming both files."""
    if dataset in ("kvasir_seg", "cvc_clinicdb"):
        _paired_cohort(data_root, dataset)
    pattern, suffix = MASK_CASES[dataset]
    mask = sorted((data_root / cohorts.DATASET_FOLDERS[dataset]).glob(pattern))[0]
    twin = _second_mask(mask, suffix)

    with pytest.raises(cohorts.CohortError) as refused:                        # the run (06)
        cohorts.read_cohort(dataset, data_root)
    message = str(refused.value)
    assert "\n" not in message and "two masks with the stem" in message
    assert mask.name in message and twin.name in message

    findings, _ = preflight.cohort_findings(data_root, [dataset], [])          # --check
    text, code = preflight.report(findings)
    assert code == 2
    assert any(mask.name in line and twin.name in line for line in _problem_lines(text))


def test_two_masks_with_one_stem_are_refused_in_hyperkvasir(data_root, tmp_path):
    """The segmented masks alike (before, the first by name was read)."""
    _, mask = _first_segmented(data_root)
    twin = _second_mask(mask, ".png")
    with pytest.raises(hyperkvasir.HyperKvasirError, match="two masks with the stem") as refused:
        hyperkvasir.index_hyperkvasir(data_root, progress=False)
    assert mask.name in str(refused.value) and twin.name in str(refused.value)
    text, code = _check(data_root, tmp_path)
    assert code == 2 and any(mask.name in line and twin.name in line for line in _problem_lines(text))


# --- a copy of a cohort at another depth --------------------------------------------------------

def test_polypgen_centre_beside_the_nested_download_is_refused_naming_both(data_root, tmp_path):
    """``PolypGen/data_C1`` directly beside the published top folder holding data_C1..C6: before,
    READY with the direct copy alone (2 of 9 frames) and the download never mentioned."""
    polypgen = data_root / "PolypGen"
    top = polypgen / "PolypGen2021_MultiCenterData_v3"
    top.mkdir()
    for centre in sorted(polypgen.glob("data_C*")):
        shutil.move(centre, top / centre.name)
    shutil.copytree(top / "data_C1", polypgen / "data_C1")

    with pytest.raises(cohorts.CohortError) as refused:                        # the run (06)
        cohorts.read_polypgen(data_root)
    message = str(refused.value)
    assert "\n" not in message and "data_C1" in message and top.name in message

    findings, _ = preflight.cohort_findings(data_root, ["polypgen"], [])     # --check
    text, code = preflight.report(findings)
    assert code == 2 and any(top.name in line and "data_C1" in line for line in _problem_lines(text))


@pytest.mark.parametrize("folder", ["labeled-images", "segmented-images"])
def test_part_of_a_hyperkvasir_folder_beside_the_nested_copy_is_refused(data_root, tmp_path, capsys,
                                                                       folder):
    """Half of ``labeled-images`` (or of ``segmented-images``, each image with its mask) directly
    under ``hyper-kvasir`` beside the full copy extracted into ``hyper-kvasir-<folder>/``: before,
    READY with the partial copy alone; now both are named (as two nested copies already were)."""
    root = data_root / "hyper-kvasir"
    nested = root / f"hyper-kvasir-{folder}" / folder
    nested.parent.mkdir()
    shutil.copytree(root / folder, nested)
    for path in sorted(p for p in (root / folder).rglob("*") if p.is_file() and "masks" not in p.parts)[::2]:
        path.unlink()                                                          # half stays
        (root / folder / "masks" / path.name).unlink(missing_ok=True)         # with its mask

    with pytest.raises(hyperkvasir.HyperKvasirError) as refused:               # the run (00)
        hyperkvasir.index_hyperkvasir(data_root, progress=False)
    message = str(refused.value)
    assert "\n" not in message and f"several '{folder}' folders" in message
    assert f"(hyper-kvasir-{folder}/{folder}, {folder})" in message          # both copies named

    code = orchestrator.main(["--profile", "smoke", "--data-root", str(data_root),
                              "--output-root", str(tmp_path / "out"), "--check"])
    out = capsys.readouterr().out
    assert code == 2 and any(f"hyper-kvasir-{folder}/{folder}" in line for line in _problem_lines(out))
