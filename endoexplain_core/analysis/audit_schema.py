"""The audit table's schema and its validation.

One row per (dataset, sample_id, checkpoint_id, method), with the columns of ``AUDIT_SCHEMA``
(fixed, so batches stream into one Parquet file); the per-image random-deletion table has
``random_deletion_schema``. ``validate_audit_table`` checks the rules of docs/protocol.md
("Audit-table validation") and ``read_audit_table`` reads a file with them, naming the file in
every error; ``read_random_deletion`` reads the second table.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

KEY_COLUMNS = ("dataset", "sample_id", "checkpoint_id", "method")

# Column -> Arrow type of the audit table (the schema is fixed so batches stream into one file).
AUDIT_SCHEMA = pa.schema([
    ("dataset", pa.string()), ("sample_id", pa.string()), ("checkpoint_id", pa.string()),
    ("arch", pa.string()), ("seed", pa.int64()), ("control", pa.string()),
    ("target", pa.string()), ("target_layer", pa.string()), ("method", pa.string()),
    ("top_fraction", pa.float64()), ("calibration", pa.string()), ("temperature", pa.float64()),
    ("logit_pos", pa.float64()), ("z", pa.float64()),
    ("raw_score", pa.float64()), ("scaled_score", pa.float64()),
    ("peak_outside_mask", pa.bool_()), ("peak_row", pa.int64()), ("peak_col", pa.int64()),
    ("iou", pa.float64()), ("iou_below_0_10", pa.bool_()), ("energy_in_mask", pa.float64()),
    ("centre_of_mass_distance", pa.float64()), ("lesion_area_fraction", pa.float64()),
    ("lesion_centre_distance", pa.float64()),
    ("constant_map", pa.bool_()), ("max_multiplicity", pa.int64()),
    ("boundary_ties", pa.int64()),
    ("logit_drop", pa.float64()), ("score_drop", pa.float64()),
    # Map-prior diagnostics (analysis.map_diagnostics): the target layer's feature grid, whether
    # the peak's grid cell is in the grid's border ring / a corner, the IoU of the map's top set
    # with the method's prior map (mean map over held-out negatives; NaN without a prior), and
    # the logit drop from deleting the lesion itself (per image, repeated on every method row).
    ("feature_grid_height", pa.int64()), ("feature_grid_width", pa.int64()),
    ("peak_border_ring", pa.bool_()), ("peak_corner_cell", pa.bool_()),
    ("prior_top_iou", pa.float64()), ("lesion_logit_drop", pa.float64()),
    # Pixels from the peak to the nearest lesion pixel (0 inside; NaN for a constant map).
    ("peak_lesion_distance", pa.float64()),
])
DIAGNOSTIC_COLUMNS = ("feature_grid_height", "feature_grid_width", "peak_border_ring",
                      "peak_corner_cell", "prior_top_iou", "lesion_logit_drop", "peak_lesion_distance")
# Tables written before the diagnostics existed (and hand-made test tables) stay valid.
REQUIRED_COLUMNS = tuple(n for n in AUDIT_SCHEMA.names if n not in DIAGNOSTIC_COLUMNS)


class AuditTableError(ValueError):
    """An audit table breaks one of the validation rules (docs/protocol.md, "Audit-table validation")."""


def random_deletion_schema(repetitions: int) -> pa.Schema:
    """Per-image random-deletion table: the ``repetitions`` logit drops and their means."""
    fields = [("dataset", pa.string()), ("sample_id", pa.string()),
              ("checkpoint_id", pa.string()), ("top_fraction", pa.float64()),
              ("repetitions", pa.int64())]
    fields += [(f"logit_drop_{r:02d}", pa.float64()) for r in range(repetitions)]
    fields += [("logit_drop_mean", pa.float64()), ("score_drop_mean", pa.float64())]
    return pa.schema(fields)


def validate_audit_table(table: pd.DataFrame, source: str = "audit table") -> pd.DataFrame:
    """Check the rules every audit table obeys; raise ``AuditTableError`` saying what is wrong.

    Rules: all required columns present; no duplicate (dataset, sample_id, checkpoint_id,
    method) rows; every method covers the same images (per dataset and checkpoint); a single
    top fraction; one scaled score per image and checkpoint. Returns the table.
    """
    missing = [column for column in REQUIRED_COLUMNS if column not in table.columns]
    if missing:
        raise AuditTableError(f"{source}: missing columns {missing}")
    if table.empty:
        raise AuditTableError(f"{source}: has no rows")
    duplicated = table.duplicated(list(KEY_COLUMNS), keep=False)
    if duplicated.any():
        examples = table.loc[duplicated, list(KEY_COLUMNS)].drop_duplicates().head(3)
        raise AuditTableError(f"{source}: {int(duplicated.sum())} duplicate "
                              f"(dataset, sample_id, checkpoint_id, method) rows, e.g. "
                              f"{examples.to_dict('records')}")
    top_fractions = sorted(table["top_fraction"].unique())
    if len(top_fractions) != 1:
        raise AuditTableError(f"{source}: mixed top fractions {top_fractions}; one per table")
    for (dataset, checkpoint_id), group in table.groupby(["dataset", "checkpoint_id"]):
        images = {m: frozenset(g["sample_id"]) for m, g in group.groupby("method")}
        union = frozenset().union(*images.values())
        unpaired = {m: len(union - ids) for m, ids in images.items() if ids != union}
        if unpaired:
            raise AuditTableError(f"{source}: methods do not cover the same images for "
                                  f"{dataset}/{checkpoint_id}; images missing per method: {unpaired}")
        scores = group.groupby("sample_id")["scaled_score"].nunique()
        if (scores > 1).any():
            raise AuditTableError(f"{source}: {dataset}/{checkpoint_id} has more than one scaled "
                                  f"score for images {list(scores[scores > 1].index[:3])}")
    return table


def read_audit_table(path: str | Path) -> pd.DataFrame:
    """Read and validate an audit Parquet file; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"audit table {path} does not exist")
    try:
        table = pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as error:  # e.g. truncated by a crash
        raise AuditTableError(f"{path}: not a readable Parquet file ({path.stat().st_size} bytes; "
                              f"truncated or damaged?): {error}") from error
    return validate_audit_table(table, source=str(path))


def read_random_deletion(path: str | Path) -> pd.DataFrame:
    """Read a per-image random-deletion table (``random_deletion_schema``); errors name the
    file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"random-deletion table {path} does not exist")
    return pd.read_parquet(path)
