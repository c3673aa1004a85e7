"""A training step of the run against its floor, in one run (issue: where does training time go?).

On a finished run's manifest and data (``--run-dir``, default ``runs/default``), for each
architecture of ``--archs`` at the profile's input size, batch size and recipe
(``--profile``, default ``default``), it times, interleaved, the minimum over ``--repeats``:

  step      one optimiser step of the run's own epoch loop (``training.train_one_epoch``) fed
            by the run's DataLoader: decode (cached after the first pass, as in the run),
            augmentation, collation, forward, loss, backward, AdamW, schedule
  floor     the same loop on one resident batch (no loading, no augmentation): a bare forward
            + backward + optimiser step
  epoch     the loop's steps per epoch x step, plus the end-of-epoch work the run does
            (BatchNorm recalibration and validation AUPRC, ``training._recalibrated_val_auprc``)

and prints step/floor and epoch/(steps x floor): how far training is from its floor, and how
much of an epoch is not optimiser steps. Random initial weights (a step costs the same).

Usage: python benchmarks/bench_training_step.py [--run-dir runs/default] [--archs efficientnet_b0]
           [--steps 8] [--repeats 3]
Output: printed, and written to benchmarks/results/bench_training_step_<profile>.txt.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from endoexplain_core import config
from endoexplain_core.data import datasets
from endoexplain_core.models import networks, training
from endoexplain_core.run_layout import RunLayout

RESULTS = Path(__file__).resolve().parent / "results"


def timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def measure(arch: str, manifest, data_root: Path, image_size: int, settings: training.TrainingSettings,
            steps: int, repeats: int, channels_last: bool) -> dict[str, float]:
    """Seconds per step of the run's loop and of its floor, and seconds of the end-of-epoch work."""
    cache = datasets.ImageCache()
    train_rows = datasets.rows_of_roles(manifest, ["train"])
    train_set = datasets.ManifestDataset(train_rows, data_root, image_size,
                                         targets=train_rows["target"].to_numpy(), augment_seed=1, cache=cache)
    val_set = datasets.ManifestDataset(datasets.rows_of_roles(manifest, ["val"]), data_root, image_size, cache=cache)
    training.seed_everything(1)
    model = networks.build_model(arch, num_classes=2)
    training.zero_init_head(model)
    device = torch.device("cpu")
    per_epoch = training.epoch_steps(len(train_set), settings)
    optimizer, scheduler, scaler = training.optimisation(model, settings, per_epoch, device, False)
    loss_function = nn.CrossEntropyLoss(label_smoothing=settings.label_smoothing)

    def loader():
        return DataLoader(train_set, batch_size=settings.batch_size, shuffle=True, drop_last=True,
                          generator=torch.Generator().manual_seed(1),
                          **training.loader_options(device, settings.num_workers))

    resident = [next(iter(loader()))] * steps
    epoch_loop = lambda batches: training.train_one_epoch(  # noqa: E731
        model, batches, steps, optimizer, scheduler, scaler, loss_function, device, False, channels_last)
    with training.deterministic_algorithms(device), training.optimiser_memory_format(model, channels_last):
        epoch_loop(loader())                      # warm: decode cache, allocations, kernel choice
        step, floor = [], []
        for _ in range(repeats):
            step.append(timed(lambda: epoch_loop(loader())) / steps)
            floor.append(timed(lambda: epoch_loop(resident)) / steps)
    end_of_epoch = min(timed(lambda: training._recalibrated_val_auprc(model, train_set, val_set, settings, 1, device, False))
                       for _ in range(max(1, repeats - 1)))
    return {"steps_per_epoch": per_epoch, "step": min(step), "floor": min(floor), "end_of_epoch": end_of_epoch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="runs/default")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--archs", nargs="+", default=None, help="default: the profile's architectures")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    profile = config.load_profile(args.profile)
    section = profile.stage_settings("01_training")
    layout = RunLayout(args.run_dir)
    manifest = datasets.load_manifest(layout.manifest_dir / "manifest.csv")
    data_root = config.resolve_data_root("", args.run_dir)
    lines = [f"bench_training_step: profile {args.profile}, {profile.shared.image_size} px, "
             f"{torch.get_num_threads()} torch threads, {args.steps} steps x {args.repeats} repeats (minimum)",
             f"{'arch':<18} {'steps/ep':>8} {'step s':>8} {'floor s':>8} {'step/floor':>10} "
             f"{'epoch s':>8} {'epoch/(n*floor)':>15}"]
    print("\n".join(lines), flush=True)
    for arch in args.archs or profile.shared.architectures:
        settings = training.settings_for(arch, section.training_settings, section.arch_overrides)
        r = measure(arch, manifest, data_root, profile.shared.image_size, settings, args.steps,
                    args.repeats, profile.shared.channels_last)
        epoch = r["steps_per_epoch"] * r["step"] + r["end_of_epoch"]
        lines.append(f"{arch:<18} {r['steps_per_epoch']:>8} {r['step']:>8.3f} {r['floor']:>8.3f} "
                     f"{r['step'] / r['floor']:>10.2f} {epoch:>8.1f} {epoch / (r['steps_per_epoch'] * r['floor']):>15.2f}")
        print(lines[-1], flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"bench_training_step_{args.profile}.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
