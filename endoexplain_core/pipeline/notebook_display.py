"""How the notebooks show tables: the paper's presentation, not pandas' working view.

A table displayed in an executed notebook is part of the audit record, so it reads like the final
tables (``record.final_table``): display names for maps and architectures (Eigen-CAM*), CI
columns joined as "0.471 (0.395 to 0.547)", p-values as "<0.001", spaces instead of
underscores, and no 0..n row index. A meaningful index (a pivot's methods or checkpoints) becomes
the first column; method names used as column headers (a pivot's columns) get their labels.

``install()`` is called once at the top of each notebook, like ``style.apply()`` for figures: it
registers the HTML form for DataFrames and Series with the running IPython kernel. The data a
notebook writes (CSV, Parquet) are never touched; only what the reader sees.
"""

from __future__ import annotations

import pandas as pd

from endoexplain_core.figures import style
from endoexplain_core.pipeline import record


def presented(table: pd.DataFrame | pd.Series) -> pd.DataFrame:
    """The display form of ``table`` (a copy): see the module docstring.

    A Series becomes two columns (its index name or "quantity", and its name or "value"); a
    non-range index becomes leading column(s); MultiIndex columns are joined with " / "."""
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
    return record.final_table(frame)


def _header(column) -> str:
    """A column header: a map method's key ("gradcam", a pivot column) becomes its label."""
    text = str(column)
    return style.method_label(text) if text in style.METHOD_LABELS else text


def to_html(table: pd.DataFrame | pd.Series) -> str:
    """HTML of ``presented(table)``: no index, cells escaped, empty for missing values."""
    return presented(table).to_html(index=False, escape=True, na_rep="", border=0)


def install(shell=None) -> bool:
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
