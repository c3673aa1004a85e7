"""Faithfulness and sanity controls: imputation, ROAD/SRG, LSR, placement, shape-preserving
deletion and cascading randomisation, each against an independent reference or a toy model
whose answer is known by construction."""

import numpy as np
import pandas as pd
import pytest
import torch
import torchvision
from torch import nn

from endoexplain_core import config
from endoexplain_core.analysis import faithfulness
from endoexplain_core.kernels import imputation, placement, randomisation, reliance, road
from endoexplain_core.kernels.cams import compute_cams

ROAD_FRACTIONS = tuple(config.FaithfulnessSettings().road_fractions)  # the profile default


# --- imputation -------------------------------------------------------------------------------

def dense_imputation(image: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """Reference: build the neighbour-mean system entry by entry and solve it densely."""
    channels, height, width = image.shape
    index = {pixel: i for i, pixel in enumerate(zip(*np.nonzero(removed)))}
    matrix = np.zeros((len(index), len(index)))
    rhs = np.zeros((len(index), channels))
    weights = {(-1, -1): 1 / 12, (-1, 0): 1 / 6, (-1, 1): 1 / 12, (0, -1): 1 / 6, (0, 1): 1 / 6,
               (1, -1): 1 / 12, (1, 0): 1 / 6, (1, 1): 1 / 12}
    for (r, c), i in index.items():
        for (dr, dc), w in weights.items():
            rr, cc = r + dr, c + dc
            if 0 <= rr < height and 0 <= cc < width:
                matrix[i, i] += w
                if removed[rr, cc]:
                    matrix[i, index[(rr, cc)]] -= w
                else:
                    rhs[i] += w * image[:, rr, cc]
    solution = np.linalg.solve(matrix, rhs)
    out = image.copy()
    for (r, c), i in index.items():
        out[:, r, c] = solution[i]
    return out


@pytest.mark.parametrize("solver", ["direct", "cg"])
def test_imputation_equals_a_dense_solve_on_small_images(solver):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(3, 3, 11, 9))
    removed = rng.random((3, 11, 9)) < 0.45
    removed[2, 3:8, 2:7] = True  # one solid block: interior pixels see only unknowns
    filled, info = imputation.solve_linear_imputation(torch.tensor(images), torch.tensor(removed),
                                                      solver=solver, tolerance=1e-12)  # direct: checked
    for b in range(3):
        np.testing.assert_allclose(filled[b].numpy(), dense_imputation(images[b], removed[b]),
                                   atol=1e-9)
    assert info.max_relative_residual <= 1e-12 and info.solver == solver


def test_direct_and_conjugate_gradient_solvers_agree_on_solid_removals():
    # Smooth saliency -> MoRF removes a solid blob, the case CG is slow on; both solvers must
    # give the same fill to within CG's tolerance (pixel errors far below the added noise).
    generator = torch.Generator().manual_seed(3)
    images = torch.nn.functional.interpolate(torch.randn(4, 3, 6, 6, generator=generator),
                                             size=(48, 48), mode="bilinear", align_corners=False)
    saliency = torch.nn.functional.interpolate(torch.rand(4, 1, 3, 3, generator=generator),
                                               size=(48, 48), mode="bilinear", align_corners=False)[:, 0]
    fov = torch.ones(4, 48, 48, dtype=torch.bool)
    removed = road.road_removal_masks(saliency, fov, "morf", (0.2,))[0]
    direct, direct_info = imputation.solve_linear_imputation(images, removed, solver="direct")
    iterative, cg_info = imputation.solve_linear_imputation(images, removed, solver="cg",
                                                            tolerance=1e-6)
    assert direct_info.solver == "direct" and cg_info.solver == "cg" and cg_info.iterations > 10
    assert direct_info.max_relative_residual < 1e-6
    assert (direct - iterative).abs().max() < 1e-3
    assert torch.equal(direct[~removed[:, None].expand_as(direct)],
                       images[~removed[:, None].expand_as(images)])


def test_auto_solver_is_direct_on_the_cpu_and_unknown_solvers_are_refused():
    images, removed = torch.randn(1, 3, 8, 8), torch.zeros(1, 8, 8, dtype=torch.bool)
    removed[0, 2:5, 3:6] = True
    assert imputation.solve_linear_imputation(images, removed)[1].solver == "direct"
    with pytest.raises(ValueError, match="unknown imputation solver"):
        imputation.solve_linear_imputation(images, removed, solver="lu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_conjugate_gradient_matches_the_cpu_direct_solve():
    images = torch.randn(3, 3, 40, 40, generator=torch.Generator().manual_seed(4))
    removed = torch.zeros(3, 40, 40, dtype=torch.bool)
    removed[:, 10:30, 8:26] = True
    cpu, _ = imputation.solve_linear_imputation(images, removed)
    cuda, info = imputation.solve_linear_imputation(images.cuda(), removed.cuda(), tolerance=1e-6)
    assert info.solver == "cg"
    assert (cuda.cpu() - cpu).abs().max() < 1e-3


def test_imputation_keeps_kept_pixels_and_fills_a_smooth_ramp_exactly():
    rows = torch.arange(16, dtype=torch.float64)
    ramp = (rows[:, None] + 2 * rows[None, :]).expand(2, 16, 16)[None].repeat(2, 1, 1, 1)
    removed = torch.zeros(2, 16, 16, dtype=torch.bool)
    removed[:, 4:12, 5:10] = True
    filled, _ = imputation.solve_linear_imputation(ramp, removed, tolerance=1e-12)
    # A linear ramp is its own neighbour mean (symmetric weights), so it is reproduced.
    torch.testing.assert_close(filled, ramp)
    noisy, _ = imputation.noisy_linear_imputation(ramp, removed, noise_keys=[1, 2], noise_std=0.1)
    assert torch.equal(noisy[:, :, ~removed[0]], ramp[:, :, ~removed[0]])
    assert (noisy - ramp)[:, :, removed[0]].abs().max() > 0


def test_imputation_noise_is_seeded_per_image_not_per_batch():
    images = torch.randn(3, 3, 12, 12)
    removed = torch.rand(3, 12, 12) < 0.3
    # A tight solve, so the batch's joint stopping rule cannot differ from the single image's.
    together, _ = imputation.noisy_linear_imputation(images.double(), removed, noise_keys=[5, 6, 7],
                                                     noise_std=0.01, tolerance=1e-12)
    alone, _ = imputation.noisy_linear_imputation(images[1:2].double(), removed[1:2], noise_keys=[6],
                                                  noise_std=0.01, tolerance=1e-12)
    torch.testing.assert_close(together[1:2], alone)


@pytest.mark.parametrize("solver", ["direct", "cg"])
def test_a_fully_removed_frame_keeps_zero(solver):
    filled, _ = imputation.solve_linear_imputation(torch.randn(1, 3, 5, 5),
                                                   torch.ones(1, 5, 5, dtype=torch.bool),
                                                   solver=solver)
    assert torch.equal(filled, torch.zeros_like(filled))


def test_a_fully_removed_frame_beside_a_partly_removed_one():
    # The whole-frame group is singular (no kept neighbour) and stays 0; the other image is
    # solved as if alone.
    images = torch.randn(2, 3, 7, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    removed = torch.zeros(2, 7, 7, dtype=torch.bool)
    removed[0] = True
    removed[1, 2:5, 1:6] = True
    filled, info = imputation.solve_linear_imputation(images, removed, solver="direct")
    assert torch.equal(filled[0], torch.zeros_like(filled[0]))
    np.testing.assert_allclose(filled[1].numpy(), dense_imputation(images[1].numpy(), removed[1].numpy()),
                               atol=1e-10)
    assert info.max_relative_residual < 1e-12


# --- ROAD and SRG ------------------------------------------------------------------------------

class PixelLinear(nn.Module):
    """Fixed-weight linear classifier: z = sum_p w_p * mean_c x_cp; logits (0, z)."""

    def __init__(self, weights: torch.Tensor):
        super().__init__()
        self.register_buffer("weights", weights)

    def forward(self, x):
        z = (x.mean(dim=1) * self.weights).flatten(1).sum(dim=1)
        return torch.stack([torch.zeros_like(z), z], dim=1)


def dotted_images(n: int, size: int, seed: int):
    """Dark frames with bright isolated dots; the model reads exactly the dot pixels."""
    generator = torch.Generator().manual_seed(seed)
    dots = torch.zeros(size, size)
    dots[2::4, 2::4] = 1.0
    images = 0.05 * torch.randn(n, 3, size, size, generator=generator) + 2.0 * dots
    return images, dots


def test_removal_masks_are_nested_exact_and_inside_the_field_of_view():
    maps = torch.rand(2, 20, 20)
    fov = torch.zeros(2, 20, 20, dtype=torch.bool)
    fov[:, 2:18, 3:19] = True
    masks = road.road_removal_masks(maps, fov, "morf", ROAD_FRACTIONS)
    counts = road.removal_counts(fov, ROAD_FRACTIONS)
    assert torch.equal(masks.flatten(2).sum(2), counts)
    assert not (masks & ~fov).any()
    assert (masks[:-1] <= masks[1:]).all()
    lerf = road.road_removal_masks(maps, fov, "lerf", ROAD_FRACTIONS)
    top = maps[0][masks[0, 0]].min()
    assert top >= maps[0][fov[0]].quantile(0.98)
    assert maps[0][lerf[0, 0]].max() <= maps[0][fov[0]].quantile(0.02)


def test_srg_positive_for_the_models_own_pixels_and_about_zero_for_a_random_map():
    images, dots = dotted_images(12, 24, seed=3)
    model = PixelLinear(dots)
    fov = torch.ones(12, 24, 24, dtype=torch.bool)
    keys = list(range(12))
    maps = {"truth": dots.expand(12, -1, -1) + 1e-3 * torch.rand(12, 24, 24),
            "random": torch.rand(12, 24, 24, generator=torch.Generator().manual_seed(9))}
    drops = road.road_drops(model, images, maps, fov, keys, temperature=2.0, fractions=ROAD_FRACTIONS,
                            noise_std=0.01)
    srg = {m: road.symmetric_relevance_gain(d["morf"], d["lerf"]) for m, d in drops.items()}
    assert (srg["truth"] > 0.5).all()
    # MoRF at 1% removes round(5.76) = 6 dots of grey level 2 -> z/T drops by 6 * 2 / T = 6.
    assert drops["truth"]["morf"][0].mean() == pytest.approx(6.0, rel=0.05)
    assert drops["truth"]["lerf"].abs().max() < 0.05
    assert abs(float(srg["random"].mean())) < 0.25 * float(srg["truth"].mean())


def test_road_timings_count_the_forwards():
    images, dots = dotted_images(4, 16, seed=1)
    timings = {}
    road.road_drops(PixelLinear(dots), images, {"m": torch.rand(4, 16, 16)},
                    torch.ones(4, 16, 16, dtype=torch.bool), [1, 2, 3, 4], temperature=1.0,
                    fractions=ROAD_FRACTIONS, noise_std=0.01, timings=timings)
    assert timings["forwards"] == 4 * 10  # 5 fractions x 2 orders per image and map
    assert timings["imputation_s"] > 0 and timings["forward_s"] > 0


# --- placement, LSR and shape-preserving deletion ------------------------------------------------

def disc(size: int, centre, radius: float) -> torch.Tensor:
    rows = torch.arange(size, dtype=torch.float32)[:, None]
    cols = torch.arange(size, dtype=torch.float32)[None, :]
    return (rows - centre[0]) ** 2 + (cols - centre[1]) ** 2 <= radius ** 2


def test_valid_translations_match_brute_force():
    size = 12
    region = torch.zeros(1, size, size, dtype=torch.bool)
    region[0, 3:6, 4:6] = True
    fov = disc(size, (5.5, 5.5), 5.5)[None]
    fov |= region
    found = {tuple(s) for s in placement.valid_translations(region, fov, avoid=region)[0].tolist()}
    expected = set()
    ys, xs = region[0].nonzero(as_tuple=True)
    for dy in range(-size + 1, size):
        for dx in range(-size + 1, size):
            r, c = ys + dy, xs + dx
            if ((r < 0) | (r >= size) | (c < 0) | (c >= size)).any():
                continue
            if fov[0, r, c].all() and not region[0, r, c].any():
                expected.add((dy, dx))
    assert found == expected and len(found) > 0


def test_seeded_translations_keep_shape_stay_in_view_and_avoid():
    size = 32
    fov = disc(size, (16, 16), 15)[None].expand(2, -1, -1).clone()
    zone = torch.stack([disc(size, (16, 16), 4), disc(size, (12, 18), 3)])
    moved, placed = placement.seeded_translations(zone, fov, [11, 12], count=5, purpose="t", avoid=zone)
    assert placed.all()
    for slot in range(5):
        for b in range(2):
            assert moved[slot, b].sum() == zone[b].sum()
            assert not (moved[slot, b] & ~fov[b]).any()
            assert not (moved[slot, b] & zone[b]).any()
    again, _ = placement.seeded_translations(zone[1:], fov[1:], [12], count=5, purpose="t", avoid=zone[1:])
    assert torch.equal(again[:, 0], moved[:, 1])


class RegionReader(nn.Module):
    """z = sum of the grey level over a fixed region (lesion or corner)."""

    def __init__(self, region: torch.Tensor):
        super().__init__()
        self.register_buffer("region", region.float())

    def forward(self, x):
        z = (x.mean(dim=1) * self.region).flatten(1).sum(dim=1)
        return torch.stack([torch.zeros_like(z), z], dim=1)


def lesion_scene(n: int, size: int = 40):
    generator = torch.Generator().manual_seed(4)
    lesion = disc(size, (18, 20), 4)
    fov = disc(size, (size / 2 - 0.5, size / 2 - 0.5), size / 2 - 1)  # corners out of view
    images = 0.1 * torch.randn(n, 3, size, size, generator=generator) + 1.5 * lesion
    return images, lesion.expand(n, -1, -1), fov.expand(n, -1, -1).clone()


def test_lsr_positive_for_a_lesion_reader_and_zero_for_a_corner_reader():
    images, zones, fov = lesion_scene(4)
    lesion_reader = RegionReader(zones[0])
    corner = torch.zeros(40, 40, dtype=torch.bool)
    corner[:3, :3] = True
    corner_reader = RegionReader(corner)
    keys = [1, 2, 3, 4]
    lesion_lsr = reliance.lesion_specific_reliance(lesion_reader, images, zones, fov, keys,
                                                   temperature=1.0, n_regions=5, noise_std=0.01)
    corner_lsr = reliance.lesion_specific_reliance(corner_reader, images, zones, fov, keys,
                                                   temperature=1.0, n_regions=5, noise_std=0.01)
    assert (lesion_lsr["n_regions"] == 5).all()
    assert (lesion_lsr["lsr"] > 50).all()  # about 50 lesion pixels lose 1.5 each
    torch.testing.assert_close(corner_lsr["lsr"], torch.zeros(4, dtype=torch.float64), atol=1e-9, rtol=0)


def test_shape_preserving_deletion_separates_the_right_place_from_the_shape():
    images, zones, fov = lesion_scene(3)
    model = RegionReader(zones[0])
    result = reliance.shape_preserving_deletion(model, images, zones, fov, [7, 8, 9],
                                                method="gradcam", repetitions=6)
    assert (result["n_shifts"] == 6).all()
    assert (result["cam_drop"] > result["shifted_drop_mean"]).all()
    # A translated copy overlaps the lesion at most partly, so its mean drop is smaller.
    assert (result["shifted_drop_mean"] < 0.8 * result["cam_drop"]).all()


# --- cascading randomisation -------------------------------------------------------------------

def test_randomisation_changes_gradient_maps_and_head_step_keeps_eigencam():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=2).eval()
    images = torch.randn(3, 3, 64, 64)
    layer = "layer4.1"
    trained = compute_cams(model, model.get_submodule(layer), images)
    steps = {}
    for name, net in randomisation.cascade(model, seed=1):
        steps[name] = compute_cams(net, net.get_submodule(layer), images)
    blocks = [name for name, _ in randomisation.randomisation_blocks(model)]
    assert blocks == ["fc", "layer4", "layer3", "layer2", "layer1", "stem"]
    assert list(steps) == blocks
    # The head leaves the activations alone: Eigen-CAM (class-agnostic) is unchanged ...
    torch.testing.assert_close(steps["fc"]["eigencam"], trained["eigencam"])
    # ... while the gradient methods change once the weights they explain are random.
    last = steps["stem"]
    for method in ("gradcam", "gradcampp", "xgradcam", "hirescam"):
        rho = randomisation.spearman_per_image(last[method], trained[method])
        assert np.nanmean(rho) < 0.9, method
    # The trained model itself was not modified.
    torch.testing.assert_close(compute_cams(model, model.get_submodule(layer), images)["gradcam"],
                               trained["gradcam"])


def test_fully_randomised_is_the_cascade_s_last_step_and_leaves_the_model_alone():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=2).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    randomised = randomisation.fully_randomised(model, seed=4)
    *_, (_, last) = randomisation.cascade(model, seed=4)
    for key, value in randomised.state_dict().items():
        torch.testing.assert_close(value, last.state_dict()[key])
        torch.testing.assert_close(model.state_dict()[key], before[key])
    assert not torch.equal(randomised.fc.weight, model.fc.weight)
    assert not torch.equal(randomised.conv1.weight, model.conv1.weight)
    assert not randomised.training


def test_spearman_and_top_iou_against_scipy_and_by_hand():
    from scipy.stats import spearmanr
    a, b = torch.rand(2, 6, 7), torch.rand(2, 6, 7)
    a[0, :3] = 0.0  # ties
    rho = randomisation.spearman_per_image(a, b)
    for i in range(2):
        assert rho[i] == pytest.approx(spearmanr(a[i].flatten(), b[i].flatten()).statistic)
    assert np.isnan(randomisation.spearman_per_image(torch.zeros(1, 4, 4), torch.rand(1, 4, 4))[0])
    assert randomisation.top_area_iou(a, a, 0.2) == pytest.approx([1.0, 1.0])


# --- figures from fixed tables -------------------------------------------------------------------

def test_faithfulness_figures_render_from_fixed_tables():
    import matplotlib
    matplotlib.use("Agg")
    import pandas as pd
    from endoexplain_core.figures import faithfulness_figures as figures

    methods = ["gradcam", "eigencam", "random"]
    curves = pd.DataFrame([{"checkpoint_id": "c", "method": m, "order": o, "fraction": f,
                            "drop": f * (3 if o == "morf" else 1), "ci_low": 0.0, "ci_high": f * 4}
                           for m in methods for o in road.ORDERS for f in ROAD_FRACTIONS])
    srg = pd.DataFrame({"method": methods, "srg": [0.5, 0.2, 0.0], "ci_low": [0.3, 0.0, -0.1],
                        "ci_high": [0.7, 0.4, 0.1]})
    shape = pd.DataFrame({"method": ["gradcam", "eigencam"], "cam_minus_shifted": [0.4, 0.1],
                          "ci_low": [0.2, -0.1], "ci_high": [0.6, 0.3],
                          "cam_minus_pixel_random": [0.8, 0.3], "pixel_ci_low": [0.6, 0.1],
                          "pixel_ci_high": [1.0, 0.5]})
    randomised = pd.DataFrame([{"step": s, "block": b, "method": m, "spearman": 1 - 0.3 * s,
                                "top_iou": 1 - 0.2 * s}
                               for s, b in enumerate(["trained", "fc", "layer4"]) for m in methods[:2]])
    gaps = pd.DataFrame([{"contrast": "A vs B", "outcome": o, "model": "M1", "slopes": "shared",
                          "method": m, "gap": g, "ci_low": g - 1, "ci_high": g + 1, "ci90_low": g - 0.8,
                          "ci90_high": g + 0.8, "tost_equivalent": False}
                         for o, g in (("energy_lift", 0.2), ("pointing_hit", 5.0)) for m in methods[:2]])
    for figure in (figures.road_curves_figure(curves), figures.srg_shape_figure(srg, shape),
                   figures.randomisation_figure(randomised), figures.subgroup_forest_figure(gaps)):
        assert figure.axes and all(ax.has_data() for ax in figure.axes)
        matplotlib.pyplot.close(figure)


def test_road_figure_draws_coinciding_curves_once_and_names_them():
    import matplotlib
    matplotlib.use("Agg")
    import pandas as pd
    from endoexplain_core.figures import faithfulness_figures as figures

    slopes = {"gradcam": 3.0, "xgradcam": 3.0, "eigencam": 2.0, "random": 1.0}
    curves = pd.DataFrame([{"checkpoint_id": "c", "method": m, "order": o, "fraction": f,
                            "drop": slope * f, "ci_low": 0.0, "ci_high": 4 * f}
                           for m, slope in slopes.items() for o in road.ORDERS for f in ROAD_FRACTIONS])
    assert figures.coinciding_curves(curves) == {"gradcam": ["xgradcam"]}
    nudged = curves.copy()
    nudged.loc[nudged["method"] == "xgradcam", "drop"] += 1e-6
    assert figures.coinciding_curves(nudged) == {}
    figure = figures.road_curves_figure(curves)
    labels = figure.axes[1].get_legend_handles_labels()[1]
    assert "Grad-CAM = XGrad-CAM" in labels and len(labels) == 3
    assert all(len(ax.get_lines()) == 3 + 1 for ax in figure.axes[:2])  # three curves + the zero line
    matplotlib.pyplot.close(figure)


def test_randomisation_similarity_changes_step_by_step():
    from endoexplain_core.analysis import faithfulness
    from endoexplain_core.models import networks

    torch.manual_seed(0)
    model = networks.build_model("resnet34").eval()
    images = torch.randn(2, 3, 64, 64)
    masks = torch.zeros(2, 64, 64, dtype=torch.bool)
    masks[:, 20:40, 20:40] = True
    prepared = faithfulness.PreparedCases(["a", "b"], images, masks)
    table = faithfulness.randomisation_similarity(model, {"arch": "resnet34", "checkpoint_id": "x"},
                                                  prepared, seed=1, top_fraction=0.2, batch_size=2)
    eigen = table[table["method"] == "eigencam"].groupby("step")["spearman"].mean()
    assert eigen[0] == pytest.approx(1.0) and eigen[1] == pytest.approx(1.0)  # trained, fc only
    assert eigen.iloc[-1] < 0.9  # the whole network random: the map has changed
    assert eigen.nunique() > 2   # each step is its own model, not the last one repeated


def test_shape_deletion_table_means_are_over_the_same_images():
    # Image c has no room for a shifted copy: it must leave every paired column, or the table
    # reads cam_drop - shifted_drop != cam_minus_shifted (found on the default run).
    shape = pd.DataFrame({"checkpoint_id": "ck", "method": "gradcam", "sample_id": ["a", "b", "c"],
                          "cam_drop": [2.0, 1.0, -5.0], "shifted_drop_mean": [1.0, 0.5, np.nan],
                          "n_shifts": [3, 3, 0], "cam_minus_shifted": [1.0, 0.5, np.nan]})
    row = faithfulness.shape_deletion_table(shape, None, replicates=50, seed=1).iloc[0]
    assert row["n"] == 2 and row["no_shift"] == 1
    assert row["cam_drop"] == pytest.approx(1.5) and row["shifted_drop"] == pytest.approx(0.75)
    assert row["cam_minus_shifted"] == pytest.approx(row["cam_drop"] - row["shifted_drop"])


def test_cost_table_reports_road_and_lsr_apart_and_together():
    timings = {"road": {"forwards": 40, "imputation_s": 1.0, "forward_s": 4.0},
               "lsr": {"forwards": 6, "imputation_s": 3.0, "forward_s": 1.0}, "total_s": 12.0}
    table = faithfulness.cost_table({"ckpt": timings}).set_index("part")
    assert list(table.index) == ["road", "lsr", "all"]
    assert table.loc["road", "imputation_per_forward_time"] == pytest.approx(0.25)
    assert table.loc["lsr", "imputation_per_forward_time"] == pytest.approx(3.0)
    assert table.loc["all", "forwards_fed"] == 46
    assert table.loc["all", "imputation_per_forward_time"] == pytest.approx(4.0 / 5.0)
    assert table.loc["all", "total_s"] == 12.0 and np.isnan(table.loc["road", "total_s"])


def test_direct_solve_with_untouched_images_in_the_batch_and_low_precision_inputs():
    # Images with nothing removed sit between and after solved ones; a float32 / bfloat16
    # 160-px frame removed but for one pixel is anchored by that pixel (a group-sum test in
    # low precision once mistook it for a frame with no kept pixel and left it at 0).
    images = torch.randn(4, 3, 160, 160, generator=torch.Generator().manual_seed(6))
    removed = torch.zeros(4, 160, 160, dtype=torch.bool)
    removed[1] = True
    removed[1, 80, 80] = False
    removed[3, 40:90, 30:100] = True
    for dtype in (torch.float32, torch.bfloat16):
        filled, info = imputation.solve_linear_imputation(images.to(dtype), removed, solver="direct")
        reference, _ = imputation.solve_linear_imputation(images.double(), removed, solver="direct")
        assert info.max_relative_residual < 1e-10
        assert torch.equal(filled[[0, 2]], images.to(dtype)[[0, 2]])
        # one kept pixel: the whole frame takes (about) its value, not 0
        kept_value = images.to(dtype)[1, :, 80, 80].double()
        assert torch.allclose(filled[1].double().mean(dim=(1, 2)), kept_value, atol=0.05)
        assert torch.allclose(filled[3].double(), reference[3].to(dtype).double(), atol=1e-2)
