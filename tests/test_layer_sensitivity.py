"""Layer sensitivity: channel-weight diagnostics on hand-checkable activations and gradients."""

import numpy as np
import pandas as pd
import pytest
import torch

from endoexplain_core.analysis import layer_sensitivity
from endoexplain_core.methods import CAM_METHODS


def _one_image() -> tuple[torch.Tensor, torch.Tensor]:
    """Three channels of a 1x2 grid. S_c = 2, 0.001 and -4 (median |S| = 2, so only channel 1
    is near zero). Channel 1's gradient varies over space: XGrad-CAM's weight there is
    sum(g A) / S_c = 1 / 0.001 = 1000 against Grad-CAM's mean(g) = 0.5, a ratio of 2000."""
    activation = torch.tensor([[[[1.0, 1.0]], [[1.0, -0.999]], [[-2.0, -2.0]]]])
    gradient = torch.tensor([[[[1.0, 1.0]], [[1.0, 0.0]], [[0.5, 0.5]]]])
    return activation, gradient


def test_near_zero_channels_and_weight_ratios_by_hand():
    result = layer_sensitivity.weight_diagnostics(*_one_image())
    np.testing.assert_array_equal(result["near_zero"], [[False, True, False]])
    np.testing.assert_array_equal(result["negative"], [[False, False, True]])
    np.testing.assert_allclose(result["gradcam"], [[1.0, 1.0, 1.0]])
    # channel 0: 2 / 2 = 1 = Grad-CAM; channel 2: -2 / -4 = 0.5 = Grad-CAM
    np.testing.assert_allclose(result["xgradcam"], [[1.0, 1.0 / (0.001 + 1e-7) / 0.5, 1.0]], rtol=1e-4)  # float32 A


def test_ratio_is_undefined_where_grad_cam_weight_is_zero():
    activation = torch.ones(1, 2, 2, 2)
    gradient = torch.tensor([[[[1.0, -1.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]]])  # channel 0: mean 0
    result = layer_sensitivity.weight_diagnostics(activation, gradient)
    assert np.isnan(result["xgradcam"][0, 0]) and result["xgradcam"][0, 1] == pytest.approx(1.0)


def test_table_marks_xgradcam_ill_posed_only_above_the_bound():
    panel = pd.DataFrame({"panel": "A", "method": list(CAM_METHODS) + ["centre"], "n": 10, "n_constant": 0,
                          **{c: 0.5 for c in ("peak_failure", "peak_failure_ci_low", "peak_failure_ci_high",
                                               "peak_failure_defined", "iou", "iou_ci_low", "iou_ci_high")}})
    facts = {"near_zero_channel_share": 0.06, "negative_channel_share": 0.4,
             **{f"{m}_ratio_{s}": v for m, values in (("gradcam", (1.0, 1.0, 1.0)), ("gradcampp", (0.3, 2.0, 9.0)),
                                                     ("xgradcam", (1.5, 70.0, 25042.0)))
                for s, v in zip(("median", "p99", "max"), values)}}
    # a: near-zero share 0.06 > 0.05; b: share 0.01 but XGrad-CAM's weight ratio p99 70 > 10;
    # c: share 0.01 and p99 4.7 (the default run's features.8.0): well posed
    table = layer_sensitivity.layer_sensitivity_table(
        {"a": panel, "b": panel, "c": panel},
        {"a": facts, "b": facts | {"near_zero_channel_share": 0.01},
         "c": facts | {"near_zero_channel_share": 0.01, "xgradcam_ratio_p99": 4.7}},
        {"a": [], "b": [("gradcam", "xgradcam")], "c": []})
    assert len(table) == 15 and set(table["method"]) == set(CAM_METHODS)
    ill = table[table["ill_posed"]]
    assert list(zip(ill["layer"], ill["method"])) == [("a", "xgradcam"), ("b", "xgradcam")]
    row = table.set_index(["layer", "method"])
    assert row.loc[("a", "xgradcam"), "weight_ratio_p99"] == 70.0
    assert row.loc[("a", "xgradcam"), "weight_ratio_max"] == 25042.0
    assert np.isnan(row.loc[("a", "hirescam"), "weight_ratio_median"])
    assert row.loc[("b", "gradcam"), "identical_with"] == "XGrad-CAM"


def test_layer_diagnostics_reads_each_batch_once_for_every_layer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(4, 6, 3, padding=1),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(6, 2))
    images = torch.randn(5, 3, 8, 8)
    reads = []

    def batches():
        for start in (0, 3):
            reads.append(start)
            yield images[start:start + 3]

    layers = {"first": model[0], "second": model[1]}
    result = layer_sensitivity.layer_diagnostics(model, layers, batches())
    assert reads == [0, 3] and set(result) == {"first", "second"}
    from endoexplain_core.kernels import cams
    activation, gradient = cams.activation_and_gradient(model, model[0], images)
    direct = layer_sensitivity.weight_diagnostics(activation, gradient)
    assert result["first"]["negative_channel_share"] == pytest.approx(direct["negative"].mean())
    ratios = direct["xgradcam"][np.isfinite(direct["xgradcam"])]
    assert result["first"]["xgradcam_ratio_max"] == pytest.approx(ratios.max())
    assert result["first"]["gradcam_ratio_median"] == pytest.approx(1.0)
