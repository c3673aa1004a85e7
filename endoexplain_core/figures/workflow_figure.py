"""Figure 1: the endoExplain workflow (one box per evidence notebook) and the exclusion flow of
the masked audit images, drawn with Matplotlib patches and arrows; every count is passed in
from the run. Method: docs/maps_and_scores.md, "Figures".
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from endoexplain_core.methods import CAM_METHODS
from endoexplain_core.figures import style
from endoexplain_core import artefacts

COLUMNS = 3
BOX_WIDTH, BOX_HEIGHT, GAP_X, GAP_Y = 2.2, 0.84, 0.3, 0.3     # inches: the axes is drawn 1:1
FLOW_WIDTH, FLOW_HEIGHT, FLOW_GAP = 1.18, 0.62, 0.255
STAGE_FACE, STAGE_EDGE, STAGE_TEXT = "#eef3f8", "#33506e", "#1d3349"
GATE_FACE = {"passes": "#e8f3e8", "fails": "#f8e6e6", "inconclusive": "#fbf1dc"}


@dataclass(frozen=True)
class Step:
    """One box: the notebook that computes it, a title and a short body text."""

    notebook: str
    title: str
    body: str
    face: str = STAGE_FACE


@dataclass(frozen=True)
class FlowStep:
    """One box of the exclusion flow: what is counted, its count, and what left at this step
    (e.g. "3 without a mask"; "" when nothing did)."""

    label: str
    n: int
    excluded: str = ""


def gate_summary(gate) -> tuple[str, str]:
    """(one-line verdict, box colour) of the validity gate table (``table_validity_gate``), e.g.
    ("0 of 5 CAMs pass (5 inconclusive)", ...); ("not run", grey) when ``gate`` is None."""
    if gate is None:
        return "not run", STAGE_FACE
    cams = gate[gate["method"].isin(CAM_METHODS)]
    passing = int(cams["passes"].sum())
    others = cams.loc[~cams["passes"].astype(bool), "verdict"].value_counts()
    detail = ", ".join(f"{n} {verdict}" for verdict, n in others.items())
    verdict = "passes" if passing == len(cams) else ("inconclusive" if "inconclusive" in others else "fails")
    return f"{passing} of {len(cams)} CAMs pass" + (f" ({detail})" if detail else ""), GATE_FACE[verdict]


def workflow_steps(role_counts: dict[str, int] | None = None, n_checkpoints: int | None = None,
                   cohort_names: list[str] | None = None, gate=None) -> list[Step]:
    """The nine evidence steps of the protocol (notebooks 00-08), with run counts where given:
    ``role_counts`` (manifest rows per role), ``n_checkpoints`` (including the control),
    ``cohort_names`` (external cohorts' display names), ``gate`` (the validity gate table: its
    verdict is stated in the gate box and colours it)."""
    roles = ("train / val / test / audit pool" if role_counts is None else
             " / ".join(f"{role_counts.get(r, 0)}" for r in ("train", "val", "test", "spatial_audit"))
             + "\n(train / val / test / audit)")
    checkpoints = ("3 architectures \u00d7 3 seeds" if n_checkpoints is None else
                   f"{n_checkpoints} checkpoint{'s' if n_checkpoints != 1 else ''}: 3 arch. \u00d7 3 seeds")
    cohorts = "external masked cohorts" if not cohort_names else ", ".join(cohort_names)
    verdict, gate_face = gate_summary(gate)
    return [
        Step("00", "Content-defined roles", f"SHA-256 + average-hash groups\n{roles}"),
        Step("01", "Training", f"{checkpoints}\n+ shuffled-label control;\nselection on validation AUPRC"),
        Step("02", "Calibration", "one temperature per checkpoint,\nfitted on validation only;\n"
             "source-category audit (test)"),
        Step("03", "Validity gate", f"planted lesion vs planted cue;\nuntrained + shuffled controls\n{verdict}",
             gate_face),
        Step("04", "Paired spatial audit", "5 CAMs + random + centre maps:\npeak, top-20% IoU;\n"
             "deletion vs random deletions"),
        Step("05", "Robustness", "thresholds, checkpoints, seeds,\nlesion size, adjusted model,\n"
             "verdict stability"),
        Step("06", "Frozen transfer", f"primary and its temperature frozen:\n{_wrap(cohorts, 40)}"),
        Step("07", "Extended localisation", "AUC-IoU, energy lift, pointing\ngame, C-Score; DoG baseline"),
        Step("08", "Faithfulness and sanity", "ROAD MoRF/LeRF, SRG, shape-kept\ndeletion, cascading "
             "randomisation,\ndensity subgroups"),
    ]


def exclusion_flow(role_counts: dict[str, int], n_masked_pool: int, n_audited: int, n_panel_a: int,
                   score_threshold: float) -> list[FlowStep]:
    """The HyperKvasir exclusion flow of the primary's audit, from the manifest to panel A.

    ``role_counts``: manifest rows per role; ``n_masked_pool``: audit-role rows with a mask;
    ``n_audited``: images the primary's audit scored (empty masks excluded); ``n_panel_a``:
    those at temperature-scaled score >= ``score_threshold``. Raises ValueError when a count
    grows along the flow (the inputs come from different runs)."""
    total = int(sum(role_counts.values()))
    audit_role = int(role_counts.get("spatial_audit", 0))
    counts = [total, audit_role, n_masked_pool, n_audited, n_panel_a]
    if any(later > earlier for earlier, later in zip(counts, counts[1:])):
        raise ValueError(f"exclusion flow counts grow along the flow {counts}: inputs from different runs?")
    return [
        FlowStep("Manifest images", total),
        FlowStep("Audit role", audit_role, f"{total - audit_role} train/val/test"),
        FlowStep("Masked pool", n_masked_pool, _left(audit_role - n_masked_pool, "without a mask")),
        FlowStep("Audited (primary)", n_audited, _left(n_masked_pool - n_audited, "empty mask")),
        FlowStep(f"Panel A: score \u2265 {score_threshold:.2f}", n_panel_a,
                 _left(n_audited - n_panel_a, f"below {score_threshold:.2f}")),
    ]


def _left(n: int, reason: str) -> str:
    return f"{n} {reason}" if n else f"no {reason}"


def _wrap(text: str, width: int) -> str:
    return textwrap.fill(text, width=width, break_on_hyphens=False)   # keep "PolypGen-like" whole


@artefacts.computed_by
def figure1_workflow(steps: list[Step], flow: list[FlowStep] | None = None,
                     external: list[tuple[str, int, int]] | None = None):
    """Draw ``steps`` as rows of three boxes joined by arrows in a snake (the first row left to
    right, the next right to left), so that every arrow is short and straight; below, the
    exclusion ``flow`` left to right with what left at each step under its arrow, and the
    ``external`` cohorts as (name, cases, eligible). 183 mm wide; the axes is in inches."""
    rows = (len(steps) + COLUMNS - 1) // COLUMNS
    stage_height = rows * BOX_HEIGHT + (rows - 1) * GAP_Y
    flow_height = (0.62 + FLOW_HEIGHT + 0.36) if flow else 0.0
    external_height = 0.36 if external else 0.0
    width = COLUMNS * BOX_WIDTH + (COLUMNS - 1) * GAP_X
    height = stage_height + flow_height + external_height
    fig = plt.figure(figsize=(style.DOUBLE_COLUMN_INCHES - 0.05, height + 0.15))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    bottom = flow_height + external_height
    corners = []
    for index, step in enumerate(steps):
        row, position = divmod(index, COLUMNS)
        column = position if row % 2 == 0 else COLUMNS - 1 - position
        x = column * (BOX_WIDTH + GAP_X)
        y = bottom + (rows - 1 - row) * (BOX_HEIGHT + GAP_Y)
        ax.add_patch(FancyBboxPatch((x, y), BOX_WIDTH, BOX_HEIGHT,
                                    boxstyle="round,pad=0.02,rounding_size=0.06",
                                    facecolor=step.face, edgecolor=STAGE_EDGE, linewidth=0.9))
        ax.text(x + 0.08, y + BOX_HEIGHT - 0.07, rf"$\mathbf{{{step.notebook}}}$  {step.title}",
                ha="left", va="top", fontsize=7.5, color=STAGE_TEXT)
        ax.text(x + 0.08, y + BOX_HEIGHT - 0.3, step.body, ha="left", va="top", fontsize=6.5,
                linespacing=1.25)
        corners.append((x, y))
    for (x0, y0), (x1, y1) in zip(corners, corners[1:]):
        if y0 != y1:        # down to the next row, same column
            start, end = (x0 + BOX_WIDTH / 2, y0), (x1 + BOX_WIDTH / 2, y1 + BOX_HEIGHT)
        elif x1 > x0:       # left to right
            start, end = (x0 + BOX_WIDTH, y0 + BOX_HEIGHT / 2), (x1, y1 + BOX_HEIGHT / 2)
        else:               # right to left
            start, end = (x0, y0 + BOX_HEIGHT / 2), (x1 + BOX_WIDTH, y1 + BOX_HEIGHT / 2)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9,
                                     linewidth=0.9, color=STAGE_EDGE))
    if flow:
        _draw_flow(ax, flow, top=flow_height + external_height - 0.62, width=width)
    if external:
        text = "External cohorts (frozen primary, all masked): " + "; ".join(
            f"{name} {cases} cases, {eligible} at high score" for name, cases, eligible in external)
        ax.text(0.0, external_height - 0.04, _wrap(text, 150), ha="left", va="top", fontsize=6.5)
    ax.set_xlim(-0.05, width + 0.05)
    ax.set_ylim(-0.05, height + 0.1)
    ax.axis("off")
    return fig


def _draw_flow(ax, flow: list[FlowStep], *, top: float, width: float) -> None:
    """The exclusion flow as a row of boxes with arrows; what left at each step under the arrow
    that leads to it."""
    ax.text(0.0, top + 0.2, "Exclusion flow of the masked audit images (development cohort)", ha="left",
            va="bottom", fontsize=7.5, fontweight="bold", color=STAGE_TEXT)
    gap = (width - len(flow) * FLOW_WIDTH) / max(1, len(flow) - 1)
    for index, step in enumerate(flow):
        x = index * (FLOW_WIDTH + gap)
        y = top - FLOW_HEIGHT
        ax.add_patch(FancyBboxPatch((x, y), FLOW_WIDTH, FLOW_HEIGHT,
                                    boxstyle="round,pad=0.02,rounding_size=0.05",
                                    facecolor="white", edgecolor=STAGE_EDGE, linewidth=0.8))
        ax.text(x + FLOW_WIDTH / 2, y + FLOW_HEIGHT - 0.1, step.label, ha="center", va="top",
                fontsize=6.5)
        ax.text(x + FLOW_WIDTH / 2, y + 0.1, f"n = {step.n:,}", ha="center", va="bottom",
                fontsize=8, fontweight="bold", color=STAGE_TEXT)
        if index:
            ax.add_patch(FancyArrowPatch((x - gap, y + FLOW_HEIGHT / 2), (x, y + FLOW_HEIGHT / 2),
                                         arrowstyle="-|>", mutation_scale=8, linewidth=0.8,
                                         color=STAGE_EDGE))
            ax.text(x - gap / 2, y - 0.06, _wrap(step.excluded, 20), ha="center", va="top",
                    fontsize=6, color="#555555")
