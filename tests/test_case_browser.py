"""The case browser: per-image facts and flags from hand-made audit rows, panels drawn from
fixed arrays, strips from a real network, and the page clicked in headless Chromium."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from endoexplain_core.figures import case_browser
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS


def audit_rows(sample_id: str, outside: dict, *, score: float, area: float, constant=(),
               peak_ties: dict | None = None) -> list[dict]:
    """Seven audit rows of one image; ``outside``: method -> peak outside the lesion."""
    return [{"sample_id": sample_id, "method": m, "scaled_score": score, "lesion_area_fraction": area,
             "lesion_centre_distance": 0.1, "peak_outside_mask": outside.get(m, True),
             "constant_map": m in constant, "iou": 0.25, "energy_in_mask": 0.3,
             "logit_drop": 1.0 if m in CAM_METHODS else np.nan,
             "max_multiplicity": (peak_ties or {}).get(m, 1), "boundary_ties": 1,
             "peak_row": 10, "peak_col": 20, "peak_lesion_distance": 0.0 if not outside.get(m, True) else 6.5}
            for m in MAP_METHODS]


def hand_table() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = (audit_rows("all_miss", {"centre": False}, score=0.95, area=0.02)          # every CAM out, centre in
            + audit_rows("split", {"gradcam": False, "hirescam": False}, score=0.95, area=0.05,
                         constant=("eigencam",))
            + audit_rows("all_hit", {m: False for m in CAM_METHODS}, score=0.40, area=0.12,
                         peak_ties={"xgradcam": 3}))
    random = pd.DataFrame({"sample_id": ["all_miss", "split", "all_hit"], "repetitions": 2,
                           "logit_drop_00": [1.0, 2.0, 3.0], "logit_drop_01": [3.0, 2.0, 5.0],
                           "logit_drop_mean": [2.0, 2.0, 4.0], "score_drop_mean": 0.1})
    return pd.DataFrame(rows), random


def test_case_rows_compute_each_image_flags_by_hand():
    table, random = hand_table()
    records = {r["sample_id"]: r for r in case_browser.case_rows(table, random, "etis", 0.90)}
    miss, split, hit = records["all_miss"], records["split"], records["all_hit"]
    assert miss["all_cams_miss"] and not miss["methods_disagree"] and miss["worse_than_centre"]
    assert not split["all_cams_miss"] and split["methods_disagree"] and split["constant_or_tied"]
    assert split["maps"]["eigencam"]["inside"] is None and split["maps"]["gradcam"]["inside"] is True
    assert not hit["high_score"] and not hit["all_cams_miss"] and not hit["methods_disagree"]
    assert hit["constant_or_tied"] and hit["maps"]["xgradcam"]["peak_ties"] == 3
    assert not hit["worse_than_centre"]                      # the centre misses, every CAM hits
    assert miss["random_drop_mean"] == 2.0 and miss["random_drop_sd"] == round(np.sqrt(2.0), 4)   # rounded for the page
    assert hit["maps"]["random"]["logit_drop"] is None       # baselines have no deletion drop
    assert miss["maps"]["gradcam"]["distance"] == 6.5 and miss["maps"]["centre"]["distance"] == 0.0
    tertiles = {r["sample_id"]: r["size_tertile"] for r in case_browser.add_size_tertiles(list(records.values()))}
    assert tertiles == {"all_miss": "small", "split": "medium", "all_hit": "large"}


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


@pytest.mark.browser
def test_the_page_filters_and_opens_a_case_in_chromium(tmp_path):
    from tests.browser import run_in_page

    table, random = hand_table()
    table.loc[table["sample_id"] == "split", "sample_id"] = "<b>odd</b> id"
    random.loc[random["sample_id"] == "split", "sample_id"] = "<b>odd</b> id"
    records = case_browser.add_size_tertiles(case_browser.case_rows(table, random, "etis", 0.90))
    (tmp_path / "strips").mkdir()
    for record in records:
        name = case_browser.strip_name(record["sample_id"])
        Image.new("RGB", (8 * 12, 12), (200, 10, 10)).save(tmp_path / "strips" / name)
        record["strip"] = f"strips/{name}"
    page = case_browser.write_case_browser(tmp_path, records, checkpoint_id="efficientnet_b0_s1129",
                                           cohort_labels={"etis": "ETIS-LaribPolypDB"}, synthetic=True,
                                           top_fraction=0.2, score_threshold=0.9,
                                           identical={"hirescam": "identical by construction to Grad-CAM"},
                                           not_validated=("xgradcam",))
    text = page.read_text()
    assert "<th>XGrad-CAM\u2020</th>" in text and "<th>Grad-CAM</th>" in text and "not validated by" in text
    count = "document.getElementById('count').textContent"
    shot = tmp_path / "one_case.png"
    values = run_in_page(page, [
        count,
        "document.getElementById('f-disagree').click(); " + count,
        "document.querySelector('#cases tbody tr').click(); "
        "[document.getElementById('detail').hidden, document.querySelectorAll('#detail-table tbody tr').length,"
        " document.getElementById('detail-title').textContent]",
        "document.getElementById('strip').naturalWidth",
        "document.getElementById('f-disagree').click(); document.getElementById('f-all-miss').click(); " + count,
        "document.querySelectorAll('#cases tbody b').length",
    ], screenshots={3: shot})
    assert values[0] == "3 of 3 images"
    assert values[1] == "1 of 3 images"                       # only the split case
    hidden, n_rows, title = values[2]
    assert not hidden and n_rows == len(MAP_METHODS) and title.startswith("ETIS-LaribPolypDB <b>odd</b> id")
    assert values[3] == 96                                    # the strip image loaded
    assert values[4] == "1 of 3 images"                       # high score and every CAM misses
    assert values[5] == 0                                     # the odd id is text, not markup
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
