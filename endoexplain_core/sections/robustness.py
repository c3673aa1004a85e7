"""Notebook 05 (robustness), one function per section: the other checkpoints' audits, the
score-threshold sensitivity, the checkpoint matrix and its ranges, lesion strata, secondary
outcomes, the adjusted model (Table 5), verdict stability, Figure 4, and the resolution and
layer checks of the primary. Each returns a ``presentation.Section``; the numbers come from the
analysis functions named in each docstring."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from endoexplain_core.analysis import (audit, layer_sensitivity, resolution_sensitivity, stability, summaries,
                                       validity_gate)
from endoexplain_core.analysis import adjusted_model as adjusted
from endoexplain_core.figures import case_figures
from endoexplain_core.files import write_csv_atomic
from endoexplain_core.models.learning import LEARNING_RULE, other_checkpoints_to_audit
from endoexplain_core import marks
from endoexplain_core.presentation import Section
from endoexplain_core.run_layout import RunLayout


def not_learned_ids(learning: pd.DataFrame) -> list[str]:
    """Sorted ids of the non-control checkpoints that did not learn (``learning_table``)."""
    return sorted(learning.loc[~learning["learned"] & (learning["control"] == "none"), "checkpoint_id"])


def other_checkpoints(run_dir: str | Path, cohort_root: str | Path, learning: pd.DataFrame, primary_id: str, *,
                      audit_unlearned: bool, image_size: int, top_fraction: float, repetitions: int,
                      batch_size: int, device: str, prior_negatives: int, task_map=None
                      ) -> tuple[pd.DataFrame, pd.DataFrame, Section]:
    """Audit the checkpoints besides the primary (``audit.audit_registry``; the primary's audit
    is 04's, read here) and read every audited one back.

    Returns (audit rows, random-deletion rows) of the primary and the audited others, and the
    section: the runs, and which checkpoints were reused or not audited (``audit_unlearned``)."""
    layout = RunLayout(run_dir)
    registry = layout.read_registry()
    runs = audit.audit_registry(run_dir, cohort_root, image_size=image_size, top_fraction=top_fraction,
                                repetitions=repetitions, batch_size=batch_size, device=device,
                                prior_negatives=prior_negatives, task_map=task_map,
                                checkpoint_ids=other_checkpoints_to_audit(learning, primary_id, audit_unlearned))
    audited_ids = [c for c in registry["checkpoint_id"] if c == primary_id or c in set(runs["checkpoint_id"])]
    tables, random_deletion = audit.read_audits(run_dir, audited_ids)
    not_audited = sorted(set(registry["checkpoint_id"]) - set(audited_ids))
    statement = (f"{len(runs)} checkpoints audited besides the primary `{primary_id}` (its audit is "
                 f"04_spatial_audit's), {int(runs['reused'].sum())} reused. Not audited (did not learn; "
                 f"audit_unlearned = {audit_unlearned}): {', '.join(not_audited) or 'none'}.")
    files = [p for c in runs["checkpoint_id"] for p in layout.audit_paths("hyperkvasir", c).values()]
    return tables, random_deletion, Section(files=files, views=[runs], statement=statement)


def threshold_sensitivity(primary: pd.DataFrame, score_thresholds, path: str | Path) -> Section:
    """The primary's panel-A failure rate at each score threshold (``summaries.failure_by_threshold``),
    also written to ``path`` (the run folder's copy)."""
    sensitivity = summaries.failure_by_threshold(primary, score_thresholds)
    counts = sensitivity.groupby("score_threshold")["n_eligible"].first()
    return Section(tables={"table_threshold_sensitivity": sensitivity},
                   files=[write_csv_atomic(sensitivity, path)],
                   views=[sensitivity.pivot(index="method", columns="score_threshold", values="failure_rate").round(3)],
                   statement="Eligible images per threshold: "
                             + ", ".join(f"{t:.2f}: {n}" for t, n in counts.items()) + ".")


def checkpoint_robustness(tables: pd.DataFrame, random_deletion: pd.DataFrame, learning: pd.DataFrame, gate,
                          primary_id: str, score_threshold: float, identical_by_arch: dict, *,
                          audit_unlearned: bool) -> tuple[pd.DataFrame, Section]:
    """Every audited checkpoint's failure rates on its own and on the primary's high-score subset
    (``summaries.checkpoint_robustness``), with ``learned`` and the gate's marks, and the
    deletion drops over all images. Returns (robustness rows, section)."""
    robustness = summaries.checkpoint_robustness(tables, random_deletion, primary_id, score_threshold,
                                                 identical_by_arch=identical_by_arch)
    robustness = robustness.merge(learning[["checkpoint_id", "learned"]], on="checkpoint_id", how="left")
    robustness = validity_gate.mark_table(robustness, gate, label_column=None)
    deletion_all = summaries.deletion_all_images(robustness, identical_by_arch)
    own = robustness.groupby("checkpoint_id")["n_own"].first()
    statement = (f"Own high-score subsets: {own.min()}-{own.max()} images; fixed subset: "
                 f"{robustness['n_fixed'].iloc[0]} images. Checkpoints that did not learn ({LEARNING_RULE}): "
                 f"{', '.join(not_learned_ids(learning)) or 'none'} "
                 + ("(not audited: audit_unlearned = False)." if not audit_unlearned else
                    "(flagged learned = False; excluded from the ranges, Figure 4 and Table 5 below)."))
    return robustness, Section(
        tables={"table_checkpoint_robustness": robustness, "table_deletion_all_images": deletion_all.reset_index()},
        views=[robustness.pivot(index="checkpoint_id", columns="method", values="failure_own").round(3),
               deletion_all.round(3)],
        statement=statement)


def failure_ranges(robustness: pd.DataFrame, learning: pd.DataFrame, gate, identical_by_arch: dict
                   ) -> tuple[pd.DataFrame, Section]:
    """Each method's failure-rate range over the checkpoints that learned
    (``summaries.checkpoint_failure_ranges``; non-learning checkpoints never enter a range).
    Returns (the learned checkpoints' robustness rows, section)."""
    learned_rows = robustness[robustness["learned"].astype(bool)]
    ranges = validity_gate.mark_table(summaries.checkpoint_failure_ranges(learned_rows, identical_by_arch),
                                      gate, label_column=None)
    at_bound = sorted(robustness.loc[robustness["temperature_at_bound"], "checkpoint_id"].unique())
    identical = "; ".join(f"{arch}: " + ", ".join(" = ".join(group) for group in groups)
                          for arch, groups in identical_by_arch.items() if groups)
    statement = (f"Identical by construction: {identical or 'none'}. Temperature at a search bound: "
                 f"{', '.join(at_bound) or 'none'}. Excluded from the ranges (did not learn): "
                 f"{', '.join(not_learned_ids(learning)) or 'none'}.")
    return learned_rows, Section(tables={"table_checkpoint_failure_ranges": ranges}, views=[ranges],
                                 statement=statement)


def lesion_strata(primary: pd.DataFrame, score_threshold: float) -> Section:
    """The primary's failure rates by lesion-size stratum on its high-score images
    (``summaries.lesion_strata_high_score``) and by tertile of all masked images
    (``summaries.lesion_tertiles``)."""
    strata = summaries.lesion_strata_high_score(primary, score_threshold)
    tertiles = summaries.lesion_tertiles(primary)
    tertiles.insert(0, "population", "all masked images (tertiles of this pool)")
    strata_sizes = strata.groupby("stratum", sort=False)["n"].first()
    tertile_sizes = tertiles.groupby("tertile", observed=True)["n"].first()
    statement = (f"High-score images (scaled score ≥ {score_threshold}) per stratum (cut-points from all audit "
                 "images): " + ", ".join(f"{s}: {n}" for s, n in strata_sizes.items()) + ". Images per tertile: "
                 + ", ".join(f"{t}: {n}" for t, n in tertile_sizes.items()) + ".")
    return Section(tables={"table_lesion_strata_high_score": strata, "table_lesion_tertiles": tertiles},
                   views=[strata.pivot(index="method", columns="stratum", values="failure_rate").round(3),
                          tertiles.pivot(index="method", columns="tertile", values="failure_rate").round(3)],
                   statement=statement)


def secondary_outcomes(primary: pd.DataFrame, score_threshold: float, *, replicates: int, seed: int) -> Section:
    """The primary's secondary outcomes with bootstrap CIs (``summaries.secondary_outcomes``)."""
    secondary = summaries.secondary_outcomes(primary, score_threshold, replicates=replicates, seed=seed)
    n_by_panel = secondary.groupby("panel")["n"].first()
    return Section(tables={"table_secondary_outcomes": secondary},
                   views=[secondary.pivot_table(index=["panel", "method"], columns="outcome", values="estimate",
                                                sort=False).round(3)],
                   statement=f"Secondary outcomes on {n_by_panel.get('A')} high-score and "
                             f"{n_by_panel.get('B')} audit images.")


def adjusted_model(primary: pd.DataFrame, learning: pd.DataFrame, gate, primary_id: str, score_threshold: float, *,
                   replicates: int, seed: int) -> Section:
    """Table 5: the primary's adjusted failure model with image-cluster bootstrap CIs
    (``adjusted_model.adjusted_table``) and the Firth-penalised odds ratios beside it."""
    model_frame = adjusted.model_frame(primary, score_threshold)
    table5, status = adjusted.adjusted_table(model_frame, replicates=replicates, seed=seed)
    firth = adjusted.firth_odds_ratios(model_frame)  # finite penalised estimates
    table5_shown, firth_shown = adjusted.format_table(table5, firth=firth), adjusted.format_firth(firth)
    heading = adjusted.heading(model_frame) if len(model_frame) else "No high-score image: Table 5 is empty."
    learned = bool(learning.set_index("checkpoint_id").loc[primary_id, "learned"])
    failing = validity_gate.failing_methods(gate) if gate is not None else []
    statement = (f"Table 5 (score ≥ {score_threshold}): {status}. It models the primary `{primary_id}` only "
                 f"(learned: {learned}); checkpoints that did not learn never enter it (excluded: "
                 f"{', '.join(not_learned_ids(learning)) or 'none'}). Firth-penalised logistic (Jeffreys prior), "
                 "profile penalised-likelihood intervals; rows are treated as independent although each image "
                 "gives five CAM rows, so these intervals are too narrow."
                 + (f"\n\n{marks.GATE_FOOTNOTE} Failing: {', '.join(failing)}." if failing else ""))
    return Section(tables={"table5_adjusted_model": table5, "table5_adjusted_model_formatted": table5_shown,
                           "table5_firth": firth, "table5_firth_formatted": firth_shown},
                   views=[heading, table5_shown,
                          adjusted.footnote(table5, replicates, summaries.temperature_statement(primary)),
                          firth_shown],
                   statement=statement)


def verdict_stability(tables: pd.DataFrame, learning: pd.DataFrame, run_dir: str | Path, figures_dir: str | Path,
                      primary_id: str, score_threshold: float, *, replicates: int, seed: int) -> Section:
    """Whether each headline verdict holds under a perturbed seed (``stability.headline_stability``;
    the gate's leave-one-replicate-out table from 03 when it exists)."""
    layout = RunLayout(run_dir)
    gate_stability_path = Path(figures_dir) / "table_validity_gate_stability.csv"
    table = stability.headline_stability(
        tables=tables, registry=layout.read_registry(), learning=learning, logits=pd.read_parquet(layout.logits),
        gate_stability=pd.read_csv(gate_stability_path) if gate_stability_path.is_file() else None,
        primary_id=primary_id, score_threshold=score_threshold, selection_replicates=replicates, seed=seed)
    held = table["held"].map(lambda v: str(v).lower())
    unstable = table.loc[held == "false", "part"] + " " + table.loc[held == "false", "label"]
    return Section(tables={"table_verdict_stability": table}, views=[table],
                   statement=f"{int((held == 'true').sum())} of {len(table)} headline verdicts held under a "
                             f"perturbed seed; unstable: {', '.join(unstable) or 'none'}; not assessable: "
                             f"{int((~held.isin(['true', 'false'])).sum())}.")


def robustness_figure(robustness: pd.DataFrame, learned_rows: pd.DataFrame, n_images: int, not_validated) -> Section:
    """Figure 4 over the checkpoints that learned (``case_figures.figure4``); the others are
    named as left out."""
    trained = set(robustness.loc[robustness["control"] == "none", "checkpoint_id"])
    figure = case_figures.figure4(learned_rows, n_images=n_images, not_validated=not_validated,
                                  left_out=sorted(trained - set(learned_rows["checkpoint_id"])))
    return Section(figures={"figure4_robustness": figure},
                   statement=f"{len(trained)} checkpoints; panel C ends with each checkpoint's own "
                             "random-deletion control.")


def resolution_check(run_dir: str | Path, cohort_root: str | Path, primary: pd.DataFrame,
                     primary_random_deletion: pd.DataFrame, gate, primary_id: str, *, native_size: int,
                     check_size: int, score_threshold: float, top_fraction: float, repetitions: int,
                     batch_size: int, device: str, replicates: int, seed: int) -> Section:
    """The primary's panel A at a second input size (``resolution_sensitivity.run_resolution_check``);
    ``check_size`` 0 skips it."""
    if not check_size:
        return Section(statement="Resolution check disabled in this profile (resolution_check_size = 0).")
    resolution, paths = resolution_sensitivity.run_resolution_check(
        run_dir, cohort_root, primary, primary_random_deletion, native_size=native_size, check_size=check_size,
        score_threshold=score_threshold, top_fraction=top_fraction, repetitions=repetitions,
        batch_size=batch_size, device=device, replicates=replicates, seed=seed)
    resolution = validity_gate.mark_table(resolution, gate)
    grid_at = dict(zip(resolution["input_size"], resolution["grid"]))
    statement = (f"Panel A of `{primary_id}` on its {len(summaries.high_score_ids(primary, score_threshold))} native "
                 f"high-score images at {native_size} px (grid {grid_at[native_size]}) and {check_size} px (grid "
                 f"{grid_at[check_size]}); same weights and temperature, only the input size changes. A method "
                 "whose failure rate moves a lot here is reporting the grid, not the lesion.")
    return Section(tables={"table_resolution_sensitivity": resolution}, files=list(paths.values()),
                   views=[resolution.pivot(index="label", columns="input_size", values="peak_failure").round(3),
                          resolution.pivot(index="label", columns="input_size", values="n_constant")],
                   statement=statement)


LAYER_DIAGNOSTICS = ["layer", "label", "near_zero_channel_share", "negative_channel_share", "weight_ratio_median",
                     "weight_ratio_p99", "weight_ratio_max", "ill_posed"]


def layer_check(run_dir: str | Path, cohort_root: str | Path, primary: pd.DataFrame,
                primary_random_deletion: pd.DataFrame, gate, *, enabled: bool, image_size: int,
                score_threshold: float, top_fraction: float, batch_size: int, device: str, replicates: int,
                seed: int) -> Section:
    """The primary's Table 4 at the neighbouring layer, with channel-weight diagnostics
    (``layer_sensitivity.run_layer_sensitivity``); skipped unless ``enabled``."""
    if not enabled:
        return Section(statement="Layer check disabled in this profile (layer_check = false).")
    layers = layer_sensitivity.run_layer_sensitivity(
        run_dir, cohort_root, primary, primary_random_deletion, image_size=image_size,
        score_threshold=score_threshold, top_fraction=top_fraction, batch_size=batch_size, device=device,
        replicates=replicates, seed=seed)
    # the gate ran at the primary's protocol layer only: no verdict is copied to its neighbour
    layers = validity_gate.mark_layer_table(layers, gate, str(primary["target_layer"].iloc[0]))
    ill_posed = sorted(set(layers.loc[layers["ill_posed"], "layer"]))
    return Section(tables={"table_layer_sensitivity": layers},
                   views=[layers.pivot(index=["panel", "label"], columns="layer", values="peak_failure").round(3),
                          layers[layers["panel"] == "B"][LAYER_DIAGNOSTICS].round(3)],
                   statement=f"XGrad-CAM ill-posed (near-zero channel share > "
                             f"{layer_sensitivity.ILL_POSED_SHARE:.0%}, or its weight ratio to Grad-CAM's "
                             f"above {layer_sensitivity.ILL_POSED_RATIO_P99:.0f} at the 99th percentile) at: "
                             f"{', '.join(ill_posed) or 'neither layer'}.")
