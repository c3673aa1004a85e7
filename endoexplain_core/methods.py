"""The method registry: every CAM method and baseline map the audit knows, in one table.

Nothing else in the package defines method names, labels or colours; modules import the
tuples below. ``MAP_METHODS`` order is the row order of every case table and summary.

Columns of ``REGISTRY``:
  label           display name (Eigen-CAM carries the class-agnostic asterisk)
  colour          one colour per method, shared by every figure
  kind            "cam" (computed from the model; the paper's five), "extended" (computed from
                  the model by the same fused pass, used only by the extended analyses, never a
                  Table 4 row), "baseline" (model-free reference map of the audit) or
                  "extended_baseline" (model-free reference map of the extended analyses only)
  gradient_based  needs the gradient of the target logit at the target layer
  class_agnostic  ignores the target class (Eigen-CAM)

Which methods coincide by construction at a given layer depends on the architecture; that
rule is ``models.networks.identical_methods``.
"""

from __future__ import annotations

from dataclasses import dataclass

from endoexplain_core.marks import NOT_VALIDATED_MARK


@dataclass(frozen=True)
class MapMethod:
    name: str
    label: str
    colour: str
    kind: str
    gradient_based: bool
    class_agnostic: bool


REGISTRY: tuple[MapMethod, ...] = (
    MapMethod("gradcam", "Grad-CAM", "#1b9e77", "cam", True, False),
    MapMethod("gradcampp", "Grad-CAM++", "#d95f02", "cam", True, False),
    MapMethod("xgradcam", "XGrad-CAM", "#7570b3", "cam", True, False),
    MapMethod("hirescam", "HiResCAM", "#e7298a", "cam", True, False),
    MapMethod("eigencam", "Eigen-CAM*", "#666666", "cam", False, True),
    MapMethod("layercam", "LayerCAM", "#1f78b4", "extended", True, False),
    MapMethod("random", "Random heatmap", "#a6761d", "baseline", False, True),
    MapMethod("centre", "Centre baseline", "#e6ab02", "baseline", False, True),
    # The frame's own smoothed gradient magnitude (kernels.baselines.salience_map): maps can
    # follow what is salient whether or not the model uses it, so a method must beat it too.
    MapMethod("salience", "Salience baseline", "#66a61e", "baseline", False, True),
    MapMethod("dog", "DoG conspicuity", "#000000", "extended_baseline", False, True),
)

# The paper's five CAM methods (Table 4 rows, in this order).
CAM_METHODS = tuple(m.name for m in REGISTRY if m.kind == "cam")
GRADIENT_METHODS = tuple(m.name for m in REGISTRY if m.gradient_based and m.kind == "cam")
# CAMs beyond the paper's five, from the same fused pass (extended localisation only).
EXTENDED_CAM_METHODS = tuple(m.name for m in REGISTRY if m.kind == "extended")
FUSED_CAM_METHODS = CAM_METHODS + EXTENDED_CAM_METHODS
FUSED_GRADIENT_METHODS = tuple(m.name for m in REGISTRY if m.gradient_based)
# The image-only difference-of-Gaussians map of the extended analyses (kernels.localisation).
EXTENDED_BASELINE_METHODS = tuple(m.name for m in REGISTRY if m.kind == "extended_baseline")
BASELINE_METHODS = tuple(m.name for m in REGISTRY if m.kind == "baseline")
MAP_METHODS = CAM_METHODS + BASELINE_METHODS
# The random-deletion control is a Table 4 row but not a map.
RANDOM_DELETION = "random_deletion"

METHOD_LABELS = {m.name: m.label for m in REGISTRY} | {RANDOM_DELETION: "Random deletion"}
METHOD_COLOURS = {m.name: m.colour for m in REGISTRY}


def method_label(method: str, not_validated=()) -> str:
    """Display name of a map method; Eigen-CAM carries its class-agnostic asterisk, and a method
    in ``not_validated`` (the validity gate's failing methods) ends with ``NOT_VALIDATED_MARK``."""
    label = METHOD_LABELS.get(method, method)
    return f"{label}{NOT_VALIDATED_MARK}" if method in not_validated else label


def labelled(table):
    """``table`` (a DataFrame with a ``method`` column) with the methods' display names."""
    return table.assign(method=table["method"].map(method_label))
