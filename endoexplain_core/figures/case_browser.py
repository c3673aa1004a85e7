"""The case browser: every audited image of the primary checkpoint on one static page.

``runs/<profile>/cases/index.html`` opens from disk (no server, no network): one row per audited
image of the HyperKvasir pool and of each external cohort, filters, and per case a JPEG strip
of the frame and every map of ``MAP_METHODS``. Numbers come from the audit tables; the strips'
maps are recomputed in the audit's batches (``audit_inputs.prepared_batches``), and the peak
marker is the table's peak. Method: docs/maps_and_scores.md, "Figures".
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
from endoexplain_core.analysis import audit, audit_inputs, audit_schema
from endoexplain_core.kernels import threshold
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS, method_label
from endoexplain_core.data.datasets import denormalised_rgb
from endoexplain_core.figures import style
from endoexplain_core.figures.style import HEATMAP_CMAP

TILE = 96                          # pixels per panel in a strip
CONTOUR_RGB = (0, 255, 255)        # lesion contour (cyan, as in Figure 3)
TOP_AREA_RGB = (255, 255, 255)     # outline of the map's top area
PEAK_RGB = (0, 255, 0)             # the table's peak
STRIP_QUALITY = 85                 # JPEG quality of a strip
PAGE_NAME = "index.html"


# --------------------------------------------------------------------------- case table

def case_rows(table: pd.DataFrame, random_deletion: pd.DataFrame, cohort: str,
              score_threshold: float) -> list[dict]:
    """One record per audited image: the image's facts, per-map results and the flags the
    page filters on. ``table``: one checkpoint's audit rows on one dataset (7 rows per image);
    ``random_deletion``: its per-image random-deletion table."""
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
                "distance": _float(row["peak_lesion_distance"]) if "peak_lesion_distance" in row else None}
        cam_inside = [maps[m]["inside"] for m in CAM_METHODS]
        high = float(first["scaled_score"]) >= score_threshold
        record = {
            "cohort": cohort, "sample_id": str(sample_id), "score": _float(first["scaled_score"]),
            "high_score": high, "lesion_area": _float(first["lesion_area_fraction"]),
            "centre_distance": _float(first["lesion_centre_distance"]), "maps": maps,
            "random_drop_mean": _float(drops.loc[sample_id].mean()) if sample_id in drops.index else None,
            "random_drop_sd": (_float(drops.loc[sample_id].std(ddof=1))
                               if sample_id in drops.index and drops.shape[1] > 1 else None),
            "all_cams_miss": high and all(inside is not True for inside in cam_inside),
            "methods_disagree": True in cam_inside and any(i is not True for i in cam_inside),
            "worse_than_centre": maps["centre"]["inside"] is True and any(i is not True for i in cam_inside),
            "constant_or_tied": any(maps[m]["constant"] or maps[m]["peak_ties"] > 1 for m in CAM_METHODS),
        }
        records.append(record)
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
.filters { display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; margin: 0.8em 0; align-items: center; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.45em; text-align: left; }
th[data-key] { cursor: pointer; background: #f3f3f3; }
tbody tr { cursor: pointer; } tbody tr:hover, tbody tr.current { background: #eef5ff; }
.b-in { color: #1b7f3b; font-weight: bold; } .b-out { color: #b00020; font-weight: bold; }
.b-const { color: #666; font-style: italic; }
#detail { position: sticky; top: 0; background: white; border-bottom: 2px solid #888;
          padding: 0.5em 0; z-index: 1; }
.labels, #strip { width: min(100%, 864px); }
.labels { display: grid; grid-template-columns: repeat(8, 1fr); font-size: 0.75em; text-align: center; }
#strip { display: block; image-rendering: auto; }
"""

_SCRIPT = """
const rows = document.querySelector('#cases tbody');
const count = document.getElementById('count');
let sortKey = 'score', sortDescending = true, visible = [], current = -1;
const esc = s => String(s).replace(/[&<>"']/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c]));
const num = (v, d = 3) => v === null || v === undefined ? '' : Number(v).toFixed(d);
const badge = m => m.inside === null ? '<span class="b-const">const</span>'
  : (m.inside ? '<span class="b-in">in</span>' : '<span class="b-out">out</span>');
function passes(c) {
  const cohort = document.getElementById('cohort').value, size = document.getElementById('size').value;
  if (cohort && c.cohort !== cohort) return false;
  if (size && c.size_tertile !== size) return false;
  if (document.getElementById('f-high').checked && !c.high_score) return false;
  if (document.getElementById('f-all-miss').checked && !c.all_cams_miss) return false;
  if (document.getElementById('f-disagree').checked && !c.methods_disagree) return false;
  if (document.getElementById('f-centre').checked && !c.worse_than_centre) return false;
  if (document.getElementById('f-constant').checked && !c.constant_or_tied) return false;
  return true;
}
function render() {
  visible = CASES.filter(passes);
  visible.sort((a, b) => {
    const x = a[sortKey], y = b[sortKey];
    const order = typeof x === 'string' ? x.localeCompare(y) : (x ?? -Infinity) - (y ?? -Infinity);
    return sortDescending ? -order : order;
  });
  rows.innerHTML = visible.map((c, i) => `<tr data-index="${i}"><td>${esc(COHORT_LABELS[c.cohort])}</td>`
    + `<td>${esc(c.sample_id)}</td><td>${num(c.score)}</td><td>${num(c.lesion_area)}</td>`
    + `<td>${num(c.centre_distance)}</td>` + MAPS.map(m => `<td>${badge(c.maps[m])}</td>`).join('') + '</tr>').join('');
  count.textContent = `${visible.length} of ${CASES.length} images`;
  current = -1;
  document.getElementById('detail').hidden = true;
}
function show(index) {
  if (index < 0 || index >= visible.length) return;
  current = index;
  const c = visible[index];
  rows.querySelectorAll('tr').forEach((tr, i) => tr.classList.toggle('current', i === index));
  document.getElementById('detail').hidden = false;
  document.getElementById('detail-title').textContent =
    `${COHORT_LABELS[c.cohort]} ${c.sample_id}: scaled score ${num(c.score)}${c.high_score ? ' (high)' : ''}, `
    + `lesion area ${num(c.lesion_area)} of the frame (${c.size_tertile}), centre distance ${num(c.centre_distance)}`;
  document.getElementById('strip').src = c.strip;
  const reference = c.random_drop_mean === null ? 'n/a'
    : `${num(c.random_drop_mean)}` + (c.random_drop_sd === null ? '' : ` (SD ${num(c.random_drop_sd)})`);
  document.querySelector('#detail-table tbody').innerHTML = MAPS.map(m => {
    const r = c.maps[m];
    const flags = [r.constant ? 'constant map' : '', !r.constant && r.peak_ties > 1 ? `peak tied over ${r.peak_ties} pixels` : '',
                   !r.constant && r.boundary_ties > 1 ? `${r.boundary_ties} pixels tied at the top-area boundary` : '',
                   IDENTICAL[m] || ''].filter(Boolean).join('; ');
    return `<tr><td>${esc(LABELS[m])}</td><td>${badge(r)}</td><td>${r.peak ? r.peak.join(', ') : ''}</td><td>${num(r.distance, 1)}</td>`
      + `<td>${num(r.iou)}</td><td>${num(r.energy)}</td><td>${num(r.logit_drop)}</td><td>${esc(flags)}</td></tr>`;
  }).join('');
  document.getElementById('random-reference').textContent = reference;
}
rows.addEventListener('click', e => { const tr = e.target.closest('tr'); if (tr) show(Number(tr.dataset.index)); });
document.querySelectorAll('th[data-key]').forEach(th => th.addEventListener('click', () => {
  sortDescending = sortKey === th.dataset.key ? !sortDescending : true;
  sortKey = th.dataset.key; render();
}));
document.querySelectorAll('.filters select, .filters input').forEach(el => el.addEventListener('change', render));
document.getElementById('prev').addEventListener('click', () => show(current - 1));
document.getElementById('next').addEventListener('click', () => show(current + 1));
document.addEventListener('keydown', e => { if (e.key === 'ArrowLeft') show(current - 1); if (e.key === 'ArrowRight') show(current + 1); });
render();
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


def write_case_browser(out_dir: str | Path, records: list[dict], *, checkpoint_id: str,
                       cohort_labels: dict[str, str], synthetic: bool, top_fraction: float,
                       score_threshold: float, identical: dict[str, str] | None = None,
                       not_validated=()) -> Path:
    """Write ``<out_dir>/index.html`` for ``records`` (``case_rows`` + ``add_size_tertiles``,
    each with a ``strip`` path relative to ``out_dir``) and return its path. ``identical``:
    map -> note for maps identical by construction to another at this layer;
    ``not_validated``: CAM methods the validity gate does not validate (their labels carry its
    dagger and the page says what it means)."""
    out_dir = Path(out_dir)
    labels = {m: method_label(m, not_validated) for m in MAP_METHODS}
    data = script_json(records)
    map_headers = "".join(f"<th>{html.escape(labels[m])}</th>" for m in MAP_METHODS)
    cohorts = "".join(f'<option value="{html.escape(k)}">{html.escape(v)}</option>'
                      for k, v in cohort_labels.items())
    strip_labels = "".join(f"<span>{html.escape(x)}</span>" for x in ["Frame", *labels.values()])
    banner = ('<p class="banner">Synthetic cohort: these frames are generated, not patients.</p>'
              if synthetic else "")
    if not_validated:
        banner += ('<p class="banner">\u2020 not validated by this run\'s planted-truth gate (fails or '
                   'inconclusive): its peaks are not shown to find planted evidence.</p>')
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Case browser: {html.escape(checkpoint_id)}</title><style>{_STYLE}</style></head><body>
<h1>Case browser: every audited image of {html.escape(checkpoint_id)}</h1>
{banner}
<p>One row per audited image; a badge says whether each map's peak lies inside the lesion (in),
outside it (out) or is undefined (const: a constant map). Click a row (or use the arrow keys)
to see the case: cyan is the lesion contour, white the outline of the map's top
{top_fraction:.0%} area, the green cross the peak; each map is min-max scaled on one colour
scale. High score: scaled score &ge; {score_threshold:.2f}.</p>
<div class="filters">
<label>Cohort <select id="cohort"><option value="">all</option>{cohorts}</select></label>
<label>Lesion size <select id="size"><option value="">all</option><option>small</option>
<option>medium</option><option>large</option></select></label>
<label><input type="checkbox" id="f-high"> high score</label>
<label><input type="checkbox" id="f-all-miss"> high score, every CAM misses</label>
<label><input type="checkbox" id="f-disagree"> CAMs disagree</label>
<label><input type="checkbox" id="f-centre"> a CAM misses where the centre baseline hits</label>
<label><input type="checkbox" id="f-constant"> constant CAM or tied peak</label>
<strong id="count"></strong>
</div>
<div id="detail" hidden>
<button id="prev">&larr; previous</button> <button id="next">next &rarr;</button>
<h2 id="detail-title"></h2>
<div class="labels">{strip_labels}</div>
<img id="strip" alt="the case's frame and maps">
<table id="detail-table"><thead><tr><th>map</th><th>peak</th><th>peak (row, col)</th><th>peak to lesion (px)</th><th>IoU</th>
<th>energy in mask</th><th>logit drop (top area deleted)</th><th>flags</th></tr></thead><tbody></tbody></table>
<p>Random deletion of the same area, mean logit drop over repetitions: <span id="random-reference"></span></p>
</div>
<table id="cases"><thead><tr><th data-key="cohort">cohort</th><th data-key="sample_id">case</th>
<th data-key="score">scaled score</th><th data-key="lesion_area">lesion area</th>
<th data-key="centre_distance">centre distance</th>{map_headers}</tr></thead><tbody></tbody></table>
<script>
const CASES = {data};
const MAPS = {script_json(list(MAP_METHODS))};
const LABELS = {script_json(labels)};
const COHORT_LABELS = {script_json(cohort_labels)};
const IDENTICAL = {script_json(identical or {})};
{_SCRIPT}
</script></body></html>
"""
    return files.write_text_atomic(out_dir / PAGE_NAME, page)


# --------------------------------------------------------------------------- one call


def build_case_browser(run_dir: str | Path, data_root: str | Path | None, *, image_size: int,
                       top_fraction: float, score_threshold: float, batch_size: int,
                       device: str | torch.device = "cpu", cohort_names=None,
                       not_validated=()) -> Path:
    """Write ``<run_dir>/cases/index.html`` and its strips for the primary checkpoint's audits:
    the HyperKvasir pool (``audit/hyperkvasir``) and each external cohort it was audited on
    (``audit/<cohort>``; ``cohort_names`` limits them). On the synthetic cohort (no
    ``data_root``) the cohorts are named "Synthetic ETIS-like" etc. Returns the page's path."""
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
    records, labels = [], {}
    for name, (label, cases) in sources.items():
        paths = layout.audit_paths(name, primary_id)
        table = audit_schema.read_audit_table(paths["table"])
        strips = case_strips(model, layer, cases, table, image_size=image_size,
                             top_fraction=top_fraction, batch_size=batch_size,
                             out_dir=out_dir / "strips" / name, device=device)
        rows = case_rows(table, audit_schema.read_random_deletion(paths["random_deletion"]), name, score_threshold)
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
                              identical=identical, not_validated=not_validated)
