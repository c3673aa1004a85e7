"""HyperKvasir adapter: the labelled lower-GI images and the segmented polyp subset.

``index_hyperkvasir`` reads ``<data_root>/hyper-kvasir`` (real or synthetic; layout:
docs/architecture.md, "Data root layout"; ``labeled-images`` and ``segmented-images`` may each
sit one or two folders deeper). One row per labelled lower-GI image (``TABLE_COLUMNS``):
``source`` the canonical category (folder name lower-cased, "_" and " " as "-",
``CATEGORY_ALIASES``), ``group`` its group folder, ``target`` 1 for ``POSITIVE_SOURCES`` else
0, ``mask_path`` on the labelled twin of each segmented image (the matching rule:
docs/protocol.md, "Roles"). Upper-GI images are counted and excluded, hidden files skipped,
other non-image files counted as ignored; masks are thresholded at 128. A twin is a
polyp-family image with the same bytes, the same average hash, or a re-encoding of it
(``REENCODING_MEAN_LEVELS``). ``HyperKvasirError`` for an unrecognised category, a segmented
image that copies a negative, a segmented image with a near-copy within ``NEAR_DUPLICATE_BITS``,
two masks with one stem, a folder found at two depths, and a missing, wrongly sized or empty mask.

Design: docs/data_models_runs.md, "HyperKvasir index".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from endoexplain_core import config
from endoexplain_core.data import imageio
from endoexplain_core.data.imageio import check_mask_size, is_image_file, read_mask
from endoexplain_core.data.roles import hash_files

HYPERKVASIR_FOLDER = "hyper-kvasir"
LOWER_GI = "lower-gi-tract"
UPPER_GI = "upper-gi-tract"
POSITIVE_SOURCES = ("polyps", "dyed-lifted-polyps")

# Canonical lower-GI category -> its group folder: the profile schema's vocabulary
# (``config.LOWER_GI_CATEGORIES``, which also checks ``category_counts``).
CATEGORY_GROUP: dict[str, str] = config.LOWER_GI_CATEGORIES

# Spellings used by the official split files and some mirrors.
CATEGORY_ALIASES: dict[str, str] = {
    "polyp": "polyps",
    "hemorroids": "hemorrhoids",
    "haemorrhoids": "hemorrhoids",
    "normal-cecum": "cecum",
    "caecum": "cecum",
    "terminal-ileum": "ileum",
    "retroflex-rectum": "retroflex-rectum",
    "dyed-lifted-polyp": "dyed-lifted-polyps",
    "dyed-resection-margin": "dyed-resection-margins",
    "ulcerative-colitis-0-1": "ulcerative-colitis-grade-0-1",
    "ulcerative-colitis-1-2": "ulcerative-colitis-grade-1-2",
    "ulcerative-colitis-2-3": "ulcerative-colitis-grade-2-3",
}

# Average-hash bits (of 256) within which an unmatched segmented image and a labelled image are
# treated as possible copies of one picture (about 8%, as imagehash's near-duplicate examples).
NEAR_DUPLICATE_BITS = 20

REENCODING_BLOCK = 8
"""Side (pixels) of the blocks whose means ``REENCODING_MEAN_LEVELS`` compares: JPEG's own block,
so that re-encoding noise (high frequencies inside a block) averages out and what is left is the
picture."""

REENCODING_MEAN_LEVELS = 3.0
"""Mean absolute difference (0-255 levels, over every ``REENCODING_BLOCK`` block mean and channel)
within which a segmented image of the same size is a re-encoding of a labelled polyp lying within
``NEAR_DUPLICATE_BITS`` of its average hash, and so its twin. Why 3: re-saving a frame as JPEG at
quality 85 moves its block means by at most 0.9 levels, at quality 50 by at most 1.9 (the
generator's 48- to 136-px frames and its real-sized mirror frames), while distinct pictures within
the near-copy radius differ by 8 levels or more: a re-encoding is matched, a different picture
stays a refused near-copy. (Per pixel the two overlap on small noisy frames: 6.3 against 12.5.)"""

TABLE_COLUMNS = ("sample_id", "path", "group", "source", "target", "sha256", "ahash", "width",
                 "height", "mask_path")


class HyperKvasirError(ValueError):
    """The HyperKvasir tree is missing, incomplete or inconsistent (message names the path)."""


@dataclass
class HyperKvasirIndex:
    """Result of ``index_hyperkvasir``.

    ``images``: one row per labelled lower-GI image, columns ``TABLE_COLUMNS`` (paths relative
    to the data root, POSIX; ``mask_path`` "" unless the image is in the segmented set; width
    and height in pixels). ``summary``: what was read, excluded and matched.
    """

    images: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)


def canonical_category(folder_name: str) -> str | None:
    """Canonical lower-GI category of a folder name, or None if it is not one."""
    name = folder_name.strip().lower().replace("_", "-").replace(" ", "-")
    name = CATEGORY_ALIASES.get(name, name)
    return name if name in CATEGORY_GROUP else None


def _visible_children(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def _require_folder(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise HyperKvasirError(f"{path}: {what} folder not found")
    return path


def _relative(path: Path, data_root: Path) -> str:
    return PurePosixPath(path.relative_to(data_root)).as_posix()


def index_hyperkvasir(data_root: str | Path, *, progress: bool = True,
                      problems: list | None = None) -> HyperKvasirIndex:
    """Index ``<data_root>/hyper-kvasir``: labelled lower-GI images, hashes (``roles.hash_files``),
    segmented masks matched to their twins and checked (same size, a lesion pixel).

    Raises ``HyperKvasirError`` naming the path (missing data root or folder, unknown category,
    repeated file stem, a near-copy that could leak, missing or empty mask),
    ``imageio.ImageReadError`` and ``imageio.MaskSizeError``. Given a ``problems`` list,
    unreadable labelled images and segmented images without a usable mask are recorded there
    as ``(path, kind, message)`` and left out, and indexing goes on.
    """
    data_root = Path(data_root)
    if not data_root.is_dir():
        raise HyperKvasirError(f"{data_root}: data root does not exist")
    root = _require_folder(data_root / HYPERKVASIR_FOLDER, "HyperKvasir ('hyper-kvasir')")
    labelled = _subtree(root, "labeled-images")
    lower = _require_folder(labelled / LOWER_GI, "HyperKvasir labeled-images/lower-gi-tract")
    segmented = _subtree(root, "segmented-images")
    segmented_images = _require_folder(segmented / "images", "segmented-images/images")
    segmented_masks = _require_folder(segmented / "masks", "segmented-images/masks")

    rows, ignored, unknown = [], [], []
    for group_dir in (p for p in _visible_children(lower) if p.is_dir()):
        for category_dir in (p for p in _visible_children(group_dir) if p.is_dir()):
            category = canonical_category(category_dir.name)
            if category is None:
                unknown.append(_relative(category_dir, data_root))
                continue
            for file in _visible_children(category_dir):
                if not is_image_file(file):
                    ignored.append(_relative(file, data_root))
                    continue
                rows.append({"sample_id": file.stem, "path": _relative(file, data_root),
                             "group": CATEGORY_GROUP[category], "source": category,
                             "target": int(category in POSITIVE_SOURCES)})
    if unknown:
        raise HyperKvasirError(f"unrecognised lower-GI categories (target unknown): {unknown}; "
                               f"known: {sorted(CATEGORY_GROUP)}")
    if not rows:
        raise HyperKvasirError(f"{lower}: no labelled lower-GI images found")
    images = pd.DataFrame(rows)
    repeated = images[images["sample_id"].duplicated(keep=False)].sort_values("path")
    if len(repeated):
        raise HyperKvasirError("file stems must be unique sample ids; repeated: "
                               + ", ".join(repeated["path"].head(4)))
    hashes = hash_files([data_root / p for p in images["path"]], progress=progress,
                        description="hashing labelled images", problems=problems)
    images = pd.concat([images, hashes], axis=1)
    images = images[images["sha256"].notna()].reset_index(drop=True)   # unreadable: in problems
    images["mask_path"] = ""

    upper_gi = 0
    if (labelled / UPPER_GI).is_dir():
        upper_gi = sum(1 for p in (labelled / UPPER_GI).rglob("*")
                       if is_image_file(p))
    twins = _match_segmented(images, data_root, segmented_images, segmented_masks, progress, problems)
    matched = twins["by_sha256"] + twins["by_ahash"] + twins["by_reencoding"]
    summary = {
        "labelled_lower_gi": len(images),
        "per_category": images["source"].value_counts().sort_index().to_dict(),
        "upper_gi_excluded": upper_gi,
        "ignored_files": ignored,
        "segmented_images": matched + twins["duplicates"] + len(twins["without_twin"]),
        "segmented_with_masks": matched,
        "segmented_matched_by_sha256": twins["by_sha256"],
        "segmented_matched_by_ahash": twins["by_ahash"],
        "segmented_matched_by_reencoding": twins["by_reencoding"],
        "segmented_byte_duplicates": twins["duplicates"],
        "segmented_without_twin": twins["without_twin"],
        "folders": {name: _relative(folder, data_root)
                    for name, folder in (("labeled-images", labelled), ("segmented-images", segmented))},
    }
    return HyperKvasirIndex(images.loc[:, list(TABLE_COLUMNS)], summary)


def _masks_by_stem(masks_dir: Path) -> dict[str, Path]:
    """stem -> mask file of ``masks_dir``, whatever the (image) extension or its case.

    Two mask files with one stem (``a.jpg`` and ``a.png``) are a ``HyperKvasirError`` naming
    both: which one was drawn for the image cannot be told, and taking the first by name would
    audit against whichever sorts first."""
    by_stem: dict[str, Path] = {}
    for path in _visible_children(masks_dir):
        if not is_image_file(path):
            continue
        if path.stem in by_stem:
            raise HyperKvasirError(f"{masks_dir}: two masks with the stem {path.stem!r} "
                                   f"({by_stem[path.stem].name} and {path.name}); keep one")
        by_stem[path.stem] = path
    return by_stem


def _subtree(root: Path, name: str) -> Path:
    """The one folder called ``name`` directly in ``root`` or one or two levels below it (a zip
    extracted into a folder of its own); ``HyperKvasirError`` naming every copy when there are
    several, at any depths, or naming what was found when there is none."""
    # Every depth is looked at: a partial copy directly under ``root`` beside the full nested
    # download would otherwise be read alone, and the other copy never mentioned.
    found = sorted(p for pattern in (name, f"*/{name}", f"*/*/{name}") for p in root.glob(pattern)
                   if p.is_dir() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if len(found) == 1:
        return found[0]
    if found:
        raise HyperKvasirError(f"{root}: several '{name}' folders ({', '.join(str(p.relative_to(root)) for p in found)}); keep one")
    found = ", ".join(sorted(p.name for p in root.iterdir() if not p.name.startswith("."))[:12])
    raise HyperKvasirError(f"{root / name}: HyperKvasir {name} folder not found (nor one or two "
                           f"levels deeper); {root} holds [{found}]")


def _pixel_twin(file: Path, candidates: pd.DataFrame, data_root: Path):
    """Index of the labelled row (of ``candidates``, equal average hash, ordered by path) whose
    decoded pixels equal ``file``'s, else the first."""
    if len(candidates) > 1:
        pixels = imageio.read_rgb(file)
        for row, path in candidates["path"].items():
            other = imageio.read_rgb(data_root / path)
            if other.shape == pixels.shape and (other == pixels).all():
                return row
    return candidates.index[0]


def _hamming(first: str, second: str) -> int:
    """Differing bits of two hex average hashes."""
    return (int(first, 16) ^ int(second, 16)).bit_count()


def _reencoded_twin(file: Path, ahash: str, width: int, height: int, polyp_family: pd.DataFrame,
                    data_root: Path):
    """Index of the labelled polyp-family row (of ``polyp_family``) that ``file`` re-encodes, or
    None: same width and height, average hash within ``NEAR_DUPLICATE_BITS``, decoded block means
    within ``REENCODING_MEAN_LEVELS`` on average; of several, the closest (then by path)."""
    candidates = [row for row, (other, w, h) in polyp_family[["ahash", "width", "height"]].iterrows()
                  if w == width and h == height and _hamming(ahash, other) <= NEAR_DUPLICATE_BITS]
    if not candidates:
        return None
    blocks = _block_means(imageio.read_rgb(file))
    differences = {}
    for row in candidates:
        other = _block_means(imageio.read_rgb(data_root / polyp_family.at[row, "path"]))
        if other.shape == blocks.shape:
            differences[row] = float(np.abs(other - blocks).mean())
    within = [row for row, difference in differences.items() if difference <= REENCODING_MEAN_LEVELS]
    return min(within, key=lambda row: (differences[row], polyp_family.at[row, "path"])) if within else None


def _block_means(pixels: np.ndarray) -> np.ndarray:
    """float (H // b, W // b, 3) means of the ``REENCODING_BLOCK`` x b blocks (b smaller on a
    frame narrower than a block) of a uint8 (H, W, 3) image; a partial edge block is left out."""
    side = max(1, min(REENCODING_BLOCK, *pixels.shape[:2]))
    height, width = pixels.shape[0] // side * side, pixels.shape[1] // side * side
    return pixels[:height, :width].reshape(height // side, side, width // side, side, 3).mean(axis=(1, 3))


def _negative_copy(digest: str, ahash: str, negatives: pd.DataFrame):
    """Index of the first negative labelled row (by path) with these bytes or this average hash,
    or None."""
    same = negatives[(negatives["sha256"] == digest) | (negatives["ahash"] == ahash)]
    return same.index[0] if len(same) else None


def _match_segmented(images: pd.DataFrame, data_root: Path, images_dir: Path, masks_dir: Path,
                     progress: bool, problems: list | None = None) -> dict[str, Any]:
    """Record ``mask_path`` on the labelled twins of the segmented images (module docstring).

    A twin is always a polyp-family image: by bytes, by average hash, or as a re-encoding
    (``_reencoded_twin``). Modifies ``images`` in place; returns counts ``by_sha256``,
    ``by_ahash``, ``by_reencoding`` (twins found each way), ``duplicates`` (segmented images
    whose twin already has a mask: skipped) and ``without_twin`` (relative paths of segmented
    images left out: no twin, no near-copy). ``HyperKvasirError`` naming both files for a
    segmented image whose only copies by bytes or hash are negatives, and for a near-copy.
    """
    ordered = images.sort_values("path")
    polyp_family = ordered[ordered["target"] == 1]
    negatives = ordered[ordered["target"] == 0]
    # Only a polyp can be a twin: a byte copy of a negative would give a negative frame a lesion mask.
    first_row_of_digest = polyp_family.drop_duplicates("sha256").reset_index().set_index("sha256")["index"]
    files = [p for p in _visible_children(images_dir) if is_image_file(p)]
    if not files:
        raise HyperKvasirError(f"{images_dir}: no segmented images found")
    masks = _masks_by_stem(masks_dir)
    digests = hash_files(files, progress=progress, description="hashing segmented images",
                         problems=problems)
    readable = digests["sha256"].notna().to_numpy()          # unreadable: in problems
    files, digests = [f for f, ok in zip(files, readable) if ok], digests[readable]
    twins = {"by_sha256": 0, "by_ahash": 0, "by_reencoding": 0, "duplicates": 0, "without_twin": []}
    leaking, negative_copies = [], []
    polyp_hashes = set(polyp_family["ahash"])
    for file, (digest, ahash, width, height) in zip(
            files, digests[["sha256", "ahash", "width", "height"]].itertuples(index=False)):
        if digest in first_row_of_digest.index:
            row, way = first_row_of_digest[digest], "by_sha256"
        elif ahash in polyp_hashes:
            row, way = _pixel_twin(file, polyp_family[polyp_family["ahash"] == ahash], data_root), "by_ahash"
        elif (negative := _negative_copy(digest, ahash, negatives)) is not None:
            how = "the same bytes as" if images.at[negative, "sha256"] == digest else "the same average hash as"
            negative_copies.append(f"{file} has {how} the negative labelled image "
                                   f"{images.at[negative, 'path']} ({images.at[negative, 'source']})")
            continue
        elif (reencoded := _reencoded_twin(file, ahash, int(width), int(height), polyp_family,
                                           data_root)) is not None:
            row, way = reencoded, "by_reencoding"
        else:
            distances = [_hamming(ahash, other) for other in images["ahash"]]
            closest = int(min(range(len(distances)), key=distances.__getitem__))
            if distances[closest] <= NEAR_DUPLICATE_BITS:
                leaking.append(f"{file} (labelled {images.at[closest, 'path']} differs in "
                               f"{distances[closest]} of 256 average-hash bits)")
            else:
                twins["without_twin"].append(_relative(file, data_root))
            continue
        if images.at[row, "mask_path"]:
            twins["duplicates"] += 1
            continue
        mask_file = masks.get(file.stem)
        try:
            if mask_file is None:
                raise HyperKvasirError(f"segmented image {file} has no mask in {masks_dir}")
            mask = read_mask(mask_file)
            check_mask_size(file, (height, width), mask_file, mask.shape)
            if not mask.any():
                raise HyperKvasirError(f"mask {mask_file} has no lesion pixel (threshold 128); "
                                       f"every HyperKvasir segmented image shows a polyp")
        except (HyperKvasirError, imageio.ImageReadError, imageio.MaskSizeError) as error:
            empty = isinstance(error, HyperKvasirError) and mask_file is not None
            imageio.note_problem(problems, file, error, imageio.EMPTY_MASK if empty else None)
            continue
        images.at[row, "mask_path"] = _relative(mask_file, data_root)
        twins[way] += 1
    if negative_copies:
        raise HyperKvasirError(
            f"{len(negative_copies)} segmented image(s) are copies of negative labelled images, "
            "not of a polyp, so the negative would be audited with a lesion mask: "
            f"{'; '.join(negative_copies[:3])}; remove the copy or file the picture as a polyp")
    if leaking:
        raise HyperKvasirError(
            f"{len(leaking)} segmented image(s) have no labelled twin (neither the same bytes "
            "nor the same average hash) but a near-copy among the labelled images, which the "
            f"roles would not keep out of development: {'; '.join(leaking[:3])}")
    return twins
