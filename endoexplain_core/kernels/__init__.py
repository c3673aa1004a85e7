"""Torch kernels of the audit (CAMs, thresholds, metrics, baselines, deletion, localisation).

The localisation scores are re-exported here (``from endoexplain_core.kernels import
auc_iou``); the other kernels are used as modules (``from endoexplain_core.kernels import cams``).
Protocol values (fractions, repetitions, noise, alpha) have no defaults here: they come from the
profile (``endoexplain_core.config``), so a forgotten argument is an error, not a silent value.
Methods: docs/maps_and_scores.md, one section per kernel.
"""

from endoexplain_core.kernels.localisation import (  # noqa: F401 (re-export)
    DEFAULT_IOU_THRESHOLDS, TOP_K_FRACTIONS, auc_iou, c_score, dog_conspicuity,
    energy_lift_bits, field_of_view, gaussian_smooth, iou_curve, pointing_hits, saliency_free,
    soft_iou, tolerance_zone, top_k_sweep,
)
