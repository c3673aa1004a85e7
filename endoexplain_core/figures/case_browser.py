"""The case browser: every audited image of the primary checkpoint on one static page.

``runs/<profile>/cases/index.html`` opens from disk (no server, no network): one row per audited
image of the HyperKvasir pool and of each external cohort, filters, and per case a JPEG strip
of the frame and every map of ``MAP_METHODS``. Numbers come from the audit tables; the strips'
maps are recomputed in the audit's batches (``audit_inputs.prepared_batches``), and the peak
marker is the table's peak. The filters count the CAMs the validity gate passes and leave out
maps degenerate on the case (``method_facts``, ``degenerate_here``) unless the reader ticks them
in; a case's address (``#cohort=...&case=...``) opens it. Method: docs/maps_and_scores.md, "Figures".
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import torch
from PIL import Image

from endoexplain_core import files
from endoexplain_core.analysis import audit, audit_inputs, audit_schema, map_diagnostics, validity_gate
from endoexplain_core.kernels import threshold
from endoexplain_core.marks import DEGENERATE_MARK
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS, method_label
from endoexplain_core.data.datasets import denormalised_rgb
from endoexplain_core.figures import style
from endoexplain_core.figures.style import HEATMAP_CMAP

TILE = 160                         # pixels per panel in a strip (a thumbnail: at least 160)
CONTOUR_RGB = (0, 255, 255)        # lesion contour (cyan, as in Figure 3)
TOP_AREA_RGB = (255, 255, 255)     # outline of the map's top area
PEAK_RGB = (0, 255, 0)             # the table's peak
STRIP_QUALITY = 85                 # JPEG quality of a strip
PAGE_NAME = "index.html"
DEGENERACY_TABLE = "table_map_degeneracy.csv"   # written by 04_spatial_audit


# --------------------------------------------------------------------------- case table

def method_facts(gate: pd.DataFrame | None, degeneracy: pd.DataFrame | None) -> dict[str, dict]:
    """Per CAM method what the page marks and filters by. ``gate``: the gate table
    (``validity_gate.read_gate_table``) or None; ``degeneracy``: ``map_diagnostics.degenerate_maps``
    rows of the browsed checkpoint or None. Per method: ``label`` (the gate's dagger when it does
    not validate the method, § when its maps are degenerate), ``verdict`` ("passes" / "fails" /
    "inconclusive"; "not run" without a gate row), ``validated`` (verdict "passes"),
    ``degenerate`` and ``why`` (the degeneracy row; False and "" without one) and
    ``ring_degenerate`` (its position rule fired: its peaks pile on the border ring)."""
    verdicts = validity_gate.gate_verdicts(gate) if gate is not None else {}
    not_validated = validity_gate.failing_methods(gate) if gate is not None else ()
    rows = degeneracy.set_index("method") if degeneracy is not None else None
    facts = {}
    for method in CAM_METHODS:
        row = rows.loc[method] if rows is not None and method in rows.index else None
        degenerate = row is not None and bool(row["degenerate"])
        facts[method] = {
            "label": method_label(method, not_validated) + (DEGENERATE_MARK if degenerate else ""),
            "verdict": str(verdicts.get(method, "not run")), "validated": verdicts.get(method) == "passes",
            "degenerate": degenerate, "why": str(row["why"]) if degenerate else "",
            "ring_degenerate": row is not None and bool(row["border_ring_share"] > row["border_ring_limit"])}
    return facts


def degenerate_here(row: pd.Series, fact: dict | None) -> list[str]:
    """Why one map (an audit row) is degenerate on its image; empty when it is not. A constant
    map has no peak; a maximum tied over several pixels has its peak picked by the row-major
    tie-break, not by the map (the per-map reading of ``map_diagnostics``' tie rule); a
    border-ring peak counts only for a method whose peaks pile on the ring on this checkpoint
    (``fact["ring_degenerate"]``), since the ring is also where an edge lesion puts a peak."""
    if bool(row["constant_map"]):
        return ["constant map"]
    reasons = []
    if int(row["max_multiplicity"]) > 1:
        reasons.append(f"maximum tied over {int(row['max_multiplicity'])} pixels")
    if fact and fact["ring_degenerate"] and bool(row.get("peak_border_ring", False)):
        reasons.append("peak on the border ring, where this method's peaks pile up")
    return reasons


def case_rows(table: pd.DataFrame, random_deletion: pd.DataFrame, cohort: str,
              score_threshold: float, methods: dict[str, dict] | None = None) -> list[dict]:
    """One record per audited image: the image's facts and per-map results; the page derives
    its filters and sort keys from them. ``table``: one checkpoint's audit rows on one dataset
    (one row per image and map); ``random_deletion``: its per-image random-deletion table;
    ``methods``: ``method_facts`` (None: no gate, no degeneracy table)."""
    methods = methods if methods is not None else method_facts(None, None)
    random = random_deletion.set_index("sample_id")
    drops = random[[c for c in random.columns if c.startswith("logit_drop_") and c[-1].isdigit()]]
    records = []
    for sample_id, rows in table.groupby("sample_id", sort=False):
        by_method = rows.set_index("method")
        first = rows.iloc[0]
        maps = {}
        for method in MAP_METHODS:
            row = by_method.loc[method]
            maps[method] = {
                "inside": None if bool(row["constant_map"]) else not bool(row["peak_outside_mask"]),
                "iou": _float(row["iou"]), "energy": _float(row["energy_in_mask"]),
                "logit_drop": _float(row["logit_drop"]), "constant": bool(row["constant_map"]),
                "peak_ties": int(row["max_multiplicity"]), "boundary_ties": int(row["boundary_ties"]),
                "peak": [int(row["peak_row"]), int(row["peak_col"])],
                "border_ring": bool(row["peak_border_ring"]) if "peak_border_ring" in row else None,
                "degenerate_here": degenerate_here(row, methods.get(method)) if method in CAM_METHODS else [],
                "distance": _float(row["peak_lesion_distance"]) if "peak_lesion_distance" in row else None}
        has_drops = sample_id in drops.index
        records.append({
            "cohort": cohort, "sample_id": str(sample_id), "score": _float(first["scaled_score"]),
            "high_score": float(first["scaled_score"]) >= score_threshold,
            "lesion_area": _float(first["lesion_area_fraction"]),
            "centre_distance": _float(first["lesion_centre_distance"]), "maps": maps,
            "random_drop_mean": _float(drops.loc[sample_id].mean()) if has_drops else None,
            "random_drop_sd": (_float(drops.loc[sample_id].std(ddof=1))
                               if has_drops and drops.shape[1] > 1 else None)})
    return records


def add_size_tertiles(records: list[dict]) -> list[dict]:
    """Label each record's lesion area as small / medium / large by the tertiles over all
    records (cohorts pooled); returns the same list."""
    areas = np.array([r["lesion_area"] for r in records], dtype=float)
    if len(areas) == 0:
        return records
    low, high = np.quantile(areas, [1 / 3, 2 / 3])
    for record, area in zip(records, areas):
        record["size_tertile"] = "small" if area <= low else "medium" if area <= high else "large"
    return records


def _float(value) -> float | None:
    return None if value is None or pd.isna(value) else round(float(value), 4)


# --------------------------------------------------------------------------- strips

def _outline(mask: np.ndarray) -> np.ndarray:
    """Pixels of ``mask`` (bool (H, W)) that touch a pixel outside it."""
    padded = np.pad(mask, 1, constant_values=False)
    interior = (padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:])
    return mask & ~interior


def draw_panel(rgb: np.ndarray, mask: np.ndarray, heatmap: np.ndarray | None,
               top_area: np.ndarray | None, peak: tuple[int, int] | None) -> np.ndarray:
    """One panel, uint8 (S, S, 3): the frame (float RGB in [0, 1]), the map blended over it on
    the shared colour scale (each map min-max scaled to [0, 1], as the kernels return it), the
    lesion contour, the top-area outline and the peak as a small cross."""
    image = rgb.copy()
    if heatmap is not None:
        colours = matplotlib.colormaps[HEATMAP_CMAP](np.clip(heatmap, 0.0, 1.0))[..., :3]
        image = 0.45 * image + 0.55 * colours
    panel = (np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)
    if top_area is not None:
        panel[_outline(top_area)] = TOP_AREA_RGB
    panel[_outline(mask)] = CONTOUR_RGB
    if peak is not None:      # a cross, two pixels thick, over the peak
        height, width = mask.shape
        size = max(3, height // 20)
        row, col = peak
        rows = slice(max(row - size, 0), min(row + size + 1, height))
        cols = slice(max(col - size, 0), min(col + size + 1, width))
        panel[rows, max(col - 1, 0):col + 1] = PEAK_RGB
        panel[max(row - 1, 0):row + 1, cols] = PEAK_RGB
    return panel


def strip_name(sample_id: str) -> str:
    """A file name for a case's strip: the id's safe characters and a hash (ids may hold any)."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", sample_id)[:60]
    return f"{readable}-{hashlib.sha256(sample_id.encode()).hexdigest()[:8]}.jpg"


def case_strips(model: torch.nn.Module, target_layer: torch.nn.Module, cases, table: pd.DataFrame,
                *, image_size: int, top_fraction: float, batch_size: int, out_dir: str | Path,
                device: str | torch.device = "cpu") -> dict[str, str]:
    """Write one JPEG strip per audited case to ``out_dir`` and return sample_id -> file name.

    ``cases``: (sample_id, uint8 RGB, bool mask) in the audit's order; maps are recomputed in the
    audit's batches of ``batch_size``, empty masks left out. Panels: the frame, then
    ``MAP_METHODS``; each panel's peak is the table's.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    peaks = {(s, m): (int(r), int(c)) for s, m, r, c, k in zip(
        table["sample_id"], table["method"], table["peak_row"], table["peak_col"], table["constant_map"]) if not k}
    names, excluded = {}, []
    for sample_ids, images, masks in audit_inputs.prepared_batches(cases, image_size, batch_size, excluded):
        maps, _ = audit.batch_maps(model, target_layer, images.to(device), sample_ids)
        for index, sample_id in enumerate(sample_ids):
            rgb, mask = denormalised_rgb(images[index]), masks[index].cpu().numpy()
            panels = [draw_panel(rgb, mask, None, None, None)]
            for method in MAP_METHODS:
                heatmap = maps[method][index].detach()
                top = threshold.top_fraction_mask(heatmap[None], top_fraction)[0].cpu().numpy()
                panels.append(draw_panel(rgb, mask, heatmap.cpu().numpy(), top,
                                         peaks.get((sample_id, method))))
            strip = Image.fromarray(np.concatenate(panels, axis=1))
            strip = strip.resize((TILE * len(panels), TILE), Image.Resampling.BILINEAR)
            name = strip_name(sample_id)
            files.replace_atomically(out_dir / name, lambda path: strip.save(
                path, format="JPEG", quality=STRIP_QUALITY))
            names[sample_id] = name
    return names


# --------------------------------------------------------------------------- page

_STYLE = """
body { font-family: DejaVu Sans, Arial, sans-serif; margin: 1em auto; max-width: 90em; padding: 0 1em; }
.banner { padding: 0.5em 1em; background: #fff4d6; border: 1px solid #e0b000; border-radius: 4px; }
.filters { display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; margin: 0.6em 0; align-items: center; }
.filters .head { font-weight: bold; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.45em; text-align: left; }
th[data-key] { cursor: pointer; background: #f3f3f3; }
tbody tr { cursor: pointer; } tbody tr:hover, tbody tr.current { background: #eef5ff; }
.b-in { color: #1b7f3b; font-weight: bold; } .b-out { color: #b00020; font-weight: bold; }
.b-const, .b-deg { color: #777; font-style: italic; font-weight: normal; }
.uncounted { color: #999; }
#cases td { white-space: nowrap; }
#cases td:nth-child(-n+2) { white-space: normal; max-width: 11em; overflow-wrap: break-word; }
#cases td:first-child { min-width: 8em; }
#detail { border: 2px solid #888; border-radius: 4px; padding: 0.5em; margin: 0.6em 0; }
#detail h2 { font-size: 1.1em; }
#detail-body { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
#detail-body table { flex: 1 1 30em; }
#tiles { display: grid; grid-template-columns: repeat(5, TILEpx); gap: 4px; }
.tile { margin: 0; font-size: 0.75em; text-align: center; }
.tile div { width: TILEpx; height: TILEpx; background-repeat: no-repeat; }
details { margin: 0.5em 0; }
""".replace("TILE", str(TILE))

_SCRIPT = """
const rows = document.querySelector('#cases tbody');
const count = document.getElementById('count');
const $ = id => document.getElementById(id);
let sortKey = 'score', sortDescending = true, visible = [], current = -1;
const esc = s => String(s).replace(/[&<>"']/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c]));
const num = (v, d = 3) => v === null || v === undefined ? '' : Number(v).toFixed(d);
const degenerate = (c, m) => c.maps[m].degenerate_here.length > 0 || (METHODS[m] && METHODS[m].degenerate);
function badge(c, m) {
  const r = c.maps[m], deg = degenerate(c, m);
  const why = [...r.degenerate_here, METHODS[m] && METHODS[m].degenerate ? 'method degenerate on this checkpoint' : ''].filter(Boolean);
  const text = r.inside === null ? 'const' : (r.inside ? 'in' : 'out');
  const cls = r.inside === null ? 'b-const' : deg ? 'b-deg' : (r.inside ? 'b-in' : 'b-out');
  return `<span class="${cls}" title="${esc(why.join('; '))}">${text}${deg && r.inside !== null ? ' (deg.)' : ''}</span>`;
}
// The CAMs the filters count on a case: the ticked methods, less the maps degenerate there
// (and every map of a degenerate method) unless degenerate maps are counted too.
function counted(c) {
  const withDegenerate = $('f-with-degenerate').checked;
  return CAMS.filter(m => $('m-' + m).checked && (withDegenerate || !degenerate(c, m)));
}
function facts(c) {
  const maps = counted(c), hits = maps.filter(m => c.maps[m].inside === true).length;
  const ious = maps.map(m => c.maps[m].iou).filter(v => v !== null);
  const centre = c.maps.centre.iou;
  return {maps, hits, misses: maps.length - hits,
          gap: centre === null || !ious.length ? null : centre - Math.max(...ious),
          spread: ious.length > 1 ? Math.max(...ious) - Math.min(...ious) : null};
}
function passes(c) {
  const f = facts(c);
  if ($('cohort').value && c.cohort !== $('cohort').value) return false;
  if ($('size').value && c.size_tertile !== $('size').value) return false;
  if ($('f-high').checked && !c.high_score) return false;
  if ($('f-all-miss').checked && !(c.high_score && f.maps.length && f.hits === 0)) return false;
  if ($('f-disagree').checked && !(f.hits && f.misses)) return false;
  if ($('f-centre').checked && !(c.maps.centre.inside === true && f.misses)) return false;
  if ($('f-degenerate').checked && !CAMS.some(m => $('m-' + m).checked && degenerate(c, m))) return false;
  const method = $('pm-method').value, outcome = $('pm-outcome').value, r = c.maps[method];
  if (outcome === 'in' && r.inside !== true) return false;
  if (outcome === 'out' && r.inside !== false) return false;
  if (outcome === 'const' && r.inside !== null) return false;
  if (outcome === 'degenerate' && !degenerate(c, method)) return false;
  return true;
}
// Sort keys; disagreement: the split of the counted peaks first (the smaller side), then the
// spread of the counted maps' IoU.
const KEYS = {cohort: c => c.cohort, sample_id: c => c.sample_id, score: c => c.score,
  lesion_area: c => c.lesion_area, iou_gap: c => facts(c).gap,
  disagreement: c => { const f = facts(c); return [Math.min(f.hits, f.misses), f.spread ?? -1]; }};
function compare(x, y) {
  if (Array.isArray(x)) return compare(x[0], y[0]) || compare(x[1], y[1]);
  return typeof x === 'string' ? x.localeCompare(y) : (x ?? -Infinity) - (y ?? -Infinity);
}
function render() {
  visible = CASES.filter(passes);
  const key = KEYS[sortKey];
  visible.sort((a, b) => (sortDescending ? -1 : 1) * compare(key(a), key(b)));
  rows.innerHTML = visible.map((c, i) => { const f = facts(c); return `<tr data-index="${i}"><td>${esc(COHORT_LABELS[c.cohort])}</td>`
    + `<td>${esc(c.sample_id)}</td><td>${num(c.score)}</td><td>${num(c.lesion_area)}</td><td>${num(f.gap)}</td>`
    + `<td>${f.maps.length ? f.hits + ' in, ' + f.misses + ' not' : ''}</td><td>${num(f.spread)}</td>`
    + MAPS.map(m => `<td${CAMS.includes(m) && !f.maps.includes(m) ? ' class="uncounted"' : ''}>${badge(c, m)}</td>`).join('') + '</tr>'; }).join('');
  count.textContent = `${visible.length} of ${CASES.length} images`;
  $('sort').value = sortKey;
  current = -1;
  $('detail').hidden = true;
}
const fragment = c => 'cohort=' + encodeURIComponent(c.cohort) + '&case=' + encodeURIComponent(c.sample_id);
function show(index) {
  if (index < 0 || index >= visible.length) return;
  current = index;
  const c = visible[index];
  rows.querySelectorAll('tr').forEach((tr, i) => tr.classList.toggle('current', i === index));
  $('detail').hidden = false;
  $('detail-title').textContent =
    `${COHORT_LABELS[c.cohort]} ${c.sample_id}: scaled score ${num(c.score)}${c.high_score ? ' (high)' : ''}, `
    + `lesion area ${num(c.lesion_area)} of the frame (${c.size_tertile}), centre distance ${num(c.centre_distance)}`;
  $('permalink').href = '#' + fragment(c);
  history.replaceState(null, '', '#' + fragment(c));
  $('tiles').innerHTML = ['Frame', ...MAPS.map(m => LABELS[m])].map((label, i) =>
    `<figure class="tile"><div style="background-image: url('${encodeURI(c.strip)}'); background-position: -${i * TILE}px 0"></div>`
    + `${esc(label)}${i ? ' ' + badge(c, MAPS[i - 1]) : ''}</figure>`).join('');
  const reference = c.random_drop_mean === null ? 'n/a'
    : `${num(c.random_drop_mean)}` + (c.random_drop_sd === null ? '' : ` (SD ${num(c.random_drop_sd)})`);
  $('detail-table').querySelector('tbody').innerHTML = MAPS.map(m => {
    const r = c.maps[m];
    const flags = [...r.degenerate_here, METHODS[m] && METHODS[m].degenerate ? 'degenerate on this checkpoint: ' + METHODS[m].why : '',
                   !r.constant && r.peak_ties <= 1 && r.boundary_ties > 1 ? `${r.boundary_ties} pixels tied at the top-area boundary` : '',
                   !r.constant && r.border_ring && !r.degenerate_here.some(w => w.includes('ring')) ? 'peak on the border ring' : '',
                   IDENTICAL[m] || ''].filter(Boolean).join('; ');
    return `<tr><td>${esc(LABELS[m])}</td><td>${badge(c, m)}</td><td>${r.constant ? '' : r.peak.join(', ')}</td><td>${num(r.distance, 1)}</td>`
      + `<td>${num(r.iou)}</td><td>${num(r.energy)}</td><td>${num(r.logit_drop)}</td><td>${esc(flags)}</td></tr>`;
  }).join('');
  $('random-reference').textContent = reference;
}
// A permalink (#cohort=...&case=...) opens its case; filters that hide it are cleared first.
function openFromFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  const wanted = c => c.cohort === params.get('cohort') && c.sample_id === params.get('case');
  if (!params.has('case') || !CASES.some(wanted)) return;
  if (!visible.some(wanted)) {
    document.querySelectorAll('.flag').forEach(el => { el.checked = false; });
    $('cohort').value = ''; $('size').value = ''; $('pm-outcome').value = '';
    render();
  }
  show(visible.findIndex(wanted));
  $('detail').scrollIntoView();
}
function preset(validatedOnly) { CAMS.forEach(m => { $('m-' + m).checked = !validatedOnly || METHODS[m].validated; }); render(); }
rows.addEventListener('click', e => { const tr = e.target.closest('tr'); if (tr) show(Number(tr.dataset.index)); });
document.querySelectorAll('th[data-key]').forEach(th => th.addEventListener('click', () => {
  sortDescending = sortKey === th.dataset.key ? !sortDescending : true;
  sortKey = th.dataset.key; render();
}));
$('sort').addEventListener('change', () => { sortKey = $('sort').value; sortDescending = true; render(); });
document.querySelectorAll('.filters select:not(#sort), .filters input').forEach(el => el.addEventListener('change', render));
$('p-validated').addEventListener('click', () => preset(true));
$('p-all').addEventListener('click', () => preset(false));
$('prev').addEventListener('click', () => show(current - 1));
$('next').addEventListener('click', () => show(current + 1));
document.addEventListener('keydown', e => { if (e.key === 'ArrowLeft') show(current - 1); if (e.key === 'ArrowRight') show(current + 1); });
window.addEventListener('hashchange', openFromFragment);
render();
openFromFragment();
"""


def script_json(value) -> str:
    """``value`` as JSON safe to inline in a ``<script>`` element: ``<``, ``>`` and ``&`` as
    ``\\u`` escapes (a sample id such as ``<!--<script>`` would otherwise switch the HTML parser
    into a state that swallows the rest of the page), and U+2028/U+2029, which old JavaScript
    parsers read as line breaks inside strings. JSON.parse and a JS literal read the same value."""
    text = json.dumps(value, separators=(",", ":"), default=str)
    for character, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                              ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(character, escape)
    return text


def _options(values: dict[str, str], selected: str | None = None) -> str:
    return "".join(f'<option value="{html.escape(k)}"{" selected" if k == selected else ""}>{html.escape(v)}</option>'
                   for k, v in values.items())


def _method_controls(methods: dict[str, dict]) -> str:
    """The filters' method choice: a box per CAM (ticked: validated by the gate), the two
    presets, whether degenerate maps count, and the per-method outcome filter."""
    boxes = "".join(
        f'<label title="{html.escape(f["why"])}"><input type="checkbox" class="count" id="m-{m}" value="{m}"'
        f'{" checked" if f["validated"] else ""}> {html.escape(f["label"])} ({html.escape(f["verdict"])})</label>'
        for m, f in methods.items())
    any_map = {m: method_label(m) for m in MAP_METHODS} | {m: f["label"] for m, f in methods.items()}
    outcomes = {"": "anywhere", "in": "inside the lesion", "out": "outside the lesion",
                "const": "undefined (constant map)", "degenerate": "degenerate on the case"}
    return f"""<div class="filters"><span class="head">CAMs the filters count:</span>{boxes}
<button id="p-validated">validated only</button> <button id="p-all">all CAMs</button>
<label><input type="checkbox" id="f-with-degenerate"> count degenerate maps too</label></div>
<div class="filters"><span class="head">Per method:</span><label>peak of <select id="pm-method">{_options(any_map)}</select></label>
<label>is <select id="pm-outcome">{_options(outcomes)}</select></label></div>"""


def _page_notes(methods: dict[str, dict], synthetic: bool, top_fraction: float, score_threshold: float) -> str:
    """The banners and the paragraph saying what the badges, filters and sort keys mean."""
    banner = ('<p class="banner">Synthetic cohort: these frames are generated, not patients.</p>'
              if synthetic else "")
    if any(not f["validated"] and f["verdict"] != "not run" for f in methods.values()):
        banner += ('<p class="banner">\u2020 not validated by this run\'s planted-truth gate (fails or '
                   'inconclusive): its peaks are not shown to find planted evidence.</p>')
    if not any(f["validated"] for f in methods.values()):
        banner += ('<p class="banner">The validity gate validates no CAM method here, so by default the '
                   'filters count no map: tick methods to count them.</p>')
    if any(f["degenerate"] for f in methods.values()):
        banner += (f'<p class="banner">{DEGENERATE_MARK} maps degenerate on this checkpoint '
                   '(table_map_degeneracy): not counted by the filters unless degenerate maps are.</p>')
    return f"""{banner}
<p>One row per audited image. By default the filters and sort keys count only the CAMs the validity
gate passes, and leave out maps degenerate on the case. Click a row (or use the arrow keys) to open
the case; its address is then a permalink.</p>
<details><summary>What the badges, filters and sort keys mean</summary>
<p>A badge says whether each map's peak lies inside the lesion (in),
outside it (out) or is undefined (const: a constant map); "(deg.)" marks a map degenerate on the
case (its maximum tied over several pixels, so the tie-break picks the peak; a border-ring peak of
a method whose peaks pile on the ring; or a method degenerate on this checkpoint). The filters and
sort keys count the ticked CAMs (by default those the validity gate passes), leaving degenerate maps
out unless asked. IoU gap: the centre baseline's IoU minus the best counted CAM's (largest first:
the counted maps overlap the lesion less than a fixed centre square); disagreement: the counted
peaks split between in and not in, then the spread of their IoU. In a case, cyan is the lesion
contour, white the outline of the map's top {top_fraction:.0%} area, the green cross the peak; each
map is min-max scaled on one colour scale. High score: scaled score &ge; {score_threshold:.2f}.</p></details>"""


_SORT_KEYS = {"score": "scaled score", "iou_gap": "IoU gap to the centre baseline",
              "disagreement": "disagreement of the counted CAMs", "lesion_area": "lesion area",
              "cohort": "cohort", "sample_id": "case"}


def _filters(cohort_labels: dict[str, str]) -> str:
    return f"""<div class="filters">
<label>Cohort <select id="cohort"><option value="">all</option>{_options(cohort_labels)}</select></label>
<label>Lesion size <select id="size"><option value="">all</option><option>small</option>
<option>medium</option><option>large</option></select></label>
<label>Sort by <select id="sort">{_options(_SORT_KEYS)}</select></label>
<strong id="count"></strong></div>
<div class="filters"><span class="head">Show:</span>
<label><input type="checkbox" class="flag" id="f-high"> high score</label>
<label><input type="checkbox" class="flag" id="f-all-miss"> high score, every counted CAM misses</label>
<label><input type="checkbox" class="flag" id="f-disagree"> counted CAMs disagree</label>
<label><input type="checkbox" class="flag" id="f-centre"> a counted CAM misses where the centre baseline hits</label>
<label><input type="checkbox" class="flag" id="f-degenerate"> a ticked CAM's map is degenerate</label></div>"""


def write_case_browser(out_dir: str | Path, records: list[dict], *, checkpoint_id: str,
                       cohort_labels: dict[str, str], synthetic: bool, top_fraction: float,
                       score_threshold: float, identical: dict[str, str] | None = None,
                       methods: dict[str, dict] | None = None) -> Path:
    """Write ``<out_dir>/index.html`` for ``records`` (``case_rows`` + ``add_size_tertiles``,
    each with a ``strip`` path relative to ``out_dir``) and return its path. ``identical``:
    map -> note for maps identical by construction to another at this layer; ``methods``:
    ``method_facts`` of the checkpoint (None: no gate and no degeneracy table, so no method is
    validated and the filters count none until ticked)."""
    out_dir = Path(out_dir)
    methods = methods if methods is not None else method_facts(None, None)
    labels = {m: methods[m]["label"] if m in methods else method_label(m) for m in MAP_METHODS}
    map_headers = "".join(f"<th>{html.escape(labels[m])}</th>" for m in MAP_METHODS)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Case browser: {html.escape(checkpoint_id)}</title><style>{_STYLE}</style></head><body>
<h1>Case browser: every audited image of {html.escape(checkpoint_id)}</h1>
{_page_notes(methods, synthetic, top_fraction, score_threshold)}
{_filters(cohort_labels)}
{_method_controls(methods)}
<div id="detail" hidden>
<button id="prev">&larr; previous</button> <button id="next">next &rarr;</button> <a id="permalink">permalink</a>
<h2 id="detail-title"></h2>
<div id="detail-body"><div id="tiles"></div>
<table id="detail-table"><thead><tr><th>map</th><th>peak</th><th>peak (row, col)</th><th>peak to lesion (px)</th><th>IoU</th>
<th>energy in mask</th><th>logit drop (top area deleted)</th><th>flags</th></tr></thead><tbody></tbody></table></div>
<p>Random deletion of the same area, mean logit drop over repetitions: <span id="random-reference"></span></p>
</div>
<table id="cases"><thead><tr><th data-key="cohort">cohort</th><th data-key="sample_id">case</th>
<th data-key="score">scaled score</th><th data-key="lesion_area">lesion area</th><th data-key="iou_gap">IoU gap</th>
<th data-key="disagreement">counted peaks</th><th data-key="disagreement">IoU spread</th>{map_headers}</tr></thead><tbody></tbody></table>
<script>
const CASES = {script_json(records)};
const MAPS = {script_json(list(MAP_METHODS))};
const CAMS = {script_json(list(CAM_METHODS))};
const METHODS = {script_json(methods)};
const LABELS = {script_json(labels)};
const COHORT_LABELS = {script_json(cohort_labels)};
const IDENTICAL = {script_json(identical or {})};
const TILE = {TILE};
{_SCRIPT}
</script></body></html>
"""
    return files.write_text_atomic(out_dir / PAGE_NAME, page)


def checkpoint_method_facts(figures_dir: str | Path | None, checkpoint_id: str,
                            pool_table: pd.DataFrame | None) -> dict[str, dict]:
    """``method_facts`` of a run: the gate table and the checkpoint's rows of
    ``table_map_degeneracy.csv`` (04) in ``figures_dir``; without that table, ``degenerate_maps``
    over ``pool_table`` (its sign rule unread, as no map correlations are at hand)."""
    gate = validity_gate.read_gate_table(figures_dir) if figures_dir is not None else None
    path = Path(figures_dir) / DEGENERACY_TABLE if figures_dir is not None else None
    if path is not None and path.is_file():
        degeneracy = pd.read_csv(path, keep_default_na=False, na_values=[""])
        degeneracy = degeneracy[degeneracy["checkpoint_id"] == checkpoint_id]
    else:
        degeneracy = map_diagnostics.degenerate_maps(pool_table) if pool_table is not None else None
    return method_facts(gate, degeneracy)


# --------------------------------------------------------------------------- one call


def build_case_browser(run_dir: str | Path, data_root: str | Path | None, *, image_size: int,
                       top_fraction: float, score_threshold: float, batch_size: int,
                       device: str | torch.device = "cpu", cohort_names=None,
                       figures_dir: str | Path | None = None) -> Path:
    """Write ``<run_dir>/cases/index.html`` and its strips for the primary checkpoint's audits:
    the HyperKvasir pool (``audit/hyperkvasir``) and each external cohort it was audited on
    (``audit/<cohort>``; ``cohort_names`` limits them). On the synthetic cohort (no
    ``data_root``) the cohorts are named "Synthetic ETIS-like" etc. ``figures_dir``: where the
    gate's verdicts and the degeneracy table lie (``checkpoint_method_facts``). Returns the
    page's path."""
    from endoexplain_core.analysis import transfer
    from endoexplain_core.run_layout import RunLayout
    from endoexplain_core.config import is_synthetic_data, resolve_data_root
    from endoexplain_core.data import cohorts
    from endoexplain_core.data.datasets import load_manifest
    from endoexplain_core.models import networks
    from endoexplain_core.numerics import resolve_device

    run_dir = Path(run_dir)
    synthetic = is_synthetic_data(data_root)
    device = resolve_device(device)          # "auto" -> the device the audit used
    cohort_root = resolve_data_root(data_root, run_dir)
    layout = RunLayout(run_dir)
    primary_id = layout.primary_id()
    model, metadata = audit.load_registered_model(run_dir, primary_id, image_size, device)
    layer_name, layer = networks.resolve_target_layer(model, metadata["arch"], metadata.get("target_layer"))
    names = [n for n in (cohort_names if cohort_names is not None else cohorts.DATASET_FOLDERS)
             if layout.audit_paths(n, primary_id)["table"].is_file()]
    sources = {}
    if layout.audit_paths("hyperkvasir", primary_id)["table"].is_file():
        pool = audit_inputs.masked_pool(load_manifest(layout.manifest))
        pool_label = "Synthetic HyperKvasir-like (audit pool)" if synthetic else "HyperKvasir (audit pool)"
        sources["hyperkvasir"] = (pool_label, audit_inputs.manifest_cases(pool, cohort_root, decode_size=image_size))
    external = transfer.external_cases(run_dir, cohort_root, names)
    for name, cases in external.items():
        sources[name] = (style.cohort_label(name, synthetic=synthetic), cohorts.iter_cases(cases, cohort_root, decode_size=image_size))

    out_dir = layout.case_browser_dir
    tables = {name: audit_schema.read_audit_table(layout.audit_paths(name, primary_id)["table"]) for name in sources}
    methods = checkpoint_method_facts(figures_dir, primary_id, tables.get("hyperkvasir"))
    records, labels = [], {}
    for name, (label, cases) in sources.items():
        paths, table = layout.audit_paths(name, primary_id), tables[name]
        strips = case_strips(model, layer, cases, table, image_size=image_size,
                             top_fraction=top_fraction, batch_size=batch_size,
                             out_dir=out_dir / "strips" / name, device=device)
        rows = case_rows(table, audit_schema.read_random_deletion(paths["random_deletion"]), name,
                         score_threshold, methods)
        for row in rows:
            row["strip"] = f"strips/{name}/{strips[row['sample_id']]}"
        records += rows
        labels[name] = label
    identical = {}
    for group in networks.identical_methods(model, layer_name):
        for method in group:
            identical[method] = "identical by construction to " + " = ".join(
                method_label(m) for m in group if m != method)
    return write_case_browser(out_dir, add_size_tertiles(records), checkpoint_id=primary_id,
                              cohort_labels=labels, synthetic=synthetic,
                              top_fraction=top_fraction, score_threshold=score_threshold,
                              identical=identical, methods=methods)
