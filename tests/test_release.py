"""The release a newcomer picks up: a valid CITATION.cff, a changelog entry for the version,
and a wheel that installs and works outside the repository (docs/promises.md, "A release that
installs anywhere")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import jsonschema
import pytest
import yaml

import endoexplain_core
from tests.cli_fixtures import audit_arguments, write_masked_frames, write_resnet18_state_dict

ROOT = Path(__file__).resolve().parent.parent
# The Citation File Format's own schema, version 1.2.0 (tests/data/README.md says where from).
CFF_SCHEMA = ROOT / "tests" / "data" / "citation_cff_1.2.0.schema.json"


def test_citation_cff_is_valid_cff_1_2_0():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    schema = json.loads(CFF_SCHEMA.read_text())
    jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker()).validate(citation)
    assert citation["version"] == endoexplain_core.__version__
    assert citation["license"] == "MIT" and "MIT License" in (ROOT / "LICENSE").read_text()
    assert citation["preferred-citation"]["type"] == "article"


def test_the_cff_check_can_fail():
    schema = json.loads(CFF_SCHEMA.read_text())
    broken = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    del broken["authors"]
    with pytest.raises(jsonschema.ValidationError, match="authors"):
        jsonschema.Draft7Validator(schema).validate(broken)


def test_the_changelog_has_an_entry_for_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    version = re.escape(endoexplain_core.__version__)
    assert re.search(rf"^## \[{version}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    assert "## [Unreleased]" in changelog


def _copy_of_the_source(destination: Path) -> Path:
    """The repository's files as a checkout has them (tracked and untracked-not-ignored), so the
    build never writes into the repository."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def _fresh_environment(folder: Path) -> Path:
    """A new virtual environment in ``folder`` whose only own package will be the wheel; the
    heavy dependencies (torch, ...) are the project environment's, appended to its path by a
    ``.pth`` line (no network). A path listed in a ``.pth`` file is not a site directory, so the
    project's editable install (itself a ``.pth`` hook there) is not activated."""
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    python = folder / "bin" / "python"
    own_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    Path(own_site, "project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.mark.slow
def test_the_wheel_installs_outside_the_repository_and_audits_and_verifies(tmp_path):
    source = _copy_of_the_source(tmp_path / "source")
    dist = tmp_path / "dist"
    # --no-isolation: the build backend (setuptools) comes from the pinned environment, not
    # from a download.
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                   check=True, capture_output=True, cwd=tmp_path)
    version = endoexplain_core.__version__
    wheel = dist / f"endoexplain-{version}-py3-none-any.whl"
    assert wheel.is_file() and (dist / f"endoexplain-{version}.tar.gz").is_file(), sorted(os.listdir(dist))

    python = _fresh_environment(tmp_path / "venv")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}

    def run(*args, check=True):
        result = subprocess.run([*args], cwd=work, env=environment, capture_output=True, text=True)
        if check:
            assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stderr[-2000:]}"
        return result

    where = run(python, "-c", "import endoexplain_core; print(endoexplain_core.__file__)").stdout.strip()
    assert Path(where).is_relative_to(tmp_path / "venv"), f"imported from {where}, not the wheel"
    assert not Path(where).is_relative_to(ROOT)
    command = tmp_path / "venv" / "bin" / "endoexplain"
    assert run(command, "--version").stdout.strip() == f"endoexplain {version}"
    assert "--target-layer" in run(command, "audit", "--help").stdout

    images, masks = write_masked_frames(work / "data", n=6)
    weights = write_resnet18_state_dict(work / "resnet18.pt", centre_on=images)
    out = work / "audit"
    audit = run(command, *audit_arguments(images, masks, weights, out))
    assert "6 images audited" in audit.stdout
    record = json.loads((out / "audit.json").read_text())
    assert record["endoexplain_version"] == version
    assert "endoexplain verify" in run(command, "verify", str(out)).stdout
    (out / "table4_summary.csv").write_text("changed\n")
    assert run(command, "verify", str(out), check=False).returncode == 2
