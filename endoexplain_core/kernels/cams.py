"""Fused class activation maps: several CAM methods from one forward and one backward pass.

Methods: ``methods.FUSED_CAM_METHODS`` (the five ``CAM_METHODS`` and the extended LayerCAM),
following pytorch-grad-cam 1.5.x. Every map is ReLU'd, resized bilinearly to the input size
(half-pixel centres, as cv2.resize) and min-max normalised per image to float32 [0, 1]; a flat
map becomes all zeros (``FLAT_RELATIVE_RANGE``). Eigen-CAM ignores the target class. Model
parameter gradients (``.grad``) are never touched.
Method: docs/maps_and_scores.md, "CAM computation".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from endoexplain_core.methods import CAM_METHODS, FUSED_CAM_METHODS, FUSED_GRADIENT_METHODS

_GRADCAMPP_EPS = 1e-6  # pytorch-grad-cam GradCAMPlusPlus
_XGRADCAM_EPS = 1e-7  # pytorch-grad-cam XGradCAM


def _resolve_layer(model: nn.Module, target_layer: nn.Module | str) -> nn.Module:
    if isinstance(target_layer, str):
        try:
            return model.get_submodule(target_layer)
        except AttributeError as error:
            raise ValueError(f"target layer {target_layer!r} is not a module of the model") from error
    if not any(module is target_layer for module in model.modules()):
        raise ValueError(f"target layer {type(target_layer).__name__} is not a module of the model")
    return target_layer


class _ActivationCapture:
    """Forward hook: makes the detached target activation the autograd leaf and switches gradient
    recording on for the rest of the forward pass (the caller's ``torch.no_grad`` block restores
    the previous mode on exit, also on errors)."""

    def __init__(self, record_graph: bool) -> None:
        self.record_graph = record_graph
        self.activation: torch.Tensor | None = None
        self.calls = 0

    def __call__(self, module: nn.Module, inputs, output):
        if not isinstance(output, torch.Tensor) or output.dim() != 4:
            raise ValueError(f"target layer {type(module).__name__} must output a (B, C, h, w) tensor")
        self.calls += 1
        leaf = output.detach().requires_grad_(self.record_graph)
        self.activation = leaf
        if self.record_graph:
            torch.set_grad_enabled(True)
        # A clone so that in-place operations after the layer do not modify the leaf.
        return leaf.clone()


def _forward_with_activation_gradient(model: nn.Module, layer: nn.Module, images: torch.Tensor,
                                      target_class: int, need_gradient: bool):
    """Return (activation (B,C,h,w), gradient or None, logits (B,K)), all detached."""
    capture = _ActivationCapture(record_graph=need_gradient)
    handle = layer.register_forward_hook(capture)
    try:
        with torch.no_grad():  # trunk: no graph; the hook enables recording from the layer on
            logits = model(images)
    finally:
        handle.remove()
    if capture.calls != 1:
        raise ValueError(f"target layer ran {capture.calls} times in one forward pass; expected once")
    activation = capture.activation
    if logits.dim() != 2 or not 0 <= target_class < logits.shape[1]:
        raise ValueError(f"target_class {target_class} is not a column of logits of shape {tuple(logits.shape)}")
    gradient = None
    if need_gradient:
        (gradient,) = torch.autograd.grad(logits[:, target_class].sum(), activation)
    return activation.detach(), gradient, logits.detach()


def _channel_weight_cam(weights: torch.Tensor, activation: torch.Tensor) -> torch.Tensor:
    """sum_c weights[b, c] * activation[b, c] -> (B, h, w)."""
    return torch.einsum("bc,bchw->bhw", weights, activation)


CHANNEL_WEIGHT_METHODS = ("gradcam", "gradcampp", "xgradcam")


def channel_weights(activation: torch.Tensor, gradient: torch.Tensor, methods=CHANNEL_WEIGHT_METHODS
                    ) -> dict[str, torch.Tensor]:
    """Per-channel weights w[b, c], (B, C) each, of the CAMs that weight whole channels
    (``CHANNEL_WEIGHT_METHODS``; formulas: docs/maps_and_scores.md, "CAM computation")."""
    weights: dict[str, torch.Tensor] = {}
    channel_sum = activation.sum(dim=(2, 3), keepdim=True)  # S_c, (B, C, 1, 1)
    if "gradcam" in methods:
        weights["gradcam"] = gradient.mean(dim=(2, 3))
    if "gradcampp" in methods:
        gradient_2 = gradient.pow(2)
        alpha = gradient_2 / (2 * gradient_2 + channel_sum * gradient_2 * gradient + _GRADCAMPP_EPS)
        alpha = torch.where(gradient != 0, alpha, torch.zeros_like(alpha))
        weights["gradcampp"] = (gradient.clamp(min=0) * alpha).sum(dim=(2, 3))
    if "xgradcam" in methods:
        weights["xgradcam"] = (gradient * activation / (channel_sum + _XGRADCAM_EPS)).sum(dim=(2, 3))
    return weights


def _gradient_cams(activation: torch.Tensor, gradient: torch.Tensor, methods) -> dict[str, torch.Tensor]:
    cams = {method: _channel_weight_cam(weights, activation)
            for method, weights in channel_weights(activation, gradient, methods).items()}
    if "hirescam" in methods:
        cams["hirescam"] = (gradient * activation).sum(dim=1)
    if "layercam" in methods:
        cams["layercam"] = (gradient.clamp(min=0) * activation).sum(dim=1)
    return cams


def eigen_projection(activation: torch.Tensor) -> torch.Tensor:
    """First principal component projection of each image's activation, sign-fixed.

    activation : (B, C, h, w) float. Returns (B, h, w) float32 before ReLU, on the input's device:
    each image's spatially centred (h*w, C) matrix projected on its first right singular vector
    (from the smaller Gram matrix, in float64), negated when its most negative value outweighs its
    largest.
    """
    batch, channels, height, width = activation.shape
    rows = activation.float().reshape(batch, channels, height * width).transpose(1, 2)
    centred = (rows - rows.mean(dim=1, keepdim=True)).double()
    if height * width <= channels:
        values, vectors = torch.linalg.eigh(centred @ centred.transpose(1, 2))
        projection = vectors[..., -1] * values[..., -1].clamp(min=0).sqrt()[:, None]
    else:
        _, vectors = torch.linalg.eigh(centred.transpose(1, 2) @ centred)
        projection = (centred @ vectors[..., -1:])[..., 0]
    projection = projection.float()
    flip = projection.amin(dim=1).abs() > projection.amax(dim=1).abs()
    projection = torch.where(flip[:, None], -projection, projection)
    return projection.reshape(batch, height, width)


# A map whose range is below this share of its magnitude is flat. Bilinear resizing of a flat
# grid (a 1x1 feature map, or equal cells) leaves float32 rounding of about 1e-7 of the value;
# min-max would stretch that to [0, 1] and put a "peak" wherever rounding fell.
FLAT_RELATIVE_RANGE = 1e-5


def minmax_per_map(maps: torch.Tensor) -> torch.Tensor:
    """Rescale every map of (..., H, W) to [0, 1]; flat maps (range <= ``FLAT_RELATIVE_RANGE``
    of the largest magnitude, zero range included) become all zeros."""
    # One min/max pass and in-place arithmetic on one new buffer: at 256 px the five maps of
    # a batch of 16 are 21 MB, and each extra full-size temporary costs a pass over memory.
    flat = maps.flatten(-2)
    low, high = torch.aminmax(flat, dim=-1, keepdim=True)
    span = high - low
    constant = span <= FLAT_RELATIVE_RANGE * torch.maximum(high.abs(), low.abs())
    scaled = (flat - low).div_(torch.where(constant, torch.ones_like(span), span))
    if bool(constant.any()):
        scaled.masked_fill_(constant, 0.0)
    return scaled.reshape(maps.shape)


def compute_cams(model: nn.Module, target_layer: nn.Module | str, images: torch.Tensor,
                 target_class: int = 1, methods=CAM_METHODS, return_logits: bool = False):
    """Compute several CAMs of ``images`` from one forward and (at most) one backward pass.

    model : classifier returning logits (B, K); put in eval mode and left so.
    target_layer : the module (or its ``get_submodule`` path) whose output is used; it must run
        exactly once per forward pass and output (B, C, h, w).
    images : float (B, 3, H, W), normalised model input, on the model's device.
    target_class : logit column the gradient methods explain (1 = positive class).
    methods : subset of ``FUSED_CAM_METHODS``, in any order; default the five ``CAM_METHODS``.
    Returns dict method -> float32 (B, H, W) in [0, 1] on the images' device (zero-range maps all
    zeros); with ``return_logits``, ``(maps, logits)`` with the same pass's logits (B, K), detached.
    Raises ValueError for unknown methods, bad shapes or a layer that is not the model's.
    """
    methods = tuple(methods)
    unknown = [m for m in methods if m not in FUSED_CAM_METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown CAM methods {unknown}; choose from {FUSED_CAM_METHODS}")
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be a float tensor (B, C, H, W); got {shape}")
    layer = _resolve_layer(model, target_layer)
    model.eval()
    need_gradient = any(m in FUSED_GRADIENT_METHODS for m in methods)
    activation, gradient, logits = _forward_with_activation_gradient(
        model, layer, images, target_class, need_gradient)
    activation = activation.float()
    with torch.no_grad():
        raw = _gradient_cams(activation, gradient.float(), methods) if need_gradient else {}
        if "eigencam" in methods:
            raw["eigencam"] = eigen_projection(activation)
        stacked = torch.stack([raw[m] for m in methods])  # (M, B, h, w)
        stacked = stacked.clamp(min=0)  # ReLU
        resized = F.interpolate(stacked.flatten(0, 1)[:, None], size=images.shape[-2:],
                                mode="bilinear", align_corners=False)[:, 0]
        normalised = minmax_per_map(resized).reshape(len(methods), images.shape[0], *images.shape[-2:])
    maps = {method: normalised[i] for i, method in enumerate(methods)}
    return (maps, logits) if return_logits else maps


def activation_and_gradient(model: nn.Module, target_layer: nn.Module | str, images: torch.Tensor,
                            target_class: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Target-layer activation A and gradient d logit[target_class] / dA, both float32 (B, C, h, w),
    from the very pass ``compute_cams`` uses (for diagnostics such as Grad-CAM++'s epsilon share)."""
    layer = _resolve_layer(model, target_layer)
    model.eval()
    activation, gradient, _ = _forward_with_activation_gradient(model, layer, images, target_class,
                                                                need_gradient=True)
    return activation.float(), gradient.float()
