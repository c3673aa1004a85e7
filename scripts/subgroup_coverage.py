"""Coverage of the subgroup GEE's 95% interval by subgroup size (the basis of
``min_subgroup_images``).

Simulates contrasts like the audit's: five CAM methods per image sharing an image effect, a
subgroup of n images against a reference of 3n, a case-mix covariate that moves the outcome,
and no true subgroup gap. Each replicate runs ``analysis.subgroups.contrast_gaps`` (model M1,
shared slopes, with the separation check) and records, per outcome, the share of method gaps
that are estimable, how often the 95% interval covers the true gap of 0 among those, and how
often p < 0.05. Prints one row per (outcome, n). Usage:

    .venv/bin/python scripts/subgroup_coverage.py [--replicates 200] [--sizes 3 5 8 10 15 20 30]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import pandas as pd

from endoexplain_core.analysis import subgroups

METHOD_OFFSETS = {"gradcam": 0.0, "gradcampp": 0.3, "xgradcam": -0.3, "hirescam": -0.6, "eigencam": 0.5}


def simulate(n_subgroup: int, rng: np.random.Generator) -> pd.DataFrame:
    """Long table of one contrast without a true gap (columns as ``contrast_gaps`` reads)."""
    n = 4 * n_subgroup
    subgroup = np.r_[np.ones(n_subgroup), np.zeros(n - n_subgroup)].astype(int)
    case_mix = rng.normal(size=n) + 0.5 * subgroup          # the subgroup differs in case mix
    image_effect = 0.8 * rng.normal(size=n)
    parts = []
    for method, offset in METHOD_OFFSETS.items():
        linear = offset + 0.8 * case_mix + image_effect
        parts.append(pd.DataFrame({
            "cluster": np.arange(n), "method": method, "subgroup": subgroup,
            "pointing_hit": (rng.random(n) < 1 / (1 + np.exp(-linear))).astype(float),
            "energy_lift": 0.5 * linear + rng.normal(size=n),
            "log_lesion_area": case_mix, "centrality": rng.random(n), "fov_area": rng.random(n),
            "margin": rng.random(n), "correct": 1.0, "dog_lift": rng.normal(size=n)}))
    return pd.concat(parts, ignore_index=True)


def coverage(sizes, replicates: int, seed: int = 20260721) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    contrast = subgroups.Contrast("simulated", "subgroup", "reference")
    rows = []
    for n_subgroup in sizes:
        records = []
        for _ in range(replicates):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gaps = subgroups.contrast_gaps(simulate(n_subgroup, rng), contrast, models=("M1",),
                                               sensitivity_model="")
            records.append(gaps)
        table = pd.concat(records, ignore_index=True)
        for outcome, part in table.groupby("outcome", sort=False):
            estimable = part[part["estimable"]]
            covered = (estimable["ci_low"] <= 0) & (0 <= estimable["ci_high"])
            rows.append({"outcome": outcome, "n_subgroup": n_subgroup, "n_reference": 3 * n_subgroup,
                         "gaps": len(part), "estimable_share": len(estimable) / len(part),
                         "coverage_95": covered.mean() if len(estimable) else np.nan,
                         "p_below_0_05": (estimable["p"] < 0.05).mean() if len(estimable) else np.nan})
        print(pd.DataFrame(rows).tail(2).round(3).to_string(index=False, header=n_subgroup == sizes[0]),
              flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 5, 8, 10, 15, 20, 30])
    args = parser.parse_args()
    result = coverage(args.sizes, args.replicates)
    print()
    print(result.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
