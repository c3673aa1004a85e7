"""Statistics of the audit: image-bootstrap CIs, paired tests, Holm, adjusted logistic model.

Conventions (DESIGN.md section 4):
- The unit of resampling is the image. Every bootstrap draws an integer index matrix of shape
  (replicates, n) from ``numpy.random.default_rng(seed)`` once and applies it to all outcomes,
  so outcomes of the same images are resampled together (paired) and reruns are identical.
- Intervals are percentile intervals (``numpy.percentile`` with linear interpolation).
- Seed 20260721; 2,000 replicates for spatial summaries, 5,000 for classifier metrics and
  figure-specific mean IoU, 500 image-cluster replicates for the adjusted logistic model.
- Empty populations (n = 0) give NaN estimates and intervals rather than an error, so that an
  empty high-score panel can be shown as such.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats

BOOTSTRAP_SEED = 20260721
SPATIAL_REPLICATES = 2000
CLASSIFIER_REPLICATES = 5000
CLUSTER_REPLICATES = 500
CONFIDENCE_LEVEL = 0.95
RIDGE_PENALTY = 1e-4
INTERCEPT_PENALTY = 1e-8


def bootstrap_indices(n: int, replicates: int, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Resampling index matrix, int64 of shape (replicates, n), rows drawn with replacement."""
    if n < 0 or replicates < 1:
        raise ValueError(f"need n >= 0 and replicates >= 1, got n={n}, replicates={replicates}")
    return np.random.default_rng(seed).integers(0, n, size=(replicates, n)) if n else \
        np.zeros((replicates, 0), dtype=np.int64)


def percentile_interval(replicate_values: np.ndarray, level: float = CONFIDENCE_LEVEL
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper percentile bounds over axis 0 of ``replicate_values`` (R, ...)."""
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(replicate_values, [tail, 100.0 - tail], axis=0)
    return low, high


def bootstrap_mean_ci(values, replicates: int = SPATIAL_REPLICATES, seed: int = BOOTSTRAP_SEED,
                      level: float = CONFIDENCE_LEVEL) -> dict[str, np.ndarray | float]:
    """Mean of ``values`` with an image-bootstrap percentile interval.

    ``values``: float array (n,) or (n, k) -- rows are images, columns are outcomes (e.g.
    methods) resampled with the same image indices. Booleans count as 0/1. NaN is rejected:
    drop undefined rows before calling. Returns ``{"estimate", "ci_low", "ci_high", "n"}``
    (scalars for 1-D input, (k,) arrays for 2-D input; NaN when n = 0).
    """
    array = np.asarray(values, dtype=np.float64)
    one_dimensional = array.ndim == 1
    if one_dimensional:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"values must be 1-D or 2-D (images x outcomes), got shape {array.shape}")
    if np.isnan(array).any():
        raise ValueError("values contain NaN; remove undefined rows before bootstrapping")
    n = array.shape[0]
    if n == 0:
        nan = np.full(array.shape[1], np.nan)
        estimate, low, high = nan, nan, nan
    else:
        # A replicate mean is (how often each image was drawn) @ values / n: one matrix
        # product (R, n) @ (n, k) instead of gathering an (R, n, k) array.
        draw_counts = _row_bincount(bootstrap_indices(n, replicates, seed), n)
        replicate_means = draw_counts @ array / n
        estimate = array.mean(axis=0)
        low, high = percentile_interval(replicate_means, level)
    if one_dimensional:
        return {"estimate": float(estimate[0]), "ci_low": float(low[0]),
                "ci_high": float(high[0]), "n": n}
    return {"estimate": estimate, "ci_low": low, "ci_high": high, "n": n}


def paired_difference_ci(first, second, replicates: int = SPATIAL_REPLICATES,
                         seed: int = BOOTSTRAP_SEED, level: float = CONFIDENCE_LEVEL) -> dict:
    """Mean paired difference ``first - second`` (same images, same order) with bootstrap CI."""
    first = np.asarray(first, dtype=np.float64)
    second = np.asarray(second, dtype=np.float64)
    if first.shape != second.shape or first.ndim != 1:
        raise ValueError(f"paired outcomes need equal 1-D shapes, got {first.shape} and {second.shape}")
    return bootstrap_mean_ci(first - second, replicates=replicates, seed=seed, level=level)


def exact_paired_binomial(failure_first, failure_second) -> dict:
    """Exact two-sided binomial test on discordant pairs (McNemar's exact test).

    ``failure_first``, ``failure_second``: bool (n,) per image. Under the null, a discordant
    image is equally likely to fail under either method. Returns the discordant counts
    (``first_only``, ``second_only``) and ``p_value`` (1.0 when there are no discordant pairs).
    """
    first = np.asarray(failure_first, dtype=bool)
    second = np.asarray(failure_second, dtype=bool)
    if first.shape != second.shape or first.ndim != 1:
        raise ValueError(f"paired outcomes need equal 1-D shapes, got {first.shape} and {second.shape}")
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
    first = np.asarray(first, dtype=np.float64)
    second = np.asarray(second, dtype=np.float64)
    if first.shape != second.shape or first.ndim != 1:
        raise ValueError(f"paired outcomes need equal 1-D shapes, got {first.shape} and {second.shape}")
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


def fit_ridge_logistic(design, outcome, weights=None, penalty: float = RIDGE_PENALTY,
                       intercept_penalty: float = INTERCEPT_PENALTY, max_iterations: int = 100,
                       tolerance: float = 1e-10) -> np.ndarray:
    """Logistic regression by Newton-Raphson (IRLS) with a tiny ridge penalty.

    ``design``: float (n, p), column 0 must be the intercept (all ones).
    ``outcome``: 0/1 (n,). ``weights``: frequency weights, float (n,) or (R, n) to fit R
    weighted problems at once (a cluster bootstrap is a frequency weighting of the rows).
    Maximises sum_i w_i log-lik_i - penalty/2 * ||beta[1:]||^2 - intercept_penalty/2 * beta[0]^2.
    Returns beta, (p,) or (R, p). The penalty keeps estimates finite under separation while
    barely moving them otherwise; the intercept gets a far smaller one so that a bootstrap
    replicate whose outcomes are all equal still has a finite (large) solution.
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
    beta = np.zeros((w.shape[0], p))
    for _ in range(max_iterations):
        probability = 1.0 / (1.0 + np.exp(-(beta @ x.T)))                     # (R, n)
        gradient = (w * (y - probability)) @ x - ridge * beta                  # (R, p)
        curvature = w * probability * (1.0 - probability)                      # (R, n)
        hessian = np.einsum("rn,ni,nj->rij", curvature, x, x) + np.diag(ridge)  # (R, p, p)
        step = np.linalg.solve(hessian, gradient[..., None])[..., 0]
        beta = beta + step
        if np.max(np.abs(step)) < tolerance:
            break
    return beta[0] if single else beta


def cluster_bootstrap_odds_ratios(design, outcome, clusters, term_names,
                                  replicates: int = CLUSTER_REPLICATES,
                                  seed: int = BOOTSTRAP_SEED, penalty: float = RIDGE_PENALTY,
                                  level: float = CONFIDENCE_LEVEL) -> dict:
    """Odds ratios of a ridge logistic model with image-cluster bootstrap percentile CIs.

    ``clusters``: (n,) cluster label per row (the image id: all method rows of one image move
    together). Each replicate draws clusters with replacement; a cluster drawn k times enters
    with frequency weight k, so all replicates are fitted at once. ``term_names``: names of the
    p design columns (the intercept is dropped from the output). Returns ``{"term",
    "odds_ratio", "ci_low", "ci_high"}`` as arrays over the non-intercept terms.
    """
    x = np.asarray(design, dtype=np.float64)
    labels, cluster_index = np.unique(np.asarray(clusters), return_inverse=True)
    if len(term_names) != x.shape[1]:
        raise ValueError(f"{len(term_names)} term names for {x.shape[1]} design columns")
    beta = fit_ridge_logistic(x, outcome, penalty=penalty)
    draws = bootstrap_indices(labels.size, replicates, seed)                    # (R, clusters)
    cluster_counts = _row_bincount(draws, labels.size)                          # (R, clusters)
    row_weights = cluster_counts[:, cluster_index]                              # (R, n)
    replicate_beta = fit_ridge_logistic(x, outcome, weights=row_weights, penalty=penalty)
    low, high = percentile_interval(np.exp(replicate_beta), level)
    return {"term": np.asarray(term_names[1:]), "odds_ratio": np.exp(beta[1:]),
            "ci_low": low[1:], "ci_high": high[1:]}


def _row_bincount(draws: np.ndarray, size: int) -> np.ndarray:
    """Counts of each value 0..size-1 in every row of ``draws`` (R, m) -> (R, size)."""
    offsets = draws + size * np.arange(draws.shape[0])[:, None]
    return np.bincount(offsets.ravel(), minlength=size * draws.shape[0]).reshape(-1, size)
