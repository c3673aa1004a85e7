"""A shared pretraining stage standing in for ImageNet.

The paper fine-tunes every seed from one set of ImageNet weights, so its seeds differ only in
the fine-tuning (head, data order, augmentation, dropout). The synthetic showcase trains from
scratch, and its seeds land in different places: Grad-CAM's panel-A failure over three
EfficientNet-B0 seeds of one default run was 0.27 / 0.89 / 0.43. This module trains one trunk
that every seed (and every gate model) can start from, without ever showing it a polyp: the
pretext task is the source category (cecum, stool, dyed resection margin, ...) of the
*training split's negative frames*. The lesion is therefore learnt in fine-tuning, seed by
seed, as in the paper's regime; no validation, test or audit image is read.

File: one safetensors record (``models.checkpoint.save_tree``) holding a 2-class state dict of
``arch`` (the pretext head replaced by a zero 2-class head; fine-tuning zero-initialises it
anyway) and the stage's identity (arch, seed, image size, manifest digest, settings, classes),
checked by ``load_trunk``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader

from endoexplain_core.config import TrainingSettings
from endoexplain_core.data import datasets
from endoexplain_core.models import checkpoint as checkpoint_files
from endoexplain_core.models import networks, training
from endoexplain_core.numerics import check_cpu_pin, resolve_device
from endoexplain_core.progress import progress_bar

TRUNK_FORMAT = 1
PRETEXT = "source category of the training split's negative frames"


def pretext_rows(manifest: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(rows, classes) of the pretext task: the manifest's ``train`` rows with target 0 (no
    polyp), and their sorted ``source`` categories (class index = position in the list).

    Raises ValueError when fewer than two categories remain (nothing to learn)."""
    rows = datasets.rows_of_roles(manifest, ["train"])
    rows = rows[rows["target"] == 0].reset_index(drop=True)
    classes = sorted(rows["source"].astype(str).unique())
    if len(classes) < 2:
        raise ValueError(f"pretraining needs negative training frames of at least two source "
                         f"categories; the manifest has {classes}")
    return rows, classes


def trunk_identity(arch: str, seed: int, image_size: int, manifest_digest: str,
                   settings: TrainingSettings, classes: list[str]) -> dict[str, Any]:
    """What a trunk file must match to be reused (and what ``load_trunk`` checks)."""
    return {"format": TRUNK_FORMAT, "pretext": PRETEXT, "arch": arch, "seed": int(seed),
            "image_size": int(image_size), "manifest_digest": manifest_digest,
            "settings": settings.model_dump(), "classes": list(classes)}


def pretrain_trunk(manifest: pd.DataFrame, data_root: str | Path, out_path: str | Path, *,
                   manifest_digest: str, image_size: int, arch: str, seed: int,
                   settings: TrainingSettings, device: str = "cpu", channels_last: bool = False,
                   show_progress: bool = True) -> dict[str, Any]:
    """Train ``arch`` from scratch on the pretext task (``pretext_rows``) and save its trunk.

    The recipe of ``training.train_checkpoint`` (AdamW, warm-up then cosine decay over
    ``settings.epochs`` x ``training.epoch_steps`` steps, label-smoothed cross-entropy, the
    training augmentation, BatchNorm statistics recomputed at the end), every random draw from
    ``seed``. There is no validation: the stage keeps its last epoch. An existing file with the
    same identity (``trunk_identity``) is reused, not retrained.

    Returns a dict: path, reused, classes, n_images, epochs, history (per epoch: epoch,
    train_loss, train_accuracy) and seconds.
    """
    check_cpu_pin()
    out_path = Path(out_path)
    rows, classes = pretext_rows(manifest)
    identity = trunk_identity(arch, seed, image_size, manifest_digest, settings, classes)
    if out_path.is_file():
        stored = checkpoint_files.load_tree(out_path)
        if stored.get("identity") == identity:
            return {"path": out_path, "reused": True, "classes": classes, "n_images": len(rows),
                    "epochs": settings.epochs, "history": stored["history"], "seconds": 0.0}
    started = time.perf_counter()
    torch_device = resolve_device(device)
    targets = rows["source"].astype(str).map({c: i for i, c in enumerate(classes)}).to_numpy()
    cache = datasets.ImageCache()
    train_set = datasets.ManifestDataset(rows, data_root, image_size, targets=targets,
                                         augment_seed=seed, cache=cache)
    training.seed_everything(seed)
    model = networks.build_model(arch, num_classes=len(classes)).to(torch_device)
    steps = training.epoch_steps(len(train_set), settings)
    optimizer, scheduler, scaler = training.optimisation(model, settings, steps, torch_device, False)
    loss_function = nn.CrossEntropyLoss(label_smoothing=settings.label_smoothing)
    history = []
    with training.deterministic_algorithms(torch_device):
        for epoch in progress_bar(range(settings.epochs), desc=f"pretraining {arch}", unit="epoch",
                                  disable=not show_progress):
            train_set.set_epoch(epoch)
            loader = DataLoader(train_set, batch_size=settings.batch_size, shuffle=True,
                                drop_last=len(train_set) > settings.batch_size,
                                generator=torch.Generator().manual_seed(seed * 1000 + epoch))
            with training.optimiser_memory_format(model, channels_last):
                losses = training.train_one_epoch(model, loader, steps, optimizer, scheduler,
                                                  scaler, loss_function, torch_device,
                                                  channels_last=channels_last)
            history.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses))})
        statistics_loader = DataLoader(train_set, batch_size=settings.batch_size, shuffle=True,
                                       generator=torch.Generator().manual_seed(seed * 1000 + 999))
        training.recalibrate_batchnorm(model, statistics_loader,
                                       settings.batchnorm_recalibration_images, torch_device)
        plain_set = datasets.ManifestDataset(rows, data_root, image_size, targets=targets, cache=cache)
        history[-1]["train_accuracy"] = _accuracy(model, plain_set, settings.eval_batch_size,
                                                  torch_device)
    networks.replace_head(model, arch, 2)
    training.zero_init_head(model)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint_files.save_tree({"identity": identity, "history": history,
                                "state_dict": {k: v.detach().cpu().clone()
                                               for k, v in model.state_dict().items()}}, out_path)
    return {"path": out_path, "reused": False, "classes": classes, "n_images": len(rows),
            "epochs": settings.epochs, "history": history,
            "seconds": round(time.perf_counter() - started, 1)}


@torch.no_grad()
def _accuracy(model: nn.Module, dataset: datasets.ManifestDataset, batch_size: int,
              device: torch.device) -> float:
    """Share of ``dataset``'s images whose pretext class is the model's arg-max (eval mode)."""
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for images, targets, _ in DataLoader(dataset, batch_size=batch_size):
            correct += int((model(images.to(device)).argmax(dim=1).cpu() == targets).sum())
    finally:
        model.train(was_training)
    return correct / len(dataset)


def load_trunk(path: str | Path, *, arch: str, image_size: int,
               manifest_digest: str | None = None) -> dict[str, torch.Tensor]:
    """The 2-class state dict of a trunk file, after checking that it was pretrained for
    ``arch`` at ``image_size`` (and, when given, on the manifest ``manifest_digest``).

    Raises ``training.CheckpointMismatchError`` naming the file and the difference."""
    stored = checkpoint_files.load_tree(path)
    identity = stored.get("identity", {})
    expected = {"format": TRUNK_FORMAT, "arch": arch, "image_size": int(image_size)}
    if manifest_digest is not None:
        expected["manifest_digest"] = manifest_digest
    wrong = {key: (identity.get(key), value) for key, value in expected.items()
             if identity.get(key) != value}
    if wrong:
        differences = ", ".join(f"{key} {found!r} (expected {value!r})"
                                for key, (found, value) in wrong.items())
        raise training.CheckpointMismatchError(f"{path}: not a trunk for this run: {differences}")
    return stored["state_dict"]
