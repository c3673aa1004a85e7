"""The package's layers import only downwards (docs/architecture.md, "Layers"), and no
function runs over 80 lines without saying why.

foundation (config, methods, marks, artefacts, run_layout, ...) < kernels < data < models < analysis < figures < pipeline.
A module may import its own layer and the layers below it; an upward import (e.g. an analysis
module importing a figure) would tie the tested core to plotting and is refused here. No import
circle either, inside a layer or across, counting imports inside functions too (a local import
hides a circle from Python, not from the design). And no protocol value has a default below
``config``: a forgotten argument must be an error, not a silent 0.20 or 2,000 replicates.
"""

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "endoexplain_core"
# "entry": the command line (cli, __main__) sits on top and may import every layer.
LAYERS = ["foundation", "kernels", "data", "models", "analysis", "figures", "pipeline", "entry"]
FOUNDATION = {"config", "methods", "marks", "presentation", "artefacts", "numerics", "files", "progress",
              "run_layout", "__init__"}
ENTRY = {"__main__", "cli", "front_door", "gate_command"}


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


def module_name(path: Path, core: Path = CORE) -> str:
    return ("endoexplain_core." + ".".join(path.relative_to(core).with_suffix("").parts)).removesuffix(".__init__")


def import_graph(paths=MODULES, core: Path = CORE) -> dict[str, set[str]]:
    """module -> the core modules it imports anywhere in its file; ``from pkg import name``
    points at ``pkg.name`` when that is a module, else at ``pkg``; package ``__init__`` files
    are left out (they only mark packages)."""
    modules = {module_name(p, core): p for p in paths if p.name != "__init__.py"}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("endoexplain_core"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("endoexplain_core")}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return circles


def test_no_import_circle_anywhere_in_the_core():
    assert import_circles(import_graph()) == []


def test_the_circle_check_finds_a_circle_inside_a_layer_even_through_a_local_import(tmp_path):
    core = tmp_path / "endoexplain_core"
    package = core / "analysis"
    package.mkdir(parents=True)
    (package / "first.py").write_text("from endoexplain_core.analysis import second\n")
    (package / "second.py").write_text("def late():\n    from endoexplain_core.analysis import first\n")
    (package / "third.py").write_text("from endoexplain_core.analysis import first\n")
    graph = import_graph(sorted(package.glob("*.py")), core=core)
    assert import_circles(graph) == [["endoexplain_core.analysis.first", "endoexplain_core.analysis.second"]]


def functions(paths):
    """(path, function node) for every function and method defined in ``paths``."""
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path, node


def long_functions(paths=MODULES, limit: int = 80) -> list[str]:
    """Functions over ``limit`` lines (docstring included): split them, no excuse accepted."""
    found = []
    for path, node in functions(paths):
        length = node.end_lineno - node.lineno + 1
        if length > limit:
            found.append(f"{path.name}:{node.name} ({length} lines)")
    return found


def test_no_function_over_80_lines():
    assert long_functions() == []


def test_the_long_function_check_can_fail(tmp_path):
    module = tmp_path / "long.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    module.write_text(f'def long():\n    """Long on purpose: a table of constants."""\n{body}\n')
    assert long_functions([module]) == ["long.py:long (87 lines)"]
    module.write_text("def short():\n" + "\n".join(f"    x{i} = {i}" for i in range(79)) + "\n")
    assert long_functions([module]) == []


# Parameters that carry a protocol value (a profile key, or the kernel's name for one): below
# config they must be passed. None is allowed as a default ("not used", checked where needed).
PROTOCOL_PARAMETERS = {
    "top_fraction", "repetitions", "replicates", "seed", "prior_negatives", "score_threshold",
    "score_thresholds", "decision_threshold", "thresholds", "noise_std", "n_regions",
    "energy_alpha", "road_fractions", "shape_repetitions", "n_bins", "split", "fractions",
    "margin", "min_accuracy", "max_control_accuracy", "radius_px", "sigma_px", "batch_size",
}
# Fixed definitions, not profile values: the AUC-IoU threshold grid and top-k sweep are part of
# the metric's formula (the threshold-free paper's), TOST's alpha is the test's convention.
FIXED_DEFINITIONS = {"DEFAULT_IOU_THRESHOLDS", "TOP_K_FRACTIONS", "TOST_ALPHA"}


def protocol_defaults(paths=MODULES) -> list[str]:
    """``module:function(parameter=default)`` for every protocol parameter with a default."""
    found = []
    for path, node in functions(p for p in paths if p.name != "config.py"):
        args = node.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        for arg, default in pairs:
            text = ast.unparse(default)
            if (arg.arg in PROTOCOL_PARAMETERS and text != "None"
                    and text.split(".")[-1] not in FIXED_DEFINITIONS):
                found.append(f"{path.name}:{node.name}({arg.arg}={text})")
    return found


def test_no_protocol_value_has_a_default_below_config():
    assert protocol_defaults() == []


def test_the_protocol_default_check_can_fail(tmp_path):
    module = tmp_path / "defaults.py"
    module.write_text("def rate(table, top_fraction=0.2, replicates=None, *, seed=7):\n    pass\n")
    assert protocol_defaults([module]) == ["defaults.py:rate(top_fraction=0.2)",
                                           "defaults.py:rate(seed=7)"]
