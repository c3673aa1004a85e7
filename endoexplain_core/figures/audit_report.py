"""The spatial-audit report of one checkpoint, assembled once for notebook 04 and ``endoexplain audit``.

From the audit table and its random deletions: the per-method summary with image-bootstrap
intervals (panel A: scaled score >= threshold; panel B: every audited image), its formatted
form, the map ties, the CAM methods identical by construction at the audited layer, and the
case figure (typical miss, discordant, consensus) with its check that the redrawn maps give the
table's IoU. The notebook adds what needs the run (the gate's daggers, paired tests, map
identity, priors); the command adds its record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from endoexplain_core.analysis import case_maps, summaries, validity_gate

from endoexplain_core.figures import case_figures
from endoexplain_core.methods import CAM_METHODS
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
                  methods: Sequence[str] | None = None) -> AuditSummary:
    """The numbers of one checkpoint's audit (``table``: ``audit_schema.read_audit_table``'s rows).

    ``replicates``/``seed``: the image bootstrap of the summary's intervals. ``mark_gate``: add
    the validity-gate column and daggers from ``gate`` (03's table; None: "not run"); False
    leaves the summary unmarked (a model audited outside a run has no gate of its own).
    ``methods``: the CAM methods to report (None: all); baselines are always kept.
    """
    summary = summaries.spatial_audit_summary(table, random_deletion, score_threshold, replicates=replicates, seed=seed)
    if methods is not None:
        kept = [m for m in summary["method"].unique() if m not in CAM_METHODS or m in methods]
        summary = summary[summary["method"].isin(kept)].reset_index(drop=True)
    if mark_gate:
        summary = validity_gate.mark_table(summary, gate)
    identical = networks.identical_methods(model, layer_name)
    return AuditSummary(summary=summary, formatted=summaries.format_spatial_audit_summary(summary),
                        ties=summaries.tie_counts(table), identical=identical,
                        identical_statement=summaries.identical_statement(identical, arch, layer_name))


def case_figure(table: pd.DataFrame, model: torch.nn.Module, layer: torch.nn.Module,
                read_cases: CaseReader, *, score_threshold: float, top_fraction: float,
                image_size: int, batch_size: int, device: torch.device, not_validated=()
                ) -> tuple[dict[str, str | None], object, pd.DataFrame]:
    """(selection, figure, iou_check): the typical-miss, discordant and consensus cases
    (``case_figures.select_figure3_cases``; None where none qualifies), drawn with their maps
    recomputed in the audit's own batches (``batch_size``: the audit's, so the maps equal the
    table's to the last bit), and per drawn map the table's IoU beside the redrawn one."""
    selection = case_figures.select_figure3_cases(table, score_threshold, image_size=image_size)
    needed = {i for chosen in selection.values() if chosen
              for i in case_maps.audit_batch_ids(table, chosen, batch_size)}
    drawn, iou_check = case_maps.redraw_cases(table, selection, model.to(device), layer,
                                              read_cases(sorted(needed)), image_size, top_fraction,
                                              device=device, batch_size=batch_size)
    figure = case_figures.draw_figure3(drawn, roles=tuple(selection) or ("miss", "discordant", "consensus"),
                                       top_fraction=top_fraction, not_validated=not_validated)
    return selection, figure, iou_check
