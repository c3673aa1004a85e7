"""Faithfulness and sanity controls of the CAMs of one checkpoint on one masked cohort (notebook 08).

From prepared cases (``prepare_cases``: as in the audit; cases whose mask is empty after
resizing are excluded and counted): ROAD / SRG (``kernels.road``), LSR and shape-preserving
deletion (``kernels.reliance``), cascading randomisation (``kernels.randomisation``) and the
case-level outcomes and covariates of the subgroup models (``localisation_outcomes``). Every
seed derives from the sample id, so results do not depend on batch size or order.
Conventions: docs/architecture.md, "Faithfulness and subgroup conventions"; method:
docs/maps_and_scores.md, "Faithfulness tables".
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pandas as pd
import torch

from endoexplain_core import config, files
from endoexplain_core.run_layout import RunLayout
from endoexplain_core.config import LocalisationSettings
from endoexplain_core.analysis import audit, audit_inputs, audit_schema, stats
from endoexplain_core.kernels import (cams, deletion, localisation, metrics,
                                      randomisation, reliance, road, threshold)
from endoexplain_core.methods import CAM_METHODS, method_label
from endoexplain_core.models import networks
from endoexplain_core.progress import progress_bar
from endoexplain_core.numerics import resolve_device


@dataclass(frozen=True)
class FaithfulnessControls:
    """Protocol parameters of the faithfulness controls: the 08 profile keys of the same names,
    the shared ``top_fraction`` and the tolerance zone's radius in pixels (``shared.localisation``
    at the input size). No defaults: every value comes from the profile."""

    road_fractions: tuple[float, ...]
    imputation_noise_std: float
    tolerance_radius_px: float
    lsr_regions: int
    shape_repetitions: int
    top_fraction: float
    road_methods: tuple[str, ...] = (*CAM_METHODS, "random")

    @classmethod
    def from_profile(cls, section: config.FaithfulnessSettings, *, localisation: LocalisationSettings,
                     image_size: int, top_fraction: float) -> "FaithfulnessControls":
        """The controls of a profile: its ``stages.08_faithfulness`` section, the shared
        ``localisation`` scales (the tolerance zone at ``image_size``) and ``top_fraction``."""
        return cls(road_fractions=tuple(section.road_fractions),
                   imputation_noise_std=section.imputation_noise_std,
                   tolerance_radius_px=localisation.pixels(image_size)["radius_px"],
                   lsr_regions=section.lsr_regions, shape_repetitions=section.shape_repetitions,
                   top_fraction=top_fraction)

    def __post_init__(self) -> None:
        unknown = [m for m in self.road_methods if m not in (*CAM_METHODS, "random", "centre")]
        if unknown:
            raise ValueError(f"road_methods: unknown maps {unknown}")
        if self.lsr_regions < 1 or self.shape_repetitions < 1:
            raise ValueError("lsr_regions and shape_repetitions must be positive")


@dataclass
class PreparedCases:
    """Cases at the model's input size: ids, float32 (N, 3, S, S) normalised images, bool
    (N, S, S) masks, and the ids excluded because their mask vanished when resized."""

    sample_ids: list[str]
    images: torch.Tensor
    masks: torch.Tensor
    excluded: list[str] = field(default_factory=list)


def prepare_cases(cases: Iterable, image_size: int) -> PreparedCases:
    """Resize (sample_id, uint8 RGB, bool mask) cases with ``audit_inputs.prepare_case``."""
    excluded: list[str] = []
    batches = list(audit_inputs.prepared_batches(cases, image_size, batch_size=2**31, excluded=excluded))
    if not batches:
        raise ValueError("no case with a non-empty mask at the model's input size")
    ids, images, masks = batches[0]
    return PreparedCases(list(ids), images, masks, excluded)


def faithfulness_batch(model, layer, images: torch.Tensor, masks: torch.Tensor, sample_ids,
                       *, temperature: float, settings: FaithfulnessControls,
                       timings: dict | None = None, include_shape: bool = True
                       ) -> dict[str, pd.DataFrame]:
    """ROAD, LSR and (``include_shape``) shape-preserving deletion of one batch. Returns:

    ``road``  per (sample_id, method, order, fraction): ``drop`` in z/T
    ``srg``   per (sample_id, method): ``srg`` and the mean MoRF and LeRF drops
    ``lsr``   per sample_id: ``zone_drop``, ``region_drop_mean``, ``n_regions``, ``lsr``,
              ``zone_area_fraction`` (|D_r| / |B|)
    ``shape`` per (sample_id, CAM method): ``cam_drop``, ``shifted_drop_mean``, ``n_shifts``,
              ``cam_minus_shifted`` (positive logit, as the deletion test), and the z drops
    ``timings`` (optional) accumulates imputation and forward seconds under ``"road"`` and ``"lsr"``.
    """
    keys = [deletion.sample_key(s) for s in sample_ids]
    maps, logits = audit.batch_maps(model, layer, images, list(sample_ids))
    reference_z = road.scaled_logit_difference(logits, temperature)
    fov = localisation.field_of_view(images, masks)
    road_maps = {m: maps[m] for m in settings.road_methods}
    drops = road.road_drops(model, images, road_maps, fov, keys, temperature=temperature,
                            fractions=settings.road_fractions,
                            noise_std=settings.imputation_noise_std, reference_z=reference_z,
                            timings=None if timings is None else timings.setdefault("road", {}))
    ids = np.asarray(sample_ids, dtype=object)
    road_rows, srg_rows = [], []
    for method, by_order in drops.items():
        for order, values in by_order.items():
            for index, fraction in enumerate(settings.road_fractions):
                road_rows.append(pd.DataFrame({"sample_id": ids, "method": method, "order": order,
                                               "fraction": fraction,
                                               "drop": values[index].cpu().numpy()}))
        srg_rows.append(pd.DataFrame({
            "sample_id": ids, "method": method,
            "srg": road.symmetric_relevance_gain(by_order["morf"], by_order["lerf"]).cpu().numpy(),
            "morf_drop_mean": by_order["morf"].mean(dim=0).cpu().numpy(),
            "lerf_drop_mean": by_order["lerf"].mean(dim=0).cpu().numpy()}))

    zones = localisation.tolerance_zone(masks, fov, settings.tolerance_radius_px)
    lsr = reliance.lesion_specific_reliance(model, images, zones, fov, keys, temperature=temperature,
                                            n_regions=settings.lsr_regions,
                                            noise_std=settings.imputation_noise_std,
                                            reference_z=reference_z,
                                            timings=None if timings is None else timings.setdefault("lsr", {}))
    lsr_table = pd.DataFrame({
        "sample_id": ids, "zone_drop": lsr["zone_drop"].numpy(),
        "region_drop_mean": lsr["region_drop_mean"].numpy(), "n_regions": lsr["n_regions"].numpy(),
        "lsr": lsr["lsr"].numpy(),
        "zone_area_fraction": (zones.flatten(1).sum(1) / fov.flatten(1).sum(1)).double().cpu().numpy()})

    shape_rows = []
    for method in CAM_METHODS if include_shape else ():
        top = threshold.top_fraction_mask(maps[method], settings.top_fraction)
        shape = reliance.shape_preserving_deletion(model, images, top, fov, keys, method=method,
                                                   repetitions=settings.shape_repetitions,
                                                   reference_logits=logits)
        shape_rows.append(pd.DataFrame({
            "sample_id": ids, "method": method, "cam_drop": shape["cam_drop"].numpy(),
            "shifted_drop_mean": shape["shifted_drop_mean"].numpy(),
            "n_shifts": shape["n_shifts"].numpy(),
            "cam_minus_shifted": (shape["cam_drop"] - shape["shifted_drop_mean"]).numpy(),
            "cam_z_drop": shape["cam_z_drop"].numpy(),
            "shifted_z_drop_mean": shape["shifted_z_drop_mean"].numpy()}))
    return {"road": pd.concat(road_rows, ignore_index=True),
            "srg": pd.concat(srg_rows, ignore_index=True), "lsr": lsr_table,
            "shape": pd.concat(shape_rows, ignore_index=True) if shape_rows else pd.DataFrame()}


def faithfulness_checkpoint(model, metadata: dict, temperature: float, prepared: PreparedCases, *,
                            dataset: str, settings: FaithfulnessControls, batch_size: int,
                            device: str = "cpu", include_shape: bool = True) -> dict:
    """Run ``faithfulness_batch`` over all prepared cases of one checkpoint (``include_shape`` False:
    ROAD and LSR only, an empty ``shape`` table). Returns ``{"road", "srg", "lsr", "shape"}``
    DataFrames (with ``dataset`` and ``checkpoint_id``) and ``timings`` (per imputing part, seconds
    of imputation and forwards and the forward count; ``total_s``), ``cost_table``'s input."""
    started = time.perf_counter()
    torch_device = resolve_device(device)
    model = model.to(torch_device).eval()
    _, layer = networks.resolve_target_layer(model, metadata["arch"], metadata.get("target_layer"))
    timings: dict = {}
    parts: dict[str, list[pd.DataFrame]] = {"road": [], "srg": [], "lsr": [], "shape": []}
    # ROAD solves one sparse system per image, fraction, order and map: minutes per checkpoint
    bar = progress_bar(total=len(prepared.sample_ids), desc=f"ROAD/LSR {metadata['checkpoint_id']} {dataset}",
                       unit="image")
    for start in range(0, len(prepared.sample_ids), batch_size):
        stop = start + batch_size
        tables = faithfulness_batch(model, layer, prepared.images[start:stop].to(torch_device),
                                    prepared.masks[start:stop].to(torch_device),
                                    prepared.sample_ids[start:stop], temperature=temperature,
                                    settings=settings, timings=timings, include_shape=include_shape)
        for name, table in tables.items():
            parts[name].append(table)
        bar.update(len(prepared.sample_ids[start:stop]))
    bar.close()
    result = {name: pd.concat(tables, ignore_index=True).assign(
        dataset=dataset, checkpoint_id=str(metadata["checkpoint_id"])) for name, tables in parts.items()}
    timings["total_s"] = time.perf_counter() - started
    result["timings"] = timings
    return result


TABLE_PARTS = ("road", "srg", "lsr", "shape")


def faithfulness_registered(run_dir, checkpoint_ids, prepared: PreparedCases, *,
                            settings: FaithfulnessControls, image_size: int, batch_size: int,
                            device: str = "cpu") -> tuple[dict[str, pd.DataFrame], dict[str, dict]]:
    """``faithfulness_checkpoint`` for registered checkpoints of a run on its audit pool.

    Each checkpoint is loaded with its temperature (``audit.load_calibrated_model``). Returns
    (tables, timings): ``TABLE_PARTS`` name -> the checkpoints' rows stacked, each also written
    to ``RunLayout.faithfulness_dir/<name>.parquet``; checkpoint_id -> its timings
    (``cost_table``'s input).
    """
    results = {}
    for checkpoint_id in checkpoint_ids:
        model, metadata, temperature = audit.load_calibrated_model(run_dir, checkpoint_id, image_size, device)
        results[checkpoint_id] = faithfulness_checkpoint(
            model, metadata, temperature, prepared, dataset="hyperkvasir", settings=settings,
            batch_size=batch_size, device=device)
    tables = {name: pd.concat([r[name] for r in results.values()], ignore_index=True) for name in TABLE_PARTS}
    out_dir = RunLayout(run_dir).faithfulness_dir
    for name, table in tables.items():
        files.write_parquet_atomic(table, out_dir / f"{name}.parquet")
    return tables, {checkpoint_id: r["timings"] for checkpoint_id, r in results.items()}


IMPUTING_PARTS = ("road", "lsr")


def cost_table(timings_by_checkpoint: dict[str, dict]) -> pd.DataFrame:
    """Imputation cost next to the forwards it feeds, one row per checkpoint and part.

    ``timings_by_checkpoint``: checkpoint_id -> ``faithfulness_checkpoint(...)["timings"]``.
    Columns: checkpoint_id, part (road / lsr / all), forwards_fed, imputation_s, forward_s,
    imputation_per_forward_time and total_s (whole checkpoint, on the ``all`` row only).
    """
    rows = []
    for checkpoint_id, timings in timings_by_checkpoint.items():
        parts = {part: timings.get(part, {}) for part in IMPUTING_PARTS}
        parts["all"] = {key: sum(p.get(key, 0) for p in parts.values())
                        for key in ("forwards", "imputation_s", "forward_s")}
        for part, values in parts.items():
            imputation_s = float(values.get("imputation_s", 0.0))
            forward_s = float(values.get("forward_s", 0.0))
            rows.append({"checkpoint_id": checkpoint_id, "part": part,
                         "forwards_fed": int(values.get("forwards", 0)),
                         "imputation_s": imputation_s, "forward_s": forward_s,
                         "imputation_per_forward_time": imputation_s / forward_s if forward_s > 0 else np.nan,
                         "total_s": float(timings["total_s"]) if part == "all" else np.nan})
    return pd.DataFrame(rows)


# --- summaries ------------------------------------------------------------------------------

def _mean_ci_rows(table: pd.DataFrame, by: list[str], value: str, replicates: int, seed: int
                  ) -> pd.DataFrame:
    rows = []
    for key, part in table.groupby(by, sort=False):
        values = part[value].dropna().to_numpy()
        summary = stats.bootstrap_mean_ci(values, replicates=replicates, seed=seed)
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), value: summary["estimate"], "ci_low": summary["ci_low"],
                     "ci_high": summary["ci_high"], "n": int(summary["n"]),
                     "share_positive": float((values > 0).mean()) if len(values) else np.nan})
    return pd.DataFrame(rows)


def srg_table(srg: pd.DataFrame, *, replicates: int, seed: int) -> pd.DataFrame:
    """Per checkpoint and method: mean ``srg`` with image-bootstrap 95% CI, n, share > 0."""
    return _mean_ci_rows(srg, ["checkpoint_id", "method"], "srg", replicates, seed)


def road_curves(road_table: pd.DataFrame, *, replicates: int, seed: int) -> pd.DataFrame:
    """Per checkpoint, method, order and fraction: mean ``drop`` (z/T) with its 95% CI."""
    return _mean_ci_rows(road_table, ["checkpoint_id", "method", "order", "fraction"], "drop",
                         replicates, seed)


def lsr_table(lsr: pd.DataFrame, *, replicates: int, seed: int) -> pd.DataFrame:
    """Per checkpoint: mean ``lsr`` over images with a comparison region (95% CI), the mean
    zone and region drops, and how many images had no comparison region."""
    rows = _mean_ci_rows(lsr, ["checkpoint_id"], "lsr", replicates, seed)
    extra = lsr.groupby("checkpoint_id", sort=False).agg(
        zone_drop=("zone_drop", "mean"), region_drop=("region_drop_mean", "mean"),
        images=("sample_id", "size"), no_region=("n_regions", lambda n: int((n == 0).sum())),
        mean_regions=("n_regions", "mean"))
    return rows.merge(extra.reset_index(), on="checkpoint_id")


def shape_deletion_table(shape: pd.DataFrame, pixel_random: pd.DataFrame | None, *,
                         replicates: int, seed: int) -> pd.DataFrame:
    """Per checkpoint and CAM: CAM deletion minus the shape-preserving random deletion (mean, 95% CI,
    positive logit drop), the mean ``cam_drop`` and ``shifted_drop`` over the same images and
    ``no_shift`` (images without a shift); with the audit's pixel-wise random-deletion table
    (``logit_drop_mean`` per sample), CAM deletion minus that control too, over every image."""
    table = _mean_ci_rows(shape, ["checkpoint_id", "method"], "cam_minus_shifted", replicates, seed)
    paired = shape.assign(cam_drop_paired=shape["cam_drop"].where(shape["cam_minus_shifted"].notna()))
    means = paired.groupby(["checkpoint_id", "method"], sort=False).agg(
        cam_drop=("cam_drop_paired", "mean"), shifted_drop=("shifted_drop_mean", "mean"),
        no_shift=("n_shifts", lambda n: int((n == 0).sum()))).reset_index()
    table = table.merge(means, on=["checkpoint_id", "method"])
    if pixel_random is not None:
        joined = shape.merge(pixel_random[["checkpoint_id", "sample_id", "logit_drop_mean"]],
                             on=["checkpoint_id", "sample_id"], how="inner")
        joined["cam_minus_pixel_random"] = joined["cam_drop"] - joined["logit_drop_mean"]
        pixel = _mean_ci_rows(joined, ["checkpoint_id", "method"], "cam_minus_pixel_random",
                              replicates, seed).rename(columns={"ci_low": "pixel_ci_low",
                                                                "ci_high": "pixel_ci_high",
                                                                "n": "pixel_n",
                                                                "share_positive": "pixel_share_positive"})
        table = table.merge(pixel, on=["checkpoint_id", "method"], how="left")
    return table


# --- cascading randomisation -----------------------------------------------------------------

def randomisation_similarity(model, metadata: dict, prepared: PreparedCases, *, seed: int,
                             top_fraction: float, batch_size: int, device: str = "cpu"
                             ) -> pd.DataFrame:
    """Per (step, block, sample_id, method): similarity of the CAM after cumulative
    randomisation up to ``block`` with the trained CAM (``spearman``, ``top_iou``) and the
    randomised map's spatial metrics against the lesion (``iou``, ``energy_in_mask``,
    ``peak_outside_mask``); step 0 (``block`` = "trained") holds the trained maps' metrics."""
    torch_device = resolve_device(device)
    model = model.to(torch_device).eval()
    layer_name, _ = networks.resolve_target_layer(model, metadata["arch"], metadata.get("target_layer"))

    def maps_of(net) -> dict[str, torch.Tensor]:
        layer = net.get_submodule(layer_name)
        parts = [cams.compute_cams(net, layer, prepared.images[s:s + batch_size].to(torch_device),
                                   target_class=1, methods=CAM_METHODS)
                 for s in range(0, len(prepared.sample_ids), batch_size)]
        return {m: torch.cat([p[m] for p in parts]).cpu() for m in CAM_METHODS}

    trained = maps_of(model)
    rows = []
    # The cascade yields one model randomised further at each step: consume it lazily.
    steps = itertools.chain([("trained", model)], randomisation.cascade(model, seed=seed))
    for step, (block, net) in enumerate(steps):
        current = trained if step == 0 else maps_of(net)
        for method in CAM_METHODS:
            spatial = metrics.spatial_metrics(current[method], prepared.masks, top_fraction)
            rows.append(pd.DataFrame({
                "step": step, "block": block, "sample_id": prepared.sample_ids, "method": method,
                "spearman": randomisation.spearman_per_image(current[method], trained[method]),
                "top_iou": randomisation.top_area_iou(current[method], trained[method], top_fraction),
                "iou": spatial["iou"].double().numpy(),
                "energy_in_mask": spatial["energy_in_mask"].double().numpy(),
                "peak_outside_mask": spatial["peak_outside_mask"].numpy(),
                "constant_map": spatial["constant_map"].numpy()}))
    return pd.concat(rows, ignore_index=True).assign(checkpoint_id=str(metadata["checkpoint_id"]))


def randomisation_table(similarity: pd.DataFrame) -> pd.DataFrame:
    """Per (step, block, method): mean ``spearman`` (over non-constant map pairs), mean
    ``top_iou``, and the Table 4 quantities of the (randomised) maps: mean IoU with the lesion,
    mean energy in the mask, share of peaks outside the mask; plus constant-map counts."""
    return similarity.groupby(["step", "block", "method"], sort=False).agg(
        spearman=("spearman", "mean"), top_iou=("top_iou", "mean"), mean_iou=("iou", "mean"),
        energy_in_mask=("energy_in_mask", "mean"), peak_outside_rate=("peak_outside_mask", "mean"),
        constant_maps=("constant_map", "sum"), images=("sample_id", "size")).reset_index()


# --- case-level outcomes for the subgroup analysis -------------------------------------------

def localisation_outcomes(model, metadata: dict, temperature: float, prepared: PreparedCases, *,
                          settings: LocalisationSettings, decision_threshold: float, batch_size: int,
                          device: str = "cpu", methods=CAM_METHODS) -> pd.DataFrame:
    """Per (sample_id, method): ``energy_lift`` (bits), ``pointing_hit`` (0/1),
    ``pointing_chance``, and the image's covariates: ``log_lesion_area`` (natural log of the
    lesion's share of the field of view), ``centrality`` (lesion centroid distance from the
    frame centre / half-diagonal, ``metrics.lesion_centre_distance``), ``fov_area`` (field of
    view share of the frame), ``z``, ``margin`` = |z - t| / T with t = T logit(decision
    threshold), ``correct`` (z > t, every case being a polyp) and ``dog_lift`` (energy lift of
    the DoG conspicuity map). ``settings``: the profile's ``shared.localisation`` scales."""
    torch_device = resolve_device(device)
    model = model.to(torch_device).eval()
    _, layer = networks.resolve_target_layer(model, metadata["arch"], metadata.get("target_layer"))
    scales = settings.pixels(prepared.images.shape[-1])
    p = decision_threshold
    threshold_z = temperature * math.log(p / (1 - p))
    parts = []
    for start in range(0, len(prepared.sample_ids), batch_size):
        ids = prepared.sample_ids[start:start + batch_size]
        images = prepared.images[start:start + batch_size].to(torch_device)
        masks = prepared.masks[start:start + batch_size].to(torch_device)
        maps, logits = audit.batch_maps(model, layer, images, list(ids))
        z = deletion.logit_difference(logits.double()).cpu().numpy()
        fov = localisation.field_of_view(images, masks)
        lesion_share = ((masks & fov).flatten(1).sum(1) / fov.flatten(1).sum(1)).double().cpu().numpy()
        dog = localisation.dog_conspicuity(images, scales["dog_sigma_small_px"],
                                           scales["dog_sigma_large_px"], fov)
        image_columns = {
            "sample_id": np.asarray(ids, dtype=object),
            "log_lesion_area": np.log(lesion_share),
            "centrality": metrics.lesion_centre_distance(masks).double().cpu().numpy(),
            "fov_area": fov.flatten(1).double().mean(1).cpu().numpy(),
            "z": z, "margin": np.abs(z - threshold_z) / temperature,
            "correct": (z > threshold_z).astype(float),
            "dog_lift": localisation.energy_lift_bits(dog, masks, fov,
                                                      settings.energy_alpha).double().cpu().numpy()}
        for method in methods:
            hits, chance = localisation.pointing_hits(maps[method], masks, fov,
                                                      radius_px=scales["radius_px"],
                                                      smooth_sigma_px=scales["smooth_sigma_px"])
            parts.append(pd.DataFrame({
                **image_columns, "method": method,
                "energy_lift": localisation.energy_lift_bits(maps[method], masks, fov,
                                                             settings.energy_alpha).double().cpu().numpy(),
                "pointing_hit": hits.double().cpu().numpy(),
                "pointing_chance": chance.double().cpu().numpy()}))
    return pd.concat(parts, ignore_index=True).assign(checkpoint_id=str(metadata["checkpoint_id"]))


# --- notebook 08's inputs and what it says beside its tables ------------------------------------

def analysed_checkpoints(run_dir, all_checkpoints: bool) -> list[str]:
    """The checkpoints notebook 08 analyses: the primary first, then (``all_checkpoints``) every
    other registered one."""
    order = RunLayout(run_dir).read_registry().sort_values("is_primary", ascending=False, kind="stable")
    return list(order["checkpoint_id"] if all_checkpoints else order.loc[order["is_primary"], "checkpoint_id"])


def describe_cases(primary_id: str, checkpoint_ids, pool: pd.DataFrame, prepared: PreparedCases,
                   image_size: int) -> str:
    """The checkpoints analysed and the masked pool prepared at the input size."""
    return (f"Primary checkpoint `{primary_id}`; checkpoints analysed: "
            f"{', '.join(f'`{c}`' for c in checkpoint_ids)}. Masked audit pool: {len(pool)} images, "
            f"{len(prepared.sample_ids)} with a mask left at {image_size} px ({len(prepared.excluded)} excluded).")


def describe_srg(srg_summary: pd.DataFrame, checkpoint_id: str) -> str:
    """One checkpoint's SRG per method (``srg_table``) with its interval and positive share."""
    rows = srg_summary[srg_summary["checkpoint_id"] == checkpoint_id].set_index("method")
    return "Primary checkpoint, SRG (z/T, mean [95% CI]): " + "; ".join(
        f"{method_label(m)} {r.srg:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}], > 0 in {100 * r.share_positive:.0f}% "
        "of images" for m, r in rows.iterrows()) + "."


def pixel_random_deletion(run_dir, checkpoint_ids) -> pd.DataFrame | None:
    """04/05's pixel-wise random deletions of ``checkpoint_ids`` where the run has them (None:
    none), the reference beside the shape-preserving control."""
    layout = RunLayout(run_dir)
    paths = [layout.audit_paths("hyperkvasir", c)["random_deletion"] for c in checkpoint_ids]
    parts = [audit_schema.read_random_deletion(path) for path in paths if path.is_file()]
    return pd.concat(parts, ignore_index=True) if parts else None


def first_cases(prepared: PreparedCases, n_images: int) -> PreparedCases:
    """The first ``n_images`` prepared cases (the randomisation check's subset)."""
    return PreparedCases(prepared.sample_ids[:n_images], prepared.images[:n_images], prepared.masks[:n_images])
