"""Subgroup gaps in map quality that do not mistake case mix for a gap: nested GEE models,
crude gaps, Holm families and equivalence tests per contrast.

A gap is subgroup (``subgroup = 1``) minus reference (``0``) per CAM method, in
``OUTCOME_UNITS`` (energy lift in bits, pointing in percentage points, SRG and LSR in z/T);
negative = worse maps in the subgroup. Input frames are long: one row per (image[, checkpoint],
method) with ``cluster`` = the image. Method: docs/statistics_and_gate.md, "Subgroup contrasts
(GEE)"; table conventions: docs/architecture.md, "Faithfulness and subgroup conventions".
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from patsy import build_design_matrices, dmatrices
from scipy import stats as scipy_stats
from scipy.special import expit
from statsmodels.genmod import families
from statsmodels.genmod.cov_struct import Exchangeable, Independence
from statsmodels.genmod.generalized_estimating_equations import GEE
from statsmodels.stats.proportion import confint_proportions_2indep

from endoexplain_core.analysis.stats import holm_adjust, separation_directions

OUTCOMES = {"energy_lift": "linear", "pointing_hit": "logistic", "srg": "linear", "lsr": "linear"}
MAP_OUTCOMES = ("energy_lift", "pointing_hit")   # the localisation outcomes of every case
OUTCOME_UNITS = {"energy_lift": "bit", "pointing_hit": "pp", "srg": "z/T", "lsr": "z/T"}
EQUIVALENCE_MARGINS = {"energy_lift": 0.5, "pointing_hit": 10.0}
CASE_MIX = ("log_lesion_area", "centrality", "fov_area")
CLASSIFIER_STATE = ("margin", "correct")
VISIBILITY = ("dog_lift",)
MODELS = ("M0", "M1", "M2", "M3")
# Exploratory, confounders only: the factors that precede the subgroup (field of view, centre).
CONFOUNDER_MODEL = "Mc"
PRECEDING = ("fov_area",)
ALL_MODELS = MODELS + (CONFOUNDER_MODEL,)
TOST_ALPHA = 0.05
PRIMARY_FAMILY, SECONDARY_FAMILY = "primary", "secondary"
# One intercept per (method, checkpoint) cell present: in the formula the cell factor replaces
# the method intercepts (``gee_formula``), so a cell left out (``fit_population``) leaves no
# empty column behind.
CHECKPOINT_TERM = "C(method):C(checkpoint_id)"
CELL_COLUMN = "method_checkpoint"
LSR_METHOD = "classifier"   # LSR's pseudo-method: the classifier's reliance, no map involved
# Images with a hit, and without one, that a logistic gap needs on each side (``thin_methods``).
MIN_SIDE_IMAGES = 3
SEPARATION_NOTE = "not estimable ({hits}; separation)"
# Clusters beyond the parameters that cluster-robust inference needs; below it: no estimate.
MIN_SPARE_CLUSTERS = 10
WALD_BEYOND_RANGE_NOTE = ("Wald 95% interval passes +-100 pp: too few images for the normal "
                          "approximation; read the crude gap's Newcombe interval")


@dataclass(frozen=True)
class Contrast:
    """One subgroup comparison: its name, the label of each side, the covariates it must not
    adjust for (they define it) and the fixed-effect terms it adds from M1 on."""

    name: str
    subgroup_label: str
    reference_label: str
    exclude: tuple[str, ...] = ()
    fixed_effects: tuple[str, ...] = ()


def model_terms(model: str, contrast: Contrast) -> list[str]:
    """Covariate terms of ``model`` (M0..M3, or the confounder-only Mc) for ``contrast``, in
    formula syntax."""
    if model == CONFOUNDER_MODEL:
        return [t for t in PRECEDING if t not in contrast.exclude] + list(contrast.fixed_effects)
    if model not in MODELS:
        raise ValueError(f"model must be one of {ALL_MODELS}; got {model!r}")
    level = MODELS.index(model)
    terms: list[str] = []
    if level >= 1:
        terms += [t for t in CASE_MIX if t not in contrast.exclude] + list(contrast.fixed_effects)
    if level >= 2:
        terms += [t for t in CLASSIFIER_STATE if t not in contrast.exclude]
    if level >= 3:
        terms += [t for t in VISIBILITY if t not in contrast.exclude]
    return terms


def informative_terms(frame: pd.DataFrame, terms) -> tuple[list[str], list[str]]:
    """(terms that vary in ``frame``, terms left out because they are constant there, e.g.
    correctness when every case is classified correctly). ``C(x)`` terms are judged by x, an
    interaction with ``C(method)`` by its other factor."""
    kept, dropped = [], []
    for term in terms:
        columns = [c for c in re.findall(r"C\((\w+)\)", term) if c != "method"] or [term]
        varies = all(frame[column].nunique(dropna=False) > 1 for column in columns)
        (kept if varies else dropped).append(term)
    return kept, dropped


def gee_formula(outcome: str, terms, *, method_specific_slopes: bool) -> str:
    """One intercept per method (per (method, checkpoint) cell when ``CHECKPOINT_TERM`` is
    among ``terms``) and one subgroup coefficient per method; shared (or per-method) slopes."""
    intercepts = f"C({CELL_COLUMN})" if CHECKPOINT_TERM in terms else "C(method)"
    covariates = [term for term in terms if term != CHECKPOINT_TERM]
    if method_specific_slopes:
        covariates = [f"C(method):{term}" for term in covariates]
    return " + ".join([f"{outcome} ~ 0 + {intercepts}", "C(method):subgroup", *covariates])


def with_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the (method, checkpoint) cell column the pooled intercepts read."""
    if "checkpoint_id" not in frame:
        return frame
    return frame.assign(**{CELL_COLUMN: frame["method"].astype(str) + "/" + frame["checkpoint_id"].astype(str)})


def fit_gee(frame: pd.DataFrame, outcome: str, terms, *, method_specific_slopes: bool = False):
    """Fit the GEE of ``outcome`` (``OUTCOMES`` says linear or logistic) on long ``frame``
    (columns ``cluster``, ``method``, ``subgroup`` 0/1, the outcome and the terms).
    Returns (statsmodels results with the bias-reduced covariance, patsy design info). Raises
    ``NotEstimable`` when the clusters do not exceed the parameters by ``MIN_SPARE_CLUSTERS``,
    or when neither the exchangeable nor the independence working correlation converges (the
    exchangeable fit is refitted under independence first; ``working_correlation`` says which).
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; known: {list(OUTCOMES)}")
    family = families.Gaussian() if OUTCOMES[outcome] == "linear" else families.Binomial()
    data, endog, exog = gee_design(frame, outcome, terms, method_specific_slopes=method_specific_slopes)
    clusters, parameters = data["cluster"].nunique(), exog.shape[1]
    if clusters - parameters < MIN_SPARE_CLUSTERS:
        raise NotEstimable(f"too few clusters: {clusters} clusters for {parameters} parameters "
                           f"(cluster-robust inference needs {MIN_SPARE_CLUSTERS} to spare)",
                           clusters=clusters, parameters=parameters)
    result = None
    for structure in (Exchangeable(), Independence()):
        model = GEE(endog, exog, groups=data["cluster"].to_numpy(), family=family,
                    cov_struct=structure)
        with warnings.catch_warnings():   # convergence is read below, not from a warning
            warnings.simplefilter("ignore")
            result = model.fit(cov_type="bias_reduced", maxiter=100)
        if result.converged:
            break
    if not result.converged:
        raise NotEstimable("did not converge (exchangeable or independence working correlation)",
                           clusters=clusters, parameters=parameters)
    return result, exog.design_info


def gee_design(frame: pd.DataFrame, outcome: str, terms, *, method_specific_slopes: bool):
    """(rows sorted by cluster and method, outcome column, design matrix) of ``gee_formula``."""
    data = with_cells(frame).sort_values(["cluster", "method"], kind="stable").reset_index(drop=True)
    endog, exog = dmatrices(gee_formula(outcome, terms, method_specific_slopes=method_specific_slopes),
                            data, return_type="dataframe", NA_action="raise")
    return data, endog, exog


class NotEstimable(ArithmeticError):
    """A fit whose estimates cannot be read: no convergence, or too few clusters. ``clusters``
    and ``parameters``: the size of the design it was refused on."""

    def __init__(self, message: str, *, clusters: int, parameters: int):
        super().__init__(message)
        self.clusters, self.parameters = clusters, parameters


def working_correlation(result) -> str:
    """The working correlation a converged fit ended with ("exchangeable" or "independence":
    the refit when the exchangeable one did not converge)."""
    return "independence" if isinstance(result.model.cov_struct, Independence) else "exchangeable"


def separated_methods(frame: pd.DataFrame, outcome: str, terms, methods, *,
                      method_specific_slopes: bool = False) -> dict[str, str]:
    """Methods whose logistic gap has no finite maximum-likelihood estimate in this design.

    Builds the fit's design (``gee_formula``) and solves the separation linear program over
    its rows. Returns method -> the separated term(s): a term of the method itself (its
    intercept, its subgroup coefficient or its own slope), or, for every method, a separated
    shared term (a covariate or fixed effect). Empty when nothing is separated. Raises
    ValueError for a rank-deficient design.
    """
    _, endog, exog = gee_design(frame, outcome, terms, method_specific_slopes=method_specific_slopes)
    directions = separation_directions(exog.to_numpy(), endog.to_numpy().ravel())
    separated = [name for name, direction in zip(exog.columns, directions) if direction != 0]
    shared = [name for name in separated if "C(method)[" not in name]
    result = {}
    for method in methods:
        own = [name for name in separated if f"C(method)[{method}]" in name]
        if own or shared:
            result[method] = ", ".join(own + shared)
    return result


def hit_counts(frame: pd.DataFrame, outcome: str, method: str) -> str:
    """Hits of one method's 0/1 outcome per side, in images: ``"3/3 subgroup, 40/57 reference
    images"``. With several checkpoints an image counts its share of hit maps, and the map
    counts follow: ``"7.6/20 subgroup, 9.5/12 reference images (61/160, 76/96 maps)"``."""
    part = frame[frame["method"] == method]
    images, maps = [], []
    for value, label in ((1, "subgroup"), (0, "reference")):
        side = part[part["subgroup"] == value]
        shares = side.groupby("cluster")[outcome].mean()
        whole = len(side) == len(shares)
        images.append(f"{int(shares.sum()) if whole else f'{shares.sum():.1f}'}/{len(shares)} {label}")
        maps.append(f"{int(side[outcome].sum())}/{len(side)}")
    if len(part) == part["cluster"].nunique():
        return ", ".join(images) + " images"
    return ", ".join(images) + f" images ({', '.join(maps)} maps)"


def g_computation_gaps(result, design_info, frame: pd.DataFrame, outcome: str, methods
                       ) -> pd.DataFrame:
    """Per method: gap (subgroup 1 minus 0, predictions averaged over that method's rows;
    x100 for the logistic outcome, i.e. percentage points) and its delta-method SE."""
    scale = 100.0 if OUTCOMES[outcome] == "logistic" else 1.0
    params = np.asarray(result.params)
    covariance = np.asarray(result.cov_params())
    rows = []
    for method in methods:
        subset = with_cells(frame[frame["method"] == method])
        designs = [np.asarray(build_design_matrices([design_info], subset.assign(subgroup=value))[0])
                   for value in (1, 0)]
        means, gradients = [], []
        for design in designs:
            linear = design @ params
            if OUTCOMES[outcome] == "logistic":
                # expit, not 1 / (1 + exp(-x)): a linear predictor below -709 overflowed exp
                # (a RuntimeWarning in notebook 08 of the default run); same values, no overflow
                probability = expit(linear)
                means.append(probability.mean())
                gradients.append((probability * (1 - probability)) @ design / len(design))
            else:
                means.append(linear.mean())
                gradients.append(design.mean(axis=0))
        gradient = gradients[0] - gradients[1]
        gap = (means[0] - means[1]) * scale
        se = float(np.sqrt(max(gradient @ covariance @ gradient, 0.0))) * scale
        rows.append({"method": method, "gap": gap, "se": se})
    return pd.DataFrame(rows)


def tost(estimate, se, margin: float, alpha: float = TOST_ALPHA) -> dict:
    """Two one-sided z-tests of |theta| < margin. ``tost_p`` = the larger one-sided p-value;
    ``tost_equivalent`` = tost_p < alpha, the same as the (1 - 2 alpha) interval lying inside
    (-margin, margin). Works element-wise on arrays."""
    estimate, se = np.asarray(estimate, dtype=float), np.asarray(se, dtype=float)
    if margin <= 0:
        raise ValueError(f"margin must be positive; got {margin}")
    with np.errstate(divide="ignore", invalid="ignore"):
        p_lower = scipy_stats.norm.sf((estimate + margin) / se)    # H0: theta <= -margin
        p_upper = scipy_stats.norm.cdf((estimate - margin) / se)   # H0: theta >= +margin
    p = np.maximum(p_lower, p_upper)
    return {"tost_p": p, "tost_equivalent": p < alpha}


def wald_columns(gaps: pd.DataFrame) -> pd.DataFrame:
    """Add ``ci_low``/``ci_high`` (95%), ``ci90_low``/``ci90_high`` and two-sided ``p``."""
    z95, z90 = scipy_stats.norm.ppf(0.975), scipy_stats.norm.ppf(0.95)
    out = gaps.copy()
    out["ci_low"], out["ci_high"] = out["gap"] - z95 * out["se"], out["gap"] + z95 * out["se"]
    out["ci90_low"], out["ci90_high"] = out["gap"] - z90 * out["se"], out["gap"] + z90 * out["se"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["p"] = 2 * scipy_stats.norm.sf(np.abs(out["gap"] / out["se"]))
    return out


def slope_heterogeneity(result, design_info, methods, terms) -> dict[str, float]:
    """Wald test that every method shares each slope, in a method-specific-slopes fit.

    H0: for every covariate term t, the coefficients C(method)[m]:t are equal across ``methods``
    (the shared-slopes model is enough). Uses the fit's robust covariance. Returns
    ``{"statistic", "df", "p"}``: p from the F reference F(df, clusters - 1) of the Wald
    statistic / df; NaN when there is nothing to compare, when the contrasts' covariance is
    rank-deficient and when the statistic is not positive.
    """
    names = list(design_info.column_names)
    params, covariance = np.asarray(result.params), np.asarray(result.cov_params())
    rows = []
    for term in terms:
        columns = [[i for i, name in enumerate(names) if name.startswith(f"C(method)[{m}]:")
                    and name.split(":", 1)[1].startswith(term)] for m in methods]
        if any(len(c) != len(columns[0]) for c in columns) or not columns or not columns[0]:
            continue
        for first, other in zip(columns[0], zip(*columns[1:])):
            for index in other:
                row = np.zeros(len(names))
                row[first], row[index] = 1.0, -1.0
                rows.append(row)
    if not rows:
        return {"statistic": np.nan, "df": 0, "p": np.nan}
    contrast = np.vstack(rows)
    difference = contrast @ params
    variance = contrast @ covariance @ contrast.T
    df = int(np.linalg.matrix_rank(variance))
    if df < len(rows):            # a rank-deficient covariance: the test is not defined
        return {"statistic": np.nan, "df": df, "p": np.nan}
    statistic = float(difference @ np.linalg.solve(variance, difference))
    if not statistic > 0:         # <= 0 or NaN from a near-singular covariance: never p = 1
        return {"statistic": np.nan, "df": df, "p": np.nan}
    # Small-sample F reference (Wald / df on df and clusters - 1 degrees of freedom): the
    # chi-square reference over-rejects with a sandwich covariance from few clusters.
    clusters = len(np.unique(result.model.groups))
    return {"statistic": statistic, "df": df,
            "p": float(scipy_stats.f.sf(statistic / df, df, clusters - 1)) if clusters > 1 else np.nan}


def fit_estimable(frame: pd.DataFrame, outcome: str, candidate_terms, methods, *,
                  method_specific_slopes: bool) -> tuple[pd.DataFrame, dict[str, str], str]:
    """One GEE of ``outcome`` over ``methods`` after the separation check.

    For the logistic outcome, separated methods (``separated_methods``) are left out one round
    at a time and the rest refitted: a separated method's rows would pull an infinite
    coefficient into the shared slopes. Returns (gaps of the fitted methods: method, gap, se;
    separated method -> terms; a note for the whole fit: covariates left out as constant, a
    non-finite result or a failed fit). The gaps carry ``n_clusters`` and ``n_parameters``,
    the size of the design the fit was made (or refused) on.
    """
    fitted, separated = list(methods), {}
    data = frame[frame["method"].isin(fitted)]
    terms, dropped = informative_terms(data, candidate_terms) if fitted else ([], [])
    note = f"constant, left out: {', '.join(dropped)}" if dropped else ""
    try:
        if not fitted:
            raise ValueError("the outcome is constant for every method")
        while OUTCOMES[outcome] == "logistic" and fitted:
            found = separated_methods(data, outcome, terms, fitted,
                                      method_specific_slopes=method_specific_slopes)
            if not found:
                break
            separated.update(found)
            fitted = [m for m in fitted if m not in found]
            data = frame[frame["method"].isin(fitted)]
            terms, dropped = informative_terms(data, candidate_terms) if fitted else ([], [])
        if not fitted:
            return pd.DataFrame(columns=["method", "gap", "se"]), separated, note
        try:
            result, design_info = fit_gee(data, outcome, terms, method_specific_slopes=method_specific_slopes)
        except NotEstimable as error:
            note = "; ".join(filter(None, [note, f"not estimable ({error})"]))
            return (pd.DataFrame({"method": fitted, "gap": np.nan, "se": np.nan,
                                  "n_clusters": error.clusters, "n_parameters": error.parameters}),
                    separated, note)
        if working_correlation(result) == "independence":
            note = "; ".join(filter(None, [note, "refit under independence working correlation "
                                                 "(exchangeable did not converge)"]))
        gaps = g_computation_gaps(result, design_info, data, outcome, fitted).assign(
            n_clusters=len(np.unique(result.model.groups)), n_parameters=len(result.params))
        if method_specific_slopes and len(fitted) > 1:
            test = slope_heterogeneity(result, design_info, fitted, terms)
            gaps["slope_heterogeneity_p"] = test["p"]
        if not np.isfinite(gaps[["gap", "se"]].to_numpy(dtype=float)).all() or (gaps["se"] <= 0).any():
            note = "; ".join(filter(None, [note, "not estimable (non-finite estimate or SE)"]))
            gaps[["gap", "se"]] = np.nan
        return gaps, separated, note
    except Exception as error:  # singular design: report, do not stop
        note = f"fit failed: {type(error).__name__}: {str(error)[:120]}"
        return pd.DataFrame({"method": fitted, "gap": np.nan, "se": np.nan}), separated, note


def thin_methods(frame: pd.DataFrame, outcome: str, methods, minimum: int = MIN_SIDE_IMAGES
                 ) -> dict[str, str]:
    """Methods whose 0/1 outcome is too thin on one side of the contrast for a logistic gap:
    fewer than ``minimum`` distinct images with a hit, or without one, in the subgroup or the
    reference (an image counts once however many checkpoints hit it, since images are the
    clusters). A side with none of either is left to the separation check, which names it
    more precisely. Returns method -> its "not estimable (...)" note."""
    thin = {}
    for method in methods:
        part = frame[frame["method"] == method]
        for side, label in ((1, "subgroup"), (0, "reference")):
            per_image = part[part["subgroup"] == side].groupby("cluster")[outcome]
            with_hit, with_miss = int((per_image.max() > 0).sum()), int((per_image.min() < 1).sum())
            if 0 < min(with_hit, with_miss) < minimum:   # 0 of either: separation, found by the LP
                thin[method] = (f"not estimable ({hit_counts(frame, outcome, method)}; the {label} has "
                                f"{with_hit} image(s) with a hit and {with_miss} without: fewer than "
                                f"{minimum} of either)")
                break
    return thin


def fit_population(frame: pd.DataFrame, outcome: str) -> tuple[pd.DataFrame, str]:
    """The rows a pooled logistic gap is read from, model and crude alike: ``frame`` without
    the (method, checkpoint) cells whose 0/1 outcome never varies in this contrast.

    Such a cell (a checkpoint whose Grad-CAM never hits here) has an infinite intercept of its
    own (``CHECKPOINT_TERM``); its rows carry no information on any other coefficient (their
    likelihood is maximised by that intercept alone), so leaving them out gives the other
    estimates' limit, where keeping them makes the whole fit separated. A frame of one
    checkpoint, or a linear outcome, is returned whole. Returns (rows kept, a note naming
    what was left out)."""
    if OUTCOMES[outcome] != "logistic" or frame.get("checkpoint_id", pd.Series(dtype=str)).nunique() < 2:
        return frame, ""
    keys = ["method", "checkpoint_id"]
    levels = frame.groupby(keys, sort=True)[outcome].agg(["nunique", "sum", "size"])
    constant = levels[levels["nunique"] <= 1]
    if constant.empty:
        return frame, ""
    drop = frame.set_index(keys).index.isin(constant.index)
    named = ", ".join(f"{method}/{checkpoint} ({int(r['sum'])}/{int(r['size'])} hits)"
                      for (method, checkpoint), r in constant.iterrows())
    return frame[~drop], f"left out, outcome constant in this contrast: {named}"


def contrast_gaps(frame: pd.DataFrame, contrast: Contrast, *, outcomes=MAP_OUTCOMES,
                  models=ALL_MODELS, sensitivity_model: str = "M1",
                  min_side_images: int = MIN_SIDE_IMAGES) -> pd.DataFrame:
    """Every gap of one contrast: outcomes x models (shared slopes) plus the method-specific-
    slopes fit of ``sensitivity_model``. A logistic term with (quasi-)complete separation makes
    its method not estimable (``separated`` True, gap NaN, the hit counts in ``note``); a fit
    that fails gives NaN rows with the error in ``note``; a method whose outcome is constant
    in this contrast is not fitted (``constant_outcome`` True, gap NaN), nor is a logistic
    method with fewer than ``min_side_images`` images with (or without) a hit on one side
    (``too_thin`` True; ``thin_methods``).
    Every fit of an outcome reads the rows of ``fit_population`` (the crude gap reads the same).
    Columns: contrast, outcome, unit, model, slopes, method, gap, se, constant_outcome,
    separated, too_thin, estimable, ci_low, ci_high, ci90_low, ci90_high, p, hits, note, n_images,
    n_subgroup, n_reference, n_checkpoints (of the method's rows in the fit), n_clusters and
    n_parameters (the fit's design; NaN where no fit was made).
    """
    methods = sorted(frame["method"].unique(), key=list(frame["method"].unique()).index)
    pooled = ((CHECKPOINT_TERM,) if "checkpoint_id" in frame and frame["checkpoint_id"].nunique() > 1
              else ())
    per_image = frame.drop_duplicates("cluster")
    counts = {"n_images": len(per_image), "n_subgroup": int((per_image["subgroup"] == 1).sum()),
              "n_reference": int((per_image["subgroup"] == 0).sum())}
    fits = [(model, "shared", False) for model in models]
    if sensitivity_model:
        fits.append((sensitivity_model, "method-specific", True))
    parts = []
    for outcome in outcomes:
        data, dropped_note = fit_population(frame, outcome)
        # A method whose outcome never varies (e.g. constant maps: every peak at the same pixel,
        # every lift 0) carries no information on a gap; fitting it would report a spurious,
        # falsely precise 0. It is left out of the fit and reported not estimable.
        varying = data.groupby("method", sort=False)[outcome].nunique() > 1
        varying_methods = [m for m in methods if varying.get(m, False)]
        constant = [m for m in methods if m not in varying_methods]
        thin = (thin_methods(data, outcome, varying_methods, min_side_images)
                if OUTCOMES[outcome] == "logistic" else {})
        varying_methods = [m for m in varying_methods if m not in thin]
        checkpoints_used = (data.groupby("method")["checkpoint_id"].nunique()
                            if "checkpoint_id" in data else pd.Series(1, index=methods))
        for model, slopes, specific in fits:
            gaps, separated, note = fit_estimable(data, outcome, [*model_terms(model, contrast), *pooled],
                                                  varying_methods, method_specific_slopes=specific)
            note = "; ".join(filter(None, [dropped_note, note]))
            gaps = _with_unfitted_methods(gaps, data, outcome, separated, thin, constant)
            gaps["constant_outcome"] = gaps.get("constant_outcome", pd.Series(False, index=gaps.index)).fillna(False).astype(bool)
            gaps["separated"] = gaps["method"].isin(list(separated))
            gaps["too_thin"] = gaps["method"].isin(list(thin))
            gaps = gaps.set_index("method").reindex(methods).reset_index()
            gaps[["gap", "se"]] = gaps[["gap", "se"]].astype(float)
            gaps["estimable"] = gaps["gap"].notna() & gaps["se"].notna()
            gaps = wald_columns(gaps)
            gaps.insert(0, "slopes", slopes)
            gaps.insert(0, "model", model)
            gaps.insert(0, "unit", OUTCOME_UNITS[outcome])
            gaps.insert(0, "outcome", outcome)
            gaps.insert(0, "contrast", contrast.name)
            gaps = _hits_and_notes(gaps, data, outcome, varying, note)
            gaps = gaps.assign(**counts, n_checkpoints=[int(checkpoints_used.get(m, 0))
                                                        for m in gaps["method"]])
            for column in ("n_clusters", "n_parameters"):
                gaps[column] = gaps.get(column, pd.Series(np.nan, index=gaps.index)).astype(float)
            parts.append(gaps)
    return pd.concat(parts, ignore_index=True)


def _with_unfitted_methods(gaps: pd.DataFrame, data: pd.DataFrame, outcome: str,
                           separated: dict, thin: dict, constant: list) -> pd.DataFrame:
    """``gaps`` (the fitted methods) plus a NaN row per method left out of the fit, each with
    its reason in ``method_note``: separated, too thin, or a constant outcome."""
    gaps = gaps.assign(method_note="")
    if separated:
        gaps = pd.concat([gaps, pd.DataFrame({
            "method": list(separated), "gap": np.nan, "se": np.nan,
            "method_note": [SEPARATION_NOTE.format(hits=hit_counts(data, outcome, m))
                            + f" along {term}" for m, term in separated.items()]})],
            ignore_index=True)
    if thin:
        gaps = pd.concat([gaps, pd.DataFrame({"method": list(thin), "gap": np.nan, "se": np.nan,
                                              "method_note": list(thin.values())})],
                         ignore_index=True)
    if constant:
        gaps = pd.concat([gaps, pd.DataFrame({"method": constant, "gap": np.nan, "se": np.nan,
                                              "constant_outcome": True,
                                              "method_note": "not estimable (constant outcome)"})],
                         ignore_index=True)
    return gaps


def _hits_and_notes(gaps: pd.DataFrame, data: pd.DataFrame, outcome: str, varying: pd.Series,
                    fit_note: str) -> pd.DataFrame:
    """Add ``hits`` (logistic outcomes) and ``note`` (each method's own note, then the fit's),
    consuming ``method_note``."""
    if OUTCOMES[outcome] == "logistic":
        gaps["hits"] = [hit_counts(data, outcome, m) if m in varying.index else ""
                        for m in gaps["method"]]
        beyond = (gaps["ci_low"] < -100.0) | (gaps["ci_high"] > 100.0)   # a gap in pp cannot pass +-100
        gaps.loc[beyond, "method_note"] = WALD_BEYOND_RANGE_NOTE
    else:
        gaps["hits"] = ""
    method_note = gaps.pop("method_note").fillna("")
    gaps["note"] = ["; ".join(filter(None, [own, fit_note])) for own in method_note]
    return gaps


LESION_SIZE_CONTRAST = "Lesion size: small vs large"
# The energy lift's ceiling rises as the lesion share falls (about 12 bits at 2% against 9 at
# 20%), so this contrast's M1 gaps form a family of their own, outside the primary one.
LESION_SIZE_FAMILY = "lesion size (outside the primary family: the lift's ceiling depends on the lesion share)"


def holm_family(outcome: str, model: str, slopes: str, contrast: str = "") -> str:
    """The Holm family of one subgroup fit (docs/architecture.md, "Faithfulness and subgroup
    conventions", **Holm families**): ``"primary"`` for the M1 shared-slopes energy-lift gaps, ``"secondary"`` for the other M1 shared-slopes outcomes
    (the control contrasts join it in ``subgroup_controls``), ``LESION_SIZE_FAMILY`` for the M1
    shared-slopes gaps of the lesion-size contrast, else
    ``"sensitivity: <outcome> <model> <slopes>"``."""
    if model == "M1" and slopes == "shared":
        if contrast == LESION_SIZE_CONTRAST:
            return LESION_SIZE_FAMILY
        return PRIMARY_FAMILY if outcome == "energy_lift" else SECONDARY_FAMILY
    return f"sensitivity: {outcome} {model} {slopes}"


def add_holm(*tables: pd.DataFrame) -> list[pd.DataFrame]:
    """``p_holm`` for every row of ``tables`` (each with ``holm_family`` and ``p``): Holm's
    adjustment over the union of the tables' rows of one family that have a finite p. Rows
    of family ``""`` (descriptive) or without a p keep NaN. Returns adjusted copies."""
    out = [table.copy().assign(p_holm=np.nan) for table in tables]
    stacked = pd.concat([table[["holm_family", "p"]].assign(table=k, row=table.index)
                         for k, table in enumerate(out)], ignore_index=True)
    stacked = stacked[(stacked["holm_family"] != "") & stacked["p"].notna()]
    for _, family in stacked.groupby("holm_family", sort=False):
        adjusted = holm_adjust(family["p"].to_numpy(dtype=float))
        for k, row, value in zip(family["table"], family["row"], adjusted):
            out[k].loc[row, "p_holm"] = value
    return out


# Hit images per side that a pointing gap needs before TOST may call it equivalent.
MIN_TOST_EVENTS = 5


def tost_blockers(gaps: pd.DataFrame, crude: pd.DataFrame | None) -> pd.Series:
    """Per gap row, why its TOST cannot claim equivalence even where the model's 90% interval
    lies inside the margin ("" when nothing blocks): for the pointing outcome, fewer than
    ``MIN_TOST_EVENTS`` hit images on a side; for any outcome with a margin, a crude interval
    (``crude_gaps``, the same contrast, outcome and method) reaching the margin. ``crude`` None:
    nothing is checked (a table without crude gaps)."""
    if crude is None or crude.empty:
        return pd.Series("", index=gaps.index)
    keys = ["contrast", "outcome", "method"] if "contrast" in gaps and "contrast" in crude else ["outcome", "method"]
    crude_rows = crude.drop_duplicates(keys).set_index(keys)
    reasons = []
    for _, row in gaps.iterrows():
        key = tuple(row[k] for k in keys)
        margin = EQUIVALENCE_MARGINS.get(row["outcome"])
        if margin is None or key not in crude_rows.index:
            reasons.append("")
            continue
        c = crude_rows.loc[key]
        blocked = []
        if OUTCOMES[row["outcome"]] == "logistic":
            events = [c["subgroup_mean"] / 100 * c["n_subgroup"], c["reference_mean"] / 100 * c["n_reference"]]
            if not all(np.nan_to_num(e) >= MIN_TOST_EVENTS - 1e-9 for e in events):
                blocked.append(f"fewer than {MIN_TOST_EVENTS} hit images on a side")
        if not (abs(c["crude_ci_low"]) < margin and abs(c["crude_ci_high"]) < margin):
            blocked.append("the crude interval reaches the margin")
        reasons.append("; ".join(blocked))
    return pd.Series(reasons, index=gaps.index)


def add_tost(gaps: pd.DataFrame, crude: pd.DataFrame | None = None) -> pd.DataFrame:
    """TOST against ``EQUIVALENCE_MARGINS`` (``margin``, ``tost_p``, ``tost_equivalent``;
    NaN/False where not estimable or where the outcome has no stated margin: SRG, LSR).
    Equivalence also needs what ``tost_blockers`` checks against ``crude``; ``tost_blocked``
    says what stopped it."""
    out = gaps.copy()
    out["margin"] = out["outcome"].map(EQUIVALENCE_MARGINS)
    out["tost_p"], out["tost_equivalent"] = np.nan, False
    for outcome, margin in EQUIVALENCE_MARGINS.items():
        rows = out["outcome"] == outcome
        if rows.any():
            test = tost(out.loc[rows, "gap"], out.loc[rows, "se"], margin)
            out.loc[rows, "tost_p"] = test["tost_p"]
            out.loc[rows, "tost_equivalent"] = test["tost_equivalent"]
    out["tost_blocked"] = tost_blockers(out, crude)
    out["tost_equivalent"] = (out["tost_equivalent"].astype(bool) & out["tost_p"].notna()
                              & (out["tost_blocked"] == ""))
    return out


def per_image_means(frame: pd.DataFrame, columns) -> pd.DataFrame:
    """One row per (cluster, method): ``columns`` averaged over the frame's checkpoints (the
    density audit's "views averaged over architectures"), with ``subgroup`` kept."""
    return (frame.groupby(["cluster", "method"], sort=False)
            .agg(subgroup=("subgroup", "first"), **{c: (c, "mean") for c in columns})
            .reset_index())


def welch_gap(subgroup_values, reference_values, level: float = 0.95) -> dict[str, float]:
    """Subgroup mean minus reference mean with Welch's t interval and two-sided p (NaN when a
    side has fewer than 2 values or both sides are constant). Keys: gap, ci_low, ci_high, p."""
    sub = np.asarray(subgroup_values, dtype=float)
    ref = np.asarray(reference_values, dtype=float)
    gap = sub.mean() - ref.mean() if len(sub) and len(ref) else np.nan
    if len(sub) < 2 or len(ref) < 2 or (np.ptp(sub) == 0 and np.ptp(ref) == 0):
        return {"gap": gap, "ci_low": np.nan, "ci_high": np.nan, "p": np.nan}
    with warnings.catch_warnings():   # one exactly constant side is fine: its variance is 0
        warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
        test = scipy_stats.ttest_ind(sub, ref, equal_var=False)
        interval = test.confidence_interval(level)
    return {"gap": gap, "ci_low": float(interval.low), "ci_high": float(interval.high),
            "p": float(test.pvalue)}


def crude_gaps(frame: pd.DataFrame, outcomes=MAP_OUTCOMES, level: float = 0.95) -> pd.DataFrame:
    """Plain group means per method and outcome before any model (subgroup mean minus reference
    mean; pointing in pp). With one checkpoint the pointing gap has the Newcombe hybrid score
    interval (``confint_proportions_2indep(method="newcomb")``), the other outcomes Welch's t;
    with several, each image's outcome is first averaged over them (``per_image_means``) and
    every interval is Welch's, over the rows of ``fit_population``. Columns: outcome, unit,
    method, n_subgroup, n_reference, n_checkpoints, subgroup_mean, reference_mean, crude_gap,
    crude_ci_low, crude_ci_high, crude_interval (NaN interval when a side has fewer than 2
    images)."""
    pooled = "checkpoint_id" in frame and frame["checkpoint_id"].nunique() > 1
    rows = []
    for outcome in outcomes:
        population = fit_population(frame, outcome)[0] if pooled else frame
        checkpoints = (population.groupby("method")["checkpoint_id"].nunique() if pooled
                       else pd.Series(dtype=int))
        if pooled:
            population = per_image_means(population, [outcome])
        newcombe = OUTCOMES[outcome] == "logistic" and not pooled
        scale = 100.0 if OUTCOMES[outcome] == "logistic" else 1.0
        for method, part in population.groupby("method", sort=False):
            sub = part.loc[part["subgroup"] == 1, outcome].dropna().to_numpy(float)
            ref = part.loc[part["subgroup"] == 0, outcome].dropna().to_numpy(float)
            low = high = np.nan
            if not newcombe:
                low, high = (welch_gap(sub, ref, level)[k] for k in ("ci_low", "ci_high"))
            elif len(sub) >= 2 and len(ref) >= 2:
                low, high = confint_proportions_2indep(int(sub.sum()), len(sub), int(ref.sum()),
                                                       len(ref), method="newcomb", alpha=1 - level)
            rows.append({"outcome": outcome, "unit": OUTCOME_UNITS[outcome], "method": method,
                         "n_subgroup": len(sub), "n_reference": len(ref),
                         "n_checkpoints": int(checkpoints.get(method, 1)),
                         "subgroup_mean": (sub.mean() if len(sub) else np.nan) * scale,
                         "reference_mean": (ref.mean() if len(ref) else np.nan) * scale,
                         "crude_gap": (sub.mean() - ref.mean() if len(sub) and len(ref) else np.nan) * scale,
                         "crude_ci_low": float(low) * scale, "crude_ci_high": float(high) * scale,
                         "crude_interval": "Newcombe hybrid score" if newcombe else "Welch t"})
    return pd.DataFrame(rows)
