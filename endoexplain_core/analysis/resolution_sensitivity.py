"""Resolution sensitivity: the primary's Table 4 panel A at a second input size.

The same weights and temperature see every masked pool image at another size, so the target
layer's feature grid grows (e.g. 4x4 -> 8x8 at twice the size) and only the input size changes
between the two rows of a map (the same native-size high-score images). The companion check at
the neighbouring layer is ``layer_sensitivity``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from endoexplain_core.analysis import audit, audit_inputs, audit_schema, summaries
from endoexplain_core.data.datasets import load_manifest
from endoexplain_core.run_layout import RunLayout


def resolution_audit(run_dir: str | Path, data_root: str | Path, checkpoint_id: str, *,
                     native_size: int, check_size: int, top_fraction: float,
                     repetitions: int, batch_size: int, device: str = "cpu") -> dict:
    """Audit a registered checkpoint (trained at ``native_size``) at another input size.

    The same weights and temperature see every masked pool image resized to ``check_size``;
    the target layer's grid grows with the input (e.g. 4x4 -> 8x8 at 2x). Tables go to
    ``<run_dir>/audit/hyperkvasir_<check_size>px/``. Returns ``audit.audit_checkpoint``'s
    summary plus ``dataset``.
    """
    layout = RunLayout(run_dir)
    dataset = f"hyperkvasir_{check_size}px"
    model, metadata, temperature = audit.load_calibrated_model(run_dir, checkpoint_id, native_size, device)
    pool = audit_inputs.masked_pool(load_manifest(layout.manifest))
    paths = layout.audit_paths(dataset, checkpoint_id)
    summary = audit.audit_checkpoint(
        model, metadata, temperature, audit_inputs.manifest_cases(pool, data_root, decode_size=check_size),
        dataset=dataset,
        image_size=check_size, table_path=paths["table"], random_deletion_path=paths["random_deletion"],
        top_fraction=top_fraction, repetitions=repetitions, batch_size=batch_size, device=device,
        total=len(pool))
    return {**summary, "dataset": dataset}


def resolution_table(tables: dict[int, tuple[pd.DataFrame, pd.DataFrame]], sample_ids, *,
                     replicates: int,
                     seed: int) -> pd.DataFrame:
    """Table 4 panel A of one checkpoint at several input sizes, on one fixed image set.

    ``tables``: input size -> (audit rows, random-deletion rows); ``sample_ids``: the images
    (e.g. the native-size high-score set, so only the input size changes). Rows: size, grid,
    then ``summaries.panel_summary`` columns.
    """
    frames = []
    for size, (table, random_deletion) in sorted(tables.items()):
        ids = [s for s in sample_ids if s in set(table["sample_id"])]
        frame = summaries.panel_summary(table, random_deletion, ids, replicates, seed)
        grid = f"{int(table['feature_grid_height'].iloc[0])}x{int(table['feature_grid_width'].iloc[0])}"
        frame.insert(0, "grid", grid)
        frame.insert(0, "input_size", size)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def run_resolution_check(run_dir: str | Path, data_root: str | Path, primary: pd.DataFrame,
                         random_deletion: pd.DataFrame, *, native_size: int, check_size: int,
                         score_threshold: float, top_fraction: float, repetitions: int,
                         batch_size: int, device: str, replicates: int,
                         seed: int) -> tuple[pd.DataFrame, dict[str, Path]]:
    """The whole check in one call: audit the primary at ``check_size`` (``resolution_audit``)
    and return (``resolution_table`` at both sizes on the native high-score images, the paths
    of the second audit). ``primary`` / ``random_deletion``: the primary's rows at its native
    size."""
    checkpoint_id = str(primary["checkpoint_id"].iloc[0])
    check = resolution_audit(run_dir, data_root, checkpoint_id, native_size=native_size,
                             check_size=check_size, top_fraction=top_fraction,
                             repetitions=repetitions, batch_size=batch_size, device=device)
    paths = RunLayout(run_dir).audit_paths(check["dataset"], checkpoint_id)
    tables = {native_size: (primary, random_deletion),
              check_size: (audit_schema.read_audit_table(paths["table"]), audit_schema.read_random_deletion(paths["random_deletion"]))}
    table = resolution_table(tables, summaries.high_score_ids(primary, score_threshold),
                             replicates=replicates, seed=seed)
    return table, {"table": paths["table"], "random_deletion": paths["random_deletion"]}


def describe(resolution: pd.DataFrame, primary_id: str, n_high_score: int, *, native_size: int,
             check_size: int) -> str:
    """The resolution check (``run_resolution_check``) in words: images, sizes and grids."""
    grid_at = dict(zip(resolution["input_size"], resolution["grid"]))
    return (f"Panel A of `{primary_id}` on its {n_high_score} native high-score images at {native_size} px "
            f"(grid {grid_at[native_size]}) and {check_size} px (grid {grid_at[check_size]}); same weights and "
            "temperature, only the input size changes. A method whose failure rate moves a lot here is "
            "reporting the grid, not the lesion.")
