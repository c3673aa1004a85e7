"""LayerCAM from the fused CAM kernel: parity with pytorch-grad-cam and no extra pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_grad_cam import LayerCAM
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

from endoexplain_core.kernels import cams
from endoexplain_core.methods import CAM_METHODS, EXTENDED_CAM_METHODS, MAP_METHODS
from endoexplain_core.models import networks
from tests.kernel_fixtures import nondegenerate_model, seeded_images

IMAGE_SIZE = 96


@pytest.mark.parametrize("arch", ["resnet34", "efficientnet_b0"])
def test_layercam_matches_pytorch_grad_cam(arch):
    model = nondegenerate_model(arch, seed=7, image_size=IMAGE_SIZE)
    layer_name = networks.TARGET_LAYERS[arch]
    images = seeded_images(2, IMAGE_SIZE, seed=3)
    ours = cams.compute_cams(model, layer_name, images, target_class=1,
                             methods=("gradcam", "layercam"))["layercam"].numpy()
    with LayerCAM(model=model, target_layers=[model.get_submodule(layer_name)]) as explainer:
        reference = explainer(input_tensor=images, targets=[ClassifierOutputTarget(1)] * 2)
    assert reference.std() > 0.05, f"{arch}: degenerate reference map"
    assert np.abs(ours - reference).max() <= 1e-4, arch


def test_layercam_costs_no_extra_pass_and_stays_out_of_table_4():
    model = nondegenerate_model("resnet34", seed=7, image_size=IMAGE_SIZE)
    calls = []
    handle = model.fc.register_forward_hook(lambda *args: calls.append(1))
    try:
        maps = cams.compute_cams(model, "layer4", seeded_images(2, IMAGE_SIZE, seed=1),
                                 methods=CAM_METHODS + EXTENDED_CAM_METHODS)
    finally:
        handle.remove()
    assert len(calls) == 1 and set(maps) == set(CAM_METHODS) | {"layercam"}
    assert "layercam" not in CAM_METHODS and "layercam" not in MAP_METHODS
    assert "layercam" not in cams.compute_cams(model, "layer4", seeded_images(1, IMAGE_SIZE))
