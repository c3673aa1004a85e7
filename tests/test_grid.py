"""CAM grid geometry (kernels.grid): node positions and the resolution ceiling, by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from endoexplain_core.kernels import grid
from endoexplain_core.models import networks


def test_node_centres_are_where_a_bilinear_resize_puts_the_grid_values():
    # 5 nodes over 136 px: (i + 0.5) * 27.2 - 0.5
    np.testing.assert_allclose(grid.node_centres(5, 136), [13.1, 40.3, 67.5, 94.7, 121.9])
    # an upsampled one-hot grid peaks at the node's pixel (rounded): the resize the CAMs use
    for index, pixel in enumerate(np.floor(grid.node_centres(5, 136) + 0.5).astype(int)):
        cell = torch.zeros(1, 1, 5, 5)
        cell[0, 0, index, index] = 1.0
        up = F.interpolate(cell, size=(136, 136), mode="bilinear", align_corners=False)[0, 0]
        # the node's pixel holds the maximum (border cells hold it on a plateau out to the edge)
        assert up[pixel, pixel] == pytest.approx(float(up.max()), abs=0.02)
        if 0 < index < 4:
            row, col = divmod(int(up.flatten().argmax()), 136)
            assert abs(row - pixel) <= 1 and abs(col - pixel) <= 1
    with pytest.raises(ValueError):
        grid.node_centres(0, 136)


def test_nearest_node_inside_by_hand():
    masks = np.zeros((4, 20, 20), bool)   # 2 x 2 grid: nodes at pixel 4.5 -> 5 and 14.5 -> 15
    masks[0, 3:8, 3:8] = True             # centroid (5, 5): node (5, 5) inside
    masks[1, 8:12, 8:12] = True           # centroid (9.5, 9.5): nearest node (5, 5) (tie -> lower), outside
    masks[2, 13:20, 0:3] = True           # centroid (16, 1): node (15, 5), outside
    inside = grid.nearest_node_inside(masks, (2, 2))
    assert inside.tolist() == [True, False, False, False]   # the last mask is empty
    assert grid.nearest_node_inside(torch.from_numpy(masks[:1]), (2, 2)).tolist() == [True]
    with pytest.raises(ValueError, match="must be"):
        grid.nearest_node_inside(masks[0], (2, 2))


def test_cam_grid_shape_is_the_layers_output_and_leaves_the_model_as_it_was():
    model = networks.build_model("resnet18").train()
    assert networks.cam_grid_shape(model, "layer4.1", 136) == (5, 5)
    assert networks.cam_grid_shape(model, "layer3.1", 136) == (9, 9)
    assert model.training and not model.layer4[1]._forward_hooks
