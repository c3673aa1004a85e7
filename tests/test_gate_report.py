"""The validity gate on one screen (analysis.gate_report): a sentence per verdict that names the
clause behind it, and fields that never contradict each other."""

from endoexplain_core.analysis import gate_report, validity_gate
from tests.test_validity_gate import READER, _cue_draws, _draws


def _tables(cases, facts):
    gate = validity_gate.gate_table(cases, facts, margin=0.25)
    clauses = validity_gate.gate_clause_table(cases, facts, margin=0.25)
    replicates = validity_gate.gate_replicate_table(cases, facts, margin=0.25)
    return gate, clauses, replicates, validity_gate.gate_stability(clauses, gate)


def test_each_verdict_gets_a_sentence_naming_its_clause():
    gate, clauses, replicates, _ = _tables(*_cue_draws([4] * 6))
    why = gate_report.gate_overview(gate, clauses, replicates).set_index("map").loc["Grad-CAM", "why"]
    assert why.startswith("fails: the shortcut model's peaks on the cue 0.10")
    assert "0 of 6 draws reach the bar 0.31" in why and "falls short of the bar by" in why
    gate, clauses, replicates, _ = _tables(*_cue_draws([13] * 6))
    why = gate_report.gate_overview(gate, clauses, replicates).set_index("map").loc["Grad-CAM", "why"]
    assert why.startswith("inconclusive: the shortcut model's peaks on the cue 0.33") and "straddles its bar" in why
    gate, clauses, replicates, _ = _tables(*_draws({1: READER, 2: READER, 3: READER}))
    overview = gate_report.gate_overview(gate, clauses, replicates).set_index("map")
    assert overview.loc["Grad-CAM", "why"].startswith("passes: the lesion model's peaks in the polyp 1.00")
    assert overview.loc["Grad-CAM", "why"].endswith("every control stays under its bar.")
    assert overview.loc["Grad-CAM", "shortcut model per draw"] == "1.00 / 1.00 / 1.00"


def test_a_verdict_without_clauses_to_read_repeats_the_tables_reason():
    gate, clauses, replicates, _ = _tables(*_draws({1: READER}))
    why = gate_report.gate_overview(gate, clauses, replicates).set_index("map").loc["Grad-CAM", "why"]
    assert why.startswith("inconclusive: one usable replicate")


def test_the_gate_tables_never_contradict_each_other():
    for cases, facts in (_cue_draws([4] * 6), _cue_draws([13] * 6), _cue_draws([8, 32, 32, 32, 32, 32])):
        gate, _, _, stability = _tables(cases, facts)
        assert gate_report.contradictions(gate, stability) == []
    gate, _, _, stability = _tables(*_cue_draws([30] * 3))
    broken = gate.copy()
    broken.loc[broken["method"] == "gradcam", "passes"] = not bool(broken.loc[broken["method"] == "gradcam", "passes"].iloc[0])
    assert any("gradcam: passes=" in p for p in gate_report.contradictions(broken))
    stale = stability.assign(verdict="fails")
    assert any("stability says fails" in p for p in gate_report.contradictions(gate, stale))


def test_the_record_shows_every_verdict_and_reason_without_the_wide_table(tmp_path):
    from endoexplain_core import artefacts
    from endoexplain_core.pipeline import record

    gate, clauses, replicates, _ = _tables(*_cue_draws([13] * 6))
    for table, name in ((gate, "table_validity_gate"), (clauses, "table_validity_gate_clauses"),
                        (replicates, "table_validity_gate_replicates")):
        artefacts.save_table(table, name, tmp_path)
    html = "\n".join(record.gate_section_html(tmp_path, tmp_path))
    shown = html.split("<details>")[0]
    assert all(label in shown for label in ("Grad-CAM", "Grad-CAM++", "XGrad-CAM", "HiResCAM", "Eigen-CAM*"))
    assert "straddles its bar" in shown and "lesion_ci_low" not in shown    # the wide columns are folded
    assert html.count("<details>") == 2 and "lesion_ci_low" in html
    header = shown.split("<thead>")[1].split("</thead>")[0]
    assert header.count("<th>") == 6          # map, verdict, why, two per-draw columns, ceiling
