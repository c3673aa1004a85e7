"""One figure style for every notebook: fonts, sizes and the CAM colour conventions.

CAM panels: greyscale anatomy, ``inferno`` activation, cyan lesion contour, white peak marker.
Eigen-CAM is class-agnostic and is labelled with an asterisk everywhere (``method_label``).
"""

from __future__ import annotations

import matplotlib

CAM_METHODS = ("gradcam", "gradcampp", "xgradcam", "hirescam", "eigencam")
BASELINES = ("random", "centre")

METHOD_LABELS = {
    "gradcam": "Grad-CAM",
    "gradcampp": "Grad-CAM++",
    "xgradcam": "XGrad-CAM",
    "hirescam": "HiResCAM",
    "eigencam": "Eigen-CAM*",
    "random": "Random heatmap",
    "centre": "Centre baseline",
    "random_deletion": "Random deletion",
}

METHOD_COLOURS = {
    "gradcam": "#1b9e77",
    "gradcampp": "#d95f02",
    "xgradcam": "#7570b3",
    "hirescam": "#e7298a",
    "eigencam": "#666666",
    "random": "#a6761d",
    "centre": "#e6ab02",
}

ARCH_LABELS = {"efficientnet_b0": "EfficientNet-B0", "resnet34": "ResNet-34",
               "convnext_tiny": "ConvNeXt-Tiny"}

HEATMAP_CMAP = "inferno"
CONTOUR_COLOUR = "cyan"
PEAK_COLOUR = "white"
EIGEN_FOOTNOTE = "* Eigen-CAM is class-agnostic (no target class)."


def method_label(method: str) -> str:
    """Display name of a map method; Eigen-CAM carries its class-agnostic asterisk."""
    return METHOD_LABELS.get(method, method)


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
