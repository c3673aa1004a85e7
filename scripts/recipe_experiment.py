"""Between-seed spread of the primary architecture under training recipes (issue 48, item 6).

Trains ``--seeds`` EfficientNet-B0 checkpoints per recipe on a finished run's manifest and
cohort, fits each one's temperature on validation, audits it on the masked pool and prints
Table 4 panel A per seed and, per recipe and method, the mean and between-seed SD of the
panel-A peak failure. Recipes:

  scratch  the profile's recipe from random weights (the run's own checkpoints are reused when
           the run directory is given as --reuse-from and their seeds are asked for)
  trunk    the same fine-tuning from one shared trunk pretrained on the training split's
           negative frames (``models.pretraining``), standing in for ImageNet

Usage (a finished default run, CPU pin on; 6 seeds x 2 recipes is about 25 min on 2 cores):

  python scripts/recipe_experiment.py --run runs/default --out runs/recipe_experiment \\
      --seeds 1129 2089 3253 4001 5003 6007 --recipes scratch trunk

Each seed is read three times: its best epoch (the profile's selection), its last epoch (the
end of the cosine schedule) and ``swa``, the plain average of the weights of epochs
``--swa-from`` to the last (stochastic weight averaging along the trajectory, Izmailov et al.
2018) with BatchNorm statistics recomputed on ``--swa-bn-images`` training images.

Writes ``<out>/per_seed.csv`` (recipe, selection, seed, val_auprc measured on the file's
weights, epoch (for swa: the last averaged epoch), temperature, n, method, peak_failure) and
``<out>/spread.csv`` (recipe, selection, method, n_seeds, mean, seed_sd, min, max). A
measurement, not a stage: nothing of the run is changed.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader

from endoexplain_core import config
from endoexplain_core.analysis import audit, audit_inputs, calibration, over_seeds
from endoexplain_core.data import datasets
from endoexplain_core.models import checkpoint as checkpoint_files
from endoexplain_core.models import networks, pretraining, training
from endoexplain_core.numerics import resolve_device
from endoexplain_core.run_layout import RunLayout

ARCH = training.PRIMARY_ARCH
TRUNK_SEED = 7   # the trunk's own seed: one fixed draw, as the paper's one set of ImageNet weights


def _reuse(source_run: Path, target: Path, seeds: list[int]) -> None:
    """Copy the source run's finished checkpoints of ``seeds`` into ``target`` (train_checkpoint
    then skips them: same spec, settings and memory format)."""
    target.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        checkpoint_id = training.checkpoint_id(ARCH, seed)
        names = [f"{checkpoint_id}{suffix}" for suffix in (".safetensors", ".resume.safetensors")]
        names += [f"epochs/{path.name}" for _, path in
                  training.epoch_snapshots(source_run / "checkpoints", checkpoint_id)]
        for name in names:
            if (source_run / "checkpoints" / name).is_file() and not (target / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source_run / "checkpoints" / name, target / name)


def average_snapshots(checkpoint_dir: Path, checkpoint_id: str, first_epoch: int, last_epoch: int,
                      target: Path, *,
                      train_set: datasets.ManifestDataset, digest: str, image_size: int,
                      bn_images: int, batch_size: int) -> Path:
    """Write ``target``: the mean of the floating-point weights of the epoch snapshots
    ``first_epoch``..``last_epoch`` of ``checkpoint_id`` (integer buffers from the last one), with
    every BatchNorm layer's statistics recomputed on ``bn_images`` training images (the averaged
    weights have no running statistics of their own). The record keeps the last epoch's
    metadata (``epoch``, ``val_auprc``) and adds ``averaged_epochs``."""
    wanted = list(range(first_epoch, last_epoch + 1))
    found = dict(training.epoch_snapshots(checkpoint_dir, checkpoint_id))
    missing = [epoch for epoch in wanted if epoch not in found]
    if not wanted or missing:
        raise FileNotFoundError(f"{checkpoint_dir}: no epoch snapshot of {checkpoint_id} for epochs "
                                f"{missing or wanted}; the average needs epochs {first_epoch}-{last_epoch}")
    snapshots = [found[epoch] for epoch in wanted]
    records = [training.load_checkpoint(path, digest, image_size) for path in snapshots]
    last = records[-1]
    model = networks.build_model(last["arch"], num_classes=2)
    model.load_state_dict(training.average_state_dicts([record["state_dict"] for record in records]))
    statistics_seed = int(last["seed"]) * 1000 + 999
    generator = torch.Generator().manual_seed(statistics_seed)
    # train-mode forwards draw stochastic-depth masks from the global generator: seed it here,
    # so the file does not depend on what ran before in this process
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(statistics_seed)
        training.recalibrate_batchnorm(model, DataLoader(train_set, batch_size=batch_size, shuffle=True,
                                                         generator=generator), bn_images,
                                       torch.device("cpu"))
    record = {**{key: value for key, value in last.items() if key != "state_dict"},
              "averaged_epochs": wanted,
              "state_dict": {key: value.detach().clone() for key, value in model.state_dict().items()}}
    checkpoint_files.save_tree(record, target)
    return target


def audit_weights(path: Path, name: str, layout: RunLayout, out: Path, *, manifest: pd.DataFrame,
                  val_set: datasets.ManifestDataset, digest: str, shared: dict,
                  settings) -> pd.DataFrame:
    """Temperature on ``val_set`` (the validation images), then the masked-pool audit of one
    checkpoint file (written as ``<out>/<name>.parquet``); its Table 4 panel-A rows
    (``over_seeds.table4_per_seed``)."""
    model, metadata = training.load_model(path, digest, shared["image_size"])
    logits = training.predict_logits(model, val_set, settings.eval_batch_size, resolve_device("cpu"))
    z = calibration.logit_difference(logits[:, 0], logits[:, 1])
    temperature = calibration.fit_temperature(z, val_set.targets)
    pool = audit_inputs.masked_pool(manifest)
    table_path = out / f"{name}.parquet"
    audit.audit_checkpoint(model, metadata, temperature,
                           audit_inputs.manifest_cases(pool, layout.data, decode_size=shared["image_size"]),
                           dataset="hyperkvasir", image_size=shared["image_size"], table_path=table_path,
                           random_deletion_path=out / f"{name}_random.parquet",
                           top_fraction=shared["top_fraction"], repetitions=1,
                           batch_size=shared["audit_batch_size"], total=len(pool))
    rows = over_seeds.table4_per_seed(pd.read_parquet(table_path), [metadata["checkpoint_id"]],
                                      shared["score_threshold"])
    # measured here, not read from the file: an averaged checkpoint carries its last epoch's record
    return rows.assign(val_auprc=training.validation_auprc(logits, val_set.targets),
                       epoch=metadata["epoch"], temperature=temperature)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, type=Path, help="a finished run directory (its manifest and cohort)")
    parser.add_argument("--out", required=True, type=Path, help="output folder (created)")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1129, 2089, 3253, 4001, 5003, 6007])
    parser.add_argument("--recipes", nargs="+", choices=["scratch", "trunk"], default=["scratch", "trunk"])
    parser.add_argument("--trunk-epochs", type=int, default=None,
                        help="pretraining epochs (default: the profile's training epochs)")
    parser.add_argument("--learning-rate", type=float, default=None,
                        help="fine-tuning peak learning rate of the trunk recipe (default: the profile's)")
    parser.add_argument("--swa-from", type=int, default=4,
                        help="first epoch whose weights enter the swa average (default 4 of 6)")
    parser.add_argument("--swa-bn-images", type=int, default=256,
                        help="training images for the swa average's BatchNorm statistics")
    parser.add_argument("--reuse-from", type=Path, default=None,
                        help="run directory whose scratch checkpoints of the asked seeds are reused")
    args = parser.parse_args()

    profile = config.load_profile(args.profile)
    shared = {**config.stage_parameters(profile, "04_spatial_audit"),
              **config.stage_parameters(profile, "01_training")}
    section = shared["training_settings"]
    settings = training.settings_for(ARCH, section, shared.get("arch_overrides"))
    layout = RunLayout(args.run)
    manifest = datasets.load_manifest(layout.manifest)
    digest = layout.manifest_digest()
    acceleration = {"channels_last": bool(shared["channels_last"])}
    # decoded once for every checkpoint's temperature fit
    val_set = datasets.ManifestDataset(datasets.rows_of_roles(manifest, ["val"]), layout.data,
                                       shared["image_size"], cache=datasets.ImageCache())
    train_rows = datasets.rows_of_roles(manifest, ["train"])

    def train_set(seed: int) -> datasets.ManifestDataset:
        """The seed's augmented training set (as in training), for BatchNorm statistics."""
        return datasets.ManifestDataset(train_rows, layout.data, shared["image_size"],
                                        targets=train_rows["target"].to_numpy(), augment_seed=seed,
                                        cache=val_set.cache)

    rows = []
    for recipe in args.recipes:
        recipe_dir = args.out / recipe
        initial_state, recipe_settings = None, settings
        if recipe == "trunk":
            trunk_settings = settings.model_copy(update={"epochs": args.trunk_epochs or settings.epochs})
            trunk = pretraining.pretrain_trunk(manifest, layout.data, args.out / f"trunk_{ARCH}.safetensors",
                                               manifest_digest=digest, image_size=shared["image_size"],
                                               arch=ARCH, seed=TRUNK_SEED, settings=trunk_settings,
                                               channels_last=acceleration["channels_last"])
            print(f"trunk: {len(trunk['classes'])} classes, {trunk['n_images']} frames, "
                  f"history {trunk['history']}, {trunk['seconds']} s")
            initial_state = pretraining.load_trunk(trunk["path"], arch=ARCH, image_size=shared["image_size"],
                                                   manifest_digest=digest)
            if args.learning_rate is not None:
                recipe_settings = settings.model_copy(update={"learning_rate": args.learning_rate})
        elif args.reuse_from is not None:
            _reuse(args.reuse_from, RunLayout(recipe_dir).checkpoints_dir, args.seeds)
        for seed in args.seeds:
            summary = training.train_matrix_unit(manifest, layout.data, recipe_dir, digest,
                                                 shared["image_size"], ARCH, seed, training.CONTROL_NONE,
                                                 recipe_settings, acceleration=acceleration,
                                                 initial_state=initial_state,
                                                 keep_epoch_snapshots=True)
            # the best epoch (the profile's rule: first epoch of the highest validation AUPRC),
            # the last one (the end of the cosine schedule) and the average of the last epochs
            checkpoints_dir = RunLayout(recipe_dir).checkpoints_dir
            last = training.epoch_snapshot_path(checkpoints_dir, summary["checkpoint_id"],
                                                recipe_settings.epochs)
            swa = average_snapshots(checkpoints_dir, summary["checkpoint_id"], args.swa_from,
                                    recipe_settings.epochs,
                                    recipe_dir / "swa" / f"{summary['checkpoint_id']}.safetensors",
                                    train_set=train_set(seed), digest=digest,
                                    image_size=shared["image_size"], bn_images=args.swa_bn_images,
                                    batch_size=recipe_settings.batch_size)
            for selection, path in (("best", summary["path"]), ("last", last), ("swa", swa)):
                per_seed = audit_weights(Path(path), f"{summary['checkpoint_id']}_{selection}", layout,
                                         recipe_dir / "audit", manifest=manifest, val_set=val_set,
                                         digest=digest, shared=shared, settings=settings)
                rows.append(per_seed.assign(recipe=recipe, selection=selection))
                print(per_seed[["checkpoint_id", "method", "n", "peak_failure", "val_auprc",
                                "epoch", "temperature"]].to_string(index=False))
    per_seed = pd.concat(rows, ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    per_seed.to_csv(args.out / "per_seed.csv", index=False)
    spread = (per_seed.groupby(["recipe", "selection", "method"], sort=False)["peak_failure"]
              .agg(n_seeds="count", mean="mean", seed_sd=lambda v: float(np.std(v, ddof=1)),
                   min="min", max="max").reset_index())
    spread.to_csv(args.out / "spread.csv", index=False)
    print(spread.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
