"""Statistics of the audit: image-bootstrap CIs, paired tests, Holm, adjusted logistic model.

The image is the unit of resampling: one index matrix (``bootstrap_indices``) serves every
outcome of a population, so outcomes of the same images are resampled together. Empty
populations (n = 0) give NaN, not an error. Rules: docs/protocol.md, "Statistics"; method:
docs/statistics_and_gate.md, "Resampling and intervals".
"""

from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats
from scipy.optimize import linprog

CONFIDENCE_LEVEL = 0.95
RIDGE_PENALTY = 1e-4
INTERCEPT_PENALTY = 1e-8
PERCENTILE_BOOTSTRAP = "percentile bootstrap"
STUDENT_T = "t (n < 10)"
NO_INTERVAL = "none (n < 2 or no spread)"
# Below this many images the percentile bootstrap of a mean undercovers (77% at n = 3, 88% at
# n = 10 for a nominal 95%): a mean then gets Student's t interval, or none.
MIN_BOOTSTRAP_N = 10
WILSON = "Wilson score"


class ConvergenceError(ArithmeticError):
    """An iterative fit stopped before its convergence criterion was met."""


def wilson_interval(successes, n, level: float = CONFIDENCE_LEVEL
                    ) -> tuple[np.ndarray | float, np.ndarray | float]:
    """Wilson score interval of ``successes / n`` (no continuity correction); n = 0 gives NaN."""
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    z = scipy_stats.norm.ppf(1 - (1 - level) / 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        low, high = np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)
        # exact by the formula (0 at k = 0, 1 at k = n) and around p; rounding can miss both
        # by 1e-16, which would draw a negative error bar
        low = np.where(k == 0, 0.0, np.minimum(low, p))
        high = np.where(k == n, 1.0, np.maximum(high, p))
    low, high = np.where(n > 0, low, np.nan), np.where(n > 0, high, np.nan)
    return (float(low), float(high)) if low.ndim == 0 else (low, high)


def replicate_dispersion(successes, n) -> float:
    """Between-replicate overdispersion of binomial counts: Pearson's X^2 of ``successes`` /
    ``n`` (one entry per replicate) around their pooled rate, divided by its degrees of freedom
    (replicates - 1), floored at 1. 1 means the replicates agree as well as binomial sampling
    allows; 10 means their rates scatter as if each replicate held a tenth of its maps (the
    quasi-binomial scale of a GLM fitted with ``scale="X2"``). 1 with one replicate or a pooled
    rate of 0 or 1 (no spread is possible)."""
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    keep = n > 0
    k, n = k[keep], n[keep]
    pooled = k.sum() / n.sum() if n.sum() else np.nan
    if len(n) < 2 or not 0 < pooled < 1:
        return 1.0
    chi_square = float(np.sum((k - n * pooled) ** 2 / (n * pooled * (1 - pooled))))
    return max(1.0, chi_square / (len(n) - 1))


def replicate_wilson_interval(successes, n, level: float = CONFIDENCE_LEVEL
                              ) -> tuple[float, float, float, float]:
    """(pooled rate, low, high, dispersion) for maps pooled over replicates that may disagree:
    the Wilson interval of the pooled rate at the effective size n / dispersion
    (``replicate_dispersion``). Replicates that agree keep the pooled Wilson interval;
    replicates of 4/48 and 40/48 count as about two maps, so their interval cannot decide."""
    k_total, n_total = float(np.sum(successes)), float(np.sum(n))
    if n_total == 0:
        return np.nan, np.nan, np.nan, np.nan
    dispersion = replicate_dispersion(successes, n)
    rate = k_total / n_total
    low, high = wilson_interval(rate * n_total / dispersion, n_total / dispersion, level)
    return rate, float(low), float(high), dispersion


def draw_mean_interval(rates, n_maps, level: float = CONFIDENCE_LEVEL) -> dict[str, float]:
    """Expected rate over independent model draws, with an interval that sees the draws.

    ``rates``: one rate per draw (k,), each in [0, 1] (e.g. one trained model's peak-inside
    rate on its replicate's frames); ``n_maps``: the number of maps behind all of them (N).
    The estimate is the mean of the draws' rates. Its standard error is
    sqrt(max(s^2 / k, p (1 - p) / N)): the between-draw spread, floored at the binomial error
    of N maps, so that draws that happen to agree do not claim more precision than the maps
    hold. The interval is Student t with k - 1 degrees of freedom, clipped to [0, 1].
    Returns {"mean", "low", "high", "sd" (between-draw SD, ddof 1), "se", "k", "df"};
    low/high NaN with fewer than two draws (the spread between draws is then unknown), every
    value NaN with none.
    """
    values = np.asarray(rates, dtype=np.float64)
    values = values[~np.isnan(values)]
    k = len(values)
    if k == 0:
        return {"mean": np.nan, "low": np.nan, "high": np.nan, "sd": np.nan, "se": np.nan,
                "k": 0, "df": np.nan}
    mean = float(values.mean())
    if k < 2:
        return {"mean": mean, "low": np.nan, "high": np.nan, "sd": np.nan, "se": np.nan,
                "k": 1, "df": 0}
    sd = float(values.std(ddof=1))
    binomial_variance = mean * (1 - mean) / float(n_maps) if n_maps else 0.0
    se = float(np.sqrt(max(sd * sd / k, binomial_variance)))
    half = float(scipy_stats.t.ppf(1 - (1 - level) / 2, k - 1)) * se
    return {"mean": mean, "low": max(0.0, mean - half), "high": min(1.0, mean + half), "sd": sd,
            "se": se, "k": k, "df": k - 1}


def draw_prediction_interval(rates, level: float = 0.80) -> tuple[float, float]:
    """Interval for the rate of one new draw: mean +- t(k - 1) * s * sqrt(1 + 1/k) over the
    draws' rates (k,), clipped to [0, 1]; (NaN, NaN) with fewer than two draws. It says what a
    single model (such as the audited checkpoint) may show, where ``draw_mean_interval`` says
    what the draws show on average."""
    values = np.asarray(rates, dtype=np.float64)
    values = values[~np.isnan(values)]
    k = len(values)
    if k < 2:
        return np.nan, np.nan
    half = (float(scipy_stats.t.ppf(1 - (1 - level) / 2, k - 1)) * float(values.std(ddof=1))
            * np.sqrt(1 + 1 / k))
    return max(0.0, float(values.mean()) - half), min(1.0, float(values.mean()) + half)


def clopper_pearson_interval(successes: int, n: int, level: float = CONFIDENCE_LEVEL
                             ) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of ``successes / n`` from the beta quantiles; (NaN, NaN)
    for n = 0. Used for counts of draws (few, so an exact interval)."""
    if n == 0:
        return np.nan, np.nan
    alpha = 1 - level
    low = 0.0 if successes == 0 else float(scipy_stats.beta.ppf(alpha / 2, successes, n - successes + 1))
    high = 1.0 if successes == n else float(scipy_stats.beta.ppf(1 - alpha / 2, successes + 1, n - successes))
    return low, high


def _images_by_columns(values, name: str) -> tuple[np.ndarray, bool]:
    """``values`` as float64 (n, k) and whether it was 1-D (one column)."""
    array = np.asarray(values, dtype=np.float64)
    one_dimensional = array.ndim == 1
    if one_dimensional:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"{name} must be 1-D or 2-D (images x columns), got shape {array.shape}")
    return array, one_dimensional


def rate_ci(outcomes, level: float = CONFIDENCE_LEVEL) -> dict[str, np.ndarray | float]:
    """Rate of a 0/1 outcome with its Wilson score interval (the one rule for a proportion).

    ``outcomes``: 0/1 (or bool) array (n,) or (n, k) -- rows are images, columns are rates of
    the same images (e.g. methods). NaN is rejected (decide what an undefined case counts as
    before calling). Returns ``{"estimate", "ci_low", "ci_high", "n", "successes",
    "interval"}``: scalars for 1-D input, (k,) arrays for 2-D input; NaN when n = 0.
    """
    array, one_dimensional = _images_by_columns(outcomes, "outcomes")
    if not np.isin(array, (0.0, 1.0)).all():
        raise ValueError("a rate needs 0/1 outcomes (NaN or other values found)")
    n = array.shape[0]
    successes = array.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        estimate = successes / n if n else np.full(array.shape[1], np.nan)
    low, high = wilson_interval(successes, np.full(successes.shape, n), level)
    result = {"estimate": estimate, "ci_low": np.atleast_1d(low), "ci_high": np.atleast_1d(high),
              "n": n, "successes": successes.astype(int),
              "interval": np.full(array.shape[1], WILSON, dtype=object)}
    if one_dimensional:
        return {"estimate": float(estimate[0]), "ci_low": float(result["ci_low"][0]),
                "ci_high": float(result["ci_high"][0]), "n": n,
                "successes": int(successes[0]), "interval": WILSON}
    return result


def bootstrap_indices(n: int, replicates: int, seed: int) -> np.ndarray:
    """Resampling index matrix, int64 of shape (replicates, n), rows drawn with replacement."""
    if n < 0 or replicates < 1:
        raise ValueError(f"need n >= 0 and replicates >= 1, got n={n}, replicates={replicates}")
    return np.random.default_rng(seed).integers(0, n, size=(replicates, n)) if n else \
        np.zeros((replicates, 0), dtype=np.int64)


def bootstrap_draw_counts(n: int, replicates: int, seed: int) -> np.ndarray:
    """How often each image is drawn in each replicate: int (replicates, n). A replicate mean
    of any outcome matrix V (n, k) is ``counts @ V / n``, with the images of every outcome
    resampled together."""
    return _row_bincount(bootstrap_indices(n, replicates, seed), n)


def percentile_interval(replicate_values: np.ndarray, level: float = CONFIDENCE_LEVEL
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper percentile bounds over axis 0 of ``replicate_values`` (R, ...)."""
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(replicate_values, [tail, 100.0 - tail], axis=0)
    return low, high


def weighted_pair_mean_ci(similarity, weights, replicates: int,
                          seed: int, level: float = CONFIDENCE_LEVEL) -> dict:
    """A weighted mean over the pairs of distinct images, sum_{i<j} w_i w_j S_ij /
    sum_{i<j} w_i w_j (the C-Score), with an image-bootstrap percentile interval.

    ``similarity``: symmetric (n, n) pair statistic (diagonal ignored); ``weights``: (n,) >= 0.
    A replicate draws n images with replacement; with c_i the times image i is drawn, it is
    the same mean over the pairs of *distinct* drawn images: sum_{i != j} c_i c_j w_i w_j S_ij /
    sum_{i != j} c_i c_j w_i w_j (a repeat of one image is never paired with itself, which
    would count a map as agreeing with itself). A replicate without two distinct weighted
    images is skipped. Returns {"estimate", "ci_low", "ci_high", "n", "replicates_used"}.
    """
    matrix = np.asarray(similarity, dtype=float)
    weights = np.asarray(weights, dtype=float)
    n = len(weights)
    if matrix.shape != (n, n):
        raise ValueError(f"similarity must be (n, n) for n = {n} weights; got {matrix.shape}")
    off_diagonal = matrix - np.diag(np.diag(matrix))

    def pair_mean(counts: np.ndarray) -> np.ndarray:
        drawn = counts * weights                                    # (R, n): c_i w_i
        numerator = np.einsum("ri,ij,rj->r", drawn, off_diagonal, drawn)
        denominator = drawn.sum(axis=1) ** 2 - (drawn ** 2).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), np.nan)

    estimate = float(pair_mean(np.ones((1, n)))[0]) if n >= 2 else float("nan")
    if n < 2:
        return {"estimate": estimate, "ci_low": np.nan, "ci_high": np.nan, "n": n, "replicates_used": 0}
    generator = np.random.default_rng(seed)
    counts = generator.multinomial(n, np.full(n, 1.0 / n), size=replicates).astype(float)
    means = pair_mean(counts)
    means = means[np.isfinite(means)]
    tail = (1 - level) / 2 * 100
    low, high = (np.percentile(means, [tail, 100 - tail]) if len(means) else (np.nan, np.nan))
    return {"estimate": estimate, "ci_low": float(low), "ci_high": float(high), "n": n,
            "replicates_used": int(len(means))}


def bootstrap_mean_ci(values, replicates: int, seed: int,
                      level: float = CONFIDENCE_LEVEL,
                      bounds: tuple[float, float] | None = None) -> dict[str, np.ndarray | float]:
    """Mean of ``values`` with an image-bootstrap percentile interval (from
    ``MIN_BOOTSTRAP_N`` images on; below it Student's t interval, and no interval for one image
    or values without spread: ``interval`` names which). ``bounds``: the range the values live
    in (e.g. (0, 1) for scores); Student's t interval is clipped to it, since a mean score's
    interval past 1 is no statement about scores (a percentile interval never leaves it).

    ``values``: float array (n,) or (n, k) -- rows are images, columns are outcomes (e.g.
    methods) resampled with the same image indices. NaN is rejected: drop undefined rows
    before calling. A single rate (0/1 outcome) takes ``rate_ci`` instead. Returns
    ``{"estimate", "ci_low", "ci_high", "n", "interval"}`` (scalars for 1-D input, (k,) arrays
    for 2-D input; NaN when n = 0).
    """
    array, one_dimensional = _images_by_columns(values, "values")
    if np.isnan(array).any():
        raise ValueError("values contain NaN; remove undefined rows before bootstrapping")
    n = array.shape[0]
    interval = np.full(array.shape[1], PERCENTILE_BOOTSTRAP, dtype=object)
    if n == 0:
        nan = np.full(array.shape[1], np.nan)
        estimate, low, high = nan, nan, nan
    elif n < MIN_BOOTSTRAP_N:
        estimate, low, high, interval = _small_sample_t(array, level)
        if bounds is not None:
            low, high = np.clip(low, *bounds), np.clip(high, *bounds)
    else:
        # A replicate mean is (how often each image was drawn) @ values / n: one matrix
        # product (R, n) @ (n, k) instead of gathering an (R, n, k) array.
        replicate_means = bootstrap_draw_counts(n, replicates, seed) @ array / n
        estimate = array.mean(axis=0)
        low, high = percentile_interval(replicate_means, level)
    if one_dimensional:
        return {"estimate": float(estimate[0]), "ci_low": float(low[0]),
                "ci_high": float(high[0]), "n": n, "interval": str(interval[0])}
    return {"estimate": estimate, "ci_low": low, "ci_high": high, "n": n, "interval": interval}


def _small_sample_t(array: np.ndarray, level: float):
    """(estimate, low, high, interval names) per column of an (n, k) array, 2 <= n < 10
    allowed: Student's t interval mean +- t(n-1) sd / sqrt(n); NaN bounds where n < 2 or the
    column has no spread (a zero-width interval would claim certainty)."""
    n = array.shape[0]
    estimate = array.mean(axis=0)
    spread = array.std(axis=0, ddof=1) if n > 1 else np.zeros(array.shape[1])
    defined = (n > 1) & (np.ptp(array, axis=0) > 0)    # equal values: no spread, no interval
    half = scipy_stats.t.ppf(1 - (1 - level) / 2, max(n - 1, 1)) * spread / np.sqrt(n)
    low = np.where(defined, estimate - half, np.nan)
    high = np.where(defined, estimate + half, np.nan)
    names = np.where(defined, STUDENT_T, NO_INTERVAL).astype(object)
    return estimate, low, high, names


def _paired(first, second, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``first`` and ``second`` as ``dtype`` arrays; ValueError unless both are 1-D of one shape."""
    first, second = np.asarray(first, dtype=dtype), np.asarray(second, dtype=dtype)
    if first.shape != second.shape or first.ndim != 1:
        raise ValueError(f"paired outcomes need equal 1-D shapes, got {first.shape} and {second.shape}")
    return first, second


def paired_difference_ci(first, second, replicates: int,
                         seed: int, level: float = CONFIDENCE_LEVEL) -> dict:
    """Mean paired difference ``first - second`` (same images, same order) with bootstrap CI."""
    first, second = _paired(first, second, np.float64)
    return bootstrap_mean_ci(first - second, replicates=replicates, seed=seed, level=level)


NEWCOMBE_PAIRED = "Newcombe paired score"


def newcombe_paired_interval(first, second, level: float = CONFIDENCE_LEVEL) -> dict:
    """Difference of two paired rates, mean(first) - mean(second), with Newcombe's (1998,
    method 10) square-and-add interval: each rate's Wilson interval, combined with the
    correlation of the paired outcomes (phi of the 2x2 table, shrunk towards 0 as Newcombe
    does: ad - bc above n/2 less n/2, negative values kept, else 0). Unlike a percentile
    bootstrap it stays consistent with McNemar's exact test beside it at a few discordant pairs.

    ``first``, ``second``: bool or 0/1 (n,) per image. Returns ``{"estimate", "ci_low",
    "ci_high", "n", "interval"}``; NaN for n = 0.
    """
    first, second = _paired(first, second, bool)
    n = first.size
    if n == 0:
        return {"estimate": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n": 0,
                "interval": NEWCOMBE_PAIRED}
    both, first_only = int(np.sum(first & second)), int(np.sum(first & ~second))
    second_only, neither = int(np.sum(~first & second)), int(np.sum(~first & ~second))
    p1, p2 = (both + first_only) / n, (both + second_only) / n
    low1, high1 = wilson_interval(both + first_only, n, level)
    low2, high2 = wilson_interval(both + second_only, n, level)
    margins = ((both + first_only) * (second_only + neither) * (both + second_only)
               * (first_only + neither))
    cross = both * neither - first_only * second_only
    shrunk = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = shrunk / np.sqrt(margins) if margins > 0 else 0.0
    difference = p1 - p2
    below = np.sqrt(max((p1 - low1) ** 2 - 2 * phi * (p1 - low1) * (high2 - p2) + (high2 - p2) ** 2, 0.0))
    above = np.sqrt(max((high1 - p1) ** 2 - 2 * phi * (high1 - p1) * (p2 - low2) + (p2 - low2) ** 2, 0.0))
    return {"estimate": difference, "ci_low": max(-1.0, difference - below),
            "ci_high": min(1.0, difference + above), "n": n, "interval": NEWCOMBE_PAIRED}


def exact_paired_binomial(failure_first, failure_second) -> dict:
    """Exact two-sided binomial test on discordant pairs (McNemar's exact test).

    ``failure_first``, ``failure_second``: bool (n,) per image. Under the null, a discordant
    image is equally likely to fail under either method. Returns the discordant counts
    (``first_only``, ``second_only``) and ``p_value`` (1.0 when there are no discordant pairs).
    """
    first, second = _paired(failure_first, failure_second, bool)
    first_only = int(np.sum(first & ~second))
    second_only = int(np.sum(~first & second))
    discordant = first_only + second_only
    p_value = 1.0 if discordant == 0 else float(
        scipy_stats.binomtest(first_only, discordant, 0.5, alternative="two-sided").pvalue)
    return {"first_only": first_only, "second_only": second_only, "p_value": p_value}


def paired_wilcoxon(first, second) -> dict:
    """Two-sided paired Wilcoxon signed-rank test (scipy defaults; zero differences dropped).

    Returns ``{"statistic", "p_value", "n_nonzero"}``; when every difference is zero the test
    is undefined and ``p_value`` is 1.0 with ``statistic`` NaN (identical maps do not differ).
    """
    first, second = _paired(first, second, np.float64)
    nonzero = int(np.count_nonzero(first - second))
    if nonzero == 0:
        return {"statistic": float("nan"), "p_value": 1.0, "n_nonzero": 0}
    result = scipy_stats.wilcoxon(first, second, zero_method="wilcox", alternative="two-sided")
    return {"statistic": float(result.statistic), "p_value": float(result.pvalue),
            "n_nonzero": nonzero}


def holm_adjust(p_values) -> np.ndarray:
    """Holm step-down adjusted p-values (same order as the input), capped at 1.

    Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(j) = max_{i<=j} min(1, (m-i+1) p_(i)).
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError(f"p-values must be a 1-D array in [0, 1] without NaN, got {p}")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(stepped)
    return adjusted


def holm_adjust_defined(p_values) -> np.ndarray:
    """``holm_adjust`` over the finite p-values; a NaN (no test possible, e.g. a pair with no
    image on which both maps have a peak) stays NaN and is not counted in the family."""
    p = np.asarray(p_values, dtype=np.float64)
    adjusted = np.full(p.shape, np.nan)
    finite = ~np.isnan(p)
    if finite.any():
        adjusted[finite] = holm_adjust(p[finite])
    return adjusted


def separation_directions(design, outcome, tolerance: float = 1e-6) -> np.ndarray:
    """Which logistic coefficients have an infinite maximum-likelihood estimate, and their sign.

    ``design``: float (n, p) including the intercept column; ``outcome``: 0/1 (n,). Solves the
    linear program of Konis (2007, eq. 4.23) with ``scipy.optimize.linprog``: maximise
    sum(Xb beta) subject to Xb beta >= 0 and -1 <= beta <= 1, where Xb = (2y - 1) * X. A
    non-zero coefficient of the solution is one that can grow without bound while never
    lowering the likelihood: the data are (quasi-)completely separated along it. Returns int8
    (p,): +1 (estimate is +inf), -1 (-inf) or 0 (finite). Only rows that are present matter,
    so pass the rows a weighted fit gives positive weight. A constant outcome separates the
    intercept. Raises ValueError for a rank-deficient design (per-term directions are then
    undefined).
    """
    x = np.asarray(design, dtype=np.float64)
    y = np.asarray(outcome, dtype=np.float64)
    if x.ndim != 2 or y.shape != (x.shape[0],) or not np.isin(y, (0.0, 1.0)).all():
        raise ValueError(f"design must be (n, p) and outcome 0/1 (n,), got {x.shape} and {y.shape}")
    if np.linalg.matrix_rank(x) < x.shape[1]:
        raise ValueError(f"design of shape {x.shape} is rank deficient: separation per term is "
                         "undefined (drop collinear or constant columns)")
    signed = x * (2.0 * y - 1.0)[:, None]
    result = linprog(-signed.sum(axis=0), A_ub=-signed, b_ub=np.zeros(len(y)),
                     bounds=[(-1.0, 1.0)] * x.shape[1], method="highs")
    if not result.success:
        raise RuntimeError(f"separation linear program failed: {result.message}")
    beta = np.where(np.abs(result.x) > tolerance, np.sign(result.x), 0.0)
    return beta.astype(np.int8)


def fit_ridge_logistic(design, outcome, weights=None, penalty: float = RIDGE_PENALTY,
                       intercept_penalty: float = INTERCEPT_PENALTY, max_iterations: int = 200,
                       tolerance: float = 1e-8, max_halvings: int = 40) -> np.ndarray:
    """Logistic regression by damped Newton-Raphson with a tiny ridge penalty.

    ``design``: float (n, p), column 0 must be the intercept (all ones).
    ``outcome``: 0/1 (n,). ``weights``: frequency weights, float (n,) or (R, n) to fit R
    weighted problems at once (a cluster bootstrap is a frequency weighting of the rows).
    Maximises sum_i w_i log-lik_i - penalty/2 * ||beta[1:]||^2 - intercept_penalty/2 * beta[0]^2.
    Each Newton step is halved (up to ``max_halvings`` times) until the penalised
    log-likelihood does not decrease; a problem has converged when its largest applied step is
    below ``tolerance`` or, with every coefficient penalised, when its Newton decrement (the
    gain the full step predicts, gradient . step) is at rounding level of the objective.
    Returns beta, (p,) or (R, p). Raises ``ConvergenceError`` naming the largest gradient norm
    when ``max_iterations`` pass without convergence.
    """
    x = np.asarray(design, dtype=np.float64)
    y = np.asarray(outcome, dtype=np.float64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"design must be (n, p) and outcome (n,), got {x.shape} and {y.shape}")
    if not np.all(x[:, 0] == 1.0):
        raise ValueError("column 0 of the design must be the intercept (all ones)")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("outcome must be 0/1")
    single = weights is None or np.ndim(weights) == 1
    w = np.ones((1, x.shape[0])) if weights is None else np.atleast_2d(np.asarray(weights, float))
    p = x.shape[1]
    ridge = np.full(p, penalty)
    ridge[0] = intercept_penalty
    strictly_concave = bool(np.all(ridge > 0))

    def objective(beta):                                                       # (R,)
        eta = beta @ x.T
        return (w * (y * eta - np.logaddexp(0.0, eta))).sum(axis=1) - 0.5 * (ridge * beta ** 2).sum(axis=1)

    beta = np.zeros((w.shape[0], p))
    current = objective(beta)
    for _ in range(max_iterations):
        probability = 1.0 / (1.0 + np.exp(-(beta @ x.T)))                     # (R, n)
        gradient = (w * (y - probability)) @ x - ridge * beta                  # (R, p)
        curvature = w * probability * (1.0 - probability)                      # (R, n)
        hessian = np.einsum("rn,ni,nj->rij", curvature, x, x) + np.diag(ridge)  # (R, p, p)
        step = np.linalg.solve(hessian, gradient[..., None])[..., 0]
        # Why the decrement: along a direction whose curvature is only the penalty (the
        # intercept's 1e-8 when every outcome of a bootstrap replicate is 1), rounding in the
        # gradient moves beta by more than ``tolerance`` forever although the maximum is
        # reached. Without a penalty on every term there may be no maximum (separation), so
        # there only the step decides.
        at_maximum = (strictly_concave
                      & (np.einsum("rp,rp->r", gradient, step)
                         <= 1e-12 * np.maximum(1.0, np.abs(current))))
        scale = np.ones(w.shape[0])
        for _ in range(max_halvings):
            candidate = beta + scale[:, None] * step
            value = objective(candidate)
            worse = value < current - 1e-12 * np.maximum(1.0, np.abs(current))
            if not worse.any():
                break
            scale = np.where(worse, scale / 2.0, scale)
        applied = scale[:, None] * step
        beta = beta + applied
        current = objective(beta)
        if np.all(at_maximum | (np.abs(applied).max(axis=1) < tolerance)):
            return beta[0] if single else beta
    probability = 1.0 / (1.0 + np.exp(-(beta @ x.T)))
    gradient = (w * (y - probability)) @ x - ridge * beta
    norms = np.linalg.norm(gradient, axis=1)
    worst = int(np.argmax(norms))
    raise ConvergenceError(
        f"ridge logistic did not converge in {max_iterations} Newton iterations: largest "
        f"gradient norm {norms[worst]:.3e} (problem {worst} of {len(norms)}); the data may be "
        "separated or the design ill-conditioned")


def cluster_bootstrap_odds_ratios(design, outcome, clusters, term_names,
                                  replicates: int,
                                  seed: int, penalty: float = RIDGE_PENALTY,
                                  level: float = CONFIDENCE_LEVEL) -> dict:
    """Odds ratios of a ridge logistic model with image-cluster bootstrap percentile CIs.

    ``clusters``: (n,) cluster label per row (the image id: all method rows of one image move
    together). Each replicate draws clusters with replacement; a cluster drawn k times enters
    with frequency weight k, so all replicates are fitted at once. ``term_names``: names of the
    p design columns (the intercept is dropped from the output).

    A replicate whose drawn rows separate a term has an infinite estimate for it: that
    replicate counts as +inf or -inf for the term (not its penalty-set value), so a bound
    reached by such replicates is infinite (an odds-ratio bound of 0 or inf). Returns
    ``{"term", "odds_ratio", "ci_low", "ci_high", "separated_replicates"}`` as arrays over the
    non-intercept terms. The full-data fit is expected to be free of separation (check with
    ``separation_directions`` first).
    """
    x = np.asarray(design, dtype=np.float64)
    y = np.asarray(outcome, dtype=np.float64)
    labels, cluster_index = np.unique(np.asarray(clusters), return_inverse=True)
    if len(term_names) != x.shape[1]:
        raise ValueError(f"{len(term_names)} term names for {x.shape[1]} design columns")
    beta = fit_ridge_logistic(x, y, penalty=penalty)
    draws = bootstrap_indices(labels.size, replicates, seed)                    # (R, clusters)
    cluster_counts = _row_bincount(draws, labels.size)                          # (R, clusters)
    row_weights = cluster_counts[:, cluster_index]                              # (R, n)
    replicate_beta = fit_ridge_logistic(x, y, weights=row_weights, penalty=penalty)
    directions = replicate_separation(x, y, row_weights)                        # (R, p)
    log_odds = np.where(directions > 0, np.inf, np.where(directions < 0, -np.inf, replicate_beta))
    low, high = _percentile_with_infinities(log_odds, level)
    with np.errstate(over="ignore"):
        return {"term": np.asarray(term_names[1:]), "odds_ratio": np.exp(beta[1:]),
                "ci_low": np.exp(low[1:]), "ci_high": np.exp(high[1:]),
                "separated_replicates": (directions[:, 1:] != 0).sum(axis=0)}


def replicate_separation(design, outcome, row_weights) -> np.ndarray:
    """Separation directions (``separation_directions``) of each weighted replicate, int8 (R, p).

    Only rows with positive weight enter a replicate. Replicates whose retained design is rank
    deficient (a term absent from every drawn row) count that as no separation; their
    estimate is then the penalty's zero for the missing term.
    """
    x = np.asarray(design, dtype=np.float64)
    y = np.asarray(outcome, dtype=np.float64)
    weights = np.atleast_2d(row_weights)
    result = np.zeros((weights.shape[0], x.shape[1]), dtype=np.int8)
    seen: dict[bytes, np.ndarray] = {}
    for r, row in enumerate(weights):
        present = row > 0
        key = np.packbits(present).tobytes()
        if key not in seen:
            try:
                seen[key] = separation_directions(x[present], y[present])
            except ValueError:
                seen[key] = np.zeros(x.shape[1], dtype=np.int8)
        result[r] = seen[key]
    return result


def _percentile_with_infinities(values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over axis 0 where values may be +-inf (order statistics stay valid:
    a bound whose neighbouring order statistics are infinite is infinite)."""
    tail = 100.0 * (1.0 - level) / 2.0
    big = np.finfo(np.float64).max / 4
    clipped = np.clip(values, -big, big)
    low, high = np.percentile(clipped, [tail, 100.0 - tail], axis=0)
    low = np.where(low <= -big / 2, -np.inf, low)
    high = np.where(high >= big / 2, np.inf, high)
    return low, high


def weighted_average_precision(score, target, weights) -> np.ndarray:
    """Average precision of ``score`` for 0/1 ``target`` under each row of frequency weights.

    ``weights``: float (R, n). The same step-wise definition as
    ``sklearn.metrics.average_precision_score`` with ``sample_weight`` (thresholds at the
    distinct scores, AP = sum over thresholds of recall increase x precision), computed for
    all R rows at once. Rows without a weighted positive give NaN.
    """
    score = np.asarray(score, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64)
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    order = np.argsort(-score, kind="mergesort")
    sorted_score, y, w = score[order], y[order], w[:, order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(sorted_score) != 0), len(sorted_score) - 1]
    true_positives = np.cumsum(w * y, axis=1)[:, last_of_tie]
    false_positives = np.cumsum(w * (1 - y), axis=1)[:, last_of_tie]
    total = true_positives[:, -1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.nan_to_num(true_positives / (true_positives + false_positives))
        recall = true_positives / total
        gained = np.diff(np.concatenate([np.zeros((len(w), 1)), recall], axis=1), axis=1)
        return np.where(total[:, 0] > 0, (gained * precision).sum(axis=1), np.nan)


CLASSIFIER_METRICS = ("auprc", "accuracy_at_0.5", "sensitivity", "specificity")


def classifier_metric_intervals(z, target, replicates: int,
                                seed: int, level: float = CONFIDENCE_LEVEL
                                ) -> dict[str, dict]:
    """Test-split classifier metrics with image-bootstrap percentile CIs.

    ``z``: float (n,) logit differences (the score's ranking; decision z >= 0 = score >= 0.5);
    ``target``: 0/1 (n,). Metrics: AUPRC (``sklearn.metrics.average_precision_score`` of z),
    accuracy at 0.5, sensitivity and specificity at 0.5. Images are resampled with
    ``bootstrap_indices``; a replicate without a positive (or negative) image leaves AUPRC and
    sensitivity (specificity) undefined and is skipped for that metric (counted in
    ``undefined_replicates``). AUPRC has a percentile interval; accuracy, sensitivity and
    specificity are single rates and take the Wilson interval (``rate_ci``). Returns metric -> ``{"estimate", "ci_low", "ci_high",
    "interval", "undefined_replicates"}``.
    """
    from sklearn.metrics import average_precision_score

    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(target, dtype=np.int64)
    if z.shape != y.shape or z.ndim != 1 or len(z) == 0 or not np.isin(y, (0, 1)).all():
        raise ValueError(f"need equal non-empty 1-D z and 0/1 target, got {z.shape} and {y.shape}")
    correct = ((z >= 0).astype(int) == y).astype(float)
    counts = bootstrap_draw_counts(len(z), replicates, seed).astype(float)
    positives, negatives = counts @ y, counts @ (1 - y)
    with np.errstate(invalid="ignore", divide="ignore"):
        replicate = {"accuracy_at_0.5": counts @ correct / len(z),
                     "sensitivity": counts @ (correct * y) / positives,
                     "specificity": counts @ (correct * (1 - y)) / negatives}
    auprc = weighted_average_precision(z, y, counts)
    auprc[(positives == 0) | (negatives == 0)] = np.nan
    replicate["auprc"] = auprc
    n_pos, n_neg = int(y.sum()), int((1 - y).sum())
    estimate = {"auprc": float(average_precision_score(y, z)) if 0 < n_pos < len(y) else np.nan,
                "accuracy_at_0.5": float(correct.mean()),
                "sensitivity": float(correct[y == 1].mean()) if n_pos else np.nan,
                "specificity": float(correct[y == 0].mean()) if n_neg else np.nan}
    successes = {"accuracy_at_0.5": (int(correct.sum()), len(z)),
                 "sensitivity": (int(correct[y == 1].sum()), n_pos),
                 "specificity": (int(correct[y == 0].sum()), n_neg)}
    tail = 100.0 * (1.0 - level) / 2.0
    result = {}
    for metric in CLASSIFIER_METRICS:
        values = replicate[metric]
        defined = values[~np.isnan(values)]
        low, high = (np.percentile(defined, [tail, 100.0 - tail]) if len(defined)
                     else (np.nan, np.nan))
        interval = PERCENTILE_BOOTSTRAP
        if metric in successes:  # a single rate: the Wilson rule
            low, high = wilson_interval(*successes[metric], level)
            interval = WILSON
        result[metric] = {"estimate": estimate[metric], "ci_low": float(low), "ci_high": float(high),
                          "interval": interval, "undefined_replicates": int(replicates - len(defined))}
    return result


def _row_bincount(draws: np.ndarray, size: int) -> np.ndarray:
    """Counts of each value 0..size-1 in every row of ``draws`` (R, m) -> (R, size)."""
    offsets = draws + size * np.arange(draws.shape[0])[:, None]
    return np.bincount(offsets.ravel(), minlength=size * draws.shape[0]).reshape(-1, size)
