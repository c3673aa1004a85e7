"""Cascading model-parameter randomisation (Adebayo et al., "Sanity checks for saliency maps").

``randomisation_blocks`` names a model's blocks, head first (torchvision ResNet: ``fc``,
``layer4`` .. ``layer1``, ``stem``; EfficientNet, ConvNeXt, MobileNetV3: ``classifier``, then
``features.<k>`` down to 0); ``randomise_block`` re-initialises one in place under a seed;
``cascade`` yields a copy randomised cumulatively after each block. Similarity of a map to the
trained model's, per image: ``spearman_per_image`` (NaN for a constant map) and
``top_area_iou``. Method: docs/maps_and_scores.md, "Cascading randomisation".
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torchvision
from scipy import stats as scipy_stats
from torch import nn

from endoexplain_core.kernels.deletion import sample_key
from endoexplain_core.kernels.threshold import top_fraction_mask


def randomisation_blocks(model: nn.Module) -> list[tuple[str, list[str]]]:
    """[(block name, [module paths])] from the head downwards; ValueError for other architectures."""
    if isinstance(model, torchvision.models.ResNet):
        return [("fc", ["fc"]), ("layer4", ["layer4"]), ("layer3", ["layer3"]),
                ("layer2", ["layer2"]), ("layer1", ["layer1"]), ("stem", ["conv1", "bn1"])]
    if isinstance(model, (torchvision.models.EfficientNet, torchvision.models.ConvNeXt,
                          torchvision.models.MobileNetV3)):
        stages = [(f"features.{k}", [f"features.{k}"]) for k in reversed(range(len(model.features)))]
        return [("classifier", ["classifier"]), *stages]
    raise ValueError(f"no randomisation blocks defined for {type(model).__name__}; "
                     "known: torchvision ResNet, EfficientNet, ConvNeXt, MobileNetV3")


def randomise_block(model: nn.Module, module_paths, *, seed: int) -> None:
    """Re-initialise the modules at ``module_paths`` of ``model`` in place: ``reset_parameters`` (and
    running statistics) where a module has one, else a normal draw with the trained tensor's mean
    and standard deviation, under ``seed``. The global RNG state is restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for path in module_paths:
            block = model.get_submodule(path)
            reset_owned = set()
            for module in block.modules():
                if hasattr(module, "reset_parameters") and callable(module.reset_parameters):
                    module.reset_parameters()
                    reset_owned.update(id(p) for p in module.parameters(recurse=False))
                    if hasattr(module, "reset_running_stats"):
                        module.reset_running_stats()
            with torch.no_grad():
                for parameter in block.parameters():
                    if id(parameter) in reset_owned:
                        continue
                    mean = parameter.mean()
                    spread = parameter.std() if parameter.numel() > 1 else parameter.abs().mean()
                    parameter.copy_(mean + spread * torch.randn_like(parameter))


def cascade(model: nn.Module, *, seed: int):
    """Yield (block name, model copy) after randomising each block cumulatively, head first.

    The trained ``model`` is not modified; one copy is randomised step by step and yielded
    (in eval mode) after each block, so the caller must finish with it before the next step.
    Block seeds are ``deletion.sample_key(f"randomise/{seed}/{block}")``.
    """
    randomised = copy.deepcopy(model).eval()
    for name, paths in randomisation_blocks(randomised):
        randomise_block(randomised, paths, seed=sample_key(f"randomise/{int(seed)}/{name}"))
        yield name, randomised


def fully_randomised(model: nn.Module, *, seed: int) -> nn.Module:
    """A copy of ``model`` (eval mode) with every block re-initialised: the last step of
    ``cascade``, the same weights under the same ``seed``. The trained model is not modified."""
    randomised = None
    for _, randomised in cascade(model, seed=seed):
        pass
    return randomised


def spearman_per_image(first: torch.Tensor, second: torch.Tensor) -> np.ndarray:
    """float64 (B,): Spearman correlation of each pair of (B, H, W) maps over all pixels
    (average ranks for ties, SciPy's ``rankdata``); NaN where either map is constant."""
    if first.shape != second.shape or first.dim() != 3:
        raise ValueError(f"maps must share a (B, H, W) shape; got {tuple(first.shape)} and "
                         f"{tuple(second.shape)}")
    a = scipy_stats.rankdata(first.detach().double().flatten(1).cpu().numpy(), axis=1)
    b = scipy_stats.rankdata(second.detach().double().flatten(1).cpu().numpy(), axis=1)
    a -= a.mean(axis=1, keepdims=True)
    b -= b.mean(axis=1, keepdims=True)
    denominator = np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (a * b).sum(axis=1) / denominator, np.nan)


def top_area_iou(first: torch.Tensor, second: torch.Tensor, top_fraction: float) -> np.ndarray:
    """float64 (B,): IoU of the two maps' top-``top_fraction`` pixel sets."""
    top_a = top_fraction_mask(first.float(), top_fraction)
    top_b = top_fraction_mask(second.float(), top_fraction)
    intersection = (top_a & top_b).flatten(1).sum(dim=1).double()
    union = (top_a | top_b).flatten(1).sum(dim=1).double()
    return (intersection / union).cpu().numpy()
