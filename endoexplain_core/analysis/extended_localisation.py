"""Extended localisation (notebook 07): threshold-free IoU, chance-normalised scores, consistency.

``score_checkpoint`` scores one checkpoint on one masked cohort, per image and map of
``EXTENDED_METHODS`` (the five CAMs, LayerCAM, random, centre, DoG), with
``kernels.localisation``: IoU curve and AUC-IoU, top-k sweep, energy lift (bits) and pointing
against its chance level; plus the polyp class's C-Score rows (``negative_class_c_scores``: the
negative class's; every row says its ``class``). Images and masks are prepared as in the audit;
energy lift and pointing are taken inside the field of view joined with the mask, IoU over the
frame; spatial scales are fractions of the input size (``LocalisationSettings``); constant maps
are counted in every table (``CONSTANT_NOTE``).
Method: docs/maps_and_scores.md, "Extended localisation tables".
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy import stats as scipy_stats

from endoexplain_core.config import LocalisationSettings
from endoexplain_core.run_layout import RunLayout
from endoexplain_core.analysis import audit, audit_inputs, map_diagnostics, stats, transfer
from endoexplain_core.data import cohorts
from endoexplain_core.data.datasets import load_manifest
from endoexplain_core.files import write_parquet_atomic
from endoexplain_core.kernels import cams, localisation
from endoexplain_core.methods import (
    BASELINE_METHODS, CAM_METHODS, EXTENDED_BASELINE_METHODS, EXTENDED_CAM_METHODS, method_label,
)
from endoexplain_core.models import networks
from endoexplain_core.models import training
from endoexplain_core.numerics import resolve_device

MODEL_METHODS = CAM_METHODS + EXTENDED_CAM_METHODS               # five CAMs + LayerCAM
EXTENDED_METHODS = MODEL_METHODS + BASELINE_METHODS + EXTENDED_BASELINE_METHODS
IOU_LEVELS = (0.3, 0.5, 0.7)                                     # single thresholds reported
GOLD_SCORE = 0.5                                                  # correctly classified
C_SCORE_RESOLUTION = 64
# The C-Score's image-bootstrap interval needs the (n, n) pair matrix: up to this many gold images.
C_SCORE_BOOTSTRAP_MAX_IMAGES = 3000
# The random heatmap's C-Score at the native input size (no pooling), on up to this many gold
# images: pooling to 64 px averages its noise towards a flat map and raises it (about 0.5 -> 0.8).
NATIVE_REFERENCE_IMAGES = 256
CONSTANT_NOTE = ("Constant (all-zero) maps: IoU 0 at every threshold > 0; uniform (0 bits) in "
                 "the energy lift and in the C-Score; arbitrary pointing peak. Counted in n_constant.")


def iou_column(threshold: float) -> str:
    """Case-table column of the IoU at one binarisation threshold, e.g. ``iou_t050``."""
    return f"iou_t{round(threshold * 100):03d}"


def topk_column(kind: str, fraction: float) -> str:
    """Case-table column of the top-k sweep, e.g. ``topk_iou_20`` or ``topk_energy_05``."""
    return f"topk_{kind}_{round(fraction * 100):02d}"


def top_area_metric(top_fraction: float) -> str:
    """The summary column of the audit's top-area IoU, e.g. ``top20_iou`` for 0.20 (the
    profile's ``top_fraction``). ValueError unless the fraction is one of the top-k sweep's
    (``localisation.TOP_K_FRACTIONS``), whose per-image column it reads."""
    if not any(abs(top_fraction - k) < 1e-9 for k in localisation.TOP_K_FRACTIONS):
        raise ValueError(f"top_fraction {top_fraction} is not in the top-k sweep "
                         f"{localisation.TOP_K_FRACTIONS}: the extended metrics have no IoU for it")
    return f"top{round(top_fraction * 100)}_iou"


def ranking_metrics(top_fraction: float) -> tuple[str, ...]:
    """The metrics a ranking compares: AUC-IoU, IoU at 0.3/0.5/0.7 and the top-area IoU."""
    return ("auc_iou", "iou_at_0.3", "iou_at_0.5", "iou_at_0.7", top_area_metric(top_fraction))


# --- maps and scores of one batch -------------------------------------------------------------

def score_maps(maps: dict[str, torch.Tensor], masks: torch.Tensor, fov: torch.Tensor,
               settings: LocalisationSettings) -> dict[str, dict[str, np.ndarray]]:
    """method -> column -> (B,) NumPy values: the per-image extended scores of each map.

    ``fov`` is joined with the masks here (the lesion always lies in B).
    """
    fov = fov | masks
    scales = settings.pixels(masks.shape[-1])
    columns: dict[str, dict[str, np.ndarray]] = {}
    lesion_share = (masks.sum(dim=(1, 2)).double() / fov.sum(dim=(1, 2)).double()).cpu().numpy()
    # The tolerance zone and its chance level depend on the lesion only: once per batch.
    zone = localisation.tolerance_zone(masks, fov, scales["radius_px"])
    chance = localisation.pointing_chance(zone, fov)
    levels = torch.as_tensor(localisation.DEFAULT_IOU_THRESHOLDS, dtype=torch.float32, device=masks.device)
    for method, values in maps.items():
        curve, sweep = localisation.curve_and_sweep(values, masks)
        hits = localisation.peak_in_zone(values, zone, fov, smooth_sigma_px=scales["smooth_sigma_px"])
        row = {
            "auc_iou": torch.trapezoid(curve, levels, dim=1),
            "energy_lift_bits": localisation.energy_lift_bits(values, masks, fov, settings.energy_alpha),
            "saliency_free": localisation.saliency_free(values, fov),
            "constant_map": values.amax(dim=(1, 2)) == values.amin(dim=(1, 2)),
            "pointing_hit": hits, "pointing_chance": chance,
        }
        row.update({iou_column(t): curve[:, i] for i, t in enumerate(localisation.DEFAULT_IOU_THRESHOLDS)})
        for i, fraction in enumerate(localisation.TOP_K_FRACTIONS):
            row[topk_column("iou", fraction)] = sweep["iou"][:, i]
            row[topk_column("energy", fraction)] = sweep["energy"][:, i]
        columns[method] = {name: value.detach().cpu().numpy() for name, value in row.items()}
        columns[method]["lesion_fov_fraction"] = lesion_share
    return columns


def _small_maps(values: torch.Tensor) -> torch.Tensor:
    """Maps area-resized to the C-Score resolution, on the CPU (kept for the gold list)."""
    return F.adaptive_avg_pool2d(values[:, None].float(), C_SCORE_RESOLUTION)[:, 0].cpu()


@dataclass
class GoldList:
    """The C-Score's gold list of one class, collected batch by batch: the gold images' maps
    (method -> pooled (n, 64, 64) CPU tensors), their weights (the class confidences) and up to
    ``NATIVE_REFERENCE_IMAGES`` random heatmaps at the native input size."""

    maps: dict[str, list[torch.Tensor]] = field(default_factory=lambda: {m: [] for m in EXTENDED_METHODS})
    weights: list[np.ndarray] = field(default_factory=list)
    native_random: list[torch.Tensor] = field(default_factory=list)

    def add(self, maps: dict[str, torch.Tensor], confidence: np.ndarray) -> None:
        """Keep the images of a batch (method -> (B, S, S) maps) whose ``confidence`` (B,) for the
        class is >= ``GOLD_SCORE``."""
        gold = confidence >= GOLD_SCORE
        if not gold.any():
            return
        self.weights.append(confidence[gold])
        index = torch.from_numpy(gold).to(maps["random"].device)
        for method in EXTENDED_METHODS:
            self.maps[method].append(_small_maps(maps[method][index]))
        if sum(len(m) for m in self.native_random) < NATIVE_REFERENCE_IMAGES:
            self.native_random.append(maps["random"][index].float().cpu())

    def rows(self, constants: dict, class_name: str, n_audited: int, *, replicates: int,
             seed: int) -> list[dict]:
        """One C-Score row per method (``c_score_with_interval`` with the profile's ``replicates``
        and ``seed``; ``c_score_native``: the random heatmap's C-Score without pooling, NaN for
        the other methods)."""
        weights = np.concatenate(self.weights) if self.weights else np.zeros(0)
        native = torch.cat(self.native_random)[:NATIVE_REFERENCE_IMAGES] if self.native_random else None
        rows = []
        for method in EXTENDED_METHODS:
            maps = torch.cat(self.maps[method]) if self.maps[method] else None
            row = {**constants, "class": class_name, "method": method, "n_gold": len(weights),
                   "n_audited": n_audited,
                   "n_constant": 0 if maps is None else int((maps.flatten(1).amax(1) <= 0).sum()),
                   **c_score_with_interval(maps, weights, replicates=replicates, seed=seed), "c_score_native": float("nan")}
            if method == "random" and native is not None and len(native) >= 2:
                row["c_score_native"] = localisation.c_score(
                    native, torch.from_numpy(weights[:len(native)]), resolution=native.shape[-1])
            rows.append(row)
        return rows


# --- one checkpoint on one cohort ---------------------------------------------------------------

def _synchronise(device: torch.device) -> None:
    """Wait for queued GPU work, so the timings split CAM and metric time correctly."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _checkpoint_columns(metadata: dict, dataset: str) -> dict:
    """The leading columns of every case and C-Score row: dataset and the checkpoint's identity."""
    return {"dataset": dataset, "checkpoint_id": str(metadata["checkpoint_id"]),
            "arch": str(metadata["arch"]), "seed": int(metadata["seed"]),
            "control": str(metadata.get("control", "none"))}


def score_checkpoint(model: torch.nn.Module, metadata: dict, temperature: float, cases: Iterable, *,
                     dataset: str, image_size: int, settings: LocalisationSettings,
                     replicates: int, seed: int, batch_size: int, device: str = "cpu",
                     total: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Extended scores of one checkpoint on one masked cohort.

    ``cases``: (sample_id, uint8 RGB, bool mask) as ``audit_inputs.manifest_cases`` yields. Returns
    (case table, one row per image x ``EXTENDED_METHODS``; the polyp class's C-Score rows, one per
    method; run summary with ``cam_seconds`` and ``metric_seconds``).
    """
    checkpoint_id = str(metadata["checkpoint_id"])
    torch_device = resolve_device(device)
    model = model.to(torch_device).eval()
    _, layer = networks.resolve_target_layer(model, metadata["arch"], metadata.get("target_layer"))
    excluded: list[str] = []
    frames, gold = [], GoldList()
    cam_seconds = metric_seconds = 0.0
    for ids, images, masks in audit_inputs.prepared_batches(cases, image_size, batch_size, excluded):
        images, masks = images.to(torch_device), masks.to(torch_device)
        started = time.perf_counter()
        maps, logits = cams.compute_cams(model, layer, images, target_class=1,
                                         methods=MODEL_METHODS, return_logits=True)
        _synchronise(torch_device)
        cam_seconds += time.perf_counter() - started
        started = time.perf_counter()
        extra, fov = reference_maps(images, ids, settings)
        maps.update(extra)
        columns = score_maps(maps, masks, fov, settings)
        _synchronise(torch_device)
        metric_seconds += time.perf_counter() - started
        z = (logits[:, 1] - logits[:, 0]).double().cpu()
        scaled = torch.sigmoid(z / temperature).numpy()
        gold.add(maps, scaled)
        for method in EXTENDED_METHODS:
            frame = pd.DataFrame(columns[method])
            frame.insert(0, "sample_id", ids)
            frame.insert(1, "method", method)
            frame["scaled_score"] = scaled
            frames.append(frame)
    if not frames:
        raise ValueError(f"checkpoint {checkpoint_id} on {dataset}: no case with a non-empty mask "
                         f"({len(excluded)} empty masks excluded)")
    table = pd.concat(frames, ignore_index=True)
    constants = _checkpoint_columns(metadata, dataset)
    for position, (name, value) in enumerate(constants.items()):
        table.insert(position, name, value)
    c_rows = gold.rows(constants, "polyp", int(table["sample_id"].nunique()),
                       replicates=replicates, seed=seed)
    summary = {**constants, "n_audited": int(table["sample_id"].nunique()),
               "n_empty_masks_excluded": len(excluded), "cam_seconds": round(cam_seconds, 3),
               "metric_seconds": round(metric_seconds, 3)}
    return table, pd.DataFrame(c_rows), summary


def negative_class_c_scores(model: torch.nn.Module, metadata: dict, temperature: float,
                            batches: Iterable[tuple[list[str], torch.Tensor]], *, dataset: str,
                            settings: LocalisationSettings, replicates: int, seed: int,
                            device: str = "cpu") -> pd.DataFrame:
    """C-Score rows of the negative class (``class`` "negative") of one checkpoint.

    ``batches``: (sample ids, normalised float32 (B, 3, S, S) images) of non-polyp frames (e.g.
    ``negative_batches``). Maps for target class 0 and ``reference_maps``; gold list: the images
    with 1 - sigmoid(z / T) >= 0.5, weighted by it. Columns as ``score_checkpoint``'s C-Score
    rows; ``n_audited`` = the negatives scored.
    """
    torch_device = resolve_device(device)
    model = model.to(torch_device).eval()
    _, layer = networks.resolve_target_layer(model, metadata["arch"], metadata.get("target_layer"))
    gold, n_scored = GoldList(), 0
    for ids, images in batches:
        images = images.to(torch_device)
        maps, logits = cams.compute_cams(model, layer, images, target_class=0,
                                         methods=MODEL_METHODS, return_logits=True)
        maps.update(reference_maps(images, ids, settings)[0])
        z = (logits[:, 1] - logits[:, 0]).double().cpu()
        gold.add(maps, torch.sigmoid(-z / temperature).numpy())   # = 1 - sigmoid(z / T)
        n_scored += len(ids)
    return pd.DataFrame(gold.rows(_checkpoint_columns(metadata, dataset), "negative", n_scored,
                                  replicates=replicates, seed=seed))


def c_score_with_interval(maps: torch.Tensor | None, weights: np.ndarray, *, replicates: int,
                          seed: int) -> dict[str, float]:
    """The C-Score of the gold maps (N, 64, 64) with its image-bootstrap 95% interval
    (``stats.weighted_pair_mean_ci`` over ``localisation.pairwise_soft_iou``; the interval is
    NaN above ``C_SCORE_BOOTSTRAP_MAX_IMAGES`` images or under 2). Keys: c_score, c_score_ci_low,
    c_score_ci_high, c_score_note ("constant" when every gold map is constant: identical flat
    maps agree perfectly, a C-Score of 1 that says nothing, so none is given)."""
    undefined = {"c_score": float("nan"), "c_score_ci_low": float("nan"), "c_score_ci_high": float("nan")}
    if maps is None or len(weights) < 2:
        return {**undefined, "c_score_note": ""}
    flat = maps.flatten(1)
    if bool((flat.amax(dim=1) == flat.amin(dim=1)).all()):
        return {**undefined, "c_score_note": "constant"}
    value = localisation.c_score(maps, torch.from_numpy(weights), resolution=C_SCORE_RESOLUTION)
    if len(weights) > C_SCORE_BOOTSTRAP_MAX_IMAGES:
        return {**undefined, "c_score": value, "c_score_note": ""}
    interval = stats.weighted_pair_mean_ci(
        localisation.pairwise_soft_iou(maps, resolution=C_SCORE_RESOLUTION).numpy(), weights,
        replicates=replicates, seed=seed)
    return {"c_score": value, "c_score_ci_low": interval["ci_low"], "c_score_ci_high": interval["ci_high"],
            "c_score_note": ""}


def reference_maps(images: torch.Tensor, sample_ids: list[str], settings: LocalisationSettings
                   ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(method -> (B, S, S) map, field of view (B, S, S) bool before joining the masks) of the
    model-free maps of a batch of normalised images (B, 3, S, S): the random heatmap and centre
    baseline (``kernels.baselines``, the audit's seeds and width) and the image-only DoG map."""
    fov = localisation.field_of_view(images)
    scales = settings.pixels(images.shape[-2])
    dog = localisation.dog_conspicuity(images, scales["dog_sigma_small_px"],
                                       scales["dog_sigma_large_px"], fov=fov)
    return {**audit.baseline_maps(images, sample_ids), "dog": dog}, fov


def score_registered(run_dir: str | Path, data_root: str | Path, checkpoint_id: str, *,
                     image_size: int, settings: LocalisationSettings, replicates: int, seed: int,
                     batch_size: int, device: str = "cpu", cases: pd.DataFrame | None = None,
                     dataset: str = "hyperkvasir", case_iterator=None
                     ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """``score_checkpoint`` for a checkpoint of the run's registry (``audit.load_calibrated_model``). Default cases: the run's masked HyperKvasir pool; pass
    ``cases`` and ``case_iterator`` (e.g. ``cohorts.iter_cases``; called with ``decode_size``)
    for an external cohort."""
    if cases is None:
        cases = audit_inputs.masked_pool(load_manifest(RunLayout(run_dir).manifest))
        case_iterator = audit_inputs.manifest_cases
    model, metadata, temperature = audit.load_calibrated_model(run_dir, checkpoint_id, image_size, device)
    return score_checkpoint(model, metadata, temperature,
                            case_iterator(cases, data_root, decode_size=image_size),
                            dataset=dataset, image_size=image_size, settings=settings,
                            replicates=replicates, seed=seed, batch_size=batch_size, device=device,
                            total=len(cases))


def negative_batches(negatives: pd.DataFrame, data_root: str | Path, image_size: int,
                     batch_size: int) -> Iterator[tuple[list[str], torch.Tensor]]:
    """(sample ids, normalised float32 (B, 3, S, S) images) of manifest rows of negatives
    (``map_diagnostics.held_out_negatives``), read batch by batch with
    ``map_diagnostics.negative_images`` (decoded at ``image_size``, as every model input)."""
    for start in range(0, len(negatives), batch_size):
        rows = negatives.iloc[start:start + batch_size]
        yield ([str(sample_id) for sample_id in rows["sample_id"]],
               map_diagnostics.negative_images(rows, data_root, image_size))


def negative_c_score_registered(run_dir: str | Path, data_root: str | Path, checkpoint_id: str, *,
                                max_images: int, image_size: int, settings: LocalisationSettings,
                                replicates: int, seed: int, batch_size: int,
                                device: str = "cpu") -> pd.DataFrame:
    """``negative_class_c_scores`` of a checkpoint of the run's registry (its fitted temperature)
    over the first ``max_images`` held-out test negatives by sample id (the audit's prior-map
    negatives are the first ``prior_negatives`` of the same list). An empty frame for 0."""
    negatives = map_diagnostics.held_out_negatives(load_manifest(RunLayout(run_dir).manifest), max_images)
    if negatives.empty:
        return pd.DataFrame()
    model, metadata, temperature = audit.load_calibrated_model(run_dir, checkpoint_id, image_size, device)
    return negative_class_c_scores(model, metadata, temperature,
                                   negative_batches(negatives, data_root, image_size, batch_size),
                                   dataset="hyperkvasir", settings=settings, replicates=replicates,
                                   seed=seed, device=device)


def score_epoch_snapshots(run_dir: str | Path, data_root: str | Path, checkpoint_id: str, *,
                          image_size: int, settings: LocalisationSettings, replicates: int,
                          seed: int, batch_size: int, device: str = "cpu") -> pd.DataFrame:
    """C-Score rows (``score_checkpoint``'s) of every kept epoch snapshot of ``checkpoint_id`` on the
    run's masked pool, with ``epoch`` and that epoch's ``val_auprc``, every epoch scaled by the
    checkpoint's fitted temperature; an empty frame when no snapshot was kept."""
    layout = RunLayout(run_dir)
    snapshots = training.epoch_snapshots(layout.checkpoints_dir, checkpoint_id)
    if not snapshots:
        return pd.DataFrame()
    cases = audit_inputs.masked_pool(load_manifest(layout.manifest))
    temperature = layout.temperature(checkpoint_id)
    digest = layout.manifest_digest()
    rows = []
    for epoch, path in snapshots:
        model, metadata = training.load_model(path, digest, image_size, resolve_device(device))
        _, c_rows, _ = score_checkpoint(model, {**metadata, "checkpoint_id": checkpoint_id}, temperature,
                                        audit_inputs.manifest_cases(cases, data_root, decode_size=image_size),
                                        dataset="hyperkvasir",
                                        image_size=image_size, settings=settings,
                                        replicates=replicates, seed=seed, batch_size=batch_size,
                                        device=device, total=len(cases))
        rows.append(c_rows.assign(epoch=epoch, val_auprc=float(metadata["val_auprc"])))
    return pd.concat(rows, ignore_index=True)


# --- summaries ----------------------------------------------------------------------------------

def _method_matrix(table: pd.DataFrame, column: str, methods) -> tuple[np.ndarray, list[str]]:
    """(images x methods) values of ``column`` for one checkpoint and dataset, paired by image."""
    wide = table.pivot(index="sample_id", columns="method", values=column)
    missing = [m for m in methods if m not in wide.columns]
    if missing:
        raise ValueError(f"case table has no rows for methods {missing}")
    wide = wide[list(methods)].dropna()
    return wide.to_numpy(dtype=np.float64), list(wide.index)


def _single_group(table: pd.DataFrame) -> None:
    groups = table.groupby(["dataset", "checkpoint_id"]).ngroups
    if groups != 1:
        raise ValueError(f"expected the rows of one dataset and checkpoint, got {groups} groups")


def auc_iou_table(table: pd.DataFrame, methods=EXTENDED_METHODS, *, top_fraction: float,
                  replicates: int,
                  seed: int) -> pd.DataFrame:
    """Per method: n, n_constant, mean AUC-IoU (raw, max 0.9) with its image-bootstrap 95% CI, mean
    IoU at 0.3/0.5/0.7 with the relative difference (AUC-IoU - IoU(t)) / IoU(t) x 100 %, and the
    mean IoU of the top ``top_fraction`` area (column ``top_area_metric``, e.g. ``top20_iou``) with
    its CI. The CIs resample the images shared by every method together."""
    _single_group(table)
    top_area = top_area_metric(top_fraction)
    intervals = {}
    for metric, column in (("auc_iou", "auc_iou"), (top_area, topk_column("iou", top_fraction))):
        matrix, _ = _method_matrix(table, column, methods)
        intervals[metric] = stats.bootstrap_mean_ci(matrix, replicates=replicates, seed=seed)
    rows = []
    for index, method in enumerate(methods):
        part = table[table["method"] == method]
        row = {"method": method, "n": len(part), "n_constant": int(part["constant_map"].sum()),
               "auc_iou": part["auc_iou"].mean(),
               "auc_iou_ci_low": intervals["auc_iou"]["ci_low"][index],
               "auc_iou_ci_high": intervals["auc_iou"]["ci_high"][index]}
        for level in IOU_LEVELS:
            mean = part[iou_column(level)].mean()
            row[f"iou_at_{level:.1f}"] = mean
            row[f"rel_diff_{level:.1f}_pct"] = (row["auc_iou"] - mean) / mean * 100 if mean > 0 else np.nan
        row[top_area] = part[topk_column("iou", top_fraction)].mean()
        row[f"{top_area}_ci_low"] = intervals[top_area]["ci_low"][index]
        row[f"{top_area}_ci_high"] = intervals[top_area]["ci_high"][index]
        rows.append(row)
    return pd.DataFrame(rows)


BINARY_REFERENCE = "binary map (reference)"


def binary_map_reference() -> pd.DataFrame:
    """The row a binary (0/1) map gets in ``auc_iou_table``'s relative differences, whatever its IoU:
    (grid width - 1) x 100 = -10% at every threshold."""
    levels = np.asarray(localisation.DEFAULT_IOU_THRESHOLDS)
    width = float(levels[-1] - levels[0])
    return pd.DataFrame([{"method": BINARY_REFERENCE,
                          **{f"rel_diff_{level:.1f}_pct": (width - 1.0) * 100 for level in IOU_LEVELS}}])


def ranking_column(metric: str) -> str:
    """The per-image column of a ``ranking_metrics`` name."""
    if metric == "auc_iou":
        return "auc_iou"
    top_area = re.fullmatch(r"top(\d+)_iou", metric)
    if top_area:
        return topk_column("iou", int(top_area.group(1)) / 100)
    return iou_column(float(metric.removeprefix("iou_at_")))


def ranking_table(summary: pd.DataFrame, metrics: tuple[str, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ranks: method x metric, 1 = best mean; agreement: per metric, Kendall tau against the
    AUC-IoU ranking and the number of method pairs whose order it reverses, out of all pairs).

    ``summary`` is an ``auc_iou_table``. Ties share the average rank (e.g. 2.5); a metric
    without ties has whole-number ranks, stored as integers so tables print "4", not "4.000".
    """
    ranks = summary[["method"]].copy()
    for metric in metrics:
        rank = summary[metric].rank(ascending=False, method="average")
        ranks[metric] = rank.astype(int) if bool((rank == rank.round()).all()) else rank
    reference = summary["auc_iou"].to_numpy()
    pairs = list(itertools.combinations(range(len(summary)), 2))
    rows = []
    for metric in metrics:
        values = summary[metric].to_numpy()
        tau = scipy_stats.kendalltau(reference, values).statistic
        reversed_pairs = sum(1 for i, j in pairs
                             if np.sign(reference[i] - reference[j]) * np.sign(values[i] - values[j]) < 0)
        rows.append({"metric": metric, "kendall_tau_vs_auc_iou": float(tau),
                     "reversed_pairs": reversed_pairs, "pairs": len(pairs)})
    return ranks, pd.DataFrame(rows)


def ranking_stability(table: pd.DataFrame, metrics: tuple[str, ...], methods=EXTENDED_METHODS, *,
                      replicates: int,
                      seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """How much of ``ranking_table`` survives resampling the images (``replicates`` image-bootstrap
    draws). Returns (tau: per metric, Kendall tau against the AUC-IoU ranking in the data with its
    percentile 95% CI; reversals: per metric and method pair reversed in the data,
    ``share_reversed``, the share of replicates in which the reversal holds)."""
    _single_group(table)
    matrices = {metric: _method_matrix(table, ranking_column(metric), methods) for metric in metrics}
    common = set.intersection(*(set(ids) for _, ids in matrices.values()))
    values = {}
    for metric, (matrix, ids) in matrices.items():
        keep = [index for index, sample_id in enumerate(ids) if sample_id in common]
        values[metric] = matrix[keep]
    n = len(common)
    counts = stats.bootstrap_draw_counts(n, replicates, seed)
    means = {metric: np.vstack([matrix.mean(axis=0), counts @ matrix / n]) for metric, matrix in values.items()}
    reference = means["auc_iou"]                           # row 0: the data, then replicates
    pairs = list(itertools.combinations(range(len(methods)), 2))
    tau_rows, reversal_rows = [], []
    for metric in metrics:
        taus = np.array([scipy_stats.kendalltau(reference[r], means[metric][r]).statistic
                         for r in range(replicates + 1)])
        low, high = stats.percentile_interval(taus[1:][~np.isnan(taus[1:])])
        tau_rows.append({"metric": metric, "kendall_tau_vs_auc_iou": float(taus[0]),
                         "tau_ci_low": float(low), "tau_ci_high": float(high), "n": n,
                         "replicates": replicates})
        for i, j in pairs:
            order = np.sign(reference[:, i] - reference[:, j]) * np.sign(means[metric][:, i] - means[metric][:, j])
            if order[0] < 0:
                reversal_rows.append({"metric": metric, "first": methods[i], "second": methods[j],
                                      "share_reversed": float((order[1:] < 0).mean()), "n": n})
    reversal_columns = ["metric", "first", "second", "share_reversed", "n"]
    return pd.DataFrame(tau_rows), pd.DataFrame(reversal_rows, columns=reversal_columns)


def auc_iou_by_subset(subsets: dict[str, pd.DataFrame], *, top_fraction: float, replicates: int,
                      seed: int) -> pd.DataFrame:
    """``auc_iou_table`` of every non-empty subset (name -> case rows) with a ``subset``
    column, concatenated in subset order."""
    return pd.concat([auc_iou_table(rows, top_fraction=top_fraction, replicates=replicates,
                                    seed=seed).assign(subset=subset)
                      for subset, rows in subsets.items() if not rows.empty], ignore_index=True)


def rankings_by_subset(auc_table: pd.DataFrame, *, top_fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``ranking_table`` of each subset of ``auc_iou_by_subset``'s table, with ``subset`` and
    its image count ``n``: (rankings, agreement between the rankings)."""
    rank_tables, agreement_tables = [], []
    for subset, part in auc_table.groupby("subset", sort=False):
        ranks, agreement = ranking_table(part.reset_index(drop=True), ranking_metrics(top_fraction))
        rank_tables.append(ranks.assign(subset=subset, n=int(part["n"].iloc[0])))
        agreement_tables.append(agreement.assign(subset=subset, n=int(part["n"].iloc[0])))
    return pd.concat(rank_tables, ignore_index=True), pd.concat(agreement_tables, ignore_index=True)


def wilcoxon_by_subset(subsets: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """``pairwise_wilcoxon`` of every subset with at least two images, with ``subset``."""
    return pd.concat([pairwise_wilcoxon(rows).assign(subset=subset)
                      for subset, rows in subsets.items() if rows["sample_id"].nunique() >= 2],
                     ignore_index=True)


def ranking_stability_by_subset(subsets: dict[str, pd.DataFrame], *, top_fraction: float, replicates: int,
                                seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``ranking_stability`` for every non-empty subset (name -> case rows), each result
    with a ``subset`` column, concatenated: (tau table, reversal table)."""
    taus, reversals = [], []
    for subset, rows in subsets.items():
        if rows.empty:
            continue
        tau, reversal = ranking_stability(rows, ranking_metrics(top_fraction), replicates=replicates, seed=seed)
        taus.append(tau.assign(subset=subset))
        reversals.append(reversal.assign(subset=subset))
    return pd.concat(taus, ignore_index=True), pd.concat(reversals, ignore_index=True)


def pairwise_wilcoxon(table: pd.DataFrame, column: str = "auc_iou", methods=MODEL_METHODS) -> pd.DataFrame:
    """Paired two-sided Wilcoxon signed-rank tests of ``column`` between every pair of
    ``methods`` over the same images, median paired difference, Holm-adjusted p-values."""
    _single_group(table)
    matrix, _ = _method_matrix(table, column, methods)
    rows = []
    for (i, first), (j, second) in itertools.combinations(enumerate(methods), 2):
        test = stats.paired_wilcoxon(matrix[:, i], matrix[:, j])
        rows.append({"first": first, "second": second, "n": matrix.shape[0],
                     "median_difference": float(np.median(matrix[:, i] - matrix[:, j])),
                     "n_nonzero": test["n_nonzero"], "p_value": test["p_value"]})
    result = pd.DataFrame(rows)
    result["p_holm"] = stats.holm_adjust(result["p_value"].to_numpy())
    return result


# A relative difference needs a reference away from zero: below a mean IoU of 0.05 the ratio
# measures the denominator's noise.
MIN_RELATIVE_REFERENCE = 0.05


def threshold_bias_tests(table: pd.DataFrame, methods=MODEL_METHODS,
                         thresholds=localisation.DEFAULT_IOU_THRESHOLDS) -> pd.DataFrame:
    """The threshold-free paper's bias tests: per method and threshold t, a paired two-sided
    Wilcoxon signed-rank test of AUC-IoU / grid width against IoU(t) over the same images, Holm
    over methods x thresholds.

    Columns: method, iou_threshold, n, mean_auc_iou, mean_iou, rel_diff_pct ((AUC - IoU) / IoU x
    100; NaN where mean IoU(t) < ``MIN_RELATIVE_REFERENCE``), grid_mean_difference (mean of
    AUC / width - IoU(t), 0 for a binary map), n_nonzero, p_value, p_holm.
    """
    _single_group(table)
    levels = np.asarray(localisation.DEFAULT_IOU_THRESHOLDS)
    width = float(levels[-1] - levels[0])
    rows = []
    for method in methods:
        part = table[table["method"] == method]
        auc = part["auc_iou"].to_numpy(float)
        for level in thresholds:
            iou = part[iou_column(level)].to_numpy(float)
            test = stats.paired_wilcoxon(auc / width, iou)
            mean_iou = float(iou.mean()) if len(iou) else np.nan
            rows.append({"method": method, "iou_threshold": float(level), "n": len(part),
                         "mean_auc_iou": float(auc.mean()) if len(auc) else np.nan, "mean_iou": mean_iou,
                         "rel_diff_pct": ((auc.mean() - mean_iou) / mean_iou * 100
                                          if mean_iou >= MIN_RELATIVE_REFERENCE else np.nan),
                         "grid_mean_difference": float((auc / width - iou).mean()) if len(iou) else np.nan,
                         "n_nonzero": test["n_nonzero"], "p_value": test["p_value"]})
    result = pd.DataFrame(rows)
    result["p_holm"] = stats.holm_adjust_defined(result["p_value"].to_numpy())
    return result


def size_tertiles(table: pd.DataFrame) -> pd.Series:
    """Lesion-size tertile label per row (by the lesion's share of the field of view, cut at the
    images' 1/3 and 2/3 quantiles): 'small', 'medium', 'large'."""
    per_image = table.drop_duplicates("sample_id").set_index("sample_id")["lesion_fov_fraction"]
    if per_image.nunique() < 3:
        labels = pd.Series("all", index=per_image.index)
    else:
        labels = pd.qcut(per_image.rank(method="first"), 3, labels=["small", "medium", "large"]).astype(str)
    return table["sample_id"].map(labels)


def chance_table(table: pd.DataFrame, methods=EXTENDED_METHODS, by_size: bool = True, *,
                 replicates: int, seed: int) -> pd.DataFrame:
    """Energy lift and pointing against chance, per method (and lesion-size tertile).

    Columns: n, n_constant, n_saliency_free, lambda_E mean [bootstrap CI] and median (bits), share
    with lambda_E > 0, pointing hit rate with its Wilson CI, mean chance pi_PG, hits above chance
    (rate - chance), and the mean paired lambda_E difference from the DoG map with its CI.
    """
    _single_group(table)
    table = table.assign(size_tertile=size_tertiles(table) if by_size else "all")
    strata = ["all"] + (sorted(set(table["size_tertile"]) - {"all"},
                               key=["small", "medium", "large"].index) if by_size else [])
    rows = []
    for stratum in strata:
        part = table if stratum == "all" else table[table["size_tertile"] == stratum]
        lift, ids = _method_matrix(part.dropna(subset=["energy_lift_bits"]), "energy_lift_bits", methods)
        dog = lift[:, list(methods).index("dog")] if "dog" in methods else None
        for index, method in enumerate(methods):
            rows_m = part[part["method"] == method]
            interval = stats.bootstrap_mean_ci(lift[:, index], replicates=replicates, seed=seed)
            hit_interval = stats.rate_ci(rows_m["pointing_hit"].to_numpy(float))
            row = {"size_tertile": stratum, "method": method, "n": len(rows_m),
                   "n_constant": int(rows_m["constant_map"].sum()),
                   "n_saliency_free": int(rows_m["saliency_free"].sum()),
                   "lambda_e_mean": interval["estimate"], "lambda_e_ci_low": interval["ci_low"],
                   "lambda_e_ci_high": interval["ci_high"],
                   "lambda_e_median": float(np.median(lift[:, index])),
                   "share_lambda_e_above_0": float((lift[:, index] > 0).mean()),
                   "hit_rate": float(rows_m["pointing_hit"].mean()),
                   "hit_rate_ci_low": hit_interval["ci_low"], "hit_rate_ci_high": hit_interval["ci_high"],
                   "chance": float(rows_m["pointing_chance"].mean()),
                   "hits_above_chance": float(rows_m["pointing_hit"].mean() - rows_m["pointing_chance"].mean())}
            if dog is not None and method != "dog":
                gap = stats.paired_difference_ci(lift[:, index], dog, replicates=replicates, seed=seed)
                row.update({"lambda_e_minus_dog": gap["estimate"], "minus_dog_ci_low": gap["ci_low"],
                            "minus_dog_ci_high": gap["ci_high"]})
            rows.append(row)
    return pd.DataFrame(rows)


def auc_iou_by_size(table: pd.DataFrame, methods=EXTENDED_METHODS, *, top_fraction: float) -> pd.DataFrame:
    """Mean AUC-IoU and top-area IoU (``top_fraction``) per method and lesion-size tertile (n
    per cell)."""
    _single_group(table)
    table = table.assign(size_tertile=size_tertiles(table))
    grouped = table[table["method"].isin(methods)].groupby(["size_tertile", "method"], sort=False)
    result = grouped.agg(n=("auc_iou", "size"), auc_iou=("auc_iou", "mean"),
                         **{top_area_metric(top_fraction): (topk_column("iou", top_fraction), "mean")}).reset_index()
    return result


def iou_curves(table: pd.DataFrame, methods=EXTENDED_METHODS) -> pd.DataFrame:
    """Long table: method, iou_threshold, mean IoU over the images (for the curve figure)."""
    rows = []
    for method in methods:
        part = table[table["method"] == method]
        for level in localisation.DEFAULT_IOU_THRESHOLDS:
            rows.append({"method": method, "iou_threshold": level, "mean_iou": part[iou_column(level)].mean(),
                         "n": len(part)})
    return pd.DataFrame(rows)


def top_k_table(table: pd.DataFrame, methods=EXTENDED_METHODS) -> pd.DataFrame:
    """Long table: method, fraction k, mean IoU and mean energy of the top-k set."""
    rows = []
    for method in methods:
        part = table[table["method"] == method]
        for fraction in localisation.TOP_K_FRACTIONS:
            rows.append({"method": method, "fraction": fraction, "n": len(part),
                         "mean_iou": part[topk_column("iou", fraction)].mean(),
                         "mean_energy": part[topk_column("energy", fraction)].mean()})
    return pd.DataFrame(rows)


def cost_ratio(summaries: Iterable[dict]) -> float:
    """Extended-metric seconds / CAM seconds over the given run summaries."""
    summaries = list(summaries)
    return sum(s["metric_seconds"] for s in summaries) / sum(s["cam_seconds"] for s in summaries)


def with_note(table: pd.DataFrame, note: str = CONSTANT_NOTE) -> pd.DataFrame:
    """The table with a ``note`` column saying how constant maps were treated."""
    return table.assign(note=note)


def noted(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """``with_note`` on every table of a name -> table dict (what notebook 07 saves)."""
    return {name: with_note(table) for name, table in tables.items()}


# --- notebook 07's scoring runs and what it says about them -------------------------------------
# ``scoring`` below is the notebook's one recipe, passed whole to ``score_registered``:
# image_size, settings (LocalisationSettings), replicates, seed, batch_size, device.

def keep_scores(run_dir: str | Path, table: pd.DataFrame, dataset: str, checkpoint_id: str) -> Path:
    """Write one checkpoint's per-image scores to the run folder; return the path."""
    return write_parquet_atomic(table, RunLayout(run_dir).extended_table(dataset, checkpoint_id))


def panel_subsets(table: pd.DataFrame, score_threshold: float) -> dict[str, pd.DataFrame]:
    """{"all images": table, "panel A": its images with scaled score >= ``score_threshold``}."""
    panel_a = set(table.loc[table["scaled_score"] >= score_threshold, "sample_id"])
    return {"all images": table, "panel A": table[table["sample_id"].isin(panel_a)]}


def describe_scales(settings: LocalisationSettings, image_size: int) -> str:
    """The localisation scales in pixels at the input size (``LocalisationSettings.pixels``)."""
    return "Scales at the input size of %d px: %s." % (image_size, ", ".join(
        f"{name} = {value:.2f}" for name, value in settings.pixels(image_size).items()))


def describe_scored(run: dict, subsets: dict[str, pd.DataFrame], score_threshold: float) -> str:
    """One sentence on a scored checkpoint (``score_registered``'s record) and its panel A."""
    return (f"`{run['checkpoint_id']}`: {run['n_audited']} masked images scored ({run['n_empty_masks_excluded']} "
            f"empty after resizing, excluded); panel A: {subsets['panel A']['sample_id'].nunique()} images at "
            f"scaled score ≥ {score_threshold:.2f}.")


def describe_rankings(ranked: pd.DataFrame, top_fraction: float) -> str:
    """The all-images ranking by AUC-IoU and by the top-area IoU (``rankings_by_subset``)."""
    everything = ranked[ranked["subset"] == "all images"]
    by_auc = " > ".join(method_label(m) for m in everything.sort_values("auc_iou")["method"])
    by_top_area = " > ".join(method_label(m) for m in everything.sort_values(top_area_metric(top_fraction))["method"])
    return f"**All images, ranking by AUC-IoU:** {by_auc}.\n\n**By top-{top_fraction:.0%} IoU:** {by_top_area}."


def describe_chance(chance: pd.DataFrame) -> str:
    """Each model map's energy lift against the DoG map's and its hit rate against chance
    (``chance_table``'s all-sizes rows), one line per method."""
    overall = chance[chance["size_tertile"] == "all"].set_index("method")
    dog = overall.loc["dog"]
    return "\n".join(
        f"- {method_label(m)}: λ_E = {overall.loc[m, 'lambda_e_mean']:.2f} bits "
        f"(DoG {dog['lambda_e_mean']:.2f}; difference {overall.loc[m, 'lambda_e_minus_dog']:+.2f}, "
        f"95% CI {overall.loc[m, 'minus_dog_ci_low']:+.2f} to {overall.loc[m, 'minus_dog_ci_high']:+.2f}); "
        f"hits {overall.loc[m, 'hit_rate']:.2f} vs chance {overall.loc[m, 'chance']:.2f}"
        for m in EXTENDED_METHODS if m != "dog" and m in overall.index)


@dataclass
class MatrixScores:
    """The training matrix on the masked pool (``score_matrix``): the runs scored (the
    primary's excluded), C-Scores of both classes, AUC-IoU per checkpoint, the kept score files."""
    runs: list[dict]
    c_scores: pd.DataFrame
    auc_iou: pd.DataFrame
    files: list[Path]


def score_matrix(run_dir: str | Path, data_dir: str | Path, primary_id: str, primary_table: pd.DataFrame,
                 primary_c_score: pd.DataFrame, *, all_checkpoints: bool, c_score_negatives: int,
                 top_fraction: float, scoring: dict) -> MatrixScores:
    """AUC-IoU of every registry checkpoint (``all_checkpoints``; else the primary only) and the
    C-Scores of both classes: the lesion class over each checkpoint's masked images, the
    negative class over its correctly classified test negatives (at most ``c_score_negatives``)."""
    replicates, seed = scoring["replicates"], scoring["seed"]
    registry = RunLayout(run_dir).read_registry()
    c_rows = [primary_c_score]
    auc_rows = [auc_iou_table(primary_table, top_fraction=top_fraction, replicates=replicates, seed=seed)
                .assign(checkpoint_id=primary_id)]
    others = [c for c in registry["checkpoint_id"] if c != primary_id] if all_checkpoints else []
    runs, kept = [], []
    for checkpoint_id in others:
        table, c_score, run = score_registered(run_dir, data_dir, checkpoint_id, **scoring)
        kept.append(keep_scores(run_dir, table, "hyperkvasir", checkpoint_id))
        runs.append(run)
        c_rows.append(c_score)
        auc_rows.append(auc_iou_table(table, top_fraction=top_fraction, replicates=replicates, seed=seed)
                        .assign(checkpoint_id=checkpoint_id))
    for checkpoint_id in [primary_id, *others]:
        c_rows.append(negative_c_score_registered(run_dir, data_dir, checkpoint_id,
                                                  max_images=c_score_negatives, **scoring))
    return MatrixScores(runs, pd.concat([rows for rows in c_rows if not rows.empty], ignore_index=True),
                        pd.concat(auc_rows, ignore_index=True), kept)


@dataclass
class ExternalScores:
    """The primary on the external cohorts (``score_external``): runs, AUC-IoU and chance per
    cohort (empty tables when no cohort was found), the kept score files."""
    runs: list[dict]
    auc_iou: pd.DataFrame
    chance: pd.DataFrame
    files: list[Path]


def score_external(run_dir: str | Path, data_dir: str | Path, primary_id: str, datasets, *,
                   top_fraction: float, scoring: dict) -> ExternalScores:
    """The primary's AUC-IoU and chance tables on each external cohort found under ``data_dir``
    (``transfer.external_cases``: cases overlapping the HyperKvasir manifest left out)."""
    replicates, seed = scoring["replicates"], scoring["seed"]
    auc_rows, chance_rows, runs, kept = [], [], [], []
    for dataset, cases in transfer.external_cases(run_dir, data_dir, datasets).items():
        table, _, run = score_registered(run_dir, data_dir, primary_id, cases=cases, dataset=dataset,
                                         case_iterator=cohorts.iter_cases, **scoring)
        kept.append(keep_scores(run_dir, table, dataset, primary_id))
        runs.append(run)
        auc_rows.append(auc_iou_table(table, top_fraction=top_fraction, replicates=replicates, seed=seed)
                        .assign(dataset=dataset))
        chance_rows.append(chance_table(table, by_size=False, replicates=replicates, seed=seed).assign(dataset=dataset))
    combine = lambda rows: pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()  # noqa: E731
    return ExternalScores(runs, combine(auc_rows), combine(chance_rows), kept)


def describe_cost(runs: list[dict]) -> str:
    """Extended metrics against the CAM computation over ``runs`` (the primary's first)."""
    primary = runs[0]
    return (f"Extended metrics / CAM computation: {cost_ratio(runs):.1%} "
            f"(primary: {primary['metric_seconds'] / primary['cam_seconds']:.1%}).")
