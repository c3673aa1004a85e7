"""External mask cohorts: one adapter per dataset layout, real downloads and synthetic copies alike.

Every adapter (``ADAPTERS``; ``read_cohort``) returns ``(cases, report)``:

- ``cases``: one row per *case* (a unique frame after collapsing byte-identical frames),
  columns ``CASE_COLUMNS``: ``dataset``, ``sample_id`` (unique within the cohort),
  ``image_path`` (the case's first frame, POSIX, relative to the data root), ``mask_paths``
  (tuple; the case's mask is their union), ``frame_paths`` (tuple of the collapsed frames),
  ``centre``, ``modality`` (``""`` where the dataset has none), ``sha256``, ``ahash`` (64 hex,
  as in the manifest), ``height``, ``width`` (pixels), ``lesion_pixels``.
- ``report``: a ``CohortReport``: rows read, duplicates collapsed, exclusions with reasons
  (``EMPTY_MASK``; ``NO_MASK`` unless more than one and more than ``MAX_UNPAIRED_SHARE`` of
  the frames lack a mask, which is a problem).

Errors name the file: ``CohortError`` (missing cohort folder, unknown layout, two masks with
one stem, a cohort's frames at two depths, unpaired frames beyond that share), ``imageio.MaskSizeError``, ``imageio.ImageReadError``. Given a ``problems``
list, bad frames are recorded as ``(path, kind, message)`` and the others read; a missing
folder or an unknown layout still raises. Each adapter's docstring names its layout (paths:
docs/architecture.md, "Data root layout"; variants: docs/protocol.md, "Dataset layouts").

Design: docs/data_models_runs.md, "External cohorts".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from endoexplain_core.data import imageio, roles

EMPTY_MASK = "mask has no positive pixel (excluded from localisation)"
NO_MASK = "no mask file (excluded from localisation)"
# More unpaired frames than this share (and more than one) read as an incomplete download.
MAX_UNPAIRED_SHARE = 0.05
CASE_COLUMNS = ("dataset", "sample_id", "image_path", "mask_paths", "frame_paths", "centre",
                "modality", "sha256", "ahash", "height", "width", "lesion_pixels")

DATASET_FOLDERS = {"etis": "ETIS-LaribPolypDB", "polypgen": "PolypGen", "polypdb": "PolypDB",
                   "kvasir_seg": "Kvasir-SEG", "cvc_clinicdb": "CVC-ClinicDB"}
DATASET_LABELS = DATASET_FOLDERS   # each cohort's folder carries its published name


class CohortError(ValueError):
    """A cohort folder cannot be read as its dataset's layout; the message names the file."""


@dataclass
class CohortReport:
    """What an adapter read and left out.

    ``rows_read``: image files read (with a ``problems`` list, the refused ones are not counted). ``duplicates_collapsed``: frames merged into another
    case because their bytes are identical. ``exclusions``: (relative path, reason) per excluded
    case. ``notes``: layout remarks (e.g. trees that were deliberately not indexed).
    """

    dataset: str
    root: Path
    rows_read: int = 0
    duplicates_collapsed: int = 0
    exclusions: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def excluded_count(self, reason: str | None = None) -> int:
        """Number of excluded cases, for one reason or all."""
        return sum(1 for _, why in self.exclusions if reason is None or why == reason)

    def summary(self) -> dict:
        """One table row: counts read, collapsed, excluded (by reason) and kept."""
        kept = self.rows_read - self.duplicates_collapsed - self.excluded_count()
        by_reason = "; ".join(f"{why}: {self.excluded_count(why)}"
                              for why in dict.fromkeys(why for _, why in self.exclusions))
        return {"dataset": self.dataset, "rows_read": self.rows_read,
                "duplicates_collapsed": self.duplicates_collapsed,
                "excluded": self.excluded_count(), "exclusion_reasons": by_reason,
                "cases": kept, "notes": " ".join(self.notes)}


@dataclass(frozen=True)
class Frame:
    """One image file of a cohort before duplicate collapsing (paths absolute)."""

    sample_id: str
    image: Path
    mask: Path | None       # None: no mask found (recorded as a problem, never read)
    centre: str = ""
    modality: str = ""


# --------------------------------------------------------------------------- file helpers

def content_hashes(path: Path) -> tuple[str, str, tuple[int, int]]:
    """SHA-256 of the file bytes, its 16x16 average hash (64 hex chars) and its (height, width).

    Computed by ``roles.hash_image_bytes``, the function that hashes the HyperKvasir manifest,
    so hashes compare across cohorts. An undecodable file raises ``ImageReadError`` naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise CohortError(f"{path}: file does not exist")
    hashed = roles.hash_image_bytes(path.read_bytes(), path)
    return hashed["sha256"], hashed["ahash"], (hashed["height"], hashed["width"])


def _natural_key(text: str) -> list:
    """Sort key that orders ``2`` before ``10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _images_in(folder: Path) -> list[Path]:
    """Image files directly in ``folder`` (``imageio.is_image_file``), naturally sorted."""
    files = [p for p in folder.iterdir() if imageio.is_image_file(p)]
    return sorted(files, key=lambda p: _natural_key(p.name))


def _mask_index(mask_dir: Path) -> dict[str, Path]:
    """Mask files of ``mask_dir`` by stem; two with one stem (``3.png`` and ``3.jpg``) are a
    ``CohortError`` naming both: which was drawn for the frame cannot be told, and taking the
    first by name would audit against whichever sorts first."""
    index: dict[str, Path] = {}
    for candidate in _images_in(mask_dir):
        if candidate.stem in index:
            raise CohortError(f"{mask_dir}: two masks with the stem {candidate.stem!r} "
                              f"({index[candidate.stem].name} and {candidate.name}); keep one")
        index[candidate.stem] = candidate
    return index


UNPAIRED, UNREADABLE, WRONG_SIZE = imageio.UNPAIRED, imageio.UNREADABLE, imageio.WRONG_SIZE


def _match_mask(index: dict[str, Path], stems: tuple[str, ...]) -> Path | None:
    """The mask among the candidate ``stems`` (first present in ``index``); None when there is
    none (``build_cases`` excludes the frame, or refuses the cohort: ``MAX_UNPAIRED_SHARE``)."""
    for stem in stems:
        if stem in index:
            return index[stem]
    return None


def polypgen_mask_stems(stem: str) -> tuple[str, ...]:
    """Mask stems of a PolypGen frame: ``<stem>_mask``; a stem that already ends in ``_``
    (``C3_EndoCV2021_00489_``, as published) has its mask at ``<stem>mask``."""
    return (f"{stem}_mask", f"{stem}mask") if stem.endswith("_") else (f"{stem}_mask",)


def _one_folder(root: Path, names: tuple[str, ...], what: str) -> Path:
    """The single existing folder among ``names`` (spelling variants, e.g. ``Ground Truth``
    with its space and ``GroundTruth``)."""
    found = [root / name for name in names if (root / name).is_dir()]
    if len(found) > 1:
        raise CohortError(f"{root}: several {what} folders ({', '.join(p.name for p in found)}); "
                          f"keep one")
    if not found:
        raise CohortError(f"{root}: unknown layout: no {what} folder "
                          f"({' or '.join(repr(n) for n in names)}); found {_listing(root)}")
    return found[0]


GROUND_TRUTH_NAMES = ("Ground Truth", "GroundTruth")


def _listing(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    return "[" + ", ".join(names[:12]) + (", ..." if len(names) > 12 else "") + "]"


def _require_folders(parent: Path, *folders: Path) -> None:
    """Raise ``CohortError`` naming ``parent`` and its contents if a folder is missing."""
    for folder in folders:
        if not folder.is_dir():
            raise CohortError(f"{parent}: unknown layout: missing folder '{folder.name}'; "
                              f"found {_listing(parent)}")


def _cohort_root(data_root: Path, dataset: str) -> Path:
    root = Path(data_root) / DATASET_FOLDERS[dataset]
    if not root.is_dir():
        raise CohortError(f"{root}: {DATASET_LABELS[dataset]} folder not found under the data "
                          f"root {data_root}")
    return root


# --------------------------------------------------------------------------- case building

def build_cases(dataset: str, data_root: Path, frames: list[Frame],
                report: CohortReport, problems: list | None = None) -> pd.DataFrame:
    """Hash and check every frame, collapse byte-identical frames, drop empty masks.

    A frame without a mask (``mask`` None) is excluded (``NO_MASK``), or, when more than one
    and more than ``MAX_UNPAIRED_SHARE`` of the frames lack one, a problem (raised without
    ``problems``).
    Frames with identical SHA-256 become one case named after the first frame (in the given
    order) whose mask is the union of their masks. A case whose (union) mask has no positive
    pixel is excluded and recorded in ``report``. Mask and image must have the same size.
    """
    data_root = Path(data_root)
    unpaired = [frame for frame in frames if frame.mask is None]
    refuse_unpaired = len(unpaired) > max(1.0, MAX_UNPAIRED_SHARE * len(frames))
    for frame in unpaired:
        if refuse_unpaired:
            imageio.note_problem(problems, frame.image, CohortError(
                f"{frame.image}: no mask ({len(unpaired)} of {len(frames)} frames of "
                f"{report.root} have none, more than one and more than {MAX_UNPAIRED_SHARE:.0%}: "
                "is the mask folder complete?)"), UNPAIRED)
        else:
            report.exclusions.append((_relative(frame.image, data_root), NO_MASK))
    groups: dict[str, list[tuple[Frame, str, tuple[int, int], int]]] = {}
    for frame in frames:
        if frame.mask is None:
            continue
        try:
            sha256, ahash, shape = content_hashes(frame.image)
            mask = imageio.read_mask(frame.mask)
            imageio.check_mask_size(frame.image, shape, frame.mask, mask.shape)
        except (imageio.ImageReadError, imageio.MaskSizeError) as error:
            imageio.note_problem(problems, frame.image, error)
            continue
        groups.setdefault(sha256, []).append((frame, ahash, shape, int(mask.sum())))
    # Frames read (problems left out); a frame excluded for its missing mask counts as read.
    report.rows_read = (sum(len(members) for members in groups.values())
                        + (0 if refuse_unpaired else len(unpaired)))

    rows = []
    for sha256, members in groups.items():
        first, ahash, (height, width), _ = members[0]
        report.duplicates_collapsed += len(members) - 1
        lesion_pixels = (int(_union_mask([m[0].mask for m in members]).sum())
                         if len(members) > 1 else members[0][3])
        if lesion_pixels == 0:
            report.exclusions.append((_relative(first.image, data_root), EMPTY_MASK))
            continue
        rows.append({"dataset": dataset, "sample_id": first.sample_id,
                     "image_path": _relative(first.image, data_root),
                     "mask_paths": tuple(_relative(m[0].mask, data_root) for m in members),
                     "frame_paths": tuple(_relative(m[0].image, data_root) for m in members),
                     "centre": first.centre, "modality": first.modality, "sha256": sha256,
                     "ahash": ahash, "height": height, "width": width,
                     "lesion_pixels": lesion_pixels})
    cases = pd.DataFrame(rows, columns=list(CASE_COLUMNS))
    if cases["sample_id"].duplicated().any():
        repeated = cases.loc[cases["sample_id"].duplicated(), "sample_id"].tolist()[:5]
        raise CohortError(f"{report.root}: sample ids are not unique: {repeated}")
    return cases.astype({"height": "int64", "width": "int64", "lesion_pixels": "int64"})


def _relative(path: Path, data_root: Path) -> str:
    """POSIX path of ``path`` relative to the data root (how case tables store paths)."""
    return path.relative_to(data_root).as_posix()


def _union_mask(paths: list[Path]) -> np.ndarray:
    union = imageio.read_mask(paths[0])
    for path in paths[1:]:
        union = union | imageio.read_mask(path)
    return union


def load_case(case: pd.Series | dict, data_root: Path, *, decode_size: int | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Image (uint8 hxwx3) and mask (bool HxW, union over collapsed frames) of one case;
    ``decode_size`` as in ``imageio.read_rgb`` (None: the full frame, h, w = H, W)."""
    data_root = Path(data_root)
    image_path = data_root / case["image_path"]
    image = imageio.read_rgb(image_path, decode_size)
    mask = _union_mask([data_root / p for p in case["mask_paths"]])
    full_shape = image.shape if decode_size is None else imageio.check_image_header(image_path)[::-1]
    imageio.check_mask_size(image_path, full_shape, data_root / case["mask_paths"][0], mask.shape)
    return image, mask


def iter_cases(cases: pd.DataFrame, data_root: Path, *, decode_size: int | None
               ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Stream ``(sample_id, image uint8 hxwx3, mask bool HxW)`` one case at a time;
    ``decode_size``: the model input side (``load_case``), None for full frames."""
    for case in cases.to_dict("records"):
        image, mask = load_case(case, data_root, decode_size=decode_size)
        yield case["sample_id"], image, mask


# --------------------------------------------------------------------------- adapters

def read_etis(data_root: Path, problems: list | None = None) -> tuple[pd.DataFrame, CohortReport]:
    """ETIS-LaribPolypDB as published (``ETIS-LaribPolypDB/<n>.tif`` frames, ``Ground
    Truth/p<n>.tif`` or ``GroundTruth`` masks) or as PraNet's test set ships it
    (``images/<n>.png``, ``masks/<n>.png``); both layouts at once is a ``CohortError``.
    ``sample_id`` is the frame number."""
    root = _cohort_root(data_root, "etis")
    original, pranet = root / "ETIS-LaribPolypDB", root / "images"
    if original.is_dir() and pranet.is_dir():
        raise CohortError(f"{root}: two layouts at once (the published 'ETIS-LaribPolypDB' frame "
                          "folder and PraNet's 'images'); keep one")
    if pranet.is_dir():
        image_dir, mask_dir = pranet, _one_folder(root, ("masks",), "mask")
        layout = "PraNet's images/ + masks/ layout"
    elif original.is_dir():
        image_dir, mask_dir = original, _one_folder(root, GROUND_TRUTH_NAMES, "mask")
        layout = f"the published layout, masks from '{mask_dir.name}'"
    else:
        raise CohortError(f"{root}: unknown layout: expected the frame folder 'ETIS-LaribPolypDB' "
                          f"(published) or 'images' + 'masks' (PraNet); found {_listing(root)}")
    masks = _mask_index(mask_dir)
    frames = [Frame(image.stem, image, _match_mask(masks, (f"p{image.stem}", image.stem)))
              for image in _images_in(image_dir)]
    if not frames:
        raise CohortError(f"{image_dir}: no image files")
    report = CohortReport("etis", root)
    report.notes.append(f"read as {layout}.")
    return build_cases("etis", data_root, frames, report, problems), report


def _polypgen_centres(root: Path) -> tuple[Path, list[Path]]:
    """The folder holding PolypGen's ``data_C<k>`` folders (``root`` itself, or the one
    sub-folder that holds them, as the published zip extracts:
    ``PolypGen2021_MultiCenterData_v3``) and those folders in natural order. ``CohortError``
    naming both places when ``root`` and a sub-folder both hold some."""
    def centres_in(folder: Path) -> list[Path]:
        return sorted((p for p in folder.iterdir() if p.is_dir() and re.fullmatch(r"data_C\d+", p.name)),
                      key=lambda p: _natural_key(p.name))

    nested = [p for p in sorted(root.iterdir()) if p.is_dir() and centres_in(p)]
    if centres_in(root):
        if nested:   # a copy at each depth: reading one alone would never mention the other
            raise CohortError(f"{root}: data_C<k> folders both directly in it "
                              f"({', '.join(p.name for p in centres_in(root))}) and in the "
                              f"sub-folder(s) {', '.join(p.name for p in nested)}; keep one copy")
        return root, centres_in(root)
    if len(nested) > 1:
        raise CohortError(f"{root}: data_C<k> folders in several sub-folders "
                          f"({', '.join(p.name for p in nested)}); keep one")
    if not nested:
        raise CohortError(f"{root}: unknown layout: expected data_C1..data_C6 folders, directly "
                          f"or in one sub-folder (PolypGen2021_MultiCenterData_v3); found {_listing(root)}")
    return nested[0], centres_in(nested[0])


def read_polypgen(data_root: Path, problems: list | None = None) -> tuple[pd.DataFrame, CohortReport]:
    """PolypGen single frames: ``data_C<k>/images_C<k>/<stem>.jpg`` + ``masks_C<k>/<stem>_mask.jpg``
    (``polypgen_mask_stems``), directly under ``PolypGen`` or in its published top folder.

    The centre label ``C<k>`` is kept; ``sample_id`` is ``C<k>/<stem>``. Empty-mask frames are
    excluded from localisation and counted; ``sequenceData`` (videos) is not indexed.
    """
    root = _cohort_root(data_root, "polypgen")
    top, centre_dirs = _polypgen_centres(root)
    report = CohortReport("polypgen", root)
    if top != root:
        report.notes.append(f"read from the published top folder '{top.name}'.")
    if (top / "sequenceData").exists() or (root / "sequenceData").exists():
        report.notes.append("sequenceData (video sequences) not indexed.")
    frames = []
    for centre_dir in centre_dirs:
        centre = centre_dir.name.removeprefix("data_")
        image_dir, mask_dir = centre_dir / f"images_{centre}", centre_dir / f"masks_{centre}"
        _require_folders(centre_dir, image_dir, mask_dir)
        masks = _mask_index(mask_dir)
        frames += [Frame(f"{centre}/{image.stem}", image,
                         _match_mask(masks, polypgen_mask_stems(image.stem)), centre=centre)
                   for image in _images_in(image_dir)]
    return build_cases("polypgen", data_root, frames, report, problems), report


def read_polypdb(data_root: Path, problems: list | None = None) -> tuple[pd.DataFrame, CohortReport]:
    """PolypDB centre-wise tree: ``PolypDB_center_wise/<centre>/<modality>/{images,masks}``.

    Centre and modality are kept; ``sample_id`` is ``<centre>/<modality>/<stem>``. The
    modality-wise tree re-organises the same images and is deliberately not indexed.
    """
    root = _cohort_root(data_root, "polypdb")
    tree = root / "PolypDB_center_wise"
    if not tree.is_dir():
        raise CohortError(f"{root}: unknown layout: the centre-wise tree 'PolypDB_center_wise' "
                          f"is missing (only it is indexed); found {_listing(root)}")
    report = CohortReport("polypdb", root)
    ignored = [p.name for p in root.iterdir() if p.is_dir() and p.name != tree.name]
    if ignored:
        report.notes.append(f"not indexed (same images re-organised): {', '.join(sorted(ignored))}.")
    frames = []
    for centre_dir in sorted((p for p in tree.iterdir() if p.is_dir()), key=lambda p: p.name):
        for modality_dir in sorted((p for p in centre_dir.iterdir() if p.is_dir()),
                                   key=lambda p: p.name):
            image_dir, mask_dir = modality_dir / "images", modality_dir / "masks"
            _require_folders(modality_dir, image_dir, mask_dir)
            masks = _mask_index(mask_dir)
            frames += [Frame(f"{centre_dir.name}/{modality_dir.name}/{image.stem}", image,
                             _match_mask(masks, (image.stem,)),
                             centre=centre_dir.name, modality=modality_dir.name)
                       for image in _images_in(image_dir)]
    if not frames:
        raise CohortError(f"{tree}: no <centre>/<modality>/images files found")
    return build_cases("polypdb", data_root, frames, report, problems), report


def read_kvasir_seg(data_root: Path, problems: list | None = None) -> tuple[pd.DataFrame, CohortReport]:
    """Kvasir-SEG: ``images/<id>.jpg`` + ``masks/<id>.jpg`` (the pictures of HyperKvasir's
    segmented set, so a hash audit against the manifest is expected to exclude them all)."""
    return _paired_folders("kvasir_seg", data_root, ("images",), ("masks",), problems)


def read_cvc_clinicdb(data_root: Path, problems: list | None = None) -> tuple[pd.DataFrame, CohortReport]:
    """CVC-ClinicDB: ``Original/<n>.tif`` + ``Ground Truth/<n>.tif`` (.png in some mirrors)."""
    return _paired_folders("cvc_clinicdb", data_root, ("Original",), GROUND_TRUTH_NAMES, problems)


def _paired_folders(dataset: str, data_root: Path, image_names: tuple[str, ...],
                    mask_names: tuple[str, ...], problems: list | None = None
                    ) -> tuple[pd.DataFrame, CohortReport]:
    """Cohorts with one image folder and one mask folder whose files share stems."""
    root = _cohort_root(data_root, dataset)
    image_dir = _one_folder(root, image_names, "image")
    mask_dir = _one_folder(root, mask_names, "mask")
    masks = _mask_index(mask_dir)
    frames = [Frame(image.stem, image, _match_mask(masks, (image.stem,)))
              for image in _images_in(image_dir)]
    if not frames:
        raise CohortError(f"{image_dir}: no image files")
    report = CohortReport(dataset, root)
    return build_cases(dataset, data_root, frames, report, problems), report


ADAPTERS = {"etis": read_etis, "polypgen": read_polypgen, "polypdb": read_polypdb,
            "kvasir_seg": read_kvasir_seg, "cvc_clinicdb": read_cvc_clinicdb}


def read_cohort(dataset: str, data_root: Path, problems: list | None = None
                ) -> tuple[pd.DataFrame, CohortReport]:
    """Dispatch to the adapter of ``dataset`` (a key of ``ADAPTERS``); with ``problems``, bad
    frames are recorded there and left out instead of raising (module docstring)."""
    if dataset not in ADAPTERS:
        raise CohortError(f"unknown cohort '{dataset}'; known: {', '.join(ADAPTERS)}")
    return ADAPTERS[dataset](Path(data_root), problems)
