"""The adjusted failure model (Table 5): which CAM, lesion and score terms go with a peak
outside the lesion among the high-score images, as odds ratios (``adjusted_table``: every term
with a status line). A constant map counts as a failure. Method: docs/statistics_and_gate.md,
"Adjusted failure model (Table 5)".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from endoexplain_core import marks
from endoexplain_core.analysis import stats, summaries
from endoexplain_core.methods import CAM_METHODS


TERMS = {
    "gradcampp": "Grad-CAM++ versus Grad-CAM",
    "xgradcam": "XGrad-CAM versus Grad-CAM",
    "hirescam": "HiResCAM versus Grad-CAM",
    "eigencam": "Eigen-CAM* versus Grad-CAM",
    "lesion_area_per_0_10": "Lesion area per 0.10 frame fraction",
    "centre_distance_per_0_10": "Lesion-centre distance per 0.10",
    "score_per_0_10": "Scaled score per 0.10",
}


def model_frame(table: pd.DataFrame, score_threshold: float) -> pd.DataFrame:
    """Rows of the adjusted failure model: the five CAMs on the high-score images.

    Columns: sample_id, method, failure (0/1; a constant map counts as a failure), intercept, one indicator per non-reference CAM
    (Grad-CAM is the reference), lesion area, centre distance and scaled score per 0.10.
    """
    summaries._single_checkpoint(table)
    ids = set(summaries.high_score_ids(table, score_threshold))
    rows = table[table["sample_id"].isin(ids) & table["method"].isin(CAM_METHODS)]
    rows = rows.sort_values(["sample_id", "method"]).reset_index(drop=True)
    # one denominator (module docstring): a constant map has no peak inside the lesion
    failure = rows["peak_outside_mask"].astype(bool) | rows["constant_map"].astype(bool)
    frame = pd.DataFrame({"sample_id": rows["sample_id"], "method": rows["method"],
                          "failure": failure.astype(float),
                          "intercept": 1.0})
    for method in CAM_METHODS[1:]:
        frame[method] = (rows["method"] == method).astype(float)
    frame["lesion_area_per_0_10"] = rows["lesion_area_fraction"] / 0.10
    frame["centre_distance_per_0_10"] = rows["lesion_centre_distance"] / 0.10
    frame["score_per_0_10"] = rows["scaled_score"] / 0.10
    return frame


SEPARATION_NOTE = "not estimable ({k}/{n} failed; quasi-complete separation)"
ODDS_RATIO_DISPLAY_LIMIT = 1000.0


def _method_terms() -> tuple[str, ...]:
    return tuple(CAM_METHODS[1:])


def detect_separation(frame: pd.DataFrame) -> dict:
    """Terms of the adjusted model whose maximum-likelihood estimate is infinite.

    Detection by linear programming (``stats.separation_directions``), repeated after each
    removal: a separated CAM indicator (e.g. a method that fails on every high-score image)
    is removed together with its rows, which leaves exactly the likelihood of the other
    terms; the check is then run again on what remains. Returns ``{"separated": {term: note},
    "rows": boolean mask of the rows kept, "terms": the design columns kept (intercept first),
    "unresolved": [terms still separated that are not CAM indicators]}``.
    """
    keep = np.ones(len(frame), dtype=bool)
    terms = ["intercept", *TERMS]
    separated: dict[str, str] = {}
    while True:
        design = frame.loc[keep, terms].to_numpy(dtype=float)
        outcome = frame.loc[keep, "failure"].to_numpy(dtype=float)
        directions = stats.separation_directions(design, outcome)
        flagged = [t for t, d in zip(terms, directions) if d != 0]
        indicators = [t for t in flagged if t in _method_terms()]
        if not indicators:
            return {"separated": separated, "rows": keep, "terms": terms,
                    "unresolved": [t for t in flagged]}
        for term in indicators:
            rows = keep & (frame["method"] == term).to_numpy()
            failed = int(frame.loc[rows, "failure"].sum())
            separated[term] = SEPARATION_NOTE.format(k=failed, n=int(rows.sum()))
            keep = keep & ~rows
            terms.remove(term)


IDENTICAL_NOTE = "the same outcome as Grad-CAM on all {n} images: odds ratio 1 by construction"


def _same_outcomes_as_reference(frame: pd.DataFrame) -> dict[str, int]:
    """CAM term -> number of images, for the CAMs whose failure equals Grad-CAM's (the
    reference) on every image of ``frame`` (``model_frame`` rows)."""
    outcomes = frame.pivot(index="sample_id", columns="method", values="failure")
    reference = CAM_METHODS[0]
    if reference not in outcomes:
        return {}
    return {method: len(outcomes) for method in _method_terms()
            if method in outcomes and outcomes[method].equals(outcomes[reference])}


def odds_ratios(frame: pd.DataFrame, replicates: int,
           seed: int, penalty: float = stats.RIDGE_PENALTY) -> pd.DataFrame:
    """Odds ratios of the adjusted model with image-cluster bootstrap CIs (Table 5).

    ``frame``: ``model_frame`` output. Separation is detected first
    (``detect_separation``): a separated CAM term is reported with NaN odds ratio,
    ``estimable`` False and ``note`` "not estimable (k/n failed; quasi-complete
    separation)", and its rows are left out of the fit of the other terms. Columns: term,
    odds_ratio, ci_low, ci_high, estimable, note, separated_replicates (bootstrap replicates
    in which the term was separated; those count as an infinite estimate, so a CI bound they
    reach is 0 or inf). Raises when there are no rows, when the outcome is constant, or when
    a term other than a CAM indicator is separated.
    """
    if frame.empty:
        raise ValueError("no high-score images: the adjusted model cannot be fitted")
    if frame["failure"].nunique() < 2:
        raise ValueError("peak failure is constant among the high-score CAM rows: the adjusted "
                         "model is not identifiable")
    found = detect_separation(frame)
    if found["unresolved"]:
        raise ValueError(f"terms {found['unresolved']} are separated and cannot be removed by "
                         "dropping a method: the adjusted model is not identifiable")
    kept = frame.loc[found["rows"]]
    result = stats.cluster_bootstrap_odds_ratios(
        kept[found["terms"]].to_numpy(), kept["failure"].to_numpy(), kept["sample_id"].to_numpy(),
        found["terms"], replicates=replicates, seed=seed, penalty=penalty)
    fitted = {t: (o, lo, hi, int(k)) for t, o, lo, hi, k in zip(
        result["term"], result["odds_ratio"], result["ci_low"], result["ci_high"],
        result["separated_replicates"])}
    identical = _same_outcomes_as_reference(kept)
    rows = []
    for term, label in TERMS.items():
        if term in identical:
            # Every image (so every bootstrap replicate) gives both maps the same outcome: the
            # maximum-likelihood OR is exactly 1. The ridge fit lands a few 1e-4 off it (the
            # penalty's pull), which a sign would read as a verdict.
            rows.append({"term": label, "odds_ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0,
                         "estimable": True, "note": IDENTICAL_NOTE.format(n=identical[term]),
                         "separated_replicates": 0})
        elif term in fitted:
            odds_ratio, low, high, k = fitted[term]
            rows.append({"term": label, "odds_ratio": odds_ratio, "ci_low": low, "ci_high": high,
                         "estimable": True, "note": "", "separated_replicates": k})
        else:
            rows.append({"term": label, "odds_ratio": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                         "estimable": False, "note": found["separated"][term],
                         "separated_replicates": replicates})
    return pd.DataFrame(rows)


def adjusted_table(frame: pd.DataFrame, replicates: int,
                         seed: int) -> tuple[pd.DataFrame, str]:
    """Table 5 and a one-line status; always a table, so later stages can rely on it.

    When the model is not identifiable (no high-score image, a constant failure outcome, a
    separated covariate or a rank-deficient design) the table lists the terms with NaN odds
    ratios and the status says why. The status also names separated (not estimable) terms.
    """
    n_images = frame["sample_id"].nunique()
    reason = None
    if n_images == 0:
        reason = "no image reached the score threshold"
    elif frame["failure"].nunique() < 2:
        reason = f"peak failure is constant over the {n_images} high-score images"
    else:
        try:
            table = odds_ratios(frame, replicates=replicates, seed=seed)
        except ValueError as error:
            reason = str(error)
    if reason is None:
        dropped = table.loc[~table["estimable"], "term"].tolist()
        status = (f"fitted on {n_images} high-score images x {len(CAM_METHODS)} CAMs, "
                  f"{replicates} image-cluster bootstrap replicates")
        if dropped:
            status += ("; not estimable (quasi-complete separation, rows left out of the fit): "
                       + ", ".join(dropped))
        return table, status
    empty = pd.DataFrame({"term": list(TERMS.values()), "odds_ratio": np.nan,
                          "ci_low": np.nan, "ci_high": np.nan, "estimable": False,
                          "note": "model not fitted", "separated_replicates": 0})
    return empty, f"NOT fitted: {reason}, so the model is not identifiable in this run"


def format_odds_ratio(value: float, digits: int = 3) -> str:
    """An odds ratio for print: beyond 1/1,000 .. 1,000 it is shown as a bound, never a number
    (such values come from separation or near-separation, not from the data)."""
    if np.isnan(value):
        return ""
    if value > ODDS_RATIO_DISPLAY_LIMIT:
        return f">{ODDS_RATIO_DISPLAY_LIMIT:,.0f}"
    if value < 1.0 / ODDS_RATIO_DISPLAY_LIMIT:
        return f"<{1.0 / ODDS_RATIO_DISPLAY_LIMIT:.3f}"
    return f"{value:.{digits}f}"


UNBOUNDED_NOTE = "not estimable (bootstrap interval unbounded: {k} replicates separated)"


def interval_unbounded(ci_low, ci_high) -> bool:
    """True when a percentile bound of the image-cluster bootstrap is 0 or infinity: more than
    (1 - level) / 2 of the replicates separate the term in that direction (their estimates are
    infinite), so the data do not bound the odds ratio on that side. Such a term is printed as
    not estimable, never as a number beside a bound of 0 or infinity."""
    return bool(ci_low <= 0.0 or not np.isfinite(ci_high))


def odds_ratio_cell(odds_ratio, low, high, digits: int = 3) -> str:
    """ "1.699 (0.734 to 60.099)", values beyond 1/1,000..1,000 shown as bounds."""
    return (f"{format_odds_ratio(odds_ratio, digits)} ({format_odds_ratio(low, digits)} to "
            f"{format_odds_ratio(high, digits)})")


def format_table(table: pd.DataFrame, digits: int = 3, firth: pd.DataFrame | None = None
                  ) -> pd.DataFrame:
    """Table 5 as printed: term and "odds ratio (low to high)", or why it is not estimable
    (separated in the data, or an interval the bootstrap leaves unbounded,
    ``interval_unbounded``). ``firth``: ``firth_odds_ratios`` output, shown beside it in a second
    column (its intervals treat rows as independent, so they are narrower)."""
    cells = []
    for row in table.itertuples():
        if not row.estimable or (isinstance(row.note, str) and row.note):   # why, or Grad-CAM's twin
            cells.append(row.note)
        elif interval_unbounded(row.ci_low, row.ci_high):
            cells.append(UNBOUNDED_NOTE.format(k=int(row.separated_replicates)))
        else:
            cells.append(odds_ratio_cell(row.odds_ratio, row.ci_low, row.ci_high, digits))
    shown = pd.DataFrame({"Term": table["term"], "Odds ratio (95% CI)": cells})
    if firth is not None:
        shown["Firth odds ratio (95% profile CI)"] = format_firth(firth, digits)[
            "Firth odds ratio (95% profile CI)"].to_numpy()
    return shown


def format_firth(firth: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """``firth_odds_ratios`` as printed: term, "odds ratio (low to high)" or why it was not fitted,
    and whether the ordinary MLE of the term is infinite."""
    cells = [odds_ratio_cell(o, lo, hi, digits) if pd.notna(o) else status for o, lo, hi, status
             in zip(firth["odds_ratio"], firth["ci_low"], firth["ci_high"], firth["interval"])]
    return pd.DataFrame({"Term": firth["term"], "Firth odds ratio (95% profile CI)": cells,
                         "Separated in the MLE": firth["separated_in_mle"]})


def heading(frame: pd.DataFrame) -> str:
    """What Table 5 models, for its caption: outcome, n and reference category (an empty
    ``frame``: that the table is empty)."""
    if frame.empty:
        return "No high-score image: Table 5 is empty."
    n_images, n_rows = frame["sample_id"].nunique(), len(frame)
    text = (f"Outcome: the CAM's peak lies outside the lesion (a constant map counts as a "
            f"failure); n = {n_images} high-score images x {len(CAM_METHODS)} CAMs = {n_rows} "
            "rows, clustered by image; reference: Grad-CAM; slopes per 0.10 of lesion area "
            "(frame fraction), lesion-centre distance and scaled score.")
    # A slope per 0.10 of a variable that spans less than 0.10 (high scores crowd near 1) is
    # an extrapolation: an odds ratio in the thousands then says so, not that the effect is huge.
    ranges = {name: (frame[column].min() * 0.10, frame[column].max() * 0.10) for name, column in
              (("lesion area", "lesion_area_per_0_10"), ("lesion-centre distance", "centre_distance_per_0_10"),
               ("scaled score", "score_per_0_10")) if column in frame}
    if not ranges:
        return text
    text += " Observed: " + ", ".join(f"{name} {low:.3f} to {high:.3f}" for name, (low, high) in ranges.items()) + "."
    narrow = [name for name, (low, high) in ranges.items() if high - low < 0.10]
    if narrow:
        text += (f" {', '.join(narrow).capitalize()} span{'s' if len(narrow) == 1 else ''} less than 0.10 "
                 "here, so an odds ratio per 0.10 extrapolates beyond the data.")
    return text


def footnote(table: pd.DataFrame, replicates: int, temperature_note: str = "") -> str:
    """The footnote of Table 5: method, separated terms, replicates that hit a bound and (when
    given, e.g. ``temperature_statement``) the temperature behind the score terms."""
    parts = [temperature_note] if temperature_note else []
    parts += ["Odds ratios of a logistic model of peak failure (Grad-CAM reference; ridge "
             f"penalty {stats.RIDGE_PENALTY:g} on slopes); 95% percentile intervals over "
             f"{replicates} image-cluster bootstrap replicates."]
    dropped = table.loc[~table["estimable"] & (table["note"] != "model not fitted")]
    if len(dropped):
        parts.append("Not estimable: " + "; ".join(f"{t}: {n}" for t, n in
                                                    zip(dropped["term"], dropped["note"]))
                     + ". The maximum-likelihood odds ratio is infinite (detected by linear "
                     "programming), so no number is reported; those rows were left out of the "
                     "fit, which leaves the other terms' estimates unchanged. See the Firth "
                     "sensitivity table.")
    bounds = (table["ci_low"], table["ci_high"]) if {"ci_low", "ci_high"} <= set(table.columns) else ([], [])
    unbounded = [t for t, e, low, high in zip(table["term"], table["estimable"], *bounds)
                 if e and interval_unbounded(low, high)]
    if unbounded:
        parts.append("Printed as not estimable because a bound of their bootstrap interval is 0 "
                     "or infinite (more than 2.5% of the replicates separate them in one "
                     "direction): " + ", ".join(unbounded) + ". The Firth column gives a finite "
                     "penalised estimate for every term; it treats the rows as independent, so "
                     "its intervals are narrower than an image-cluster interval.")
    hit = table.loc[table["estimable"] & (table["separated_replicates"] > 0)]
    if len(hit):
        parts.append("Replicates with separation count as infinite estimates: " + "; ".join(
            f"{t}: {k} of {replicates}" for t, k in zip(hit["term"], hit["separated_replicates"]))
            + ".")
    return " ".join(parts)


def firth_odds_ratios(frame: pd.DataFrame, level: float = stats.CONFIDENCE_LEVEL) -> pd.DataFrame:
    """Firth-penalised logistic model of the same terms (sensitivity analysis of Table 5).

    ``firthmodels.FirthLogisticRegression`` (Jeffreys-prior penalty) gives finite estimates
    even for separated terms; intervals are profile penalised-likelihood intervals. They treat
    the rows as independent although each image contributes five CAM rows, so they are
    narrower than an image-cluster interval would be. Columns: term, odds_ratio, ci_low,
    ci_high, separated_in_mle (the ordinary MLE of this term is infinite), interval.
    Empty frame or constant outcome: NaN rows ("not fitted"); a rank-deficient design (a term
    constant or collinear in these rows), a fit the solver refuses or one that does not
    converge: NaN rows whose interval says "not estimable" or "not converged" and why.
    """
    from firthmodels import FirthLogisticRegression  # optional dependency of this one table

    terms = list(TERMS)
    labels = [TERMS[t] for t in terms]
    separated = set()
    if len(frame) and frame["failure"].nunique() == 2:
        try:
            separated = set(detect_separation(frame)["separated"])
        except ValueError:
            separated = set()
    nan_table = pd.DataFrame({"term": labels, "odds_ratio": np.nan, "ci_low": np.nan,
                              "ci_high": np.nan, "separated_in_mle": [t in separated for t in terms],
                              "interval": "not fitted"})
    if frame.empty or frame["failure"].nunique() < 2:
        return nan_table
    x = frame[terms].to_numpy(dtype=float)
    design_rank = np.linalg.matrix_rank(np.column_stack([np.ones(len(x)), x]))
    if design_rank < len(terms) + 1:   # a constant or collinear term: no fit can separate it
        return nan_table.assign(interval=f"not estimable: design rank {design_rank} of "
                                         f"{len(terms) + 1} (a term is constant or collinear here)")
    model = FirthLogisticRegression(max_iter=200, backend="numpy")
    try:
        model.fit(x, frame["failure"].to_numpy(dtype=int))
        if not model.converged_:   # a sensitivity analysis that cannot be fitted is reported, not used
            return nan_table.assign(interval=f"not converged in {model.max_iter} iterations")
        bounds = model.conf_int(alpha=1.0 - level, method="pl")[: len(terms)]
    except (ValueError, np.linalg.LinAlgError) as error:  # e.g. a rank-deficient weighted design
        return nan_table.assign(interval=f"not estimable: {str(error).splitlines()[0]}")
    with np.errstate(over="ignore"):
        return pd.DataFrame({"term": labels, "odds_ratio": np.exp(model.coef_),
                             "ci_low": np.exp(bounds[:, 0]), "ci_high": np.exp(bounds[:, 1]),
                             "separated_in_mle": [t in separated for t in terms],
                             "interval": "profile penalised likelihood (rows independent)"})


def describe(status: str, *, score_threshold: float, primary_id: str, learned: bool, not_learned,
             failing_methods=()) -> str:
    """What Table 5 is, in words: its fit status, whose model it is, what it leaves out, how
    its intervals are made, and the CAM methods the gate does not validate."""
    return (f"Table 5 (score ≥ {score_threshold}): {status}. It models the primary `{primary_id}` only "
            f"(learned: {learned}); checkpoints that did not learn never enter it (excluded: "
            f"{', '.join(not_learned) or 'none'}). Firth-penalised logistic (Jeffreys prior), "
            "profile penalised-likelihood intervals; rows are treated as independent although each image "
            "gives five CAM rows, so these intervals are too narrow."
            + (f"\n\n{marks.GATE_FOOTNOTE} Failing: {', '.join(failing_methods)}." if failing_methods else ""))
