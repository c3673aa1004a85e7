"""Notebook 08 (faithfulness), one function per section: the cases, the per-image scores of the
analysed checkpoints, SRG and ROAD, LSR, shape-preserving deletion, the cost, the model
randomisation check and the subgroup audit. Each returns a ``presentation.Section``; the numbers
come from ``analysis.faithfulness`` and ``analysis.subgroup_audit``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from endoexplain_core.analysis import audit, audit_inputs, audit_schema, faithfulness, subgroup_audit, transfer
from endoexplain_core.data.datasets import load_manifest
from endoexplain_core.figures import faithfulness_figures
from endoexplain_core.files import write_parquet_atomic
from endoexplain_core.methods import method_label
from endoexplain_core.presentation import Section
from endoexplain_core.run_layout import RunLayout


def _labelled(table: pd.DataFrame) -> pd.DataFrame:
    """A view with the methods' display names."""
    return table.assign(method=table["method"].map(method_label))


def cases(run_dir: str | Path, data_dir: str | Path, *, all_checkpoints: bool, image_size: int
          ) -> tuple[list[str], faithfulness.PreparedCases, Section]:
    """The checkpoints analysed (the primary first; every registered one with ``all_checkpoints``)
    and the masked audit pool prepared at the input size (``faithfulness.prepare_cases``)."""
    layout = RunLayout(run_dir)
    order = layout.read_registry().sort_values("is_primary", ascending=False, kind="stable")
    checkpoint_ids = list(order["checkpoint_id"] if all_checkpoints else order.loc[order["is_primary"], "checkpoint_id"])
    pool = audit_inputs.masked_pool(load_manifest(layout.manifest))
    prepared = faithfulness.prepare_cases(audit_inputs.manifest_cases(pool, data_dir, decode_size=image_size),
                                          image_size)
    statement = (f"Primary checkpoint `{layout.primary_id()}`; checkpoints analysed: "
                 f"{', '.join(f'`{c}`' for c in checkpoint_ids)}. Masked audit pool: {len(pool)} images, "
                 f"{len(prepared.sample_ids)} with a mask left at {image_size} px ({len(prepared.excluded)} excluded).")
    return checkpoint_ids, prepared, Section(statement=statement)


def srg_and_road(tables: dict[str, pd.DataFrame], primary_id: str, not_validated, *, replicates: int, seed: int
                 ) -> tuple[pd.DataFrame, Section]:
    """SRG per checkpoint and method (``faithfulness.srg_table``) and the ROAD curves
    (``road_curves``) with the primary's figure. Returns (the SRG summary, section)."""
    srg_summary = faithfulness.srg_table(tables["srg"], replicates=replicates, seed=seed)
    curves = faithfulness.road_curves(tables["road"], replicates=replicates, seed=seed)
    figure = faithfulness_figures.road_curves_figure(curves[curves["checkpoint_id"] == primary_id], not_validated)
    primary_srg = srg_summary[srg_summary["checkpoint_id"] == primary_id].set_index("method")
    statement = "Primary checkpoint, SRG (z/T, mean [95% CI]): " + "; ".join(
        f"{method_label(m)} {r.srg:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}], > 0 in {100 * r.share_positive:.0f}% "
        "of images" for m, r in primary_srg.iterrows()) + "."
    return srg_summary, Section(
        tables={"table_s_faithfulness_srg": srg_summary, "table_s_faithfulness_road_curves": curves},
        figures={"figure_s_faithfulness_road": figure}, views=[_labelled(srg_summary).round(3)], statement=statement)


def lesion_specific_reliance(tables: dict[str, pd.DataFrame], *, replicates: int, seed: int) -> Section:
    """LSR per checkpoint and method (``faithfulness.lsr_table``)."""
    lsr_summary = faithfulness.lsr_table(tables["lsr"], replicates=replicates, seed=seed)
    return Section(tables={"table_s_faithfulness_lsr": lsr_summary}, views=[lsr_summary.round(3)])


def shape_deletion(tables: dict[str, pd.DataFrame], srg_summary: pd.DataFrame, run_dir: str | Path, checkpoint_ids,
                   primary_id: str, not_validated, *, replicates: int, seed: int) -> Section:
    """Shape-preserving deletion beside 04's pixel-wise random deletion where the run has it
    (``faithfulness.shape_deletion_table``), with the primary's SRG-and-shape figure."""
    layout = RunLayout(run_dir)
    random_paths = [layout.audit_paths("hyperkvasir", c)["random_deletion"] for c in checkpoint_ids]
    pixel_parts = [audit_schema.read_random_deletion(path) for path in random_paths if path.is_file()]
    pixel_random = pd.concat(pixel_parts, ignore_index=True) if pixel_parts else None
    summary = faithfulness.shape_deletion_table(tables["shape"], pixel_random, replicates=replicates, seed=seed)
    figure = faithfulness_figures.srg_shape_figure(srg_summary[srg_summary["checkpoint_id"] == primary_id],
                                                   summary[summary["checkpoint_id"] == primary_id], not_validated)
    return Section(tables={"table_s_faithfulness_shape_deletion": summary},
                   figures={"figure_s_faithfulness_srg": figure}, views=[_labelled(summary).round(3)],
                   statement="" if pixel_random is not None else
                   "No pixel-wise random-deletion table of 04 in this run folder: only the shape-preserving "
                   "control is shown.")


def cost(timings: dict[str, dict]) -> Section:
    """Imputation cost against the forwards it feeds (``faithfulness.cost_table``)."""
    table = faithfulness.cost_table(timings)
    return Section(tables={"table_s_faithfulness_cost": table}, views=[table.round(3)])


def randomisation(run_dir: str | Path, prepared: faithfulness.PreparedCases, primary_id: str, not_validated, *,
                  n_images: int, seed: int, top_fraction: float, image_size: int, batch_size: int, device: str
                  ) -> Section:
    """Model-randomisation check on the first ``n_images`` prepared cases
    (``faithfulness.randomisation_similarity``): how similar each map stays as the primary's
    layers are re-initialised."""
    model, metadata = audit.load_registered_model(run_dir, primary_id, image_size, device)
    subset = faithfulness.PreparedCases(prepared.sample_ids[:n_images], prepared.images[:n_images],
                                        prepared.masks[:n_images])
    similarity = faithfulness.randomisation_similarity(model, metadata, subset, seed=seed, top_fraction=top_fraction,
                                                       batch_size=batch_size, device=device)
    path = write_parquet_atomic(similarity, RunLayout(run_dir).faithfulness_dir / "randomisation.parquet")
    summary = faithfulness.randomisation_table(similarity)
    return Section(tables={"table_s_faithfulness_randomisation": summary},
                   figures={"figure_s_faithfulness_randomisation":
                            faithfulness_figures.randomisation_figure(summary, not_validated)},
                   files=[path],
                   views=[summary.pivot(index=["step", "block"], columns="method", values="spearman").round(3)])


def subgroup_cases(run_dir: str | Path, data_dir: str | Path, prepared: faithfulness.PreparedCases,
                   tables: dict[str, pd.DataFrame], primary_id: str, *, cohorts, checkpoints: str,
                   with_faithfulness: bool, localisation_settings, settings: faithfulness.FaithfulnessSettings,
                   decision_threshold: float, image_size: int, batch_size: int, device: str, seed: int
                   ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, pd.DataFrame], Section]:
    """Per-image outcomes of the subgroup checkpoints on the audit pool and the external
    ``cohorts`` (``subgroup_audit.case_outcomes``, with the randomised-network control), and the
    primary's per-image SRG and LSR on them: the audit pool's from ``tables``, the external
    cohorts' computed here when ``with_faithfulness`` (without it only the lesion-size contrast
    gets SRG/LSR gaps). Returns (outcomes, randomised outcomes, reliance tables, section)."""
    out_dir = RunLayout(run_dir).faithfulness_dir
    cohort_cases = transfer.external_cases(run_dir, data_dir, cohorts, required=True)
    prepared_by_dataset, labels_by_dataset = subgroup_audit.prepare_subgroup_cohorts(prepared, cohort_cases, data_dir,
                                                                                    image_size)
    subgroup_ids = subgroup_audit.subgroup_checkpoint_ids(run_dir, checkpoints)
    outcomes, randomised = subgroup_audit.case_outcomes(
        run_dir, subgroup_ids, prepared_by_dataset, labels_by_dataset, settings=localisation_settings,
        decision_threshold=decision_threshold, image_size=image_size, batch_size=batch_size, device=device,
        seed=seed)
    reliance = subgroup_audit.cohort_faithfulness(
        run_dir, primary_id, prepared_by_dataset if with_faithfulness else {},
        {"srg": tables["srg"], "lsr": tables["lsr"]}, settings=settings, image_size=image_size,
        batch_size=batch_size, device=device)
    written = {"subgroup_cases": outcomes, "subgroup_cases_randomised": randomised,
               **{f"subgroup_{part}": table for part, table in reliance.items()}}
    files = [write_parquet_atomic(table, out_dir / f"{name}.parquet") for name, table in written.items()]
    primary_cases = outcomes[outcomes["checkpoint_id"] == primary_id].drop_duplicates(["dataset", "sample_id"])
    by_cohort = primary_cases.groupby("dataset").agg(
        images=("sample_id", "size"),
        median_lesion_share=("log_lesion_area", lambda v: float(np.exp(pd.Series(v)).median())),
        primary_correct=("correct", "mean"), mean_dog_lift=("dog_lift", "mean")).round(3)
    statement = (f"Checkpoints in the subgroup models (`subgroup_checkpoints: {checkpoints}`): "
                 + ", ".join(f"`{c}`" for c in subgroup_ids) + ".")
    return outcomes, randomised, reliance, Section(files=files, views=[by_cohort], statement=statement)


M1_COLUMNS = ["contrast", "outcome", "method", "gap", "ci_low", "ci_high", "holm_family", "p_holm", "tost_p",
              "tost_equivalent", "n_subgroup", "n_reference", "hits", "note"]
CONTROL_COLUMNS = ["contrast", "control", "outcome", "method", "gap", "ci_low", "ci_high", "p", "p_holm",
                   "n_subgroup", "n_reference"]


def subgroup_gaps(outcomes: pd.DataFrame, randomised: pd.DataFrame, reliance: dict[str, pd.DataFrame] | None,
                  primary_id: str, not_validated, *, min_images: int) -> Section:
    """The subgroup gaps of the GEE models M0-M3, their crude gaps, the controls and the skipped
    contrasts (``subgroup_audit.subgroup_table``), with the M1 forest plot."""
    gaps, crude, controls, skipped = subgroup_audit.subgroup_table(
        outcomes, min_images=min_images, randomised=randomised, faithfulness=reliance,
        faithfulness_checkpoint=primary_id)
    main = gaps[(gaps["model"] == "M1") & (gaps["slopes"] == "shared")]
    views = ["M1 gaps (primary family: energy lift; secondary: pointing, SRG, LSR):", _labelled(main[M1_COLUMNS]).round(3)]
    if len(controls):
        views += ["Controls (crude, per-image values averaged over the checkpoints; Welch t intervals; Holm within "
                  "the secondary family):", _labelled(controls[CONTROL_COLUMNS]).round(3)]
    if len(skipped):
        views.append("Skipped contrasts (too few images on one side): " + "; ".join(
            f"{r.contrast} ({r.n_subgroup} vs {r.n_reference})" for r in skipped.itertuples()))
    section = Section(tables={"table_s_faithfulness_subgroups": gaps, "table_s_faithfulness_subgroups_crude": crude,
                              "table_s_faithfulness_subgroup_controls": controls,
                              "table_s_faithfulness_subgroups_skipped": skipped}, views=views)
    if len(gaps):
        section.figures["figure_s_faithfulness_subgroups"] = faithfulness_figures.subgroup_forest_figure(
            gaps, model="M1", not_validated=not_validated)
        nested = gaps[(gaps["slopes"] == "shared") & (gaps["outcome"] == "energy_lift")].pivot_table(
            index=["contrast", "method"], columns="model", values="gap", sort=False)
        section.views += ["Energy-lift gap (bits) as factors are added, M0 → M3:", nested.round(3)]
        section.statement = (
            f"M1: {int(main['gap'].notna().sum())} of {len(main)} gaps estimable ({int(main['separated'].sum())} "
            "separated: a side where every or no image hits; their crude gap and Newcombe interval are in the _crude "
            f"table); {int(main['tost_equivalent'].sum())} rated equivalent to 0 by TOST; "
            f"{int((main['p_holm'] < 0.05).sum())} with Holm p < 0.05 in their family. Small synthetic subgroups give "
            "wide intervals: an interval that crosses the margin is *inconclusive*, not evidence of a gap.")
    return section
