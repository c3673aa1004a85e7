"""The run folder's layout: the one owner of every path under ``runs/<profile>/``.

``RunLayout(run_dir)`` gives each artefact's path and reads the registry, the primary
checkpoint, temperatures and the manifest digest; a missing file is an error naming it and the
stage that writes it. ``RUN_FOLDER``: every path pattern with the stage that writes it (the
rows of docs/architecture.md's run-folder table).

Design: docs/data_models_runs.md, "Run layout and atomic files".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

MANIFEST_FILE = "manifest.csv"
DIGEST_FILE = "manifest.sha256"
# A manifest stage 00 refused, kept for reading only: no digest, so no stage accepts it.
REJECTED_FILE = "manifest.rejected.csv"
REGISTRY_FILE = "registry.csv"
TEMPERATURES_FILE = "temperatures.csv"

# Every path of the run folder (relative to ``run_dir``; ``<...>`` is a placeholder) and the
# stages that write it: the rows of docs/architecture.md's run-folder table, in its order.
RUN_FOLDER = {
    "data/": "00",
    "manifest/manifest.csv": "00",
    "manifest/manifest.sha256": "00",
    "manifest/manifest.rejected.csv": "00",
    "checkpoints/<checkpoint_id>.safetensors": "01",
    "checkpoints/<checkpoint_id>.resume.safetensors": "01",
    "checkpoints/epochs/<checkpoint_id>.epochNNN.safetensors": "01",
    "checkpoints/registry.csv": "01",
    "checkpoints/training_curves.csv": "01",
    "logits/logits.parquet": "01",
    "calibration/temperatures.csv": "02",
    "calibration/scores.parquet": "02",
    "calibration/reliability_test.csv": "02",
    "validity_gate/seed_<seed>/gate_<model>.parquet": "03",
    "audit/<dataset>/<checkpoint_id>.parquet": "04/05/06",
    "audit/<dataset>/<checkpoint_id>_random_deletion.parquet": "04/05/06",
    "audit/<dataset>/<checkpoint_id>_summary.json": "04/05",
    "audit/<dataset>/<checkpoint_id>_negatives.parquet": "04/05",
    "audit/hyperkvasir_<size>px/<primary>.parquet": "05",
    "audit/hyperkvasir_layer_<layer>/<primary>.parquet": "05",
    "robustness/threshold_sensitivity.csv": "05",
    "extended/<dataset>/<checkpoint_id>.parquet": "07",
    "faithfulness/{road,srg,lsr,shape}.parquet": "08",
    "faithfulness/randomisation.parquet": "08",
    "faithfulness/subgroup_cases.parquet": "08",
    "faithfulness/subgroup_cases_randomised.parquet": "08",
    "faithfulness/subgroup_{srg,lsr}.parquet": "08",
    "cases/index.html": "09",
    "notebooks/NN_name.ipynb": "run_all.sh",
    "stamps/NN_name.json": "run_all.sh",
    "provenance.json": "run_all.sh",
    "index.html": "run_all.sh",
}


def output_inside_data_root(output_root: str | Path, data_root: str | Path) -> str:
    """The refusal ("" when none) of an output root that is the data root or lies inside it:
    the run would write ``runs/`` and ``figures/`` into the data, whose fingerprint (every file's
    size and time) then changes with each run, so stage 00 and every later stage would rerun
    every time. Both paths are compared resolved (links and ``..`` followed)."""
    output, data = Path(output_root).expanduser().resolve(), Path(data_root).expanduser().resolve()
    if output == data or data in output.parents:
        return (f"the output root {output} is inside the data root {data}: the run would write into "
                "the data and its fingerprint would change, rerunning every stage each time; choose "
                "--output-root outside the data root")
    return ""


@dataclass(frozen=True)
class RunLayout:
    """Paths and run-level records of one run folder (``runs/<profile>/`` or ``--output-root``).

    >>> RunLayout("runs/smoke").registry
    PosixPath('runs/smoke/checkpoints/registry.csv')
    """

    run_dir: Path

    def __init__(self, run_dir: str | Path):
        object.__setattr__(self, "run_dir", Path(run_dir))

    # --- folders and files, in stage order ------------------------------------------------
    @property
    def data(self) -> Path:
        """The embedded synthetic cohort (only when no data root is given)."""
        return self.run_dir / "data"

    @property
    def manifest_dir(self) -> Path:
        return self.run_dir / "manifest"

    @property
    def manifest(self) -> Path:
        return self.manifest_dir / MANIFEST_FILE

    @property
    def manifest_digest_file(self) -> Path:
        return self.manifest_dir / DIGEST_FILE

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def registry(self) -> Path:
        return self.checkpoints_dir / REGISTRY_FILE

    @property
    def training_curves(self) -> Path:
        return self.checkpoints_dir / "training_curves.csv"

    @property
    def logits(self) -> Path:
        return self.run_dir / "logits" / "logits.parquet"

    @property
    def calibration_dir(self) -> Path:
        return self.run_dir / "calibration"

    @property
    def temperatures(self) -> Path:
        return self.calibration_dir / TEMPERATURES_FILE

    @property
    def scores(self) -> Path:
        return self.calibration_dir / "scores.parquet"

    @property
    def validity_gate_dir(self) -> Path:
        return self.run_dir / "validity_gate"

    @property
    def robustness_dir(self) -> Path:
        return self.run_dir / "robustness"

    @property
    def threshold_sensitivity(self) -> Path:
        return self.robustness_dir / "threshold_sensitivity.csv"

    @property
    def faithfulness_dir(self) -> Path:
        return self.run_dir / "faithfulness"

    def audit_dir(self, dataset: str) -> Path:
        """``audit/<dataset>/``: the audits of every checkpoint on one cohort."""
        return self.run_dir / "audit" / dataset

    def audit_paths(self, dataset: str, checkpoint_id: str) -> dict[str, Path]:
        """The four files of one audit: ``table``, ``random_deletion``, ``summary``, ``negatives``."""
        folder = self.audit_dir(dataset)
        return {"table": folder / f"{checkpoint_id}.parquet",
                "random_deletion": folder / f"{checkpoint_id}_random_deletion.parquet",
                "summary": folder / f"{checkpoint_id}_summary.json",
                "negatives": folder / f"{checkpoint_id}_negatives.parquet"}

    def extended_table(self, dataset: str, checkpoint_id: str) -> Path:
        """``extended/<dataset>/<checkpoint_id>.parquet``: 07's per-image localisation rows."""
        return self.run_dir / "extended" / dataset / f"{checkpoint_id}.parquet"

    @property
    def case_browser_dir(self) -> Path:
        """The case browser: ``index.html`` and one strip of maps per audited image."""
        return self.run_dir / "cases"

    @property
    def notebooks_dir(self) -> Path:
        """Executed notebooks (``.ipynb`` + ``.html``), one per stage."""
        return self.run_dir / "notebooks"

    @property
    def stamps_dir(self) -> Path:
        """One JSON stamp per stage: its digest and the files it wrote."""
        return self.run_dir / "stamps"

    @property
    def provenance(self) -> Path:
        return self.run_dir / "provenance.json"

    @property
    def index_html(self) -> Path:
        """The run record's front page."""
        return self.run_dir / "index.html"

    # --- run-level records ------------------------------------------------------------------
    def manifest_digest(self) -> str:
        """The manifest digest (``manifest/manifest.sha256``) that the run's checkpoints carry."""
        path = self.manifest_digest_file
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: run 00_roles first")
        return path.read_text().split()[0]

    def read_registry(self) -> pd.DataFrame:
        """``checkpoints/registry.csv``, checked to name exactly one primary checkpoint;
        ``is_primary`` is returned as bool."""
        path = self.registry
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: run 01_training first")
        registry = pd.read_csv(path, dtype={"checkpoint_id": str, "path": str, "sha256": str})
        primaries = registry.loc[registry["is_primary"].astype(str).str.lower() == "true", "checkpoint_id"]
        if len(primaries) != 1:
            raise ValueError(f"{path}: expected exactly one primary checkpoint, found {list(primaries)}")
        registry["is_primary"] = registry["checkpoint_id"] == primaries.iloc[0]
        return registry

    def registry_entry(self, checkpoint_id: str) -> pd.Series:
        """The registry row of ``checkpoint_id`` (index: the registry's columns)."""
        registry = self.read_registry().set_index("checkpoint_id")
        if checkpoint_id not in registry.index:
            raise KeyError(f"checkpoint {checkpoint_id} is not in {self.registry}")
        return registry.loc[checkpoint_id]

    def primary_id(self) -> str:
        """The ``checkpoint_id`` of the primary checkpoint."""
        registry = self.read_registry()
        return str(registry.loc[registry["is_primary"], "checkpoint_id"].iloc[0])

    def checkpoint_file(self, checkpoint_id: str) -> Path:
        """The absolute path of a registered checkpoint's safetensors file."""
        return self.run_dir / str(self.registry_entry(checkpoint_id)["path"])

    def temperature(self, checkpoint_id: str) -> float:
        """The validation-fitted temperature of ``checkpoint_id`` (``calibration/temperatures.csv``)."""
        path = self.temperatures
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: run 02_calibration first")
        table = pd.read_csv(path, dtype={"checkpoint_id": str})
        match = table.loc[table["checkpoint_id"] == checkpoint_id, "temperature"]
        if match.empty:
            raise KeyError(f"{path}: checkpoint {checkpoint_id} has no fitted temperature")
        value = float(match.iloc[0])
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"{path}: temperature of {checkpoint_id} is {value}, not > 0")
        return value

    def primary_checkpoint(self) -> dict:
        """The primary's registry row as a dict, with ``path`` made absolute and its
        ``temperature``."""
        registry = self.read_registry()
        row = registry.loc[registry["is_primary"]].iloc[0].to_dict()
        row["path"] = str(self.run_dir / row["path"])
        row["temperature"] = self.temperature(row["checkpoint_id"])
        return row
