"""How the real datasets look on disk, for the synthetic generator's ``mirror`` and
``downloaded`` layouts (what each holds: docs/protocol.md, "Dataset layouts").

``dress_frame`` puts a rendered frame and its mask into a frame of one of its dataset's
published sizes (``*_SIZES``, (height, width) pixels) with the screen overlays of
``OVERLAY_TEXT``; ``STRAY_FILES`` and ``label_csv`` are what real folders hold beside the
images; ``rearrange_as_downloaded`` turns a mirror tree into the ``downloaded`` layout in
place. Every draw comes from the generator passed in.

Design: docs/data_models_runs.md, "The mirror of the real datasets".
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

import cv2
import numpy as np

# Published frame sizes, (height, width) pixels.
HYPERKVASIR_SIZES: tuple[tuple[int, int], ...] = ((576, 720), (1024, 1280), (1072, 1920), (529, 622))
ETIS_SIZES: tuple[tuple[int, int], ...] = ((966, 1225),)
POLYPGEN_SIZES: dict[int, tuple[tuple[int, int], ...]] = {
    1: ((1080, 1920), (1064, 1350)), 2: ((1080, 1350),), 3: ((576, 720), (480, 640)),
    4: ((1080, 1920),), 5: ((1024, 1280),), 6: ((1080, 1920), (576, 720)),
}
POLYPDB_SIZES: dict[str, tuple[tuple[int, int], ...]] = {
    "Simula": ((576, 720), (1024, 1280)), "BKAI": ((995, 1280),), "Karolinska": ((1080, 1920),),
}
# Datasets whose frames carry the processor's on-screen text (ETIS and the BKAI crops do not).
OVERLAY_TEXT = {"hyper-kvasir": True, "ETIS-LaribPolypDB": False, "PolypGen": True,
                "PolypDB/Simula": True, "PolypDB/BKAI": False, "PolypDB/Karolinska": True}

# Files real downloads carry next to the images (relative path -> bytes).
STRAY_FILES: dict[str, bytes] = {
    ".DS_Store": b"\x00\x00\x00\x01Bud1" + bytes(26),
    "hyper-kvasir/labeled-images/.DS_Store": b"\x00\x00\x00\x01Bud1" + bytes(26),
    "ETIS-LaribPolypDB/ETIS-LaribPolypDB/Thumbs.db": b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(56),
    "PolypDB/PolypDB_center_wise/.DS_Store": b"\x00\x00\x00\x01Bud1" + bytes(26),
    "hyper-kvasir/segmented-images/bounding-boxes.json": b'{"note": "boxes of the segmented polyps"}\n',
}
LABEL_CSV = "hyper-kvasir/labeled-images/image-labels.csv"


def dress_frame(rng: np.random.Generator, image: np.ndarray, mask: np.ndarray,
                sizes: Sequence[tuple[int, int]], *, text: bool) -> tuple[np.ndarray, np.ndarray]:
    """A rendered frame placed in a real-sized frame: uint8 (H, W, 3) image, bool (H, W) mask.

    ``image`` (uint8 h x w x 3) and ``mask`` (bool h x w) are enlarged together (bilinear,
    nearest neighbour) into the field-of-view box of a frame whose (H, W) is drawn from
    ``sizes``; with ``text`` the left margin carries screen text and a frame line. Geometry:
    docs/data_models_runs.md, "The mirror of the real datasets".
    """
    height, width = sizes[int(rng.integers(len(sizes)))]
    box_height = int(round(height * rng.uniform(0.90, 0.98)))
    aspect = image.shape[1] / image.shape[0] * rng.uniform(1.0, 1.15)
    box_width = min(int(round(box_height * aspect)), int(width * 0.80))
    top = (height - box_height) // 2
    left = width - box_width - int(round(width * rng.uniform(0.005, 0.02)))
    frame = np.full((height, width, 3), int(rng.integers(0, 4)), dtype=np.uint8)
    frame[top:top + box_height, left:left + box_width] = cv2.resize(
        image, (box_width, box_height), interpolation=cv2.INTER_LINEAR)
    frame_mask = np.zeros((height, width), dtype=bool)
    frame_mask[top:top + box_height, left:left + box_width] = cv2.resize(
        mask.astype(np.uint8), (box_width, box_height), interpolation=cv2.INTER_NEAREST) > 0
    if text:
        _screen_text(rng, frame, left, top, box_height)
    return frame, frame_mask


def _screen_text(rng: np.random.Generator, frame: np.ndarray, left: int, top: int,
                 box_height: int) -> None:
    """In place: date, time, processor settings in the left margin and a frame line around the
    field of view (never inside it, so the lesion mask stays true)."""
    scale = frame.shape[0] / 900.0
    lines = [f"{int(rng.integers(2010, 2020))}/{int(rng.integers(1, 13)):02d}/"
             f"{int(rng.integers(1, 29)):02d}",
             f"{int(rng.integers(7, 18)):02d}:{int(rng.integers(0, 60)):02d}:"
             f"{int(rng.integers(0, 60)):02d}",
             f"Eh:A{int(rng.integers(1, 9))} Ct:{int(rng.integers(1, 4))}",
             f"CVP:{int(rng.integers(1, 6))}"]
    thickness = max(1, int(round(2 * scale)))
    for number, line in enumerate(lines):
        origin = (int(8 * scale), int(40 * scale + number * 34 * scale))
        if origin[1] < frame.shape[0]:
            cv2.putText(frame, line, origin, cv2.FONT_HERSHEY_SIMPLEX, 0.8 * scale,
                        (235, 235, 235), thickness, cv2.LINE_AA)
    text_right = int(8 * scale + cv2.getTextSize(lines[2], cv2.FONT_HERSHEY_SIMPLEX, 0.8 * scale,
                                                 thickness)[0][0])
    outline = max(1, thickness // 2)
    if left - 2 * outline > text_right:   # a frame line only where the margin leaves room for it
        cv2.rectangle(frame, (left - 2 * outline, max(0, top - 2 * outline)),
                      (frame.shape[1] - 1, min(frame.shape[0] - 1, top + box_height + outline)),
                      (200, 200, 200), outline)


def label_csv(rows: Sequence[tuple[str, str, str]]) -> bytes:
    """HyperKvasir's ``image-labels.csv``: ``Video file,Finding,Organ,Classification`` per
    labelled image, from (stem, category, group) triples."""
    lines = ["Video file,Finding,Organ,Classification"]
    lines += [f"{stem},{category},Lower GI,{group}" for stem, category, group in rows]
    return ("\n".join(lines) + "\n").encode()


POLYPGEN_TOP_FOLDER = "PolypGen2021_MultiCenterData_v3"


def jpeg_with_comment(data: bytes, comment: bytes) -> bytes:
    """The same JPEG with a comment segment (COM, 0xFFFE) after its start marker: other bytes
    and another SHA-256, the same decoded pixels."""
    if data[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG (no start-of-image marker)")
    return data[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + data[2:]


def rearrange_as_downloaded(root: Path) -> dict[str, Any]:
    """Rearrange a mirror tree under ``root`` in place into the ``downloaded`` layout (module
    docstring) and say what moved. Paths are the generator's; the readers must find every
    case again (``tests/test_mirror_layouts.py``)."""
    root = Path(root)
    done: dict[str, Any] = {}
    # HyperKvasir: each zip extracted into a folder named after it.
    hyperkvasir = root / "hyper-kvasir"
    for name in ("labeled-images", "segmented-images"):
        target = hyperkvasir / f"hyper-kvasir-{name}" / name
        target.parent.mkdir()
        os.replace(hyperkvasir / name, target)
    segmented = hyperkvasir / "hyper-kvasir-segmented-images" / "segmented-images" / "images"
    rewritten = 0
    for path in sorted(segmented.glob("*.jpg")):
        path.write_bytes(jpeg_with_comment(path.read_bytes(), b"exported by the annotation tool"))
        rewritten += 1
    done["segmented_reencoded"] = rewritten
    # PolypGen: the v3 zip's top folder; the published "<stem>_.jpg" frame; a name with spaces.
    polypgen = root / "PolypGen"
    top = polypgen / POLYPGEN_TOP_FOLDER
    top.mkdir()
    for child in sorted(polypgen.iterdir()):
        if child != top:
            os.replace(child, top / child.name)
    renamed = []
    for centre, new_stem in ((3, "{stem}_"), (2, "{stem} copy")):
        images, masks = top / f"data_C{centre}" / f"images_C{centre}", top / f"data_C{centre}" / f"masks_C{centre}"
        frame = sorted(p for p in images.glob("*.jpg") if not p.name.startswith("."))[-1]
        stem = new_stem.format(stem=frame.stem)
        mask_stem = f"{stem}mask" if stem.endswith("_") else f"{stem}_mask"
        os.replace(masks / f"{frame.stem}_mask.jpg", masks / f"{mask_stem}.jpg")
        os.replace(frame, images / f"{stem}.jpg")
        renamed.append(f"{images.relative_to(root).as_posix()}/{stem}.jpg")
    done["polypgen_renamed"] = renamed
    # ETIS as PraNet's test set ships it: images/<n>.png, masks/<n>.png.
    etis = root / "ETIS-LaribPolypDB"
    for source, target, pattern in (("ETIS-LaribPolypDB", "images", "{n}"), ("Ground Truth", "masks", "p{n}")):
        (etis / target).mkdir()
        for path in sorted((etis / source).glob("*.tif")):
            number = re.sub(r"^p", "", path.stem) if pattern.startswith("p") else path.stem
            image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
            if not cv2.imwrite(str(etis / target / f"{number}.png"), image):
                raise OSError(f"{etis / target / f'{number}.png'}: could not be written")
        shutil.rmtree(etis / source)
    done["etis_layout"] = "images/ + masks/ (PNG)"
    # PolypDB: one frame without a mask, as in the real set.
    lonely = sorted((root / "PolypDB" / "PolypDB_center_wise").glob("BKAI/LCI/masks/*.png"))[0]
    lonely.unlink()
    done["polypdb_without_mask"] = lonely.relative_to(root).as_posix().replace("/masks/", "/images/")[:-4] + ".jpg"
    return done
