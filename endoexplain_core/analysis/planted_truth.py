"""Audit validity on planted truth: does the audit see where a model's evidence really is?

Two tiny CNNs are trained on synthetic frames (``synthetic.render_frame``) where exactly one
cue carries the class signal:
- ``dye``: positives carry blue dye, negatives do not; a polyp is present in half of each class
  (so the lesion says nothing about the class);
- ``lesion``: positives carry a conspicuous polyp, negatives do not; dye is present in half of
  each class.
Both are then audited (``audit.audit_checkpoint``) on a masked pool whose frames carry a polyp
surrounded by dye, with the polyp as the mask. A valid audit shows clearly higher
peak-outside-lesion rates for the dye model with every gradient CAM, and the random heatmap's
rate near 1 - lesion area (a uniformly random peak falls in the lesion with that probability).

The CNN's target layer is its last convolution before a ReLU, so the gradient varies over space
and the four gradient CAMs are not identical by construction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from endoexplain_core.analysis import audit

from endoexplain_core.data import synthetic
from endoexplain_core.data.datasets import to_normalised_tensor

SIGNALS = ("dye", "lesion")
TARGET_LAYER = "features.4"
GRADIENT_METHODS = ("gradcam", "gradcampp", "xgradcam", "hirescam")


class TinyCNN(nn.Module):
    """Three 3x3 convolutions (stride 2, 2, 1), global average pooling, 2-class linear head.

    Input float (B, 3, S, S) normalised; output logits (B, 2). Feature map S/4 x S/4.
    """

    def __init__(self, width: int = 24):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(width, 2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(dim=(2, 3)))


def training_frames(signal: str, n_images: int, size: int, seed: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised float32 images (n, 3, S, S) and int64 labels (n,) for one planted signal.

    Labels alternate 1, 0, ...; the other cue is present in every second frame of each class.
    """
    if signal not in SIGNALS:
        raise ValueError(f"unknown planted signal {signal!r}; choose from {SIGNALS}")
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(n_images):
        label, other_cue = i % 2, (i // 2) % 2 == 1
        if signal == "dye":
            image, _ = synthetic.render_frame(rng, size, lesion=other_cue, dye=bool(label))
        else:
            image, _ = synthetic.render_frame(rng, size, lesion=bool(label), dye=other_cue)
        images.append(to_normalised_tensor(image))
        labels.append(label)
    return torch.stack(images), torch.tensor(labels)


def audit_pool(n_images: int, size: int, seed: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Masked frames carrying a polyp with its dye cushion: (sample_id, RGB, lesion mask)."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(n_images):
        image, mask = synthetic.render_frame(rng, size, lesion=True, dye=True)
        cases.append((f"planted_{i:04d}", image, mask))
    return cases


def train_planted_model(signal: str, *, n_images: int, size: int, epochs: int, seed: int,
                        batch_size: int = 32, learning_rate: float = 3e-3) -> tuple[TinyCNN, float]:
    """Train a ``TinyCNN`` on ``training_frames(signal, ...)``; return (model, train accuracy)."""
    images, labels = training_frames(signal, n_images, size, seed)
    torch.manual_seed(seed)
    model = TinyCNN()
    optimiser = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    order_generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(labels), generator=order_generator).split(batch_size):
            optimiser.zero_grad()
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
            loss.backward()
            optimiser.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(images).argmax(dim=1) == labels).float().mean())
    return model, accuracy


def run_planted_truth(output_dir: str | Path, *, size: int = 64, n_train: int = 160,
                      n_pool: int = 40, epochs: int = 6, seed: int = 20260721,
                      top_fraction: float = 0.20, repetitions: int = 4) -> pd.DataFrame:
    """Train both planted models, audit them on the dye + lesion pool, summarise per method.

    Audit tables go to ``<output_dir>/<signal>.parquet``. Returns one row per (signal, map
    method): signal, method, n, peak_outside_rate, mean_iou, train_accuracy,
    mean_lesion_area and expected_random_rate (= 1 - mean lesion area).
    Scores are uncalibrated (temperature 1): only localisation is assessed here.
    """
    output_dir = Path(output_dir)
    pool = audit_pool(n_pool, size, seed + 1)
    rows = []
    for signal in SIGNALS:
        model, accuracy = train_planted_model(signal, n_images=n_train, size=size,
                                              epochs=epochs, seed=seed)
        metadata = {"checkpoint_id": f"planted_{signal}", "arch": "tiny_cnn", "seed": seed}
        audit.audit_checkpoint(
            model, metadata, 1.0, pool, dataset="planted_truth", image_size=size,
            table_path=output_dir / f"{signal}.parquet",
            random_deletion_path=output_dir / f"{signal}_random_deletion.parquet",
            top_fraction=top_fraction, repetitions=repetitions,
            target_layer=(TARGET_LAYER, model.get_submodule(TARGET_LAYER)), total=n_pool)
        table = audit.read_audit_table(output_dir / f"{signal}.parquet")
        area = table.groupby("sample_id")["lesion_area_fraction"].first().mean()
        for method, group in table.groupby("method", sort=False):
            rows.append({"signal": signal, "method": method, "n": len(group),
                         "peak_outside_rate": group["peak_outside_mask"].mean(),
                         "mean_iou": group["iou"].mean(), "train_accuracy": accuracy,
                         "mean_lesion_area": area, "expected_random_rate": 1.0 - area})
    return pd.DataFrame(rows)


def validity_checks(summary: pd.DataFrame, random_tolerance: float = 0.15) -> pd.DataFrame:
    """Per check: the two rates compared and whether the audit passed it.

    Checks: for each gradient CAM, dye-model rate > lesion-model rate; for the random heatmap
    of each model, |rate - (1 - lesion area)| <= ``random_tolerance``.
    """
    rate = summary.set_index(["signal", "method"])["peak_outside_rate"]
    checks = [{"check": f"{method}: dye model fails more than lesion model",
               "value": rate["dye", method], "reference": rate["lesion", method],
               "passed": bool(rate["dye", method] > rate["lesion", method])}
              for method in GRADIENT_METHODS]
    for signal in SIGNALS:
        row = summary[(summary["signal"] == signal) & (summary["method"] == "random")].iloc[0]
        checks.append({"check": f"random heatmap ({signal} model) near 1 - lesion area",
                       "value": row["peak_outside_rate"], "reference": row["expected_random_rate"],
                       "passed": bool(abs(row["peak_outside_rate"] - row["expected_random_rate"])
                                      <= random_tolerance)})
    return pd.DataFrame(checks)
