"""The case browser: per-image facts from hand-made audit rows, the gate's and the degeneracy
table's marks per method, panels drawn from fixed arrays, strips from a real network, and the
page's filters, sort keys, thumbnails and permalinks clicked in headless Chromium."""

from __future__ import annotations

from urllib.parse import quote

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from endoexplain_core.analysis import map_diagnostics
from endoexplain_core.figures import case_browser
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS


def audit_rows(sample_id: str, outside: dict, *, score: float, area: float, constant=(),
               peak_ties: dict | None = None, iou: dict | None = None, ring=("hirescam",)) -> list[dict]:
    """One image's audit rows (one per map) on a 7x7 grid; ``outside``: method -> peak outside
    the lesion (default True), ``iou``: method -> IoU (default 0.25), ``ring``: the methods
    whose peak lies on the border ring."""
    return [{"sample_id": sample_id, "checkpoint_id": "efficientnet_b0_s1129", "method": m,
             "scaled_score": score, "lesion_area_fraction": area,
             "lesion_centre_distance": 0.1, "peak_outside_mask": outside.get(m, True),
             "constant_map": m in constant, "iou": (iou or {}).get(m, 0.25), "energy_in_mask": 0.3,
             "logit_drop": 1.0 if m in CAM_METHODS else np.nan,
             "max_multiplicity": (peak_ties or {}).get(m, 1), "boundary_ties": 1,
             "feature_grid_height": 7, "feature_grid_width": 7, "peak_border_ring": m in ring,
             "peak_row": 10, "peak_col": 20, "peak_lesion_distance": 0.0 if not outside.get(m, True) else 6.5}
            for m in MAP_METHODS]


INSIDE = False   # readable values of ``outside``
OUTSIDE = True


def hand_table() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Five images. Validated (see ``hand_gate``): Grad-CAM, Grad-CAM++, Eigen-CAM; HiResCAM's
    maps are tied on four of five images and always on the ring, so ``degenerate_maps`` flags it.

    all_miss        every CAM out, the centre in; high score
    split           Grad-CAM and HiResCAM in, Eigen-CAM constant, the rest out; high score
    all_hit         every CAM in (XGrad-CAM tied), the centre out; low score
    hires_only      every CAM in but HiResCAM (out, tied): the artefact of the issue; high score
    tied_validated  Grad-CAM in but tied over 2 pixels, every other CAM out; high score
    """
    all_in = {m: INSIDE for m in CAM_METHODS}
    hires_tied = {"hirescam": 4}
    rows = (audit_rows("all_miss", {"centre": INSIDE}, score=0.95, area=0.02, peak_ties=hires_tied,
                       iou={"centre": 0.5, "gradcam": 0.2, "gradcampp": 0.2, "eigencam": 0.2})
            + audit_rows("split", {"gradcam": INSIDE, "hirescam": INSIDE}, score=0.95, area=0.05,
                         constant=("eigencam",), peak_ties=hires_tied)
            + audit_rows("all_hit", all_in, score=0.40, area=0.12, peak_ties={"xgradcam": 3, **hires_tied},
                         iou={"gradcam": 0.7}, ring=("hirescam", "gradcam"))
            + audit_rows("hires_only", {**all_in, "hirescam": OUTSIDE, "centre": INSIDE}, score=0.92,
                         area=0.08, peak_ties={"hirescam": 6})
            + audit_rows("tied_validated", {"gradcam": INSIDE}, score=0.91, area=0.20, peak_ties={"gradcam": 2},
                         iou={"centre": 0.6, "gradcampp": 0.1, "eigencam": 0.05}))
    ids = ["all_miss", "split", "all_hit", "hires_only", "tied_validated"]
    random = pd.DataFrame({"sample_id": ids, "repetitions": 2, "logit_drop_00": [1.0, 2.0, 3.0, 1.0, 1.0],
                           "logit_drop_01": [3.0, 2.0, 5.0, 1.0, 1.0], "logit_drop_mean": [2.0, 2.0, 4.0, 1.0, 1.0],
                           "score_drop_mean": 0.1})
    return pd.DataFrame(rows), random


def hand_gate() -> pd.DataFrame:
    verdicts = {"gradcam": "passes", "gradcampp": "passes", "xgradcam": "fails", "hirescam": "inconclusive",
                "eigencam": "passes", "random": "inconclusive", "centre": "inconclusive", "salience": "inconclusive"}
    return pd.DataFrame({"method": list(verdicts), "verdict": list(verdicts.values()),
                         "passes": [v == "passes" for v in verdicts.values()]})


def hand_methods(table: pd.DataFrame) -> dict[str, dict]:
    return case_browser.method_facts(hand_gate(), map_diagnostics.degenerate_maps(table))


def test_method_facts_read_the_gate_verdict_and_the_degeneracy_rule():
    table, _ = hand_table()
    methods = hand_methods(table)
    assert [m for m, f in methods.items() if f["validated"]] == ["gradcam", "gradcampp", "eigencam"]
    assert methods["xgradcam"]["label"] == "XGrad-CAM\u2020" and methods["gradcam"]["label"] == "Grad-CAM"
    hires = methods["hirescam"]
    assert hires["degenerate"] and hires["ring_degenerate"] and hires["label"] == "HiResCAM\u2020\u00a7"
    assert "4 of 5 maps with tied maxima" in hires["why"] or "tied maxima" in hires["why"]
    assert not methods["gradcam"]["degenerate"] and not methods["gradcam"]["ring_degenerate"]
    unread = case_browser.method_facts(None, None)           # no gate run: nothing validated, no marks
    assert not any(f["validated"] or f["degenerate"] for f in unread.values())
    assert {f["verdict"] for f in unread.values()} == {"not run"}


def test_a_run_s_method_facts_come_from_its_figures_folder(tmp_path):
    """The browser reads the gate table and the browsed checkpoint's degeneracy rows as 03 and
    04 write them; without the degeneracy table it applies the rule to the pool's own rows."""
    table, _ = hand_table()
    hand_gate().to_csv(tmp_path / "table_validity_gate.csv", index=False)
    degeneracy = map_diagnostics.degenerate_maps(table)
    other = degeneracy.assign(checkpoint_id="resnet34_s1129", degenerate=True, why="another checkpoint")
    pd.concat([degeneracy, other]).to_csv(tmp_path / case_browser.DEGENERACY_TABLE, index=False)
    read = case_browser.checkpoint_method_facts(tmp_path, "efficientnet_b0_s1129", None)
    assert read == hand_methods(table)                       # the other checkpoint's rows are not read
    (tmp_path / case_browser.DEGENERACY_TABLE).unlink()
    assert case_browser.checkpoint_method_facts(tmp_path, "efficientnet_b0_s1129", table) == read
    unread = case_browser.checkpoint_method_facts(None, "efficientnet_b0_s1129", None)
    assert unread == case_browser.method_facts(None, None)


def test_case_rows_keep_each_map_and_say_why_it_is_degenerate_on_the_case():
    table, random = hand_table()
    records = {r["sample_id"]: r for r in case_browser.case_rows(table, random, "etis", 0.90, hand_methods(table))}
    miss, split, hit, tied = records["all_miss"], records["split"], records["all_hit"], records["tied_validated"]
    assert miss["high_score"] and not hit["high_score"]
    assert split["maps"]["eigencam"]["inside"] is None and split["maps"]["gradcam"]["inside"] is True
    assert split["maps"]["eigencam"]["degenerate_here"] == ["constant map"]
    assert tied["maps"]["gradcam"]["degenerate_here"] == ["maximum tied over 2 pixels"]
    assert hit["maps"]["xgradcam"]["degenerate_here"] == ["maximum tied over 3 pixels"]
    # a ring peak is degenerate only for a method whose peaks pile on the ring (HiResCAM here)
    assert hit["maps"]["gradcam"]["border_ring"] and hit["maps"]["gradcam"]["degenerate_here"] == []
    assert tied["maps"]["hirescam"]["degenerate_here"] == ["peak on the border ring, where this method's peaks pile up"]
    assert len(miss["maps"]["hirescam"]["degenerate_here"]) == 2          # tied and on the ring
    assert miss["maps"]["centre"]["degenerate_here"] == []                # baselines are not judged
    assert miss["random_drop_mean"] == 2.0 and miss["random_drop_sd"] == round(np.sqrt(2.0), 4)   # rounded for the page
    assert hit["maps"]["random"]["logit_drop"] is None       # baselines have no deletion drop
    assert miss["maps"]["gradcam"]["distance"] == 6.5 and miss["maps"]["centre"]["distance"] == 0.0
    tertiles = {r["sample_id"]: r["size_tertile"] for r in case_browser.add_size_tertiles(list(records.values()))}
    assert tertiles["all_miss"] == "small" and tertiles["tied_validated"] == "large"


def test_panel_draws_contour_top_area_and_peak_on_fixed_arrays():
    rgb = np.zeros((40, 40, 3))
    mask = np.zeros((40, 40), dtype=bool)
    mask[10:20, 10:20] = True
    top = np.zeros((40, 40), dtype=bool)
    top[25:35, 25:35] = True
    panel = case_browser.draw_panel(rgb, mask, np.linspace(0, 1, 1600).reshape(40, 40), top, (30, 5))
    assert tuple(panel[10, 15]) == case_browser.CONTOUR_RGB and tuple(panel[15, 15]) != case_browser.CONTOUR_RGB
    assert tuple(panel[25, 30]) == case_browser.TOP_AREA_RGB and tuple(panel[30, 30]) != case_browser.TOP_AREA_RGB
    assert tuple(panel[30, 5]) == case_browser.PEAK_RGB and tuple(panel[30, 7]) == case_browser.PEAK_RGB
    plain = case_browser.draw_panel(rgb, mask, None, None, None)
    assert plain[0, 0].tolist() == [0, 0, 0]                  # no map: the frame itself
    assert case_browser.strip_name("a/b <c>") != case_browser.strip_name("a_b__c_")
    assert case_browser.strip_name("a/b <c>").startswith("a_b__c_-")


def test_strips_recompute_the_maps_of_a_real_network_with_the_table_peaks(tmp_path):
    from endoexplain_core.models import networks

    torch.manual_seed(0)
    model = networks.build_model("resnet34").eval()
    _, layer = networks.resolve_target_layer(model, "resnet34", None)
    rng = np.random.default_rng(0)
    cases = []
    for i in range(3):
        mask = np.zeros((48, 48), dtype=bool)
        mask[10 + i:30, 12:30] = True
        cases.append((f"case/{i}", rng.integers(0, 255, (48, 48, 3), dtype=np.uint8), mask))
    empty = ("empty", rng.integers(0, 255, (48, 48, 3), dtype=np.uint8), np.zeros((48, 48), dtype=bool))
    table = pd.DataFrame([{"sample_id": s, "method": m, "peak_row": 3, "peak_col": 4, "constant_map": False}
                          for s, _, _ in cases for m in MAP_METHODS])
    names = case_browser.case_strips(model, layer, [cases[0], empty, *cases[1:]], table, image_size=64,
                                     top_fraction=0.2, batch_size=2, out_dir=tmp_path)
    assert sorted(names) == ["case/0", "case/1", "case/2"]    # the empty mask is left out, as in the audit
    strip = Image.open(tmp_path / names["case/1"])
    assert strip.size == (case_browser.TILE * (1 + len(MAP_METHODS)), case_browser.TILE)
    assert case_browser.TILE >= 160                            # thumbnails of at least 160 px


def hand_page(tmp_path, split_id: str = "split"):
    """The hand table's browser in ``tmp_path`` (the split case renamed ``split_id``), strips of
    the real size in one flat colour per case."""
    table, random = hand_table()
    table.loc[table["sample_id"] == "split", "sample_id"] = split_id
    random.loc[random["sample_id"] == "split", "sample_id"] = split_id
    methods = hand_methods(table)
    records = case_browser.add_size_tertiles(case_browser.case_rows(table, random, "etis", 0.90, methods))
    (tmp_path / "strips").mkdir()
    for record in records:
        name = case_browser.strip_name(record["sample_id"])
        Image.new("RGB", (case_browser.TILE * (1 + len(MAP_METHODS)), case_browser.TILE), (200, 10, 10)).save(
            tmp_path / "strips" / name)
        record["strip"] = f"strips/{name}"
    return case_browser.write_case_browser(tmp_path, records, checkpoint_id="efficientnet_b0_s1129",
                                           cohort_labels={"etis": "ETIS-LaribPolypDB"}, synthetic=True,
                                           top_fraction=0.2, score_threshold=0.9, methods=methods,
                                           identical={"hirescam": "identical by construction to Grad-CAM"})


COUNT = "document.getElementById('count').textContent"


def click(*ids: str) -> str:
    """JavaScript clicking each element of ``ids`` in turn, then reading the count."""
    return "".join(f"document.getElementById('{i}').click(); " for i in ids) + COUNT


def first_rows(n: int) -> str:
    return f"Array.from(document.querySelectorAll('#cases tbody tr')).slice(0, {n}).map(tr => tr.children[1].textContent)"


@pytest.mark.browser
def test_filters_count_validated_non_degenerate_maps_by_default(tmp_path):
    from tests.browser import run_in_page

    page = hand_page(tmp_path)
    text = page.read_text()
    assert "<th>XGrad-CAM\u2020</th>" in text and "<th>Grad-CAM</th>" in text and "<th>HiResCAM\u2020\u00a7</th>" in text
    values = run_in_page(page, [
        COUNT,
        "CAMS.filter(m => document.getElementById('m-' + m).checked)",
        click("f-disagree"),                      # default: validated CAMs, degenerate maps out
        "document.querySelectorAll('#cases tbody tr')[0].children[1].textContent",
        click("f-disagree", "f-all-miss"),
        click("f-all-miss", "f-centre"),
        click("f-centre", "f-degenerate"),
        click("f-degenerate", "f-high"),
        click("f-high", "f-with-degenerate", "f-disagree"),          # validated, degenerate maps in
        click("p-all"),                                               # every CAM, degenerate maps in
        click("f-with-degenerate"),                                   # every CAM, degenerate maps out
        click("f-disagree", "p-validated", "f-disagree"),             # the preset restores the default
    ], wait_seconds=0.05)
    assert values[0] == "5 of 5 images"
    assert values[1] == ["gradcam", "gradcampp", "eigencam"]          # the gate's "passes"
    assert values[2] == "1 of 5 images" and values[3] == "split"      # not hires_only, not tied_validated
    assert values[4] == "2 of 5 images"                               # all_miss; tied_validated (tied Grad-CAM out)
    assert values[5] == "1 of 5 images"                               # all_miss
    assert values[6] == "2 of 5 images"                               # split (constant), tied_validated (tied)
    assert values[7] == "4 of 5 images"
    assert values[8] == "2 of 5 images"                               # split, tied_validated
    assert values[9] == "3 of 5 images"                               # + hires_only: the old page's count
    assert values[10] == "1 of 5 images"                              # HiResCAM out: split only
    assert values[11] == "1 of 5 images"


@pytest.mark.browser
def test_per_method_filter_and_the_two_sort_keys(tmp_path):
    from tests.browser import run_in_page

    page = hand_page(tmp_path)
    pick = ("(document.getElementById('pm-method').value = '{m}', document.getElementById('pm-outcome').value = '{o}', "
            "document.getElementById('pm-outcome').dispatchEvent(new Event('change')), " + COUNT + ")")
    sort = ("(document.getElementById('sort').value = '{k}', document.getElementById('sort').dispatchEvent("
            "new Event('change')), " + first_rows(3) + ")")
    values = run_in_page(page, [
        pick.format(m="hirescam", o="out"), pick.format(m="gradcam", o="degenerate"),
        pick.format(m="hirescam", o="degenerate"), pick.format(m="eigencam", o="const"),
        pick.format(m="centre", o="in"), pick.format(m="gradcam", o=""),
        sort.format(k="iou_gap"), sort.format(k="disagreement"),
    ], wait_seconds=0.05)
    assert values[:6] == ["3 of 5 images", "1 of 5 images", "5 of 5 images", "1 of 5 images",
                          "2 of 5 images", "5 of 5 images"]
    assert values[6][:2] == ["tied_validated", "all_miss"]            # centre IoU minus the best counted CAM's
    assert values[7] == ["split", "all_hit", "tied_validated"]        # split peaks first, then IoU spread


@pytest.mark.browser
def test_a_permalink_opens_its_case_with_thumbnails_of_160_px(tmp_path):
    from tests.browser import run_in_page

    odd = "<b>odd</b> id/&?#"
    page = hand_page(tmp_path, split_id=odd)
    shot = tmp_path / "one_case.png"
    tiles = ("Array.from(document.querySelectorAll('#tiles .tile div')).map(d => "
             "[d.getBoundingClientRect().width, d.getBoundingClientRect().height])")
    strip_size = ("new Promise(done => { const image = new Image(); image.onload = () => "
                  "done([image.naturalWidth, image.naturalHeight]); image.onerror = () => done(null); "
                  "image.src = getComputedStyle(document.querySelector('#tiles .tile div')).backgroundImage.slice(5, -2); })")
    values = run_in_page(page, [
        "[document.getElementById('detail').hidden, document.getElementById('detail-title').textContent,"
        " document.querySelectorAll('#detail-table tbody tr').length, document.querySelectorAll('#cases tbody b').length]",
        tiles, strip_size,
        "document.getElementById('f-disagree').click(); location.hash = '#cohort=etis&case=all_hit'; 0",
        "[document.getElementById('detail-title').textContent, " + COUNT + ", document.getElementById('f-disagree').checked]",
        "document.querySelector('#cases tbody tr').click(); location.hash",
    ], screenshots={0: shot}, fragment="#cohort=etis&case=" + quote(odd, safe=""))
    hidden, title, n_rows, markup = values[0]
    assert not hidden and title.startswith(f"ETIS-LaribPolypDB {odd}:") and n_rows == len(MAP_METHODS)
    assert markup == 0                                        # the odd id is text, not markup
    assert len(values[1]) == 1 + len(MAP_METHODS) and all(w >= 160 and h >= 160 for w, h in values[1])
    assert values[2] == [case_browser.TILE * (1 + len(MAP_METHODS)), case_browser.TILE]   # the strip loaded
    title, count, disagree = values[4]                        # a hash change opens the case, clearing a hiding filter
    assert title.startswith("ETIS-LaribPolypDB all_hit:") and count == "5 of 5 images" and not disagree
    assert values[5].startswith("#cohort=etis&case=")          # opening a case writes its permalink
    with Image.open(shot) as opened_case:                     # a screenshot of the opened case
        assert opened_case.size == (1300, 1100)


@pytest.mark.parametrize("name", ["<!--<script> b", "</script><b>x</b>", "a & b \u2028 c", "plain"])
def test_inline_json_cannot_end_or_comment_out_the_script(name):
    """Names are data: whatever a sample id holds, the inline JSON has no '<', '>' or '&' (the
    HTML parser's script states never see them) and reads back to the same value."""
    import json

    value = [{"sample_id": name, "cohort": "hyperkvasir"}]
    text = case_browser.script_json(value)
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == value
