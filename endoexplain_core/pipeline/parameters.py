"""Notebook ``parameters`` cells, generated from the profile schema so there is one source.

``render_parameters_cell(stage)`` renders a stage's cell from ``config`` (names, the
``REFERENCE_PROFILE``'s values, the schema's descriptions as comments); ``sync_notebook``
writes it into the notebook.

Design: docs/data_models_runs.md, "Notebook parameters cells".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from endoexplain_core import config

RUN_PATH_COMMENTS = {
    "profile": "profile name (configs/<profile>.yaml)",
    "run_dir": "run folder: artefacts of earlier stages in, this stage's out",
    "figures_dir": "figures (PNG+PDF) and tables (CSV+MD+TeX)",
    "data_root": "cohort root; empty: the synthetic cohort in <run_dir>/data",
    "manifest_reference_dir": "committed reference manifest (read by 00_roles only)",
}
REFERENCE_PROFILE = "smoke"


def _python_literal(value: Any) -> str:
    """A value as Python source (JSON-like values only: what Papermill passes)."""
    return repr(value)


def run_path_defaults(profile: str = REFERENCE_PROFILE) -> dict[str, str]:
    """Defaults of the run paths for a notebook opened by hand from ``notebooks/``."""
    return {"profile": profile, "run_dir": f"../runs/{profile}",
            "figures_dir": f"../figures/{profile}", "data_root": "",
            "manifest_reference_dir": f"../data_manifest/{profile}"}


def expected_parameters(stage: str, profile: str = REFERENCE_PROFILE) -> dict[str, Any]:
    """Every parameter a stage's notebook declares, with the reference profile's values."""
    loaded = config.load_profile(profile)
    values = dict(run_path_defaults(loaded.profile))
    if stage == "00_roles":
        values["adopt_manifest"] = False
    values.update(config.stage_parameters(loaded, stage))
    return values


def _description(stage: str, key: str) -> str:
    if key in RUN_PATH_COMMENTS:
        return RUN_PATH_COMMENTS[key]
    if key == "adopt_manifest":
        return "True: accept a manifest that differs from the reference and overwrite it"
    model = config.STAGE_SETTINGS[stage]
    field = model.model_fields.get(key) or config.SharedSettings.model_fields.get(key)
    return (field.description or "") if field is not None else ""


def render_parameters_cell(stage: str, profile: str = REFERENCE_PROFILE) -> str:
    """Source of the ``parameters`` cell of ``stage``: one assignment per line, with a comment."""
    settings = config.STAGE_SETTINGS[stage]
    values = expected_parameters(stage, profile)
    groups = [("# Run paths (passed by run_all.sh)", list(RUN_PATH_COMMENTS)
               + (["adopt_manifest"] if stage == "00_roles" else [])),
              ("# Shared profile keys this stage uses (configs/<profile>.yaml: shared)",
               list(settings.uses_shared)),
              (f"# This stage (configs/<profile>.yaml: stages.{stage})",
               list(settings.model_fields))]
    lines = [f"# Generated from endoexplain_core.config for the {profile} profile "
             "(scripts/sync_parameters.py); run_all.sh passes the real values."]
    for heading, keys in groups:
        if not keys:
            continue
        lines.append(heading)
        for key in keys:
            comment = _description(stage, key)
            lines.append(f"{key} = {_python_literal(values[key])}"
                         + (f"  # {comment}" if comment else ""))
    return "\n".join(lines)


def parameters_cell(notebook: Path) -> dict:
    """The cell tagged ``parameters`` of a notebook (JSON dict); ValueError if there is none."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"{notebook}: expected one cell tagged 'parameters', found {len(tagged)}")
    return tagged[0]


def sync_notebook(notebook: Path, profile: str = REFERENCE_PROFILE) -> bool:
    """Rewrite a notebook's parameters cell from the schema; return whether it changed."""
    import nbformat

    notebook = Path(notebook)
    document = nbformat.read(notebook, as_version=4)
    source = render_parameters_cell(notebook.stem, profile)
    for cell in document.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            if cell.source == source:
                return False
            cell.source = source
    nbformat.write(document, notebook)
    return True
