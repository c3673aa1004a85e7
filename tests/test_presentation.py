"""Tables shown in the notebooks read like the paper's tables: display names, joined CIs, no
0..n index; the kernel hook registers with a real IPython shell."""

import numpy as np
import pandas as pd

from endoexplain_core import presentation


def test_a_range_index_is_dropped_and_names_and_intervals_are_the_papers():
    table = pd.DataFrame({"method": ["gradcam", "eigencam"], "failure_rate": [0.25, 0.5],
                          "failure_rate_ci_low": [0.1, 0.3], "failure_rate_ci_high": [0.4, 0.7],
                          "p_holm": [0.0004, 0.2], "n_eligible": [12.0, 12.0]})
    shown = presentation.presented(table)
    assert list(shown.columns) == ["method", "failure rate (95% CI)", "p holm", "n eligible"]
    assert shown["method"].tolist() == ["Grad-CAM", "Eigen-CAM*"]
    assert shown["failure rate (95% CI)"].tolist() == ["0.250 (0.100 to 0.400)", "0.500 (0.300 to 0.700)"]
    assert shown["p holm"].tolist() == ["<0.001", "0.200"] and shown["n eligible"].tolist() == ["12", "12"]
    html = presentation.to_html(table)
    assert "<th>method</th>" in html and "<th></th>" not in html        # no index column


def test_a_pivot_keeps_its_index_as_a_column_and_labels_method_headers():
    long = pd.DataFrame({"checkpoint_id": ["a", "a", "b", "b"], "method": ["gradcam", "hirescam"] * 2,
                         "failure_own": [0.1, 0.2, 0.3, np.nan]})
    shown = presentation.presented(long.pivot(index="checkpoint_id", columns="method", values="failure_own"))
    assert list(shown.columns) == ["checkpoint id", "Grad-CAM", "HiResCAM"]
    assert shown["HiResCAM"].tolist() == ["0.200", ""]


def test_a_series_becomes_two_columns_and_multiindex_columns_are_joined():
    series = pd.Series({"checkpoint_id": "efficientnet_b0_s1129", "n_audited": 90, "reused": False})
    shown = presentation.presented(series)
    assert list(shown.columns) == ["quantity", "value"] and shown["quantity"].tolist()[1] == "n_audited"
    wide = pd.DataFrame([[1.0, 2.0]], columns=pd.MultiIndex.from_tuples([("iou", "gradcam"), ("iou", "random")]))
    assert list(presentation.presented(wide).columns) == ["iou / Grad-CAM", "iou / Random heatmap"]


def test_install_registers_the_html_form_with_an_ipython_shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        assert presentation.install_notebook_tables(shell)
        data, _ = shell.display_formatter.format(pd.DataFrame({"method": ["xgradcam"], "n": [3]}))
        assert "XGrad-CAM" in data["text/html"] and "<th></th>" not in data["text/html"]
    finally:
        formatter = shell.display_formatter.formatters["text/html"]
        formatter.pop(pd.DataFrame, None)
        formatter.pop(pd.Series, None)
        InteractiveShell.clear_instance()


def test_outside_ipython_install_does_nothing():
    assert presentation.install_notebook_tables() is False


def test_columns_print_by_the_schema_not_by_their_values():
    """A rate that is 0 or 1 on every row stays a rate; a count is a count by dtype or by name
    (``n_*`` with a missing row); p-values by name. The record's and the Markdown file's cells
    come from the same formatter (only the thousands separator differs)."""
    table = pd.DataFrame({"peak_failure": [1.0, 0.0], "n_images": [1234.0, np.nan],
                          "hits": [3.0, 4.0], "n_maps": [5, 2000], "p_holm": [0.0004, 0.5]})
    markdown_cells = presentation.column_texts(table, "{:.3f}")
    record_cells = presentation.column_texts(table, "{:.3f}", thousands=True)
    assert markdown_cells["peak_failure"].tolist() == ["1.000", "0.000"]
    assert markdown_cells["hits"].tolist() == ["3.000", "4.000"]          # not named a count
    assert markdown_cells["n_images"].tolist() == ["1234", ""]
    assert record_cells["n_images"].tolist() == ["1,234", ""]
    assert markdown_cells["n_maps"].tolist() == [5, 2000]                 # integers as they are
    assert record_cells["n_maps"].tolist() == ["5", "2,000"]
    assert markdown_cells["p_holm"].tolist() == record_cells["p_holm"].tolist() == ["<0.001", "0.500"]
    assert presentation.final_table(table)["peak failure"].tolist() == ["1.000", "0.000"]
