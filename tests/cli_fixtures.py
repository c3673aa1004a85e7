"""A folder of masked frames and a torchvision ResNet-18 state dict, built locally (never
downloaded), for the ``endoexplain audit`` tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torchvision
from PIL import Image

FORMATS = (".jpg", ".png", ".tif")


def write_masked_frames(folder: Path, n: int = 20, seed: int = 0) -> tuple[Path, Path]:
    """``n`` endoscopy-like frames (JPEG/PNG/TIFF in turn, sizes vary) with a bright round
    lesion, and their masks ``<stem>_mask.png`` (white = lesion). Returns (images, masks)."""
    rng = np.random.default_rng(seed)
    images, masks = folder / "frames", folder / "masks"
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        height, width = 90 + 6 * (i % 3), 100
        yy, xx = np.mgrid[:height, :width]
        cy, cx, r = rng.integers(25, height - 25), rng.integers(25, width - 25), rng.integers(8, 18)
        lesion = (yy - cy) ** 2 + (xx - cx) ** 2 < r ** 2
        frame = np.stack([150 + 40 * np.sin(xx / 17), 70 + 20 * np.cos(yy / 23), 60 + 0 * xx], -1)
        frame = frame + rng.normal(0, 8, frame.shape)
        frame[lesion] += (60, 30, 10)
        Image.fromarray(np.clip(frame, 0, 255).astype(np.uint8)).save(
            images / f"frame{i:02d}{FORMATS[i % len(FORMATS)]}")
        Image.fromarray((lesion * 255).astype(np.uint8)).save(masks / f"frame{i:02d}_mask.png")
    return images, masks


def write_resnet18_state_dict(path: Path, seed: int = 0, centre_on: Path | None = None,
                              image_size: int = 64) -> Path:
    """A 2-class torchvision ResNet-18 with seeded random weights, saved as a state dict.

    ``centre_on``: a folder of frames; the positive bias is shifted so that the median logit
    difference z on them (at ``image_size``) is 0, i.e. about half score above 0.5.
    """
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(weights=None, num_classes=2).eval()
    if centre_on is not None:
        from endoexplain_core.data.datasets import resize_rgb, to_normalised_tensor
        from endoexplain_core.data.imageio import read_rgb

        batch = torch.stack([to_normalised_tensor(resize_rgb(read_rgb(p), image_size))
                             for p in sorted(centre_on.iterdir())])
        with torch.no_grad():
            logits = model(batch)
            model.fc.bias[1] -= (logits[:, 1] - logits[:, 0]).median()
    torch.save(model.state_dict(), path)
    return path


def audit_arguments(images: Path, masks: Path, weights: Path, out: Path, *extra: str) -> list[str]:
    """A fast ``endoexplain audit`` command line (64 px, few repetitions and replicates).

    T = 0.005 spreads the random head's small logit differences (centred on 0, see
    ``write_resnet18_state_dict``) over (0, 1), so that some images reach the high-score panel
    and the case figure has cases to draw.
    """
    return ["audit", "--arch", "resnet18", "--weights", str(weights), "--images", str(images),
            "--masks", str(masks), "--mask-suffix", "_mask", "--out", str(out),
            "--image-size", "64", "--repetitions", "3", "--bootstrap-replicates", "200",
            "--temperature", "0.005", "--device", "cpu", *extra]
