"""Training matrix: one checkpoint per (architecture, seed), plus a shuffled-label control.

Recipe: docs/protocol.md, "Training recipe" (mixed precision on CUDA only).

Reproducibility: every source of randomness is derived from the checkpoint seed: model
initialisation (torch), the per-epoch shuffling order (a torch.Generator seeded from
``(seed, epoch)``), augmentations (``datasets.ManifestDataset``) and dropout / stochastic depth
(the global torch RNG, saved in the resume state). After every epoch a resume state is written;
a killed run restarts from the last completed epoch and ends with the same weights.

Files, under ``<run_dir>/checkpoints/`` (docs/architecture.md):
``<checkpoint_id>.safetensors`` best-epoch weights + metadata; ``<checkpoint_id>.resume.safetensors``
last epoch's full training state; ``registry.csv``; ``training_curves.csv``. Both checkpoint
files are written and read by ``models.checkpoint`` (tensors in safetensors, the rest JSON):
no code path unpickles them.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import average_precision_score
from torch import nn
from torch.utils.data import DataLoader

from endoexplain_core.config import TrainingSettings
from endoexplain_core.run_layout import RunLayout
from endoexplain_core.progress import progress_bar
from endoexplain_core import artefacts, files
from endoexplain_core.numerics import check_cpu_pin, resolve_device
from endoexplain_core.data import datasets
from endoexplain_core.kernels import cams
from endoexplain_core.models import checkpoint as checkpoint_files
from endoexplain_core.models import networks
from endoexplain_core.models.learning import MAP_CHECK_METHODS, MIN_NONCONSTANT_SHARE, MIN_VAL_AUPRC

CHECKPOINT_FORMAT = 2  # 2: safetensors + JSON (1 was a torch pickle)
CONTROL_NONE = "none"
CONTROL_SHUFFLED = "shuffled_labels"
PRIMARY_ARCH = "efficientnet_b0"
REGISTRY_COLUMNS = ["checkpoint_id", "arch", "seed", "control", "epochs", "val_auprc",
                    "val_map_share", "val_nll", "path", "sha256", "is_primary"]
LOGIT_COLUMNS = ["checkpoint_id", "arch", "seed", "control", "sample_id", "role", "source",
                 "target", "logit_neg", "logit_pos"]


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


class CheckpointMismatchError(ValueError):
    """A checkpoint or resume state does not belong to this run (digest, size, settings)."""


# ----------------------------------------------------------------------------- settings


def settings_for(arch: str, training_settings: dict[str, Any],
                 overrides: dict[str, dict] | None = None) -> TrainingSettings:
    """Settings of ``arch``: the profile's ``training_settings``, then ``overrides[arch]``."""
    merged = dict(training_settings)
    merged.update((overrides or {}).get(arch, {}))
    known = set(TrainingSettings.model_fields)
    unknown = sorted(set(merged) - known)
    if unknown:
        raise ValueError(f"unknown training settings {unknown} for {arch}; known: {sorted(known)}")
    return TrainingSettings(**merged)


@dataclass(frozen=True)
class CheckpointSpec:
    """Identity of one checkpoint, stored in its file and checked when it is loaded."""

    arch: str
    seed: int
    control: str
    image_size: int
    manifest_digest: str
    target_layer: str
    pretrained: bool

    @property
    def checkpoint_id(self) -> str:
        return checkpoint_id(self.arch, self.seed, self.control)


def checkpoint_id(arch: str, seed: int, control: str = CONTROL_NONE) -> str:
    """``<arch>_s<seed>``, or ``<arch>_shuffled_s<seed>`` for the shuffled-label control."""
    if control == CONTROL_NONE:
        return f"{arch}_s{seed}"
    if control == CONTROL_SHUFFLED:
        return f"{arch}_shuffled_s{seed}"
    raise ValueError(f"unknown control {control!r}; expected {CONTROL_NONE!r} or {CONTROL_SHUFFLED!r}")


def shuffled_targets(targets: np.ndarray, seed: int) -> np.ndarray:
    """Labels of a shuffled-label control: the same number of each label as ``targets``,
    assigned at random but balanced across the true classes, so they carry no information about
    the images' true labels, not even by chance.

    A plain permutation leaves the shuffled and the true labels agreeing on a random share of the
    images (0.5 +- 0.036 for 192 balanced frames), and a control trained on labels that agree
    with the truth on 57% of frames can learn the truth: the gate's shuffled control once reached
    held-out accuracy 0.81. Here each true class gets shuffled positives in proportion to its size
    (largest remainders, so the total is exact), placed at random within the class. ``targets``:
    (N,) 0/1 labels; returns int64 (N,), fixed for a seed."""
    targets = np.asarray(targets).astype(np.int64)
    if targets.size and not np.isin(targets, (0, 1)).all():
        raise ValueError("shuffled_targets needs 0/1 labels")
    rng = np.random.default_rng(seed)
    n_positive = int(targets.sum())
    classes = [np.flatnonzero(targets == label) for label in (0, 1)]
    exact = [len(members) * n_positive / max(len(targets), 1) for members in classes]
    counts = [int(np.floor(value)) for value in exact]
    for index in np.argsort([counts[i] - exact[i] for i in (0, 1)])[:n_positive - sum(counts)]:
        counts[index] += 1                       # largest remainders first
    shuffled = np.zeros_like(targets)
    for members, count in zip(classes, counts):
        shuffled[rng.permutation(members)[:count]] = 1
    return shuffled


# ----------------------------------------------------------------------------- randomness


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _worker_init(worker_id: int) -> None:
    """DataLoader worker seeding: derive NumPy/Python seeds from the worker's torch seed."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


@contextlib.contextmanager
def deterministic_algorithms(device: torch.device) -> Iterator[None]:
    """Use torch's deterministic kernels on CPU within the block, then restore the setting."""
    previous = torch.are_deterministic_algorithms_enabled()
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def zero_init_head(model: nn.Module) -> nn.Linear:
    """Set the new 2-class head (the model's last ``nn.Linear``) to zero weights and bias;
    return the head. Why: docs/protocol.md, "Training recipe"."""
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear head to initialise")
    head = linears[-1]
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


# ----------------------------------------------------------------------------- files


def load_checkpoint(path: str | Path, expected_manifest_digest: str, expected_image_size: int
                    ) -> dict[str, Any]:
    """Read a checkpoint file; refuse one trained on another manifest or image size.

    Returns the metadata dict (arch, seed, control, image_size, normalisation, target_layer,
    epoch, val_auprc, manifest_digest, pretrained, settings) with ``state_dict`` added.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist: run notebook 01_training")
    checkpoint = checkpoint_files.load_tree(path)  # never unpickles
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointMismatchError(f"{path} is not an endoExplain checkpoint (format {CHECKPOINT_FORMAT})")
    if checkpoint["manifest_digest"] != expected_manifest_digest:
        raise CheckpointMismatchError(
            f"{path} was trained on manifest {checkpoint['manifest_digest'][:12]}..., but this run's "
            f"manifest is {expected_manifest_digest[:12]}...: retrain (01_training) for this manifest")
    if int(checkpoint["image_size"]) != int(expected_image_size):
        raise CheckpointMismatchError(
            f"{path} was trained at {checkpoint['image_size']} px, but this run uses "
            f"{expected_image_size} px: retrain or use the matching profile")
    return checkpoint


def load_model(path: str | Path, expected_manifest_digest: str, expected_image_size: int,
               device: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """Checked checkpoint -> (model in eval mode on ``device``, metadata)."""
    checkpoint = load_checkpoint(path, expected_manifest_digest, expected_image_size)
    model = networks.build_model(checkpoint["arch"], num_classes=2)
    model.load_state_dict(checkpoint["state_dict"])
    metadata = {key: value for key, value in checkpoint.items() if key != "state_dict"}
    return model.to(device).eval(), metadata


# ----------------------------------------------------------------------------- one checkpoint


def cosine_with_warmup(warmup_steps: int, total_steps: int):
    """Learning-rate factor per step: linear 1/(w+1)..1 over ``warmup_steps``, then cosine to 0."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


def loader_options(device: torch.device, num_workers: int = 0) -> dict[str, Any]:
    """DataLoader keyword arguments for ``device``: ``num_workers`` decoding processes, and on
    CUDA pinned host memory (asynchronous host-to-device copies); the CPU path is unchanged."""
    return {"num_workers": num_workers, "pin_memory": device.type == "cuda"}


def to_device(images: torch.Tensor, device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """Move a batch to ``device`` (non-blocking from pinned memory), optionally channels_last."""
    images = images.to(device, non_blocking=device.type == "cuda")
    return images.contiguous(memory_format=torch.channels_last) if channels_last else images


@contextlib.contextmanager
def optimiser_memory_format(model: nn.Module, channels_last: bool):
    """Run the block with ``model``'s 4-D weights in channels_last format (when asked), and
    leave it contiguous afterwards, also on an error. The Parameter objects stay the same
    (the optimiser keeps them); only their memory layout changes."""
    if not channels_last:
        yield model
        return
    model.to(memory_format=torch.channels_last)
    try:
        yield model
    finally:
        model.to(memory_format=torch.contiguous_format)


def use_mixed_precision(device: torch.device, mixed_precision: bool) -> bool:
    """Autocast (float16) only on CUDA and only when asked: CPU runs stay float32 (and exact)."""
    return bool(mixed_precision) and device.type == "cuda"


@torch.no_grad()
def predict_logits(model: nn.Module, dataset: datasets.ManifestDataset, batch_size: int,
                   device: torch.device, mixed_precision: bool = False,
                   num_workers: int = 0) -> np.ndarray:
    """float32 (n, 2) logits [negative, positive] of every item, in dataset order.

    ``mixed_precision``: float16 autocast on CUDA (ignored on the CPU); ``num_workers``:
    DataLoader worker processes (pinned memory on CUDA). Results can differ in the last bits
    between batch sizes (kernel blocking): ``batch_size`` is part of the profile.
    """
    model.eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False,
                        **loader_options(device, num_workers))
    logits = np.zeros((len(dataset), 2), dtype=np.float32)
    for images, _, indices in loader:
        with torch.autocast(device.type, dtype=torch.float16,
                            enabled=use_mixed_precision(device, mixed_precision)):
            output = model(to_device(images, device))
        logits[indices.numpy()] = output.float().cpu().numpy()
    return logits


def validation_auprc(logits: np.ndarray, targets: np.ndarray) -> float:
    """AUPRC (average precision) of z = logit_pos - logit_neg against binary targets."""
    return float(average_precision_score(targets, logits[:, 1] - logits[:, 0]))


def _training_state(model, optimizer, scheduler, scaler, progress: dict, spec, settings,
                    channels_last: bool) -> dict:
    return {"format": CHECKPOINT_FORMAT, "spec": asdict(spec), "settings": settings.model_dump(),
            "channels_last": bool(channels_last),
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
            "rng": _rng_state(), **progress}


EPOCH_SNAPSHOT_DIR = "epochs"


def epoch_snapshot_path(checkpoint_dir: str | Path, checkpoint_id: str, epoch: int) -> Path:
    """``<checkpoint_dir>/epochs/<checkpoint_id>.epochNNN.safetensors`` (epoch 1-based)."""
    return Path(checkpoint_dir) / EPOCH_SNAPSHOT_DIR / f"{checkpoint_id}.epoch{epoch:03d}{checkpoint_files.SUFFIX}"


def epoch_snapshots(checkpoint_dir: str | Path, checkpoint_id: str) -> list[tuple[int, Path]]:
    """(epoch, path) of every kept snapshot of ``checkpoint_id``, by epoch; [] when none."""
    folder = Path(checkpoint_dir) / EPOCH_SNAPSHOT_DIR
    found = []
    for path in folder.glob(f"{checkpoint_id}.epoch[0-9][0-9][0-9]{checkpoint_files.SUFFIX}"):
        found.append((int(path.name[len(checkpoint_id) + 6:len(checkpoint_id) + 9]), path))
    return sorted(found)


def _checkpoint_record(spec: CheckpointSpec, settings: TrainingSettings, progress: dict,
                       state_dict: dict) -> dict:
    return {"format": CHECKPOINT_FORMAT, "checkpoint_id": spec.checkpoint_id, **asdict(spec),
            "normalisation": datasets.NORMALISATION, "epoch": progress["best_epoch"],
            "val_auprc": progress["best_auprc"], "settings": settings.model_dump(),
            "state_dict": {k: v.detach().cpu().clone() for k, v in state_dict.items()}}


def average_state_dicts(state_dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Weight averaging (SWA along one trajectory): the element-wise mean of every
    floating-point tensor over ``state_dicts`` (same keys and shapes, e.g. one seed's epoch
    snapshots); integer tensors (BatchNorm's ``num_batches_tracked``) are taken from the last.
    The averaged BatchNorm running statistics are not those of the averaged weights: recompute
    them (``recalibrate_batchnorm``) before using the model."""
    if not state_dicts:
        raise ValueError("average_state_dicts needs at least one state dict")
    keys = list(state_dicts[-1])
    for state in state_dicts:
        if list(state) != keys:
            raise ValueError("average_state_dicts: the state dicts have different keys")
    return {key: (torch.stack([state[key] for state in state_dicts]).mean(0)
                  if state_dicts[-1][key].is_floating_point() else state_dicts[-1][key].clone())
            for key in keys}


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, loader: DataLoader, n_images: int,
                          device: torch.device) -> int:
    """Replace every BatchNorm layer's running mean and variance by their plain average over
    the first ``n_images`` images of ``loader`` (train-mode forwards, no gradient, no
    optimiser step); return the number of images used (0: no BatchNorm layer or n_images 0).
    Why: docs/protocol.md, "Training recipe"."""
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not layers or n_images <= 0:
        return 0
    momenta = [layer.momentum for layer in layers]
    was_training = model.training
    seen = 0
    try:
        for layer in layers:
            layer.reset_running_stats()
            layer.momentum = None  # cumulative average over the batches below
        model.train()
        for images, _, _ in loader:
            images = images[: n_images - seen]
            model(to_device(images, device))
            seen += len(images)
            if seen >= n_images:
                break
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
        model.train(was_training)
    return seen


def train_one_epoch(model: nn.Module, loader: DataLoader, max_steps: int, optimizer, scheduler,
                     scaler, loss_function, device: torch.device, mixed_precision: bool = False,
                     channels_last: bool = False) -> list[float]:
    """One epoch of optimiser steps (at most ``max_steps``); returns the per-step losses.

    Raises ``NonFiniteLossError`` before the step that would apply a NaN/inf loss.
    """
    use_amp = use_mixed_precision(device, mixed_precision)
    model.train()
    losses = []
    for step, (images, targets, _) in enumerate(loader):
        if step >= max_steps:
            break
        with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
            loss = loss_function(model(to_device(images, device, channels_last)),
                                 targets.to(device, non_blocking=device.type == "cuda"))
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"training loss became {loss.item()} at step {step + 1}")
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        losses.append(loss.item())
    return losses


def train_checkpoint(model: nn.Module, spec: CheckpointSpec, train_set: datasets.ManifestDataset,
                     val_set: datasets.ManifestDataset, settings: TrainingSettings,
                     checkpoint_dir: str | Path, device: str | torch.device = "cpu",
                     show_progress: bool = True, mixed_precision: bool = False,
                     channels_last: bool = False, keep_epoch_snapshots: bool = False) -> dict[str, Any]:
    """Train (or resume, or skip if finished) one checkpoint; return its summary.

    ``keep_epoch_snapshots``: also save the weights after every epoch as
    ``<checkpoint_dir>/epochs/<id>.epochNNN.safetensors`` (same format; ``epoch`` and
    ``val_auprc`` are that epoch's), e.g. for the per-epoch C-Score of notebook 07.

    ``mixed_precision`` (float16 autocast with a gradient scaler) applies on CUDA only.
    ``channels_last``: the optimiser steps run in channels_last memory format (part of the
    checkpoint's identity: its weights differ in the last bits); BatchNorm recalibration and
    validation run contiguous.

    ``model`` must be freshly built after ``seed_everything(spec.seed)``; it is ignored when
    a resume state exists (its weights are overwritten). ``train_set`` must have augmentation
    on and its targets set (shuffled for the control). Returns a dict: checkpoint_id, arch,
    seed, control, pretrained, epochs (best epoch, 1-based), epochs_run, val_auprc, path,
    history (list of per-epoch dicts: epoch, train_loss, val_auprc, learning_rate).
    """
    check_cpu_pin()  # training turns another kernel's last bits into another model: refuse
    device = torch.device(device)
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    best_path = checkpoint_dir / f"{spec.checkpoint_id}{checkpoint_files.SUFFIX}"
    resume_path = checkpoint_dir / f"{spec.checkpoint_id}.resume{checkpoint_files.SUFFIX}"

    steps_per_epoch = epoch_steps(len(train_set), settings)
    model = model.to(device)
    optimizer, scheduler, scaler = optimisation(model, settings, steps_per_epoch, device,
                                                 mixed_precision)
    loss_function = nn.CrossEntropyLoss(label_smoothing=settings.label_smoothing)
    progress = {"epoch": 0, "best_epoch": 0, "best_auprc": -1.0, "epochs_since_best": 0,
                "finished": False, "history": []}

    if resume_path.is_file():
        state = _matching_resume_state(resume_path, best_path, spec, settings, channels_last)
        progress = _restore(state, model, optimizer, scheduler, scaler, keys=progress)

    bar = progress_bar(total=settings.epochs, initial=progress["epoch"], desc=spec.checkpoint_id,
                       unit="epoch", disable=not show_progress)
    with deterministic_algorithms(device):
        while not progress["finished"]:
            epoch = progress["epoch"]
            train_set.set_epoch(epoch)
            shuffle_generator = torch.Generator().manual_seed(spec.seed * 1000 + epoch)
            loader = DataLoader(train_set, batch_size=settings.batch_size, shuffle=True,
                                drop_last=len(train_set) > settings.batch_size,
                                generator=shuffle_generator, worker_init_fn=_worker_init,
                                **loader_options(device, settings.num_workers))
            try:
                with optimiser_memory_format(model, channels_last):
                    losses = train_one_epoch(model, loader, steps_per_epoch, optimizer, scheduler,
                                              scaler, loss_function, device, mixed_precision,
                                              channels_last)
            except NonFiniteLossError as error:
                raise _diverged(error, spec.checkpoint_id, epoch, progress["best_epoch"],
                                best_path) from None

            auprc = _recalibrated_val_auprc(model, train_set, val_set, settings,
                                            spec.seed * 1000 + epoch + 500, device, mixed_precision)
            progress["history"].append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)),
                                        "val_auprc": auprc,
                                        "learning_rate": float(scheduler.get_last_lr()[0])})
            snapshot = (epoch_snapshot_path(checkpoint_dir, spec.checkpoint_id, epoch + 1)
                        if keep_epoch_snapshots else None)
            _select_and_save(progress, auprc, model, spec, settings, best_path, snapshot)
            checkpoint_files.save_tree(_training_state(model, optimizer, scheduler, scaler, progress,
                                                       spec, settings, channels_last), resume_path)
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses):.3f}", val_auprc=f"{auprc:.3f}")
    bar.close()
    return {"checkpoint_id": spec.checkpoint_id, "arch": spec.arch, "seed": spec.seed,
            "control": spec.control, "pretrained": spec.pretrained,
            "epochs": progress["best_epoch"], "epochs_run": progress["epoch"],
            "val_auprc": progress["best_auprc"], "path": best_path,
            "history": progress["history"]}


def _select_and_save(progress: dict, auprc: float, model: nn.Module, spec: CheckpointSpec,
                     settings: TrainingSettings, best_path: Path, snapshot_path: Path | None) -> None:
    """After an epoch (in place on ``progress``): count it, save its snapshot (if asked), keep
    it as the best checkpoint when its validation AUPRC beats the best so far, and decide
    whether training is finished (last epoch, or ``patience`` epochs without a better one)."""
    progress["epoch"] += 1
    if snapshot_path is not None:
        this_epoch = {"best_epoch": progress["epoch"], "best_auprc": auprc}
        checkpoint_files.save_tree(_checkpoint_record(spec, settings, this_epoch, model.state_dict()),
                                   snapshot_path)
    if auprc > progress["best_auprc"]:
        progress.update(best_auprc=auprc, best_epoch=progress["epoch"], epochs_since_best=0)
        checkpoint_files.save_tree(_checkpoint_record(spec, settings, progress, model.state_dict()),
                                   best_path)
    else:
        progress["epochs_since_best"] += 1
    progress["finished"] = (progress["epoch"] >= settings.epochs
                            or progress["epochs_since_best"] >= settings.patience)


def _restore(state: dict, model: nn.Module, optimizer, scheduler, scaler, *, keys) -> dict:
    """Load a resume state into the model, optimiser, schedule, scaler and the RNGs; return
    its progress entries (``keys``)."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    _set_rng_state(state["rng"])
    return {key: state[key] for key in keys}


def _diverged(error: Exception, checkpoint_id: str, epoch: int, best_epoch: int,
              best_path: Path) -> NonFiniteLossError:
    """The one-line error for a non-finite loss: where, what was kept, what to change."""
    kept = (f"the last good checkpoint (epoch {best_epoch}) is kept at {best_path}"
            if best_path.is_file() else "no checkpoint had been written yet")
    return NonFiniteLossError(
        f"{checkpoint_id}: {error} at epoch {epoch + 1}; {kept}. Lower the learning "
        f"rate or raise warmup_steps in the profile's 01_training section.")


def epoch_steps(n_train: int, settings: TrainingSettings) -> int:
    """Optimiser steps per epoch: full batches (one step for a set no larger than a batch),
    capped by ``max_steps_per_epoch``."""
    steps = n_train // settings.batch_size if n_train > settings.batch_size else 1
    if settings.max_steps_per_epoch is not None:
        steps = min(steps, settings.max_steps_per_epoch)
    return steps


def optimisation(model: nn.Module, settings: TrainingSettings, steps_per_epoch: int,
                  device: torch.device, mixed_precision: bool):
    """AdamW, its cosine schedule with warm-up over every step of the run, and the gradient
    scaler (enabled for CUDA mixed precision only)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate,
                                  weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, cosine_with_warmup(settings.warmup_steps, settings.epochs * steps_per_epoch))
    scaler = torch.amp.GradScaler(device.type, enabled=use_mixed_precision(device, mixed_precision))
    return optimizer, scheduler, scaler


def _matching_resume_state(resume_path: Path, best_path: Path, spec: CheckpointSpec,
                           settings: TrainingSettings, channels_last: bool) -> dict:
    """The resume state at ``resume_path``; ``CheckpointMismatchError`` when it was written for
    another spec, other settings or the other memory format."""
    state = checkpoint_files.load_tree(resume_path)  # safetensors + JSON, never unpickled
    # The memory format is part of the identity: its kernels give other weights, so a
    # state from the other format is never resumed or reused (a missing key: contiguous).
    if (state.get("spec") != asdict(spec) or state.get("settings") != settings.model_dump()
            or bool(state.get("channels_last", False)) != bool(channels_last)):
        raise CheckpointMismatchError(
            f"{resume_path} belongs to other settings, memory format or another manifest/image "
            f"size (stored {state.get('spec')}, {state.get('settings')}, channels_last "
            f"{bool(state.get('channels_last', False))}); delete it and {best_path.name} "
            f"to retrain this checkpoint")
    return state


def _recalibrated_val_auprc(model: nn.Module, train_set, val_set, settings: TrainingSettings,
                            statistics_seed: int, device: torch.device,
                            mixed_precision: bool) -> float:
    """Recalibrate BatchNorm on training images drawn with ``statistics_seed``, then return
    the validation AUPRC."""
    statistics_generator = torch.Generator().manual_seed(statistics_seed)
    recalibrate_batchnorm(model, DataLoader(train_set, batch_size=settings.batch_size, shuffle=True,
                                            generator=statistics_generator,
                                            worker_init_fn=_worker_init,
                                            **loader_options(device, settings.num_workers)),
                          settings.batchnorm_recalibration_images, device)
    return validation_auprc(predict_logits(model, val_set, settings.eval_batch_size, device,
                                           mixed_precision, num_workers=settings.num_workers),
                            val_set.targets)


# ----------------------------------------------------------------------------- the matrix


class MissingImageNetWeights(FileNotFoundError):
    """The profile asks for ImageNet weights that are not on this machine (never downloaded)."""


def imagenet_weights_path(arch: str, imagenet_weights: str | dict) -> Path | None:
    """Which local ImageNet weights to start ``arch`` from (None = from scratch).

    ``imagenet_weights``: ``"none"`` (from scratch, the only way to ask for it), ``"auto"``
    (the torchvision cache, via ``networks.find_local_imagenet_weights``), or a mapping
    arch -> file path (a value of ``"none"`` trains that architecture from scratch). Asking
    for weights that are not there is an error, never a silent fall-back to random
    initialisation: ``MissingImageNetWeights`` names the expected file and how to provide it.
    A file whose name carries torchvision's hash must match it
    (``networks.verify_weights_file``; ``networks.WeightsHashMismatch`` otherwise).
    """
    path = locate_imagenet_weights(arch, imagenet_weights)
    if path is not None:
        networks.verify_weights_file(path)
    return path


def locate_imagenet_weights(arch: str, imagenet_weights: str | dict) -> Path | None:
    """The file ``imagenet_weights`` points ``arch`` to (``imagenet_weights_path`` without the
    hash check, for callers that verify it themselves and want the digest)."""
    if imagenet_weights == "none":
        return None
    if imagenet_weights == "auto":
        found = networks.find_local_imagenet_weights(arch)
        if found is None:
            expected = networks.imagenet_weights_cache_path(arch)
            raise MissingImageNetWeights(
                f"ImageNet weights for {arch} are not in the local torchvision cache: expected "
                f"{expected}. Copy that file there (nothing is downloaded), or set "
                f"imagenet_weights: {{{arch}: /path/to/{expected.name}}} in the profile, or set "
                "imagenet_weights: none to train from scratch deliberately.")
        return found
    if isinstance(imagenet_weights, dict):
        if arch not in imagenet_weights:
            raise MissingImageNetWeights(
                f"imagenet_weights in the profile names no file for {arch}: add "
                f"{arch}: /path/to/{networks.imagenet_weights_cache_path(arch).name} (or {arch}: "
                "none to train it from scratch deliberately)")
        if imagenet_weights[arch] in (None, "none"):
            return None
        path = Path(imagenet_weights[arch]).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"ImageNet weights for {arch} given in the profile do not exist: {path}")
        return path
    raise ValueError(f"imagenet_weights must be 'none', 'auto' or a mapping arch -> path, got {imagenet_weights!r}")


def check_architectures(architectures: list[str]) -> None:
    """Refuse a profile asking for an architecture the core cannot build."""
    unknown = [arch for arch in architectures if arch not in networks.ARCHITECTURES]
    if unknown:
        raise ValueError(f"the profile asks for unknown architectures {unknown}; "
                         f"known: {list(networks.ARCHITECTURES)}")


def matrix_runs(architectures: list[str], training_seeds: list[int],
                control_seed: int | None) -> list[tuple[str, int, str]]:
    """(arch, seed, control) of every checkpoint of the matrix, the shuffled-label control last."""
    runs = [(arch, seed, CONTROL_NONE) for arch in architectures for seed in training_seeds]
    if control_seed is not None:
        runs.append((PRIMARY_ARCH, control_seed, CONTROL_SHUFFLED))
    return runs


def train_matrix_unit(manifest: pd.DataFrame, data_root: str | Path, run_dir: str | Path,
                      manifest_digest: str, image_size: int, arch: str, seed: int, control: str,
                      settings: TrainingSettings, imagenet_weights: str | dict = "none",
                      device: str = "cpu", show_progress: bool = True,
                      acceleration: dict[str, Any] | None = None,
                      cache: datasets.ImageCache | None = None,
                      val_set: datasets.ManifestDataset | None = None,
                      keep_epoch_snapshots: bool = False,
                      initial_state: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """Train (or resume, or reuse) one checkpoint of the matrix: one unit of work.

    Everything the run depends on is in the arguments (its own seed drives initialisation,
    shuffling, augmentation and the label permutation of the control), so it gives the same
    checkpoint in any process and in any order. ``cache`` and ``val_set`` may be shared between
    units of one process (``train_matrix``'s plain loop); a task builds its own.
    ``acceleration``: optional ``{"mixed_precision": bool (CUDA only), "channels_last": bool}``.
    ``initial_state``: a 2-class state dict of ``arch`` to fine-tune from (a shared trunk,
    ``models.pretraining``), loaded strictly before the head is zeroed; it excludes
    ``imagenet_weights`` other than ``"none"``. Returns the ``train_checkpoint`` summary.
    """
    device = resolve_device(device)
    cache = datasets.ImageCache() if cache is None else cache
    if val_set is None:
        val_set = datasets.ManifestDataset(datasets.rows_of_roles(manifest, ["val"]), data_root,
                                           image_size, cache=cache)
    train_rows = datasets.rows_of_roles(manifest, ["train"])
    targets = train_rows["target"].to_numpy()
    if control == CONTROL_SHUFFLED:
        targets = shuffled_targets(targets, seed)
    train_set = datasets.ManifestDataset(train_rows, data_root, image_size, targets=targets,
                                         augment_seed=seed, cache=cache)
    weights_path = imagenet_weights_path(arch, imagenet_weights)
    if initial_state is not None and weights_path is not None:
        raise ValueError(f"{arch}: start from ImageNet weights or from a trunk, not both")
    seed_everything(seed)
    model = networks.build_model(arch, num_classes=2, weights_path=weights_path)
    if initial_state is not None:
        model.load_state_dict(initial_state, strict=True)
    zero_init_head(model)
    spec = CheckpointSpec(arch=arch, seed=seed, control=control, image_size=image_size,
                          manifest_digest=manifest_digest,
                          target_layer=networks.TARGET_LAYERS[arch],
                          pretrained=weights_path is not None or initial_state is not None)
    return train_checkpoint(model, spec, train_set, val_set, settings,
                            RunLayout(run_dir).checkpoints_dir, device, show_progress,
                            keep_epoch_snapshots=keep_epoch_snapshots, **(acceleration or {}))


def train_matrix(manifest: pd.DataFrame, data_root: str | Path, run_dir: str | Path,
                 manifest_digest: str, image_size: int, architectures: list[str],
                 training_seeds: list[int], training_settings: dict[str, Any],
                 arch_overrides: dict[str, dict] | None = None, control_seed: int | None = None,
                 imagenet_weights: str | dict = "none", device: str = "cpu",
                 show_progress: bool = True, acceleration: dict[str, Any] | None = None,
                 task_map=None, keep_epoch_snapshots: bool = False) -> list[dict[str, Any]]:
    """Train architectures x seeds and the shuffled-label EfficientNet-B0 control.

    Each checkpoint is one ``train_matrix_unit``. Default (``task_map=None``): one after the
    other in this process, decoding each image once (shared ``ImageCache``). ``task_map``:
    ``pipeline.tasks.TaskRunner.map`` (or any function ``(function, calls, labels) -> results
    in order``) to run the units as tasks, e.g. on Dask workers. Finished checkpoints are
    skipped and interrupted ones resumed. Returns one summary dict per checkpoint
    (``train_checkpoint``), the control last; ``control_seed=None`` skips the control.
    ``keep_epoch_snapshots``: every checkpoint also keeps its per-epoch weights
    (``train_checkpoint``).
    """
    check_architectures(architectures)
    settings = {arch: settings_for(arch, training_settings, arch_overrides)
                for arch in [*architectures, PRIMARY_ARCH]}
    resolve_device(device)  # a missing CUDA device is an error here, before any task starts
    runs = matrix_runs(architectures, training_seeds, control_seed)
    calls = [{"manifest": manifest, "data_root": data_root, "run_dir": run_dir,
              "manifest_digest": manifest_digest, "image_size": image_size, "arch": arch,
              "seed": seed, "control": control, "settings": settings[arch],
              "imagenet_weights": imagenet_weights, "device": device,
              "show_progress": show_progress, "acceleration": acceleration,
              "keep_epoch_snapshots": keep_epoch_snapshots}
             for arch, seed, control in runs]
    if task_map is not None:
        return task_map(train_matrix_unit, calls,
                        labels=[checkpoint_id(arch, seed, control) for arch, seed, control in runs])
    cache = datasets.ImageCache()
    val_set = datasets.ManifestDataset(datasets.rows_of_roles(manifest, ["val"]), data_root,
                                       image_size, cache=cache)
    return [train_matrix_unit(**call, cache=cache, val_set=val_set) for call in calls]


def training_curves(summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """Long table of per-epoch curves: checkpoint_id, arch, seed, control, epoch, ..."""
    rows = [{"checkpoint_id": s["checkpoint_id"], "arch": s["arch"], "seed": s["seed"],
             "control": s["control"], **entry} for s in summaries for entry in s["history"]]
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- selection


SELECTION_COLUMNS = ("checkpoint_id", "arch", "seed", "control", "val_auprc", "val_map_share",
                     "val_nll")
# Validation AUPRCs within this of the best are a tie: converged seeds differ by a few rank
# swaps of the ~28 validation positives (0.001-0.004 each), which last-bit differences between
# machines can move; such a difference is no reason to prefer a seed. A tie goes to the lowest
# validation NLL (``validation_nll``: how far the scores separate the classes, which AUPRC
# near 1 no longer tells apart), then to the lowest seed.
PRIMARY_TIE_AUPRC = 0.01


def validation_nll(z: np.ndarray, targets: np.ndarray) -> float:
    """Mean cross-entropy (nats per image, no label smoothing, no temperature) of a two-class
    model with logit difference ``z`` = logit_pos - logit_neg against 0/1 ``targets``:
    log(1 + exp(-z)) for a positive, log(1 + exp(z)) for a negative."""
    z, targets = np.asarray(z, dtype=np.float64), np.asarray(targets)
    return float(np.mean(np.logaddexp(0.0, np.where(targets == 1, -z, z))))


def tie_break_order(tied: pd.DataFrame) -> pd.DataFrame:
    """``tied`` candidate rows (val_nll, seed) in the order a tie is broken: lowest validation
    NLL first, then lowest seed (a NaN NLL last)."""
    return tied.sort_values(["val_nll", "seed"], kind="mergesort", na_position="last")


def primary_candidates(validation_results: pd.DataFrame) -> pd.DataFrame:
    """The rows the primary is chosen from: non-control ``PRIMARY_ARCH`` runs that learned by
    validation alone (AUPRC >= ``MIN_VAL_AUPRC`` and Grad-CAM and Eigen-CAM non-constant on
    at least ``MIN_NONCONSTANT_SHARE`` of the validation positives, ``val_map_share``); when
    none did, all of them (the notebook says so and 05 marks the primary not learned). Shared
    by ``select_primary`` and the selection-stability check."""
    eligible = validation_results[(validation_results["arch"] == PRIMARY_ARCH)
                                  & (validation_results["control"] == CONTROL_NONE)]
    learned = eligible[(eligible["val_auprc"] >= MIN_VAL_AUPRC)
                       & (eligible["val_map_share"] >= MIN_NONCONSTANT_SHARE)]
    return learned if len(learned) else eligible


def select_primary(validation_results: pd.DataFrame) -> str:
    """The primary checkpoint: best validation AUPRC among the non-control EfficientNet-B0 runs
    that learned by validation alone (``primary_candidates``).

    ``validation_results`` holds exactly the columns ``SELECTION_COLUMNS``; anything else
    (e.g. a test metric) is refused, so selection cannot see test data. Ties: every run within
    ``PRIMARY_TIE_AUPRC`` of the best is tied, and the one with the lowest validation NLL wins
    (``tie_break_order``; equal NLLs: the lowest seed).
    """
    extra = sorted(set(validation_results.columns) - set(SELECTION_COLUMNS))
    missing = sorted(set(SELECTION_COLUMNS) - set(validation_results.columns))
    if extra or missing:
        raise ValueError(f"select_primary takes exactly the columns {list(SELECTION_COLUMNS)} "
                         f"(validation only); extra {extra}, missing {missing}")
    eligible = primary_candidates(validation_results)
    if eligible.empty:
        raise ValueError(f"no non-control {PRIMARY_ARCH} checkpoint to select the primary from")
    tied = eligible[eligible["val_auprc"] >= eligible["val_auprc"].max() - PRIMARY_TIE_AUPRC]
    return str(tie_break_order(tied).iloc[0]["checkpoint_id"])


def validation_map_share(model: nn.Module, arch: str, dataset: datasets.ManifestDataset,
                         batch_size: int, device: torch.device) -> float:
    """Smallest share, over ``MAP_CHECK_METHODS``, of ``dataset``'s images (the validation
    positives) on which the model's map is not constant: the map half of the learning rule,
    measured on validation images so that choosing the primary never looks at audit images."""
    _, layer = networks.resolve_target_layer(model, arch)
    nonconstant = {method: [] for method in MAP_CHECK_METHODS}
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False)
    for images, _, _ in loader:
        maps = cams.compute_cams(model, layer, images.to(device), methods=MAP_CHECK_METHODS)
        for method, batch in maps.items():
            nonconstant[method].append((batch.flatten(1).amax(dim=1) > 0).cpu().numpy())
    shares = [np.concatenate(flags).mean() for flags in nonconstant.values() if flags]
    return float(min(shares)) if shares else float("nan")


def add_selection_measures(summaries: list[dict[str, Any]], manifest: pd.DataFrame,
                           data_root: str | Path, manifest_digest: str, image_size: int,
                           *, device: str = "cpu", batch_size: int) -> list[dict[str, Any]]:
    """``summaries`` with what ``select_primary`` reads besides AUPRC, for every non-control
    ``PRIMARY_ARCH`` checkpoint (NaN for the others: they do not compete for primary):
    ``val_map_share`` (``validation_map_share`` on the validation positives the model calls
    positive, z >= 0; NaN when it calls none) and ``val_nll``
    (``validation_nll`` on every validation image)."""
    device = resolve_device(device)
    cache = datasets.ImageCache()
    validation = manifest[manifest["role"] == "val"]
    everything = datasets.ManifestDataset(validation, data_root, image_size, cache=cache)
    for summary in summaries:
        summary["val_map_share"] = summary["val_nll"] = float("nan")
        if summary["arch"] == PRIMARY_ARCH and summary["control"] == CONTROL_NONE:
            model, _ = load_model(summary["path"], manifest_digest, image_size, device)
            logits = predict_logits(model, everything, batch_size, device)   # one pass for both
            z = logits[:, 1].astype(np.float64) - logits[:, 0]
            summary["val_nll"] = validation_nll(z, everything.targets)
            # the map check reads the positives the model calls positive (z >= 0), as 05 does
            called = everything.rows[(everything.targets == 1) & (z >= 0)]
            summary["val_map_share"] = validation_map_share(
                model, summary["arch"], datasets.ManifestDataset(called, data_root, image_size, cache=cache),
                batch_size, device) if len(called) else float("nan")
    return summaries


def build_registry(summaries: list[dict[str, Any]], primary_id: str, run_dir: str | Path
                   ) -> pd.DataFrame:
    """Registry rows (``REGISTRY_COLUMNS``); paths relative to ``run_dir``, POSIX."""
    run_dir = Path(run_dir)
    rows = [{"checkpoint_id": s["checkpoint_id"], "arch": s["arch"], "seed": s["seed"],
             "control": s["control"], "epochs": s["epochs"], "val_auprc": s["val_auprc"],
             "val_map_share": s.get("val_map_share", float("nan")),
             "val_nll": s.get("val_nll", float("nan")),
             "path": Path(s["path"]).resolve().relative_to(run_dir.resolve()).as_posix(),
             "sha256": files.sha256_file(s["path"]), "is_primary": s["checkpoint_id"] == primary_id}
            for s in summaries]
    return pd.DataFrame(rows, columns=REGISTRY_COLUMNS)


# ----------------------------------------------------------------------------- logits


# The manifest roles whose logits are exported: calibration (02) fits on validation and reports
# validation and test, the selection-stability check (05) resamples validation. Training and
# audit images are never read from the logits table (the audits score their own images), and
# exporting them for ten checkpoints cost more than the rest of the stage's inference.
LOGIT_ROLES = ("val", "test")


def export_logits(registry: pd.DataFrame, manifest: pd.DataFrame, data_root: str | Path,
                  run_dir: str | Path, manifest_digest: str, image_size: int,
                  batch_size: int, device: str = "cpu", show_progress: bool = True,
                  roles: tuple[str, ...] = LOGIT_ROLES) -> pd.DataFrame:
    """Both logits of every checkpoint for the manifest images of ``roles``.

    Returns (and writes to ``<run_dir>/logits/logits.parquet``) the ``LOGIT_COLUMNS`` table,
    rows ordered by registry then manifest order. ``target`` is the true label, also for the
    shuffled-label control.
    """
    run_dir = Path(run_dir)
    device = resolve_device(device)
    manifest = manifest[manifest["role"].isin(roles)].reset_index(drop=True)
    dataset = datasets.ManifestDataset(manifest, data_root, image_size, cache=datasets.ImageCache())
    frames = []
    for entry in progress_bar(registry.itertuples(index=False), total=len(registry), desc="logits",
                              disable=not show_progress):
        model, _ = load_model(run_dir / entry.path, manifest_digest, image_size, device)
        logits = predict_logits(model, dataset, batch_size, device)
        frames.append(pd.DataFrame({
            "checkpoint_id": entry.checkpoint_id, "arch": entry.arch, "seed": entry.seed,
            "control": entry.control, "sample_id": manifest["sample_id"].to_numpy(),
            "role": manifest["role"].to_numpy(), "source": manifest["source"].to_numpy(),
            "target": manifest["target"].to_numpy(), "logit_neg": logits[:, 0],
            "logit_pos": logits[:, 1]}))
    table = pd.concat(frames, ignore_index=True)[LOGIT_COLUMNS]
    files.write_parquet_atomic(table, RunLayout(run_dir).logits)
    return table


def evaluate_test_split(logits: pd.DataFrame, checkpoint_ids: list[str],
                        metric_intervals=None) -> pd.DataFrame:
    """Test-split AUPRC, accuracy at score 0.5 (z >= 0) and positive prevalence per checkpoint.

    Call only after the primary has been selected on validation results.
    ``metric_intervals``: optional ``f(z, target) -> {metric: {"estimate", "ci_low",
    "ci_high", ...}}`` (the analysis layer's ``stats.classifier_metric_intervals``, 5,000
    image-bootstrap replicates); with it the table gains ``test_<metric>_ci_low`` /
    ``_ci_high`` for AUPRC, accuracy at 0.5, sensitivity and specificity, and the point
    estimates of sensitivity and specificity. Passed in because this layer may not import
    the statistics layer above it.
    """
    rows = []
    for checkpoint in checkpoint_ids:
        test = logits[(logits["checkpoint_id"] == checkpoint) & (logits["role"] == "test")]
        z = (test["logit_pos"] - test["logit_neg"]).to_numpy()
        target = test["target"].to_numpy()
        row = {"checkpoint_id": checkpoint, "n_test": len(test),
               "test_auprc": float(average_precision_score(target, z)),
               "test_accuracy_at_0.5": float(np.mean((z >= 0).astype(int) == target)),
               "positive_prevalence": float(target.mean())}
        if metric_intervals is not None:
            for metric, values in metric_intervals(z, target).items():
                row[f"test_{metric}"] = values["estimate"]
                row[f"test_{metric}_ci_low"] = values["ci_low"]
                row[f"test_{metric}_ci_high"] = values["ci_high"]
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- reporting


@artefacts.computed_by
def training_table(summaries: list[dict[str, Any]], primary_id: str,
                   test_results: pd.DataFrame) -> pd.DataFrame:
    """Table S1: one row per checkpoint (validation results), test columns where computed.

    ``test_results`` comes from ``evaluate_test_split`` (primary and control only); the other
    rows keep NaN test columns because the protocol reports test metrics of the primary only.
    """
    rows = pd.DataFrame([{"checkpoint_id": s["checkpoint_id"], "arch": s["arch"],
                          "seed": s["seed"], "control": s["control"],
                          "pretrained": s["pretrained"], "best_epoch": s["epochs"],
                          "epochs_run": s["epochs_run"], "val_auprc": s["val_auprc"],
                          "val_nll": s.get("val_nll", float("nan")),
                          "primary": s["checkpoint_id"] == primary_id} for s in summaries])
    return rows.merge(test_results, on="checkpoint_id", how="left")
