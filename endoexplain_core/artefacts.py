"""Saving figures and tables to ``figures/<profile>/``.

``save_figure``: PNG + PDF; ``save_table``: CSV + Markdown + LaTeX; each written atomically
with a provenance sidecar ``<figures_dir>/provenance/<name>.json`` (the files' SHA-256, the
stage from ``STAGE_ENV``, the cell's execution count, and the core function that computed the
table or figure when it was marked by ``computed_by``). ``Written``: a stage's record of its files.

Design: docs/data_models_runs.md, "Artefacts and provenance".
"""

from __future__ import annotations

import functools
import inspect
import os
import textwrap
from pathlib import Path

import pandas as pd

from endoexplain_core import config, files, marks, presentation

PRINT_DPI = 300
PROVENANCE_DIR = "provenance"          # sidecars live in this subfolder of figures_dir
STAGE_ENV = "ENDOEXPLAIN_STAGE"        # set by the orchestrator while a stage's notebook runs


def _execution_count() -> int | None:
    """The running notebook cell's execution count (None outside IPython), read from the input
    history ``In`` (the shell's ``execution_count`` is already advanced while a cell runs)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    history = shell.user_ns.get("In") if shell is not None else None
    return len(history) - 1 if history else None


# Where a table (``DataFrame.attrs``) or a figure (an attribute of the Figure) keeps the function
# that computed it, for its sidecar.
COMPUTED_BY = "computed_by"
_FIGURE_ORIGIN = "_endoexplain_computed_by"
_PACKAGE_PARENT = Path(__file__).resolve().parent.parent


def function_origin(function) -> dict[str, str | int]:
    """{"function": "module.qualname", "file": path relative to the repository (or the installed
    package's parent), "line": first line of its definition} of a core function."""
    function = inspect.unwrap(function)
    path = Path(inspect.getsourcefile(function)).resolve()
    try:
        shown = path.relative_to(_PACKAGE_PARENT).as_posix()
    except ValueError:
        shown = str(path)
    return {"function": f"{function.__module__}.{function.__qualname__}", "file": shown,
            "line": inspect.getsourcelines(function)[1]}


def computed_by(function):
    """Decorator for the core functions that compute a saved table or figure: every DataFrame
    or matplotlib Figure the function returns (alone or in a tuple) remembers
    ``function_origin(function)``, and ``save_table`` / ``save_figure`` write it into the
    artefact's sidecar, so a number in the record leads to the code that computed it."""
    origin = function_origin(function)

    @functools.wraps(function)
    def marked(*args, **kwargs):
        result = function(*args, **kwargs)
        for item in result if isinstance(result, tuple) else (result,):
            if isinstance(item, pd.DataFrame):
                item.attrs[COMPUTED_BY] = origin
            elif hasattr(item, "savefig"):
                setattr(item, _FIGURE_ORIGIN, origin)
        return result

    return marked


def origin_of(artefact) -> dict | None:
    """The ``computed_by`` origin a table or figure carries (None when unmarked)."""
    if isinstance(artefact, pd.DataFrame):
        return artefact.attrs.get(COMPUTED_BY)
    return getattr(artefact, _FIGURE_ORIGIN, None)


def write_sidecar(name: str, paths: list[Path], figures_dir: str | Path, kind: str,
                  computed: dict | None = None) -> Path:
    """Write ``<figures_dir>/provenance/<name>.json`` for the files just saved (see module
    docstring); ``computed``: the artefact's ``origin_of``. Return the sidecar's path."""
    record = {"artefact": name, "kind": kind,
              "files": {path.name: files.sha256_file(path) for path in paths},
              "stage": os.environ.get(STAGE_ENV), "execution_count": _execution_count(),
              "computed_by": computed}
    return files.write_json_atomic(Path(figures_dir) / PROVENANCE_DIR / f"{name}.json", record)


# White margin around a saved figure's tight box (inches): the printed width is the drawn
# width plus twice this (tests/test_figures.py measures both).
SAVE_PAD_INCHES = 0.02


def data_footer(data_root: str | Path | None) -> str:
    """The footer every figure of a run carries: ``marks.SYNTHETIC_FOOTER`` when the run read
    synthetic frames (``config.is_synthetic_data``: the embedded cohort or a generated data root
    such as the mirror), else ""."""
    return marks.SYNTHETIC_FOOTER if config.is_synthetic_data(data_root) else ""


def wrap_to_width(text: str, width_inches: float, *, fontsize: float, share: float = 0.95) -> str:
    """``text`` wrapped (each of its lines) to ``share`` of a ``width_inches`` wide figure at
    ``fontsize`` points (about 0.52 em per character, DejaVu Sans)."""
    characters = max(20, int(width_inches * 72 / (0.52 * fontsize) * share))
    return "\n".join(textwrap.fill(line, width=characters) for line in text.split("\n"))


def save_figure(fig, name: str, figures_dir: str | Path, dpi: int = PRINT_DPI,
                footer: str = "") -> list[Path]:
    """Write ``fig`` as ``<figures_dir>/<name>.png`` and ``.pdf``; return the two paths.

    ``footer`` (e.g. ``data_footer(data_root)``) is printed in small grey type below
    everything else, right-aligned and wrapped to the figure's width (a footer never widens
    the printed figure); the tight bounding box grows to hold it. PDF metadata dates are
    fixed so that reruns produce byte-identical files.
    """
    if footer:
        wrapped = wrap_to_width(footer, fig.get_figwidth(), fontsize=6, share=0.9)
        fig.text(0.995, -0.005, wrapped, ha="right", va="top", fontsize=6, color="#555555")
    figures_dir = Path(figures_dir)   # created by the first replace_atomically
    png = figures_dir / f"{name}.png"
    pdf = figures_dir / f"{name}.pdf"
    # Atomic: a failed or interrupted save (a full disk) keeps the previous good file.
    files.replace_atomically(png, lambda temporary: fig.savefig(
        temporary, format="png", dpi=dpi, bbox_inches="tight", pad_inches=SAVE_PAD_INCHES,
        metadata={"Software": None}))
    files.replace_atomically(pdf, lambda temporary: fig.savefig(
        temporary, format="pdf", bbox_inches="tight", pad_inches=SAVE_PAD_INCHES,
        metadata={"CreationDate": None, "ModDate": None}))
    write_sidecar(name, [png, pdf], figures_dir, "figure", origin_of(fig))
    return [png, pdf]


def save_table(table: pd.DataFrame, name: str, figures_dir: str | Path,
               float_format: str = "{:.3f}", index: bool = False, notes=None,
               synthetic: bool = False) -> list[Path]:
    """Write ``table`` as CSV (full precision), Markdown and LaTeX (``presentation.column_texts``
    with ``float_format``) under ``figures_dir``; return the paths.

    ``notes``: footnotes printed below the Markdown and LaTeX tables (not the CSV); default:
    ``marks.notes_for`` the table's cells, plus the synthetic-cohort note when ``synthetic``.
    """
    figures_dir = Path(figures_dir)   # created by the first replace_atomically
    csv = figures_dir / f"{name}.csv"
    md = figures_dir / f"{name}.md"
    tex = figures_dir / f"{name}.tex"
    files.replace_atomically(csv, lambda temporary: table.to_csv(temporary, index=index,
                                                                lineterminator="\n"))
    shown = presentation.column_texts(table, float_format)
    if notes is None:
        notes = marks.notes_for(shown, synthetic)
    markdown_notes = "".join(f"\n{presentation.markdown_cell(note)}\n" for note in notes)
    files.write_text_atomic(md, presentation.markdown_table(shown, index=index) + "\n" + markdown_notes)
    latex_notes = "".join(f"\\par\\footnotesize {latex_escape(note)}\n" for note in notes)
    files.write_text_atomic(tex, latex_symbols(shown.to_latex(index=index, escape=True) + latex_notes))
    write_sidecar(name, [csv, md, tex], figures_dir, "table", origin_of(table))
    return [csv, md, tex]


def read_table(folder: str | Path, name: str) -> pd.DataFrame | None:
    """The table ``<folder>/<name>.csv`` an earlier stage saved, or None when it is not there."""
    path = Path(folder) / f"{name}.csv"
    return pd.read_csv(path) if path.is_file() else None


def bool_column(table: pd.DataFrame, column: str, missing: bool = False) -> pd.Series:
    """``table[column]`` as bools, whether it holds bools or the "True"/"False" strings a CSV
    round trip leaves; a table without the column gives ``missing`` on every row."""
    if column not in table.columns:
        return pd.Series(missing, index=table.index, dtype=bool)
    return table[column].map(lambda v: str(v).strip().lower() == "true").astype(bool)


# The tables' marks as LaTeX commands: the manuscript compiles with pdflatex, no Unicode font.
LATEX_SYMBOLS = {"\u2020": "\\dag{}", "\u2021": "\\ddag{}", "\u00a7": "\\S{}", "\u2212": "-", "\u2013": "--",
                 "\u2265": "$\\geq$", "\u2264": "$\\leq$", "\u00d7": "$\\times$"}


LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    """Plain text for LaTeX: each special character escaped, in one pass."""
    return "".join(LATEX_SPECIALS.get(char, char) for char in text)


def latex_symbols(text: str) -> str:
    """``text`` (escaped LaTeX) with the Unicode marks of ``LATEX_SYMBOLS`` as LaTeX commands."""
    for symbol, command in LATEX_SYMBOLS.items():
        text = text.replace(symbol, command)
    return text


def display_path(path: str | Path, run_dir: str | Path, figures_dir: str | Path) -> str:
    """``path`` for a notebook's printed output: relative to the output root (the folder holding
    ``runs/`` and ``figures/``) or to the repository when it lies inside one of them, else as
    given (a user's own data folder)."""
    path = Path(path).resolve()
    root = Path(os.path.commonpath([Path(run_dir).resolve(), Path(figures_dir).resolve()]))
    repository = Path(__file__).resolve().parent.parent
    for base in (root, repository):
        if path == base or base in path.parents:
            return path.relative_to(base).as_posix()
    return str(path)


def written_listing(paths, run_dir: str | Path, figures_dir: str | Path) -> str:
    """The files a notebook wrote, sorted, one per line, relative to the output root (the
    folder that holds ``runs/`` and ``figures/``), so an executed notebook names no absolute
    path of the machine it ran on. Duplicates are listed once."""
    root = Path(os.path.commonpath([Path(run_dir).resolve(), Path(figures_dir).resolve()]))
    relative = sorted({Path(os.path.relpath(Path(p).resolve(), root)).as_posix() for p in paths})
    return f"{len(relative)} files written (relative to the output root):\n" + "\n".join(relative)


class Written:
    """The files one stage writes, recorded as it writes them: tables and figures go through
    ``table`` and ``figure`` (``save_table`` / ``save_figure`` into ``figures_dir``, a
    synthetic run's tables marked as such), other files are recorded with ``add``;
    ``listing()`` is the stage's closing list (``written_listing``). The recording methods
    return None, so a cell that ends with one shows no machine path."""

    def __init__(self, run_dir: str | Path, figures_dir: str | Path, *, synthetic: bool):
        self.run_dir, self.figures_dir, self.synthetic = Path(run_dir), Path(figures_dir), synthetic
        self.paths: list[Path] = []

    def table(self, table: pd.DataFrame, name: str, **options) -> None:
        """``save_table(table, name, figures_dir, synthetic=..., **options)``, recorded."""
        self.add(*save_table(table, name, self.figures_dir, synthetic=self.synthetic, **options))

    def figure(self, fig, name: str, **options) -> None:
        """``save_figure(fig, name, figures_dir, **options)``, recorded."""
        self.add(*save_figure(fig, name, self.figures_dir, **options))

    def add(self, *paths: str | Path) -> None:
        """Record files written elsewhere (run-folder tables, checkpoints)."""
        self.paths += [Path(p) for p in paths]

    def listing(self) -> str:
        """The recorded files, sorted and relative to the output root (``written_listing``)."""
        return written_listing(self.paths, self.run_dir, self.figures_dir)
