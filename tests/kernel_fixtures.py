"""Helpers shared by the kernel tests: small models with non-degenerate activations.

Randomly initialised torchvision models are poor test subjects for CAMs: EfficientNet's late
stages output near-zero activations (BatchNorm running statistics of 0/1 do not match the real
scale), and ConvNeXt's blocks are almost identities (layer scale 1e-6). ``nondegenerate_model``
fixes both with a seeded, data-dependent perturbation.
"""

from __future__ import annotations

import torch
from torch import nn

from endoexplain_core.models import networks


def nondegenerate_model(arch: str, seed: int = 0, image_size: int = 64) -> nn.Module:
    """A seeded ``networks.build_model(arch)`` in eval mode with informative activations.

    * BatchNorm running statistics are set to the statistics of one batch of seeded noise
      images (one train-mode forward with momentum 1), then the affine parameters are drawn
      from U(0.5, 1.5) (weight) and N(0, 0.2) (bias);
    * ConvNeXt layer scales are drawn from U(0.2, 0.6).
    """
    torch.manual_seed(seed)
    model = networks.build_model(arch)
    generator = torch.Generator().manual_seed(seed + 1)
    batch_norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("layer_scale"):
                parameter.copy_(torch.rand(parameter.shape, generator=generator) * 0.4 + 0.2)
        if batch_norms:
            for bn in batch_norms:
                bn.momentum = 1.0
            model.train()
            model(torch.randn(8, 3, image_size, image_size, generator=generator))
            for bn in batch_norms:
                bn.momentum = 0.1
                bn.weight.copy_(torch.rand(bn.weight.shape, generator=generator) + 0.5)
                bn.bias.copy_(torch.randn(bn.bias.shape, generator=generator) * 0.2)
    return model.eval()


def seeded_images(batch: int, size: int, seed: int = 0) -> torch.Tensor:
    """float32 (B, 3, size, size) smooth-ish seeded images (noise plus a bright blob)."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(batch, 3, size, size, generator=generator)
    rows = torch.arange(size, dtype=torch.float32)[:, None]
    cols = torch.arange(size, dtype=torch.float32)[None, :]
    centres = torch.rand(batch, 2, generator=generator) * size
    blob = torch.exp(-((rows - centres[:, 0, None, None]) ** 2 + (cols - centres[:, 1, None, None]) ** 2)
                     / (2 * (size / 6) ** 2))
    return noise * 0.5 + 2.0 * blob[:, None]
