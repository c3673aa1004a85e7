"""Architectures, their CAM target layers, and which CAM methods coincide by construction.

``build_model``: a torchvision classifier (``AUDITABLE_ARCHITECTURES``) with a 2-class head
(index 0 = negative, 1 = positive), built with ``weights=None`` (never downloads; ImageNet
weights only from a local file) and portable dropout / stochastic-depth masks.
``TARGET_LAYERS``: one CAM target layer per architecture, a ``model.get_submodule`` path.
``identical_methods``: CAMs that coincide there by construction.

Design: docs/data_models_runs.md, "Architectures and target layers".
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torchvision
from torch import nn

from endoexplain_core import files
from endoexplain_core.config import ARCHITECTURES  # the profile schema validates against it

# CAM target layer per architecture (docs/protocol.md, "Target layers").
TARGET_LAYERS = {
    "efficientnet_b0": "features.8.0",
    "resnet34": "layer4.2",
    "convnext_tiny": "features.7",
    "resnet18": "layer4.1",
    "mobilenet_v3_large": "features.16.0",
}
# Further torchvision classifiers that ``endoexplain audit`` accepts for a user's own model
# (the pipeline never trains them); target layer by the same rule (the last residual block).
AUDIT_ONLY_TARGET_LAYERS = {
    "resnet50": "layer4.2",
}
AUDITABLE_ARCHITECTURES = ARCHITECTURES + tuple(AUDIT_ONLY_TARGET_LAYERS)


class PortableDropout(nn.Dropout):
    """``nn.Dropout`` whose mask is ``torch.rand(x.shape) >= p`` (torch's own generator on
    every CPU); kept units are scaled by 1 / (1 - p) as in ``nn.Dropout``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, device=x.device) >= self.p
        return x * keep.to(x.dtype) / (1.0 - self.p)


class PortableStochasticDepth(torchvision.ops.StochasticDepth):
    """torchvision's ``StochasticDepth`` ("row": one draw per sample; "batch": one draw) with
    the survival mask drawn as ``torch.rand(size) < 1 - p``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        survival = 1.0 - self.p
        size = [x.shape[0]] + [1] * (x.ndim - 1) if self.mode == "row" else [1] * x.ndim
        keep = (torch.rand(size, device=x.device) < survival).to(x.dtype)
        return x * keep / survival


def portable_random_masks(model: nn.Module) -> nn.Module:
    """In place: swap every ``nn.Dropout`` and torchvision ``StochasticDepth`` of ``model`` for
    its portable twin (same p, same mode, no parameters: state dicts are unchanged)."""
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                setattr(parent, name, PortableDropout(child.p, child.inplace))
            elif type(child) is torchvision.ops.StochasticDepth:
                setattr(parent, name, PortableStochasticDepth(child.p, child.mode))
    return model


def _check_arch(arch: str) -> None:
    if arch not in AUDITABLE_ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(AUDITABLE_ARCHITECTURES)}")


def default_target_layer(arch: str) -> str:
    """The CAM target layer of ``arch`` (study or audit-only architecture)."""
    _check_arch(arch)
    return {**TARGET_LAYERS, **AUDIT_ONLY_TARGET_LAYERS}[arch]


def replace_head(model: nn.Module, arch: str, num_classes: int) -> None:
    """Swap the final linear layer for a freshly initialised one with ``num_classes`` outputs."""
    if isinstance(model, torchvision.models.ResNet):
        model.fc = nn.Linear(model.fc.in_features, num_classes)
    else:  # EfficientNet, MobileNetV3, ConvNeXt: the classifier's last module is the linear head
        model.classifier[-1] = nn.Linear(model.classifier[-1].in_features, num_classes)


def build_model(arch: str, num_classes: int = 2, weights_path: str | Path | None = None) -> nn.Module:
    """A torchvision classifier ``arch`` with ``num_classes`` outputs, in train mode on the CPU,
    with ``portable_random_masks``; never downloads.

    ``weights_path``: optional local ImageNet (1000-class) state dict; its trunk is loaded and
    the head replaced by a new one. New weights come from torch's global RNG (seed it first).
    Raises ValueError for an unknown architecture or a state dict that does not fit (naming
    the file), FileNotFoundError for a missing file.
    """
    _check_arch(arch)
    if weights_path is None:
        return portable_random_masks(
            torchvision.models.get_model(arch, weights=None, num_classes=num_classes))
    weights_path = Path(weights_path)
    if not weights_path.is_file():
        raise FileNotFoundError(f"ImageNet weights file not found: {weights_path}")
    model = torchvision.models.get_model(arch, weights=None, num_classes=1000)
    try:
        state = torch.load(weights_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as error:  # unreadable or mismatched file: say which and why
        raise ValueError(f"{weights_path}: not an ImageNet state dict for {arch}: {error}") from error
    replace_head(model, arch, num_classes)
    return portable_random_masks(model)


def find_local_imagenet_weights(arch: str) -> Path | None:
    """``imagenet_weights_cache_path(arch)`` when that file exists, else None; never downloads."""
    candidate = imagenet_weights_cache_path(arch)
    return candidate if candidate.is_file() else None


# "<name>-<first hex digits of the file's SHA-256>.pth", torchvision's file names.
TORCHVISION_HASH_IN_NAME = re.compile(r"-([a-f0-9]{8,})\.")


class WeightsHashMismatch(ValueError):
    """A weights file whose SHA-256 contradicts the hash its torchvision file name carries."""


def imagenet_weights_url(arch: str) -> str:
    """torchvision's download URL of ``arch``'s default ImageNet weights (nothing is fetched)."""
    _check_arch(arch)
    return torchvision.models.get_model_weights(arch).DEFAULT.url


def verify_weights_file(path: Path) -> tuple[str, str | None]:
    """(SHA-256 of ``path``, the hash prefix its file name carries or None). Raises
    ``WeightsHashMismatch`` naming the file when the name carries a torchvision hash that the
    digest does not start with: a truncated download or another file under torchvision's name."""
    digest = files.sha256_file(path)
    named = TORCHVISION_HASH_IN_NAME.search(Path(path).name)
    expected = named.group(1) if named else None
    if expected is not None and not digest.startswith(expected):
        raise WeightsHashMismatch(
            f"{path}: SHA-256 {digest[:16]}... does not start with {expected}, the hash in its "
            "torchvision file name: a partial download or another file; fetch it again from "
            "torchvision's URL (README, 'ImageNet weights')")
    return digest, expected


def imagenet_weights_cache_path(arch: str) -> Path:
    """Where torchvision keeps ``arch``'s ImageNet weights: ``<torch hub dir>/checkpoints/<name>``
    (the file name of the weights' URL, e.g. ``resnet34-b627a593.pth``), present or not."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(imagenet_weights_url(arch)).name


def resolve_target_layer(model: nn.Module, arch: str, layer_name: str | None = None) -> tuple[str, nn.Module]:
    """Return ``(name, module)`` of the CAM target layer.

    ``layer_name`` defaults to ``TARGET_LAYERS[arch]``; any module path of the model is
    accepted (e.g. ``"layer3.5"``). Raises ValueError naming the layer and architecture when
    the path does not exist in the model.
    """
    _check_arch(arch)
    name = default_target_layer(arch) if layer_name is None else layer_name
    try:
        module = model.get_submodule(name)
    except AttributeError as error:
        raise ValueError(f"target layer {name!r} is not a module of this {arch} model") from error
    return name, module


# Layers whose output goes straight into global average pooling, per torchvision class: their
# gradient is constant over space (docs/data_models_runs.md, "Architectures and target layers").
def _gap_fed_layers(model: nn.Module) -> set[str]:
    if isinstance(model, torchvision.models.ResNet):
        return {"layer4", f"layer4.{len(model.layer4) - 1}"}
    if isinstance(model, (torchvision.models.ConvNeXt, torchvision.models.EfficientNet,
                          torchvision.models.MobileNetV3)):
        return {"features", f"features.{len(model.features) - 1}"}
    return set()


def identical_methods(model: nn.Module, layer_name: str) -> list[tuple[str, ...]]:
    """Groups of CAM methods identical by construction at ``layer_name``, from the architecture,
    not from data: ``[("gradcam", "hirescam", "xgradcam")]`` for a layer that feeds global
    average pooling directly (e.g. resnet34 ``layer4.2``, convnext_tiny ``features.7``,
    efficientnet_b0 ``features.8``), else ``[]`` (e.g. efficientnet_b0 ``features.8.0``).
    Identity on one checkpoint's data: ``analysis.map_diagnostics.practical_identity``.
    Raises ValueError when ``layer_name`` is not a module of the model.
    """
    try:
        model.get_submodule(layer_name)
    except AttributeError as error:
        raise ValueError(f"target layer {layer_name!r} is not a module of this model") from error
    gap_fed = _gap_fed_layers(model)
    if layer_name not in gap_fed:
        return []
    return [("gradcam", "hirescam", "xgradcam")]


def cam_grid_shape(model: nn.Module, layer_name: str, image_size: int) -> tuple[int, int]:
    """(h, w) of ``layer_name``'s output for a square ``image_size`` input: the CAM grid.

    One forward pass of a zero image in eval mode, without autograd (train/eval mode restored);
    the hook is removed also on errors.
    """
    layer = model.get_submodule(layer_name)
    shapes: list[tuple[int, int]] = []
    handle = layer.register_forward_hook(lambda module, inputs, output: shapes.append(tuple(output.shape[-2:])))
    was_training = model.training
    try:
        model.eval()
        parameter = next(model.parameters())
        with torch.no_grad():
            model(torch.zeros(1, 3, image_size, image_size, dtype=parameter.dtype, device=parameter.device))
    finally:
        handle.remove()
        model.train(was_training)
    return shapes[0]


def identical_methods_by_arch(architectures) -> dict[str, list[tuple[str, ...]]]:
    """arch -> groups of CAMs identical by construction at its default target layer.

    Decided from the architecture (``identical_methods`` on an untrained model of each
    architecture), not from data, so it holds for every checkpoint of that architecture.
    """
    return {arch: identical_methods(build_model(arch), TARGET_LAYERS[arch]) for arch in architectures}
