"""Progress bars go to the stage's log under the orchestrator, never into the executed notebook."""

from __future__ import annotations

from pathlib import Path

from endoexplain_core import artefacts, progress


def test_bar_writes_plain_lines_to_the_progress_log_and_nothing_to_stderr(tmp_path, monkeypatch, capsys):
    log = tmp_path / "logs" / "01_training.log"
    log.parent.mkdir()
    monkeypatch.setenv(progress.PROGRESS_LOG_ENV, str(log))
    for _ in progress.progress_bar(range(3), desc="efficientnet_b0_s1129", unit="epoch"):
        pass
    lines = log.read_text().splitlines()
    assert lines and all("\r" not in line for line in lines)
    assert lines[-1].startswith("efficientnet_b0_s1129: 100%") and "3/3" in lines[-1]
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    with progress.progress_bar(total=2, desc="logits") as bar:   # manual updates and postfix
        bar.update(2)
        bar.set_postfix(loss=0.5)
    assert log.read_text().splitlines()[-1].startswith("logits: 100%")
    assert bar._log_stream is None                                 # the bar closed its log file


def test_without_the_log_the_bar_is_an_ordinary_stderr_bar(monkeypatch, capsys):
    monkeypatch.delenv(progress.PROGRESS_LOG_ENV, raising=False)
    for _ in progress.progress_bar(range(2), desc="hashing"):
        pass
    assert "hashing: 100%" in capsys.readouterr().err


def test_written_listing_and_display_path_name_no_absolute_path(tmp_path):
    run_dir, figures_dir = tmp_path / "runs" / "smoke", tmp_path / "figures" / "smoke"
    paths = [run_dir / "checkpoints" / "registry.csv", str(figures_dir / "table2_roles.csv"),
             figures_dir / "table2_roles.csv"]
    listing = artefacts.written_listing(paths, run_dir, figures_dir)
    assert listing.splitlines() == ["2 files written (relative to the output root):",
                                    "figures/smoke/table2_roles.csv",
                                    "runs/smoke/checkpoints/registry.csv"]
    assert str(tmp_path) not in listing
    assert artefacts.display_path(run_dir / "data", run_dir, figures_dir) == "runs/smoke/data"
    repository = Path(artefacts.__file__).resolve().parent.parent
    assert artefacts.display_path(repository / "data_manifest" / "smoke", run_dir, figures_dir) == "data_manifest/smoke"
    elsewhere = Path("/srv/hyperkvasir")
    assert artefacts.display_path(elsewhere, run_dir, figures_dir) == str(elsewhere)   # a user's data


def test_a_callers_file_argument_yields_to_the_stage_log(tmp_path, monkeypatch, capsys):
    # pipeline.tasks once passed file=sys.stdout: under the orchestrator the log still wins
    import sys

    log = tmp_path / "stage.log"
    monkeypatch.setenv(progress.PROGRESS_LOG_ENV, str(log))
    with progress.progress_bar(total=1, desc="tasks", file=sys.stdout) as bar:
        bar.update(1)
    assert "tasks: 100%" in log.read_text() and capsys.readouterr().out == ""


def test_the_written_recorder_saves_through_artefacts_and_lists_every_file(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    run_dir, figures_dir = tmp_path / "runs" / "smoke", tmp_path / "figures" / "smoke"
    written = artefacts.Written(run_dir, figures_dir, synthetic=True)
    # nothing returned: a notebook cell that ends with a recording shows no machine path
    assert written.table(pd.DataFrame({"n": [1.0, 2.0]}), "table_x") is None
    assert [p.name for p in written.paths] == ["table_x.csv", "table_x.md", "table_x.tex"]
    assert "synthetic" in (figures_dir / "table_x.md").read_text().lower()  # the run's synthetic note
    fig, _ = plt.subplots()
    written.figure(fig, "figure_x", footer="a footer")
    plt.close(fig)
    assert (figures_dir / "figure_x.png").is_file() and (figures_dir / "figure_x.pdf").is_file()
    written.add(run_dir / "audit" / "a.parquet", str(run_dir / "audit" / "a.parquet"))
    listing = written.listing()
    assert listing.splitlines()[0] == "6 files written (relative to the output root):"
    assert "runs/smoke/audit/a.parquet" in listing and "figures/smoke/figure_x.pdf" in listing
    assert str(tmp_path) not in listing
