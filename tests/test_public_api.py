"""The 1.0 public API (docs/api.md): every listed name imports from the module the docs name,
takes the documented parameters, and the protocol's three kernels run end to end on a toy
model whose answers a person can check by hand."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import endoexplain_core

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
ROW = re.compile(r"^\| `(?P<module>[\w.]+)` \| `(?P<name>\w+)` \|(?P<params>[^|]*)\|")


def documented_names() -> list[tuple[str, str, list[str]]]:
    rows = []
    for line in API_DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            params = [p.strip() for p in match["params"].strip().strip("`").split(",") if p.strip()]
            rows.append((match["module"], match["name"], params))
    return rows


def test_the_api_table_lists_the_kernels_the_cli_and_the_verdicts():
    names = {(module.rsplit(".", 1)[-1], name) for module, name, _ in documented_names()}
    for expected in [("cams", "compute_cams"), ("threshold", "top_fraction_mask"),
                     ("deletion", "deletion_response"), ("metrics", "peak_outside_mask"),
                     ("cli", "main"), ("verdicts", "compare_runs"), ("endoexplain_core", "__version__")]:
        assert expected in names, expected


@pytest.mark.parametrize("module, name, params", documented_names(),
                         ids=lambda value: value if isinstance(value, str) else None)
def test_every_documented_name_imports_with_its_documented_parameters(module, name, params):
    obj = getattr(importlib.import_module(module), name)
    if not params:
        return
    signature = inspect.signature(obj)
    assert list(signature.parameters)[:len(params)] == params, (
        f"{module}.{name}{signature} does not start with the documented ({', '.join(params)})")


def test_the_short_form_imports_the_kernel_modules():
    from endoexplain_core import cams, deletion, threshold
    from endoexplain_core.kernels import cams as kernel_cams

    assert cams is kernel_cams
    assert callable(threshold.top_fraction_mask) and callable(deletion.deletion_response)
    with pytest.raises(AttributeError):
        endoexplain_core.not_a_kernel  # noqa: B018


def test_version_is_one_source():
    from importlib import metadata

    assert endoexplain_core.__version__ == "1.0.0"
    assert metadata.version("endoexplain") == endoexplain_core.__version__


class LeftHalfModel(nn.Module):
    """A 1-channel 4x4 feature map that copies the image's channel 0 (avg-pooled 2x), and a
    positive logit = the mean of that map's left two columns: its evidence is the left half."""

    def __init__(self):
        super().__init__()
        self.features = nn.AvgPool2d(2)

    def forward(self, images):
        feature = self.features(images[:, :1])                # (B, 1, 4, 4)
        positive = feature[:, 0, :, :2].mean(dim=(1, 2))
        return torch.stack([torch.zeros_like(positive), positive], dim=1)


def test_the_three_kernels_run_end_to_end_on_a_hand_checkable_model():
    from endoexplain_core import cams, deletion, threshold
    from endoexplain_core.kernels import metrics

    images = torch.ones(1, 3, 8, 8)
    model = LeftHalfModel()
    maps = cams.compute_cams(model, "features", images, target_class=1, methods=("hirescam", "gradcam"))
    # HiResCAM = ReLU(sum over channels of gradient x activation): the gradient reaches only the
    # left two feature columns (of 4), so the map is 1 on the left half and 0 on the right.
    assert bool((maps["hirescam"][0, :, :2] > 0.99).all()) and float(maps["hirescam"][0, :, 6:].max()) == 0.0
    # Grad-CAM weights the one uniform channel by its mean gradient: a constant map, all zeros.
    assert float(maps["gradcam"].abs().max()) == 0.0
    keep = threshold.top_fraction_mask(maps["hirescam"], 0.25)   # 16 of 64 pixels
    assert int(keep.sum()) == 16 and bool(keep[0, :, 4:].any()) is False
    # Deleting 16 pixels of value 1 in the left half: the left feature mean falls by 16/32.
    drops = deletion.deletion_response(model, images, keep, target_class=1)
    assert drops.tolist() == [0.5]
    lesion = torch.zeros(1, 8, 8, dtype=torch.bool)
    lesion[0, :, :2] = True
    assert metrics.peak_outside_mask(maps["hirescam"], lesion).tolist() == [False]
