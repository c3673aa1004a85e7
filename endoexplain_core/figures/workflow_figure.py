"""Figure 1: the endoExplain workflow, drawn in code (Matplotlib patches and arrows).

The boxes follow the stages in order: content-defined roles before any training; training and
validation-only selection; calibration on validation only; the paired spatial audit; robustness;
frozen transfer. Counts shown in the boxes are passed in from the run (never typed by hand).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

BOX_WIDTH, BOX_HEIGHT = 2.7, 1.45


@dataclass(frozen=True)
class Step:
    """One box: the notebook that computes it, a title and a short body text."""

    notebook: str
    title: str
    body: str


def workflow_steps(role_counts: dict[str, int] | None = None, n_checkpoints: int | None = None,
                   cohort_names: list[str] | None = None) -> list[Step]:
    """The six steps of the protocol, with run counts where given.

    ``role_counts``: manifest rows per role (train/val/test/spatial_audit); ``n_checkpoints``:
    trained checkpoints including the control; ``cohort_names``: external cohorts analysed.
    """
    roles = ("train / val / test / masked audit pool" if role_counts is None else
             " / ".join(f"{role_counts.get(r, 0)}" for r in ("train", "val", "test", "spatial_audit"))
             + "\n(train / val / test / audit)")
    checkpoints = ("3 architectures x 3 seeds" if n_checkpoints is None else
                   f"{n_checkpoints} checkpoint{'s' if n_checkpoints != 1 else ''}: "
                   "3 arch. x 3 seeds") + "\n+ shuffled-label control"
    cohorts = ("external masked cohorts" if not cohort_names else
               textwrap.fill(", ".join(cohort_names), width=34))
    return [
        Step("00", "Content-defined roles", f"SHA-256 + average-hash groups\n{roles}"),
        Step("01", "Training", f"{checkpoints}\nselection on validation AUPRC"),
        Step("02", "Calibration", "one temperature per checkpoint,\nfitted on validation only;\n"
             "source-category audit (test)"),
        Step("04", "Paired spatial audit", "5 CAMs + random + centre maps:\npeak, top-20% IoU;\n"
             "top-20% deletion vs 20 random\nexact-area deletions (control)"),
        Step("05", "Robustness", "thresholds, checkpoints,\nlesion size, adjusted model"),
        Step("06", "Frozen transfer", f"primary checkpoint and T frozen\n{cohorts}"),
    ]


def figure1_workflow(steps: list[Step]):
    """Draw ``steps`` as rows of three boxes joined by arrows, in a snake: the first row left to
    right, the next right to left, and so on, so that every arrow is short and straight."""
    columns = 3
    rows = (len(steps) + columns - 1) // columns
    gap_x, gap_y = 0.55, 0.6
    fig, ax = plt.subplots(figsize=(7.2, 1.05 + 1.45 * rows))
    corners = []
    for index, step in enumerate(steps):
        row, position = divmod(index, columns)
        column = position if row % 2 == 0 else columns - 1 - position
        x = column * (BOX_WIDTH + gap_x)
        y = (rows - 1 - row) * (BOX_HEIGHT + gap_y)
        ax.add_patch(FancyBboxPatch((x, y), BOX_WIDTH, BOX_HEIGHT,
                                    boxstyle="round,pad=0.02,rounding_size=0.08",
                                    facecolor="#eef3f8", edgecolor="#33506e", linewidth=1.0))
        ax.text(x + 0.1, y + BOX_HEIGHT - 0.12, f"{step.notebook}  {step.title}", ha="left",
                va="top", fontsize=8.5, fontweight="bold", color="#1d3349")
        ax.text(x + 0.1, y + BOX_HEIGHT - 0.42, step.body, ha="left", va="top", fontsize=7,
                linespacing=1.3)
        corners.append((x, y))
    for (x0, y0), (x1, y1) in zip(corners, corners[1:]):
        if y0 != y1:        # down to the next row, same column
            start, end = (x0 + BOX_WIDTH / 2, y0), (x1 + BOX_WIDTH / 2, y1 + BOX_HEIGHT)
        elif x1 > x0:       # left to right
            start, end = (x0 + BOX_WIDTH, y0 + BOX_HEIGHT / 2), (x1, y1 + BOX_HEIGHT / 2)
        else:               # right to left
            start, end = (x0, y0 + BOX_HEIGHT / 2), (x1 + BOX_WIDTH, y1 + BOX_HEIGHT / 2)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=10,
                                     linewidth=1.0, color="#33506e"))
    ax.set_xlim(-0.1, columns * BOX_WIDTH + (columns - 1) * gap_x + 0.1)
    ax.set_ylim(-0.1, rows * BOX_HEIGHT + (rows - 1) * gap_y + 0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    return fig
