"""Notebook 06 (frozen transfer), one function per section: the external cohorts and their
hash audit, the primary frozen with its temperature, the cohorts' audits, Figure 5 and the
centre / modality breakdown. Each returns a ``presentation.Section``; the numbers come from
``analysis.transfer``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from endoexplain_core.analysis import transfer
from endoexplain_core.artefacts import display_path
from endoexplain_core.data import roles
from endoexplain_core.figures import transfer_figures
from endoexplain_core.methods import method_label
from endoexplain_core.models import training
from endoexplain_core.presentation import Section
from endoexplain_core.run_layout import RunLayout


def cohorts(run_dir: str | Path, data_root: str, data_dir: str | Path, figures_dir: str | Path, *,
            required, optional) -> tuple[transfer.ExternalCohorts, pd.DataFrame, Section]:
    """Read the external cohorts (``transfer.read_external``: every case whose bytes or average
    hash overlap the run's HyperKvasir manifest is excluded) after verifying that manifest.
    Returns (the cohorts, the manifest, section)."""
    manifest = roles.verify_manifest(run_dir, data_root)  # the manifest the overlaps are checked against
    external = transfer.read_external(run_dir, data_dir, required=required, optional=optional)
    absent = sorted(set(optional) - set(external.cases))
    return external, manifest, Section(
        statement=f"Read from {display_path(data_dir, run_dir, figures_dir)}: {', '.join(external.cases)}; "
                  f"optional cohorts absent: {', '.join(absent) or 'none'}.")


def hash_audit(external: transfer.ExternalCohorts, manifest: pd.DataFrame) -> Section:
    """Overlaps of every cohort with the manifest and with each other
    (``transfer.hash_audit_summary``), what each cohort kept, and every file left out with its
    reason (``transfer.exclusion_table``)."""
    cases, reports, overlaps = external.cases, external.reports, external.overlaps
    hash_summary = transfer.hash_audit_summary(external.read_cases, overlaps)
    cohort_table = pd.DataFrame([report.summary() for report in reports.values()])
    excluded_files = transfer.exclusion_table(reports)
    statement = (
        f"{len(manifest)} HyperKvasir manifest images checked; "
        f"{sum(r.excluded_count(transfer.OVERLAP_REASON) for r in reports.values())} external cases overlap them "
        f"and are excluded; {int((overlaps['other_dataset'] != transfer.MANIFEST_NAME).sum())} overlapping pairs "
        f"between external cohorts; {sum(len(t) for t in cases.values())} cases remain for the audit.")
    return Section(tables={"table_s_transfer_hash_audit": hash_summary, "table_s_transfer_cohorts": cohort_table,
                           "table_s_transfer_exclusions": excluded_files},
                   views=[hash_summary, cohort_table], statement=statement)


def frozen_primary(run_dir: str | Path, image_size: int) -> tuple[dict, object, dict, Section]:
    """The primary checkpoint and its validation temperature, loaded on the CPU and never
    retrained. Returns (its registry row, model, metadata, section)."""
    layout = RunLayout(run_dir)
    primary = layout.primary_checkpoint()
    model, metadata = training.load_model(primary["path"], layout.manifest_digest(), image_size, device="cpu")
    return primary, model, metadata, Section(
        statement=f"Primary checkpoint `{primary['checkpoint_id']}`, temperature T = {primary['temperature']:.4f} "
                  "(frozen).")


def audits(audit_runs: pd.DataFrame, run_dir: str | Path, cases: dict, checkpoint_id: str) -> Section:
    """The cohorts' audit runs (``transfer.audit_cohorts``) and the files they wrote."""
    layout = RunLayout(run_dir)
    files = [layout.audit_paths(name, checkpoint_id)[part] for name in cases for part in ("table", "random_deletion")]
    return Section(files=files, views=[audit_runs])


def transfer_figure(audit_table: pd.DataFrame, not_validated, *, synthetic: bool, score_threshold: float,
                    top_fraction: float, replicates: int, seed: int) -> Section:
    """Mean top-area IoU per cohort and map with bootstrap CIs (``transfer.transfer_summary``):
    the transfer table and Figure 5 with its caption."""
    summary = transfer.transfer_summary(audit_table, score_threshold=score_threshold, top_fraction=top_fraction,
                                        replicates=replicates, seed=seed)
    table = transfer.table_transfer(summary)
    figure = transfer_figures.figure5_transfer(summary, score_threshold=score_threshold, top_fraction=top_fraction,
                                               synthetic=synthetic, not_validated=not_validated)
    return Section(tables={"table_transfer": table}, figures={"figure5_transfer": figure}, views=[table],
                   statement=transfer_figures.figure5_caption(summary, score_threshold=score_threshold,
                                                              synthetic=synthetic))


def breakdown(audit_table: pd.DataFrame, cases: dict[str, pd.DataFrame], *, score_threshold: float,
              replicates: int, seed: int) -> Section:
    """Mean IoU per centre and per modality of each labelled cohort (``transfer.breakdown``)."""
    parts = [transfer.breakdown(audit_table[audit_table["dataset"] == name], table, by,
                                score_threshold=score_threshold, replicates=replicates, seed=seed)
             for name, table in cases.items() for by in ("centre", "modality")]
    table = pd.concat([p for p in parts if len(p)], ignore_index=True).assign(method=lambda t: t["method"].map(method_label))
    groups = table[["dataset", "grouping", "group"]].drop_duplicates().shape[0]
    return Section(tables={"table_s_transfer_breakdown": table},
                   views=[table.pivot_table(index=["dataset", "grouping", "group", "n_cases"], columns="method",
                                            values="mean_iou", sort=False).round(3)],
                   statement=f"Mean IoU by group for {table['dataset'].nunique()} labelled cohorts, {groups} groups; "
                             f"smallest group n = {table['n_cases'].min()}.")
