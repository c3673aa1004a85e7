"""Content hashing, hash groups, study roles, the manifest and Table 2 (docs/protocol.md, "Roles").

``hash_files``: SHA-256 and 16x16 average hash (``AHASH_SIZE``; 64 hex) per image;
``assign_roles``: ``group_id`` (``hash_groups``) and ``role`` (``ROLES``), checked by
``check_roles`` (``RoleIntegrityError``); ``build_manifest``: ``MANIFEST_COLUMNS``, rows by
path, "\\n" line endings (``manifest_bytes``); ``record_manifest``: compared with the committed
reference in ``data_manifest/<profile>/`` (``ManifestMismatchError``) and written with its
SHA-256 to ``<run_dir>/manifest/`` only when accepted; ``verify_manifest``: a later stage's
check of the files (``ManifestVerificationError``); ``table2``: counts per role and kind.
Design: docs/data_models_runs.md, "Roles and the manifest".
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Sequence

import imagehash
import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from endoexplain_core.run_layout import RunLayout
from endoexplain_core.run_layout import DIGEST_FILE, MANIFEST_FILE, REJECTED_FILE  # noqa: F401 (re-export)
from endoexplain_core.progress import progress_bar
from endoexplain_core.config import resolve_data_root
from endoexplain_core.data import imageio
from endoexplain_core.data.imageio import ImageReadError
from endoexplain_core import artefacts, files

AHASH_SIZE = 16
ROLES = ("train", "val", "test", "spatial_audit")
SPLIT_ROLES = ("train", "val", "test")
MANIFEST_COLUMNS = ("sample_id", "path", "group", "source", "target", "role", "sha256", "ahash",
                    "group_id", "width", "height", "mask_path")


class RoleIntegrityError(RuntimeError):
    """A hash group crosses study roles, or a segmented image is outside ``spatial_audit``."""


class ManifestMismatchError(RuntimeError):
    """The manifest differs from the committed reference (message summarises the difference)."""


class ManifestVerificationError(RuntimeError):
    """The files on disk no longer match the manifest, or the manifest its digest."""


# --- Hashing ----------------------------------------------------------------------------

def sha256_file(path: str | Path) -> str:
    """Lowercase hex SHA-256 of a file's bytes; ``ImageReadError`` naming a missing file."""
    path = Path(path)
    if not path.is_file():
        raise ImageReadError(f"{path}: file does not exist")
    return files.sha256_file(path)


def hash_image_bytes(data: bytes, name: str | Path = "<bytes>") -> dict[str, object]:
    """SHA-256, 16x16 average hash (64 hex chars), width and height of one encoded image.

    The image is fully decoded; ``ImageReadError`` naming ``name`` if it cannot be.
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            ahash = str(imagehash.average_hash(image, hash_size=AHASH_SIZE))
            width, height = image.size
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise ImageReadError(f"{name}: cannot decode image file ({error})") from error
    return {"sha256": files.sha256_bytes(data), "ahash": ahash, "width": width, "height": height}


def hash_files(paths: Sequence[str | Path], *, progress: bool = True,
               description: str = "hashing", problems: list | None = None) -> pd.DataFrame:
    """Hash every file: DataFrame (one row per path, input order) with columns
    ``sha256`` (str), ``ahash`` (str, 64 hex), ``width``, ``height`` (int, pixels). An
    unreadable file raises ``ImageReadError``, or with ``problems`` is recorded there
    (``imageio.note_problem``) and gets a row of None."""
    rows = []
    for path in progress_bar(paths, desc=description, disable=not progress, unit="file"):
        path = Path(path)
        try:
            if not path.is_file():
                raise ImageReadError(f"{path}: file does not exist")
            rows.append(hash_image_bytes(path.read_bytes(), path))
        except OSError as error:        # ImageReadError, or the file cannot be opened at all
            imageio.note_problem(problems, path, error, imageio.UNREADABLE)
            rows.append({"sha256": None, "ahash": None, "width": None, "height": None})
    return pd.DataFrame(rows, columns=["sha256", "ahash", "width", "height"])


# --- Hash groups ------------------------------------------------------------------------

def hash_groups(sha256: Sequence[str], ahash: Sequence[str]) -> list[str]:
    """Group id of each file: connected components of "same SHA-256 or same average hash".

    Union-find over file indices. A group's id is ``"g"`` + the first 16 hex characters of the
    smallest SHA-256 among its members, so ids depend on content only (not on paths or order).
    """
    if len(sha256) != len(ahash):
        raise ValueError("sha256 and ahash must have the same length")
    parent = list(range(len(sha256)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    for keys in (sha256, ahash):
        first_with_key: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in first_with_key:
                root_a, root_b = find(i), find(first_with_key[key])
                parent[max(root_a, root_b)] = min(root_a, root_b)
            else:
                first_with_key[key] = i
    smallest: dict[int, str] = {}
    for i, digest in enumerate(sha256):
        root = find(i)
        smallest[root] = min(smallest.get(root, digest), digest)
    return ["g" + smallest[find(i)][:16] for i in range(len(sha256))]


# --- Roles ------------------------------------------------------------------------------

def stream(seed: int, name: str) -> np.random.Generator:
    """An independent random generator for (``seed``, ``name``): one stream per stratum (or
    synthetic category), so one's size never reshuffles another."""
    name_key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng([int(seed), name_key])


def split_groups(group_sizes: pd.Series, seed: int, stratum: str,
                 fractions: Sequence[float]) -> dict[str, str]:
    """Assign the groups of one stratum to train/val/test, whole groups at a time: {group_id: role}.

    ``group_sizes``: images per group, indexed by group id; ``fractions``: three shares summing
    to 1 (ValueError otherwise). Rule: docs/data_models_runs.md, "Roles and the manifest".
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not np.isclose(sum(fractions), 1):
        raise ValueError(f"split fractions must be three non-negative numbers summing to 1, "
                         f"got {fractions}")
    ids = sorted(group_sizes.index)
    order = stream(seed, stratum).permutation(len(ids))
    sizes = np.array([group_sizes[ids[i]] for i in order], dtype=float)
    midpoints = (np.cumsum(sizes) - sizes / 2) / sizes.sum()
    boundaries = np.cumsum(fractions)[:2]
    role_index = np.searchsorted(boundaries, midpoints, side="right")
    return {ids[i]: SPLIT_ROLES[r] for i, r in zip(order, role_index)}


def assign_roles(table: pd.DataFrame, *, seed: int,
                 fractions: Sequence[float]) -> pd.DataFrame:
    """Add ``group_id`` and ``role`` to an image table (columns ``path``, ``source``,
    ``sha256``, ``ahash``, ``mask_path``, "" outside the segmented set): a group with a
    segmented member is ``spatial_audit``; the others are split by ``split_groups`` within the
    stratum of their most common source (ties: alphabetical). ``RoleIntegrityError`` on a
    broken invariant (``check_roles``)."""
    result = table.copy()
    result["group_id"] = hash_groups(list(result["sha256"]), list(result["ahash"]))
    audit_groups = set(result.loc[result["mask_path"] != "", "group_id"])
    result["role"] = ""
    result.loc[result["group_id"].isin(audit_groups), "role"] = "spatial_audit"
    development = result[result["role"] == ""]
    stratum_of_group = (development.groupby(["group_id", "source"]).size().reset_index(name="n")
                        .sort_values(["group_id", "n", "source"], ascending=[True, False, True])
                        .drop_duplicates("group_id").set_index("group_id")["source"])
    group_sizes = development.groupby("group_id").size()
    role_of_group: dict[str, str] = {}
    for stratum in sorted(set(stratum_of_group)):
        members = stratum_of_group.index[stratum_of_group == stratum]
        role_of_group.update(split_groups(group_sizes[members], seed, stratum, fractions))
    undecided = result["role"] == ""
    result.loc[undecided, "role"] = result.loc[undecided, "group_id"].map(role_of_group)
    check_roles(result)
    return result


def check_roles(table: pd.DataFrame) -> None:
    """Raise ``RoleIntegrityError`` if a hash group spans roles, a role is unknown, or an image
    of the segmented set is not ``spatial_audit``."""
    unknown = sorted(set(table["role"]) - set(ROLES))
    if unknown:
        raise RoleIntegrityError(f"unknown roles {unknown}; expected {ROLES}")
    roles_per_group = table.groupby("group_id")["role"].nunique()
    crossing = roles_per_group[roles_per_group > 1]
    if len(crossing):
        example = table[table["group_id"] == crossing.index[0]][["path", "role"]]
        raise RoleIntegrityError(
            f"{len(crossing)} hash group(s) cross study roles, e.g. {crossing.index[0]}: "
            + "; ".join(f"{p} ({r})" for p, r in example.itertuples(index=False)))
    leaked = table[(table["mask_path"] != "") & (table["role"] != "spatial_audit")]
    if len(leaked):
        raise RoleIntegrityError(f"{len(leaked)} segmented image(s) outside spatial_audit, "
                                 f"e.g. {leaked['path'].iloc[0]} ({leaked['role'].iloc[0]})")


# --- Manifest ---------------------------------------------------------------------------

def build_manifest(table: pd.DataFrame) -> pd.DataFrame:
    """The manifest: ``MANIFEST_COLUMNS`` in order, rows sorted by ``path``, checked roles."""
    missing = [c for c in MANIFEST_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"image table lacks manifest columns {missing}")
    manifest = table.loc[:, list(MANIFEST_COLUMNS)].sort_values("path", kind="stable")
    manifest = manifest.reset_index(drop=True)
    duplicated = manifest["sample_id"][manifest["sample_id"].duplicated()]
    if len(duplicated):
        raise ValueError(f"sample_id must be unique; repeated: {sorted(set(duplicated))[:5]}")
    check_roles(manifest)
    return manifest


def manifest_bytes(manifest: pd.DataFrame) -> bytes:
    """The exact bytes of ``manifest.csv`` (UTF-8, "\\n" line endings, no index)."""
    return manifest.to_csv(index=False, lineterminator="\n").encode("utf-8")


def write_manifest(manifest: pd.DataFrame, manifest_dir: str | Path) -> str:
    """Write ``manifest.csv`` and ``manifest.sha256`` (hex digest + newline); return the digest."""
    return _write_with_digest(manifest_bytes(manifest), Path(manifest_dir))


def _write_with_digest(data: bytes, manifest_dir: Path) -> str:
    """Write a manifest's bytes and then its digest file (each temporary + rename); the digest."""
    digest = files.sha256_bytes(data)
    files.write_bytes_atomic(manifest_dir / MANIFEST_FILE, data)
    files.write_bytes_atomic(manifest_dir / DIGEST_FILE, (digest + "\n").encode())
    return digest


def read_manifest(path: str | Path) -> pd.DataFrame:
    """Read a manifest CSV with its column types (strings stay strings, empty mask_path is "")."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: manifest does not exist")
    return _parse_manifest(path, path)


def _parse_manifest(source, name) -> pd.DataFrame:
    """``read_manifest``'s parsing of ``source`` (a path or a byte stream) called ``name``."""
    manifest = pd.read_csv(source, dtype=str, keep_default_na=False)
    missing = [c for c in MANIFEST_COLUMNS if c not in manifest.columns]
    if missing:
        raise ManifestVerificationError(f"{name}: missing manifest columns {missing}")
    for column in ("target", "width", "height"):
        manifest[column] = manifest[column].astype(int)
    return manifest


def read_digest(path: str | Path) -> str:
    """The hex digest stored in a ``manifest.sha256`` file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: digest file does not exist")
    return path.read_text().strip()


def describe_differences(new: pd.DataFrame, reference: pd.DataFrame, examples: int = 3) -> str:
    """Human-readable summary of how two manifests differ (rows keyed by ``path``)."""
    new_rows, ref_rows = new.set_index("path"), reference.set_index("path")
    added = new_rows.index.difference(ref_rows.index)
    removed = ref_rows.index.difference(new_rows.index)
    parts = [f"{len(new_rows)} rows now vs {len(ref_rows)} in the reference"]
    if len(added):
        parts.append(f"{len(added)} added (e.g. {', '.join(added[:examples])})")
    if len(removed):
        parts.append(f"{len(removed)} removed (e.g. {', '.join(removed[:examples])})")
    common = new_rows.index.intersection(ref_rows.index)
    columns = [c for c in new_rows.columns if c in ref_rows.columns]
    left = new_rows.loc[common, columns].astype(str)
    right = ref_rows.loc[common, columns].astype(str)
    for column in columns:
        changed = common[(left[column] != right[column]).to_numpy()]
        if len(changed) == 0:
            continue
        if column == "role":
            moves = (right.loc[changed, "role"] + " -> " + left.loc[changed, "role"]).value_counts()
            detail = ", ".join(f"{move}: {n}" for move, n in sorted(moves.items()))
            parts.append(f"role changed for {len(changed)} rows ({detail})")
        else:
            parts.append(f"{column} changed for {len(changed)} rows (e.g. {changed[0]})")
    if len(parts) == 1:
        parts.append("same rows and values, but the bytes differ (column order or formatting)")
    return "; ".join(parts)


MAX_MANIFEST_BYTES = 256 << 20   # the paper's manifest (7,210 rows) is about 1 MB


def _reference_difference(new_bytes: bytes, reference_dir: Path) -> str | None:
    """``None`` when ``new_bytes`` are the reference manifest's bytes, else a summary of the
    difference (or of the missing reference)."""
    new_digest = files.sha256_bytes(new_bytes)
    reference_csv = reference_dir / MANIFEST_FILE
    if not reference_csv.is_file():
        return f"no reference manifest at {reference_csv}"
    # Bounded: the reference folder is named by the user (--manifest-reference).
    reference_bytes = files.read_bounded(reference_csv, MAX_MANIFEST_BYTES, "reference manifest")
    reference_digest = files.sha256_bytes(reference_bytes)
    if reference_digest == new_digest:
        return None
    summary = describe_differences(_parse_manifest(io.BytesIO(new_bytes), "the new manifest"),
                                   _parse_manifest(io.BytesIO(reference_bytes), reference_csv))
    return f"digest {new_digest[:12]} vs reference {reference_digest[:12]}: {summary}"


def _mismatch(manifest_path: Path, reference_dir: Path, summary: str) -> ManifestMismatchError:
    return ManifestMismatchError(
        f"manifest {manifest_path} differs from the committed reference in "
        f"{reference_dir}: {summary}. If the change is intended, adopt the new manifest "
        f"(notebook parameter adopt_manifest=True, or run_all.sh --adopt-manifest) and "
        f"commit {reference_dir}.")


def record_manifest(manifest: pd.DataFrame, manifest_dir: str | Path, reference_dir: str | Path,
                    *, adopt: bool = False) -> dict[str, str]:
    """Stage 00's manifest step: compare ``manifest`` with the committed reference, then write
    ``manifest.csv`` + ``manifest.sha256`` into ``manifest_dir`` only when accepted (equal, or
    ``adopt``: the reference is replaced after). Returns ``{"status": "match" | "adopted",
    "digest", "summary"}``. Refused: ``ManifestMismatchError`` naming ``manifest.rejected.csv``
    (the rows, no digest); ``manifest_dir`` is left without a manifest or digest.
    """
    manifest_dir, reference_dir = Path(manifest_dir), Path(reference_dir)
    data = manifest_bytes(manifest)
    summary = _reference_difference(data, reference_dir)
    if summary is not None and not adopt:
        # The digest goes first: a manifest.csv without one is refused by every stage.
        (manifest_dir / DIGEST_FILE).unlink(missing_ok=True)
        (manifest_dir / MANIFEST_FILE).unlink(missing_ok=True)
        files.write_bytes_atomic(manifest_dir / REJECTED_FILE, data)
        raise _mismatch(manifest_dir / REJECTED_FILE, reference_dir, summary)
    digest = write_manifest(manifest, manifest_dir)
    (manifest_dir / REJECTED_FILE).unlink(missing_ok=True)
    if summary is None:
        return {"status": "match", "digest": digest, "summary": "identical"}
    _write_with_digest(data, reference_dir)   # adopted: the new bytes replace the reference
    return {"status": "adopted", "digest": digest, "summary": summary}


def verify_manifest(run_dir: str | Path, data_root: str | Path | None, *,
                    progress: bool = True) -> pd.DataFrame:
    """Check that the run's manifest still describes the files; return the manifest.

    ``data_root``: the notebook parameter ("" = ``<run_dir>/data``). ``manifest.csv`` must match
    ``manifest.sha256``, every listed file exist with its SHA-256 and every listed mask exist;
    ``ManifestVerificationError`` with a summary otherwise.
    """
    manifest_dir = RunLayout(run_dir).manifest_dir
    root = resolve_data_root(data_root, run_dir)
    csv_path, digest_path = manifest_dir / MANIFEST_FILE, manifest_dir / DIGEST_FILE
    if not csv_path.is_file() or not digest_path.is_file():
        raise ManifestVerificationError(f"no manifest in {manifest_dir}: run 00_roles first")
    recorded, actual = read_digest(digest_path), files.sha256_bytes(csv_path.read_bytes())
    if recorded != actual:
        raise ManifestVerificationError(f"{csv_path} was changed after it was written: its "
                                        f"SHA-256 is {actual[:12]}, {digest_path} says "
                                        f"{recorded[:12]}; rerun 00_roles")
    manifest = read_manifest(csv_path)
    missing, changed = [], []
    for path, digest, mask in progress_bar(manifest[["path", "sha256", "mask_path"]].itertuples(
            index=False), total=len(manifest), desc="verifying files", disable=not progress):
        file = root / path
        if not file.is_file():
            missing.append(path)
        elif sha256_file(file) != digest:
            changed.append(path)
        if mask and not (root / mask).is_file():
            missing.append(mask)
    if missing or changed:
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if changed:
            problems.append(f"{len(changed)} with different bytes (e.g. {', '.join(changed[:3])})")
        raise ManifestVerificationError(
            f"the files under {root} no longer match manifest {csv_path} "
            f"(digest {recorded[:12]}): {'; '.join(problems)}. Rerun 00_roles.")
    return manifest


# --- Table 2 ----------------------------------------------------------------------------

def image_kind(source: str, target: int) -> str:
    """Table 2 column of an image: ``negative``, ``dyed-lifted polyp`` or ``standard polyp``."""
    if int(target) == 0:
        return "negative"
    return "dyed-lifted polyp" if source == "dyed-lifted-polyps" else "standard polyp"


AUDITED_COLUMN = "audited (with mask)"


@artefacts.computed_by
def table2(manifest: pd.DataFrame) -> pd.DataFrame:
    """Table 2: image counts per study role (rows, plus ``total``) and kind (columns, plus
    ``total``). Columns: ``role``, ``negative``, ``dyed-lifted polyp``, ``standard polyp``,
    ``total``, ``AUDITED_COLUMN`` (int: images with a mask in ``spatial_audit``, the pool
    behind Table 4 panel B)."""
    kinds = ["negative", "dyed-lifted polyp", "standard polyp"]
    kind = [image_kind(s, t) for s, t in zip(manifest["source"], manifest["target"])]
    counts = pd.crosstab(manifest["role"], pd.Series(kind, index=manifest.index, name="kind"))
    counts = counts.reindex(index=list(ROLES), columns=kinds, fill_value=0)
    counts.loc["total"] = counts.sum()
    counts["total"] = counts.sum(axis=1)
    counts.columns.name = None
    has_mask = (manifest["mask_path"].fillna("").astype(str) != "") if "mask_path" in manifest else False
    audited = manifest[(manifest["role"] == "spatial_audit") & has_mask]["role"].value_counts()
    counts[AUDITED_COLUMN] = audited.reindex(counts.index, fill_value=0)
    counts.loc["total", AUDITED_COLUMN] = int(audited.sum())
    columns = kinds + ["total", AUDITED_COLUMN]
    return counts.rename_axis("role").reset_index().astype({c: int for c in columns})
