"""The case-level audit table: every map of one checkpoint on one masked cohort.

One row per (dataset, sample_id, checkpoint_id, method), for the five CAMs and the three spatial
baselines (random heatmap, centre Gaussian, the frame's own salience); every metric is at the model's input size, and masks empty at that size are excluded
and counted. Inputs: ``audit_inputs``; schema and validation: ``audit_schema``. Method:
docs/statistics_and_gate.md, "The case-level audit"; docs/protocol.md, "Deletion".
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from endoexplain_core.progress import progress_bar
from endoexplain_core.analysis import audit_inputs, audit_schema, map_diagnostics
from endoexplain_core import files
from endoexplain_core.run_layout import RunLayout
from endoexplain_core.kernels import baselines, cams, deletion, map_priors, metrics, threshold
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS
from endoexplain_core.models import networks, training
from endoexplain_core.data.datasets import load_manifest
from endoexplain_core.numerics import resolve_device

TARGET = "polyp_family positive logit"
CALIBRATION_STATUS = "scaled"
CENTRE_SIGMA_FRACTION = 0.25


def sigmoid(values: torch.Tensor) -> torch.Tensor:
    """Logistic function, float64 for stable score differences."""
    return torch.sigmoid(values.double())


# --- the audit --------------------------------------------------------------------------------

def batch_maps(model: torch.nn.Module, target_layer: torch.nn.Module, images: torch.Tensor,
               sample_ids: list[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Every map the audit scores for one batch, and the logits (B, 2) of its forward.

    ``images``: float32 (B, 3, S, S) normalised, on the model's device. Returns ({method in
    ``MAP_METHODS``: (B, S, S) map in [0, 1]}, logits): the five CAMs of one fused pass
    (target class 1), the random heatmap seeded by each sample id, the centre baseline and the
    frame's salience map.
    Figure 3 and the case browser redraw maps with this, so they draw what the audit scored.
    """
    maps, logits = cams.compute_cams(model, target_layer, images, target_class=1,
                                     methods=CAM_METHODS, return_logits=True)
    return {**maps, **baseline_maps(images, sample_ids)}, logits


def baseline_maps(images: torch.Tensor, sample_ids: list[str]) -> dict[str, torch.Tensor]:
    """The model-free controls of a batch (B, 3, S, S) of normalised frames: ``random`` (a
    heatmap seeded by each sample id), ``centre`` (the centre Gaussian) and ``salience`` (the
    frame's smoothed gradient magnitude, ``baselines.salience_map``), each (B, S, S) in [0, 1]."""
    batch, _, height, width = images.shape
    keys = [deletion.sample_key(sample_id) for sample_id in sample_ids]
    return {"random": baselines.random_heatmaps(keys, height, width, images.device),
            "centre": baselines.centre_gaussian(batch, height, width, CENTRE_SIGMA_FRACTION,
                                                images.device),
            "salience": baselines.salience_map(images)}


def audit_batch(model: torch.nn.Module, target_layer: torch.nn.Module, images: torch.Tensor,
                masks: torch.Tensor, sample_ids: list[str], *, temperature: float,
                top_fraction: float, repetitions: int, grid: tuple[int, int] | None = None,
                priors: dict[str, torch.Tensor] | None = None) -> tuple[dict, dict]:
    """Audit one batch; return (column -> values over B x len(MAP_METHODS) rows, random-deletion
    columns).

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

    # Interleave to image-major order: row = image * len(MAP_METHODS) + method.
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
                     repetitions: int, batch_size: int, device: str = "cpu",
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
    """
    checkpoint_id = _checked_checkpoint_id(metadata, temperature)
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
    random_constants = {"dataset": dataset, "checkpoint_id": checkpoint_id,
                        "top_fraction": float(top_fraction), "repetitions": repetitions}
    deletion_schema = audit_schema.random_deletion_schema(repetitions)

    table_path, random_deletion_path = Path(table_path), Path(random_deletion_path)
    table_path.parent.mkdir(parents=True, exist_ok=True)
    random_deletion_path.parent.mkdir(parents=True, exist_ok=True)
    # One temporary name per process: two audits of one folder never write the same file.
    temporary_table = files.temporary_sibling(table_path, "partial")
    temporary_deletion = files.temporary_sibling(random_deletion_path, "partial")
    excluded: list[str] = []
    n_audited = 0
    try:
        with pq.ParquetWriter(temporary_table, audit_schema.AUDIT_SCHEMA) as table_writer, \
                pq.ParquetWriter(temporary_deletion, deletion_schema) as deletion_writer, \
                progress_bar(total=total, desc=checkpoint_id, unit="img") as bar:
            for ids, images, masks in audit_inputs.prepared_batches(cases, image_size, batch_size, excluded):
                rows, random_table = audit_batch(
                    model, layer_module, images.to(torch_device), masks.to(torch_device), ids,
                    temperature=temperature, top_fraction=top_fraction, repetitions=repetitions,
                    grid=grid, priors=priors)
                n_rows = len(rows["sample_id"])
                rows.update({k: [v] * n_rows for k, v in constants.items()})
                table_writer.write_table(pa.Table.from_pydict(rows, schema=audit_schema.AUDIT_SCHEMA))
                random_table.update({k: [v] * len(ids) for k, v in random_constants.items()})
                deletion_writer.write_table(pa.Table.from_pydict(random_table, schema=deletion_schema))
                n_audited += len(ids)
                bar.update(n_audited + len(excluded) - bar.n)   # excluded cases count as seen
        if n_audited == 0:
            raise ValueError(f"checkpoint {checkpoint_id}: no case with a non-empty mask to audit "
                             f"({len(excluded)} empty masks excluded)")
        audit_schema.validate_audit_table(pd.read_parquet(temporary_table), source=str(table_path))
        os.replace(temporary_table, table_path)
        os.replace(temporary_deletion, random_deletion_path)
    finally:
        for leftover in (temporary_table, temporary_deletion):
            leftover.unlink(missing_ok=True)
    return {"checkpoint_id": checkpoint_id, "n_audited": n_audited,
            "n_empty_masks_excluded": len(excluded), "excluded_sample_ids": excluded,
            "table_path": str(table_path), "random_deletion_path": str(random_deletion_path),
            "seconds": round(time.perf_counter() - started, 2)}


def _checked_checkpoint_id(metadata: dict, temperature: float | None) -> str:
    """The checkpoint id, after checking the metadata keys and the fitted temperature."""
    missing = [key for key in ("checkpoint_id", "arch", "seed") if key not in metadata]
    if missing:
        raise ValueError(f"checkpoint metadata lacks {missing}")
    checkpoint_id = str(metadata["checkpoint_id"])
    if temperature is None or not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"checkpoint {checkpoint_id} has no valid fitted temperature "
                         f"(got {temperature}); run 02_calibration first")
    return checkpoint_id


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


class CheckpointAudit(NamedTuple):
    """One registered checkpoint's audit as the later analyses read it: its rows (``table``),
    random deletions and held-out negatives, the model with its metadata and target layer, and
    the masked pool it was run on."""
    table: pd.DataFrame
    random_deletion: pd.DataFrame
    negatives: pd.DataFrame
    model: torch.nn.Module
    metadata: dict
    layer_name: str
    layer: torch.nn.Module
    pool: pd.DataFrame


def load_checkpoint_audit(run_dir: str | Path, checkpoint_id: str, *, image_size: int,
                          device: str) -> CheckpointAudit:
    """Read the finished HyperKvasir audit of ``checkpoint_id`` (``audit_registered_checkpoint``)
    with its model and target layer."""
    layout = RunLayout(run_dir)
    paths = layout.audit_paths("hyperkvasir", checkpoint_id)
    model, metadata = load_registered_model(run_dir, checkpoint_id, image_size, device)
    layer_name, layer = networks.resolve_target_layer(model, metadata["arch"], metadata.get("target_layer"))
    return CheckpointAudit(audit_schema.read_audit_table(paths["table"]),
                           audit_schema.read_random_deletion(paths["random_deletion"]),
                           pd.read_parquet(paths["negatives"]), model, metadata, layer_name, layer,
                           audit_inputs.masked_pool(load_manifest(layout.manifest)))


def describe_audit_run(run: dict, table: pd.DataFrame) -> str:
    """One sentence on an audit run (``audit_registered_checkpoint``'s record) and its table."""
    return (f"Checkpoint `{run['checkpoint_id']}` (T = {table['temperature'].iloc[0]:.3f}): {run['n_audited']} "
            f"masked images audited, {run['n_empty_masks_excluded']} empty masks excluded"
            + (" (reused: inputs unchanged)." if run.get("reused") else "."))


def audit_registered_checkpoint(run_dir: str | Path, data_root: str | Path, checkpoint_id: str, *,
                                image_size: int, top_fraction: float, repetitions: int,
                                batch_size: int, device: str = "cpu",
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
    pool = audit_inputs.masked_pool(manifest)
    paths = layout.audit_paths(dataset, checkpoint_id)
    negatives = map_diagnostics.held_out_negatives(manifest, prior_negatives)
    settings = {"checkpoint_sha256": str(entry["sha256"]), "top_fraction": float(top_fraction),
                "repetitions": int(repetitions), "image_size": int(image_size),
                "pool": sorted(pool["sample_id"].astype(str)), "prior_negatives": int(prior_negatives),
                # an audit written before a map was added (e.g. the salience baseline) is redone
                "methods": list(MAP_METHODS),
                "inputs_sha256": audit_inputs.input_digest(pool, data_root, negatives)}
    if reuse and paths["summary"].is_file() and paths["table"].is_file():
        previous = json.loads(paths["summary"].read_text())
        if previous.get("settings") == settings and paths["random_deletion"].is_file():
            audit_schema.read_audit_table(paths["table"])
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
                               audit_inputs.manifest_cases(pool, data_root, decode_size=image_size),
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
                   other_repetitions: int | None = None, batch_size: int,
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
        tables.append(audit_schema.read_audit_table(paths["table"]))
        deletions.append(audit_schema.read_random_deletion(paths["random_deletion"]))
    return pd.concat(tables, ignore_index=True), pd.concat(deletions, ignore_index=True)


def describe_other_audits(runs: pd.DataFrame, not_audited, primary_id: str, *, audit_unlearned: bool) -> str:
    """Notebook 05's audits besides the primary (``audit_registry``'s runs) in one sentence."""
    return (f"{len(runs)} checkpoints audited besides the primary `{primary_id}` (its audit is "
            f"04_spatial_audit's), {int(runs['reused'].sum())} reused. Not audited (did not learn; "
            f"audit_unlearned = {audit_unlearned}): {', '.join(sorted(not_audited)) or 'none'}.")
