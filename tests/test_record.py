"""The figure index and the run record (index.html), including a headless-Chromium check that
every link in index.html resolves and every image loads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from endoexplain_core import artefacts, marks, presentation  # noqa: E402
from endoexplain_core.pipeline import record  # noqa: E402
from tests.browser import broken_resources, render_in_chromium  # noqa: E402


def fake_run(root: Path) -> tuple[Path, Path, dict]:
    """A run folder and a figures folder shaped like a real smoke run (stages 00, 05, 06, 07)."""
    run_dir, figures_dir = root / "runs" / "smoke", root / "figures" / "smoke"
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [0, 1])
    artefacts.save_figure(fig, "figure5_transfer", figures_dir, dpi=50)
    artefacts.save_figure(fig, "figure 1 workflow", figures_dir, dpi=50)  # a space in a name
    plt.close(fig)
    artefacts.save_table(pd.DataFrame({"a": [1.0]}), "table2_roles", figures_dir)
    artefacts.save_table(pd.DataFrame({"a": [2.0]}), "table_transfer", figures_dir)
    (figures_dir / "stray_note.txt").write_text("written by hand\n")
    stages = []
    for stage, status, files in (
            ("00_roles", "ran", ["table2_roles.csv", "table2_roles.md", "table2_roles.tex"]),
            ("06_transfer", "skipped", ["figure5_transfer.png", "figure5_transfer.pdf",
                                        "table_transfer.csv", "table_transfer.md",
                                        "table_transfer.tex"]),
            ("09_figures", "ran", ["figure 1 workflow.png", "figure 1 workflow.pdf",
                                   "table_transfer.csv"]),
            ("07_extra", "not_run", [])):
        executed = run_dir / "notebooks" / f"{stage}.ipynb"
        if status != "not_run":
            executed.parent.mkdir(parents=True, exist_ok=True)
            executed.write_text("{}")
            executed.with_suffix(".html").write_text(f"<html><body>{stage}</body></html>")
        stages.append({"stage": stage, "notebook": f"notebooks/{stage}.ipynb", "status": status,
                       "seconds": 1.5, "parameters": {"profile": "smoke", "seed": 20260721,
                                                      "note": "a|b"},
                       "executed_notebook": str(executed), "html": str(executed.with_suffix(".html")),
                       "figure_files": files})
    provenance = {"profile": "smoke", "git": {"commit": "abc123", "dirty": True},
                  "packages": {"torch": "2.14.1"}, "device": {"platform": "linux"},
                  "parameters": {}, "manifest_digest": "f" * 64,
                  "checkpoints": {"efficientnet_b0_s1129": "0" * 64}, "stages": stages,
                  "status": "complete", "wall_seconds": 12.0}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "provenance.json").write_text(json.dumps(provenance))
    return run_dir, figures_dir, provenance


def test_figure_index_is_complete_and_attributed(tmp_path):
    run_dir, figures_dir, provenance = fake_run(tmp_path)
    index = record.write_figure_index(figures_dir, provenance["stages"])
    text = index.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    listed = [unquote(re.search(r"\]\(([^)]*)\)", row).group(1)) for row in rows]
    on_disk = sorted(p.name for p in figures_dir.iterdir() if p.is_file() and p.name != "README.md")
    assert sorted(listed) == on_disk                     # every file listed ...
    assert all((figures_dir / name).is_file() for name in listed)   # ... and every listed exists
    by_file = dict(zip(listed, rows))
    assert "09_figures" in by_file["table_transfer.csv"]           # the last writer wins
    assert "06_transfer" in by_file["table_transfer.md"]
    assert "unknown stage" in by_file["stray_note.txt"]
    assert "figure (PDF)" in by_file["figure5_transfer.pdf"]
    assert "### 07_extra" in text and "| seed | 20260721 |" in text
    assert "a\\|b" in text                               # pipes escaped inside table cells


def test_run_index_links_only_existing_files(tmp_path):
    run_dir, figures_dir, provenance = fake_run(tmp_path)
    record.write_figure_index(figures_dir, provenance["stages"])
    page = record.write_run_index(run_dir, figures_dir, provenance).read_text()
    hrefs = re.findall(r'(?:href|src)="([^"]+)"', page)
    anchors = [h for h in hrefs if h.startswith("#")]        # in-page: the id must exist
    assert anchors and all(f'id="{h[1:]}"' in page for h in anchors)
    files = [h for h in hrefs if not h.startswith("#")]
    assert files and all((run_dir / unquote(h)).resolve().is_file() for h in files)
    assert "notebooks/06_transfer.html" in hrefs and "provenance.json" in hrefs
    assert "../../figures/smoke/figure%201%20workflow.png" in hrefs
    assert "07_extra.html (not written)" in page and "status-skipped" in page


# --------------------------------------------------------------------------- browser check

@pytest.mark.browser
def test_index_html_renders_in_chromium_with_every_link_and_image(tmp_path):
    run_dir, figures_dir, provenance = fake_run(tmp_path)
    record.write_figure_index(figures_dir, provenance["stages"])
    page = record.write_run_index(run_dir, figures_dir, provenance)
    report = render_in_chromium(page)
    pngs = sorted(p.name for p in figures_dir.glob("*.png"))
    assert len(report["images"]) == len(pngs) == 2
    assert len(report["links"]) >= 10
    assert broken_resources(report) == []
    # The check can fail: remove one thumbnail's file and it is reported as broken.
    (figures_dir / "figure5_transfer.png").unlink()
    broken = broken_resources(render_in_chromium(page))
    assert any("image" in b and "figure5_transfer.png" in b for b in broken)
    assert any(b.startswith("link") and "figure5_transfer.png" in b for b in broken)


@pytest.mark.browser
def test_screenshots_of_the_record_and_its_figures_are_window_sized_pngs(tmp_path):
    from tests import screenshots

    run_dir, figures_dir, provenance = fake_run(tmp_path)
    record.write_run_index(run_dir, figures_dir, provenance)
    shots = screenshots.record_screenshots(run_dir, tmp_path / "shots")
    assert list(shots) == ["record_first_screen"]                 # no case browser in this run
    with Image.open(shots["record_first_screen"]) as first_screen:
        assert first_screen.size == (1300, 1100)
        low, high = first_screen.convert("L").getextrema()
        assert high - low > 100                                     # a page, not a blank frame
    figures = screenshots.figure_screenshots(figures_dir, tmp_path / "shots")
    assert sorted(figures) == sorted(p.stem for p in figures_dir.glob("figure*.png"))
    assert all(path.stat().st_size > 0 for path in figures.values())


def test_index_html_puts_results_first_banners_brief_figures_then_tables(tmp_path):
    run_dir, figures_dir, provenance = fake_run(tmp_path)
    gate = pd.DataFrame({"method": ["gradcam", "gradcampp", "xgradcam", "hirescam", "eigencam", "random"],
                         "verdict": ["passes", "inconclusive", "passes", "fails", "passes", "fails"]})
    artefacts.save_table(gate, "table_validity_gate", figures_dir)
    long_table = pd.DataFrame({"method": ["gradcam"] * 60, "n": range(60)})
    artefacts.save_table(long_table, "table_paper_comparison", figures_dir)
    (figures_dir / "summary.md").write_text(
        "# Run summary\n\n## In brief\n\n- **Validity gate**: 3 of 5 pass.\n- **Classifier**: fine.\n\n"
        "## Headline numbers\n\nnot in the brief\n")
    provenance["data_root"] = "(embedded synthetic cohort)"
    page = record.write_run_index(run_dir, figures_dir, provenance).read_text()
    order = [page.index(marker) for marker in (
        "Synthetic cohort:", "Validity gate: 3 of 5 CAM methods pass", "<h2>In brief</h2>",
        "<h2>Figures</h2>", "Paper versus this run", 'id="tables"', 'id="notebooks"')]
    assert order == sorted(order)
    assert "Grad-CAM++ inconclusive, HiResCAM fails" in page and "banner-gate-warn" in page
    assert "<strong>Classifier</strong>: fine." in page and "not in the brief" not in page
    assert "(60 rows)" in page and page.count("<tr>") >= 60            # every row, no "first 40"
    assert record.FIGURE_CAPTIONS["figure5_transfer"] in page
    # compute time: the stages' own runs (1.5 s each, three ran or skipped), not the 12 s invocation
    assert "compute behind these results 0.1 min" in page and "this invocation 12.0 s" in page
    real = record.write_run_index(run_dir, figures_dir, {**provenance, "data_root": "/data"}).read_text()
    assert "Synthetic cohort:" not in real


# --------------------------------------------------------------------------- final tables, Figures 1-2

def test_final_table_formats_estimates_cis_p_values_and_labels():
    table = pd.DataFrame({"method": ["gradcam", "eigencam"], "n": [172, 172],
                          "failure": [0.0412, 0.6221], "failure_ci_low": [0.0125, 0.55],
                          "failure_ci_high": [0.07, 0.69], "iou": [0.5, 0.25],
                          "ci_low": [0.4, 0.2], "ci_high": [0.6, 0.3],
                          "p_holm": [0.0004, 0.2], "energy_in_mask": [0.33333, np.nan]})
    final = presentation.final_table(table)
    assert list(final.columns) == ["method", "n", "failure (95% CI)", "iou (95% CI)", "p holm",
                                   "energy in mask"]
    assert final["method"].tolist() == ["Grad-CAM", "Eigen-CAM*"]
    assert final["failure (95% CI)"].tolist() == ["0.041 (0.013 to 0.070)", "0.622 (0.550 to 0.690)"]
    assert final["iou (95% CI)"].iloc[1] == "0.250 (0.200 to 0.300)"
    assert final["p holm"].tolist() == ["<0.001", "0.200"]
    assert final["energy in mask"].tolist() == ["0.333", ""]
    assert final["n"].tolist() == [172, 172]


def test_final_table_shows_a_method_once_even_when_its_label_carries_the_gate_dagger():
    # Table 4's label column is daggered by notebook 03 before notebook 09 formats it.
    table = pd.DataFrame({"method": ["gradcam", "random"], "label": ["Grad-CAM\u2020", "Random heatmap"],
                          "n": [127, 127]})
    assert list(presentation.final_table(table).columns) == ["label", "n"]
    other = table.assign(label=["Grad-CAM (own subset)", "Random heatmap"])
    assert list(presentation.final_table(other).columns) == ["method", "label", "n"]


def test_collect_final_tables_names_missing_files(tmp_path):
    artefacts.save_table(pd.DataFrame({"role": ["train"], "n": [3]}), "table2_roles", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"table3_calibration\.csv \(written by 02_calibration\)"):
        record.collect_final_tables(tmp_path)
    collected = record.collect_final_tables(tmp_path, names={"table2_roles": "00_roles"})
    assert collected["table2_roles"].to_dict("records") == [{"role": "train", "n": 3}]


def test_figure1_workflow_shows_run_counts():
    from endoexplain_core.figures import workflow_figure

    roles = {"train": 70, "val": 15, "test": 15, "spatial_audit": 20}
    gate = pd.DataFrame({"method": ["gradcam", "gradcampp", "xgradcam", "hirescam", "eigencam", "random"],
                         "passes": [True, False, False, True, True, False],
                         "verdict": ["passes", "inconclusive", "fails", "passes", "passes", "fails"]})
    steps = workflow_figure.workflow_steps(roles, n_checkpoints=10, cohort_names=["ETIS", "PolypGen"], gate=gate)
    flow = workflow_figure.exclusion_flow(roles, n_masked_pool=18, n_audited=17, n_panel_a=6, score_threshold=0.9)
    fig = workflow_figure.figure1_workflow(steps, flow, [("ETIS", 30, 1)])
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "70 / 15 / 15 / 20" in texts and "10 checkpoints" in texts and "ETIS, PolypGen" in texts
    assert [s.notebook for s in steps] == ["00", "01", "02", "03", "04", "05", "06", "07", "08"]
    assert "3 of 5 CAMs pass (1 inconclusive, 1 fails)" in texts          # the gate's own verdict
    assert steps[3].face == workflow_figure.GATE_FACE["inconclusive"]
    for shown in ("n = 120", "n = 20", "100 train/val/test", "2 without a mask", "n = 18",
                  "1 empty mask", "n = 6", "11 below 0.90", "ETIS 30 cases, 1 at high score"):
        assert shown in texts, shown
    arrows = [p for p in fig.axes[0].patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(arrows) == (len(steps) - 1) + (len(flow) - 1) == 12
    plt.close(fig)
    with pytest.raises(ValueError, match="grow along the flow"):
        workflow_figure.exclusion_flow(roles, n_masked_pool=18, n_audited=19, n_panel_a=6, score_threshold=0.9)


def test_figure2_panels_from_run_tables(tmp_path):
    from endoexplain_core.figures import calibration_figures

    reliability = pd.DataFrame({"score": ["Raw"] * 3 + ["Temperature-scaled"] * 3,
                                "bin": [0, 5, 9] * 2, "count": [4, 0, 6, 3, 2, 5],
                                "mean_score": [0.05, np.nan, 0.97, 0.08, 0.55, 0.93],
                                "observed_frequency": [0.0, np.nan, 1.0, 0.0, 0.5, 1.0]})
    sensitivity = pd.DataFrame({"score_threshold": [0.8, 0.9] * 2, "method": ["gradcam"] * 2 + ["eigencam"] * 2,
                                "n_eligible": [30, 12, 30, 12], "failure_rate": [0.2, 0.25, 0.6, 0.5],
                                "ci_low": [0.1, 0.1, 0.4, 0.3], "ci_high": [0.3, 0.4, 0.8, 0.7]})
    fig = calibration_figures.figure2_calibration_threshold(reliability, sensitivity)
    panel_a, panel_b = fig.axes
    raw_line = [l for l in panel_a.lines if l.get_label().startswith("Raw (ECE ")][0]
    assert list(raw_line.get_xdata()) == pytest.approx([0.97], abs=0.01)   # empty bin skipped (x nudged)
    open_points = [x for l in panel_a.lines if l.get_markerfacecolor() == "white" for x in l.get_xdata()]
    assert sorted(open_points) == pytest.approx([0.05, 0.08, 0.55], abs=0.01)   # bins under 5: open points
    # each threshold's eligible count under its tick, none printed inside the panel
    assert [t.get_text() for t in panel_b.get_xticklabels()] == ["0.80\n30", "0.90\n12"]
    assert not panel_b.texts
    assert panel_b.get_title(loc="left") == "$\\mathbf{B}$  Failure by threshold"
    counts_row = sorted(t.get_text() for t in panel_a.texts)      # scaled-score bin counts
    assert counts_row == ["2", "3", "5", "n:"]
    assert "Eigen-CAM*" in [t.get_text() for t in panel_b.get_legend().get_texts()]
    plt.close(fig)
    (tmp_path / "bad.csv").write_text("threshold,method\n0.9,gradcam\n")
    with pytest.raises(ValueError, match=r"bad\.csv: missing columns.*05_robustness"):
        calibration_figures.read_checked_csv(tmp_path / "bad.csv",
                                             calibration_figures.THRESHOLD_COLUMNS, "05_robustness")


def test_markdown_prints_counts_as_integers_and_other_floats_rounded(tmp_path):
    # n_test is float only because rows without a test evaluation are NaN.
    table = pd.DataFrame({"n_test": [139.0, np.nan], "n": [2.0, 3.0], "auprc": [0.9991, np.nan],
                          "n_ratio": [0.5, 1.0], "rank": [6.0, 1.0]})
    artefacts.save_table(table, "table_counts", tmp_path)
    lines = (tmp_path / "table_counts.md").read_text().splitlines()
    assert lines[2] == "| 139 | 2 | 0.999 | 0.500 | 6.000 |"
    assert lines[3] == "|  | 3 |  | 1.000 | 1.000 |"
    assert "139.000" not in (tmp_path / "table_counts.tex").read_text()


def test_final_tables_carry_their_footnotes_into_markdown_and_latex(tmp_path):
    from endoexplain_core.analysis import stability, validity_gate

    table = pd.DataFrame({"label": ["Grad-CAM\u2020", "HiResCAM\u2021", "Eigen-CAM*"],
                          "odds ratio": ["1.2 (0.5 to 3.1)", "not estimable (bootstrap interval unbounded: 18 replicates separated)", ""]})
    notes = marks.notes_for(table, synthetic=True)
    assert notes == [marks.GATE_FOOTNOTE, marks.UNSTABLE_FOOTNOTE, "* Eigen-CAM is class-agnostic (no target class).",
                     marks.NOT_ESTIMABLE_NOTE, marks.SYNTHETIC_FOOTER]
    assert marks.notes_for(pd.DataFrame({"label": ["Grad-CAM"]}), synthetic=False) == []
    artefacts.save_table(table, "final_t", tmp_path, notes=notes)
    markdown = (tmp_path / "final_t.md").read_text()
    assert markdown.rstrip().endswith(marks.SYNTHETIC_FOOTER) and marks.GATE_FOOTNOTE[:40] in markdown
    latex = (tmp_path / "final_t.tex").read_text()
    assert r"\par\footnotesize Synthetic cohort" in latex and "\u2020" not in latex and r"\dag{}" in latex
    assert pd.read_csv(tmp_path / "final_t.csv").shape == (3, 2)            # the CSV stays data only


# --------------------------------------------------------------------------- a run that stopped


def failed_in_05(run_dir: Path, figures_dir: Path) -> dict:
    """A provenance whose run stopped in 05_robustness: 04 ran, 06-09 did not; Table 5 and
    Figure 5 are on disk from an earlier run."""
    artefacts.save_table(pd.DataFrame({"panel": ["A"], "method": ["gradcam"], "n": [9],
                                       "peak_failure": [0.3], "peak_failure_ci_low": [0.1],
                                       "peak_failure_ci_high": [0.6], "logit_drop": [1.0],
                                       "logit_drop_ci_low": [0.5], "logit_drop_ci_high": [1.5]}),
                         "table4_spatial_audit", figures_dir)
    artefacts.save_table(pd.DataFrame({"term": ["x"]}), "table5_adjusted_model", figures_dir)
    artefacts.save_table(pd.DataFrame({"cohort": ["ETIS"], "method": ["Grad-CAM"]}), "table_transfer", figures_dir)
    fig, ax = plt.subplots(figsize=(2, 1.5))
    artefacts.save_figure(fig, "figure5_transfer", figures_dir, dpi=40)
    plt.close(fig)
    stages = [{"stage": "04_spatial_audit", "status": "ran", "seconds": 3.0,
               "figure_files": ["table4_spatial_audit.csv"]},
              {"stage": "05_robustness", "status": "failed", "seconds": 2.0, "figure_files": [],
               "error": "05_robustness.ipynb failed in cell 7 (execution count 5): LinAlgError: "
                        "Singular matrix\n  partial notebook kept at /x/05_robustness.ipynb"},
              {"stage": "06_transfer", "status": "not_run", "seconds": 0.0,
               "figure_files": ["table_transfer.csv", "figure5_transfer.png"]},
              {"stage": "09_figures", "status": "not_run", "seconds": 0.0, "figure_files": []}]
    run_dir.mkdir(parents=True, exist_ok=True)
    return {"profile": "smoke", "status": "failed", "stages": stages, "data_root": "(embedded synthetic cohort)"}


def test_a_failed_run_leads_with_the_stage_its_error_and_what_is_missing(tmp_path):
    run_dir, figures_dir = tmp_path / "runs" / "smoke", tmp_path / "figures" / "smoke"
    provenance = failed_in_05(run_dir, figures_dir)
    (figures_dir / "summary.md").write_text("# Run summary\n\n## In brief\n\n- **Validity gate**: STALE SENTENCE.\n")
    page = record.write_run_index(run_dir, figures_dir, provenance).read_text()
    banner = page[page.index('class="banner banner-failed"'):]
    banner = banner[:banner.index("</div>")]
    assert page.index("banner-failed") < page.index("Synthetic cohort:")  # it leads
    assert "Run FAILED in 05_robustness: 05_robustness.ipynb failed in cell 7 (execution count 5): " \
           "LinAlgError: Singular matrix" in banner and "partial notebook" not in banner
    for missing in ("Table 5 (adjusted model) (05_robustness)", "Figure 4 (architecture x seed)",
                    "transfer (RQ4) (06_transfer)", "Figure 5 (transfer) (06_transfer)",
                    "the case browser (09_figures)"):
        assert missing in banner
    assert "Table 4 (RQ1)" not in banner  # 04 finished
    # Files an earlier run left are marked, never shown as this run's
    assert "OUT OF DATE (stage 06_transfer did not finish in this run)" in page
    # The brief is read from what this run finished, not the earlier run's summary.md
    assert "STALE SENTENCE" not in page
    brief = page[page.index("In brief (what this run finished)"):page.index("<h2>Figures</h2>")]
    assert ("RQ1, high score, where does the map look?</strong> No estimate over seeds (stage "
            "05_robustness did not finish in this run): One checkpoint's audit (the primary, on the "
            "9 audit images") in brief
    assert "RQ2, does it persist?</strong> could not be computed (stage 05_robustness did not finish" in brief
    assert "RQ4, transfer:</strong> could not be computed (stage 06_transfer did not finish in this run)" in brief
    # a table of a stage that finished (here: none for the gate) is missing, not blamed on 05
    assert "no CAM method is validated (its table is missing)" in brief and "(baselines: ;" not in brief
    assert record.failure_banner({**provenance, "status": "complete"}) == ""


def test_an_interrupted_run_says_so_in_its_banner(tmp_path):
    run_dir, figures_dir = tmp_path / "runs" / "smoke", tmp_path / "figures" / "smoke"
    provenance = failed_in_05(run_dir, figures_dir)
    provenance["status"] = "interrupted"
    provenance["stages"][1].update(status="interrupted", error=None)
    assert "Run interrupted in 05_robustness (Ctrl-C)." in record.failure_banner(provenance)


@pytest.mark.browser
def test_a_wide_headline_table_fits_the_page_in_chromium(tmp_path):
    """Table 4 has about 20 columns of long numbers: in the record its cells wrap, so the table
    is no wider than the page and its last column is on screen."""
    from tests.browser import run_in_page

    run_dir, figures_dir, provenance = fake_run(tmp_path)
    wide = pd.DataFrame({f"peak_failure_ci_high_column_{i}": [0.123456789 * i] * 3 for i in range(20)})
    artefacts.save_table(wide, "table4_panel_a", figures_dir)
    page = record.write_run_index(run_dir, figures_dir, provenance)
    table_width, page_width, last_right = run_in_page(page, [
        "document.querySelector('.scroll table').getBoundingClientRect().width",
        "document.body.clientWidth",
        "Array.from(document.querySelectorAll('.scroll table tr:first-child th')).pop()"
        ".getBoundingClientRect().right"], wait_seconds=0.0, size=(1100, 900))
    assert table_width <= page_width and last_right <= 1100


def test_a_run_stopped_between_stages_still_gets_its_banner(tmp_path):
    """Ctrl-C while hashing, before the next stage started: no stage is "interrupted", yet the
    record says the run stopped and what is missing from the first stage that did not run."""
    provenance = {"status": "interrupted", "stages": [{"stage": "04_spatial_audit", "status": "ran"},
                                                      {"stage": "05_robustness", "status": "not_run"}]}
    banner = record.failure_banner(provenance)
    assert "Run interrupted before 05_robustness ran." in banner and "Table 5 (adjusted model)" in banner
    assert [r["stage"] for r in record.unfinished_stages(provenance)] == ["05_robustness"]
    blank_error = {"status": "failed", "stages": [{"stage": "05_robustness", "status": "failed", "error": " \n"}]}
    assert "Run FAILED in 05_robustness: no error recorded" in record.failure_banner(blank_error)
