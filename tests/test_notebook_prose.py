"""The notebooks' prose names the intervals their code computes (issue 52, item 5).

Each interval family has a pattern in prose and the primitives in ``endoexplain_core`` that
compute it (``FAMILIES``). A static call graph of the package (function name -> the names it
calls; by name, so it over-approximates what a call reaches) says which families a notebook's
code cells reach. Two rules:

- every family a notebook's Markdown names is reached by that notebook's code;
- a Markdown cell that names intervals names every family reached by the code cells that
  follow it up to the next Markdown cell (the section whose numbers it describes), so
  "image-bootstrap percentile intervals" above a table whose rates have Wilson intervals fails.
"""

from __future__ import annotations

import ast
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
STUDENT_T = "Student t"
# family -> (its names in prose, the package functions that compute it). A Student t interval
# is every function that calls ``t.ppf`` (found in the source, ``_t_interval_functions``).
FAMILIES = {
    "Wilson": (r"\bWilson\b", {"wilson_interval"}),
    "bootstrap": (r"\bbootstrap", {"bootstrap_indices", "bootstrap_draw_counts", "weighted_pair_mean_ci"}),
    "Clopper-Pearson": (r"\bClopper", {"clopper_pearson_interval"}),
    STUDENT_T: (r"\bStudent(?:'s)? t\b|\bt interval", set()),
    "Newcombe": (r"\bNewcombe\b", {"newcombe_paired_interval"}),
}
# Reached only as a fallback a sentence need not name beside the main interval: the bootstrap
# mean's Student t below ten images (``stats.MIN_BOOTSTRAP_N``).
FALLBACKS = {"_small_sample_t"}


def _called_names(tree: ast.AST) -> set[str]:
    """Names of everything called or handed on in ``tree``: ``f(...)`` -> f, ``module.f(...)``
    and ``partial(module.f, ...)`` -> f."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            names.add(node.func.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return names


def _calls_t_ppf(function: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "ppf" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "t" for n in ast.walk(function))


@lru_cache(maxsize=1)
def _call_graph() -> tuple[dict[str, set[str]], frozenset[str]]:
    """(function name -> names it calls, merged over same-named functions; names of the
    functions that compute a Student t interval)."""
    graph: dict[str, set[str]] = {}
    t_functions = set()
    for path in (ROOT / "endoexplain_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                graph.setdefault(node.name, set()).update(_called_names(node))
                if _calls_t_ppf(node):
                    t_functions.add(node.name)
    return graph, frozenset(t_functions)


def _primitives(family: str) -> set[str]:
    return set(_call_graph()[1]) if family == STUDENT_T else FAMILIES[family][1]


def families_reached(called: set[str], *, fallbacks: bool = True) -> set[str]:
    """Interval families the package functions named in ``called`` reach (transitively)."""
    graph = _call_graph()[0]
    primitives = set().union(*(_primitives(f) for f in FAMILIES))
    seen, todo = set(), [n for n in called if n in graph]
    while todo:
        name = todo.pop()
        if name in seen or (not fallbacks and name in FALLBACKS):
            continue
        seen.add(name)
        if name in primitives:   # an interval built from another (Newcombe from Wilson) is its own
            continue
        todo.extend(n for n in graph.get(name, ()) if n in graph and n not in seen)
    return {family for family in FAMILIES if seen & _primitives(family)}


def families_named(text: str) -> set[str]:
    return {family for family, (pattern, _) in FAMILIES.items() if re.search(pattern, text)}


def _code_names(source: str) -> set[str]:
    """Called names of a code cell (IPython magics and shell lines left out)."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return _called_names(ast.parse("\n".join(lines)))


def sections(notebook: dict) -> list[tuple[str, set[str]]]:
    """(Markdown text, names called by the code cells up to the next Markdown cell) per
    Markdown cell of ``notebook`` (its JSON)."""
    result = []
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            result.append((source, set()))
        elif cell["cell_type"] == "code" and result:
            result[-1][1].update(_code_names(source))
    return result


def prose_problems(notebook: dict) -> list[str]:
    """What the notebook's prose says about intervals that its code does not do (both rules)."""
    parts = sections(notebook)
    everything = set().union(*(names for _, names in parts)) if parts else set()
    everything |= {n for cell in notebook["cells"] if cell["cell_type"] == "code"
                   for n in _code_names("".join(cell["source"]))}
    computed = families_reached(everything)
    problems = []
    for text, names in parts:
        named = families_named(text)
        first_line = text.strip().splitlines()[0][:70] if text.strip() else ""
        problems += [f"{first_line!r} names {family} intervals; no code of the notebook computes one"
                     for family in sorted(named - computed)]
        if named:
            problems += [f"{first_line!r} names {sorted(named)} but its code also computes {family} intervals"
                         for family in sorted(families_reached(names, fallbacks=False) - named)]
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_prose_names_the_intervals_its_code_computes(path):
    assert prose_problems(json.loads(path.read_text())) == []


def _notebook(*cells: tuple[str, str]) -> dict:
    return {"cells": [{"cell_type": kind, "source": source} for kind, source in cells]}


def test_the_old_notebook_04_wording_fails_and_the_new_one_passes():
    """Issue 52: notebook 04 called Table 4's intervals "image-bootstrap percentile" while its
    peak-failure rates have Wilson intervals (``summaries.summarise_columns`` -> ``stats.rate_ci``)."""
    code = "summary = audit_report.audit_summary(table, deletions, model, layer, arch=a, score_threshold=t)"
    old = _notebook(("markdown", "## Table 4\n\nPeak failure ... 95% image-bootstrap\npercentile intervals; "
                                 "within a panel every row uses the same images."), ("code", code))
    problems = prose_problems(old)
    assert len(problems) == 1 and "also computes Wilson intervals" in problems[0]
    new = _notebook(("markdown", "## Table 4\n\nThe peak-failure rate has a Wilson 95% interval; the means "
                                 "have image-bootstrap percentile intervals."), ("code", code))
    assert prose_problems(new) == []
    invented = _notebook(("markdown", "Rates with Clopper-Pearson intervals."), ("code", code))
    assert any("names Clopper-Pearson intervals; no code" in p for p in prose_problems(invented))
