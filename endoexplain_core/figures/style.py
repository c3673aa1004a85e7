"""One figure style for every notebook: fonts, sizes and the CAM colour conventions.

CAM panels: greyscale anatomy, ``inferno`` activation, cyan lesion contour, white peak marker.
Eigen-CAM is class-agnostic and is labelled with an asterisk everywhere (``method_label``).
"""

from __future__ import annotations

import matplotlib
import numpy as np

# Method names, labels and colours live in the registry (endoexplain_core.methods), not here.
from endoexplain_core.artefacts import wrap_to_width
from endoexplain_core.data.cohorts import DATASET_LABELS
from endoexplain_core.methods import METHOD_COLOURS

from endoexplain_core.presentation import ARCH_LABELS  # noqa: E402 (one home for display names)

# Architectures are told apart by marker and grey level, never by a colour that means a CAM
# method elsewhere (ConvNeXt-Tiny used to be HiResCAM's pink).
ARCH_COLOURS = {"efficientnet_b0": "#000000", "resnet34": "#555555", "convnext_tiny": "#999999",
                "resnet18": "#555555", "mobilenet_v3_large": "#999999"}
ARCH_MARKERS = {"efficientnet_b0": "o", "resnet34": "s", "convnext_tiny": "^", "resnet18": "s",
                "mobilenet_v3_large": "D"}
# Reference maps look the same in every figure: the registry's colour, dashed.
REFERENCE_LINESTYLE = "--"
RANDOM_REFERENCE = {"color": METHOD_COLOURS["random"], "linestyle": REFERENCE_LINESTYLE}

# Print sizes (inches): one column 89 mm, two columns 183 mm; no text under 6 pt at that size.
SINGLE_COLUMN_INCHES = 89 / 25.4
DOUBLE_COLUMN_INCHES = 183 / 25.4
SMALLEST_TEXT_POINTS = 6.0

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


def error_extents(estimate, low, high) -> np.ndarray:
    """matplotlib ``yerr`` (2, n) from an estimate and its interval: the distances below and
    above, never negative. An interval need not contain its estimate to the last bit (the float
    mean of equal values can exceed their max; a percentile interval may sit beside its mean);
    such a side is drawn with length 0 instead of raising."""
    estimate, low, high = (np.asarray(v, dtype=float) for v in (estimate, low, high))
    return np.vstack([np.clip(estimate - low, 0.0, None), np.clip(high - estimate, 0.0, None)])


def two_line_label(label: str) -> str:
    """A display label on two lines, so that many fit side by side without rotation: at the
    first space ("Random\\nheatmap"), else after the first hyphen ("Grad-\\nCAM++"), else before
    a final "CAM" ("HiRes\\nCAM"), else as is."""
    if " " in label:
        return label.replace(" ", "\n", 1)
    if "-" in label:
        return label.replace("-", "-\n", 1)
    at = label.find("CAM", 1)                 # "HiResCAM" -> "HiRes" / "CAM"
    return label[:at] + "\n" + label[at:] if at > 0 else label


# Text keyword arguments for a string drawn as written: names from data (file names, case ids,
# checkpoint ids, labels) may hold "$" or "\\"; mathtext would draw "price $5 and $6" as
# "price 5*and*6" and stop the figure on "math_$\\alpha^{$".
AS_WRITTEN = {"parse_math": False}


def as_written(text) -> str:
    """``str(text)`` with every ``$`` escaped (``\\$``), so that Matplotlib draws it as written
    even inside a string that has mathtext of its own (a panel title's ``$\\mathbf{A}$``) or
    reaches Matplotlib where no ``parse_math`` can be passed (legend labels). A string that is
    all data is better drawn with ``**AS_WRITTEN`` (``get_text`` then returns it unchanged),
    except with ``wrap=True``: Matplotlib measures wrapped words as mathtext whatever
    ``parse_math`` says, so such text is escaped instead."""
    return str(text).replace("$", r"\$")


def footnote(fig, text: str, *, fontsize: float = 6.5) -> None:
    """The figure's note below its axes, left-aligned and wrapped to the figure's width (a
    one-line note wider than the figure would widen the printed figure); drawn as written
    (no mathtext: notes name cases and checkpoints)."""
    fig.supxlabel(wrap_to_width(text, fig.get_figwidth(), fontsize=fontsize), fontsize=fontsize,
                  x=0.01, ha="left", **AS_WRITTEN)


def panel_title(ax, letter: str, title: str = "", **kwargs) -> None:
    """Left-aligned axes title led by a bold panel letter ("**A**  Reliability"), the same in
    every figure; ``title`` is drawn as written (``as_written``). ``kwargs`` go to
    ``Axes.set_title`` (e.g. ``pad``)."""
    text = rf"$\mathbf{{{letter}}}$" + (f"  {as_written(title)}" if title else "")
    ax.set_title(text, loc="left", **kwargs)


def checkpoint_label(checkpoint_id: str) -> str:
    """Display name of a checkpoint id: "efficientnet_b0_s1129" -> "EfficientNet-B0 s1129",
    "efficientnet_b0_shuffled_s1129" -> "EfficientNet-B0 shuffled s1129"; other ids unchanged."""
    for arch, label in ARCH_LABELS.items():
        if checkpoint_id.startswith(arch + "_"):
            return f"{label} " + checkpoint_id[len(arch) + 1:].replace("_", " ")
    return checkpoint_id


def cohort_label(dataset: str, *, synthetic: bool = False) -> str:
    """Display name of an external cohort; on the embedded synthetic cohort the name says what the
    frames are ("Synthetic ETIS-like"), so no figure of a synthetic run carries a real dataset's
    name as if it were that dataset."""
    if synthetic:
        return f"Synthetic {SHORT_COHORT_NAMES.get(dataset, DATASET_LABELS.get(dataset, dataset))}-like"
    return DATASET_LABELS.get(dataset, dataset)


SHORT_COHORT_NAMES = {"etis": "ETIS"}


def footer_lines(*lines: str) -> str:
    """The figure footer of ``artefacts.save_figure``: the non-empty lines, one per line (e.g.
    the gate's mark note and the synthetic-cohort line)."""
    return "\n".join(line for line in lines if line)


# Line style and marker per map method, so that two methods whose curves nearly coincide
# (Grad-CAM and Grad-CAM++ correlate at 0.99997 on a run's primary) both stay visible: the
# second is dashed with open markers drawn over the first's filled ones.
METHOD_LINES = {"gradcam": ("-", "o", True), "gradcampp": ((0, (4, 2)), "s", False),
                "xgradcam": ("-.", "^", True), "hirescam": (":", "D", False),
                "eigencam": ((0, (1, 1, 3, 1)), "v", True), "layercam": ("-", "P", True),
                "random": ("--", "x", True), "centre": ("--", "+", True),
                "salience": ("--", "*", True), "dog": ("--", "1", True)}


def method_line(method: str, colour: str, *, position: int = 0, every: int = 1) -> dict:
    """``Axes.plot`` keyword arguments of ``method``'s curve: its line style and marker
    (``METHOD_LINES``; open markers for the second of a look-alike pair), drawn on every
    ``every``-th point starting at ``position % every``, so that curves lying on each other
    show their markers side by side."""
    linestyle, marker, filled = METHOD_LINES.get(method, ("-", "o", True))
    return {"color": colour, "linestyle": linestyle, "marker": marker, "markersize": 3.5 if filled else 4.5,
            "markerfacecolor": colour if filled else "none", "markeredgewidth": 0.9,
            "markevery": (position % every, every) if every > 1 else None}


def near_coincident(wide, tolerance: float) -> list[tuple[str, str, float]]:
    """(first, second, largest |difference|) for each pair of columns of ``wide`` (one column per
    method, rows the points of its curve) that differ by at most ``tolerance`` everywhere:
    curves a reader cannot tell apart, named in the figure's note."""
    methods = list(wide.columns)
    pairs = []
    for i, first in enumerate(methods):
        for second in methods[i + 1:]:
            gap = float((wide[first] - wide[second]).abs().max())
            if gap <= tolerance:
                pairs.append((first, second, gap))
    return pairs


def coincidence_note(wide, tolerance: float, label) -> str:
    """" A, B and C nearly coincide (largest pairwise difference d)." per group of curves of
    ``wide`` that ``near_coincident`` pairs (connected groups, so four curves on one line are one
    sentence, not six); ``label``: method -> its display label. "" when no two curves coincide."""
    pairs = near_coincident(wide, tolerance)
    group_of = {m: {m} for pair in pairs for m in pair[:2]}
    for first, second, _ in pairs:
        merged = group_of[first] | group_of[second]
        for method in merged:
            group_of[method] = merged
    groups = {tuple(m for m in wide.columns if m in g) for g in group_of.values()}
    sentences = []
    for group in sorted(groups, key=lambda g: list(wide.columns).index(g[0])):
        gap = max(d for a, b, d in pairs if a in group and b in group)
        names = [label(m) for m in group]
        listed = " and ".join(names) if len(names) == 2 else ", ".join(names[:-1]) + " and " + names[-1]
        sentences.append(f" {listed} nearly coincide (largest pairwise difference {gap:.3f}).")
    return "".join(sentences)


def without_layercam(gate_note: str) -> str:
    """The gate's figure note for a figure that draws no LayerCAM: its sentence on the maps the
    gate does not test names only the reference maps (Figure 2 carried a note on LayerCAM,
    which it does not plot)."""
    return gate_note.replace("LayerCAM and the reference maps are not tested",
                             "The reference maps are not tested")
