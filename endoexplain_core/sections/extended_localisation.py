"""Notebook 07 (extended localisation), one function per section: the primary's scores, AUC-IoU,
rankings and their stability, paired tests and threshold bias, lesion size and IoU curves, the
top-k sweep, chance and energy, the checkpoint matrix with C-Scores, per-epoch C-Scores, the
external cohorts and the cost. Each returns a ``presentation.Section``.

``scoring`` is the notebook's one scoring recipe, passed whole to
``extended_localisation.score_registered``: ``image_size``, ``settings`` (the profile's
``LocalisationSettings``), ``replicates``, ``seed``, ``batch_size``, ``device``. Every saved table
carries the constant-map note (``extended_localisation.with_note``)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pandas as pd

from endoexplain_core.analysis import extended_localisation as ext
from endoexplain_core.analysis import transfer
from endoexplain_core.data import cohorts
from endoexplain_core.figures import extended_figures, style
from endoexplain_core.files import write_parquet_atomic
from endoexplain_core.methods import method_label
from endoexplain_core.presentation import Section
from endoexplain_core.run_layout import RunLayout


def _noted(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    return {name: ext.with_note(table) for name, table in tables.items()}


def _keep_cases(run_dir: str | Path, table: pd.DataFrame, dataset: str, checkpoint_id: str) -> Path:
    """Write one checkpoint's per-image scores to the run folder; return the path."""
    return write_parquet_atomic(table, RunLayout(run_dir).extended_table(dataset, checkpoint_id))


class PrimaryScores(NamedTuple):
    """The primary's per-image scores (``table``), its C-Score rows, its run record and the two
    subsets every later section reads (all images, panel A)."""
    table: pd.DataFrame
    c_score: pd.DataFrame
    run: dict
    subsets: dict[str, pd.DataFrame]


def scales(settings, image_size: int) -> Section:
    """The localisation scales in pixels at the input size (``LocalisationSettings.pixels``)."""
    return Section(statement="Scales at the input size of %d px: %s." % (image_size, ", ".join(
        f"{name} = {value:.2f}" for name, value in settings.pixels(image_size).items())))


def primary_scores(run_dir: str | Path, data_dir: str | Path, primary_id: str, score_threshold: float, *,
                   scoring: dict) -> tuple[PrimaryScores, Section]:
    """Score the primary's masked audit pool (``extended_localisation.score_registered``) and keep
    its per-image table in the run folder."""
    table, c_score, run = ext.score_registered(run_dir, data_dir, primary_id, **scoring)
    path = _keep_cases(run_dir, table, "hyperkvasir", primary_id)
    panel_a_ids = set(table.loc[table["scaled_score"] >= score_threshold, "sample_id"])
    subsets = {"all images": table, "panel A": table[table["sample_id"].isin(panel_a_ids)]}
    statement = (f"`{primary_id}`: {run['n_audited']} masked images scored ({run['n_empty_masks_excluded']} empty "
                 f"after resizing, excluded); panel A: {len(panel_a_ids)} images at scaled score ≥ "
                 f"{score_threshold:.2f}.")
    return PrimaryScores(table, c_score, run, subsets), Section(files=[path], statement=statement)


def auc_iou(subsets: dict[str, pd.DataFrame], *, top_fraction: float, replicates: int, seed: int
            ) -> tuple[pd.DataFrame, Section]:
    """AUC-IoU per method and subset with bootstrap CIs (``auc_iou_by_subset``), saved beside the
    binary-map reference row (a relative difference of -10% is the threshold grid, not a finding)."""
    table = ext.auc_iou_by_subset(subsets, top_fraction=top_fraction, replicates=replicates, seed=seed)
    saved = pd.concat([table, ext.binary_map_reference()], ignore_index=True)
    return table, Section(tables=_noted({"table_s_extended_auc_iou": saved}), views=[table])


def rankings(subsets: dict[str, pd.DataFrame], auc_table: pd.DataFrame, *, top_fraction: float, replicates: int,
             seed: int) -> Section:
    """Method rankings per metric and their agreement (``rankings_by_subset``), and how much of
    each ranking survives resampling the images (``ranking_stability_by_subset``)."""
    ranked, agreement = ext.rankings_by_subset(auc_table, top_fraction=top_fraction)
    rank_stability, reversals = ext.ranking_stability_by_subset(subsets, top_fraction=top_fraction,
                                                                replicates=replicates, seed=seed)
    everything = ranked[ranked["subset"] == "all images"]
    by_auc = " > ".join(method_label(m) for m in everything.sort_values("auc_iou")["method"])
    by_top_area = " > ".join(method_label(m) for m in everything.sort_values(ext.top_area_metric(top_fraction))["method"])
    return Section(tables=_noted({"table_s_extended_rankings": ranked, "table_s_extended_rank_agreement": agreement,
                                  "table_s_extended_rank_stability": rank_stability,
                                  "table_s_extended_rank_reversals": reversals}),
                   views=[ranked, agreement, rank_stability, reversals],
                   statement=f"**All images, ranking by AUC-IoU:** {by_auc}.\n\n**By top-{top_fraction:.0%} IoU:** "
                             f"{by_top_area}.")


def paired_tests(subsets: dict[str, pd.DataFrame]) -> Section:
    """Pairwise Wilcoxon tests of AUC-IoU per subset, and the threshold-free paper's bias tests
    (AUC-IoU against IoU(t), Holm over methods x thresholds) on all images."""
    wilcoxon = ext.wilcoxon_by_subset(subsets)
    threshold_bias = ext.threshold_bias_tests(subsets["all images"])
    return Section(tables=_noted({"table_s_extended_auc_wilcoxon": wilcoxon,
                                  "table_s_extended_threshold_bias": threshold_bias}),
                   views=[wilcoxon, threshold_bias.pivot(index="method", columns="iou_threshold",
                                                         values="grid_mean_difference").round(3)])


def size_and_curves(primary: PrimaryScores, auc_table: pd.DataFrame, primary_id: str, not_validated, *,
                    top_fraction: float) -> Section:
    """AUC-IoU by lesion-size tertile and the IoU-against-threshold curves of the primary."""
    table = primary.table
    by_size = ext.auc_iou_by_size(table, top_fraction=top_fraction)
    figure = extended_figures.iou_threshold_curves(
        ext.iou_curves(table), auc_table[auc_table["subset"] == "all images"],
        title=f"{style.checkpoint_label(primary_id)}: IoU against threshold "
              f"(n = {table['sample_id'].nunique()} masked images)", not_validated=not_validated)
    return Section(tables=_noted({"table_s_extended_auc_by_size": by_size}),
                   figures={"figure_s_extended_iou_curves": figure},
                   views=[by_size.pivot(index="method", columns="size_tertile", values="auc_iou")])


def top_k(primary: PrimaryScores, primary_id: str, not_validated) -> Section:
    """The top-k sweep of the primary (``top_k_table``) and its figure."""
    sweep = ext.top_k_table(primary.table)
    figure = extended_figures.top_k_sweep_figure(sweep, title=f"{style.checkpoint_label(primary_id)}: top-k sweep",
                                                 not_validated=not_validated)
    return Section(tables=_noted({"table_s_extended_top_k": sweep}), figures={"figure_s_extended_top_k": figure})


def chance_and_energy(primary: PrimaryScores, primary_id: str, not_validated, *, replicates: int, seed: int
                      ) -> Section:
    """Each method's hit rate against chance and its energy lift against the DoG baseline
    (``chance_table``), with the energy-lift distributions."""
    table = primary.table
    chance = ext.chance_table(table, replicates=replicates, seed=seed)
    figure = extended_figures.energy_lift_distributions(
        table, ext.EXTENDED_METHODS, not_validated=not_validated,
        title=f"{style.checkpoint_label(primary_id)}: energy lift (n = {table['sample_id'].nunique()} masked images)")
    overall = chance[chance["size_tertile"] == "all"].set_index("method")
    dog = overall.loc["dog"]
    lines = [f"- {method_label(m)}: λ_E = {overall.loc[m, 'lambda_e_mean']:.2f} bits "
             f"(DoG {dog['lambda_e_mean']:.2f}; difference {overall.loc[m, 'lambda_e_minus_dog']:+.2f}, "
             f"95% CI {overall.loc[m, 'minus_dog_ci_low']:+.2f} to {overall.loc[m, 'minus_dog_ci_high']:+.2f}); "
             f"hits {overall.loc[m, 'hit_rate']:.2f} vs chance {overall.loc[m, 'chance']:.2f}"
             for m in ext.EXTENDED_METHODS if m != "dog"]
    return Section(tables=_noted({"table_s_extended_chance": chance}),
                   figures={"figure_s_extended_energy_lift": figure},
                   views=[chance[chance["size_tertile"] == "all"]], statement="\n".join(lines))


def checkpoint_matrix(run_dir: str | Path, data_dir: str | Path, primary: PrimaryScores, primary_id: str,
                      not_validated, *, all_checkpoints: bool, c_score_negatives: int, top_fraction: float,
                      scoring: dict) -> tuple[list[dict], Section]:
    """AUC-IoU of every checkpoint (``all_checkpoints``; else the primary only) and the C-Scores of
    both classes: the lesion class over each checkpoint's masked images, the negative class over
    its correctly classified test negatives (at most ``c_score_negatives``). Returns the runs
    scored here (the primary's is ``primary.run``) and the section."""
    replicates, seed = scoring["replicates"], scoring["seed"]
    registry = RunLayout(run_dir).read_registry()
    c_rows = [primary.c_score]
    matrix_rows = [ext.auc_iou_table(primary.table, top_fraction=top_fraction, replicates=replicates, seed=seed)
                   .assign(checkpoint_id=primary_id)]
    others = [c for c in registry["checkpoint_id"] if c != primary_id] if all_checkpoints else []
    runs, files = [], []
    for checkpoint_id in others:
        table, c_score, run = ext.score_registered(run_dir, data_dir, checkpoint_id, **scoring)
        files.append(_keep_cases(run_dir, table, "hyperkvasir", checkpoint_id))
        runs.append(run)
        c_rows.append(c_score)
        matrix_rows.append(ext.auc_iou_table(table, top_fraction=top_fraction, replicates=replicates, seed=seed)
                           .assign(checkpoint_id=checkpoint_id))
    for checkpoint_id in [primary_id, *others]:
        c_rows.append(ext.negative_c_score_registered(run_dir, data_dir, checkpoint_id,
                                                      max_images=c_score_negatives, **scoring))
    c_scores = pd.concat([rows for rows in c_rows if not rows.empty], ignore_index=True)
    matrix = pd.concat(matrix_rows, ignore_index=True)
    figure = extended_figures.c_score_heatmap(c_scores, ext.EXTENDED_METHODS, not_validated=not_validated)
    return runs, Section(
        tables=_noted({"table_s_extended_c_score": c_scores, "table_s_extended_matrix_auc_iou": matrix}),
        figures={"figure_s_extended_c_score": figure}, files=files,
        views=[c_scores.pivot(index=["checkpoint_id", "class"], columns="method", values="c_score")
               .reindex(columns=list(ext.EXTENDED_METHODS)),
               c_scores.drop_duplicates(["checkpoint_id", "class"])[["checkpoint_id", "class", "n_audited", "n_gold"]]])


def epoch_c_scores(run_dir: str | Path, data_dir: str | Path, primary_id: str, *, scoring: dict) -> Section:
    """The primary's C-Score at each kept epoch snapshot (``score_epoch_snapshots``)."""
    epoch_c = ext.score_epoch_snapshots(run_dir, data_dir, primary_id, **scoring)
    if epoch_c.empty:
        return Section(statement=f"No epoch snapshots were kept for `{primary_id}` (01_training "
                                 "keep_epoch_snapshots: false): no per-epoch C-Score.")
    return Section(tables=_noted({"table_s_extended_c_score_epochs": epoch_c}),
                   views=[epoch_c.pivot(index=["epoch", "val_auprc"], columns="method", values="c_score")
                          .reindex(columns=list(ext.EXTENDED_METHODS)).round(3)],
                   statement=f"`{primary_id}`: C-Score per epoch over each epoch's own gold list "
                             "(n_gold per row in the table).")


def external_cohorts(run_dir: str | Path, data_dir: str | Path, primary_id: str, datasets, *,
                     top_fraction: float, scoring: dict) -> tuple[list[dict], Section]:
    """The primary's AUC-IoU and chance tables on each external cohort found under ``data_dir``
    (``transfer.external_cases``). Returns the runs scored here and the section."""
    replicates, seed = scoring["replicates"], scoring["seed"]
    auc_rows, chance_rows, runs, files = [], [], [], []
    for dataset, cases in transfer.external_cases(run_dir, data_dir, datasets).items():
        table, _, run = ext.score_registered(run_dir, data_dir, primary_id, cases=cases, dataset=dataset,
                                             case_iterator=cohorts.iter_cases, **scoring)
        files.append(_keep_cases(run_dir, table, dataset, primary_id))
        runs.append(run)
        auc_rows.append(ext.auc_iou_table(table, top_fraction=top_fraction, replicates=replicates, seed=seed)
                        .assign(dataset=dataset))
        chance_rows.append(ext.chance_table(table, by_size=False, replicates=replicates, seed=seed)
                           .assign(dataset=dataset))
    if not runs:
        return runs, Section(statement=f"No external cohort of {datasets} under {data_dir}.")
    auc_table, chance = pd.concat(auc_rows, ignore_index=True), pd.concat(chance_rows, ignore_index=True)
    return runs, Section(tables=_noted({"table_s_extended_external_auc_iou": auc_table,
                                        "table_s_extended_external_chance": chance}),
                         files=files, views=[auc_table, chance])


def cost(runs: list[dict]) -> Section:
    """Time of the extended metrics against the CAM computation, per scored run (primary first)."""
    table = pd.DataFrame(runs)[["checkpoint_id", "n_audited", "cam_seconds", "metric_seconds"]]
    primary = runs[0]
    return Section(views=[table], statement=f"Extended metrics / CAM computation: {ext.cost_ratio(runs):.1%} "
                                            f"(primary: {primary['metric_seconds'] / primary['cam_seconds']:.1%}).")
