"""The audit record of a run: the figure index (``figures/<profile>/README.md``),
``runs/<profile>/index.html``, and the paper's final tables in one format (notebook 09).

Both are written by the orchestrator at the end of ``run_all.sh`` from the provenance record's
``stages`` list, whose entries look like ``{"stage": "06_transfer", "notebook":
"notebooks/06_transfer.ipynb", "status": "ran" | "skipped" | "failed" | "not_run", "seconds":
float, "parameters": {...}, "executed_notebook": "<abs .ipynb>", "html": "<abs .html>",
"figure_files": ["figure5_transfer.png", ...]}``. Nothing here knows the stage names, so
notebooks added after 06 are picked up unchanged.

Conventions: a file written by several stages is attributed to the last of them (the one whose
version is on disk); a file that no stage claims is still listed, as "unknown stage", so that
the index is complete. Every link is relative, so the record opens from disk, and a link is
only written for a file that exists.
"""

from __future__ import annotations

from html import escape
import json
import os
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from endoexplain_core.run_layout import RunLayout
from endoexplain_core.analysis import adjusted_model
from endoexplain_core.analysis.validity_gate import DAGGER
from endoexplain_core import artefacts, files, presentation
from endoexplain_core.figures import style
from endoexplain_core.methods import CAM_METHODS, method_label
from endoexplain_core.pipeline import summary

INDEX_NAME = "README.md"
UNKNOWN_STAGE = "unknown stage"
FILE_KINDS = {".png": "figure (PNG)", ".pdf": "figure (PDF)", ".csv": "table (CSV)",
              ".md": "table (Markdown)", ".tex": "table (LaTeX)"}


def figure_files(figures_dir: str | Path) -> list[str]:
    """Every file under ``figures_dir`` (POSIX paths relative to it), except the index itself
    and hidden temporary files, sorted."""
    figures_dir = Path(figures_dir)
    if not figures_dir.is_dir():
        return []
    return sorted(p.relative_to(figures_dir).as_posix() for p in figures_dir.rglob("*")
                  if p.is_file() and p.name != INDEX_NAME and not p.name.startswith(".")
                  and p.relative_to(figures_dir).parts[0] != artefacts.PROVENANCE_DIR)


def link_provenance(figures_dir: str | Path, stage: str, executed_notebook: str | Path,
                    parameters: dict, digest: str) -> list[Path]:
    """Complete the sidecars a stage just wrote (``artefacts.write_sidecar``): the executed
    notebook, the id of the cell whose execution count the sidecar recorded (the HTML export's
    anchor ``#cell-id=<id>``), the stage's parameters and digest. Returns the sidecars updated."""
    import nbformat

    folder = Path(figures_dir) / artefacts.PROVENANCE_DIR
    if not folder.is_dir() or not Path(executed_notebook).is_file():
        return []
    cells = nbformat.read(executed_notebook, as_version=4).cells
    cell_of_count = {cell.get("execution_count"): cell.get("id") for cell in cells
                     if cell.cell_type == "code" and cell.get("execution_count") is not None}
    updated = []
    for path in sorted(folder.glob("*.json")):
        sidecar = json.loads(path.read_text())
        if sidecar.get("stage") != stage:
            continue
        sidecar.update(executed_notebook=Path(executed_notebook).name,
                       cell_id=cell_of_count.get(sidecar.get("execution_count")),
                       parameters=parameters, stage_digest=digest)
        files.write_json_atomic(path, sidecar)
        updated.append(path)
    return updated


def cell_link(figures_dir: str | Path, name: str, run_dir: Path) -> str:
    """An HTML link "cell" to the notebook cell that wrote artefact ``name`` (a file name or
    stem under figures_dir), from its sidecar; "" when there is none."""
    sidecar = Path(figures_dir) / artefacts.PROVENANCE_DIR / f"{Path(name).stem}.json"
    if not sidecar.is_file():
        return ""
    record = json.loads(sidecar.read_text())
    if not record.get("cell_id") or not record.get("executed_notebook"):
        return ""
    page = RunLayout(run_dir).notebooks_dir / Path(record["executed_notebook"]).with_suffix(".html").name
    computed = record.get("computed_by")
    code = (f' | computed by <code>{escape(computed["function"])}</code> '
            f'({escape(computed["file"])}, line {int(computed["line"])})' if computed else "")
    return (f' | <a href="{_href(page, run_dir)}#cell-id={quote(str(record["cell_id"]))}">cell</a>'
            f'{code} | {_link(sidecar, run_dir, "provenance")}')


def attribute_files(figures_dir: str | Path, stage_records: list[dict]) -> dict[str, dict | None]:
    """Map each file in ``figures_dir`` to the stage record that wrote it (``None`` if none)."""
    producer: dict[str, dict] = {}
    for record in stage_records:  # in execution order: a later writer wins
        for name in record.get("figure_files") or []:
            producer[name] = record
    return {name: producer.get(name) for name in figure_files(figures_dir)}


def _kind(name: str) -> str:
    return FILE_KINDS.get(Path(name).suffix.lower(), f"other ({Path(name).suffix or 'no suffix'})")


def _markdown_cell(value) -> str:
    """A parameter or file name as one Markdown cell (non-text values as JSON)."""
    return presentation.markdown_cell(value if isinstance(value, str) else json.dumps(value, default=str))


def stage_timing(record: dict) -> tuple[str, float]:
    """Status text and seconds of the run that produced a stage's artefacts.

    A stage skipped because nothing changed (or left out by ``--only``) did not run now; its
    artefacts come from the last run that finished it, whose duration and finishing time are
    in ``<run_dir>/stamps/<stage>.json``. Returns e.g. ``("skipped: unchanged since the run
    finished 2026-11-30T23:10:02", 367.2)`` instead of 0.0 s.
    """
    status = str(record.get("status", "unknown"))
    seconds = float(record.get("seconds") or 0.0)
    if status not in ("skipped", "not_run"):
        return status, seconds
    stamp = {}
    if record.get("executed_notebook"):
        stamp_path = Path(record["executed_notebook"]).parent.parent / "stamps" / f"{record['stage']}.json"
        if stamp_path.is_file():
            stamp = json.loads(stamp_path.read_text())
    last = stamp.get("seconds", record.get("last_run_seconds"))
    if last is None:
        return status, seconds
    reason = "unchanged" if status == "skipped" else (
        "not requested (up to date)" if record.get("up_to_date") else "not requested (out of date)")
    when = f" since the run finished {stamp['finished']}" if stamp.get("finished") else ""
    return f"{status}: {reason}{when}", float(last)


def write_figure_index(figures_dir: str | Path, stage_records: list[dict]) -> Path:
    """Write ``<figures_dir>/README.md``: every figure and table file with the notebook and
    parameters that produced it. Returns the path of the index."""
    figures_dir = Path(figures_dir)
    attribution = attribute_files(figures_dir, stage_records)
    lines = [f"# Figures and tables: profile `{figures_dir.name}`", "",
             "Generated at the end of `run_all.sh` by `endoexplain_core.pipeline.record`; do not edit. "
             "Each file is listed with the notebook that wrote it; that notebook's parameters "
             "are listed below the table.", "",
             "| file | kind | produced by |", "|---|---|---|"]
    for name, record in attribution.items():
        producer = (f"[{record['stage']}](#{record['stage']}) (`{record.get('notebook', '')}`)"
                    if record else UNKNOWN_STAGE)
        lines.append(f"| [{_markdown_cell(name)}]({quote(name)}) | {_kind(name)} | {producer} |")
    if not attribution:
        lines.append("| (no files) | | |")
    lines += ["", "## Notebooks and their parameters", ""]
    for record in stage_records:
        written = sorted(n for n, r in attribution.items() if r is record)
        lines += [f"<a id=\"{record['stage']}\"></a>", f"### {record['stage']}", "",
                  f"Notebook `{record.get('notebook', '')}`, status {stage_timing(record)[0]}, "
                  f"{stage_timing(record)[1]:.1f} s, {len(written)} file(s) on disk "
                  f"from it.", "", "| parameter | value |", "|---|---|"]
        lines += [f"| {_markdown_cell(key)} | {_markdown_cell(value)} |"
                  for key, value in sorted((record.get("parameters") or {}).items())]
        lines.append("")
    unknown = [n for n, r in attribution.items() if r is None]
    if unknown:
        lines += ["### " + UNKNOWN_STAGE, "",
                  f"{len(unknown)} file(s) no stage of this run claims (e.g. left by an earlier "
                  "run or written by hand).", ""]
    path = figures_dir / INDEX_NAME
    files.write_text_atomic(path, "\n".join(lines))
    return path


# --------------------------------------------------------------------------- index.html

_STYLE = """
body { font-family: DejaVu Sans, Arial, sans-serif; margin: 1.5em auto; max-width: 80em;
       padding: 0 1em; line-height: 1.4; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
code { font-size: 0.9em; }
.status-ran { color: #1b7f3b; } .status-skipped { color: #555; }
.status-failed { color: #b00020; font-weight: bold; } .status-not_run { color: #999; }
.banner { padding: 0.6em 1em; border-radius: 4px; margin: 0.6em 0; font-weight: bold; }
.banner-synthetic { background: #fff4d6; border: 1px solid #e0b000; }
.banner-gate-pass { background: #e3f4e8; border: 1px solid #1b7f3b; }
.banner-gate-warn { background: #fde8e8; border: 1px solid #b00020; }
.banner-failed { background: #b00020; color: white; } .banner-failed p { margin: 0.2em 0; }
.banner-failed ul { margin: 0.2em 0; font-weight: normal; }
.brief li { margin: 0.3em 0; }
.facts { color: #444; font-size: 0.9em; }
.scroll { overflow-x: auto; max-height: 32em; overflow-y: auto; border: 1px solid #eee;
          margin-bottom: 1.5em; }
.scroll table { margin: 0; }
.scroll td, .scroll th { white-space: normal; max-width: 14em; overflow-wrap: anywhere; }
table.gate { width: 100%; } table.gate td:nth-child(3) { min-width: 30em; }
details { margin: 0.4em 0 1em; } summary { cursor: pointer; }
.gallery { display: grid; grid-template-columns: repeat(auto-fill, minmax(24em, 1fr)); gap: 1.2em; }
figure { margin: 0; }
figure img { width: 100%; max-height: 22em; object-fit: contain; border: 1px solid #ddd;
             background: white; }
figcaption { font-size: 0.85em; }
figcaption .file { color: #666; word-break: break-all; }
"""


def _href(target: Path, start: Path) -> str:
    """Relative, URL-quoted link from folder ``start`` to ``target``."""
    return quote(Path(os.path.relpath(target, start)).as_posix())


def _link(target: Path, start: Path, text: str) -> str:
    """An ``<a>`` to ``target`` if it exists, else the plain text marked as missing."""
    if target.is_file():
        return f'<a href="{_href(target, start)}">{escape(text)}</a>'
    return f"{escape(text)} (not written)"


def _parameter_table(parameters: dict) -> str:
    rows = "".join(f"<tr><td><code>{escape(str(k))}</code></td>"
                   f"<td><code>{escape(json.dumps(v, default=str))}</code></td></tr>"
                   for k, v in sorted(parameters.items()))
    return (f"<details><summary>{len(parameters)} parameters</summary>"
            f"<table>{rows}</table></details>")


# One-sentence captions of the figures (file stem -> caption); others show their file name.
FIGURE_CAPTIONS = {
    "figure1_workflow": "Figure 1. The audit's stages, from content-hashed study roles to transfer.",
    "figure2_calibration_threshold": "Figure 2. (A) Reliability of the primary's scores before and "
                                     "after temperature scaling; (B) peak failure per map against "
                                     "the score threshold, with the images each threshold keeps.",
    "figure3_cases": "Figure 3. High-score cases chosen by rule (a miss by most CAMs, discordant CAMs, "
                     "consensus): each map's peak, top-20% area, IoU and the peak's distance "
                     "from the lesion, beside the centre and random baselines.",
    "figure4_robustness": "Figure 4. The architecture x seed matrix: peak failure on each "
                          "checkpoint's own high-score subset (A) and on the primary's (B); logit "
                          "drop after deleting the top area, against random deletion (C).",
    "figure5_transfer": "Figure 5. The frozen primary on external cohorts: mean IoU of each map "
                        "with the polyp (95% CI) beside the centre baseline.",
    "figure_s1_training_curves": "Figure S1. Training loss and validation AUPRC per epoch of every "
                                 "checkpoint of the matrix.",
    "figure_s2_reliability": "Figure S2. Reliability diagram of the test split (raw and "
                             "temperature-scaled scores) and the images per score bin.",
    "figure_s_extended_iou_curves": "IoU of each map with the lesion mask against the map "
                                    "threshold; the legend gives the area under the curve.",
    "figure_s_extended_top_k": "Top-k sweep: IoU of the top k% pixels with the lesion, and the "
                               "share of top-k saliency inside it, for k = 5-50%.",
    "figure_s_extended_energy_lift": "Energy lift: each map's energy inside the lesion relative to "
                                     "the lesion's area, in bits (0 = a uniform map).",
    "figure_s_extended_c_score": "C-Score: consistency of each method's maps across correctly "
                                 "classified images.",
    "figure_s_faithfulness_road": "ROAD: drop of the scaled score when the most (MoRF) or least "
                                  "(LeRF) relevant pixels are filled by noisy linear imputation.",
    "figure_s_faithfulness_srg": "Symmetric relevance gain (MoRF minus LeRF drop), and deletion "
                                 "beyond shape-preserving and pixel-wise random controls.",
    "figure_s_faithfulness_randomisation": "Cascading randomisation: similarity of each map to the "
                                           "trained model's as blocks are re-initialised from the head.",
    "figure_s_faithfulness_subgroups": "Adjusted subgroup gaps in peak failure on the external "
                                       "cohorts, with the equivalence margin.",
    "contact_sheet": "Contact sheet: the first frames of every category and external cohort "
                     "(segmented masks outlined).",
}

# The tables shown inline at the top of index.html: file stem -> heading.
# (The validity gate has its own section, ``gate_section_html``: verdicts and reasons first.)
HEADLINE_TABLES = {"table3_calibration": "Table 3: calibration of the primary checkpoint",
                   "table4_panel_a": "Table 4, panel A: high-score population (one checkpoint's audit; "
                                     "intervals conditional on this checkpoint)",
                   "table4_over_seeds": "Table 4 over seeds: panel A as a mean over the learned seeds",
                   "table_verdict_stability": "Do the headline verdicts hold under a perturbed seed?",
                   "table5_adjusted_model_formatted": "Table 5: adjusted failure model",
                   "table_paper_comparison": "Paper versus this run"}


def headline_tables_html(figures_dir: str | Path, run_dir: str | Path, stage_records: list[dict],
                         tables: dict[str, str] = HEADLINE_TABLES,
                         stale: dict[str, str] | None = None) -> list[str]:
    """HTML blocks for the headline tables that exist in ``figures_dir``: heading, the whole
    table formatted like the paper's final tables (``presentation.final_table``) in a scroll box, and links
    to the CSV and to the executed notebook (HTML) that wrote it. Missing tables are skipped."""
    figures_dir, run_dir = Path(figures_dir), Path(run_dir)
    attribution = attribute_files(figures_dir, stage_records)
    blocks = ["<h2>Headline tables</h2>"]
    for stem, heading in tables.items():
        path = figures_dir / f"{stem}.csv"
        if not path.is_file():
            continue
        table = presentation.final_table(pd.read_csv(path))
        producer = attribution.get(f"{stem}.csv")
        source = _link(path, run_dir, path.name)
        if producer and producer.get("html"):
            source += " from " + _link(Path(producer["html"]), run_dir, producer["stage"])
        source += cell_link(figures_dir, stem, run_dir)   # the very cell, and the function
        if f"{stem}.csv" in (stale or {}):
            heading = f"{heading} (OUT OF DATE: {stale[f'{stem}.csv']})"
        blocks += [f"<h3>{escape(heading)}</h3>", f"<p>{source} ({len(table)} rows)</p>",
                   '<div class="scroll">'
                   + table.to_html(index=False, escape=True, na_rep="", border=0) + "</div>"]
    return blocks if len(blocks) > 1 else []


def gate_section_html(figures_dir: Path, run_dir: Path) -> list[str]:
    """The validity gate on one screen: per method its verdict, one sentence why, the rates of
    each draw and the resolution ceiling (``gate_report.gate_overview``), the full gate table
    and its per-clause table folded below. [] when the gate has not run; a gate table written
    before the per-clause table existed is shown whole."""
    from endoexplain_core.analysis import gate_report

    gate_path, clause_path = figures_dir / "table_validity_gate.csv", figures_dir / "table_validity_gate_clauses.csv"
    if not gate_path.is_file():
        return []
    gate = pd.read_csv(gate_path)
    blocks = ['<h2 id="gate">Validity gate</h2>']
    if clause_path.is_file() and "verdict" in gate.columns:
        replicates_path = figures_dir / "table_validity_gate_replicates.csv"
        overview = gate_report.gate_overview(
            gate, pd.read_csv(clause_path),
            pd.read_csv(replicates_path) if replicates_path.is_file() else None)
        blocks.append(overview.to_html(index=False, escape=True, border=0, classes="gate"))
    folded = [("The full gate table", gate_path), ("Each clause: draws, spread, one new draw", clause_path)]
    for title, path in folded:
        if path.is_file():
            table = pd.read_csv(path)
            blocks.append(f"<details><summary>{escape(title)} ({len(table.columns)} columns; "
                          f"{_link(path, run_dir, path.name)})</summary><div class=\"scroll\">"
                          + table.to_html(index=False, escape=True, na_rep="", border=0)
                          + "</div></details>")
    return blocks


def _cpu_numerics_text(provenance: dict) -> str:
    """One line for the record's header: the CPU pin in force and what the CPU offers."""
    facts = (provenance.get("device") or {}).get("cpu_numerics")
    if not facts:
        return "not recorded"
    detected = facts.get("detected") or {}
    pinned = ", ".join(f"{k}={v}" for k, v in (facts.get("pinned") or {}).items())
    return (f"pin {facts.get('pin')} ({pinned}); ATen kernels {facts.get('aten_capability')}; "
            f"detected {detected.get('model')} (best {detected.get('best_isa')}); "
            f"{facts.get('torch_threads')} torch threads; torch {facts.get('torch_version')}")


def compute_seconds(stage_records: list[dict]) -> float:
    """Seconds of compute behind the record's artefacts: each stage's own run (for a stage
    skipped as unchanged, the run that made its files, ``stage_timing``), summed."""
    return sum(stage_timing(record)[1] for record in stage_records)


def is_synthetic(provenance: dict) -> bool:
    """True when the run read synthetic frames (``provenance["synthetic_data"]``: the embedded
    cohort or a generated data root such as the mirror); records written before that key
    existed: no data root."""
    if "synthetic_data" in provenance:
        return bool(provenance["synthetic_data"])
    data_root = str(provenance.get("data_root") or "")
    return not data_root or "synthetic" in data_root


def brief_html(figures_dir: Path, run_dir: Path, provenance: dict | None = None,
               stale: dict[str, str] | None = None) -> list[str]:
    """The summary's "In brief" section as HTML. A complete run: ``summary.md`` (written by
    notebook 09), with a link to it; [] before notebook 09 has run. A failed or interrupted run:
    the brief read now from the tables this run finished, each sentence whose tables it did not
    finish saying so (``summary.verdict_lines`` with ``unavailable``). ``stale``: the run's
    ``stale_files``, when the caller has them already."""
    import mistune

    unfinished = unfinished_stages(provenance or {})
    if unfinished:
        stale = stale_files(figures_dir, provenance) if stale is None else stale
        not_finished = {r["stage"] for r in unfinished}
        unavailable = {Path(n).stem: why for n, why in stale.items() if n.endswith(".csv")}
        # A table of an unfinished stage is unavailable even when no file is stale; a table of a
        # stage that finished keeps its plain "missing" reason.
        unavailable |= {stem: f"stage {stage} did not finish in this run"
                        for stem, stage in summary.BRIEF_TABLES.items()
                        if stage in not_finished and stem not in unavailable}
        lines = summary.verdict_lines(figures_dir, is_synthetic(provenance), unavailable)
        return ["<h2>In brief (what this run finished)</h2>",
                f'<div class="brief">{mistune.html("".join(f"- {line}{chr(10)}" for line in lines))}</div>']
    path = figures_dir / summary.SUMMARY_NAME
    if not path.is_file():
        return []
    text = path.read_text()
    brief = text.split(summary.BRIEF_HEADING, 1)[-1].split("\n## ", 1)[0] if summary.BRIEF_HEADING in text else ""
    if not brief.strip():
        return []
    return ["<h2>In brief</h2>", f'<div class="brief">{mistune.html(brief)}</div>',
            f"<p>All headline numbers: {_link(path, run_dir, summary.SUMMARY_NAME)}</p>"]


# What a reader loses when a stage does not finish: stage -> (what, the file that carries it).
# The end-to-end test checks every file against the stage that writes it in the smoke run.
STAGE_PRODUCTS = {
    "00_roles": [("Table 2 (study roles)", "table2_roles.csv"), ("contact sheet", "contact_sheet.png")],
    "01_training": [("Table S1 and Figure S1 (training)", "table_s1_training.csv")],
    "02_calibration": [("Table 3 (calibration)", "table3_calibration.csv"),
                       ("Figure S2 (reliability)", "figure_s2_reliability.png"),
                       ("source-category table", "table_source_category.csv")],
    "03_validity_gate": [("the validity gate", "table_validity_gate.csv")],
    "04_spatial_audit": [("Table 4 (RQ1)", "table4_spatial_audit.csv"), ("Figure 3 (cases)", "figure3_cases.png")],
    "05_robustness": [("Table 5 (adjusted model)", "table5_adjusted_model.csv"),
                      ("Figure 4 (architecture x seed)", "figure4_robustness.png"),
                      ("threshold, checkpoint and lesion-size sensitivity (RQ2)", "table_threshold_sensitivity.csv"),
                      ("the learned-checkpoint table", "table_checkpoint_learning.csv"),
                      ("Table 4 over seeds (RQ1, RQ2)", "table4_over_seeds.csv"),
                      ("verdict stability", "table_verdict_stability.csv")],
    "06_transfer": [("transfer (RQ4)", "table_transfer.csv"), ("Figure 5 (transfer)", "figure5_transfer.png")],
    "07_extended_localisation": [("extended localisation (AUC-IoU, energy lift, pointing, C-Score)",
                                  "table_s_extended_auc_iou.csv")],
    "08_faithfulness": [("faithfulness (ROAD, SRG, lesion-specific reliance for RQ3, randomisation, subgroups)",
                         "table_s_faithfulness_srg.csv")],
    "09_figures": [("Figures 1 and 2", "figure1_workflow.png"), ("the final tables", "final_table4_spatial_audit.csv"),
                   ("summary.md", "summary.md"), ("the case browser", "cases/index.html")],
}
UNFINISHED = ("failed", "interrupted")


def unfinished_stages(provenance: dict) -> list[dict]:
    """The stage records of a failed or interrupted run from the stage that stopped it on
    (that stage, then every stage that did not run because of it); [] for a complete run."""
    stages = provenance.get("stages") or []
    if provenance.get("status") not in UNFINISHED:
        return []
    stopped = next((i for i, r in enumerate(stages) if r.get("status") in UNFINISHED), None)
    if stopped is None:   # stopped between stages (e.g. Ctrl-C while hashing): the first not run
        stopped = next((i for i, r in enumerate(stages) if r.get("status") == "not_run"), len(stages))
    return stages[stopped:]


def stale_files(figures_dir: Path, provenance: dict) -> dict[str, str]:
    """Files under ``figures_dir`` that a stage which did not finish in this run wrote (in an
    earlier run, or partly in this one) -> why they cannot be trusted here."""
    unfinished = unfinished_stages(provenance)
    if not unfinished:
        return {}
    names = {r["stage"] for r in unfinished}
    attribution = attribute_files(figures_dir, provenance.get("stages") or [])
    products = {name: r["stage"] for r in unfinished for _, name in STAGE_PRODUCTS.get(r["stage"], [])}
    stale = {}
    for name, producer in attribution.items():
        stage = producer["stage"] if producer and producer["stage"] in names else products.get(name)
        if stage:
            stale[name] = f"stage {stage} did not finish in this run"   # whenever it was written
    return stale


def failure_banner(provenance: dict) -> str:
    """A red banner for a failed or interrupted run: the stage, the error in one line, and what
    is missing because of it; for a record marked "running" (a run started on it and has not
    written its own), that it may be stale; "" for a complete run."""
    if provenance.get("status") == "running":
        return ('<div class="banner banner-failed"><p>A run started on this record and has not '
                "written its own: it is still running, or it died without a record (killed, power "
                "lost, disk full). Figures and tables below may be from an earlier run or only "
                "partly rewritten.</p></div>")
    unfinished = unfinished_stages(provenance)
    if not unfinished:
        return ""
    stopped = unfinished[0]
    if stopped.get("status") == "failed":
        error = (str(stopped.get("error") or "").strip().splitlines() or ["no error recorded"])[0]
        what = f"Run FAILED in {stopped['stage']}: {error}"
    elif stopped.get("status") == "interrupted":
        what = f"Run interrupted in {stopped['stage']} ({provenance.get('interrupted_by') or 'Ctrl-C'})."
    else:
        what = f"Run {provenance.get('status')} before {stopped['stage']} ran."
    missing = [f"{label} ({r['stage']})" for r in unfinished for label, _ in STAGE_PRODUCTS.get(r["stage"], [])]
    others = [r["stage"] for r in unfinished if r["stage"] not in STAGE_PRODUCTS]
    items = "".join(f"<li>{escape(text)}</li>" for text in missing + [f"everything {s} writes" for s in others])
    return (f'<div class="banner banner-failed"><p>{escape(what)}</p>'
            "<p>Missing because of it (a file of these stages on disk is marked out of date):</p>"
            f"<ul>{items}</ul></div>")


def gate_banner(figures_dir: Path) -> str:
    """One line on the validity gate's verdict for the CAM methods, coloured by outcome."""
    path = figures_dir / "table_validity_gate.csv"
    if not path.is_file():
        return ('<p class="banner banner-gate-warn">Validity gate not run: no CAM method is '
                "validated in this record.</p>")
    gate = pd.read_csv(path)
    cams = gate[gate["method"].isin(CAM_METHODS)]
    passing = [method_label(m) for m, v in zip(cams["method"], cams["verdict"]) if v == "passes"]
    others = ", ".join(f"{method_label(m)} {v}" for m, v in zip(cams["method"], cams["verdict"])
                       if v != "passes")
    kind = "pass" if len(passing) == len(cams) else "warn"
    text = (f"Validity gate: {len(passing)} of {len(cams)} CAM methods pass"
            + (f" ({', '.join(passing)})" if passing else "")
            + (f"; {others}. Their rates are marked {DAGGER} and say nothing about lesion "
               "localisation." if others else "."))
    return f'<p class="banner banner-gate-{kind}">{escape(text)}</p>'


def figure_gallery(figures_dir: Path, run_dir: Path, names: list[str],
                   stale: dict[str, str] | None = None) -> list[str]:
    """Captioned figures (paper figures first), each linked to its PNG, PDF and notebook cell;
    a figure in ``stale`` (name -> why) is captioned as out of date."""
    stale = stale or {}
    pngs = [n for n in names if n.lower().endswith(".png")]
    order = {stem: i for i, stem in enumerate(FIGURE_CAPTIONS)}
    pngs.sort(key=lambda n: (order.get(Path(n).stem, len(order)), n))
    items = []
    for name in pngs:
        png = figures_dir / name
        pdf = png.with_suffix(".pdf")
        caption = FIGURE_CAPTIONS.get(Path(name).stem, "")
        if name in stale:
            caption = f"OUT OF DATE ({stale[name]}). {caption}"
        links = _link(png, run_dir, name) + (f" | {_link(pdf, run_dir, 'PDF')}" if pdf.is_file() else "")
        items.append(f'<figure><a href="{_href(png, run_dir)}"><img src="{_href(png, run_dir)}"'
                     f' alt="{escape(caption or name)}" loading="eager"></a>'
                     f"<figcaption>{escape(caption)} <span class=\"file\">{links}"
                     f"{cell_link(figures_dir, name, run_dir)}</span></figcaption></figure>")
    return ["<h2>Figures</h2>",
            f'<div class="gallery">{"".join(items)}</div>' if items else "<p>no figures</p>"]


def write_run_index(run_dir: str | Path, figures_dir: str | Path, provenance: dict) -> Path:
    """Write ``<run_dir>/index.html``, results first: the synthetic-data and validity-gate
    banners, the summary's "In brief" sentences, captioned figures, the headline tables (all
    rows), every table file; then the executed notebooks (HTML, parameters, status, the seconds
    of the run that made their files), checkpoint hashes and provenance. Returns its path.
    """
    run_dir, figures_dir = Path(run_dir).resolve(), Path(figures_dir).resolve()
    stage_records = provenance.get("stages") or []
    stale = stale_files(figures_dir, provenance)
    names = figure_files(figures_dir)
    headline = headline_tables_html(figures_dir, run_dir, stage_records, stale=stale)
    page = "\n".join(["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
                      f"<title>endoExplain run record ({escape(str(provenance.get('profile')))})"
                      "</title>", f"<style>{_STYLE}</style></head><body>",
                      *_record_head(run_dir, figures_dir, provenance),
                      *brief_html(figures_dir, run_dir, provenance, stale),
                      *gate_section_html(figures_dir, run_dir),
                      *figure_gallery(figures_dir, run_dir, names, stale), *headline,
                      *_table_list(run_dir, figures_dir, names), *_stage_table(run_dir, stage_records),
                      *_checkpoint_list(provenance), "</body></html>", ""])
    path = RunLayout(run_dir).index_html
    files.write_text_atomic(path, page)
    return path


def _record_head(run_dir: Path, figures_dir: Path, provenance: dict) -> list[str]:
    """The title, banners (failure, synthetic data, validity gate) and the run's facts."""
    git = provenance.get("git") or {}
    stage_records = provenance.get("stages") or []
    head = [f"<h1>endoExplain run record: profile <code>{escape(str(provenance.get('profile')))}"
            "</code></h1>", failure_banner(provenance)]
    if is_synthetic(provenance):
        head.append('<p class="banner banner-synthetic">Synthetic cohort: every number and image '
                    "in this record comes from the synthetic cohort the package generates (HyperKvasir-, ETIS-, "
                    "PolypGen- and PolypDB-like frames), not from patients.</p>")
    head.append(gate_banner(figures_dir))
    head += ['<ul class="facts">',
             f"<li>status: {escape(str(provenance.get('status', 'unknown')))}; compute behind "
             f"these results {compute_seconds(stage_records) / 60:.1f} min (sum of the stages' "
             f"own runs); this invocation {float(provenance.get('wall_seconds') or 0.0):.1f} s</li>",
             f"<li>endoExplain {escape(str(provenance.get('endoexplain_version', 'not recorded')))}; "
             f"git commit <code>{escape(str(git.get('commit')))}</code>"
             f"{' (working tree dirty)' if git.get('dirty') else ''}; manifest digest "
             f"<code>{escape(str(provenance.get('manifest_digest')))[:12]}</code>; data: "
             f"{escape(str(provenance.get('data_root', '')))}</li>",
             f"<li>CPU numerics: {escape(_cpu_numerics_text(provenance))}</li>",
             *(["<li>profile overrides (the run is not the profile file's): "
                + "; ".join(f"<code>--set {escape(text)}</code>" for text in provenance["overrides"])
                + "</li>"] if provenance.get("overrides") else []),
             f"<li><strong>{_link(run_dir / 'cases' / 'index.html', run_dir, 'Case browser')}</strong>: "
             "every audited image with its maps, filterable</li>",
             f"<li>{_link(run_dir / 'provenance.json', run_dir, 'provenance.json')} | "
             f"{_link(figures_dir / INDEX_NAME, run_dir, 'figure index')} | "
             '<a href="#notebooks">notebooks</a> | <a href="#tables">all tables</a></li>',
             "</ul>"]
    return head


def _stage_table(run_dir: Path, stage_records: list[dict]) -> list[str]:
    """The executed notebooks: status, seconds, HTML and notebook links, parameters."""
    stage_rows = []
    for record in stage_records:
        status = str(record.get("status", "unknown"))
        status_text, seconds = stage_timing(record)
        html_path = Path(record["html"]) if record.get("html") else None
        notebook_path = (Path(record["executed_notebook"]) if record.get("executed_notebook")
                         else None)
        html_cell = (_link(html_path, run_dir, html_path.name) if html_path else "(none)")
        notebook_cell = (_link(notebook_path, run_dir, notebook_path.name) if notebook_path
                         else "(none)")
        stage_rows.append(
            f"<tr><td>{escape(str(record.get('stage')))}</td>"
            f"<td class=\"status-{escape(status)}\">{escape(status_text)}</td>"
            f"<td>{seconds:.1f}</td>"
            f"<td>{html_cell}<br>{notebook_cell}</td>"
            f"<td>{_parameter_table(record.get('parameters') or {})}</td></tr>")
    return ['<h2 id="notebooks">Notebooks</h2>', "<table><tr><th>stage</th><th>status</th><th>seconds</th>"
            "<th>executed notebook</th><th>parameters</th></tr>", *stage_rows, "</table>"]


def _checkpoint_list(provenance: dict) -> list[str]:
    """The checkpoints' SHA-256 (resume states left out)."""
    # Resume states (``<id>.resume.*``) are training state, not checkpoints of the study.
    checkpoints = {k: v for k, v in (provenance.get("checkpoints") or {}).items()
                   if ".resume" not in k}
    checkpoint_rows = "".join(f"<tr><td>{escape(k)}</td><td><code>{escape(str(v))}</code></td></tr>"
                              for k, v in sorted(checkpoints.items()))
    return ["<h2>Checkpoints (SHA-256)</h2>",
            f"<table>{checkpoint_rows}</table>" if checkpoints else "<p>none</p>"]


def _table_list(run_dir: Path, figures_dir: Path, names: list[str]) -> list[str]:
    """Every table file (CSV, with its Markdown and LaTeX copies and its cell link)."""
    tables = [n for n in names if Path(n).suffix.lower() == ".csv"]
    table_items = "".join(
        f"<li>{_link(figures_dir / n, run_dir, n)}"
        + "".join(f" | {_link((figures_dir / n).with_suffix(s), run_dir, s[1:])}"
                  for s in (".md", ".tex") if (figures_dir / n).with_suffix(s).is_file())
        + cell_link(figures_dir, n, run_dir) + "</li>" for n in tables)
    return ['<h2 id="tables">All tables</h2>',
            f"<ul>{table_items}</ul>" if tables else "<p>no tables</p>"]


# --------------------------------------------------------------------------- final tables

# The paper's tables: the name each earlier notebook saves under ``figures_dir`` -> that notebook.
FINAL_TABLES = {"table2_roles": "00_roles", "table3_calibration": "02_calibration",
                "table4_spatial_audit": "04_spatial_audit",
                "table5_adjusted_model": "05_robustness",
                "table_source_category": "02_calibration", "table_transfer": "06_transfer"}
FINAL_PREFIX = "final_"
# The presentation rules of the final tables live in the foundation (notebooks use them too).


def figure1_inputs(run_dir: str | Path, figures_dir: str | Path, *, score_threshold: float,
                   synthetic: bool):
    """What Figure 1 shows of this run: (steps, exclusion flow, external cohorts).

    Read from the run: the manifest's roles, the registry, the validity gate's table (its
    verdict colours the gate box), the primary's HyperKvasir audit summary (images audited),
    Table 4's panel A n and the transfer table ((cohort, cases, eligible) per external cohort).
    Missing optional parts (no gate, no transfer) are left out of the figure, never invented."""
    from endoexplain_core.analysis import audit_inputs, validity_gate
    from endoexplain_core.data import roles as roles_module
    from endoexplain_core.figures import workflow_figure

    layout, figures_dir = RunLayout(run_dir), Path(figures_dir)
    manifest = roles_module.read_manifest(layout.manifest)
    registry = layout.read_registry()
    role_counts = manifest["role"].value_counts().to_dict()
    external = []
    transfer_path = figures_dir / "table_transfer.csv"
    if transfer_path.is_file():
        per_cohort = pd.read_csv(transfer_path).drop_duplicates("cohort")
        labels = {style.DATASET_LABELS.get(d, d): d for d in style.DATASET_LABELS}
        external = [(style.cohort_label(labels.get(row.cohort, row.cohort), synthetic=synthetic),
                     int(row.n_cases), int(row.n_eligible)) for row in per_cohort.itertuples()]
    steps = workflow_figure.workflow_steps(role_counts, len(registry), [name for name, _, _ in external],
                                           gate=validity_gate.read_gate_table(figures_dir))
    audit_summary = json.loads(layout.audit_paths("hyperkvasir", layout.primary_id())["summary"].read_text())
    table4 = pd.read_csv(figures_dir / "table4_spatial_audit.csv")
    panel_a = table4.loc[table4["panel"] == "A", "n"]
    flow = workflow_figure.exclusion_flow(role_counts, len(audit_inputs.masked_pool(manifest)),
                                          int(audit_summary["n_audited"]),
                                          int(panel_a.max()) if len(panel_a) else 0, score_threshold)
    return steps, flow, external


def collect_final_tables(figures_dir: str | Path, names: dict[str, str] = FINAL_TABLES,
                         digits: int = 3) -> dict[str, pd.DataFrame]:
    """Read each paper table CSV an earlier notebook saved in ``figures_dir`` and format it with
    ``presentation.final_table``. Raises ``FileNotFoundError`` naming the missing file and its notebook."""
    figures_dir = Path(figures_dir)
    missing = [f"{figures_dir / (n + '.csv')} (written by {stage})" for n, stage in names.items()
               if not (figures_dir / f"{n}.csv").is_file()]
    if missing:
        raise FileNotFoundError("paper tables missing: " + "; ".join(missing))
    tables = {}
    for name in names:
        table = pd.read_csv(figures_dir / f"{name}.csv")
        if {"odds_ratio", "estimable", "note"} <= set(table.columns):
            # Odds ratios: separated terms as "not estimable", values beyond 1/1,000..1,000 as
            # bounds, never as numbers set by a penalty (analysis.adjusted_model.format_table).
            firth_path = figures_dir / "table5_firth.csv"
            firth = pd.read_csv(firth_path) if firth_path.is_file() else None
            tables[name] = adjusted_model.format_table(table, digits, firth=firth)
        else:
            tables[name] = presentation.final_table(table, digits)
    return tables
