"""The environment pins agree everywhere, and committed notebooks carry no outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;#]+)")


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        match = PIN.match(line)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def requirement_pins() -> dict[str, str]:
    return _pins((REPO / "requirements.txt").read_text().splitlines())


def test_every_requirement_is_pinned_exactly():
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert PIN.match(line), f"requirements.txt: '{line}' is not pinned with =="


def test_environment_yml_lists_the_same_pins_as_requirements():
    spec = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    assert _pins(pip_section) == requirement_pins()
    assert "python=3.11" in spec["dependencies"]


def test_constraints_agree_with_requirements():
    constraints = _pins((REPO / "constraints.txt").read_text().splitlines())
    for name, version in requirement_pins().items():
        assert constraints.get(name) == version, f"constraints.txt pins {name} differently"


def test_installed_torch_matches_the_pin():
    """The environment is the pinned one (whatever the pin is), so results are comparable."""
    from importlib import metadata

    pins = requirement_pins()
    for package in ("torch", "torchvision"):
        installed = metadata.version(package).split("+")[0]
        assert installed == pins[package], f"{package} {installed} installed, {pins[package]} pinned"


def committed_notebooks() -> list[Path]:
    return sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_numbered_notebooks():
    names = [p.name for p in committed_notebooks()]
    assert names and all(re.match(r"^\d\d_[a-z0-9_]+\.ipynb$", n) for n in names), names


def test_notebooks_are_stripped_and_parametrised():
    for path in committed_notebooks():
        notebook = json.loads(path.read_text())
        assert notebook["metadata"]["kernelspec"]["name"] == "endoexplain", path.name
        tagged = [c for c in notebook["cells"]
                  if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
        for index, cell in enumerate(notebook["cells"]):
            if cell["cell_type"] == "code":
                assert cell.get("outputs") == [], f"{path.name} cell {index} has outputs"
                assert cell.get("execution_count") is None, f"{path.name} cell {index} ran"
