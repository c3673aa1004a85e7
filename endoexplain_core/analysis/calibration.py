"""Temperature scaling of the binary logit difference and the calibration metrics.

``z = logit_pos - logit_neg``; raw score ``sigmoid(z)``, scaled score ``sigmoid(z / T)`` with one
``T`` in ``TEMPERATURE_BOUNDS`` per checkpoint, fitted on validation NLL only. Rule:
docs/protocol.md, "Calibration"; method: docs/statistics_and_gate.md, "Calibration".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar
from scipy.special import expit

from endoexplain_core.run_layout import RunLayout
from endoexplain_core.analysis import stats
from endoexplain_core.files import write_csv_atomic, write_parquet_atomic
from endoexplain_core import artefacts

TEMPERATURE_BOUNDS = (0.05, 20.0)
SCORE_KINDS = {"raw": "Raw", "scaled": "Temperature-scaled"}
SPLIT_LABELS = {"train": "Training", "val": "Validation", "test": "Test",
                "spatial_audit": "Masked audit pool"}


def logit_difference(logit_neg: np.ndarray, logit_pos: np.ndarray) -> np.ndarray:
    """Binary logit difference ``z = logit_pos - logit_neg`` as float64."""
    return np.asarray(logit_pos, dtype=np.float64) - np.asarray(logit_neg, dtype=np.float64)


def scaled_score(z: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Positive-class score ``sigmoid(z / T)``; ``T = 1`` gives the raw score."""
    return expit(np.asarray(z, dtype=np.float64) / temperature)


def nll(z: np.ndarray, target: np.ndarray, temperature: float = 1.0) -> float:
    """Mean binary negative log-likelihood of ``sigmoid(z / T)`` (natural log).

    Computed from logits, ``mean(log(1 + exp(-s * z / T)))`` with ``s = +1`` for positives and
    ``-1`` for negatives, so it stays finite even where the score rounds to 0 or 1.
    """
    z, target = _check_pair(z, target)
    sign = 2.0 * target - 1.0
    return float(np.mean(np.logaddexp(0.0, -sign * z / temperature)))


def brier(score: np.ndarray, target: np.ndarray) -> float:
    """Brier score ``mean((score - target)^2)``."""
    score, target = _check_pair(score, target)
    return float(np.mean((score - target) ** 2))


def bin_index(score: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width bin of each score in [0, 1]: ``floor(score * n_bins)``, 1.0 in the last bin."""
    score = np.asarray(score, dtype=np.float64)
    if np.any((score < 0) | (score > 1)):
        raise ValueError("scores must lie in [0, 1]")
    return np.minimum((score * n_bins).astype(int), n_bins - 1)


def reliability_table(score: np.ndarray, target: np.ndarray, n_bins: int) -> pd.DataFrame:
    """Per equal-width bin: bin, lower, upper, count, mean_score, observed_frequency.

    Empty bins are kept with count 0 and NaN means (a diagram shows the gap).
    """
    score, target = _check_pair(score, target)
    bins = bin_index(score, n_bins)
    rows = []
    for b in range(n_bins):
        inside = bins == b
        count = int(inside.sum())
        rows.append({"bin": b, "lower": b / n_bins, "upper": (b + 1) / n_bins, "count": count,
                     "mean_score": float(score[inside].mean()) if count else np.nan,
                     "observed_frequency": float(target[inside].mean()) if count else np.nan})
    return pd.DataFrame(rows)


def ece(score: np.ndarray, target: np.ndarray, n_bins: int) -> float:
    """Expected calibration error: ``sum_b (n_b / N) * |mean score_b - positive rate_b|``."""
    return ece_from_bins(reliability_table(score, target, n_bins))


def ece_from_bins(table: pd.DataFrame) -> float:
    """The ECE of a ``reliability_table`` (count, mean_score, observed_frequency per bin);
    NaN when every bin is empty."""
    filled = table[table["count"] > 0]
    if filled.empty:
        return float("nan")
    gaps = (filled["mean_score"] - filled["observed_frequency"]).abs()
    return float((filled["count"] * gaps).sum() / filled["count"].sum())


def bootstrap_ece(score: np.ndarray, target: np.ndarray, n_bins: int, counts: np.ndarray) -> np.ndarray:
    """ECE of each bootstrap replicate: (R,) for ``counts`` (R, n), how often each image is
    drawn (``stats.bootstrap_draw_counts``). Bins are fixed by the scores, so a replicate's
    ECE is ``sum_b |sum of drawn scores in b - sum of drawn targets in b| / n``."""
    score, target = _check_pair(score, target)
    in_bin = np.eye(n_bins)[bin_index(score, n_bins)]                  # (n, B) one-hot
    gaps = counts @ (in_bin * (score - target)[:, None])               # (R, B)
    return np.abs(gaps).sum(axis=1) / len(score)


def split_rows(scores: pd.DataFrame, checkpoint_id: str, split: str) -> pd.DataFrame:
    """The rows of ``scores`` of one checkpoint on one split; ValueError when there are none."""
    part = scores[(scores["checkpoint_id"] == checkpoint_id) & (scores["role"] == split)]
    if part.empty:
        raise ValueError(f"{checkpoint_id}: no rows for split {split!r}")
    return part


@artefacts.computed_by
def ece_intervals(scores: pd.DataFrame, checkpoint_id: str, split: str, n_bins: int, *,
                  replicates: int, seed: int) -> pd.DataFrame:
    """ECE of raw and temperature-scaled scores on one split, and the change from scaling,
    with paired image-bootstrap 95% percentile intervals (the same resampled images for raw,
    scaled and their difference).

    Rows: Raw, Temperature-scaled, Change (scaled - raw). Columns: checkpoint_id, split,
    score, n, ece, ci_low, ci_high."""
    part = split_rows(scores, checkpoint_id, split)
    target = part["target"].to_numpy(float)
    counts = stats.bootstrap_draw_counts(len(part), replicates, seed).astype(float)
    estimates, replicate_values = {}, {}
    for kind, column in (("raw", "raw_score"), ("scaled", "scaled_score")):
        values = part[column].to_numpy(float)
        estimates[kind] = ece(values, target, n_bins)
        replicate_values[kind] = bootstrap_ece(values, target, n_bins, counts)
    estimates["change"] = estimates["scaled"] - estimates["raw"]
    replicate_values["change"] = replicate_values["scaled"] - replicate_values["raw"]
    rows = []
    for kind, label in (("raw", SCORE_KINDS["raw"]), ("scaled", SCORE_KINDS["scaled"]),
                        ("change", "Change (scaled - raw)")):
        low, high = stats.percentile_interval(replicate_values[kind])
        rows.append({"checkpoint_id": checkpoint_id, "split": SPLIT_LABELS.get(split, split),
                     "score": label, "n": len(part), "ece": estimates[kind],
                     "ci_low": float(low), "ci_high": float(high)})
    return pd.DataFrame(rows)


def fit_temperature(z_val: np.ndarray, y_val: np.ndarray,
                    bounds: tuple[float, float] = TEMPERATURE_BOUNDS) -> float:
    """The ``T`` minimising validation NLL of ``sigmoid(z / T)``, searched over log T.

    Raises ValueError when validation lacks one of the classes. The optimum may sit on a
    bound (e.g. perfectly separated or uninformative logits); ``at_bound`` tells.
    """
    z_val, y_val = _check_pair(z_val, y_val)
    if y_val.min() == y_val.max():
        raise ValueError("temperature fitting needs validation images of both classes")
    low, high = np.log(bounds[0]), np.log(bounds[1])
    result = minimize_scalar(lambda log_t: nll(z_val, y_val, np.exp(log_t)),
                             bounds=(low, high), method="bounded",
                             options={"xatol": 1e-8, "maxiter": 500})
    if not result.success:
        raise RuntimeError(f"temperature fit did not converge: {result.message}")
    return float(np.exp(result.x))


def at_bound(temperature: float, bounds: tuple[float, float] = TEMPERATURE_BOUNDS) -> bool:
    """True when a fitted T lies within 0.1% (in log T) of a search bound: the bound set it."""
    log_t = np.log(temperature)
    return bool(min(log_t - np.log(bounds[0]), np.log(bounds[1]) - log_t) < 1e-3)


def _check_pair(values: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(values, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    if values.shape != target.shape or values.ndim != 1 or len(values) == 0:
        raise ValueError(f"expected two equal-length non-empty 1-D arrays, got {values.shape} and {target.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError("non-finite logits or scores")
    if not np.all((target == 0) | (target == 1)):
        raise ValueError("targets must be 0 or 1")
    return values, target


# ----------------------------------------------------------------------------- tables


def fit_temperatures(logits: pd.DataFrame) -> pd.DataFrame:
    """One temperature per checkpoint from its validation rows.

    Columns: checkpoint_id, temperature, at_bound (the fit stopped on a search bound).
    """
    rows = []
    for checkpoint, frame in logits.groupby("checkpoint_id", sort=False):
        val = frame[frame["role"] == "val"]
        if val.empty:
            raise ValueError(f"{checkpoint}: no validation rows in the logits table")
        z = logit_difference(val["logit_neg"], val["logit_pos"])
        temperature = fit_temperature(z, val["target"])
        rows.append({"checkpoint_id": checkpoint, "temperature": temperature,
                     "at_bound": at_bound(temperature)})
    return pd.DataFrame(rows)


def add_scores(logits: pd.DataFrame, temperatures: pd.DataFrame) -> pd.DataFrame:
    """Logits table + z, temperature, raw_score, scaled_score (the ``scores.parquet`` table)."""
    scores = logits.merge(temperatures[["checkpoint_id", "temperature"]], on="checkpoint_id", how="left", validate="many_to_one")
    if scores["temperature"].isna().any():
        missing = sorted(scores.loc[scores["temperature"].isna(), "checkpoint_id"].unique())
        raise ValueError(f"no temperature for checkpoints {missing}")
    scores["z"] = logit_difference(scores["logit_neg"], scores["logit_pos"])
    scores["raw_score"] = scaled_score(scores["z"])
    scores["scaled_score"] = scaled_score(scores["z"], scores["temperature"].to_numpy())
    columns = list(logits.columns) + ["z", "temperature", "raw_score", "scaled_score"]
    return scores[columns]


@artefacts.computed_by
def calibration_table(scores: pd.DataFrame, checkpoint_id: str,
                      splits: tuple[str, ...] = ("val", "test"), *, n_bins: int) -> pd.DataFrame:
    """NLL, Brier and ECE of raw and temperature-scaled scores per split (Table 3 layout).

    ``temperature_at_bound`` is True on the temperature-scaled rows of a checkpoint whose T
    stopped on a search bound: its scaled score is then set by the bound, not by the data.
    """
    frame = scores[scores["checkpoint_id"] == checkpoint_id]
    rows = []
    for split in splits:
        part = frame[frame["role"] == split]
        if part.empty:
            raise ValueError(f"{checkpoint_id}: no rows for split {split!r}")
        temperature = float(part["temperature"].iloc[0])
        for kind, column, t in (("raw", "raw_score", 1.0), ("scaled", "scaled_score", temperature)):
            rows.append({"checkpoint_id": checkpoint_id, "split": SPLIT_LABELS[split],
                         "score": SCORE_KINDS[kind], "temperature": t,
                         "temperature_at_bound": kind == "scaled" and at_bound(t), "n": len(part),
                         "nll": nll(part["z"], part["target"], t),
                         "brier": brier(part[column], part["target"]),
                         "ece": ece(part[column], part["target"], n_bins)})
    return pd.DataFrame(rows)


def reliability_raw_vs_scaled(scores: pd.DataFrame, checkpoint_id: str, split: str,
                              n_bins: int) -> pd.DataFrame:
    """Reliability tables of raw and scaled scores stacked, with a ``score`` column."""
    part = scores[(scores["checkpoint_id"] == checkpoint_id) & (scores["role"] == split)]
    tables = []
    for kind, column in (("raw", "raw_score"), ("scaled", "scaled_score")):
        table = reliability_table(part[column], part["target"], n_bins)
        table.insert(0, "score", SCORE_KINDS[kind])
        table.insert(0, "split", split)
        table.insert(0, "checkpoint_id", checkpoint_id)
        tables.append(table)
    return pd.concat(tables, ignore_index=True)


@artefacts.computed_by
def source_category_audit(scores: pd.DataFrame, checkpoint_id: str, split: str, threshold: float,
                          *, replicates: int, seed: int) -> pd.DataFrame:
    """Per source category at the unchanged decision boundary (scaled score >= threshold).

    Positive sources: sensitivity, mean scaled score, false negatives and their share of all
    false negatives. Negative sources: false-positive rate, mean scaled score, false positives
    and their share of all false positives. Every rate has a Wilson 95% interval
    (``*_ci_low``/``*_ci_high``; the one rule for a proportion, ``stats``). The mean scaled
    score has an image-bootstrap percentile interval (``replicates``, ``seed``: the profile's).
    """
    part = split_rows(scores, checkpoint_id, split)
    called_positive = part["scaled_score"] >= threshold
    errors = called_positive != (part["target"] == 1)
    total_fn = int((errors & (part["target"] == 1)).sum())
    total_fp = int((errors & (part["target"] == 0)).sum())
    rows = []
    for (target, source), group in part.groupby(["target", "source"], sort=True):
        positive_call = called_positive[group.index]
        n_errors = int((positive_call != (target == 1)).sum())
        total = total_fn if target == 1 else total_fp
        low, high = stats.wilson_interval(int(positive_call.sum()), len(group))
        mean_score = stats.bootstrap_mean_ci(group["scaled_score"].to_numpy(float),
                                            replicates=replicates, seed=seed, bounds=(0.0, 1.0))
        rows.append({"target": int(target), "source": source, "n": len(group),
                     "sensitivity": float(positive_call.mean()) if target == 1 else np.nan,
                     "sensitivity_ci_low": low if target == 1 else np.nan,
                     "sensitivity_ci_high": high if target == 1 else np.nan,
                     "false_positive_rate": float(positive_call.mean()) if target == 0 else np.nan,
                     "false_positive_rate_ci_low": low if target == 0 else np.nan,
                     "false_positive_rate_ci_high": high if target == 0 else np.nan,
                     "mean_scaled_score": mean_score["estimate"],
                     "mean_scaled_score_ci_low": mean_score["ci_low"],
                     "mean_scaled_score_ci_high": mean_score["ci_high"],
                     "false_negatives": n_errors if target == 1 else 0,
                     "false_positives": n_errors if target == 0 else 0,
                     "share_of_errors": n_errors / total if total else np.nan})
    table = pd.DataFrame(rows).sort_values(["target", "source"], ascending=[False, True])
    return table.reset_index(drop=True)


def write_outputs(run_dir: str | Path, temperatures: pd.DataFrame, scores: pd.DataFrame,
                  reliability_test: pd.DataFrame) -> list[Path]:
    """Write temperatures.csv, scores.parquet and reliability_test.csv under <run_dir>/calibration."""
    layout = RunLayout(run_dir)
    return [write_csv_atomic(temperatures, layout.temperatures),
            write_parquet_atomic(scores, layout.scores),
            write_csv_atomic(reliability_test, layout.calibration_dir / "reliability_test.csv")]
