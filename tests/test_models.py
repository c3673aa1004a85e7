"""Architecture table, model builder, target layers and the identical-by-construction rule."""

from __future__ import annotations

import hashlib

import pytest
import torch

from endoexplain_core.models import networks, training


@pytest.mark.parametrize("arch", networks.ARCHITECTURES)
def test_build_model_and_default_target_layer(arch):
    torch.manual_seed(0)
    model = networks.build_model(arch, num_classes=2)
    with torch.no_grad():
        logits = model.eval()(torch.randn(1, 3, 64, 64))
    assert logits.shape == (1, 2)
    name, layer = networks.resolve_target_layer(model, arch)
    assert name == networks.TARGET_LAYERS[arch]
    # the table's paths are the DESIGN's features[-1][0], layer4[-1], features[-1]
    expected = {"efficientnet_b0": lambda m: m.features[-1][0], "resnet34": lambda m: m.layer4[-1],
                "convnext_tiny": lambda m: m.features[-1], "resnet18": lambda m: m.layer4[-1],
                "mobilenet_v3_large": lambda m: m.features[-1][0]}[arch](model)
    assert layer is expected


def test_unknown_architecture_and_layer_errors():
    with pytest.raises(ValueError, match="known: efficientnet_b0, resnet34, convnext_tiny, resnet18, mobilenet_v3_large"):
        networks.build_model("vgg16")
    model = networks.build_model("resnet34")
    with pytest.raises(ValueError, match="'layer5' is not a module of this resnet34"):
        networks.resolve_target_layer(model, "resnet34", "layer5")
    with pytest.raises(ValueError, match="not a module"):
        networks.identical_methods(model, "layer5")


def test_imagenet_weights_loaded_from_a_local_file(tmp_path):
    torch.manual_seed(1)
    source = networks.torchvision.models.resnet34(weights=None)
    path = tmp_path / "resnet34_imagenet.pth"
    torch.save(source.state_dict(), path)
    model = networks.build_model("resnet34", num_classes=2, weights_path=path)
    assert torch.equal(model.conv1.weight, source.conv1.weight)
    assert model.fc.out_features == 2
    with pytest.raises(FileNotFoundError, match="missing.pth"):
        networks.build_model("resnet34", weights_path=tmp_path / "missing.pth")
    with pytest.raises(ValueError, match="resnet34_imagenet.pth"):
        networks.build_model("convnext_tiny", weights_path=path)


def test_find_local_weights_looks_only_in_the_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    assert networks.find_local_imagenet_weights("resnet34") is None
    (tmp_path / "checkpoints").mkdir()
    cached = tmp_path / "checkpoints" / "resnet34-b627a593.pth"
    cached.write_bytes(b"")
    assert networks.find_local_imagenet_weights("resnet34") == cached


def test_weights_files_are_checked_against_the_hash_in_their_torchvision_name(tmp_path):
    payload = b"not really weights"
    digest = hashlib.sha256(payload).hexdigest()
    honest = tmp_path / f"resnet34-{digest[:8]}.pth"
    honest.write_bytes(payload)
    assert networks.verify_weights_file(honest) == (digest, digest[:8])
    foreign = tmp_path / "resnet34-b627a593.pth"           # torchvision's name, other bytes
    foreign.write_bytes(payload)
    with pytest.raises(networks.WeightsHashMismatch, match=r"resnet34-b627a593.pth: SHA-256 .* does not start with b627a593"):
        networks.verify_weights_file(foreign)
    with pytest.raises(networks.WeightsHashMismatch):      # the run's own lookup refuses it too
        training.imagenet_weights_path("resnet34", {"resnet34": str(foreign)})
    own = tmp_path / "my_resnet34.pth"                     # no hash in the name: not checkable
    own.write_bytes(payload)
    assert networks.verify_weights_file(own) == (digest, None)
    assert networks.imagenet_weights_url("resnet34") == "https://download.pytorch.org/models/resnet34-b627a593.pth"


def test_identical_methods_table():
    assert networks.identical_methods(networks.build_model("resnet34"), "layer4.2") == [("gradcam", "hirescam", "xgradcam")]
    assert networks.identical_methods(networks.build_model("convnext_tiny"), "features.7") == [("gradcam", "hirescam", "xgradcam")]
    efficientnet = networks.build_model("efficientnet_b0")
    assert networks.identical_methods(efficientnet, "features.8.0") == []
    assert networks.identical_methods(efficientnet, "features.8") == [("gradcam", "hirescam", "xgradcam")]
    assert networks.identical_methods(networks.build_model("resnet34"), "layer3.5") == []


def test_numerics_policy_is_applied_and_readable():
    """configure_torch sets every flag of the policy; torch_settings reads them back (what the
    provenance records). CPU-only machines still carry the flags."""
    import torch
    from endoexplain_core import numerics
    saved = numerics.torch_settings()
    try:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        applied = numerics.configure_torch()
        assert {k: applied[k] for k in numerics.POLICY} == numerics.POLICY
    finally:
        torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]
        torch.backends.cudnn.deterministic = saved["cudnn_deterministic"]
        torch.backends.cuda.matmul.allow_tf32 = saved["cuda_matmul_allow_tf32"]
        torch.backends.cudnn.allow_tf32 = saved["cudnn_allow_tf32"]
