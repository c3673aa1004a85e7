"""Notebook 04 (spatial audit of the primary), one function per section: the audit, Table 4,
paired tests with map identity, map ties, map priors and Figure 3. Each returns a
``presentation.Section``; Table 4 and Figure 3 are ``figures.audit_report``'s, the same
assembly ``endoexplain audit`` uses."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch

from endoexplain_core.analysis import audit, audit_inputs, audit_schema, map_diagnostics, summaries, validity_gate
from endoexplain_core.data.datasets import load_manifest
from endoexplain_core.figures import audit_report
from endoexplain_core.models import networks
from endoexplain_core.numerics import resolve_device
from endoexplain_core import marks
from endoexplain_core.presentation import Section
from endoexplain_core.run_layout import RunLayout


class PrimaryAudit(NamedTuple):
    """The primary's audit as the later sections read it: its rows (``table``), random
    deletions and held-out negatives, the model with its metadata and target layer, and the
    masked pool it was run on."""
    table: pd.DataFrame
    random_deletion: pd.DataFrame
    negatives: pd.DataFrame
    model: torch.nn.Module
    metadata: dict
    layer_name: str
    layer: torch.nn.Module
    pool: pd.DataFrame


def primary_audit(run_dir: str | Path, cohort_root: str | Path, primary_id: str, *, image_size: int,
                  top_fraction: float, repetitions: int, batch_size: int, device: str, prior_negatives: int
                  ) -> tuple[PrimaryAudit, Section]:
    """Audit the primary checkpoint (``audit.audit_registered_checkpoint``; reused when its inputs
    are unchanged) and load what the later sections need."""
    layout = RunLayout(run_dir)
    run = audit.audit_registered_checkpoint(
        run_dir, cohort_root, primary_id, image_size=image_size, top_fraction=top_fraction,
        repetitions=repetitions, batch_size=batch_size, device=device, prior_negatives=prior_negatives)
    paths = layout.audit_paths("hyperkvasir", primary_id)
    table = audit_schema.read_audit_table(paths["table"])
    model, metadata = audit.load_registered_model(run_dir, primary_id, image_size, device)
    layer_name, layer = networks.resolve_target_layer(model, metadata["arch"], metadata.get("target_layer"))
    primary = PrimaryAudit(table, audit_schema.read_random_deletion(paths["random_deletion"]),
                           pd.read_parquet(paths["negatives"]), model, metadata, layer_name, layer,
                           audit_inputs.masked_pool(load_manifest(layout.manifest)))
    statement = (f"Primary `{primary_id}` (T = {table['temperature'].iloc[0]:.3f}): {run['n_audited']} masked images "
                 f"audited, {run['n_empty_masks_excluded']} empty masks excluded.")
    shown = pd.Series({k: run[k] for k in ("checkpoint_id", "n_audited", "n_empty_masks_excluded", "reused")})
    return primary, Section(files=list(paths.values()), views=[shown], statement=statement)


def spatial_audit_table(primary: PrimaryAudit, gate, *, score_threshold: float, replicates: int, seed: int
                        ) -> tuple[audit_report.AuditSummary, Section]:
    """Table 4 with the gate's daggers (``audit_report.audit_summary``), its two panels and its
    formatted form."""
    summary = audit_report.audit_summary(primary.table, primary.random_deletion, primary.model, primary.layer_name,
                                         arch=primary.metadata["arch"], score_threshold=score_threshold,
                                         replicates=replicates, seed=seed, gate=gate)
    table4 = summary.summary
    n_a, n_b = summary.n_high_score, summary.n_audited
    gate_line = (marks.GATE_FOOTNOTE if gate is not None and validity_gate.failing_methods(gate)
                 else "All CAM methods pass the validity gate." if gate is not None else
                 "The validity gate has not been run.")
    statement = "\n\n".join([
        f"Panel A: {n_a} of {n_b} images with temperature-scaled score ≥ {score_threshold}; panel B: all {n_b}."
        + (" Panel A is EMPTY in this run: no image reached the threshold, so its rows are blank." if n_a == 0 else ""),
        summaries.temperature_statement(primary.table),
        "Every map is scored on the same images: a constant map (no peak) counts as a peak failure; "
        "'Constant maps' says how many, and the last column gives the rate over maps with a peak.",
        gate_line])
    return summary, Section(tables={"table4_spatial_audit": table4,
                                    "table4_panel_a": table4[table4["panel"] == "A"],
                                    "table4_panel_b": table4[table4["panel"] == "B"],
                                    "table4_spatial_audit_formatted": summary.formatted},
                            views=[summary.formatted], statement=statement)


def paired_tests(primary: PrimaryAudit, summary: audit_report.AuditSummary, cohort_root: str | Path, *,
                 score_threshold: float, top_fraction: float, image_size: int, batch_size: int, device: str,
                 replicates: int, seed: int) -> Section:
    """Paired tests between the methods on both panels (``summaries.paired_tests``, Holm within
    each outcome and panel), with the map-identity diagnostics that flag pairs which are not
    independent evidence (``map_diagnostics.checkpoint_map_diagnostics``) and Grad-CAM++'s
    epsilon share."""
    table = primary.table
    panels = {"A": summaries.high_score_ids(table, score_threshold), "B": sorted(table["sample_id"].unique())}
    paired = pd.concat([summaries.paired_tests(table, ids, summary.identical, replicates=replicates, seed=seed)
                        .assign(panel=panel) for panel, ids in panels.items() if ids], ignore_index=True)
    pool_ids, pool_tensors = audit_inputs.pool_images(primary.pool, cohort_root, image_size)
    identity, epsilon = map_diagnostics.checkpoint_map_diagnostics(
        primary.model, primary.layer, pool_tensors.to(resolve_device(device)), pool_ids, top_fraction=top_fraction,
        batch_size=batch_size, identical_groups=summary.identical)
    paired = map_diagnostics.flag_pairs(paired, identity)
    epsilon_share = epsilon["gradcampp_epsilon_share"]
    tested = sorted(paired["panel"].unique())
    return Section(
        tables={"table4_map_identity": identity, "table4_paired_tests": paired},
        views=[identity.round(3), map_diagnostics.identity_statement(identity),
               f"Grad-CAM++ epsilon share (per map, share of denominators where the 1e-6 epsilon dominates): "
               f"median {epsilon_share.median():.3f}, max {epsilon_share.max():.3f} over {len(epsilon)} maps. "
               "Pairs flagged independent_evidence = False below are not independent evidence.",
               paired.drop(columns=["first", "second"]).round(4)],
        statement=f"Paired tests on panels {tested} (n = {', '.join(str(len(panels[p])) for p in tested)}); "
                  "p-values Holm-adjusted within each outcome and panel.")


def map_ties(summary: audit_report.AuditSummary) -> Section:
    """Constant maps and top-area boundary ties per method, and the methods identical by
    construction."""
    ties = summary.ties
    return Section(tables={"table4_map_ties": ties}, views=[ties, summary.identical_statement],
                   statement=f"{int(ties['constant_maps'].sum())} constant maps and {int(ties['boundary_ties'].sum())} "
                             f"maps with boundary ties among {int(ties['maps'].sum())} maps.")


def map_priors(primary: PrimaryAudit, gate, *, top_fraction: float) -> Section:
    """Each method's prior map from held-out negatives and the border-ring chance
    (``map_diagnostics.prior_table``), with the lesion- and CAM-deletion logit drops."""
    table = primary.table
    grid = (int(table["feature_grid_height"].iloc[0]), int(table["feature_grid_width"].iloc[0]))
    priors = validity_gate.mark_table(map_diagnostics.prior_table(table, primary.negatives, grid), gate)
    statement = (f"Feature grid {grid[0]}x{grid[1]} (border-ring chance {priors['border_ring_chance'].iloc[0]:.2f}); "
                 f"prior maps from {primary.negatives['sample_id'].nunique()} held-out negatives. Deleting the lesion "
                 f"drops the logit by {priors['lesion_logit_drop_mean'].iloc[0]:.3f} on average; deleting each CAM's "
                 f"top {top_fraction:.0%}: "
                 + ", ".join(f"{r.label} {r.cam_top_logit_drop_mean:.3f}" for r in priors.itertuples()) + ".")
    return Section(tables={"table_s_map_priors": priors}, views=[priors.round(3)], statement=statement)


def case_figure(primary: PrimaryAudit, cohort_root: str | Path, not_validated, *, score_threshold: float,
                top_fraction: float, image_size: int, batch_size: int, device: str) -> Section:
    """Figure 3 (``audit_report.case_figure``) with its check that the redrawn maps give the
    table's IoU (saved with four decimals)."""
    selection, figure, iou_check = audit_report.case_figure(
        primary.table, primary.model, primary.layer,
        lambda ids: audit_inputs.read_cases(primary.pool, cohort_root, ids, decode_size=image_size),
        score_threshold=score_threshold, top_fraction=top_fraction, image_size=image_size, batch_size=batch_size,
        device=resolve_device(device), not_validated=not_validated)
    statement = f"Selected: {selection}. " + (
        "No high-score case qualifies for either row: the figure says so." if not any(selection.values()) else
        f"Largest |rendered - table| IoU difference: "
        f"{(iou_check['rendered_iou'] - iou_check['table_iou']).abs().max():.2e}.")
    return Section(tables={"figure3_iou_check": iou_check}, float_formats={"figure3_iou_check": "{:.4f}"},
                   figures={"figure3_cases": figure}, statement=statement)
