"""The spatial-audit report of one checkpoint, assembled once for notebook 04 and ``endoexplain audit``.

From the audit table and its random deletions: the per-method summary (panel A: scaled score
>= threshold; panel B: every audited image) and its reading form, the map ties, the CAM methods
identical by construction at the audited layer, and Figure 3 with its IoU check against the
table. The notebook adds what needs the run (gate daggers, paired tests, map identity, priors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from endoexplain_core import marks
from endoexplain_core.analysis import case_maps, map_diagnostics, summaries, validity_gate

from endoexplain_core.figures import case_figures
from endoexplain_core.methods import CAM_METHODS, method_label
from endoexplain_core.models import networks

# sample ids -> {sample_id: (uint8 (H, W, 3) RGB, bool (H, W) mask)}, decoded at the input size
CaseReader = Callable[[list[str]], dict[str, tuple[np.ndarray, np.ndarray]]]


@dataclass
class AuditSummary:
    """What one audit shows in numbers. ``summary``: one row per panel x method
    (``summaries.spatial_audit_summary``); ``formatted``: the same for reading (estimate with interval);
    ``ties``: constant maps and top-area boundary ties per method; ``identical``: groups of CAM
    methods equal by construction at the audited layer, with ``identical_statement``."""

    summary: pd.DataFrame
    formatted: pd.DataFrame
    ties: pd.DataFrame
    identical: list[tuple[str, ...]]
    identical_statement: str

    @property
    def n_high_score(self) -> int:
        """Images in panel A (scaled score >= the threshold)."""
        return int(self.summary.loc[self.summary["panel"] == "A", "n"].iloc[0])

    @property
    def n_audited(self) -> int:
        """Images in panel B (every audited image)."""
        return int(self.summary.loc[self.summary["panel"] == "B", "n"].iloc[0])


def audit_summary(table: pd.DataFrame, random_deletion: pd.DataFrame, model: torch.nn.Module,
                  layer_name: str, *, arch: str, score_threshold: float, replicates: int, seed: int,
                  gate: pd.DataFrame | None = None, mark_gate: bool = True,
                  methods: Sequence[str] | None = None,
                  degeneracy: pd.DataFrame | None = None) -> AuditSummary:
    """The numbers of one checkpoint's audit (``table``: ``audit_schema.read_audit_table``'s rows).

    ``replicates``/``seed``: the image bootstrap of the summary's intervals. ``mark_gate``: add
    the validity-gate column and daggers from ``gate`` (03's table; None: "not run"); False
    leaves the summary unmarked (a model audited outside a run has no gate of its own).
    ``methods``: the CAM methods to report (None: all); baselines are always kept.
    ``degeneracy``: this checkpoint's ``map_diagnostics.degenerate_maps`` rows; its degenerate
    methods get the ``maps`` column's "degenerate" and ``marks.DEGENERATE_MARK`` on their labels
    (None: no ``maps`` column).
    """
    summary = summaries.spatial_audit_summary(table, random_deletion, score_threshold, replicates=replicates, seed=seed)
    if methods is not None:
        kept = [m for m in summary["method"].unique() if m not in CAM_METHODS or m in methods]
        summary = summary[summary["method"].isin(kept)].reset_index(drop=True)
    if mark_gate:
        summary = validity_gate.mark_table(summary, gate)
    summary = map_diagnostics.mark_degenerate(summary, degeneracy)
    identical = networks.identical_methods(model, layer_name)
    return AuditSummary(summary=summary, formatted=summaries.format_spatial_audit_summary(summary),
                        ties=summaries.tie_counts(table), identical=identical,
                        identical_statement=summaries.identical_statement(identical, arch, layer_name))


def table4_files(summary: AuditSummary) -> dict[str, pd.DataFrame]:
    """Table 4 as it is saved: whole, each panel, and the reading form."""
    table4 = summary.summary
    return {"table4_spatial_audit": table4, "table4_panel_a": table4[table4["panel"] == "A"],
            "table4_panel_b": table4[table4["panel"] == "B"], "table4_spatial_audit_formatted": summary.formatted}


def describe_table4(summary: AuditSummary, table: pd.DataFrame, gate: pd.DataFrame | None, *,
                    score_threshold: float) -> str:
    """What Table 4 holds, in words: the panels' sizes (an empty panel A said so), the
    temperature behind the scores, how constant maps count, the gate's verdict line and, when
    the summary is marked (``maps`` column), the degenerate methods."""
    n_a, n_b = summary.n_high_score, summary.n_audited
    if gate is None:
        gate_line = "The validity gate has not been run."
    elif validity_gate.failing_methods(gate):
        gate_line = marks.GATE_FOOTNOTE
    else:
        gate_line = "All CAM methods pass the validity gate."
    return "\n\n".join([
        f"Panel A: {n_a} of {n_b} images with temperature-scaled score ≥ {score_threshold}; panel B: all {n_b}."
        + (" Panel A is EMPTY in this run: no image reached the threshold, so its rows are blank." if n_a == 0 else ""),
        summaries.temperature_statement(table),
        "Every map is scored on the same images: a constant map (no peak) counts as a peak failure; "
        "'Constant maps' says how many, and the last column gives the rate over maps with a peak.",
        gate_line] + _degenerate_line(summary.summary))


def _degenerate_line(table4: pd.DataFrame) -> list[str]:
    """The degenerate-maps footnote naming the marked methods ([] when none is, or unchecked)."""
    if "maps" not in table4.columns:
        return []
    flagged = table4.loc[table4["maps"] == "degenerate", "method"].drop_duplicates()
    if flagged.empty:
        return ["No CAM method's maps are degenerate on this checkpoint (table_map_degeneracy)."]
    return [marks.DEGENERATE_FOOTNOTE + " Marked: "
            + ", ".join(method_label(m) for m in flagged) + "."]


def describe_ties(ties: pd.DataFrame) -> str:
    """Constant maps and maps with top-area boundary ties, summed over methods."""
    return (f"{int(ties['constant_maps'].sum())} constant maps and {int(ties['boundary_ties'].sum())} "
            f"maps with boundary ties among {int(ties['maps'].sum())} maps.")


def describe_case_figure(selection: dict[str, str | None], iou_check: pd.DataFrame) -> str:
    """Which cases Figure 3 drew, and how far its redrawn maps' IoU is from the table's."""
    if not any(selection.values()):
        return f"Selected: {selection}. No high-score case qualifies for either row: the figure says so."
    return (f"Selected: {selection}. Largest |rendered - table| IoU difference: "
            f"{(iou_check['rendered_iou'] - iou_check['table_iou']).abs().max():.2e}.")


def case_figure(table: pd.DataFrame, model: torch.nn.Module, layer: torch.nn.Module,
                read_cases: CaseReader, *, score_threshold: float, top_fraction: float,
                image_size: int, batch_size: int, device: torch.device, not_validated=(),
                degenerate=()) -> tuple[dict[str, str | None], object, pd.DataFrame]:
    """(selection, figure, iou_check): the typical-miss, discordant and consensus cases
    (``case_figures.select_figure3_cases``; None where none qualifies), drawn with their maps
    recomputed in the audit's own batches (``batch_size``: the audit's, so the maps equal the
    table's to the last bit), and per drawn map the table's IoU beside the redrawn one.
    ``degenerate``: methods whose maps are degenerate on this checkpoint (drawn, marked, no vote
    in the selection)."""
    selection = case_figures.select_figure3_cases(table, score_threshold, image_size=image_size,
                                                  degenerate=degenerate)
    needed = {i for chosen in selection.values() if chosen
              for i in case_maps.audit_batch_ids(table, chosen, batch_size)}
    drawn, iou_check = case_maps.redraw_cases(table, selection, model.to(device), layer,
                                              read_cases(sorted(needed)), image_size, top_fraction,
                                              device=device, batch_size=batch_size)
    figure = case_figures.draw_figure3(drawn, roles=tuple(selection) or ("miss", "discordant", "consensus"),
                                       top_fraction=top_fraction, not_validated=not_validated,
                                       degenerate=degenerate)
    return selection, figure, iou_check
