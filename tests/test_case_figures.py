"""Figure 3 selection rule on a crafted table; rendered-IoU verification; Figure 4 layout."""

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

matplotlib.use("Agg")

from endoexplain_core.figures import case_figures  # noqa: E402

from endoexplain_core.analysis import audit, audit_schema, case_maps
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS  # noqa: E402


def selection_table():
    """Rows (sample, CAM): peaks outside given per method order; IoU per method."""
    specs = {
        # sample: (score, outside flags for the five CAMs, IoUs)
        "a": (0.95, [1, 1, 0, 0, 0], [0.1, 0.2, 0.5, 0.6, 0.7]),    # balance 2, range 0.6
        "b": (0.96, [1, 0, 1, 0, 0], [0.1, 0.2, 0.3, 0.4, 0.9]),    # balance 2, range 0.8
        "c": (0.99, [1, 0, 0, 0, 0], [0.0, 0.9, 0.9, 0.9, 0.9]),    # balance 1
        "d": (0.50, [1, 1, 0, 0, 0], [0.0, 0.0, 1.0, 1.0, 1.0]),    # low score: not eligible
        "e": (0.91, [0, 0, 0, 0, 0], [0.6, 0.6, 0.6, 0.6, 0.6]),    # consensus, mean 0.6
        "f": (0.93, [0, 0, 0, 0, 0], [0.6, 0.6, 0.6, 0.6, 0.6]),    # tie with e: e wins by id
        "g": (0.40, [0, 0, 0, 0, 0], [0.9, 0.9, 0.9, 0.9, 0.9]),    # low score
        "h": (0.97, [1, 1, 1, 1, 1], [0.0, 0.0, 0.0, 0.0, 0.0]),    # every peak out, 9 px
        "i": (0.98, [1, 1, 1, 1, 1], [0.0, 0.0, 0.0, 0.0, 0.0]),    # every peak out, 30 px: far
        "j": (0.99, [1, 1, 1, 1, 1], [0.0, 0.0, 0.0, 0.0, 0.0]),    # every peak out, 2 px: a near miss
        "k": (0.92, [1, 1, 1, 1, 1], [0.0, 0.0, 0.0, 0.0, 0.0]),    # every peak out, 12 px
    }
    distances = {"h": 9.0, "i": 30.0, "j": 2.0, "k": 12.0}
    rows = [{"sample_id": s, "method": m, "scaled_score": score, "peak_outside_mask": bool(o),
             "iou": iou, "constant_map": False, "peak_lesion_distance": distances.get(s, 0.0 if not o else 20.0)}
            for s, (score, outside, ious) in specs.items()
            for m, o, iou in zip(CAM_METHODS, outside, ious)]
    rows += [{"sample_id": "c", "method": "random", "scaled_score": 0.99, "constant_map": False,
              "peak_outside_mask": False, "iou": 1.0, "peak_lesion_distance": 0.0}]  # baselines never count
    return pd.DataFrame(rows)


def test_selection_rule_on_a_crafted_table():
    selection = case_figures.select_figure3_cases(selection_table(), score_threshold=0.90, image_size=100)
    # clear misses: at least 5 px (5% of 100); h, i and k miss with all five CAMs (j's 2 px do
    # not count); the clear-miss distances (h 9, k 12, a-c 20, i 30, five of each) have median
    # 16, so k is the typical one
    assert selection == {"miss": "k", "discordant": "b", "consensus": "e"}
    # without the input size any peak outside counts: h, i, j, k tie on five misses, and the
    # medians of their scores (0.97, 0.98, 0.99, 0.92; overall 0.975) put h and i equally
    # close: the smaller id wins
    assert case_figures.select_figure3_cases(selection_table(), 0.90)["miss"] == "h"
    assert case_figures.format_score(0.9996) == ">0.999" and case_figures.format_score(0.97) == "0.970"


def render_figure3(table, selection, model, layer, cases, image_size, top_fraction, batch_size=None):
    """Redraw and check the selected cases' maps (analysis), then draw them (figures)."""
    drawn, checks = case_maps.redraw_cases(table, selection, model, layer, cases, image_size,
                                           top_fraction, batch_size=batch_size)
    return case_figures.draw_figure3(drawn, roles=tuple(selection), top_fraction=top_fraction), checks


def test_a_degenerate_method_does_not_vote_in_the_selection():
    """HiResCAM (fourth CAM) degenerate: its peak is a tie-break position, always "out" on this
    checkpoint. Counted, no image would be a consensus; left out, e gives the consensus with 4
    of 4 proper peaks inside, and the row titles count only the proper maps."""
    table = selection_table()
    hires = table["method"] == "hirescam"
    table.loc[hires, "peak_outside_mask"] = True
    table.loc[hires, "peak_lesion_distance"] = 40.0
    assert case_figures.select_figure3_cases(table, 0.90, image_size=100)["consensus"] is None
    selection = case_figures.select_figure3_cases(table, 0.90, image_size=100, degenerate=["hirescam"])
    assert selection["consensus"] == "e"
    own = table[table["sample_id"] == "e"].set_index("method")
    info = {m: {"constant_map": False, "peak_outside_mask": bool(own.loc[m, "peak_outside_mask"])} for m in CAM_METHODS}
    assert case_figures.row_title("consensus", info) == "Consensus: 1 of 5 CAM peaks outside the lesion"
    assert case_figures.row_title("consensus", info, degenerate=["hirescam"]) == \
        "Consensus: 0 of 4 CAM peaks outside the lesion"


def test_a_degenerate_method_is_drawn_with_its_mark_and_the_caption_says_why():
    from endoexplain_core.marks import DEGENERATE_MARK

    size = 16
    maps = {m: np.random.default_rng(i).random((size, size)) for i, m in enumerate(MAP_METHODS)}
    rows = {m: {"iou": 0.2, "constant_map": False, "peak_outside_mask": False, "distance": 0.0}
            for m in MAP_METHODS}
    drawn = [{"role": "consensus", "sample_id": "e", "score": 0.95, "rgb": np.full((size, size, 3), 0.5),
              "mask": np.ones((size, size), bool), "maps": maps, "rows": rows}]
    fig = case_figures.draw_figure3(drawn, roles=("consensus",), top_fraction=0.2, degenerate=["hirescam"])
    titles = [ax.get_title() for ax in fig.get_axes()]
    assert "HiResCAM" + DEGENERATE_MARK in titles and "Grad-CAM" in titles
    texts = " ".join(" ".join(t.get_text().split()) for t in fig.texts)   # the footnote is wrapped
    assert case_figures.DEGENERATE_FIGURE_NOTE in texts
    caption = case_figures.figure3_caption({"consensus": "e"}, top_fraction=0.2, degenerate=["hirescam"])
    assert case_figures.DEGENERATE_FIGURE_NOTE in caption
    assert case_figures.DEGENERATE_FIGURE_NOTE not in case_figures.figure3_caption({"consensus": "e"}, top_fraction=0.2)
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_selection_with_no_eligible_case_returns_none():
    selection = case_figures.select_figure3_cases(selection_table(), score_threshold=0.999)
    assert selection == {"miss": None, "discordant": None, "consensus": None}
    fig, checks = render_figure3(selection_table(), selection, None, None, {}, 8, 0.2)
    assert checks.empty and fig is not None


class TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.features = nn.Conv2d(3, 4, kernel_size=3, padding=1)
        self.head = nn.Linear(4, 2)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))

    def forward(self, x):
        return self.head(torch.relu(self.features(x)).mean(dim=(2, 3)))


def test_rendered_iou_is_verified_against_the_audit_table(tmp_path):
    rng = np.random.default_rng(0)
    cases = {}
    for sample_id in ("x1", "x2"):
        image = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
        mask = np.zeros((16, 16), dtype=bool)
        mask[4:10, 5:12] = True
        cases[sample_id] = (image, mask)
    model = TinyModel()
    audit.audit_checkpoint(model, {"checkpoint_id": "tiny", "arch": "tiny", "seed": 0}, 1.0,
                           [(k, *v) for k, v in cases.items()], dataset="unit", image_size=16,
                           table_path=tmp_path / "a.parquet", random_deletion_path=tmp_path / "r.parquet",
                           top_fraction=0.2, repetitions=2, batch_size=2,
                           target_layer=("features", model.features))
    table = audit_schema.read_audit_table(tmp_path / "a.parquet")
    selection = {"discordant": "x1", "consensus": "x2"}
    fig, checks = render_figure3(table, selection, model, model.features, cases, 16, 0.2)
    assert len(checks) == 2 * len(MAP_METHODS) and checks["peak_matches"].all()   # 5 CAMs + 3 baselines per case
    np.testing.assert_allclose(checks["rendered_iou"], checks["table_iou"], atol=1e-6)
    assert len(fig.axes) >= 16
    # Recomputed in the audit's own batch (batch 2 here), the maps equal the table's exactly.
    assert case_maps.audit_batch_ids(table, "x2", 2) == ["x1", "x2"]
    assert case_maps.audit_batch_ids(table, "x2", 1) == ["x2"]
    _, in_batch = render_figure3(table, selection, model, model.features, cases, 16, 0.2,
                                              batch_size=2)
    assert (in_batch["rendered_iou"] == in_batch["table_iou"]).all() and in_batch["peak_matches"].all()
    tampered = table.copy()
    tampered.loc[(tampered["sample_id"] == "x2") & (tampered["method"] == "hirescam"), "iou"] += 0.01
    with pytest.raises(case_maps.RenderedIoUMismatch, match="x2/hirescam"):
        render_figure3(tampered, selection, model, model.features, cases, 16, 0.2)


def test_figure4_draws_three_panels_with_each_checkpoints_random_deletion_control():
    controls = {("efficientnet_b0", 1): 0.7, ("efficientnet_b0", 2): 0.8, ("resnet34", 1): -0.5,
                ("resnet34", 2): -0.3}
    rows = [{"checkpoint_id": f"{arch}_s{seed}", "arch": arch, "seed": seed, "control": "none",
             "method": method, "failure_own": 0.1 * seed, "failure_fixed": 0.2,
             "logit_drop_all": 0.5, "n_own": 10 + seed, "n_fixed": 12,
             "random_deletion_mean": controls[arch, seed]}
            for arch in ("efficientnet_b0", "resnet34") for seed in (1, 2) for method in CAM_METHODS]
    fig = case_figures.figure4(pd.DataFrame(rows), not_validated=("hirescam",))
    panel_c = fig.axes[2]
    references = [line for line in panel_c.get_lines() if line.get_label() == "Random deletion (own control)"
                  or (line.get_color() == case_figures.RANDOM_REFERENCE["color"] and line.get_marker() != "None")]
    # one point per architecture at the mean of its own checkpoints' controls
    assert sorted(line.get_ydata()[0] for line in references) == pytest.approx([-0.4, 0.75])
    labels = [t.get_text().replace("\n", "") for t in panel_c.get_xticklabels()]
    assert "Eigen-CAM*" in labels and "Randomdeletion" in labels and "HiResCAM\u2020" in labels


def test_figure4_leaves_a_degenerate_seed_out_of_the_mean_and_draws_it_as_a_cross():
    """Three EfficientNet-B0 seeds, HiResCAM degenerate on s3 (rate 1.0): its mean is that of s1
    and s2 (0.1, 0.2), as table4_over_seeds has it, and s3 is a cross, named in the note."""
    rows = [{"checkpoint_id": f"efficientnet_b0_s{seed}", "arch": "efficientnet_b0", "seed": seed,
             "control": "none", "method": method,
             "failure_own": 1.0 if (seed, method) == (3, "hirescam") else 0.1 * seed,
             "failure_fixed": 0.2, "logit_drop_all": 0.5, "n_own": 10, "n_fixed": 10}
            for seed in (1, 2, 3) for method in CAM_METHODS]
    degeneracy = pd.DataFrame({"checkpoint_id": ["efficientnet_b0_s3", "efficientnet_b0_s3"],
                               "method": ["hirescam", "gradcam"], "degenerate": [True, False]})
    fig = case_figures.figure4(pd.DataFrame(rows), degeneracy=degeneracy)
    panel_a = fig.axes[0]
    hires_x = list(CAM_METHODS).index("hirescam")
    means = [line for line in panel_a.get_lines() if line.get_marker() == "o" and len(line.get_xdata()) > 1]
    mean_at = dict(zip(np.round(means[0].get_xdata()).astype(int), means[0].get_ydata()))
    assert mean_at[hires_x] == pytest.approx(0.15) and mean_at[0] == pytest.approx(0.2)
    crosses = [line for line in panel_a.get_lines() if line.get_marker() == "x"]
    drawn = [(round(x), y) for line in crosses for x, y in zip(line.get_xdata(), line.get_ydata())
             if np.isfinite(y)]
    assert drawn == [(hires_x, 1.0)]
    assert "Crosses: a seed whose maps of that method are degenerate" in fig._supxlabel.get_text().replace("\n", " ")
    plain = case_figures.figure4(pd.DataFrame(rows))       # without the check every seed counts
    means = [line for line in plain.axes[0].get_lines() if line.get_marker() == "o" and len(line.get_xdata()) > 1]
    assert means[0].get_ydata()[hires_x] == pytest.approx((0.1 + 0.2 + 1.0) / 3)


def test_figure4_says_when_a_panel_has_no_eligible_images():
    rows = [{"checkpoint_id": "efficientnet_b0_s1", "arch": "efficientnet_b0", "seed": 1,
             "control": "none", "method": method, "failure_own": float("nan"),
             "failure_fixed": float("nan"), "logit_drop_all": 0.1, "n_own": 0, "n_fixed": 0}
            for method in CAM_METHODS]
    fig = case_figures.figure4(pd.DataFrame(rows))
    assert any("no eligible images" in t.get_text() for t in fig.axes[0].texts)
    assert not fig.axes[2].texts


def test_figure4_names_identical_groups_from_the_run_tables_display_labels():
    """The run's robustness table writes identical_with as display labels ("Grad-CAM = XGrad-CAM");
    older tables and the figure inputs use method keys: both name the same group."""
    rows = []
    for label_form in (True, False):
        rows = [{"checkpoint_id": "resnet34_s1", "arch": "resnet34", "seed": 1, "control": "none",
                 "method": method, "failure_own": 0.5, "failure_fixed": 0.5, "logit_drop_all": 0.1,
                 "n_own": 10, "n_fixed": 10, "random_deletion_mean": 0.0,
                 "identical_with": {"gradcam": "XGrad-CAM = HiResCAM" if label_form else "xgradcam = hirescam",
                                    "xgradcam": "Grad-CAM = HiResCAM" if label_form else "gradcam = hirescam",
                                    "hirescam": "Grad-CAM = XGrad-CAM" if label_form else "gradcam = xgradcam"}.get(method, "")}
                for method in CAM_METHODS]
        fig = case_figures.figure4(pd.DataFrame(rows), left_out=["convnext_tiny_s1"])
        note = fig._supxlabel.get_text().replace("\n", " ")
        assert "Grad-CAM = XGrad-CAM = HiResCAM at ResNet-34" in note and "ConvNeXt-Tiny s1" in note


def test_a_miss_needs_most_cam_peaks_clearly_outside():
    """An image where one CAM misses and four hit is not a "miss", even when it is the image
    with the most misses: the row is then not drawn."""
    table = selection_table()
    one_miss = table[table["sample_id"].isin(["c", "e"])]          # c: 1 of 5 out, e: 0 of 5
    assert case_figures.select_figure3_cases(one_miss, 0.90, image_size=100)["miss"] is None
    two_of_five = table[table["sample_id"].isin(["a"])]            # 2 of 5 out: no majority
    assert case_figures.select_figure3_cases(two_of_five, 0.90, image_size=100)["miss"] is None


@pytest.mark.parametrize("seed", range(6))
def test_each_row_title_matches_its_own_peaks(seed):
    """Random audit tables: the selected row's title counts exactly its CAM peaks outside the
    lesion, and that count obeys its role's rule (miss: most out; discordant: some in, some out;
    consensus: none out)."""
    rng = np.random.default_rng(seed)
    rows = []
    for sample in range(12):
        p_out = rng.uniform()
        for method in CAM_METHODS:
            outside = bool(rng.uniform() < p_out)
            rows.append({"sample_id": f"s{sample:02d}", "method": method, "scaled_score": 0.95,
                         "peak_outside_mask": outside, "iou": rng.uniform(), "constant_map": False,
                         "peak_lesion_distance": rng.uniform(6, 30) if outside else 0.0})
    table = pd.DataFrame(rows)
    selection = case_figures.select_figure3_cases(table, 0.9, image_size=100)
    for role, sample in selection.items():
        if sample is None:
            continue
        own = table[table["sample_id"] == sample].set_index("method")
        info = {m: {"constant_map": False, "peak_outside_mask": bool(own.loc[m, "peak_outside_mask"])}
                for m in CAM_METHODS}
        outside = int(own["peak_outside_mask"].sum())
        assert case_figures.row_title(role, info).split(": ")[1] == f"{outside} of 5 CAM peaks outside the lesion"
        assert {"miss": outside >= 3, "discordant": 0 < outside < 5, "consensus": outside == 0}[role]


def test_the_miss_majority_counts_maps_that_have_a_peak():
    """2 of 2 defined peaks clearly out and 3 constant maps (no peak; the audit counts them as
    outside): a miss."""
    rows = [{"sample_id": "x", "method": m, "scaled_score": 0.95, "peak_outside_mask": True,
             "iou": 0.0, "constant_map": i >= 2, "peak_lesion_distance": 20.0 if i < 2 else np.nan}
            for i, m in enumerate(CAM_METHODS)]
    assert case_figures.select_figure3_cases(pd.DataFrame(rows), 0.9, image_size=100)["miss"] == "x"


@pytest.mark.parametrize("drawn_rows", [0, 1])
def test_figure3_keeps_its_rows_under_the_caption(tmp_path, drawn_rows):
    """The smoke cases: no row or one row drawn, the others not drawn, every map method (the
    salience baseline too) and the full caption. Constrained layout must not collapse the rows
    (it warns "axes sizes collapsed to zero" when the caption leaves them no height)."""
    import warnings

    import matplotlib.pyplot as plt
    import numpy as np

    from endoexplain_core import artefacts
    from endoexplain_core.methods import MAP_METHODS

    size = 32
    mask = np.zeros((size, size), bool)
    mask[10:20, 10:20] = True
    maps = {m: np.random.default_rng(i).random((size, size)) for i, m in enumerate(MAP_METHODS)}
    rows = {m: {"iou": 0.2, "constant_map": False, "peak_outside_mask": i % 2 == 0, "distance": 3.0}
            for i, m in enumerate(MAP_METHODS)}
    drawn = [{"role": "miss", "sample_id": "case_1", "score": 0.95, "rgb": np.full((size, size, 3), 0.5),
              "mask": mask, "maps": maps, "rows": rows}][:drawn_rows]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = case_figures.draw_figure3(drawn, top_fraction=0.2)
        artefacts.save_figure(fig, "figure3_cases", tmp_path, dpi=40)
    drawn_axes = [ax for ax in fig.get_axes() if ax.get_images()]
    assert len(drawn_axes) == (1 + len(MAP_METHODS)) * drawn_rows
    assert all(ax.get_position().height > 0.05 for ax in drawn_axes)
    plt.close(fig)
