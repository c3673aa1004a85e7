"""Does the primary's Table 4 depend on the target layer, and is XGrad-CAM well posed?

The primary re-audited at its neighbouring layer (``NEIGHBOUR_LAYERS``) on the same images,
beside each layer's channel-weight diagnostics (near-zero activation sums S_c, weight ratios to
Grad-CAM, the ``ill_posed`` rule). Method: docs/statistics_and_gate.md, "Layer sensitivity and
XGrad-CAM's conditioning".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from endoexplain_core.run_layout import RunLayout
from endoexplain_core.analysis import audit, audit_inputs, audit_schema, summaries
from endoexplain_core.data.datasets import load_manifest
from endoexplain_core.kernels import cams
from endoexplain_core.methods import CAM_METHODS, method_label
from endoexplain_core.models import networks

NEIGHBOUR_LAYERS = {"efficientnet_b0": "features.8", "resnet34": "layer4.1",
                    "convnext_tiny": "features.7.1", "resnet18": "layer4.0",
                    "mobilenet_v3_large": "features.16"}
NEAR_ZERO_FRACTION = 0.01
ILL_POSED_SHARE = 0.05
ILL_POSED_RATIO_P99 = 10.0   # 1% of (image, channel) weights over 10x Grad-CAM's: not a reweighting, a blow-up


def weight_diagnostics(activation: torch.Tensor, gradient: torch.Tensor) -> dict[str, np.ndarray]:
    """Channel diagnostics of one batch: ``near_zero`` and ``negative`` bool (B, C) (|S_c| near
    zero; S_c < 0) and, per channel-weight method, the weight ratio to Grad-CAM as float64
    (B, C) (NaN where Grad-CAM's weight is 0).

    ``activation``, ``gradient``: the target layer's A and d logit / dA, (B, C, h, w).
    """
    channel_sum = activation.double().sum(dim=(2, 3))                           # S_c, (B, C)
    median = channel_sum.abs().median(dim=1, keepdim=True).values
    near_zero = (channel_sum.abs() < NEAR_ZERO_FRACTION * median).numpy()
    weights = {m: w.double().abs().numpy() for m, w in cams.channel_weights(activation, gradient).items()}
    reference = weights["gradcam"]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = {m: np.where(reference > 0, w / reference, np.nan) for m, w in weights.items()}
    return {"near_zero": near_zero, "negative": (channel_sum < 0).numpy(), **ratios}


def layer_diagnostics(model: torch.nn.Module, layers: dict[str, torch.nn.Module], batches
                      ) -> dict[str, dict[str, float]]:
    """Per layer (name -> module), over image ``batches`` (an iterable of normalised
    (B, 3, S, S) tensors on the model's device, read once for every layer): the shares of
    near-zero and of negative channel sums and, per channel-weight method, the median, 99th
    percentile and maximum of its weight ratio to Grad-CAM over every (image, channel)."""
    parts = {name: {"near_zero": [], "negative": [], **{m: [] for m in cams.CHANNEL_WEIGHT_METHODS}}
             for name in layers}
    for images in batches:
        for name, layer in layers.items():
            activation, gradient = cams.activation_and_gradient(model, layer, images)
            for key, values in weight_diagnostics(activation.cpu(), gradient.cpu()).items():
                parts[name][key].append(values.ravel())
    result = {}
    for name, collected in parts.items():
        joined = {key: np.concatenate(values) if values else np.array([]) for key, values in collected.items()}
        facts = {f"{kind}_channel_share": float(joined[kind].mean()) if len(joined[kind]) else np.nan
                 for kind in ("near_zero", "negative")}
        for method in cams.CHANNEL_WEIGHT_METHODS:
            values = joined[method][np.isfinite(joined[method])]
            for label, summary in (("median", np.median), ("p99", lambda v: np.percentile(v, 99)), ("max", np.max)):
                facts[f"{method}_ratio_{label}"] = float(summary(values)) if len(values) else np.nan
        result[name] = facts
    return result


def layer_sensitivity_table(panels: dict[str, pd.DataFrame], diagnostics: dict[str, dict],
                            identical: dict[str, list]) -> pd.DataFrame:
    """One row per (layer, panel, CAM): Table 4 columns (``summaries.spatial_audit_summary``: panel A, the
    high-score images, and B, all images) beside the layer's weight diagnostics. ``panels``,
    ``diagnostics``, ``identical``: layer name -> Table 4 frame / ``layer_diagnostics`` dict /
    groups identical by construction there.

    Columns: layer, panel, method, label, n, n_constant, peak_failure (+ Wilson CI),
    peak_failure_defined, iou (+ CI), near_zero_channel_share, negative_channel_share,
    weight_ratio_median, weight_ratio_p99, weight_ratio_max (to Grad-CAM; NaN without channel
    weights), identical_with, ill_posed
    (XGrad-CAM where the near-zero share exceeds ``ILL_POSED_SHARE`` or its weight ratio's 99th
    percentile exceeds ``ILL_POSED_RATIO_P99``).
    """
    rows = []
    for layer, panel in panels.items():
        facts = diagnostics[layer]
        for row in panel[panel["method"].isin(CAM_METHODS)].itertuples():
            has_weights = row.method in cams.CHANNEL_WEIGHT_METHODS
            rows.append({
                "layer": layer, "panel": row.panel, "method": row.method, "label": method_label(row.method), "n": row.n,
                "n_constant": row.n_constant, "peak_failure": row.peak_failure,
                "peak_failure_ci_low": row.peak_failure_ci_low,
                "peak_failure_ci_high": row.peak_failure_ci_high,
                "peak_failure_defined": row.peak_failure_defined,
                "iou": row.iou, "iou_ci_low": row.iou_ci_low, "iou_ci_high": row.iou_ci_high,
                "near_zero_channel_share": facts["near_zero_channel_share"],
                "negative_channel_share": facts["negative_channel_share"],
                "weight_ratio_median": facts[f"{row.method}_ratio_median"] if has_weights else np.nan,
                "weight_ratio_p99": facts[f"{row.method}_ratio_p99"] if has_weights else np.nan,
                "weight_ratio_max": facts[f"{row.method}_ratio_max"] if has_weights else np.nan,
                "identical_with": summaries.identical_with_text(row.method, identical.get(layer, ())),
                "ill_posed": bool(row.method == "xgradcam" and has_weights
                                  and (facts["near_zero_channel_share"] > ILL_POSED_SHARE
                                       or facts["xgradcam_ratio_p99"] > ILL_POSED_RATIO_P99))})
    return pd.DataFrame(rows)


def run_layer_sensitivity(run_dir: str | Path, data_root: str | Path, primary: pd.DataFrame,
                          random_deletion: pd.DataFrame, *, image_size: int, score_threshold: float,
                          top_fraction: float, batch_size: int, device: str,
                          replicates: int,
                          seed: int) -> pd.DataFrame:
    """Audit the primary (``primary``: its audit rows at the protocol layer, with
    ``random_deletion``) at its neighbour layer, compute both layers' weight diagnostics over
    every audit image (they describe the layer, not a population) and return
    ``layer_sensitivity_table`` with panels A and B. The neighbour audit is written to
    ``<run_dir>/audit/hyperkvasir_layer_<name>/`` (one random deletion per image: only the map
    outcomes are compared)."""
    run_dir = Path(run_dir)
    checkpoint_id = str(primary["checkpoint_id"].iloc[0])
    layout = RunLayout(run_dir)
    model, metadata, temperature = audit.load_calibrated_model(run_dir, checkpoint_id, image_size, device)
    protocol = networks.resolve_target_layer(model, metadata["arch"], metadata.get("target_layer"))
    neighbour = networks.resolve_target_layer(model, metadata["arch"], NEIGHBOUR_LAYERS[metadata["arch"]])
    pool = audit_inputs.masked_pool(load_manifest(layout.manifest))
    paths = layout.audit_paths(f"hyperkvasir_layer_{neighbour[0]}", checkpoint_id)
    audit.audit_checkpoint(model, metadata, temperature,
                           audit_inputs.manifest_cases(pool, data_root, decode_size=image_size),
                           dataset="hyperkvasir", image_size=image_size, table_path=paths["table"],
                           random_deletion_path=paths["random_deletion"], top_fraction=top_fraction,
                           repetitions=1, batch_size=batch_size, device=device,
                           target_layer=neighbour, total=len(pool))
    neighbour_table = audit_schema.read_audit_table(paths["table"])
    # the scores do not depend on the layer, so both layers' panels hold the same images
    panels = {protocol[0]: summaries.spatial_audit_summary(primary, random_deletion, score_threshold, replicates, seed),
              neighbour[0]: summaries.spatial_audit_summary(neighbour_table, audit_schema.read_random_deletion(paths["random_deletion"]),
                                             score_threshold, replicates, seed)}
    torch_device = next(model.parameters()).device
    batches = (images.to(torch_device) for _, images, _ in audit_inputs.prepared_batches(
        audit_inputs.manifest_cases(pool, data_root, decode_size=image_size), image_size, batch_size,
        excluded=[]))
    # the layers' weights over every audit image (one decode for both layers)
    diagnostics = layer_diagnostics(model, dict((protocol, neighbour)), batches)
    identical = {name: networks.identical_methods(model, name) for name in (protocol[0], neighbour[0])}
    return layer_sensitivity_table(panels, diagnostics, identical)


# the per-layer diagnostics notebook 05 shows beside the layer table
LAYER_DIAGNOSTICS = ["layer", "label", "near_zero_channel_share", "negative_channel_share", "weight_ratio_median",
                     "weight_ratio_p99", "weight_ratio_max", "ill_posed"]


def describe(layers: pd.DataFrame) -> str:
    """The layers at which XGrad-CAM is ill-posed (``run_layer_sensitivity``'s flag)."""
    ill_posed = sorted(set(layers.loc[layers["ill_posed"], "layer"]))
    return (f"XGrad-CAM ill-posed (near-zero channel share > {ILL_POSED_SHARE:.0%}, or its weight ratio to "
            f"Grad-CAM's above {ILL_POSED_RATIO_P99:.0f} at the 99th percentile) at: "
            f"{', '.join(ill_posed) or 'neither layer'}.")
