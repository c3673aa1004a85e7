"""The package's layers import only downwards (docs/architecture.md, "Layers").

foundation (config, methods, marks, artefacts) < kernels < data < models < analysis < figures < pipeline.
A module may import its own layer and the layers below it; an upward import (e.g. an analysis
module importing a figure) would tie the tested core to plotting and is refused here.
"""

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "endoexplain_core"
# "entry": the command line (cli, __main__) sits on top and may import every layer.
LAYERS = ["foundation", "kernels", "data", "models", "analysis", "figures", "pipeline", "entry"]
FOUNDATION = {"config", "methods", "marks", "artefacts", "numerics", "files", "progress", "__init__"}
ENTRY = {"__main__", "cli"}


def layer_of(module: str) -> str:
    """Layer of a dotted module name inside endoexplain_core (``endoexplain_core.kernels.cams``)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in FOUNDATION:
        return "foundation"
    if parts[0] in ENTRY:
        return "entry"
    return parts[0]


def core_imports(path: Path) -> list[str]:
    """Every ``endoexplain_core...`` module imported by ``path`` (module and function level)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("endoexplain_core"):
            if node.module == "endoexplain_core":
                found += [f"endoexplain_core.{alias.name}" for alias in node.names]
            else:
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("endoexplain_core")]
    return found


MODULES = sorted(p for p in CORE.rglob("*.py"))


def test_every_module_is_in_a_known_layer():
    for path in MODULES:
        module = "endoexplain_core." + ".".join(path.relative_to(CORE).with_suffix("").parts)
        assert layer_of(module) in LAYERS, f"{path} is in no layer: add it to LAYERS"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(CORE).as_posix())
def test_imports_point_down(path):
    module = "endoexplain_core." + ".".join(path.relative_to(CORE).with_suffix("").parts)
    own = LAYERS.index(layer_of(module))
    upward = [name for name in core_imports(path) if LAYERS.index(layer_of(name)) > own]
    assert not upward, f"{path.relative_to(CORE)} ({layer_of(module)}) imports upward: {upward}"


def test_layering_rule_catches_an_upward_import(tmp_path):
    """The check itself can fail: an analysis module importing a figure module is flagged."""
    bad = tmp_path / "bad.py"
    bad.write_text("from endoexplain_core.figures import style\n")
    upward = [n for n in core_imports(bad) if LAYERS.index(layer_of(n)) > LAYERS.index("analysis")]
    assert upward == ["endoexplain_core.figures"]
