"""How the record presents a table to a reader: one rule for the final tables and for every
table an executed notebook shows.

``column_texts`` prints cells by the column schema (docs/architecture.md, "Table columns");
``final_table`` also joins estimates with their CIs as "0.471 (0.395 to 0.547)" under
"<name> (95% CI)", labels methods and architectures and spaces the headers;
``install_notebook_tables`` shows every DataFrame that way in IPython (no 0..n index);
``Section`` and ``report`` save and show one notebook section. Data files keep full precision.

Design: docs/data_models_runs.md, "Table presentation".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from endoexplain_core.marks import NOT_VALIDATED_MARK
from endoexplain_core.methods import METHOD_LABELS, method_label

ARCH_LABELS = {"efficientnet_b0": "EfficientNet-B0", "resnet34": "ResNet-34",
               "convnext_tiny": "ConvNeXt-Tiny", "resnet18": "ResNet-18",
               "mobilenet_v3_large": "MobileNetV3-Large"}

CI_SUFFIXES = ("_ci_low", "_ci_high")


# --- the column schema (docs/architecture.md, "Table columns") and the one cell formatter ------

def is_p_value_column(name) -> bool:
    """``p``, ``p_*``, ``*_p``, ``*p_value*`` (e.g. ``failure_p_holm``): columns of p-values."""
    name = str(name).lower()
    return name == "p" or name.startswith("p_") or name.endswith("_p") or "p_value" in name or "_p_" in name


def is_count_column(name, values: pd.Series) -> bool:
    """An integer column, or a float column named ``n`` or ``n_*`` holding whole numbers wherever
    it has a value (a count read back from CSV with missing rows: 139.0)."""
    if pd.api.types.is_integer_dtype(values):
        return True
    name, present = str(name), values.dropna()
    return ((name == "n" or name.startswith("n_")) and pd.api.types.is_float_dtype(values)
            and len(present) > 0 and bool(np.all(np.isfinite(present)))
            and bool(np.all(present == np.round(present))))


def format_p_value(value) -> str:
    """A p-value for print: "<0.001" below 0.001, else three decimals; NaN as ""."""
    if pd.isna(value):
        return ""
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def number_text(value, digits: int = 3, *, missing: str = "") -> str:
    """``value`` with ``digits`` decimals; ``missing`` for None or NaN."""
    return missing if value is None or pd.isna(value) else f"{float(value):.{digits}f}"


def column_texts(table: pd.DataFrame, float_format: str = "{:.3f}", *,
                 thousands: bool = False) -> pd.DataFrame:
    """``table`` with its number columns as the text a reader sees, by the column schema above:
    p-values as ``format_p_value``, counts as whole numbers (with thousands separators when
    ``thousands``, for counts of 1,000 and more), other floats with ``float_format``; missing
    values as "". Text columns are left as they are."""
    shown = table.copy()
    for column in shown.columns:
        values = shown[column]
        if is_count_column(column, values):
            if thousands and values.abs().max() >= 1000 or pd.api.types.is_float_dtype(values):
                pattern = "{:,.0f}" if thousands else "{:.0f}"
                shown[column] = values.map(lambda v, p=pattern: "" if pd.isna(v) else p.format(v))
        elif pd.api.types.is_float_dtype(values):
            pattern = float_format
            if is_p_value_column(column):
                shown[column] = values.map(format_p_value)
            else:
                shown[column] = values.map(lambda v, p=pattern: "" if pd.isna(v) else p.format(v))
    return shown


def printable(text: str) -> str:
    """``text`` on one line: line breaks as spaces, other control characters (terminal escape
    sequences in a file name) as visible ``\\xNN`` codes."""
    text = text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return "".join(c if c.isprintable() or c == " " else f"\\x{ord(c):02x}" for c in text)


# Characters Markdown (and the notebook's MathJax) would read as markup in a name from data.
MARKDOWN_SPECIAL = "\\`*_[]$<>|"


def markdown_literal(value) -> str:
    """``value`` as literal Markdown text (``printable``, every markup character backslash-
    escaped), so a file name such as "price $5 and $6.png" is shown as written, not as math."""
    return "".join(f"\\{c}" if c in MARKDOWN_SPECIAL else c for c in printable(str(value)))


def markdown_cell(value) -> str:
    """``value`` as one Markdown table cell: ``printable`` with the pipe escaped."""
    return printable(str(value)).replace("|", "\\|")


def markdown_table(table: pd.DataFrame, index: bool = False) -> str:
    """A GitHub-flavoured Markdown table of ``table``'s cells as they are (format them first,
    e.g. with ``column_texts``); no dependency on ``tabulate``."""
    frame = table.reset_index() if index else table
    header = "| " + " | ".join(markdown_cell(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(markdown_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def estimate_with_ci(estimate, low, high, digits: int = 3, *, missing: str = "") -> str:
    """An estimate and its interval as a reader sees it: ``"0.471 (0.395 to 0.547)"``;
    ``missing`` for a NaN estimate; ``"0.183 (CI n/a)"`` when a bound is NaN (one image has no
    interval: never "0.183 ( to )")."""
    if pd.isna(estimate):
        return missing
    if pd.isna(low) or pd.isna(high):
        return f"{number_text(estimate, digits)} (CI n/a)"
    return f"{number_text(estimate, digits)} ({number_text(low, digits)} to {number_text(high, digits)})"


def _ci_columns(columns: list[str]) -> list[tuple[str, str, str]]:
    """(estimate, low, high) column triples: ``x, x_ci_low, x_ci_high`` anywhere, and bare
    ``ci_low, ci_high`` that directly follow their estimate column."""
    triples = []
    for column in columns:
        low, high = f"{column}{CI_SUFFIXES[0]}", f"{column}{CI_SUFFIXES[1]}"
        if low in columns and high in columns:
            triples.append((column, low, high))
    position = {c: i for i, c in enumerate(columns)}
    if "ci_low" in position and "ci_high" in position and position["ci_low"] > 0:
        estimate = columns[position["ci_low"] - 1]
        if (estimate, "ci_low", "ci_high") not in triples:
            triples.append((estimate, "ci_low", "ci_high"))
    return triples


def final_table(table: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """One consistent presentation of a paper table (text cells): CI triples joined by
    ``estimate_with_ci`` under ``<name> (95% CI)``, other cells by ``column_texts`` with
    ``digits`` and thousands separators, methods and architectures by their display labels (a
    ``method`` column dropped when ``label`` shows it), underscores in headers as spaces."""
    shown = table.copy()
    if "method" in shown.columns:
        shown["method"] = shown["method"].map(lambda m: method_label(m) if isinstance(m, str) else m)
        # A label may already carry the validity gate's dagger ("Grad-CAM†"): still the same name.
        undaggered = shown["label"].astype(str).str.rstrip(NOT_VALIDATED_MARK) if "label" in shown.columns else None
        if undaggered is not None and (undaggered == shown["method"]).all():
            shown = shown.drop(columns="method")
    if "arch" in shown.columns:
        shown["arch"] = shown["arch"].map(lambda a: ARCH_LABELS.get(a, a))
    columns = list(shown.columns)
    for estimate, low, high in _ci_columns(columns):
        combined = [estimate_with_ci(e, lo, hi, digits)
                    for e, lo, hi in zip(shown[estimate], shown[low], shown[high])]
        shown[estimate] = combined
        shown = shown.drop(columns=[low, high]).rename(columns={estimate: f"{estimate} (95% CI)"})
    shown = column_texts(shown, f"{{:.{digits}f}}", thousands=True)
    return shown.rename(columns=lambda c: str(c).replace("_", " "))




# --- tables shown in the notebooks -----------------------------------------------------------------

def presented(table: pd.DataFrame | pd.Series) -> pd.DataFrame:
    """The display form of ``table`` (a copy): ``final_table`` after the index and headers are
    made readable. A Series becomes two columns (its index name or "quantity", and its name or
    "value"); a non-range index becomes leading column(s) (a pivot's methods or checkpoints);
    MultiIndex columns are joined with " / "; a method key used as a header gets its label."""
    if isinstance(table, pd.Series):
        frame = table.rename_axis(table.index.name or "quantity").reset_index(name=table.name or "value")
    else:
        frame = table.copy()
        if isinstance(frame.columns, pd.MultiIndex):
            frame.columns = [" / ".join(_header(part) for part in column if str(part) != "")
                             for column in frame.columns]
        else:
            frame.columns = [_header(column) for column in frame.columns]
        if not isinstance(frame.index, pd.RangeIndex):
            names = [name if name is not None else "" for name in frame.index.names]
            frame = frame.rename_axis([n or f"level {i}" for i, n in enumerate(names)]).reset_index()
    return final_table(frame)


def _header(column) -> str:
    """A column header: a map method's key ("gradcam", a pivot column) becomes its label."""
    text = str(column)
    return method_label(text) if text in METHOD_LABELS else text


def to_html(table: pd.DataFrame | pd.Series) -> str:
    """HTML of ``presented(table)``: no index, cells escaped, empty for missing values."""
    return presented(table).to_html(index=False, escape=True, na_rep="", border=0)


def install_notebook_tables(shell=None) -> bool:
    """Show every DataFrame and Series of this IPython session with ``to_html``. Returns False
    (and does nothing) outside IPython, e.g. when a notebook's code is imported as a script."""
    if shell is None:
        from IPython import get_ipython
        shell = get_ipython()
    if shell is None:
        return False
    formatter = shell.display_formatter.formatters["text/html"]
    formatter.for_type(pd.DataFrame, to_html)
    formatter.for_type(pd.Series, to_html)
    return True


# --- one notebook section ----------------------------------------------------------------------

@dataclass
class Section:
    """What one notebook section reports, built by a tested core function and shown by ``report``.

    ``tables``: name -> table saved under ``figures_dir`` (``artefacts.save_table``);
    ``float_formats``: name -> ``float_format`` for the tables that need more digits;
    ``figures``: name -> Matplotlib figure saved as PNG + PDF and shown;
    ``files``: run-folder files the section's computation wrote (recorded, not shown);
    ``views``: what a reader sees, in order (tables, or text shown as Markdown);
    ``statement``: the section's finding in words (Markdown), shown last."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    float_formats: dict[str, str] = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    views: list = field(default_factory=list)
    statement: str = ""


def report(section: Section, written: "artefacts.Written", *, footer: str = "") -> None:
    """Save ``section``'s tables and figures through ``written`` (figures with ``footer``),
    record its files, then show its figures, its views and its statement in that order."""
    from IPython.display import Markdown, display
    import matplotlib.pyplot as plt

    for name, table in section.tables.items():
        options = {"float_format": section.float_formats[name]} if name in section.float_formats else {}
        written.table(table, name, **options)
    written.add(*section.files)
    for name, figure in section.figures.items():
        written.figure(figure, name, footer=footer)
        display(figure)
        plt.close(figure)  # shown once, not again at the cell's end
    for view in section.views:
        display(Markdown(view) if isinstance(view, str) else view)
    if section.statement:
        display(Markdown(section.statement))
