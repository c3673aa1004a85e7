"""Table 4 over training seeds: what the audit says about a method, not about one checkpoint.

One checkpoint's Table 4 is one draw of a training run: the learned seeds of one recipe give
Grad-CAM panel-A failure rates far apart, with a between-seed spread several times the
binomial error of one checkpoint's images, so an image-level interval says nothing about
another training run. ``table4_per_seed`` gives each learned checkpoint of the primary's
architecture its own panel A (its own high-score images); ``table4_over_seeds`` reads them as
draws: per map method the mean over seeds with a Student t interval over the seeds
(``stats.draw_mean_interval``), the between-seed SD, and the comparison with the centre
baseline paired within seed, read by a t interval or, for a bimodal method, by the share of
seeds below the centre. No verdict needs every seed to agree.

Method: docs/statistics_and_gate.md, "Table 4 over seeds".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from endoexplain_core import artefacts
from endoexplain_core.analysis import map_diagnostics, stats, summaries
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS, method_label

CENTRE = "centre"
# A gap of at least this much between neighbouring sorted seed rates makes a method bimodal:
# its mean lies where no seed is, so it is read by the share of seeds below the centre.
BIMODAL_GAP = 0.5
# What one new seed shows: the level of its prediction interval, and the probability of a new
# seed on its side (rule of succession) a share-read verdict needs to hold for a new seed.
ONE_NEW_SEED_LEVEL = 0.80
PER_SEED_COLUMNS = ("checkpoint_id", "seed", "is_primary", "method", "label", "n", "n_constant",
                    "peak_failure", "degenerate", "degenerate_why")
OVER_SEEDS_COLUMNS = (
    "method", "label", "n_seeds", "n_degenerate", "n_images", "peak_failure", "ci_low", "ci_high", "seed_sd",
    "seed_min", "seed_max", "n_paired", "n_below_centre", "share_below_centre",
    "share_below_centre_ci_low", "share_below_centre_ci_high", "difference_from_centre",
    "difference_ci_low", "difference_ci_high", "one_new_seed_difference_low",
    "one_new_seed_difference_high", "versus_centre", "versus_centre_rule", "note")


def primary_architecture_seeds(learning: pd.DataFrame, primary_id: str) -> list[str]:
    """Checkpoint ids of the primary's architecture, not controls, that learned (the learning
    table's ``learned``), in seed order. ``learning``: ``learning.learning_table`` rows with
    checkpoint_id, arch, seed, control, learned. A primary that did not learn is not among them:
    its maps are not a draw of a model that learned."""
    arch = learning.loc[learning["checkpoint_id"] == primary_id, "arch"]
    if arch.empty:
        raise ValueError(f"primary checkpoint {primary_id} is not in the learning table")
    learned = learning["learned"].map(lambda v: str(v).strip().lower() == "true")
    chosen = learning[(learning["arch"] == arch.iloc[0]) & (learning["control"] == "none") & learned]
    return chosen.sort_values("seed")["checkpoint_id"].tolist()


@artefacts.computed_by
def table4_per_seed(tables: pd.DataFrame, checkpoint_ids, score_threshold: float,
                    primary_id: str | None = None) -> pd.DataFrame:
    """Table 4 panel A's peak failure of every map method on each checkpoint's own high-score
    images (scaled score >= ``score_threshold`` under that checkpoint).

    ``tables``: audit rows of several checkpoints on one dataset (``audit.read_audits``);
    ``checkpoint_ids``: the seeds to read (``primary_architecture_seeds``). One row per
    checkpoint_id x method (the ``MAP_METHODS`` the audits hold, in that order): checkpoint_id,
    seed, is_primary, method, label, n (that checkpoint's panel-A images), n_constant,
    peak_failure (share of the n maps whose peak lies outside the lesion, a constant map counted
    as a failure as in Table 4; NaN when n = 0), degenerate and degenerate_why (a CAM's maps on
    all of that checkpoint's audit images by ``map_diagnostics.degenerate_maps``' position and
    tie rules; the sign rule needs the checkpoint's map-identity table, which only the primary
    has; always False for the baselines)."""
    present = set(tables["method"]) if len(tables) else set()
    methods = [m for m in MAP_METHODS if m in present]
    rows = []
    for checkpoint_id in checkpoint_ids:
        table = tables[tables["checkpoint_id"] == checkpoint_id]
        if table.empty:
            raise ValueError(f"checkpoint {checkpoint_id} has no audit rows")
        degeneracy = map_diagnostics.degenerate_maps(table).set_index("method")
        ids = set(summaries.high_score_ids(table, score_threshold))
        panel = table[table["sample_id"].isin(ids)]
        seeds = table["seed"].dropna() if "seed" in table.columns else pd.Series(dtype=float)
        seed = int(seeds.iloc[0]) if len(seeds) else -1
        for method in methods:
            of_method = panel[panel["method"] == method]
            rows.append({"checkpoint_id": checkpoint_id, "seed": seed,
                         "is_primary": checkpoint_id == primary_id, "method": method,
                         "label": method_label(method), "n": len(of_method),
                         "n_constant": int(of_method["constant_map"].astype(bool).sum()),
                         "peak_failure": summaries.failure_rate(of_method),
                         "degenerate": bool(method in CAM_METHODS and method in degeneracy.index
                                            and degeneracy.at[method, "degenerate"]),
                         "degenerate_why": str(degeneracy.at[method, "why"])
                         if method in degeneracy.index else ""})
    return pd.DataFrame(rows, columns=list(PER_SEED_COLUMNS))


def is_degenerate(per_seed: pd.DataFrame) -> pd.Series:
    """``table4_per_seed``'s degenerate column as bools (a CSV round trip gives strings; a
    table written before the column existed counts every seed as proper)."""
    return artefacts.bool_column(per_seed, "degenerate")


def paired_difference_interval(rates, centre_rates, n_maps: int,
                               level: float = stats.CONFIDENCE_LEVEL) -> dict[str, float]:
    """Mean over seeds of (rate - centre rate), each pair from one seed's images.

    Student t with k - 1 degrees of freedom over the k pairs' differences, its standard error
    floored, as in ``stats.draw_mean_interval``, at the binomial error of the two mean rates
    over the ``n_maps`` images of all seeds (treated as independent: seeds that happen to agree
    claim no more precision than their maps hold). Also the ``ONE_NEW_SEED_LEVEL`` prediction
    interval of one new seed's difference, mean +- t * s * sqrt(1 + 1/k). Returns {"mean",
    "low", "high", "new_low", "new_high", "k"}; intervals NaN with fewer than two pairs; all
    clipped to [-1, 1]."""
    rates, centre_rates = np.asarray(rates, dtype=float), np.asarray(centre_rates, dtype=float)
    both = ~(np.isnan(rates) | np.isnan(centre_rates))
    rates, centre_rates = rates[both], centre_rates[both]
    differences = rates - centre_rates
    k = len(differences)
    result = {"mean": float(differences.mean()) if k else np.nan, "low": np.nan, "high": np.nan,
              "new_low": np.nan, "new_high": np.nan, "k": k}
    if k < 2:
        return result
    sd = float(differences.std(ddof=1))
    p, q = float(rates.mean()), float(centre_rates.mean())
    binomial_variance = (p * (1 - p) + q * (1 - q)) / float(n_maps) if n_maps else 0.0
    se = float(np.sqrt(max(sd * sd / k, binomial_variance)))
    half = float(scipy_stats.t.ppf(1 - (1 - level) / 2, k - 1)) * se
    new_half = float(scipy_stats.t.ppf(1 - (1 - ONE_NEW_SEED_LEVEL) / 2, k - 1)) * sd * np.sqrt(1 + 1 / k)
    mean = result["mean"]
    result.update({"low": max(-1.0, mean - half), "high": min(1.0, mean + half),
                   "new_low": max(-1.0, mean - new_half), "new_high": min(1.0, mean + new_half)})
    return result


def largest_gap(rates) -> float:
    """Largest gap between neighbouring sorted finite rates (0 with fewer than two)."""
    values = np.sort(np.asarray(rates, dtype=float)[~np.isnan(np.asarray(rates, dtype=float))])
    return float(np.diff(values).max()) if len(values) > 1 else 0.0


def versus_centre(difference: dict, below: int, paired: int, bimodal: bool,
                  level: float = stats.CONFIDENCE_LEVEL) -> tuple[str, str]:
    """The verdict "above centre" / "below centre" / "inconclusive" / "not estimable" (fewer
    than two seeds with both rates) and the rule that gave it. A unimodal method: the t interval
    of the paired differences (``paired_difference_interval``) lies wholly above or below 0. A
    bimodal method: the Clopper-Pearson interval of the share of seeds below the centre lies
    wholly above or below one half. Never by asking every seed to agree."""
    if paired < 2:
        return "not estimable", "fewer than two seeds with a panel A"
    if bimodal:
        low, high = stats.clopper_pearson_interval(below, paired, level)
        verdict = "below centre" if low > 0.5 else "above centre" if high < 0.5 else "inconclusive"
        return verdict, "share of seeds below centre, Clopper-Pearson against 1/2 (bimodal)"
    verdict = ("above centre" if difference["low"] > 0 else
               "below centre" if difference["high"] < 0 else "inconclusive")
    return verdict, "paired difference from centre, Student t over seeds"


@artefacts.computed_by
def table4_over_seeds(per_seed: pd.DataFrame, level: float = stats.CONFIDENCE_LEVEL) -> pd.DataFrame:
    """Table 4 panel A as an expectation over training seeds, one row per map method.

    ``per_seed``: ``table4_per_seed`` (a seed without panel-A images, n = 0, is left out of
    every number, and so is a seed whose maps of the method are degenerate). Columns (rates are
    shares of maps whose peak lies outside the lesion):

    - method, label; n_seeds (seeds with a panel A and proper maps of the method), n_degenerate
      (seeds with a panel A left out because the method's maps are degenerate there),
      n_images (the n_seeds' panel-A images in all);
    - peak_failure: the mean of the seeds' rates, each seed on its own high-score images;
      ci_low, ci_high: Student t over the seeds (k - 1 df), standard error floored at the
      binomial error of n_images maps (``stats.draw_mean_interval``); seed_sd (ddof 1),
      seed_min, seed_max (shown, not evidence: they widen with the number of seeds);
    - n_paired (seeds where the centre baseline has a rate too), n_below_centre and
      share_below_centre: seeds whose rate lies below the centre baseline's on the same seed's
      images, with its Clopper-Pearson interval (share_below_centre_ci_low/high);
    - difference_from_centre (mean over seeds of rate - centre rate) with its t interval
      (difference_ci_low/high) and the 80% prediction interval of one new seed's difference
      (one_new_seed_difference_low/high; ``paired_difference_interval``);
    - versus_centre and versus_centre_rule (``versus_centre``; empty for the centre itself);
    - note: why a bimodal method (a gap of at least ``BIMODAL_GAP`` between neighbouring seed
      rates) is read by its share of seeds below the centre rather than by its mean.

    With no seed every number is NaN (n_seeds 0), one row per ``MAP_METHODS`` method."""
    with_panel = per_seed[per_seed["n"] > 0] if len(per_seed) else per_seed
    degenerate = is_degenerate(with_panel)
    rows = with_panel[~degenerate]
    methods = list(dict.fromkeys(per_seed["method"])) if len(per_seed) else list(MAP_METHODS)
    centre = (rows[rows["method"] == CENTRE].set_index("checkpoint_id")["peak_failure"]
              if len(rows) else pd.Series(dtype=float))
    result = []
    for method in methods:
        of_method = rows[rows["method"] == method] if len(rows) else rows
        rates = of_method["peak_failure"].to_numpy(dtype=float) if len(of_method) else np.array([])
        n_images = int(of_method["n"].sum()) if len(of_method) else 0
        over = stats.draw_mean_interval(rates, n_maps=n_images, level=level)
        row = {"method": method, "label": method_label(method), "n_seeds": int(over["k"]),
               "n_degenerate": int((degenerate & (with_panel["method"] == method)).sum())
               if len(with_panel) else 0,
               "n_images": n_images, "peak_failure": over["mean"], "ci_low": over["low"],
               "ci_high": over["high"], "seed_sd": over["sd"],
               "seed_min": float(np.nanmin(rates)) if len(rates) else np.nan,
               "seed_max": float(np.nanmax(rates)) if len(rates) else np.nan,
               "n_paired": 0, "n_below_centre": 0, "share_below_centre": np.nan,
               "share_below_centre_ci_low": np.nan, "share_below_centre_ci_high": np.nan,
               "difference_from_centre": np.nan, "difference_ci_low": np.nan,
               "difference_ci_high": np.nan, "one_new_seed_difference_low": np.nan,
               "one_new_seed_difference_high": np.nan, "versus_centre": "",
               "versus_centre_rule": "", "note": ""}
        gap = largest_gap(rates)
        bimodal = gap >= BIMODAL_GAP
        if method != CENTRE and not len(of_method) and row["n_degenerate"]:
            row.update({"versus_centre": "not estimable",
                        "versus_centre_rule": "maps degenerate on every seed with a panel A"})
        if method != CENTRE and len(of_method):
            centre_rates = of_method["checkpoint_id"].map(centre).to_numpy(dtype=float)
            paired = ~(np.isnan(rates) | np.isnan(centre_rates))
            n_paired = int(paired.sum())
            below = int((rates[paired] < centre_rates[paired]).sum())
            difference = paired_difference_interval(rates, centre_rates, n_images, level)
            share_low, share_high = stats.clopper_pearson_interval(below, n_paired, level)
            verdict, rule = versus_centre(difference, below, n_paired, bimodal, level)
            row.update({"n_paired": n_paired, "n_below_centre": below,
                        "share_below_centre": below / n_paired if n_paired else np.nan,
                        "share_below_centre_ci_low": share_low, "share_below_centre_ci_high": share_high,
                        "difference_from_centre": difference["mean"],
                        "difference_ci_low": difference["low"], "difference_ci_high": difference["high"],
                        "one_new_seed_difference_low": difference["new_low"],
                        "one_new_seed_difference_high": difference["new_high"],
                        "versus_centre": verdict, "versus_centre_rule": rule})
            if bimodal:
                row["note"] = (f"bimodal over seeds (rates {row['seed_min']:.2f} to {row['seed_max']:.2f}, "
                               f"a gap of {gap:.2f} between neighbouring seeds): the mean lies where no "
                               f"seed does, so read it by the share of seeds below the centre baseline "
                               f"({below} of {n_paired})")
        result.append(row)
    return pd.DataFrame(result, columns=list(OVER_SEEDS_COLUMNS))


def describe(over_seeds: pd.DataFrame, per_seed: pd.DataFrame, primary_id: str) -> str:
    """What ``table4_over_seeds`` rests on: seeds, images, the primary's place among them, and
    the bimodal methods."""
    seeds = sorted(per_seed.loc[per_seed["n"] > 0, "checkpoint_id"].unique()) if len(per_seed) else []
    if not seeds:
        return ("Table 4 over seeds: no learned seed of the primary's architecture has a panel A, so "
                "there is no estimate over seeds; Table 4 is one checkpoint's audit.")
    sizes = per_seed[per_seed["n"] > 0].groupby("checkpoint_id")["n"].first()
    bimodal = over_seeds.loc[over_seeds["note"].astype(str) != "", "label"].tolist()
    primary_in = "the primary among them" if primary_id in seeds else "the primary not among them"
    return (f"Table 4 over seeds: {len(seeds)} learned seeds of the primary's architecture ({primary_in}), "
            f"each on its own panel A ({', '.join(f'{c}: {int(n)}' for c, n in sizes.items())} images); "
            "mean over seeds with a Student t 95% interval over them (never narrower than the binomial "
            "error of all their images); the centre baseline compared within each seed. Bimodal over seeds, "
            f"read by the share of seeds below the centre: {', '.join(bimodal) or 'none'}. "
            + describe_degenerate_seeds(per_seed))


def describe_degenerate_seeds(per_seed: pd.DataFrame) -> str:
    """Which seeds' maps of which method ``table4_over_seeds`` leaves out as degenerate."""
    used = per_seed[per_seed["n"] > 0]
    flagged = used[is_degenerate(used)]
    if flagged.empty:
        return "No method's maps are degenerate on any of these seeds."
    parts = [f"{method_label(method)} on {', '.join(group['checkpoint_id'])}"
             for method, group in flagged.groupby("method", sort=False)]
    return ("Left out of a method's mean as degenerate (border-ring peaks or tied maxima on the audit "
            f"pool, map_diagnostics.degenerate_maps): {'; '.join(parts)}; their rates are in "
            "table4_per_seed, not read as localisation.")
