"""The case-level audit table: every map of one checkpoint on one masked cohort.

One row per (dataset, sample_id, checkpoint_id, method), for the five CAMs and the two spatial
baselines (seeded random heatmap, centred Gaussian). Conventions:

- Images and masks are resized to the model's input size (images as in ``data``: area/bilinear
  then ImageNet normalisation; masks nearest-neighbour), and every metric is computed at that
  size. Masks that are empty after resizing are excluded and counted, never scored.
- Scores come from the same forward that produced the CAMs: z = logit(pos) - logit(neg),
  ``raw_score = sigmoid(z)``, ``scaled_score = sigmoid(z / T)`` with the checkpoint's
  validation-fitted temperature T.
- Deletion (CAMs only): the top-``top_fraction`` pixels of each CAM are set to 0 in normalised
  space; ``logit_drop`` = original minus deleted positive logit, ``score_drop`` likewise for the
  scaled score. The control deletes the same number of random pixels ``repetitions`` times per
  image (seeds derived from (sample id, repetition)); it is written to a second per-image table.
- The table is streamed batch by batch to a temporary Parquet file, validated, and renamed
  into place only when complete, so a failing run never replaces a good table.

Size: over 400 lines on purpose: the batch loop, its validation and its Parquet streaming share
one row schema; the kernels it calls live in kernels/.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable, Iterator

import cv2
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from endoexplain_core.progress import progress_bar
from endoexplain_core.analysis import map_diagnostics
from endoexplain_core import files
from endoexplain_core.run_layout import RunLayout
from endoexplain_core.kernels import baselines, cams, deletion, map_priors, metrics, threshold
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS
from endoexplain_core.models import networks, training
from endoexplain_core.data.datasets import load_manifest, resize_rgb, to_normalised_tensor
from endoexplain_core.data.imageio import read_image_and_mask, same_frame
from endoexplain_core.numerics import resolve_device

TARGET = "polyp_family positive logit"
CALIBRATION_STATUS = "scaled"
CENTRE_SIGMA_FRACTION = 0.25
KEY_COLUMNS = ("dataset", "sample_id", "checkpoint_id", "method")

# Column -> Arrow type of the audit table (the schema is fixed so batches stream into one file).
AUDIT_SCHEMA = pa.schema([
    ("dataset", pa.string()), ("sample_id", pa.string()), ("checkpoint_id", pa.string()),
    ("arch", pa.string()), ("seed", pa.int64()), ("control", pa.string()),
    ("target", pa.string()), ("target_layer", pa.string()), ("method", pa.string()),
    ("top_fraction", pa.float64()), ("calibration", pa.string()), ("temperature", pa.float64()),
    ("logit_pos", pa.float64()), ("z", pa.float64()),
    ("raw_score", pa.float64()), ("scaled_score", pa.float64()),
    ("peak_outside_mask", pa.bool_()), ("peak_row", pa.int64()), ("peak_col", pa.int64()),
    ("iou", pa.float64()), ("iou_below_0_10", pa.bool_()), ("energy_in_mask", pa.float64()),
    ("centre_of_mass_distance", pa.float64()), ("lesion_area_fraction", pa.float64()),
    ("lesion_centre_distance", pa.float64()),
    ("constant_map", pa.bool_()), ("max_multiplicity", pa.int64()),
    ("boundary_ties", pa.int64()),
    ("logit_drop", pa.float64()), ("score_drop", pa.float64()),
    # Map-prior diagnostics (analysis.map_diagnostics): the target layer's feature grid, whether
    # the peak's grid cell is in the grid's border ring / a corner, the IoU of the map's top set
    # with the method's prior map (mean map over held-out negatives; NaN without a prior), and
    # the logit drop from deleting the lesion itself (per image, repeated on every method row).
    ("feature_grid_height", pa.int64()), ("feature_grid_width", pa.int64()),
    ("peak_border_ring", pa.bool_()), ("peak_corner_cell", pa.bool_()),
    ("prior_top_iou", pa.float64()), ("lesion_logit_drop", pa.float64()),
    # Pixels from the peak to the nearest lesion pixel (0 inside; NaN for a constant map).
    ("peak_lesion_distance", pa.float64()),
])
DIAGNOSTIC_COLUMNS = ("feature_grid_height", "feature_grid_width", "peak_border_ring",
                      "peak_corner_cell", "prior_top_iou", "lesion_logit_drop", "peak_lesion_distance")
# Old name -> name: audit tables written before the top fraction had one name ("threshold"
# meant it here, a score level in the sensitivity table and an IoU level in 07) stay readable.
LEGACY_COLUMNS = {"threshold": "top_fraction"}
# Tables written before the diagnostics existed (and hand-made test tables) stay valid.
REQUIRED_COLUMNS = tuple(n for n in AUDIT_SCHEMA.names if n not in DIAGNOSTIC_COLUMNS)


class AuditTableError(ValueError):
    """An audit table breaks one of the validation rules (docs/protocol.md, "Audit-table validation")."""


def random_deletion_schema(repetitions: int) -> pa.Schema:
    """Per-image random-deletion table: the ``repetitions`` logit drops and their means."""
    fields = [("dataset", pa.string()), ("sample_id", pa.string()),
              ("checkpoint_id", pa.string()), ("top_fraction", pa.float64()),
              ("repetitions", pa.int64())]
    fields += [(f"logit_drop_{r:02d}", pa.float64()) for r in range(repetitions)]
    fields += [("logit_drop_mean", pa.float64()), ("score_drop_mean", pa.float64())]
    return pa.schema(fields)


def sigmoid(values: torch.Tensor) -> torch.Tensor:
    """Logistic function, float64 for stable score differences."""
    return torch.sigmoid(values.double())


# --- inputs -----------------------------------------------------------------------------------

def masked_pool(manifest: pd.DataFrame) -> pd.DataFrame:
    """Manifest rows of the masked audit pool: role ``spatial_audit`` with a ``mask_path``."""
    if "mask_path" not in manifest.columns:
        raise ValueError("manifest has no mask_path column: cannot find the masked audit pool")
    pool = manifest[(manifest["role"] == "spatial_audit") & (manifest["mask_path"] != "")]
    return pool.reset_index(drop=True)


def manifest_cases(pool: pd.DataFrame, data_root: str | Path, *, decode_size: int | None
                   ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Yield (sample_id, uint8 (h, w, 3) RGB image, bool (H, W) mask) for each pool row.

    ``decode_size``: the model input side the images go to (large JPEGs decoded at a reduced
    scale, as in training: ``imageio.read_rgb``); None for the full frame (h, w = H, W).
    Files are read lazily, one at a time, so memory does not grow with the pool; unreadable
    files and mask/image size mismatches raise errors naming the files.
    """
    data_root = Path(data_root)
    for row in pool.itertuples(index=False):
        image, mask = read_image_and_mask(data_root / row.path, data_root / row.mask_path,
                                          decode_size=decode_size)
        yield str(row.sample_id), image, mask


def input_digest(pool: pd.DataFrame, data_root: str | Path, negatives: pd.DataFrame | None = None) -> str:
    """SHA-256 over the bytes of every file an audit reads: each pool image and its mask, and
    each held-out negative image (``negatives``), in pool order. Part of the audit's reuse key,
    so changing one byte of one mask makes the next run re-audit (the manifest records image
    digests only)."""
    data_root = Path(data_root)
    lines = [f"{row.sample_id}:{files.sha256_file(data_root / row.path)}:"
             f"{files.sha256_file(data_root / row.mask_path)}" for row in pool.itertuples(index=False)]
    if negatives is not None:
        lines += [f"{row.sample_id}:{files.sha256_file(data_root / row.path)}:"
                  for row in negatives.itertuples(index=False)]
    return files.sha256_bytes("\n".join(lines).encode())


def prepare_case(sample_id: str, image: np.ndarray, mask: np.ndarray, image_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Resize one case: float32 (3, S, S) normalised image and bool (S, S) mask. The image
    is the mask's frame, at full size or decoded at a reduced scale (``imageio.same_frame``)."""
    if not same_frame(image.shape, mask.shape):
        raise ValueError(f"sample {sample_id}: mask size {mask.shape[:2]} differs from "
                         f"image size {image.shape[:2]}")
    resized_mask = cv2.resize(mask.astype(np.uint8), (image_size, image_size),
                              interpolation=cv2.INTER_NEAREST).astype(bool)
    return to_normalised_tensor(resize_rgb(image, image_size)), torch.from_numpy(resized_mask)


def pool_images(pool: pd.DataFrame, data_root: str | Path, image_size: int) -> tuple[list[str], torch.Tensor]:
    """(sample ids, normalised float32 (N, 3, S, S) images) of a masked pool, as the audit
    prepares them; cases whose mask is empty at this size are left out, as in the audit."""
    ids, images = [], []
    for sample_id, image, mask in manifest_cases(pool, data_root, decode_size=image_size):
        tensor, resized_mask = prepare_case(sample_id, image, mask, image_size)
        if resized_mask.any():
            ids.append(sample_id)
            images.append(tensor)
    return ids, torch.stack(images)


def prepared_batches(cases: Iterable, image_size: int, batch_size: int, excluded: list[str]):
    """Group prepared cases into batches; empty masks go to ``excluded`` instead.

    Yields ``(sample_ids, images (B, 3, S, S), masks (B, S, S) bool)`` with B <= batch_size.
    """
    ids, images, masks = [], [], []
    for sample_id, image, mask in cases:
        image_tensor, mask_tensor = prepare_case(sample_id, image, mask, image_size)
        if not mask_tensor.any():
            excluded.append(sample_id)
            continue
        ids.append(sample_id)
        images.append(image_tensor)
        masks.append(mask_tensor)
        if len(ids) == batch_size:
            yield ids, torch.stack(images), torch.stack(masks)
            ids, images, masks = [], [], []
    if ids:
        yield ids, torch.stack(images), torch.stack(masks)


# --- the audit --------------------------------------------------------------------------------

def batch_maps(model: torch.nn.Module, target_layer: torch.nn.Module, images: torch.Tensor,
               sample_ids: list[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Every map the audit scores for one batch, and the logits (B, 2) of its forward.

    ``images``: float32 (B, 3, S, S) normalised, on the model's device. Returns ({method in
    ``MAP_METHODS``: (B, S, S) map in [0, 1]}, logits): the five CAMs of one fused pass
    (target class 1), the random heatmap seeded by each sample id and the centre baseline.
    Figure 3 and the case browser redraw maps with this, so they draw what the audit scored.
    """
    batch, _, height, width = images.shape
    maps, logits = cams.compute_cams(model, target_layer, images, target_class=1,
                                     methods=CAM_METHODS, return_logits=True)
    keys = [deletion.sample_key(sample_id) for sample_id in sample_ids]
    maps["random"] = baselines.random_heatmaps(keys, height, width, images.device)
    maps["centre"] = baselines.centre_gaussian(batch, height, width, CENTRE_SIGMA_FRACTION,
                                               images.device)
    return maps, logits


def audit_batch(model: torch.nn.Module, target_layer: torch.nn.Module, images: torch.Tensor,
                masks: torch.Tensor, sample_ids: list[str], *, temperature: float,
                top_fraction: float, repetitions: int, grid: tuple[int, int] | None = None,
                priors: dict[str, torch.Tensor] | None = None) -> tuple[dict, dict]:
    """Audit one batch; return (column -> values over B x 7 rows, random-deletion columns).

    ``images``: float32 (B, 3, S, S) normalised, on the model's device; ``masks``: bool
    (B, S, S), non-empty. Rows are ordered image-major, methods in ``MAP_METHODS`` order.
    ``grid``: the target layer's (h, w) (computed from one forward when None); ``priors``:
    method -> (S, S) prior map for ``prior_top_iou`` (NaN when None or for baselines).
    Forwards: 1 CAM forward (+ its backward) and 6 + ``repetitions`` deletion forwards (the
    five CAM top areas, the lesion itself, the random controls).
    """
    if grid is None:
        grid = map_diagnostics.feature_grid(model, target_layer, images.shape[-1], images.device)
    batch, _, height, width = images.shape
    maps, logits = batch_maps(model, target_layer, images, sample_ids)
    keys = [deletion.sample_key(sample_id) for sample_id in sample_ids]
    logits = logits.detach().double()
    z = logits[:, 1] - logits[:, 0]

    # Deletion: the five CAM top areas, then the exact-area random controls, in one call.
    cam_top = torch.stack([threshold.top_fraction_mask(maps[m], top_fraction) for m in CAM_METHODS])
    n_pixels = threshold.kept_pixel_count(top_fraction, height, width)
    random_top = deletion.random_deletion_masks(keys, [n_pixels] * batch, height, width,
                                                repetitions=repetitions, device=images.device)
    with torch.no_grad():
        deleted = deletion.deletion_logits(model, images,
                                           torch.cat([cam_top, masks[None], random_top])).double()
    lesion_drop = logits[:, 1] - deleted[len(CAM_METHODS), :, 1]                         # (B,)
    keep_rows = [i for i in range(deleted.shape[0]) if i != len(CAM_METHODS)]
    deleted = deleted[keep_rows]
    logit_drop = logits[None, :, 1] - deleted[..., 1]                                  # (5+R, B)
    z_deleted = deleted[..., 1] - deleted[..., 0]
    score_drop = sigmoid(z / temperature)[None] - sigmoid(z_deleted / temperature)    # (5+R, B)

    per_method = {}
    for index, method in enumerate(MAP_METHODS):
        is_cam = index < len(CAM_METHODS)
        spatial = metrics.spatial_metrics(maps[method], masks, top_fraction,
                                          keep=cam_top[index] if is_cam else None)
        columns = {name: value.detach().cpu().numpy() for name, value in spatial.items()}
        columns["logit_drop"] = logit_drop[index].cpu().numpy() if is_cam else np.full(batch, np.nan)
        columns["score_drop"] = score_drop[index].cpu().numpy() if is_cam else np.full(batch, np.nan)
        rows_px, cols_px = spatial["peak_row"], spatial["peak_col"]
        columns["peak_border_ring"] = map_priors.border_ring(rows_px, cols_px, height, grid).cpu().numpy()
        columns["peak_corner_cell"] = map_priors.corner_cell(rows_px, cols_px, height, grid).cpu().numpy()
        prior = (priors or {}).get(method)
        columns["prior_top_iou"] = (
            map_priors.top_set_iou(maps[method], prior.to(maps[method].device), top_fraction).cpu().numpy()
            if prior is not None else np.full(batch, np.nan))
        per_method[method] = columns

    # Interleave to image-major order: row = image * 7 + method.
    rows = {name: np.stack([per_method[m][name] for m in MAP_METHODS], axis=1).reshape(-1)
            for name in per_method[MAP_METHODS[0]]}
    rows["sample_id"] = np.repeat(np.asarray(sample_ids, dtype=object), len(MAP_METHODS))
    rows["method"] = np.tile(np.asarray(MAP_METHODS, dtype=object), batch)
    for name, value in (("logit_pos", logits[:, 1]), ("z", z), ("raw_score", sigmoid(z)),
                        ("scaled_score", sigmoid(z / temperature)), ("lesion_logit_drop", lesion_drop)):
        rows[name] = np.repeat(value.cpu().numpy(), len(MAP_METHODS))
    rows["feature_grid_height"] = np.full(batch * len(MAP_METHODS), grid[0], dtype=np.int64)
    rows["feature_grid_width"] = np.full(batch * len(MAP_METHODS), grid[1], dtype=np.int64)

    random_drops = logit_drop[len(CAM_METHODS):].T.cpu().numpy()                        # (B, R)
    random_table = {"sample_id": list(sample_ids)}
    for r in range(repetitions):
        random_table[f"logit_drop_{r:02d}"] = random_drops[:, r]
    random_table["logit_drop_mean"] = random_drops.mean(axis=1)
    random_table["score_drop_mean"] = score_drop[len(CAM_METHODS):].mean(dim=0).cpu().numpy()
    return rows, random_table


def audit_checkpoint(model: torch.nn.Module, metadata: dict, temperature: float, cases: Iterable,
                     *, dataset: str, image_size: int, table_path: str | Path,
                     random_deletion_path: str | Path, top_fraction: float,
                     repetitions: int, batch_size: int = 16, device: str = "cpu",
                     target_layer: tuple[str, torch.nn.Module] | None = None,
                     total: int | None = None,
                     priors: dict[str, torch.Tensor] | None = None) -> dict:
    """Audit one checkpoint on one masked cohort and write its two Parquet tables.

    ``metadata``: checkpoint metadata with ``checkpoint_id``, ``arch``, ``seed`` and optionally
    ``target_layer`` (layer name) and ``control``. ``temperature``: the checkpoint's fitted T
    (> 0; None is an error). ``cases``: iterable of (sample_id, uint8 (H, W, 3) RGB, bool
    (H, W) mask), consumed once, batch by batch. ``target_layer``: optional (name, module)
    override of ``networks.resolve_target_layer``. ``total``: number of cases, for the bar.
    ``priors``: optional method -> (S, S) prior maps (``map_diagnostics.prior_maps``) for the
    ``prior_top_iou`` column.

    Returns a summary: checkpoint_id, n_audited, n_empty_masks_excluded, the excluded sample ids,
    the two paths and the wall time in seconds.

    Long on purpose: the batch loop streams rows into one Parquet writer and validates them;
    split, the writer's state would cross functions.
    """
    missing = [key for key in ("checkpoint_id", "arch", "seed") if key not in metadata]
    if missing:
        raise ValueError(f"checkpoint metadata lacks {missing}")
    checkpoint_id = str(metadata["checkpoint_id"])
    if temperature is None or not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"checkpoint {checkpoint_id} has no valid fitted temperature "
                         f"(got {temperature}); run 02_calibration first")
    started = time.perf_counter()
    torch_device = resolve_device(device)
    model = model.to(torch_device).eval()
    if target_layer is None:
        target_layer = networks.resolve_target_layer(model, metadata["arch"],
                                                   metadata.get("target_layer"))
    layer_name, layer_module = target_layer
    grid = map_diagnostics.feature_grid(model, layer_module, image_size, torch_device)
    constants = {"dataset": dataset, "checkpoint_id": checkpoint_id,
                 "arch": str(metadata["arch"]), "seed": int(metadata["seed"]),
                 "control": str(metadata.get("control", "none")), "target": TARGET,
                 "target_layer": layer_name, "top_fraction": float(top_fraction),
                 "calibration": CALIBRATION_STATUS, "temperature": float(temperature)}
    deletion_schema = random_deletion_schema(repetitions)

    table_path, random_deletion_path = Path(table_path), Path(random_deletion_path)
    table_path.parent.mkdir(parents=True, exist_ok=True)
    random_deletion_path.parent.mkdir(parents=True, exist_ok=True)
    # One temporary name per process: two audits of one folder never write the same file.
    temporary_table = files.temporary_sibling(table_path, "partial")
    temporary_deletion = files.temporary_sibling(random_deletion_path, "partial")
    excluded: list[str] = []
    n_audited = 0
    try:
        with pq.ParquetWriter(temporary_table, AUDIT_SCHEMA) as table_writer, \
                pq.ParquetWriter(temporary_deletion, deletion_schema) as deletion_writer, \
                progress_bar(total=total, desc=checkpoint_id, unit="img") as bar:
            for ids, images, masks in prepared_batches(cases, image_size, batch_size, excluded):
                rows, random_table = audit_batch(
                    model, layer_module, images.to(torch_device), masks.to(torch_device), ids,
                    temperature=temperature, top_fraction=top_fraction, repetitions=repetitions,
                    grid=grid, priors=priors)
                n_rows = len(rows["sample_id"])
                rows.update({k: [v] * n_rows for k, v in constants.items()})
                table_writer.write_table(pa.Table.from_pydict(rows, schema=AUDIT_SCHEMA))
                random_table.update({"dataset": [dataset] * len(ids),
                                     "checkpoint_id": [checkpoint_id] * len(ids),
                                     "top_fraction": [float(top_fraction)] * len(ids),
                                     "repetitions": [repetitions] * len(ids)})
                deletion_writer.write_table(pa.Table.from_pydict(random_table, schema=deletion_schema))
                n_audited += len(ids)
                bar.update(n_audited + len(excluded) - bar.n)   # excluded cases count as seen
        if n_audited == 0:
            raise ValueError(f"checkpoint {checkpoint_id}: no case with a non-empty mask to audit "
                             f"({len(excluded)} empty masks excluded)")
        validate_audit_table(pd.read_parquet(temporary_table), source=str(table_path))
        os.replace(temporary_table, table_path)
        os.replace(temporary_deletion, random_deletion_path)
    finally:
        for leftover in (temporary_table, temporary_deletion):
            leftover.unlink(missing_ok=True)
    return {"checkpoint_id": checkpoint_id, "n_audited": n_audited,
            "n_empty_masks_excluded": len(excluded), "excluded_sample_ids": excluded,
            "table_path": str(table_path), "random_deletion_path": str(random_deletion_path),
            "seconds": round(time.perf_counter() - started, 2)}


# --- validation -------------------------------------------------------------------------------

def validate_audit_table(table: pd.DataFrame, source: str = "audit table") -> pd.DataFrame:
    """Check the rules every audit table obeys; raise ``AuditTableError`` saying what is wrong.

    Rules: all required columns present; no duplicate (dataset, sample_id, checkpoint_id,
    method) rows; every method covers the same images (per dataset and checkpoint); a single
    top fraction; one scaled score per image and checkpoint. Returns the table, with the
    column names of older tables brought up to date (``LEGACY_COLUMNS``).
    """
    table = table.rename(columns={old: new for old, new in LEGACY_COLUMNS.items()
                                  if old in table.columns and new not in table.columns})
    missing = [column for column in REQUIRED_COLUMNS if column not in table.columns]
    if missing:
        raise AuditTableError(f"{source}: missing columns {missing}")
    if table.empty:
        raise AuditTableError(f"{source}: has no rows")
    duplicated = table.duplicated(list(KEY_COLUMNS), keep=False)
    if duplicated.any():
        examples = table.loc[duplicated, list(KEY_COLUMNS)].drop_duplicates().head(3)
        raise AuditTableError(f"{source}: {int(duplicated.sum())} duplicate "
                              f"(dataset, sample_id, checkpoint_id, method) rows, e.g. "
                              f"{examples.to_dict('records')}")
    top_fractions = sorted(table["top_fraction"].unique())
    if len(top_fractions) != 1:
        raise AuditTableError(f"{source}: mixed top fractions {top_fractions}; one per table")
    for (dataset, checkpoint_id), group in table.groupby(["dataset", "checkpoint_id"]):
        images = {m: frozenset(g["sample_id"]) for m, g in group.groupby("method")}
        union = frozenset().union(*images.values())
        unpaired = {m: len(union - ids) for m, ids in images.items() if ids != union}
        if unpaired:
            raise AuditTableError(f"{source}: methods do not cover the same images for "
                                  f"{dataset}/{checkpoint_id}; images missing per method: {unpaired}")
        scores = group.groupby("sample_id")["scaled_score"].nunique()
        if (scores > 1).any():
            raise AuditTableError(f"{source}: {dataset}/{checkpoint_id} has more than one scaled "
                                  f"score for images {list(scores[scores > 1].index[:3])}")
    return table


def read_audit_table(path: str | Path) -> pd.DataFrame:
    """Read and validate an audit Parquet file; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"audit table {path} does not exist")
    try:
        table = pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as error:  # e.g. truncated by a crash
        raise AuditTableError(f"{path}: not a readable Parquet file ({path.stat().st_size} bytes; "
                              f"truncated or damaged?): {error}") from error
    return validate_audit_table(table, source=str(path))


# --- one registered checkpoint of a run ---------------------------------------------------------

def load_registered_model(run_dir: str | Path, checkpoint_id: str, image_size: int,
                          device: str = "cpu") -> tuple[torch.nn.Module, dict]:
    """(model in eval mode, metadata with ``checkpoint_id``) of a registry checkpoint.

    The checkpoint must match the run's manifest digest and ``image_size``.
    """
    layout = RunLayout(run_dir)
    model, metadata = training.load_model(layout.checkpoint_file(checkpoint_id), layout.manifest_digest(),
                                          image_size, resolve_device(device))
    return model, {**metadata, "checkpoint_id": checkpoint_id}


def load_calibrated_model(run_dir: str | Path, checkpoint_id: str, image_size: int,
                          device: str = "cpu") -> tuple[torch.nn.Module, dict, float]:
    """``load_registered_model`` plus the checkpoint's validation-fitted temperature:
    (model, metadata, temperature), what every scored analysis of a registered checkpoint needs."""
    temperature = RunLayout(run_dir).temperature(checkpoint_id)
    model, metadata = load_registered_model(run_dir, checkpoint_id, image_size, device)
    return model, metadata, temperature


def read_cases(pool: pd.DataFrame, data_root: str | Path, sample_ids, *,
               decode_size: int | None) -> dict:
    """sample_id -> (uint8 RGB image, bool mask) for the requested pool members
    (``decode_size`` as in ``manifest_cases``)."""
    wanted = set(sample_ids)
    return {sample_id: (image, mask) for sample_id, image, mask
            in manifest_cases(pool[pool["sample_id"].isin(wanted)], data_root,
                              decode_size=decode_size)}


def audit_registered_checkpoint(run_dir: str | Path, data_root: str | Path, checkpoint_id: str, *,
                                image_size: int, top_fraction: float, repetitions: int,
                                batch_size: int = 16, device: str = "cpu",
                                dataset: str = "hyperkvasir", reuse: bool = True,
                                prior_negatives: int) -> dict:
    """Audit a checkpoint of the run's registry on the run's masked HyperKvasir pool.

    ``prior_negatives``: how many held-out test negatives (sorted by sample id) define each
    method's prior map (``map_diagnostics.prior_maps``); their per-map peak rows are written to
    ``<checkpoint_id>_negatives.parquet``. 0 skips the prior (``prior_top_iou`` is NaN).

    Loads the manifest (and its digest), the checkpoint (refusing one trained on another
    manifest or size) and its temperature. With ``reuse``, an existing audit made from the same
    checkpoint file (SHA-256), pool and settings is read back instead of recomputed. Returns the
    audit summary (``audit_checkpoint``) with ``reused`` added; it is also written as JSON.
    """
    layout = RunLayout(run_dir)
    entry = layout.registry_entry(checkpoint_id)
    manifest = load_manifest(layout.manifest)
    pool = masked_pool(manifest)
    paths = layout.audit_paths(dataset, checkpoint_id)
    negatives = map_diagnostics.held_out_negatives(manifest, prior_negatives)
    settings = {"checkpoint_sha256": str(entry["sha256"]), "top_fraction": float(top_fraction),
                "repetitions": int(repetitions), "image_size": int(image_size),
                "pool": sorted(pool["sample_id"].astype(str)), "prior_negatives": int(prior_negatives),
                "inputs_sha256": input_digest(pool, data_root, negatives)}
    if reuse and paths["summary"].is_file() and paths["table"].is_file():
        previous = json.loads(paths["summary"].read_text())
        if previous.get("settings") == settings and paths["random_deletion"].is_file():
            read_audit_table(paths["table"])
            return {**previous, "reused": True}
    model, metadata, temperature = load_calibrated_model(run_dir, checkpoint_id, image_size, device)
    priors = None
    if len(negatives):
        layer_name, layer = networks.resolve_target_layer(model, metadata["arch"],
                                                          metadata.get("target_layer"))
        torch_device = resolve_device(device)
        grid = map_diagnostics.feature_grid(model, layer, image_size, torch_device)
        images = map_diagnostics.negative_images(negatives, data_root, image_size).to(torch_device)
        priors, negative_rows = map_diagnostics.prior_maps(
            model, layer, images, negatives["sample_id"], grid=grid, top_fraction=top_fraction,
            batch_size=batch_size)
        files.write_parquet_atomic(negative_rows.assign(checkpoint_id=checkpoint_id),
                                      paths["negatives"])
    summary = audit_checkpoint(model, metadata, temperature,
                               manifest_cases(pool, data_root, decode_size=image_size),
                               dataset=dataset, image_size=image_size,
                               table_path=paths["table"],
                               random_deletion_path=paths["random_deletion"],
                               top_fraction=top_fraction, repetitions=repetitions,
                               batch_size=batch_size, device=device, total=len(pool),
                               priors=priors)
    summary = {**summary, "settings": settings}
    files.write_text_atomic(paths["summary"], json.dumps(summary, indent=1))
    return {**summary, "reused": False}


def audit_registry(run_dir: str | Path, data_root: str | Path, *, image_size: int,
                   top_fraction: float, repetitions: int,
                   other_repetitions: int | None = None, batch_size: int = 16,
                   device: str = "cpu", dataset: str = "hyperkvasir",
                   prior_negatives: int, task_map=None,
                   checkpoint_ids=None) -> pd.DataFrame:
    """Audit every checkpoint of the registry, or those in ``checkpoint_ids`` (registry order),
    reusing audits already written; one row each.

    ``repetitions``: random deletions per image for the primary checkpoint (as in 03, so its
    audit is reused); ``other_repetitions``: for the other checkpoints, whose random-deletion
    mean is only a per-checkpoint reference (None = the same as the primary). ``task_map``:
    ``None`` audits the checkpoints one after the other in this process; a
    ``pipeline.tasks.TaskRunner.map`` runs one ``audit_registered_checkpoint`` task per
    checkpoint (each writes its own files atomically; the rows are the same).
    """
    registry = RunLayout(run_dir).read_registry()
    if checkpoint_ids is not None:
        unknown = sorted(set(checkpoint_ids) - set(registry["checkpoint_id"]))
        if unknown:
            raise ValueError(f"not in the registry of {run_dir}: {', '.join(unknown)}")
        registry = registry[registry["checkpoint_id"].isin(list(checkpoint_ids))]
    other_repetitions = repetitions if other_repetitions is None else other_repetitions
    calls = [{"run_dir": run_dir, "data_root": data_root, "checkpoint_id": checkpoint_id,
              "image_size": image_size, "top_fraction": top_fraction,
              "repetitions": repetitions if primary else other_repetitions,
              "batch_size": batch_size, "device": device, "dataset": dataset,
              "prior_negatives": prior_negatives}
             for checkpoint_id, primary in zip(registry["checkpoint_id"], registry["is_primary"])]
    if task_map is None:
        summaries = [audit_registered_checkpoint(**call) for call in calls]
    else:
        summaries = task_map(audit_registered_checkpoint, calls,
                             labels=[f"{dataset}/{call['checkpoint_id']}" for call in calls])
    columns = ["checkpoint_id", "n_audited", "n_empty_masks_excluded", "reused", "seconds"]
    return pd.DataFrame(summaries, columns=columns).merge(
        registry[["checkpoint_id", "arch", "seed", "control", "is_primary"]], on="checkpoint_id")


def read_audits(run_dir: str | Path, checkpoint_ids, dataset: str = "hyperkvasir"
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(validated audit rows, random-deletion rows) of several checkpoints, concatenated."""
    tables, deletions = [], []
    for checkpoint_id in checkpoint_ids:
        paths = RunLayout(run_dir).audit_paths(dataset, checkpoint_id)
        tables.append(read_audit_table(paths["table"]))
        deletions.append(pd.read_parquet(paths["random_deletion"]))
    return pd.concat(tables, ignore_index=True), pd.concat(deletions, ignore_index=True)
