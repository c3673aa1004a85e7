"""From a number to its code (docs/data_models_runs.md, "Artefacts and provenance"): a table or
figure computed by a function marked ``artefacts.computed_by`` carries that function's name,
file and line into its provenance sidecar, and the record prints them beside the cell link."""

import inspect
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from endoexplain_core import artefacts  # noqa: E402


@artefacts.computed_by
def toy_table(n: int) -> pd.DataFrame:
    return pd.DataFrame({"x": range(n)})


@artefacts.computed_by
def toy_figure_and_table():
    fig, _ = plt.subplots()
    return fig, pd.DataFrame({"y": [1.0]})


def test_a_marked_table_names_its_function_file_and_line_in_its_sidecar(tmp_path):
    table = toy_table(3).round(2)                     # pandas keeps attrs through such steps
    artefacts.save_table(table, "table_toy", tmp_path)
    sidecar = json.loads((tmp_path / "provenance" / "table_toy.json").read_text())
    line = inspect.getsourcelines(inspect.unwrap(toy_table))[1]
    assert sidecar["computed_by"] == {"function": "tests.test_computed_by.toy_table",
                                      "file": "tests/test_computed_by.py", "line": line}


def test_every_table_and_figure_of_a_tuple_is_marked_and_unmarked_ones_say_none(tmp_path):
    fig, table = toy_figure_and_table()
    assert artefacts.origin_of(fig)["function"].endswith("toy_figure_and_table")
    assert artefacts.origin_of(table)["function"].endswith("toy_figure_and_table")
    artefacts.save_figure(fig, "figure_toy", tmp_path)
    plt.close(fig)
    assert json.loads((tmp_path / "provenance" / "figure_toy.json").read_text())["computed_by"]["line"] > 0
    artefacts.save_table(pd.DataFrame({"z": [1]}), "table_plain", tmp_path)
    assert json.loads((tmp_path / "provenance" / "table_plain.json").read_text())["computed_by"] is None


def test_the_run_tables_functions_are_marked():
    from endoexplain_core.analysis import calibration, validity_gate
    from endoexplain_core.data import roles

    for function in (calibration.calibration_table, validity_gate.gate_table, roles.table2):
        origin = artefacts.function_origin(function)
        assert origin["file"].startswith("endoexplain_core/") and origin["line"] > 0
        assert inspect.unwrap(function) is not function            # decorated


def test_the_record_prints_the_function_beside_the_cell_link(tmp_path):
    from endoexplain_core.pipeline import record

    artefacts.save_table(toy_table(2), "table_toy", tmp_path)
    sidecar = tmp_path / "provenance" / "table_toy.json"
    data = json.loads(sidecar.read_text())
    data.update(cell_id="abc", executed_notebook="04_spatial_audit.ipynb")
    sidecar.write_text(json.dumps(data))
    link = record.cell_link(tmp_path, "table_toy.csv", tmp_path)
    assert "#cell-id=abc" in link and "computed by <code>tests.test_computed_by.toy_table</code>" in link
    assert "tests/test_computed_by.py, line" in link
