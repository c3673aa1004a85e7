"""Saving figures and tables to ``figures/<profile>/`` in the formats the paper needs.

Every figure is written as PNG (for reading) and PDF (for print); every table as CSV (for
machines), Markdown (for the README index and notebooks) and LaTeX (for the manuscript).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

PRINT_DPI = 300


def save_figure(fig, name: str, figures_dir: str | Path, dpi: int = PRINT_DPI) -> list[Path]:
    """Write ``fig`` as ``<figures_dir>/<name>.png`` and ``.pdf``; return the two paths.

    PDF metadata dates are fixed so that reruns produce byte-identical files.
    """
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    png = figures_dir / f"{name}.png"
    pdf = figures_dir / f"{name}.pdf"
    fig.savefig(png, dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(pdf, bbox_inches="tight", metadata={"CreationDate": None, "ModDate": None})
    return [png, pdf]


def save_table(table: pd.DataFrame, name: str, figures_dir: str | Path,
               float_format: str = "{:.3f}", index: bool = False) -> list[Path]:
    """Write ``table`` as CSV, Markdown and LaTeX under ``figures_dir``; return the paths.

    CSV keeps full precision; Markdown and LaTeX round floats with ``float_format``.
    """
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    csv = figures_dir / f"{name}.csv"
    md = figures_dir / f"{name}.md"
    tex = figures_dir / f"{name}.tex"
    table.to_csv(csv, index=index, lineterminator="\n")
    shown = table.copy()
    for column in shown.columns:
        if pd.api.types.is_float_dtype(shown[column]):
            shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else float_format.format(v))
    md.write_text(_markdown(shown, index=index) + "\n")
    tex.write_text(shown.to_latex(index=index, escape=True))
    return [csv, md, tex]


def _markdown(table: pd.DataFrame, index: bool) -> str:
    """A GitHub-flavoured Markdown table (no dependency on ``tabulate``)."""
    frame = table.reset_index() if index else table
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])
