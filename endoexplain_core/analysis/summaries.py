"""Summaries of audit tables: Table 4 panels, paired tests, sensitivity analyses (the adjusted
model of Table 5 is ``adjusted_model``), each a tidy frame from validated audit tables.

One denominator per panel: every method of a panel is scored on the same images, and a
constant map counts as a peak failure (``failure_matrix``), with the rate over maps with a peak
(``peak_failure_defined``, ``n_constant``) beside it. A high-score population is the images
with ``scaled_score >= score_threshold``. Method: docs/statistics_and_gate.md, "Table 4 and its
sensitivity tables".
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from endoexplain_core import presentation
from endoexplain_core.analysis import calibration, stats
from endoexplain_core.analysis.map_diagnostics import IDENTITY_GROUP_COLUMN
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS, RANDOM_DELETION
from endoexplain_core.methods import method_label

TABLE4_ROWS = CAM_METHODS + ("random", RANDOM_DELETION, "centre", "salience")
OUTCOMES = {"peak_failure": "peak_outside_mask", "iou": "iou",
            "energy_in_mask": "energy_in_mask", "logit_drop": "logit_drop"}
TERTILE_LABELS = ("small", "medium", "large")
RATE_OUTCOMES = ("peak_outside_mask", "iou_below_0_10")


def image_matrix(table: pd.DataFrame, column: str, methods, sample_ids) -> np.ndarray:
    """Values of ``column`` as float (n_images, n_methods), rows in ``sample_ids`` order.

    ``table`` holds one checkpoint on one dataset. Raises when a requested cell is missing.
    Values are the audit table's: a constant map's outcomes are those of a uniform map.
    """
    wide = table.pivot(index="sample_id", columns="method", values=column)
    missing = [m for m in methods if m not in wide.columns]
    if missing:
        raise ValueError(f"audit table has no rows for methods {missing}")
    return wide.reindex(index=list(sample_ids), columns=list(methods)).to_numpy(dtype=np.float64, copy=True)


def constant_matrix(table: pd.DataFrame, methods, sample_ids) -> np.ndarray:
    """bool (n_images, n_methods): the map is constant (no peak, no top set of its own)."""
    wide = table.pivot(index="sample_id", columns="method", values="constant_map")
    wide = wide.reindex(index=list(sample_ids), columns=list(methods))
    return wide.fillna(False).to_numpy(dtype=bool)


def failure_matrix(table: pd.DataFrame, methods, sample_ids) -> np.ndarray:
    """float 0/1 (n_images, n_methods): peak outside the lesion, a constant map counted as a
    failure (it has no peak inside the lesion; the paper's Eq. 2)."""
    failure = image_matrix(table, "peak_outside_mask", methods, sample_ids)
    return np.where(constant_matrix(table, methods, sample_ids), 1.0, failure)


def summarise_columns(matrix: np.ndarray, *, rate: bool, replicates: int | None = None,
                      seed: int | None = None) -> dict[str, np.ndarray]:
    """Per column of ``matrix`` (images x methods, same images): estimate, ci_low, ci_high,
    interval and n as (k,) arrays. ``rate``: the columns are 0/1 rates (Wilson interval, no
    resampling); otherwise means with the paired image bootstrap, which needs ``replicates``
    and ``seed`` (the profile's; ValueError without them)."""
    if not rate and (replicates is None or seed is None):
        raise ValueError("bootstrap means need the profile's replicates and seed")
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim == 1:
        matrix = matrix[:, None]
    result = (stats.rate_ci(matrix) if rate else
              stats.bootstrap_mean_ci(matrix, replicates=replicates, seed=seed))
    keys = ("estimate", "ci_low", "ci_high", "interval")
    return {k: np.atleast_1d(result[k]) for k in keys} | {"n": np.full(matrix.shape[1], matrix.shape[0])}


def constant_counts(table: pd.DataFrame, methods, sample_ids) -> np.ndarray:
    """int (n_methods,): constant maps per method among ``sample_ids``."""
    return constant_matrix(table, methods, sample_ids).sum(axis=0)


def failure_rate(rows: pd.DataFrame) -> float:
    """Peak-failure rate of ``rows`` (one method), a constant map counted as a failure (NaN
    when there are no rows)."""
    if not len(rows):
        return np.nan
    failure = rows["peak_outside_mask"].astype(bool) | rows["constant_map"].astype(bool)
    return float(failure.mean())


def defined_rate(rows: pd.DataFrame, column: str = "peak_outside_mask") -> float:
    """Mean of ``column`` over rows whose map is not constant (NaN when none): the
    defined-maps-only value reported beside the primary rate."""
    defined = rows.loc[~rows["constant_map"].astype(bool), column]
    return float(defined.astype(float).mean()) if len(defined) else np.nan


def high_score_ids(table: pd.DataFrame, score_threshold: float) -> list[str]:
    """Sorted sample ids whose scaled score under this table's checkpoint is >= threshold."""
    scores = table.groupby("sample_id")["scaled_score"].first()
    return sorted(scores.index[scores >= score_threshold])


def _single_checkpoint(table: pd.DataFrame) -> None:
    keys = table[["dataset", "checkpoint_id"]].drop_duplicates()
    if len(keys) != 1:
        raise ValueError(f"expected one dataset and checkpoint, got {keys.to_dict('records')}")


def panel_summary(table: pd.DataFrame, random_deletion: pd.DataFrame, sample_ids,
                  replicates: int, seed: int
                  ) -> pd.DataFrame:
    """One Table 4 panel: per map row, n and each outcome's mean with its 95% CI.

    Rows: the five CAMs, random heatmap, random deletion (logit drop only: the per-image mean of
    the exact-area draws), centre baseline and salience baseline. Outcomes that do not apply are NaN. An empty
    population gives n = 0 and NaN everywhere. Every row uses the same ``n`` images (module
    docstring): ``peak_failure`` counts a constant map as a failure (Wilson CI);
    ``peak_failure_defined`` is the rate over the ``n_defined`` maps with a peak and
    ``n_constant`` counts the others.
    """
    _single_checkpoint(table)
    sample_ids = sorted(sample_ids)
    result = pd.DataFrame({"method": TABLE4_ROWS, "label": [method_label(m) for m in TABLE4_ROWS],
                           "n": len(sample_ids)})
    constant = dict(zip(MAP_METHODS, constant_counts(table, MAP_METHODS, sample_ids)))
    result["n_constant"] = result["method"].map(constant).fillna(0).astype(int)
    result["n_defined"] = result["n"] - result["n_constant"]
    rows = table[table["sample_id"].isin(sample_ids)]
    defined = {m: defined_rate(rows[rows["method"] == m]) for m in MAP_METHODS}
    result["peak_failure_defined"] = result["method"].map(defined).astype(float)
    for outcome, column in OUTCOMES.items():
        methods = CAM_METHODS if outcome == "logit_drop" else MAP_METHODS
        if outcome == "peak_failure":
            matrix = failure_matrix(table, methods, sample_ids)
        else:
            matrix = image_matrix(table, column, methods, sample_ids)
        if outcome == "logit_drop":
            means = random_deletion.set_index("sample_id")["logit_drop_mean"]
            matrix = np.column_stack([matrix, means.reindex(sample_ids).to_numpy(float)])
            methods = CAM_METHODS + (RANDOM_DELETION,)
        summary = summarise_columns(matrix, rate=outcome == "peak_failure",
                                    replicates=replicates, seed=seed)
        for key, suffix in (("estimate", ""), ("ci_low", "_ci_low"), ("ci_high", "_ci_high")):
            values = dict(zip(methods, summary[key]))
            result[outcome + suffix] = result["method"].map(values).astype(float)
    return result


def spatial_audit_summary(table: pd.DataFrame, random_deletion: pd.DataFrame, score_threshold: float,
                          replicates: int, seed: int) -> pd.DataFrame:
    """The spatial audit's per-method summary (the paper's Table 4): panel A (scaled score >=
    ``score_threshold``) stacked on panel B (all images), ``panel_summary`` for each."""
    panels = []
    for panel, ids in (("A", high_score_ids(table, score_threshold)),
                       ("B", sorted(table["sample_id"].unique()))):
        frame = panel_summary(table, random_deletion, ids, replicates, seed)
        frame.insert(0, "panel", panel)
        panels.append(frame)
    result = pd.concat(panels, ignore_index=True)
    # Panel A is selected on the scaled score: a temperature stuck on its search bound makes
    # that selection arbitrary, so every row carries the flag.
    result["temperature_at_bound"] = temperature_at_bound(table)
    return result


def temperature_at_bound(table: pd.DataFrame) -> bool:
    """True when the case table's (one checkpoint's) fitted temperature sits on a search bound."""
    if "temperature" not in table.columns or table.empty:
        return False
    values = table["temperature"].dropna().unique()
    # T <= 0 is no fit (raw scores), as in the robustness rows
    return bool(any(float(v) > 0 and calibration.at_bound(float(v)) for v in values))


def temperature_statement(table: pd.DataFrame) -> str:
    """One sentence on the temperature behind a table's scaled scores (a warning at a bound)."""
    values = table["temperature"].dropna().unique() if "temperature" in table.columns else []
    values = [v for v in values if float(v) > 0]
    if not values:
        return "No fitted temperature recorded."
    text = ", ".join(f"{float(v):.3g}" for v in values)
    if temperature_at_bound(table):
        return (f"WARNING: the temperature (T = {text}) stopped on its search bound "
                f"{calibration.TEMPERATURE_BOUNDS}: the scaled scores, and so the high-score "
                "panel, rest on an unconstrained fit (docs/protocol.md, Calibration).")
    return f"Scaled scores use the validation-fitted temperature T = {text} (inside its search bounds)."


def format_spatial_audit_summary(table: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Table 4 as printed: panel, map label, n, each outcome as "estimate (CI)", and the
    identity group of a method whose maps are one piece of evidence with others ("Identical
    maps", when ``table`` carries ``map_diagnostics.mark_identity_groups``' column)."""
    shown = pd.DataFrame({"Panel": table["panel"], "Map": table["label"], "n": table["n"]})
    for outcome, title in (("peak_failure", "Peak failure"), ("iou", "Top-20% IoU"),
                           ("energy_in_mask", "Energy in mask"), ("logit_drop", "Logit drop")):
        shown[title] = [presentation.estimate_with_ci(e, lo, hi, digits, missing="\u2013") for e, lo, hi in
                        zip(table[outcome], table[outcome + "_ci_low"], table[outcome + "_ci_high"])]
    if "temperature_at_bound" in table.columns and table["temperature_at_bound"].any():
        shown["Panel"] = shown["Panel"].astype(str) + " (T at bound)"
    if "n_constant" in table.columns:  # constant maps count as failures; the rest shown beside
        shown["Constant maps"] = table["n_constant"].to_numpy()
        shown["Peak failure, maps with a peak"] = [
            "\u2013" if v != v else f"{v:.{digits}f}" for v in table["peak_failure_defined"]]
    if IDENTITY_GROUP_COLUMN in table.columns:  # map_diagnostics.mark_identity_groups
        shown["Identical maps"] = table[IDENTITY_GROUP_COLUMN].fillna("").to_numpy()
    return shown.reset_index(drop=True)


def paired_tests(table: pd.DataFrame, sample_ids, identical_groups=(), *,
                 replicates: int, seed: int) -> pd.DataFrame:
    """All pairs of CAMs on the same images: failure and IoU differences, tests, Holm p.

    A pair is compared on the images where both maps have a peak (``n``; the others are
    counted in ``n_constant_excluded``).
    Failure: difference of rates (first - second) with bootstrap CI and the exact binomial
    test on discordant images. IoU: mean difference with bootstrap CI and the paired Wilcoxon
    test. Holm adjustment is applied within each outcome over the ten pairs.
    ``identical_groups``: tuples of methods identical by construction at this layer
    (``models.identical_methods``); such pairs are flagged, not presented as evidence.
    """
    sample_ids = sorted(sample_ids)
    failure = image_matrix(table, "peak_outside_mask", CAM_METHODS, sample_ids)
    iou = image_matrix(table, "iou", CAM_METHODS, sample_ids)
    has_peak = ~constant_matrix(table, CAM_METHODS, sample_ids)
    rows = []
    for i, j in combinations(range(len(CAM_METHODS)), 2):
        first, second = CAM_METHODS[i], CAM_METHODS[j]
        same = any(first in group and second in group for group in identical_groups)
        both = has_peak[:, i] & has_peak[:, j]
        row = {"first": first, "second": second, "n": int(both.sum()),
               "n_constant_excluded": len(sample_ids) - int(both.sum()),
               "identical_by_construction": same}
        if both.any():
            fi, fj, ii, ij = failure[both, i], failure[both, j], iou[both, i], iou[both, j]
            fail_diff = stats.newcombe_paired_interval(fi > 0, fj > 0)   # agrees with McNemar beside it
            binomial = stats.exact_paired_binomial(fi > 0, fj > 0)
            iou_diff = stats.paired_difference_ci(ii, ij, replicates, seed)
            wilcoxon = stats.paired_wilcoxon(ii, ij)
            row.update({"failure_difference": fail_diff["estimate"],
                        "failure_difference_ci_low": fail_diff["ci_low"],
                        "failure_difference_ci_high": fail_diff["ci_high"],
                        "discordant_first_only": binomial["first_only"],
                        "discordant_second_only": binomial["second_only"],
                        "failure_p": binomial["p_value"],
                        "iou_difference": iou_diff["estimate"],
                        "iou_difference_ci_low": iou_diff["ci_low"],
                        "iou_difference_ci_high": iou_diff["ci_high"],
                        "iou_p": wilcoxon["p_value"]})
        rows.append(row)
    result = pd.DataFrame(rows)
    result.insert(2, "pair", [f"{method_label(a)} vs {method_label(b)}"
                              for a, b in zip(result["first"], result["second"])])
    if "failure_p" in result.columns:
        # A pair with no image where both maps have a peak has no test: not in the family.
        result["failure_p_holm"] = stats.holm_adjust_defined(result["failure_p"].to_numpy())
        result["iou_p_holm"] = stats.holm_adjust_defined(result["iou_p"].to_numpy())
    return result


def audit_panels(table: pd.DataFrame, score_threshold: float) -> dict[str, list[str]]:
    """Table 4's panels as sample ids: A = scaled score >= ``score_threshold``, B = every image."""
    return {"A": high_score_ids(table, score_threshold), "B": sorted(table["sample_id"].unique())}


def paired_tests_by_panel(table: pd.DataFrame, panels: dict[str, list[str]], identical_groups=(), *,
                          replicates: int, seed: int) -> pd.DataFrame:
    """``paired_tests`` on each non-empty panel, stacked with a ``panel`` column (Holm within
    each outcome and panel)."""
    parts = [paired_tests(table, ids, identical_groups, replicates=replicates, seed=seed).assign(panel=panel)
             for panel, ids in panels.items() if ids]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def describe_paired_tests(paired: pd.DataFrame, panels: dict[str, list[str]]) -> str:
    """Which panels were tested, on how many images."""
    tested = sorted(paired["panel"].unique()) if "panel" in paired else []
    return (f"Paired tests on panels {tested} (n = {', '.join(str(len(panels[p])) for p in tested)}); "
            "p-values Holm-adjusted within each outcome and panel.")


def tie_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per method: maps, constant maps, maps with a tied maximum, maps with a tied boundary.

    ``max_multiplicity`` > 1: several pixels share the maximum (the peak is the first in
    row-major order). ``boundary_ties`` > 1: several pixels share the value of the last kept
    pixel, so the fixed tie-break permutation may decide which of them are kept.
    """
    grouped = table.groupby("method", sort=False)
    result = pd.DataFrame({
        "maps": grouped.size(),
        "constant_maps": grouped["constant_map"].sum().astype(int),
        "tied_maximum": grouped["max_multiplicity"].apply(lambda v: int((v > 1).sum())),
        "boundary_ties": grouped["boundary_ties"].apply(lambda v: int((v > 1).sum())),
    }).reindex(list(MAP_METHODS)).reset_index()
    result.insert(1, "label", result["method"].map(method_label))
    return result


def identical_statement(identical_groups, arch: str, layer_name: str) -> str:
    """A sentence saying which CAMs coincide by construction at ``layer_name`` (or none)."""
    if not identical_groups:
        return (f"At {arch} layer {layer_name} no two CAM methods are identical by construction; "
                "differences between them are empirical.")
    groups = "; ".join(" = ".join(method_label(m) for m in group) for group in identical_groups)
    return (f"At {arch} layer {layer_name} these CAMs are identical by construction (the layer "
            f"feeds global average pooling, so the gradient is spatially constant): {groups}. "
            "They are one piece of evidence, not several.")


def failure_by_threshold(table: pd.DataFrame, thresholds) -> pd.DataFrame:
    """Failure rate per map method at each scaled-score threshold, with eligible counts.

    Columns: score_threshold, method, n_eligible, n_constant (constant maps among them, counted as
    failures), failure_rate, ci_low, ci_high (Wilson; NaN when no image is eligible). Methods:
    the five CAMs and the two spatial baselines.
    """
    _single_checkpoint(table)
    rows = []
    for score_threshold in thresholds:
        ids = high_score_ids(table, score_threshold)
        summary = summarise_columns(failure_matrix(table, MAP_METHODS, ids), rate=True)
        constant = constant_counts(table, MAP_METHODS, ids)
        for k, method in enumerate(MAP_METHODS):
            rows.append({"score_threshold": float(score_threshold), "method": method,
                         "n_eligible": len(ids), "n_constant": int(constant[k]),
                         "failure_rate": float(summary["estimate"][k]),
                         "ci_low": float(summary["ci_low"][k]),
                         "ci_high": float(summary["ci_high"][k])})
    return pd.DataFrame(rows)


def checkpoint_robustness(tables: pd.DataFrame, random_deletion: pd.DataFrame,
                          primary_id: str, score_threshold: float,
                          identical_by_arch: dict | None = None) -> pd.DataFrame:
    """Per checkpoint and map method: failure on its own and on the primary's high-score set.

    ``tables``: audit rows of several checkpoints on one dataset; ``random_deletion``: their
    per-image random-deletion rows. Columns: checkpoint_id, arch, seed, control, method,
    n_own, n_constant_own, failure_own, n_fixed, n_constant_fixed, failure_fixed (a constant
    map counts as a failure), logit_drop_all (CAMs: mean over all images),
    random_deletion_mean (the checkpoint's mean random-deletion logit drop over all images),
    temperature and temperature_at_bound (the fit stopped on a search bound, so this
    checkpoint's scaled scores, and with them its own high-score subset, are set by the bound),
    identical_with (the other CAMs this method equals by construction at the checkpoint's
    target layer, from ``identical_by_arch``: arch -> groups; empty when none or not given).
    """
    primary = tables[tables["checkpoint_id"] == primary_id]
    if primary.empty:
        raise ValueError(f"primary checkpoint {primary_id} has no audit rows")
    fixed_ids = set(high_score_ids(primary, score_threshold))
    rows = []
    for checkpoint_id, table in tables.groupby("checkpoint_id", sort=True):
        own_ids = set(high_score_ids(table, score_threshold))
        drops = random_deletion.loc[random_deletion["checkpoint_id"] == checkpoint_id,
                                    "logit_drop_mean"]
        first = table.iloc[0]
        for method, rows_of_method in table.groupby("method", sort=False):
            own = rows_of_method[rows_of_method["sample_id"].isin(own_ids)]
            fixed = rows_of_method[rows_of_method["sample_id"].isin(fixed_ids)]
            rows.append({"checkpoint_id": checkpoint_id, "arch": first["arch"],
                         "seed": int(first["seed"]), "control": first["control"],
                         "method": method, "n_own": len(own),
                         "n_constant_own": int(own["constant_map"].sum()),
                         "failure_own": failure_rate(own),
                         "n_fixed": len(fixed), "n_constant_fixed": int(fixed["constant_map"].sum()),
                         "failure_fixed": failure_rate(fixed),
                         "logit_drop_all": float(rows_of_method["logit_drop"].mean()),
                         "random_deletion_mean": float(drops.mean()) if len(drops) else np.nan,
                         "temperature": float(first["temperature"]),
                         "temperature_at_bound": (float(first["temperature"]) > 0
                                                  and calibration.at_bound(float(first["temperature"]))),
                         "identical_with": identical_with_text(method, (identical_by_arch or {}).get(first["arch"], ()))})
    return pd.DataFrame(rows)


def identical_with_text(method: str, groups) -> str:
    """The other methods of ``method``'s identical-by-construction group, joined by " = "."""
    for group in groups:
        if method in group:
            return " = ".join(method_label(m) for m in group if m != method)
    return ""


def lesion_tertiles(table: pd.DataFrame) -> pd.DataFrame:
    """Failure per map method within lesion-area tertiles of this table's images.

    Tertiles are dataset-specific: images are ranked by lesion area (ties by sample id) and cut
    into three near-equal groups, small / medium / large. Columns: tertile, area_min, area_max,
    method, n, n_constant, failure_rate (a constant map counts as a failure), ci_low, ci_high
    (Wilson).
    """
    _single_checkpoint(table)
    areas = table.groupby("sample_id")["lesion_area_fraction"].first()
    ranked = areas.reset_index().sort_values(["lesion_area_fraction", "sample_id"])
    ranked["tertile"] = pd.qcut(np.arange(len(ranked)), 3, labels=list(TERTILE_LABELS))
    rows = []
    for tertile, members in ranked.groupby("tertile", observed=False, sort=False):
        ids = sorted(members["sample_id"])
        summary = summarise_columns(failure_matrix(table, MAP_METHODS, ids), rate=True)
        constant = constant_counts(table, MAP_METHODS, ids)
        for k, method in enumerate(MAP_METHODS):
            rows.append({"tertile": tertile, "area_min": members["lesion_area_fraction"].min(),
                         "area_max": members["lesion_area_fraction"].max(), "method": method,
                         "n": len(ids), "n_constant": int(constant[k]),
                         "failure_rate": float(summary["estimate"][k]),
                         "ci_low": float(summary["ci_low"][k]),
                         "ci_high": float(summary["ci_high"][k])})
    return pd.DataFrame(rows)


def lesion_area_cut_points(table: pd.DataFrame) -> tuple[float, float]:
    """Tertile cut-points of lesion area over the whole audit pool of this table.

    Images are ranked by lesion area (ties by sample id) and cut into three near-equal groups
    as in ``lesion_tertiles``; the cut-points are the largest areas of the small and medium
    groups. An image is small when area <= first, medium when <= second, large otherwise.
    """
    _single_checkpoint(table)
    areas = table.groupby("sample_id")["lesion_area_fraction"].first()
    ranked = areas.reset_index().sort_values(["lesion_area_fraction", "sample_id"])
    groups = pd.qcut(np.arange(len(ranked)), 3, labels=list(TERTILE_LABELS))
    ranked["tertile"] = np.asarray(groups)
    by_group = ranked.groupby("tertile", observed=False)["lesion_area_fraction"].max()
    return float(by_group["small"]), float(by_group["medium"])


def lesion_strata_high_score(table: pd.DataFrame, score_threshold: float) -> pd.DataFrame:
    """Failure per map method by lesion-size stratum within the high-score subset.

    The protocol's definition: strata cut at the tertile cut-points of the *full* masked pool
    (``lesion_area_cut_points``), applied to the images with scaled score >= threshold, so
    strata within the subset need not be equal in size. Columns: population, stratum,
    area_cut_low, area_cut_high, method, n, failures (a constant map counts as one),
    failure_rate, ci_low, ci_high (Wilson), interval.
    A stratum without images has n = 0 and NaN rates.
    """
    first, second = lesion_area_cut_points(table)
    ids = high_score_ids(table, score_threshold)
    areas = table.groupby("sample_id")["lesion_area_fraction"].first()
    bounds = {"small": (-np.inf, first), "medium": (first, second), "large": (second, np.inf)}
    rows = []
    for stratum, (low, high) in bounds.items():
        members = sorted(s for s in ids if low < areas[s] <= high)
        matrix = failure_matrix(table, MAP_METHODS, members)
        summary = summarise_columns(matrix, rate=True)
        for k, method in enumerate(MAP_METHODS):
            rows.append({"population": f"scaled score >= {score_threshold:.2f}",
                         "stratum": stratum, "area_cut_low": low, "area_cut_high": high,
                         "method": method, "n": len(members),
                         "failures": int(matrix[:, k].sum()),
                         "failure_rate": float(summary["estimate"][k]),
                         "ci_low": float(summary["ci_low"][k]),
                         "ci_high": float(summary["ci_high"][k]),
                         "interval": str(summary["interval"][k])})
    return pd.DataFrame(rows)


SECONDARY_OUTCOMES = {"iou_below_0_10": "Top-20% IoU < 0.10 (rate)",
                      "centre_of_mass_distance": "Centre-of-mass distance",
                      "score_drop": "Scaled-score drop after top-20% deletion"}


def secondary_outcomes(table: pd.DataFrame, score_threshold: float,
                       replicates: int,
                       seed: int) -> pd.DataFrame:
    """The protocol's secondary outcomes per map method, high-score subset and all images.

    IoU < 0.10 (rate), centre-of-mass distance (the audit's normalised distance between the
    map's centre of mass and the lesion's) and the temperature-scaled score drop after the
    top-20% deletion (CAMs only; NaN for baselines). The rate takes the Wilson interval, the
    means image-bootstrap CIs with the images of a panel shared by every method. Columns: panel, population, outcome, label, method, n,
    estimate, ci_low, ci_high, interval.
    """
    _single_checkpoint(table)
    populations = (("A", f"scaled score >= {score_threshold:.2f}", high_score_ids(table, score_threshold)),
                   ("B", "all masked images", sorted(table["sample_id"].unique())))
    rows = []
    for panel, population, ids in populations:
        for outcome, label in SECONDARY_OUTCOMES.items():
            methods = CAM_METHODS if outcome == "score_drop" else MAP_METHODS
            matrix = image_matrix(table, outcome, methods, ids)
            summary = summarise_columns(matrix, rate=outcome in RATE_OUTCOMES,
                                        replicates=replicates, seed=seed)
            for k, method in enumerate(methods):
                rows.append({"panel": panel, "population": population, "outcome": outcome,
                             "label": label, "method": method, "n": len(ids),
                             "estimate": float(summary["estimate"][k]),
                             "ci_low": float(summary["ci_low"][k]),
                             "ci_high": float(summary["ci_high"][k]),
                             "interval": str(summary["interval"][k])})
    return pd.DataFrame(rows)


def checkpoint_failure_ranges(robustness: pd.DataFrame, identical_by_arch: dict | None = None,
                              non_learning: set | frozenset = frozenset()) -> pd.DataFrame:
    """Per CAM method: minimum and maximum failure rate across checkpoints (the paper's ranges).

    ``robustness``: ``checkpoint_robustness`` output; controls are left out. Both subsets:
    each checkpoint's own high-score subset and the primary's fixed subset. A checkpoint
    with no eligible image does not enter its range (counted in ``n_checkpoints``).
    ``identical_by_arch``: arch -> groups of methods identical by construction at that
    architecture's target layer (``networks.identical_methods``); ``non_learning``:
    checkpoint ids that learned nothing (their rows enter the range and are named).
    Columns: subset, method, n_checkpoints, min, min_checkpoint, max, max_checkpoint,
    identical_by_construction_in (architectures where this method equals another CAM),
    non_learning_checkpoints, temperature_at_bound_checkpoints.
    """
    matrix = robustness[(robustness["control"] == "none") & robustness["method"].isin(CAM_METHODS)]
    identical_by_arch = identical_by_arch or {}
    rows = []
    for subset, column in (("own high-score subset", "failure_own"),
                           ("primary's fixed subset", "failure_fixed")):
        for method in CAM_METHODS:
            part = matrix[(matrix["method"] == method) & matrix[column].notna()]
            identical_in = sorted(arch for arch, groups in identical_by_arch.items()
                                  if any(method in group for group in groups))
            at_bound = (sorted(part.loc[part["temperature_at_bound"], "checkpoint_id"])
                        if "temperature_at_bound" in part else [])
            row = {"subset": subset, "method": method, "n_checkpoints": len(part),
                   "min": np.nan, "min_checkpoint": "", "max": np.nan, "max_checkpoint": "",
                   "identical_by_construction_in": ", ".join(identical_in),
                   "non_learning_checkpoints": ", ".join(sorted(set(part["checkpoint_id"]) & set(non_learning))),
                   "temperature_at_bound_checkpoints": ", ".join(at_bound)}
            if len(part):
                low, high = part.loc[part[column].idxmin()], part.loc[part[column].idxmax()]
                row.update({"min": float(low[column]), "min_checkpoint": low["checkpoint_id"],
                            "max": float(high[column]), "max_checkpoint": high["checkpoint_id"]})
            rows.append(row)
    return pd.DataFrame(rows)


def deletion_all_images(robustness: pd.DataFrame, identical_by_arch: dict) -> pd.DataFrame:
    """Per checkpoint: each CAM's mean logit drop over all audit images, the checkpoint's
    random-deletion mean, its identical-by-construction groups and whether its temperature sits
    at a search bound. ``robustness``: ``checkpoint_robustness`` rows."""
    by_checkpoint = robustness.groupby("checkpoint_id")
    table = robustness[robustness["method"].isin(CAM_METHODS)].pivot(
        index="checkpoint_id", columns="method", values="logit_drop_all")
    table["random_deletion"] = by_checkpoint["random_deletion_mean"].first()
    table["identical_by_construction"] = by_checkpoint["arch"].first().map(
        lambda arch: "; ".join(" = ".join(group) for group in identical_by_arch.get(arch, [])))
    table["temperature_at_bound"] = by_checkpoint["temperature_at_bound"].first()
    return table


# --- what notebook 05 says beside its tables ---------------------------------------------------

def describe_threshold_sensitivity(sensitivity: pd.DataFrame) -> str:
    """Eligible images at each threshold of ``failure_by_threshold``."""
    counts = sensitivity.groupby("score_threshold")["n_eligible"].first()
    return "Eligible images per threshold: " + ", ".join(f"{t:.2f}: {n}" for t, n in counts.items()) + "."


def describe_checkpoint_robustness(robustness: pd.DataFrame, not_learned, *, learning_rule: str,
                                   audit_unlearned: bool) -> str:
    """The subsets behind ``checkpoint_robustness`` and the checkpoints that did not learn."""
    own = robustness.groupby("checkpoint_id")["n_own"].first()
    return (f"Own high-score subsets: {own.min()}-{own.max()} images; fixed subset: "
            f"{robustness['n_fixed'].iloc[0]} images. Checkpoints that did not learn ({learning_rule}): "
            f"{', '.join(not_learned) or 'none'} "
            + ("(not audited: audit_unlearned = False)." if not audit_unlearned else
               "(flagged learned = False; excluded from the ranges, Figure 4 and Table 5 below)."))


def describe_failure_ranges(robustness: pd.DataFrame, identical_by_arch: dict, not_learned) -> str:
    """What shapes ``checkpoint_failure_ranges``: identical methods, temperatures at a bound,
    checkpoints left out."""
    at_bound = sorted(robustness.loc[robustness["temperature_at_bound"], "checkpoint_id"].unique())
    identical = "; ".join(f"{arch}: " + ", ".join(" = ".join(group) for group in groups)
                          for arch, groups in identical_by_arch.items() if groups)
    return (f"Identical by construction: {identical or 'none'}. Temperature at a search bound: "
            f"{', '.join(at_bound) or 'none'}. Excluded from the ranges (did not learn): "
            f"{', '.join(not_learned) or 'none'}.")


def describe_lesion_strata(strata: pd.DataFrame, tertiles: pd.DataFrame, score_threshold: float) -> str:
    """Images per stratum (``lesion_strata_high_score``) and per tertile (``lesion_tertiles``)."""
    strata_sizes = strata.groupby("stratum", sort=False)["n"].first()
    tertile_sizes = tertiles.groupby("tertile", observed=True)["n"].first()
    return (f"High-score images (scaled score ≥ {score_threshold}) per stratum (cut-points from all audit "
            "images): " + ", ".join(f"{s}: {n}" for s, n in strata_sizes.items()) + ". Images per tertile: "
            + ", ".join(f"{t}: {n}" for t, n in tertile_sizes.items()) + ".")


def describe_secondary_outcomes(secondary: pd.DataFrame) -> str:
    """The panels' sizes behind ``secondary_outcomes``."""
    n_by_panel = secondary.groupby("panel")["n"].first()
    return f"Secondary outcomes on {n_by_panel.get('A')} high-score and {n_by_panel.get('B')} audit images."
