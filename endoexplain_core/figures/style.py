"""One figure style for every notebook: fonts, sizes and the CAM colour conventions.

CAM panels: greyscale anatomy, ``inferno`` activation, cyan lesion contour, white peak marker.
Eigen-CAM is class-agnostic and is labelled with an asterisk everywhere (``method_label``).
"""

from __future__ import annotations

import matplotlib

# Method names, labels and colours live in the registry (endoexplain_core.methods).
from endoexplain_core.methods import (  # noqa: E402  (re-exported for figures)
    BASELINE_METHODS as BASELINES, CAM_METHODS, EIGEN_FOOTNOTE, METHOD_COLOURS, METHOD_LABELS,
    method_label,
)

ARCH_LABELS = {"efficientnet_b0": "EfficientNet-B0", "resnet34": "ResNet-34",
               "convnext_tiny": "ConvNeXt-Tiny"}

# Architectures are told apart by marker and grey level, never by a colour that means a CAM
# method elsewhere (ConvNeXt-Tiny used to be HiResCAM's pink).
ARCH_COLOURS = {"efficientnet_b0": "#000000", "resnet34": "#555555", "convnext_tiny": "#999999"}
ARCH_MARKERS = {"efficientnet_b0": "o", "resnet34": "s", "convnext_tiny": "^"}
# Reference maps look the same in every figure: the registry's colour, dashed.
REFERENCE_LINESTYLE = "--"
RANDOM_REFERENCE = {"color": METHOD_COLOURS["random"], "linestyle": REFERENCE_LINESTYLE}

HEATMAP_CMAP = "inferno"
CONTOUR_COLOUR = "cyan"
PEAK_COLOUR = "white"


def apply() -> None:
    """Set the shared Matplotlib style (call once at the top of a notebook)."""
    matplotlib.rcParams.update({
        "font.family": "DejaVu Sans",
        "font.size": 9,
        "axes.titlesize": 9,
        "axes.labelsize": 9,
        "xtick.labelsize": 8,
        "ytick.labelsize": 8,
        "legend.fontsize": 8,
        "figure.dpi": 110,
        "savefig.dpi": 300,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "pdf.fonttype": 42,
    })
