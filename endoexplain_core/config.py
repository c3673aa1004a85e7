"""Profiles: YAML files in ``configs/`` that hold every parameter of a run.

A profile has a ``shared`` section (parameters every notebook receives) and a ``stages``
section keyed by notebook name (``00_roles``, ``01_training``, ...). A notebook receives
``shared`` merged with its own stage section (stage keys win), plus the run paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
PROFILES = ("smoke", "default", "paper")


class ProfileError(ValueError):
    """A profile file is missing or malformed."""


def profile_path(profile: str) -> Path:
    """Path of ``configs/<profile>.yaml`` (or ``profile`` itself if it is a YAML path)."""
    candidate = Path(profile)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    return CONFIG_DIR / f"{profile}.yaml"


def load_profile(profile: str) -> dict[str, Any]:
    """Read and check a profile; raise ``ProfileError`` naming the file on any problem."""
    path = profile_path(profile)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
        raise ProfileError(f"profile file {path} does not exist (known profiles: {known})")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ProfileError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(config, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level")
    for section in ("shared", "stages"):
        if not isinstance(config.get(section), dict):
            raise ProfileError(f"{path}: missing mapping section '{section}'")
    config.setdefault("profile", path.stem)
    return config


def stage_parameters(config: dict[str, Any], stage: str) -> dict[str, Any]:
    """Parameters for one notebook: ``shared`` overlaid with ``stages[stage]``."""
    parameters = dict(config["shared"])
    parameters.update(config["stages"].get(stage) or {})
    return parameters


def resolve_data_root(data_root: str | Path | None, run_dir: str | Path) -> Path:
    """The folder cohorts are read from: ``data_root`` if given, else ``<run_dir>/data``."""
    if data_root:
        return Path(data_root).expanduser().resolve()
    return Path(run_dir) / "data"
