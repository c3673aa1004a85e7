"""Small fixed inputs for every paper figure (used by tests/test_figures.py).

Each builder returns the tables a figure function takes, with values in the ranges of a real
run (rates at 0 and 1, an empty threshold, an architecture with no eligible image, a constant
map) so that the edge cases a reviewer would notice are drawn.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from endoexplain_core import config
from endoexplain_core.kernels import road
from endoexplain_core.methods import BASELINE_METHODS, CAM_METHODS, MAP_METHODS

ROAD_FRACTIONS = tuple(config.FaithfulnessSettings().road_fractions)  # the profile default


def reliability_table() -> pd.DataFrame:
    rows = []
    counts = {"Raw": [60, 2, 0, 1, 0, 0, 1, 0, 3, 80], "Temperature-scaled": [58, 3, 1, 0, 1, 0, 1, 2, 4, 77]}
    for kind, per_bin in counts.items():
        for b, n in enumerate(per_bin):
            mean = (b + 0.5) / 10 if n else np.nan
            observed = (0.0 if b == 0 else 1.0 if b == 9 else min(1.0, (b + 2) / 10)) if n else np.nan
            rows.append({"checkpoint_id": "efficientnet_b0_s2089", "split": "test", "score": kind,
                         "bin": b, "lower": b / 10, "upper": (b + 1) / 10, "count": n,
                         "mean_score": mean if b < 9 else 0.995, "observed_frequency": observed})
    return pd.DataFrame(rows)


def threshold_table(empty_last: bool = True) -> pd.DataFrame:
    rows = []
    eligible = {0.80: 70, 0.85: 64, 0.90: 59, 0.95: 0 if empty_last else 40}
    rates = {"gradcam": 0.5, "gradcampp": 0.04, "xgradcam": 1.0, "hirescam": 1.0,
             "eigencam": 0.04, "random": 0.83, "centre": 0.47}
    for threshold, n in eligible.items():
        for method, rate in rates.items():
            low, high = (max(0.0, rate - 0.1), min(1.0, rate + 0.1)) if n else (np.nan, np.nan)
            rows.append({"score_threshold": threshold, "method": method, "n_eligible": n,
                         "failure_rate": rate if n else np.nan, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows)


def robustness_table() -> pd.DataFrame:
    """Nine checkpoints + control; ResNet-34 has no eligible image on its own subset."""
    rng = np.random.default_rng(0)
    rows = []
    for arch in ("efficientnet_b0", "resnet34", "convnext_tiny"):
        for seed in (1129, 2089, 3253):
            n_own = 0 if arch == "resnet34" else int(rng.integers(20, 60))
            identical = {"resnet34": ("gradcam", "hirescam", "xgradcam"),
                         "convnext_tiny": ("gradcam", "hirescam")}.get(arch, ())
            for method in MAP_METHODS:
                same = " = ".join(m for m in identical if m != method) if method in identical else ""
                rows.append({"checkpoint_id": f"{arch}_s{seed}", "arch": arch, "seed": seed,
                             "control": "none", "method": method, "n_own": n_own,
                             "failure_own": float(rng.uniform()) if n_own else np.nan,
                             "n_fixed": 59, "failure_fixed": float(rng.uniform()),
                             "logit_drop_all": float(rng.normal(0.3, 0.5)) if method in CAM_METHODS else np.nan,
                             "random_deletion_mean": 0.56, "temperature": 20.0 if (arch, seed) == ("resnet34", 1129) else 1.1,
                             "temperature_at_bound": (arch, seed) == ("resnet34", 1129),
                             "identical_with": same})
    return pd.DataFrame(rows)


def transfer_summary() -> pd.DataFrame:
    rows = []
    for dataset, n, eligible in (("etis", 193, 16), ("polypgen", 1410, 342), ("polypdb", 3934, 748)):
        for k, method in enumerate(MAP_METHODS):
            mean = 0.08 + 0.02 * k
            rows.append({"dataset": dataset, "method": method, "n_cases": n, "n_eligible": eligible,
                         "mean_iou": mean, "ci_low": mean - 0.01, "ci_high": mean + 0.012,
                         "centre_baseline_iou": 0.08 + 0.02 * MAP_METHODS.index("centre")})
    return pd.DataFrame(rows)


def training_curves() -> pd.DataFrame:
    rows = []
    for arch in ("efficientnet_b0", "resnet34", "convnext_tiny"):
        for seed in (1129, 2089, 3253):
            for epoch in (1, 2, 3):
                rows.append({"checkpoint_id": f"{arch}_s{seed}", "arch": arch, "seed": seed,
                             "control": "none", "epoch": epoch, "train_loss": 0.7 / epoch,
                             "val_auprc": min(1.0, 0.6 + 0.1 * epoch + 0.01 * (seed % 7))})
    for epoch in (1, 2, 3):
        rows.append({"checkpoint_id": "efficientnet_b0_shuffled_s1129", "arch": "efficientnet_b0",
                     "seed": 1129, "control": "shuffled_labels", "epoch": epoch,
                     "train_loss": 0.69, "val_auprc": 0.3})
    return pd.DataFrame(rows)


def figure3_rows(size: int = 32) -> list[dict]:
    """One drawn row (discordant) with a constant HiResCAM map, an Eigen-CAM map whose maximum
    is tied over many pixels, a peak on the frame edge and the baselines."""
    from endoexplain_core.methods import MAP_METHODS

    yy, xx = np.mgrid[0:size, 0:size]
    mask = (yy - 12) ** 2 + (xx - 14) ** 2 < 36
    rgb = np.stack([np.full((size, size), 0.6), np.full((size, size), 0.3), np.full((size, size), 0.3)], -1)
    maps = {}
    for k, method in enumerate(MAP_METHODS):
        heat = np.exp(-((yy - 4 * k) ** 2 + (xx - (size - 1)) ** 2) / 60.0)
        maps[method] = heat / heat.max()
    maps["hirescam"] = np.zeros((size, size))
    maps["eigencam"] = np.minimum(1.0, 1.5 * maps["eigencam"])      # a plateau: tied maxima
    tops = {m: v >= np.quantile(v, 0.8) for m, v in maps.items()}
    rows = {m: {"iou": 0.1 * k, "constant_map": m == "hirescam", "peak_outside_mask": k % 2 == 0,
                "distance": 0.0 if k % 2 else 7.4}
            for k, m in enumerate(MAP_METHODS)}
    return [{"role": "discordant", "sample_id": "0a1b2c3d-4e5f-6789-abcd-ef0123456789",
             "score": 0.9996, "rgb": rgb, "mask": mask, "maps": maps, "tops": tops, "rows": rows}]


# --- inputs shaped like the default run's (the figures two readers returned, issue 52) -------

def default_reliability_table() -> pd.DataFrame:
    """110 test images; adjacent scaled bins of 3 and 32 images (printed "3 32" as one number)."""
    counts = {"Raw": [30, 4, 2, 1, 0, 1, 2, 4, 30, 36], "Temperature-scaled": [33, 2, 1, 0, 1, 2, 1, 3, 32, 35]}
    rows = []
    for kind, per_bin in counts.items():
        for b, n in enumerate(per_bin):
            rows.append({"checkpoint_id": "efficientnet_b0_s2089", "split": "test", "score": kind, "bin": b,
                         "lower": b / 10, "upper": (b + 1) / 10, "count": n,
                         "mean_score": (b + 0.5) / 10 if n else np.nan,
                         "observed_frequency": min(1.0, max(0.0, (b - 0.5) / 9)) if n else np.nan})
    return pd.DataFrame(rows)


def default_ece_intervals() -> pd.DataFrame:
    return pd.DataFrame({"score": ["Raw", "Temperature-scaled", "Change (scaled - raw)"], "n": 110,
                         "ece": [0.061, 0.048, -0.013], "ci_low": [0.031, 0.022, -0.041],
                         "ci_high": [0.094, 0.079, 0.012]})


def default_threshold_table() -> pd.DataFrame:
    """Eligible n 110, 110, 109, 95 at thresholds 0.80-0.95 (printed "n=110n=110n=109n=95");
    every map method of the run, baselines included."""
    rows = []
    eligible = {0.80: 110, 0.85: 110, 0.90: 109, 0.95: 95}
    rates = dict(zip(MAP_METHODS, (0.26, 0.26, 0.31, 0.95, 0.26, 0.86, 0.19, 0.44)))
    for threshold, n in eligible.items():
        for method, rate in rates.items():
            rows.append({"score_threshold": threshold, "method": method, "n_eligible": n, "failure_rate": rate,
                         "ci_low": max(0.0, rate - 0.08), "ci_high": min(1.0, rate + 0.08)})
    return pd.DataFrame(rows)


def default_robustness_table() -> pd.DataFrame:
    """EfficientNet-B0 (gated), ResNet-18 and MobileNetV3-Large, three seeds each, every map method;
    temperatures 0.05 to 0.87 (raw logits of very different scales); two EfficientNet seeds fail
    more often than the centre baseline."""
    rng = np.random.default_rng(52)
    temperatures = iter(np.linspace(0.05, 0.87, 9))
    rows = []
    for arch in ("efficientnet_b0", "resnet18", "mobilenet_v3_large"):
        for seed in (1129, 2089, 3253):
            temperature = float(next(temperatures))
            identical = {"resnet18": ("gradcam", "hirescam")}.get(arch, ())
            for method in MAP_METHODS:
                same = " = ".join(m for m in identical if m != method) if method in identical else ""
                base = {"centre": 0.19, "random": 0.86, "salience": 0.44}.get(method)
                rows.append({"checkpoint_id": f"{arch}_s{seed}", "arch": arch, "seed": seed, "control": "none",
                             "method": method, "n_own": int(rng.integers(90, 110)),
                             "failure_own": base if base is not None else float(rng.uniform(0.1, 0.5)),
                             "n_fixed": 109, "failure_fixed": base if base is not None else float(rng.uniform(0.1, 0.5)),
                             "logit_drop_all": float(rng.normal(2.0, 0.6)) * temperature if method in CAM_METHODS else np.nan,
                             "random_deletion_mean": 0.4 * temperature, "temperature": temperature,
                             "temperature_at_bound": False, "identical_with": same})
    return pd.DataFrame(rows)


# --- supplementary figures (notebooks 07 and 08) ----------------------------------------------

def road_curves() -> pd.DataFrame:
    """MoRF/LeRF curves of one checkpoint; XGrad-CAM coincides with Grad-CAM (drawn once)."""
    slopes = {"gradcam": 3.0, "gradcampp": 2.5, "xgradcam": 3.0, "hirescam": 1.5, "eigencam": 2.0,
              "random": 1.0}
    return pd.DataFrame([{"checkpoint_id": "efficientnet_b0_s2089", "method": m, "order": o,
                          "fraction": f, "drop": slope * f * (1 if o == "morf" else 0.3),
                          "ci_low": 0.8 * slope * f * (1 if o == "morf" else 0.3) - 0.01,
                          "ci_high": 1.2 * slope * f * (1 if o == "morf" else 0.3) + 0.01}
                         for m, slope in slopes.items() for o in road.ORDERS for f in ROAD_FRACTIONS])


def srg_table() -> pd.DataFrame:
    methods = list(CAM_METHODS) + ["random"]
    estimates = [0.5, 0.42, 0.31, -0.05, 0.2, 0.0]
    return pd.DataFrame({"checkpoint_id": "efficientnet_b0_s2089", "method": methods, "srg": estimates,
                         "ci_low": [e - 0.15 for e in estimates], "ci_high": [e + 0.15 for e in estimates]})


def shape_table() -> pd.DataFrame:
    estimates = [0.4, 0.35, 0.2, -0.1, 0.3]
    return pd.DataFrame({"checkpoint_id": "efficientnet_b0_s2089", "method": list(CAM_METHODS),
                         "cam_minus_shifted": estimates, "ci_low": [e - 0.2 for e in estimates],
                         "ci_high": [e + 0.2 for e in estimates],
                         "cam_minus_pixel_random": [e + 0.4 for e in estimates],
                         "pixel_ci_low": [e + 0.2 for e in estimates],
                         "pixel_ci_high": [e + 0.6 for e in estimates]})


def randomisation_table() -> pd.DataFrame:
    """Cascading randomisation of an EfficientNet-B0: eleven steps, head first."""
    blocks = ["trained", "classifier"] + [f"features.{k}" for k in range(8, -1, -1)]
    return pd.DataFrame([{"checkpoint_id": "efficientnet_b0_s2089", "step": step, "block": block,
                          "method": m, "spearman": 1.0 if step == 0 else float(np.cos(step + k)) * 0.8,
                          "top_iou": 1.0 if step == 0 else 0.1 + 0.05 * ((step + k) % 5)}
                         for step, block in enumerate(blocks) for k, m in enumerate(CAM_METHODS)])


def subgroup_gaps() -> pd.DataFrame:
    """Adjusted gaps of two contrasts; one not estimable (separated), one equivalent to 0."""
    rows = []
    for contrast in ("PolypGen C3 vs rest", "PolypDB NBI vs WLI"):
        for outcome, scale in (("energy_lift", 0.3), ("pointing_hit", 8.0)):
            for k, m in enumerate(CAM_METHODS):
                gap = scale * (k - 2) / 2
                separated = contrast.startswith("PolypGen") and m == "hirescam"
                rows.append({"contrast": contrast, "outcome": outcome, "model": "M1", "slopes": "shared",
                             "method": m, "gap": np.nan if separated else gap,
                             "ci_low": gap - scale, "ci_high": gap + scale,
                             "ci90_low": gap - 0.8 * scale, "ci90_high": gap + 0.8 * scale,
                             "tost_equivalent": k == 2})
    return pd.DataFrame(rows)


EXTENDED_FIGURE_METHODS = (*CAM_METHODS, "layercam", "random", "centre", "dog")


def iou_curves() -> tuple[pd.DataFrame, pd.DataFrame]:
    thresholds = np.round(np.arange(0.05, 0.96, 0.05), 2)
    curves = pd.DataFrame([{"method": m, "iou_threshold": t, "mean_iou": max(0.0, 0.4 - 0.3 * t - 0.03 * k),
                            "n": 90} for k, m in enumerate(EXTENDED_FIGURE_METHODS) for t in thresholds])
    auc = curves.groupby("method", sort=False)["mean_iou"].mean().rename("auc_iou").reset_index()
    return curves, auc


def energy_table() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame([{"method": m, "sample_id": f"s{i}", "energy_lift_bits": float(rng.normal(1.0 - 0.1 * k, 0.8))}
                         for k, m in enumerate(EXTENDED_FIGURE_METHODS) for i in range(40)])


def c_scores() -> pd.DataFrame:
    rows = []
    for class_name, shift in (("polyp", 0.0), ("negative", 0.1)):
        for arch in ("efficientnet_b0", "resnet34", "convnext_tiny"):
            for seed in (1129, 2089, 3253):
                for k, m in enumerate(EXTENDED_FIGURE_METHODS):
                    rows.append({"checkpoint_id": f"{arch}_s{seed}", "class": class_name, "method": m,
                                 "n_gold": 40 + seed % 7 + int(100 * shift),
                                 "c_score": 1.0 if m == "centre" else 0.3 + 0.05 * k + shift,
                                 "c_score_native": 0.5 if m == "random" else np.nan})
    return pd.DataFrame(rows)


def top_k_sweep() -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "fraction": f, "mean_iou": 0.3 * f / (0.1 + f) - 0.02 * k,
                          "mean_energy": 0.6 - 0.03 * k - 0.2 * f, "n": 90}
                         for k, m in enumerate(EXTENDED_FIGURE_METHODS) for f in (0.05, 0.1, 0.2, 0.3, 0.5)])


__all__ = ["reliability_table", "threshold_table", "robustness_table", "transfer_summary",
           "training_curves", "figure3_rows", "road_curves", "srg_table", "shape_table",
           "randomisation_table", "subgroup_gaps", "iou_curves", "energy_table", "c_scores",
           "top_k_sweep", "default_reliability_table", "default_ece_intervals", "default_threshold_table",
           "default_robustness_table", "BASELINE_METHODS"]
