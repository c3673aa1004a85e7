"""Frozen external transfer (notebook 06): hash audit, the frozen primary checkpoint, per-cohort
summaries of the audit tables (Figure 5 itself: ``figures.transfer_figures``).

Nothing is fitted on external data; cases that overlap the HyperKvasir manifest by hash are
excluded and counted. Method: docs/statistics_and_gate.md, "Frozen external transfer".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from endoexplain_core.run_layout import RunLayout
from endoexplain_core.analysis import audit, audit_schema, stats
from endoexplain_core.data import cohorts
from endoexplain_core.data.cohorts import DATASET_LABELS, CohortReport
from endoexplain_core.data.datasets import load_manifest
from endoexplain_core.methods import MAP_METHODS, labelled, method_label

MANIFEST_NAME = "hyperkvasir"
OVERLAP_REASON = "overlaps the HyperKvasir manifest by hash (not external data)"
OVERLAP_COLUMNS = ("dataset", "sample_id", "other_dataset", "other_sample_id", "other_role",
                   "match")


# --------------------------------------------------------------------------- hash audit

def _matches(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    """Pairs of rows of ``left`` and ``right`` with equal sha256 or equal ahash.

    Both frames have columns sample_id, sha256, ahash (and right optionally role). ``match`` is
    "sha256" when the bytes are identical, else "ahash".
    """
    pairs = []
    for key in ("sha256", "ahash"):
        joined = left[["sample_id", "sha256", "ahash"]].merge(
            right.rename(columns={"sample_id": "other_sample_id"}), on=key, suffixes=("", "_other"))
        if key == "ahash":  # an identical-bytes pair also has identical ahash: keep it once
            joined = joined[joined["sha256"] != joined["sha256_other"]]
        joined = joined.assign(match=key)
        pairs.append(joined)
    merged = pd.concat(pairs, ignore_index=True)
    if "role" not in merged.columns:
        merged["role"] = ""
    return merged.rename(columns={"role": "other_role"})[
        ["sample_id", "other_sample_id", "other_role", "match"]]


def hash_audit(cohort_cases: dict[str, pd.DataFrame], manifest: pd.DataFrame) -> pd.DataFrame:
    """Every overlap of an external case with the HyperKvasir manifest or another cohort.

    ``cohort_cases``: dataset -> case table (``cohorts.CASE_COLUMNS``). ``manifest``: the
    HyperKvasir manifest (sample_id, role, sha256, ahash, ...). Returns one row per overlapping
    pair (``OVERLAP_COLUMNS``); ``other_dataset`` is ``"hyperkvasir"`` for the manifest. Pairs
    between two cohorts are listed once, under the first cohort in the given order.
    """
    manifest_keys = manifest[["sample_id", "role", "sha256", "ahash"]].astype(str)
    rows = []
    names = list(cohort_cases)
    for position, dataset in enumerate(names):
        cases = cohort_cases[dataset]
        found = _matches(cases, manifest_keys).assign(other_dataset=MANIFEST_NAME)
        rows.append(found.assign(dataset=dataset))
        for other in names[position + 1:]:
            other_keys = cohort_cases[other][["sample_id", "sha256", "ahash"]]
            rows.append(_matches(cases, other_keys).assign(dataset=dataset, other_dataset=other))
    table = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    return table.reindex(columns=list(OVERLAP_COLUMNS)).sort_values(
        ["dataset", "other_dataset", "sample_id", "other_sample_id"], ignore_index=True)


def hash_audit_summary(cohort_cases: dict[str, pd.DataFrame], overlaps: pd.DataFrame) -> pd.DataFrame:
    """Per cohort: cases hashed, cases with an exact / average-hash-only overlap with the
    manifest, and cases overlapping any other external cohort (either direction)."""
    rows = []
    for dataset, cases in cohort_cases.items():
        mine = overlaps[overlaps["dataset"] == dataset]
        with_manifest = mine[mine["other_dataset"] == MANIFEST_NAME]
        row = {"dataset": DATASET_LABELS.get(dataset, dataset), "cases_hashed": len(cases),
               "exact_overlap_hyperkvasir": with_manifest.loc[
                   with_manifest["match"] == "sha256", "sample_id"].nunique(),
               "ahash_only_overlap_hyperkvasir": with_manifest.loc[
                   with_manifest["match"] == "ahash", "sample_id"].nunique()}
        between = overlaps[overlaps["other_dataset"] != MANIFEST_NAME]
        as_first = between.loc[between["dataset"] == dataset, "sample_id"]
        as_second = between.loc[between["other_dataset"] == dataset, "other_sample_id"]
        row["overlap_other_cohorts"] = len(set(as_first) | set(as_second))
        rows.append(row)
    return pd.DataFrame(rows)


def exclusion_table(reports: dict[str, CohortReport]) -> pd.DataFrame:
    """Every file an external cohort left out, one row each: dataset, path (relative to the data
    root), reason (an empty mask, a missing mask file, an overlap with the manifest)."""
    rows = [{"dataset": name, "path": path, "reason": reason}
            for name, report in reports.items() for path, reason in report.exclusions]
    return pd.DataFrame(rows, columns=["dataset", "path", "reason"])


def exclude_manifest_overlap(cases: pd.DataFrame, overlaps: pd.DataFrame,
                             report: CohortReport) -> pd.DataFrame:
    """Drop the cases of ``report.dataset`` that overlap the HyperKvasir manifest by hash and
    record each in ``report.exclusions``. Returns the kept cases (order unchanged)."""
    hit = overlaps[(overlaps["dataset"] == report.dataset)
                   & (overlaps["other_dataset"] == MANIFEST_NAME)]
    overlapping = set(hit["sample_id"])
    excluded = cases[cases["sample_id"].isin(overlapping)]
    report.exclusions += [(path, OVERLAP_REASON) for path in excluded["image_path"]]
    return cases[~cases["sample_id"].isin(overlapping)].reset_index(drop=True)


# --------------------------------------------------------------------------- frozen checkpoint

def audit_cohort_unit(model, metadata: dict, temperature: float, dataset: str,
                      cases: pd.DataFrame, data_root: str | Path, run_dir: str | Path, *,
                      image_size: int, top_fraction: float, repetitions: int, batch_size: int,
                      device: str) -> dict:
    """Audit the frozen checkpoint on one cohort (one unit of work; ``audit.audit_checkpoint``)
    and write ``<run_dir>/audit/<dataset>/<checkpoint_id>[_random_deletion].parquet``
    atomically. Returns the audit summary."""
    checkpoint_id = str(metadata["checkpoint_id"])
    paths = RunLayout(run_dir).audit_paths(dataset, checkpoint_id)
    return audit.audit_checkpoint(
        model, metadata, temperature, cohorts.iter_cases(cases, data_root, decode_size=image_size),
        dataset=dataset,
        image_size=image_size, table_path=paths["table"], random_deletion_path=paths["random_deletion"],
        top_fraction=top_fraction, repetitions=repetitions, batch_size=batch_size,
        device=device, total=len(cases))


def audit_cohorts(model, metadata: dict, temperature: float, cohort_cases: dict[str, pd.DataFrame],
                  data_root: str | Path, run_dir: str | Path, *, image_size: int,
                  top_fraction: float, repetitions: int, batch_size: int,
                  device: str, task_map=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Audit the frozen checkpoint on every cohort with ``audit.audit_checkpoint`` (the function
    of notebook 04), writing ``<run_dir>/audit/<dataset>/<checkpoint_id>[_random_deletion].parquet``.

    One ``audit_cohort_unit`` per cohort: in this process one after the other
    (``task_map=None``) or as tasks (``pipeline.tasks.TaskRunner.map``). Returns the
    concatenated, validated audit tables and one summary row per cohort (n_audited, empty
    masks excluded after resizing, seconds).
    """
    checkpoint_id = str(metadata["checkpoint_id"])
    calls = [{"model": model, "metadata": metadata, "temperature": temperature,
              "dataset": dataset, "cases": cases, "data_root": data_root, "run_dir": run_dir,
              "image_size": image_size, "top_fraction": top_fraction,
              "repetitions": repetitions, "batch_size": batch_size, "device": device}
             for dataset, cases in cohort_cases.items()]
    if task_map is None:
        results = [audit_cohort_unit(**call) for call in calls]
    else:
        results = task_map(audit_cohort_unit, calls,
                           labels=[f"{dataset}/{checkpoint_id}" for dataset in cohort_cases])
    tables, runs = [], []
    for (dataset, cases), run in zip(cohort_cases.items(), results):
        tables.append(audit_schema.read_audit_table(run["table_path"]))
        runs.append({"dataset": DATASET_LABELS.get(dataset, dataset), "checkpoint_id": checkpoint_id,
                     "temperature": temperature, "cases": len(cases),
                     "n_audited": run["n_audited"],
                     "empty_after_resize": run["n_empty_masks_excluded"],
                     "seconds": run["seconds"]})
    return pd.concat(tables, ignore_index=True), pd.DataFrame(runs)


# --------------------------------------------------------------------------- summaries

def _mean_ci(values: np.ndarray, replicates: int, seed: int) -> tuple[float, float, float]:
    result = stats.bootstrap_mean_ci(values, replicates=replicates, seed=seed)
    return result["estimate"], result["ci_low"], result["ci_high"]


def chance_top_fraction_iou(lesion_fraction, top_fraction: float) -> np.ndarray:
    """Expected IoU of a uniformly random top-area set with the lesion, per image.

    ``lesion_fraction``: lesion area / frame area (array, in [0, 1]); ``top_fraction``: share of
    pixels the top-area rule keeps. A random set of f·N pixels meets a lesion of a·N pixels in
    f·a·N pixels on average, so IoU ≈ f·a / (f + a − f·a) (the ratio of expected areas; the
    exact expectation differs by O(1/N)). This is the chance level a map's top-20% IoU should
    be read against: it grows with the lesion, unlike the model-free centre baseline.
    """
    a = np.asarray(lesion_fraction, dtype=float)
    f = float(top_fraction)
    union = f + a - f * a
    return np.divide(f * a, union, out=np.zeros_like(a), where=union > 0)


def transfer_summary(audit_table: pd.DataFrame, *, score_threshold: float, top_fraction: float,
                     replicates: int,
                     seed: int) -> pd.DataFrame:
    """Mean top-fraction IoU per (dataset, method) with bootstrap 95% CIs.

    ``audit_table``: concatenated audit tables (one checkpoint, several datasets). Returns per
    (dataset, method): ``n_cases``, ``n_eligible`` (scaled score >= ``score_threshold``),
    ``mean_iou`` / ``ci_low`` / ``ci_high`` over all cases, ``mean_iou_high_score`` /
    ``mean_iou_high_score_ci_low`` / ``_ci_high`` over the eligible cases (NaN if none), the
    peak-outside-mask rate among eligible cases, ``centre_baseline_iou`` (the cohort's mean
    IoU of the centred Gaussian) and ``chance_iou`` (the cohort's mean expected IoU of a
    uniformly random top-area set, ``chance_top_fraction_iou`` at ``top_fraction``). Each
    method's bootstrap uses the same seed, hence the same resampled images within a cohort.
    """
    audit_schema.validate_audit_table(audit_table, source="transfer audit tables")
    if audit_table["checkpoint_id"].nunique() != 1:
        raise ValueError("transfer summary expects the tables of one (frozen) checkpoint, got "
                         f"{sorted(audit_table['checkpoint_id'].unique())}")
    rows = []
    for dataset, cohort in audit_table.groupby("dataset", sort=False):
        centre_iou = cohort.loc[cohort["method"] == "centre", "iou"].mean()
        lesions = cohort.drop_duplicates("sample_id")["lesion_area_fraction"].to_numpy()
        chance_iou = float(chance_top_fraction_iou(lesions, top_fraction).mean())
        for method in [m for m in MAP_METHODS if m in set(cohort["method"])]:
            part = cohort[cohort["method"] == method].sort_values("sample_id")
            eligible = part[part["scaled_score"] >= score_threshold]
            mean, low, high = _mean_ci(part["iou"].to_numpy(), replicates, seed)
            high_mean, high_low, high_high = _mean_ci(eligible["iou"].to_numpy(), replicates, seed)
            # the Table 4 rule: a constant map counts as a failure; Wilson interval
            failure = stats.rate_ci(eligible["peak_outside_mask"].astype(bool).to_numpy()
                                    | eligible["constant_map"].astype(bool).to_numpy())
            rows.append({"dataset": dataset, "method": method, "n_cases": len(part),
                         "n_eligible": len(eligible), "mean_iou": mean, "ci_low": low,
                         "ci_high": high, "mean_iou_high_score": high_mean,
                         "mean_iou_high_score_ci_low": high_low,
                         "mean_iou_high_score_ci_high": high_high,
                         "n_constant_high_score": int(eligible["constant_map"].sum()),
                         "peak_outside_high_score": failure["estimate"],
                         "peak_outside_high_score_ci_low": failure["ci_low"],
                         "peak_outside_high_score_ci_high": failure["ci_high"],
                         "centre_baseline_iou": centre_iou, "chance_iou": chance_iou})
    return pd.DataFrame(rows)


BREAKDOWN_COLUMNS = ("dataset", "grouping", "group", "method", "n_cases", "n_eligible",
                     "mean_iou", "ci_low", "ci_high")


def breakdown(audit_table: pd.DataFrame, cases: pd.DataFrame, by: str, *, score_threshold: float,
              replicates: int,
              seed: int) -> pd.DataFrame:
    """Mean IoU per (``by`` label, method) for one cohort, ``by`` = "centre" or "modality".

    ``cases``: the cohort's case table (for the labels), joined on sample_id. Returns
    ``BREAKDOWN_COLUMNS`` (``grouping`` = ``by``, ``group`` = the label; 2,000 bootstrap
    replicates by default). An empty result means the cohort carries no such label.
    """
    labels = cases[["sample_id", by]].rename(columns={by: "group"})
    labels = labels[labels["group"].astype(str) != ""]
    if labels.empty:
        return pd.DataFrame(columns=list(BREAKDOWN_COLUMNS))
    joined = audit_table.merge(labels, on="sample_id", how="inner", validate="many_to_one")
    order = {m: i for i, m in enumerate(MAP_METHODS)}
    rows = []
    for (dataset, group, _, method), part in joined.assign(
            rank=joined["method"].map(order)).groupby(["dataset", "group", "rank", "method"]):
        mean, low, high = _mean_ci(part.sort_values("sample_id")["iou"].to_numpy(), replicates, seed)
        rows.append({"dataset": dataset, "grouping": by, "group": group, "method": method,
                     "n_cases": len(part),
                     "n_eligible": int((part["scaled_score"] >= score_threshold).sum()),
                     "mean_iou": mean, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows, columns=list(BREAKDOWN_COLUMNS))


def table_transfer(summary: pd.DataFrame) -> pd.DataFrame:
    """The paper's transfer table: one row per cohort and map, display labels, Eigen-CAM*."""
    table = summary.copy()
    table.insert(0, "cohort", table.pop("dataset").map(lambda d: DATASET_LABELS.get(d, d)))
    table["method"] = table["method"].map(method_label)
    return table[["cohort", "method", "n_cases", "n_eligible", "mean_iou", "ci_low", "ci_high",
                  "mean_iou_high_score",
                  "mean_iou_high_score_ci_low", "mean_iou_high_score_ci_high",
                  "n_constant_high_score", "peak_outside_high_score",
                  "peak_outside_high_score_ci_low", "peak_outside_high_score_ci_high",
                  "centre_baseline_iou", *(["chance_iou"] if "chance_iou" in table.columns else [])]]


def no_negatives_statement(cohort_cases: dict[str, pd.DataFrame]) -> str:
    """A sentence computed from the case tables: how many cases, how many without a lesion."""
    total = sum(len(c) for c in cohort_cases.values())
    negatives = sum(int((c["lesion_pixels"] == 0).sum()) for c in cohort_cases.values())
    names = ", ".join(DATASET_LABELS.get(d, d) for d in cohort_cases)
    return (f"The {total} analysed external cases ({names}) all carry a lesion mask: "
            f"{negatives} negative images. Without negatives, no external AUPRC, specificity or "
            f"calibration can be estimated; these cohorts support spatial transfer only.")


@dataclass
class ExternalCohorts:
    """The external cohorts of a run as read: ``read_cases`` (every readable case),
    ``overlaps`` (``hash_audit`` against the run's manifest and between cohorts), ``cases``
    (``read_cases`` minus the manifest overlaps) and the ``reports`` that count every
    exclusion; dictionaries in reading order."""

    read_cases: dict[str, pd.DataFrame]
    overlaps: pd.DataFrame
    cases: dict[str, pd.DataFrame]
    reports: dict[str, CohortReport]


def read_external(run_dir: str | Path, data_root: str | Path, *, required=(), optional=()
                  ) -> ExternalCohorts:
    """Read the ``required`` cohorts (a missing folder stops with ``cohorts.CohortError``
    naming it) and those of ``optional`` whose folder is under ``data_root``, in that order,
    and exclude every case whose bytes or average hash overlap the run's HyperKvasir manifest:
    the one rule of notebooks 06, 07, 08 and the case browser."""
    data_root = Path(data_root)
    names = [*required, *(name for name in optional if (data_root / cohorts.DATASET_FOLDERS[name]).is_dir())]
    read = {name: cohorts.read_cohort(name, data_root) for name in names}
    read_cases = {name: table for name, (table, _) in read.items()}
    reports = {name: report for name, (_, report) in read.items()}
    if not names:
        return ExternalCohorts({}, pd.DataFrame(), {}, {})
    overlaps = hash_audit(read_cases, load_manifest(RunLayout(run_dir).manifest))
    cases = {name: exclude_manifest_overlap(table, overlaps, reports[name]) for name, table in read_cases.items()}
    return ExternalCohorts(read_cases, overlaps, cases, reports)


def external_cases(run_dir: str | Path, data_root: str | Path, cohort_names, *,
                   required: bool = False) -> dict[str, pd.DataFrame]:
    """``read_external(...).cases`` of ``cohort_names``: all required, or those present."""
    names = list(cohort_names)
    return read_external(run_dir, data_root, required=names if required else (),
                         optional=() if required else names).cases


# --- what notebook 06 says beside its tables ---------------------------------------------------

def describe_read(external: ExternalCohorts, optional, where: str) -> str:
    """Which cohorts were read from ``where`` and which optional ones are absent."""
    absent = sorted(set(optional) - set(external.cases))
    return f"Read from {where}: {', '.join(external.cases)}; optional cohorts absent: {', '.join(absent) or 'none'}."


def cohort_table(external: ExternalCohorts) -> pd.DataFrame:
    """One row per cohort: what it kept and left out (``CohortReport.summary``)."""
    return pd.DataFrame([report.summary() for report in external.reports.values()])


def describe_hash_audit(external: ExternalCohorts, manifest: pd.DataFrame) -> str:
    """The overlap audit in words: manifest images checked, external cases excluded as
    overlaps, overlapping pairs between cohorts, cases left for the audit."""
    reports, overlaps = external.reports, external.overlaps
    return (f"{len(manifest)} HyperKvasir manifest images checked; "
            f"{sum(r.excluded_count(OVERLAP_REASON) for r in reports.values())} external cases overlap them "
            f"and are excluded; {int((overlaps['other_dataset'] != MANIFEST_NAME).sum())} overlapping pairs "
            f"between external cohorts; {sum(len(t) for t in external.cases.values())} cases remain for the audit.")


def breakdown_table(audit_table: pd.DataFrame, cases: dict[str, pd.DataFrame], *, score_threshold: float,
                    replicates: int, seed: int) -> pd.DataFrame:
    """``breakdown`` by centre and by modality of every labelled cohort, stacked, methods by
    their display names."""
    parts = [breakdown(audit_table[audit_table["dataset"] == name], table, by,
                       score_threshold=score_threshold, replicates=replicates, seed=seed)
             for name, table in cases.items() for by in ("centre", "modality")]
    table = pd.concat([part for part in parts if len(part)], ignore_index=True)
    return labelled(table)


def describe_breakdown(table: pd.DataFrame) -> str:
    """How many labelled cohorts and groups the breakdown covers, and its smallest group."""
    groups = table[["dataset", "grouping", "group"]].drop_duplicates().shape[0]
    return (f"Mean IoU by group for {table['dataset'].nunique()} labelled cohorts, {groups} groups; "
            f"smallest group n = {table['n_cases'].min()}.")
