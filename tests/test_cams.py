"""Fused CAM kernel: parity with pytorch-grad-cam, Eigen-CAM against NumPy, and hygiene."""

from __future__ import annotations

import gc

import cv2
import numpy as np
import pytest
import torch
from pytorch_grad_cam import GradCAM, GradCAMPlusPlus, HiResCAM, XGradCAM
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

from endoexplain_core import methods
from endoexplain_core.kernels import cams

from endoexplain_core.models import networks
from tests.kernel_fixtures import nondegenerate_model, seeded_images

IMAGE_SIZE = 96  # last feature map 3x3; the "other" layers give 6x6
# ConvNeXt's stage outputs (features.1/3/5) feed a LayerNorm, which is scale invariant, so
# sum_c g_c A_c = 0 there and HiResCAM is pure rounding noise: use a downsampling output.
OTHER_LAYERS = {"efficientnet_b0": "features.5", "resnet34": "layer3.5", "convnext_tiny": "features.4",
                "resnet18": "layer3.1", "mobilenet_v3_large": "features.12"}
LIBRARY = {"gradcam": GradCAM, "gradcampp": GradCAMPlusPlus, "xgradcam": XGradCAM, "hirescam": HiResCAM}

_MODELS: dict[str, torch.nn.Module] = {}


def _model(arch: str) -> torch.nn.Module:
    """One perturbed model per architecture for the whole file (building them is the slow part)."""
    if arch not in _MODELS:
        # seed 7 leaves MobileNetV3's HiResCAM all-negative on the test images (a zero map, no
        # test of agreement); seed 8 gives every method structure
        _MODELS[arch] = nondegenerate_model(arch, seed=8 if arch == "mobilenet_v3_large" else 7,
                                            image_size=IMAGE_SIZE)
    return _MODELS[arch]


def _library_cam(method: str, model, layer, images, target_class: int) -> np.ndarray:
    with LIBRARY[method](model=model, target_layers=[layer]) as explainer:
        return explainer(input_tensor=images, targets=[ClassifierOutputTarget(target_class)] * len(images))


@pytest.mark.parametrize("arch", networks.ARCHITECTURES)
@pytest.mark.parametrize("which", ["default", "other"])
def test_gradient_methods_match_pytorch_grad_cam(arch, which):
    model = _model(arch)
    layer_name = networks.TARGET_LAYERS[arch] if which == "default" else OTHER_LAYERS[arch]
    layer = model.get_submodule(layer_name)
    images = seeded_images(2, IMAGE_SIZE, seed=3)
    ours = cams.compute_cams(model, layer_name, images, target_class=1, methods=methods.GRADIENT_METHODS)
    for method in methods.GRADIENT_METHODS:
        reference = _library_cam(method, model, layer, images, target_class=1)
        ours_np = ours[method].numpy()
        assert ours_np.shape == reference.shape
        # non-degenerate: the maps carry structure, so agreement is informative
        assert reference.std() > 0.05, f"{arch} {layer_name} {method}: degenerate reference map"
        assert np.abs(ours_np - reference).max() <= 1e-4, f"{arch} {layer_name} {method}"


def _numpy_eigen_cam(activation: np.ndarray, size: int) -> np.ndarray:
    """Independent reference: per-image NumPy SVD, sign rule, ReLU, cv2 resize, min-max."""
    out = []
    for act in activation.astype(np.float64):
        rows = act.reshape(act.shape[0], -1).T
        rows = rows - rows.mean(axis=0)
        _, _, vt = np.linalg.svd(rows, full_matrices=False)
        projection = rows @ vt[0]
        if abs(projection.min()) > abs(projection.max()):
            projection = -projection
        cam = np.maximum(projection.reshape(act.shape[1:]), 0).astype(np.float32)
        cam = cv2.resize(cam, (size, size), interpolation=cv2.INTER_LINEAR)
        out.append((cam - cam.min()) / (cam.max() - cam.min()))
    return np.stack(out)


@pytest.mark.parametrize("arch", networks.ARCHITECTURES)
def test_eigencam_matches_numpy_svd_with_sign_rule(arch):
    model = _model(arch)
    layer = model.get_submodule(networks.TARGET_LAYERS[arch])
    images = seeded_images(2, IMAGE_SIZE, seed=5)
    captured = []
    handle = layer.register_forward_hook(lambda module, inputs, output: captured.append(output.detach().clone()))
    with torch.no_grad():
        model(images)
    handle.remove()
    reference = _numpy_eigen_cam(captured[0].numpy(), IMAGE_SIZE)
    ours = cams.compute_cams(model, layer, images, methods=("eigencam",))["eigencam"].numpy()
    assert np.abs(ours - reference).max() <= 1e-4


def test_eigen_projection_sign_rule_on_hand_case():
    # One channel varying over space: the centred projection is +-(x - mean); the sign rule
    # makes the largest-magnitude value (here the single high pixel) positive.
    activation = torch.tensor([0.0, 0.0, 0.0, 4.0]).reshape(1, 1, 2, 2)
    projection = cams.eigen_projection(activation)
    assert torch.allclose(projection, torch.tensor([[[-1.0, -1.0], [-1.0, 3.0]]]), atol=1e-5)
    projection = cams.eigen_projection(-activation)  # a low outlier: it must end up positive
    assert torch.allclose(projection, torch.tensor([[[-1.0, -1.0], [-1.0, 3.0]]]), atol=1e-5)


def test_identical_by_construction_holds_numerically():
    images = seeded_images(2, IMAGE_SIZE, seed=11)
    resnet = _model("resnet34")
    maps = cams.compute_cams(resnet, "layer4.2", images)
    assert networks.identical_methods(resnet, "layer4.2") == [("gradcam", "hirescam", "xgradcam")]
    assert torch.allclose(maps["gradcam"], maps["hirescam"], atol=1e-5)
    assert torch.allclose(maps["gradcam"], maps["xgradcam"], atol=1e-4)
    convnext = _model("convnext_tiny")
    maps = cams.compute_cams(convnext, "features.7", images)
    assert networks.identical_methods(convnext, "features.7") == [("gradcam", "hirescam", "xgradcam")]
    assert torch.allclose(maps["gradcam"], maps["hirescam"], atol=1e-5)
    # XGrad-CAM joins even though ConvNeXt's residual stream has negative channel sums; its
    # 1e-7 epsilon leaves a difference of about 1e-7 / min |S_c| (here min |S_c| ~ 1e-4).
    assert torch.allclose(maps["gradcam"], maps["xgradcam"], atol=5e-4)
    efficientnet = _model("efficientnet_b0")
    maps = cams.compute_cams(efficientnet, "features.8", images)  # after BN + SiLU: signed
    assert networks.identical_methods(efficientnet, "features.8") == [("gradcam", "hirescam", "xgradcam")]
    assert torch.allclose(maps["gradcam"], maps["xgradcam"], atol=1e-5)
    # Where the rule says "not identical", the maps do differ (the check can fail).
    maps = cams.compute_cams(efficientnet, "features.8.0", images)
    assert networks.identical_methods(efficientnet, "features.8.0") == []
    assert (maps["gradcam"] - maps["hirescam"]).abs().max() > 0.05


def test_logits_come_from_the_same_forward_and_calls_are_deterministic():
    model = _model("resnet34")
    images = seeded_images(2, IMAGE_SIZE, seed=2)
    maps, logits = cams.compute_cams(model, "layer4.2", images, return_logits=True)
    again = cams.compute_cams(model, "layer4.2", images)
    with torch.no_grad():
        expected = model(images)
    assert torch.allclose(logits, expected, atol=1e-5)
    assert not logits.requires_grad
    for method in cams.CAM_METHODS:
        assert maps[method].dtype == torch.float32
        assert float(maps[method].min()) == 0.0 and float(maps[method].max()) == 1.0
        assert torch.equal(maps[method], again[method])


def test_trunk_records_no_graph_and_parameters_keep_their_grad():
    model = _model("resnet34")
    model.zero_grad(set_to_none=True)  # the parity tests ran the library, which fills .grad
    model.train()
    sentinel = torch.full_like(model.fc.weight, 3.0)
    model.fc.weight.grad = sentinel.clone()
    seen = {}
    trunk_hook = model.layer3.register_forward_hook(
        lambda m, i, o: seen.__setitem__("trunk", o.requires_grad))
    head_hook = model.fc.register_forward_hook(lambda m, i, o: seen.__setitem__("head", o.requires_grad))
    try:
        cams.compute_cams(model, "layer4.2", seeded_images(2, IMAGE_SIZE))
    finally:
        trunk_hook.remove()
        head_hook.remove()
    assert seen == {"trunk": False, "head": True}
    assert not model.training
    assert torch.equal(model.fc.weight.grad, sentinel)
    assert all(p.grad is None for name, p in model.named_parameters() if name != "fc.weight")
    model.fc.weight.grad = None


class _FailsAfterLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, images):
        self.conv(images)
        raise RuntimeError("boom after the target layer")


def test_hooks_removed_and_grad_mode_restored_after_errors():
    failing = _FailsAfterLayer()
    with pytest.raises(RuntimeError, match="boom"):
        cams.compute_cams(failing, "conv", torch.randn(1, 3, 8, 8))
    assert len(failing.conv._forward_hooks) == 0
    assert torch.is_grad_enabled()
    model = _model("resnet34")
    with pytest.raises(ValueError, match="target_class"):
        cams.compute_cams(model, "layer4.2", seeded_images(1, IMAGE_SIZE), target_class=5)
    assert all(len(m._forward_hooks) == 0 for m in model.modules())
    assert torch.is_grad_enabled()


def test_no_reference_cycles_left_behind():
    model = _model("efficientnet_b0")
    images = seeded_images(2, IMAGE_SIZE)
    cams.compute_cams(model, "features.8.0", images)  # warm-up (lazy imports, caches)
    gc.collect()
    gc.disable()
    try:
        cams.compute_cams(model, "features.8.0", images, return_logits=True)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_constant_and_zero_maps_become_zeros():
    maps = torch.stack([torch.full((4, 4), 2.5), torch.arange(16.0).reshape(4, 4)])
    scaled = cams.minmax_per_map(maps)
    assert torch.equal(scaled[0], torch.zeros(4, 4))
    assert torch.allclose(scaled[1], torch.arange(16.0).reshape(4, 4) / 15)
    # A target layer whose activation is zero everywhere gives all-zero CAMs, not NaN.
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.fill_(-1.0)
    out = cams.compute_cams(model, "1", torch.randn(2, 3, 8, 8))
    for method, cam in out.items():
        assert torch.equal(cam, torch.zeros(2, 8, 8)), method


def test_bad_input_gives_clear_errors():
    model = _model("resnet34")
    images = seeded_images(1, IMAGE_SIZE)
    with pytest.raises(ValueError, match="not a module"):
        cams.compute_cams(model, "layer9", images)
    with pytest.raises(ValueError, match="not a module"):
        cams.compute_cams(model, torch.nn.Conv2d(1, 1, 1), images)
    with pytest.raises(ValueError, match="unknown CAM methods"):
        cams.compute_cams(model, "layer4.2", images, methods=("scorecam",))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        cams.compute_cams(model, "layer4.2", images[0])
    assert all(len(m._forward_hooks) == 0 for m in model.modules())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model = _model("resnet34")
    images = seeded_images(2, IMAGE_SIZE)
    cpu = cams.compute_cams(model, "layer4.2", images)
    gpu = cams.compute_cams(model.cuda(), "layer4.2", images.cuda())
    model.cpu()
    for method in cams.CAM_METHODS:
        assert gpu[method].device.type == "cuda"
        assert (gpu[method].cpu() - cpu[method]).abs().max() <= 1e-3


def _planted_patch_model() -> torch.nn.Module:
    """Hand-set weights with torchvision's stride-32 geometry: a grey-level 1x1 convolution, then
    five 3x3 convolutions of stride 2 and padding 1 that average their input (the chain every
    stride-32 torchvision trunk follows), global average pooling and a head whose positive logit
    is the pooled value. Its only evidence is wherever the image is bright."""
    convolutions = [torch.nn.Conv2d(3, 1, 1, bias=False)]
    convolutions += [torch.nn.Conv2d(1, 1, 3, stride=2, padding=1, bias=False) for _ in range(5)]
    head = torch.nn.Linear(1, 2)
    with torch.no_grad():
        convolutions[0].weight.fill_(1 / 3)
        for convolution in convolutions[1:]:
            convolution.weight.fill_(1 / 9)
        head.weight.copy_(torch.tensor([[0.0], [1.0]]))
        head.bias.zero_()
    return torch.nn.Sequential(torch.nn.Sequential(*convolutions), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), head)


def _patch_misses(size: int, patch: int, step: int) -> int:
    """Positions (every ``step`` px in both axes) where the planted model's Grad-CAM peak lies
    outside the bright ``patch`` x ``patch`` square."""
    model = _planted_patch_model()
    positions = [(top, left) for top in range(0, size - patch + 1, step)
                 for left in range(0, size - patch + 1, step)]
    images = torch.zeros(len(positions), 3, size, size)
    for index, (top, left) in enumerate(positions):
        images[index, :, top:top + patch, left:left + patch] = 1.0
    maps = cams.compute_cams(model, model[0][-1], images, methods=("gradcam",))["gradcam"]
    misses = 0
    for index, (top, left) in enumerate(positions):
        row, col = divmod(int(maps[index].flatten().argmax()), size)
        misses += not (top <= row < top + patch and left <= col < left + patch)
    return misses


def test_a_planted_patch_is_where_the_upsampled_peak_lands():
    """docs/protocol.md, "CAM grid and resolution": at the default 136 px a 48 px patch anywhere
    in the frame gets its upsampled peak; at 160 px (a multiple of 32) the half-pixel-centred
    resize draws the grid half a cell off and peaks miss, so the check can fail."""
    assert _patch_misses(136, 48, step=4) == 0
    assert _patch_misses(160, 48, step=8) > 0


def test_a_one_cell_grid_gives_flat_maps_not_rounding_peaks():
    """Thin data (issue 35): EfficientNet-B0 at 32 px has a 1x1 feature grid. Its CAMs are one
    value each; bilinear resizing leaves float32 rounding, which a min-max with an exact zero-range
    test stretched to a [0, 1] map whose "peak" sat wherever rounding fell (Grad-CAM++ in the
    thin-data smoke run: 20 of 20 maps "non-constant" on a 1x1 grid)."""
    value = torch.tensor(0.7310586)
    resized = torch.nn.functional.interpolate(value.reshape(1, 1, 1, 1).expand(1, 1, 1, 1) * torch.ones(1, 1, 1, 1),
                                              size=(32, 32), mode="bilinear", align_corners=False)[0]
    noisy = resized + torch.randn(1, 32, 32) * 1e-7 * value     # rounding-sized differences
    assert torch.equal(cams.minmax_per_map(noisy), torch.zeros(1, 32, 32))
    real = resized + torch.linspace(0, 1e-3, 32 * 32).reshape(1, 32, 32)   # a real (if small) structure
    assert cams.minmax_per_map(real).amax() == 1.0
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Conv2d(4, 4, 1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4, 2))
    torch.manual_seed(0)
    images = torch.randn(3, 3, 32, 32)
    out = cams.compute_cams(model, "3", images)   # the 1x1 activation after the pooling
    for method, cam in out.items():
        assert torch.equal(cam, torch.zeros_like(cam)), method
