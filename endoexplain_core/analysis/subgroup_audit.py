"""The subgroup contrasts of this audit and the tables notebook 08 writes from them.

``audit_contrasts`` cuts the case table into the contrasts (PolypDB modality, each PolypGen
centre, lesion size); ``subgroup_table`` runs, per contrast, the nested GEE models of
``subgroups`` on the localisation outcomes (every analysed checkpoint), the same models on the
primary's SRG and LSR when given, the crude gaps and the controls of ``subgroup_controls``,
then Holm's adjustment by family over all of them and TOST.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from endoexplain_core.models.learning import learning_table, with_map_check
from endoexplain_core.config import LocalisationSettings
from endoexplain_core.run_layout import RunLayout
from endoexplain_core.analysis import audit, faithfulness, subgroup_controls, subgroups, transfer
from endoexplain_core.analysis.subgroups import Contrast
from endoexplain_core.data import cohorts
from endoexplain_core.data.datasets import load_manifest
from endoexplain_core.kernels import randomisation
from endoexplain_core.files import write_parquet_atomic
from endoexplain_core.progress import progress_bar

WHITE_LIGHT = {"WLI", "WL", "WHITE LIGHT", "WHITE-LIGHT"}
FAITHFULNESS_MODELS = ("M0", "M1")   # SRG/LSR: crude as the model sees it, and case-mix adjusted


def subgroup_checkpoint_ids(run_dir: str | Path, which: str) -> list[str]:
    """Checkpoints whose maps enter the subgroup models, the primary first: ``"primary"``, or
    ``"learned"``: also every other checkpoint of the registry that learned (AUPRC and maps,
    ``learning.with_map_check`` on the audits of 04 and 05) and is no control (a shuffled-label model's maps carry
    no subgroup effect worth pooling)."""
    if which not in ("primary", "learned"):
        raise ValueError(f"subgroup_checkpoints must be 'primary' or 'learned'; got {which!r}")
    layout = RunLayout(run_dir)
    registry = layout.read_registry()
    primary_id = layout.primary_id()
    if which == "primary":
        return [primary_id]
    learning = learning_table(registry, load_manifest(layout.manifest))
    audited = [c for c in learning["checkpoint_id"] if c == primary_id or layout.audit_paths("hyperkvasir", c)["table"].is_file()]
    learning = with_map_check(learning, audit.read_audits(run_dir, audited)[0])
    chosen = learning["learned"].astype(bool) & (learning["control"] == "none")
    return [primary_id, *[c for c in learning.loc[chosen, "checkpoint_id"] if c != primary_id]]


def prepare_subgroup_cohorts(pool: faithfulness.PreparedCases, cohort_cases: dict[str, pd.DataFrame],
                             data_root: str | Path, image_size: int) -> tuple[dict, dict]:
    """The cohorts of the subgroup models at the input size: the audit pool (``pool``, already
    prepared; no centre or modality) first, then each external cohort of ``cohort_cases``
    (``transfer.external_cases``). Returns (dataset -> ``faithfulness.PreparedCases``,
    dataset -> ``sample_id``, ``centre``, ``modality`` labels)."""
    prepared = {"hyperkvasir": pool}
    labels = {"hyperkvasir": pd.DataFrame({"sample_id": pool.sample_ids, "centre": "", "modality": ""})}
    for name, table in cohort_cases.items():
        prepared[name] = faithfulness.prepare_cases(cohorts.iter_cases(table, data_root, decode_size=image_size),
                                                    image_size)
        labels[name] = table[["sample_id", "centre", "modality"]]
    return prepared, labels


def case_outcomes(run_dir: str | Path, checkpoint_ids, prepared_by_dataset: dict, labels_by_dataset: dict,
                  *, settings: LocalisationSettings, decision_threshold: float, image_size: int,
                  batch_size: int, device: str, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Localisation outcomes (``faithfulness.localisation_outcomes``) of every checkpoint on
    every prepared cohort, and the same on each checkpoint's fully randomised copy
    (``randomisation.fully_randomised``, seeded by ``seed``; same temperature, target layer and
    ``checkpoint_id``). ``labels_by_dataset``: per cohort, ``sample_id``, ``centre``,
    ``modality``. Returns (trained, randomised) long tables with ``dataset`` added."""
    trained, randomised = [], []
    bar = progress_bar(total=2 * len(checkpoint_ids) * len(prepared_by_dataset),
                       desc="subgroup maps", unit="cohort")
    for checkpoint_id in checkpoint_ids:
        model, metadata, temperature = audit.load_calibrated_model(run_dir, checkpoint_id, image_size, device)
        for parts, net in ((trained, model), (randomised, randomisation.fully_randomised(model, seed=seed))):
            for name, cases in prepared_by_dataset.items():
                outcomes = faithfulness.localisation_outcomes(
                    net, metadata, temperature, cases, settings=settings,
                    decision_threshold=decision_threshold, batch_size=batch_size, device=device)
                parts.append(outcomes.merge(labels_by_dataset[name], on="sample_id", how="left")
                             .assign(dataset=name))
                bar.update(1)
    bar.close()
    trained_table, randomised_table = (pd.concat(parts, ignore_index=True) for parts in (trained, randomised))
    for table in (trained_table, randomised_table):
        table[["centre", "modality"]] = table[["centre", "modality"]].fillna("")
    return trained_table, randomised_table


def cohort_faithfulness(run_dir: str | Path, checkpoint_id: str, prepared_by_dataset: dict,
                        known: dict[str, pd.DataFrame], *, settings: faithfulness.FaithfulnessControls,
                        image_size: int, batch_size: int, device: str) -> dict[str, pd.DataFrame]:
    """Per-image SRG and LSR of ``checkpoint_id`` on every prepared cohort: taken from
    ``known`` (``{"srg", "lsr"}`` tables of ``faithfulness.faithfulness_checkpoint``, e.g. the
    audit pool's, with ``dataset`` and ``checkpoint_id``) where they cover a cohort, computed
    (ROAD and LSR, no shape control) for the others. Returns ``{"srg": ..., "lsr": ...}``."""
    parts = {name: [table[table["checkpoint_id"] == checkpoint_id]] for name, table in known.items()}
    covered = set(parts["srg"][0]["dataset"])
    missing = [name for name in prepared_by_dataset if name not in covered]
    if missing:
        model, metadata, temperature = audit.load_calibrated_model(run_dir, checkpoint_id, image_size, device)
        for name in missing:
            result = faithfulness.faithfulness_checkpoint(
                model, metadata, temperature, prepared_by_dataset[name], dataset=name,
                settings=settings, batch_size=batch_size, device=device, include_shape=False)
            for part in parts:
                parts[part].append(result[part])
    return {part: pd.concat(tables, ignore_index=True) for part, tables in parts.items()}


def _labelled(frame: pd.DataFrame, subgroup: pd.Series) -> pd.DataFrame:
    out = frame.assign(subgroup=subgroup.astype(int).to_numpy())
    return out.assign(cluster=out["dataset"].astype(str) + "/" + out["sample_id"].astype(str))


def audit_contrasts(cases: pd.DataFrame, *, min_images: int
                    ) -> tuple[list[tuple[Contrast, pd.DataFrame]], pd.DataFrame]:
    """The subgroup contrasts of the transfer cohorts and the audit pool.

    ``cases``: long table of ``analysis.faithfulness.localisation_outcomes`` rows with
    ``dataset``, ``centre`` and ``modality`` added (``""`` where a cohort has no such label).
    Contrasts:
      * PolypDB, image-enhanced endoscopy (NBI, BLI, FICE, LCI, ...) vs white light; centre
        fixed effects from M1 on (the modality mix differs between centres);
      * PolypGen, each centre vs the other PolypGen centres;
      * lesion size, lesions below vs at or above the median lesion share of the field of view,
        over every cohort; dataset fixed effects from M1 on; log lesion area left out (it
        defines the contrast).
    A contrast with fewer than ``min_images`` images on either side is skipped and listed in
    the second return value (contrast, n_subgroup, n_reference, reason).
    """
    contrasts: list[tuple[Contrast, pd.DataFrame]] = []
    skipped = []

    def add(contrast: Contrast, frame: pd.DataFrame) -> None:
        images = frame.drop_duplicates("cluster")
        n_sub, n_ref = int(images["subgroup"].sum()), int((1 - images["subgroup"]).sum())
        if min(n_sub, n_ref) < min_images:
            skipped.append({"contrast": contrast.name, "n_subgroup": n_sub, "n_reference": n_ref,
                            "reason": f"fewer than {min_images} images on one side"})
        else:
            contrasts.append((contrast, frame))

    polypdb = cases[cases["dataset"] == "polypdb"]
    if len(polypdb):
        enhanced = ~polypdb["modality"].str.upper().isin(WHITE_LIGHT)
        add(Contrast("PolypDB: image-enhanced vs white light", "image-enhanced", "white light",
                     fixed_effects=("C(centre)",)), _labelled(polypdb, enhanced))
    polypgen = cases[cases["dataset"] == "polypgen"]
    for centre in sorted(c for c in polypgen["centre"].unique() if c):
        add(Contrast(f"PolypGen: {centre} vs other centres", centre, "other centres"),
            _labelled(polypgen, polypgen["centre"] == centre))
    per_image = cases.drop_duplicates(["dataset", "sample_id"])
    median = float(per_image["log_lesion_area"].median())
    add(Contrast(subgroups.LESION_SIZE_CONTRAST, "below the median lesion share",
                 "at or above the median", exclude=("log_lesion_area",),
                 fixed_effects=("C(dataset)",) if cases["dataset"].nunique() > 1 else ()),
        _labelled(cases, cases["log_lesion_area"] < median))
    return contrasts, pd.DataFrame(skipped, columns=["contrast", "n_subgroup", "n_reference", "reason"])


def faithfulness_frames(frame: pd.DataFrame, faithfulness: dict[str, pd.DataFrame],
                        checkpoint_id: str) -> dict[str, pd.DataFrame]:
    """The contrast's rows of ``checkpoint_id`` joined with its per-image SRG (per CAM method)
    and LSR (one row per image, method ``subgroups.LSR_METHOD``). ``faithfulness``: ``{"srg":
    dataset, sample_id, method, srg; "lsr": dataset, sample_id, lsr}`` (images without an LSR,
    e.g. no room for a comparison region, are left out). Returns ``{"srg": ..., "lsr": ...}``
    with the images that have the outcome."""
    own = frame[frame["checkpoint_id"] == checkpoint_id]
    srg = own.merge(faithfulness["srg"][["dataset", "sample_id", "method", "srg"]],
                    on=["dataset", "sample_id", "method"], how="inner", validate="one_to_one")
    lsr = (own.drop_duplicates("cluster").drop(columns="method")
           .merge(faithfulness["lsr"][["dataset", "sample_id", "lsr"]], on=["dataset", "sample_id"],
                  how="inner", validate="one_to_one")
           .assign(method=subgroups.LSR_METHOD))
    return {"srg": srg.dropna(subset=["srg"]), "lsr": lsr.dropna(subset=["lsr"])}


def subgroup_table(cases: pd.DataFrame, *, min_images: int, models=subgroups.ALL_MODELS,
                   randomised: pd.DataFrame | None = None,
                   faithfulness: dict[str, pd.DataFrame] | None = None,
                   faithfulness_checkpoint: str | None = None
                   ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every contrast's gaps, crude gaps and controls, with Holm by family and TOST.

    ``cases``: localisation outcomes of every analysed checkpoint (``audit_contrasts``);
    ``randomised``: the same outcomes on the randomised networks (``subgroup_controls``);
    ``faithfulness``: per-image SRG and LSR of ``faithfulness_checkpoint`` (usually the
    primary; ``faithfulness_frames``), fitted with ``FAITHFULNESS_MODELS``.
    Returns (gaps, crude gaps, controls, skipped contrasts).
    """
    contrasts, skipped = audit_contrasts(cases, min_images=min_images)
    if not contrasts:
        empty = pd.DataFrame(columns=["contrast", "outcome", "model", "slopes", "method", "gap",
                                      "tost_equivalent", "tost_p"])
        return empty, pd.DataFrame(), pd.DataFrame(), skipped
    gap_parts, crude_parts, control_parts = [], [], []
    for contrast, frame in contrasts:
        gap_parts.append(subgroups.contrast_gaps(frame, contrast, models=models))
        crude_parts.append(subgroups.crude_gaps(frame).assign(contrast=contrast.name))
        control_parts.append(subgroup_controls.control_gaps(contrast.name, frame, randomised))
        if faithfulness is None:
            continue
        for outcome, outcome_frame in faithfulness_frames(frame, faithfulness,
                                                          faithfulness_checkpoint).items():
            if outcome_frame.empty:
                continue
            gap_parts.append(subgroups.contrast_gaps(outcome_frame, contrast, outcomes=(outcome,),
                                                     models=FAITHFULNESS_MODELS, sensitivity_model=""))
            crude_parts.append(subgroups.crude_gaps(outcome_frame, outcomes=(outcome,))
                               .assign(contrast=contrast.name))
    gaps = pd.concat(gap_parts, ignore_index=True)
    gaps["holm_family"] = [subgroups.holm_family(o, m, s, c) for o, m, s, c in
                           zip(gaps["outcome"], gaps["model"], gaps["slopes"], gaps["contrast"])]
    gaps, controls = subgroups.add_holm(gaps, pd.concat(control_parts, ignore_index=True))
    crude = pd.concat(crude_parts, ignore_index=True)
    return subgroups.add_tost(gaps, crude), crude, controls, skipped


# --- notebook 08's subgroup inputs and what it says beside its tables ---------------------------

def subgroup_inputs(run_dir: str | Path, data_dir: str | Path, prepared: faithfulness.PreparedCases,
                    tables: dict[str, pd.DataFrame], primary_id: str, *, cohorts_used, checkpoints: str,
                    with_faithfulness: bool, localisation_settings: LocalisationSettings,
                    settings: faithfulness.FaithfulnessControls, decision_threshold: float, image_size: int,
                    batch_size: int, device: str, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, dict, list[Path]]:
    """Per-image outcomes of the subgroup checkpoints (``subgroup_checkpoint_ids``) on the audit
    pool and the external ``cohorts_used`` (``case_outcomes``, with the randomised-network
    control), and the primary's per-image SRG and LSR on them: the audit pool's from ``tables``
    (08's faithfulness tables), the external cohorts' computed here when ``with_faithfulness``.
    Each table is kept in the run folder. Returns (outcomes, randomised outcomes, reliance
    tables, kept files)."""
    cohort_cases = transfer.external_cases(run_dir, data_dir, cohorts_used, required=True)
    prepared_by_dataset, labels_by_dataset = prepare_subgroup_cohorts(prepared, cohort_cases, data_dir, image_size)
    outcomes, randomised = case_outcomes(
        run_dir, subgroup_checkpoint_ids(run_dir, checkpoints), prepared_by_dataset, labels_by_dataset,
        settings=localisation_settings, decision_threshold=decision_threshold, image_size=image_size,
        batch_size=batch_size, device=device, seed=seed)
    reliance = cohort_faithfulness(run_dir, primary_id, prepared_by_dataset if with_faithfulness else {},
                                   {"srg": tables["srg"], "lsr": tables["lsr"]}, settings=settings,
                                   image_size=image_size, batch_size=batch_size, device=device)
    kept = {"subgroup_cases": outcomes, "subgroup_cases_randomised": randomised,
            **{f"subgroup_{part}": table for part, table in reliance.items()}}
    out_dir = RunLayout(run_dir).faithfulness_dir
    files = [write_parquet_atomic(table, out_dir / f"{name}.parquet") for name, table in kept.items()]
    return outcomes, randomised, reliance, files


def cohort_profile(outcomes: pd.DataFrame, checkpoint_id: str) -> pd.DataFrame:
    """Per cohort, under ``checkpoint_id``: images, median lesion share, share classified
    correctly, mean DoG lift: how the subgroups' cohorts differ before any model."""
    cases = outcomes[outcomes["checkpoint_id"] == checkpoint_id].drop_duplicates(["dataset", "sample_id"])
    return cases.groupby("dataset").agg(
        images=("sample_id", "size"),
        median_lesion_share=("log_lesion_area", lambda v: float(np.exp(pd.Series(v)).median())),
        primary_correct=("correct", "mean"), mean_dog_lift=("dog_lift", "mean")).round(3)


# The columns notebook 08 shows of the M1 gaps and of the controls.
M1_COLUMNS = ["contrast", "outcome", "method", "gap", "ci_low", "ci_high", "holm_family", "p_holm", "tost_p",
              "tost_equivalent", "n_subgroup", "n_reference", "hits", "note"]
CONTROL_COLUMNS = ["contrast", "control", "outcome", "method", "gap", "ci_low", "ci_high", "p", "p_holm",
                   "n_subgroup", "n_reference"]


def main_gaps(gaps: pd.DataFrame) -> pd.DataFrame:
    """The M1 shared-slopes rows: the main model's gaps."""
    return gaps[(gaps["model"] == "M1") & (gaps["slopes"] == "shared")]


def nested_lift_gaps(gaps: pd.DataFrame) -> pd.DataFrame:
    """Energy-lift gaps (bits) per contrast and method as the models add factors, M0 to M3."""
    return gaps[(gaps["slopes"] == "shared") & (gaps["outcome"] == "energy_lift")].pivot_table(
        index=["contrast", "method"], columns="model", values="gap", sort=False)


def describe_skipped(skipped: pd.DataFrame) -> str:
    """The contrasts left out for too few images on a side."""
    return "Skipped contrasts (too few images on one side): " + "; ".join(
        f"{r.contrast} ({r.n_subgroup} vs {r.n_reference})" for r in skipped.itertuples())


def describe_gaps(main: pd.DataFrame) -> str:
    """The M1 gaps in words: estimable, separated, equivalent, Holm-significant."""
    return (f"M1: {int(main['gap'].notna().sum())} of {len(main)} gaps estimable ({int(main['separated'].sum())} "
            "separated: a side where every or no image hits; their crude gap and Newcombe interval are in the _crude "
            f"table); {int(main['tost_equivalent'].sum())} rated equivalent to 0 by TOST; "
            f"{int((main['p_holm'] < 0.05).sum())} with Holm p < 0.05 in their family. Small synthetic subgroups give "
            "wide intervals: an interval that crosses the margin is *inconclusive*, not evidence of a gap.")
