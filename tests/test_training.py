"""Training loop: determinism, resume, NaN handling, checkpoints, selection and logit export.

A tiny cohort (32 px PNGs written to tmp_path) and a tiny CNN keep each training to well under
a second; one test runs the real EfficientNet-B0 matrix path for a single step at 32 px.
"""

import hashlib

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from torch import nn

from endoexplain_core.data import datasets

from endoexplain_core.figures import training_figures
from endoexplain_core.models import checkpoint, training

IMAGE_SIZE = 32
DIGEST = "ab" * 32
SETTINGS = training.TrainingSettings(epochs=3, batch_size=8, learning_rate=0.01,
                                     warmup_steps=1, patience=5, eval_batch_size=16)


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """40 images: positives carry a bright centred square, negatives do not."""
    root = tmp_path_factory.mktemp("cohort")
    rng = np.random.default_rng(0)
    roles = ["train"] * 24 + ["val"] * 8 + ["test"] * 4 + ["spatial_audit"] * 4
    rows = []
    for i, role in enumerate(roles):
        target = i % 2
        image = rng.integers(60, 120, (40, 40, 3), dtype=np.uint8)
        if target:
            image[12:28, 12:28] = (230, 200, 90)
        path = f"hyper-kvasir/{role}/img{i:03d}.png"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / path)
        rows.append({"sample_id": f"img{i:03d}", "path": path, "target": target, "role": role,
                     "source": ("dyed-lifted-polyps" if i % 4 == 1 else "polyps") if target
                     else ("dyed-resection-margins" if i % 4 == 2 else "cecum")})
    return root, pd.DataFrame(rows)


class TinyNet(nn.Module):
    """Conv -> ReLU -> dropout -> global pool -> linear (dropout exercises the torch RNG)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Linear(6, 2)

    def forward(self, images):
        return self.head(self.features(images).mean(dim=(2, 3)))


class PoisonedNet(TinyNet):
    """Returns NaN logits from its ``poison_from``-th training forward on."""

    def __init__(self, poison_from):
        super().__init__()
        self.training_calls = 0
        self.poison_from = poison_from

    def forward(self, images):
        logits = super().forward(images)
        if self.training:
            self.training_calls += 1
            if self.training_calls >= self.poison_from:
                return logits * float("nan")
        return logits


class FailingDataset(datasets.ManifestDataset):
    """Raises a decode error on its ``fail_at``-th item read (a file going bad mid-epoch)."""

    def __init__(self, *args, fail_at, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = 0
        self.fail_at = fail_at

    def __getitem__(self, index):
        self.reads += 1
        if self.reads == self.fail_at:
            raise datasets.ImageDecodeError(f"cannot decode image {self.rows.at[index, 'path']}")
        return super().__getitem__(index)


def _spec(seed=1129, control=training.CONTROL_NONE, digest=DIGEST):
    return training.CheckpointSpec(arch="tinynet", seed=seed, control=control,
                                   image_size=IMAGE_SIZE, manifest_digest=digest,
                                   target_layer="features.0", pretrained=False)


def _datasets(cohort, dataset_class=datasets.ManifestDataset, seed=1129, **kwargs):
    root, manifest = cohort
    train_set = dataset_class(datasets.rows_of_roles(manifest, ["train"]), root, IMAGE_SIZE,
                              augment_seed=seed, **kwargs)
    val_set = datasets.ManifestDataset(datasets.rows_of_roles(manifest, ["val"]), root, IMAGE_SIZE)
    return train_set, val_set


def _train(cohort, directory, model_class=TinyNet, settings=SETTINGS, spec=None, channels_last=False,
           **dataset_kwargs):
    spec = spec or _spec()
    training.seed_everything(spec.seed)
    model = model_class()
    train_set, val_set = _datasets(cohort, **dataset_kwargs)
    return training.train_checkpoint(model, spec, train_set, val_set, settings, directory,
                                     show_progress=False, channels_last=channels_last)


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _final_weights(directory):
    return checkpoint.load_tree(directory / "tinynet_s1129.resume.safetensors")["model"]


def test_two_trainings_give_identical_checkpoints(cohort, tmp_path):
    first = _train(cohort, tmp_path / "a")
    second = _train(cohort, tmp_path / "b")
    assert _sha(first["path"]) == _sha(second["path"])
    for name, tensor in _final_weights(tmp_path / "a").items():
        assert torch.equal(tensor, _final_weights(tmp_path / "b")[name]), name
    assert first["history"] == second["history"] and len(first["history"]) == 3
    # A different seed gives different weights (the seed is actually used).
    other = _train(cohort, tmp_path / "c", spec=_spec(seed=7))
    assert not torch.equal(checkpoint.load_tree(other["path"])["state_dict"]["head.weight"],
                           checkpoint.load_tree(first["path"])["state_dict"]["head.weight"])


def test_resume_after_interrupted_epoch_matches_uninterrupted_run(cohort, tmp_path):
    uninterrupted = _train(cohort, tmp_path / "full")
    # 24 training images, batch 8 -> 24 reads per epoch (+ drop_last nothing): fail in epoch 2.
    with pytest.raises(datasets.ImageDecodeError, match="img0"):
        _train(cohort, tmp_path / "killed", dataset_class=FailingDataset, fail_at=24 + 10)
    state = checkpoint.load_tree(tmp_path / "killed" / "tinynet_s1129.resume.safetensors")
    assert state["epoch"] == 1 and not state["finished"]
    resumed = _train(cohort, tmp_path / "killed")
    assert resumed["history"] == uninterrupted["history"]
    for name, tensor in _final_weights(tmp_path / "full").items():
        assert torch.equal(tensor, _final_weights(tmp_path / "killed")[name]), name
    assert _sha(resumed["path"]) == _sha(uninterrupted["path"])


def test_channels_last_steps_are_deterministic_resumable_and_leave_the_model_contiguous(cohort, tmp_path):
    """channels_last optimiser steps: a run is repeatable and survives an interruption; the
    weights saved are plain contiguous tensors. The same run in contiguous format takes other
    kernels, so its weights may differ in the last bits, never in shape or names."""
    first = _train(cohort, tmp_path / "a", channels_last=True)
    again = _train(cohort, tmp_path / "b", channels_last=True)
    assert _sha(first["path"]) == _sha(again["path"]) and first["history"] == again["history"]
    with pytest.raises(datasets.ImageDecodeError):
        _train(cohort, tmp_path / "killed", channels_last=True, dataset_class=FailingDataset, fail_at=24 + 10)
    resumed = _train(cohort, tmp_path / "killed", channels_last=True)
    assert resumed["history"] == first["history"] and _sha(resumed["path"]) == _sha(first["path"])
    weights = checkpoint.load_tree(first["path"])["state_dict"]
    assert all(tensor.is_contiguous() for tensor in weights.values())
    contiguous = checkpoint.load_tree(_train(cohort, tmp_path / "c")["path"])["state_dict"]
    assert {k: v.shape for k, v in contiguous.items()} == {k: v.shape for k, v in weights.items()}
    # A finished run in one format is never reused for the other (its weights would differ).
    with pytest.raises(training.CheckpointMismatchError, match="channels_last"):
        _train(cohort, tmp_path / "c", channels_last=True)
    with pytest.raises(training.CheckpointMismatchError, match="channels_last"):
        _train(cohort, tmp_path / "a", channels_last=False)


def test_optimiser_memory_format_restores_contiguous_weights_after_an_error():
    model = TinyNet()
    parameters = list(model.parameters())
    with pytest.raises(RuntimeError, match="mid-step"):
        with training.optimiser_memory_format(model, True):
            assert model.features[0].weight.is_contiguous(memory_format=torch.channels_last)
            assert not model.features[0].weight.is_contiguous()
            raise RuntimeError("mid-step")
    assert model.features[0].weight.is_contiguous()
    assert all(a is b for a, b in zip(parameters, model.parameters()))  # the optimiser's objects
    with training.optimiser_memory_format(model, False):
        assert model.features[0].weight.is_contiguous()


def test_finished_checkpoint_is_not_retrained(cohort, tmp_path):
    first = _train(cohort, tmp_path)
    before = (tmp_path / "tinynet_s1129.safetensors").stat().st_mtime_ns
    again = _train(cohort, tmp_path)
    assert again["history"] == first["history"]
    assert (tmp_path / "tinynet_s1129.safetensors").stat().st_mtime_ns == before


def test_resume_state_from_other_settings_is_refused(cohort, tmp_path):
    _train(cohort, tmp_path)
    changed = SETTINGS.model_copy(update={"learning_rate": 0.5})
    with pytest.raises(training.CheckpointMismatchError, match="other settings"):
        _train(cohort, tmp_path, settings=changed)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(cohort, tmp_path):
    # 3 steps per epoch: epoch 1 is clean, epoch 2 turns NaN at its second step.
    with pytest.raises(training.NonFiniteLossError, match="nan at step 2 at epoch 2.*kept"):
        _train(cohort, tmp_path, model_class=lambda: PoisonedNet(poison_from=5))
    kept = training.load_checkpoint(tmp_path / "tinynet_s1129.safetensors", DIGEST, IMAGE_SIZE)
    assert kept["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in kept["state_dict"].values() if v.is_floating_point())


def test_checkpoint_metadata_round_trip_and_refusals(cohort, tmp_path):
    summary = _train(cohort, tmp_path)
    checkpoint = training.load_checkpoint(summary["path"], DIGEST, IMAGE_SIZE)
    assert checkpoint["checkpoint_id"] == "tinynet_s1129"
    assert (checkpoint["arch"], checkpoint["seed"], checkpoint["control"]) == ("tinynet", 1129, "none")
    assert checkpoint["image_size"] == IMAGE_SIZE and checkpoint["target_layer"] == "features.0"
    assert checkpoint["normalisation"] == {"mean": list(datasets.IMAGENET_MEAN), "std": list(datasets.IMAGENET_STD)}
    assert checkpoint["manifest_digest"] == DIGEST and checkpoint["pretrained"] is False
    best = max(summary["history"], key=lambda e: e["val_auprc"])
    assert checkpoint["epoch"] == best["epoch"] and checkpoint["val_auprc"] == best["val_auprc"]
    model = TinyNet()
    model.load_state_dict(checkpoint["state_dict"])
    with pytest.raises(training.CheckpointMismatchError, match="manifest"):
        training.load_checkpoint(summary["path"], "cd" * 32, IMAGE_SIZE)
    with pytest.raises(training.CheckpointMismatchError, match="64 px"):
        training.load_checkpoint(summary["path"], DIGEST, 64)
    with pytest.raises(FileNotFoundError, match="01_training"):
        training.load_checkpoint(tmp_path / "missing.safetensors", DIGEST, IMAGE_SIZE)


def test_early_stopping_after_patience(cohort, tmp_path):
    # model_copy skips validation on purpose: a profile needs learning_rate > 0, this test
    # freezes the model to see patience alone end training.
    settings = SETTINGS.model_copy(update={"epochs": 20, "patience": 1, "learning_rate": 0.0})
    summary = _train(cohort, tmp_path, settings=settings)
    # With a zero learning rate the AUPRC never improves after epoch 1: stop after epoch 2.
    assert summary["epochs"] == 1 and summary["epochs_run"] == 2


def test_cosine_with_warmup_hand_values():
    factor = training.cosine_with_warmup(warmup_steps=2, total_steps=6)
    assert [factor(s) for s in range(2)] == pytest.approx([1 / 3, 2 / 3])
    assert factor(2) == pytest.approx(1.0)
    assert factor(4) == pytest.approx(0.5)  # halfway through the 4 decay steps
    assert factor(6) == pytest.approx(0.0, abs=1e-12)


def test_shuffled_targets_are_fixed_and_keep_prevalence():
    targets = np.array([1] * 10 + [0] * 30)
    shuffled = training.shuffled_targets(targets, 1129)
    assert shuffled.sum() == 10 and not np.array_equal(shuffled, targets)
    np.testing.assert_array_equal(shuffled, training.shuffled_targets(targets, 1129))
    with pytest.raises(ValueError, match="0/1 labels"):
        training.shuffled_targets(np.array([0, 2, 1]), 1)


@pytest.mark.parametrize("n_positive,n", [(10, 40), (96, 192), (7, 23), (0, 5), (5, 5), (165, 519)])
def test_shuffled_targets_are_balanced_across_the_true_classes(n_positive, n):
    # each true class gets shuffled positives in proportion to its size (to one image), so the
    # shuffled labels agree with the truth on the chance share p^2 + (1 - p)^2, for every seed
    rng = np.random.default_rng(n)
    targets = rng.permutation(np.array([1] * n_positive + [0] * (n - n_positive)))
    p = n_positive / n
    for seed in range(20):
        shuffled = training.shuffled_targets(targets, seed)
        assert shuffled.sum() == n_positive
        for label in (0, 1):
            members = targets == label
            assert abs(shuffled[members].sum() - members.sum() * p) < 1
    assert len({training.shuffled_targets(targets, s).tobytes() for s in range(5)}) == (
        1 if n_positive in (0, n) else 5)
    assert training.checkpoint_id("efficientnet_b0", 1129, training.CONTROL_SHUFFLED) == \
        "efficientnet_b0_shuffled_s1129"


VALIDATION = pd.DataFrame({
    "checkpoint_id": ["efficientnet_b0_s1129", "efficientnet_b0_s2089", "efficientnet_b0_s3253",
                      "resnet34_s1129", "efficientnet_b0_shuffled_s1129"],
    "arch": ["efficientnet_b0"] * 3 + ["resnet34", "efficientnet_b0"],
    "seed": [1129, 2089, 3253, 1129, 1129],
    "control": ["none"] * 4 + ["shuffled_labels"],
    "val_auprc": [0.91, 0.95, 0.95, 0.99, 0.999],
    "val_map_share": [1.0, 1.0, 1.0, np.nan, np.nan],
    "val_nll": [0.30, 0.20, 0.20, np.nan, np.nan],
})


def test_select_primary_best_efficientnet_ties_to_lowest_nll_then_lowest_seed():
    assert training.select_primary(VALIDATION) == "efficientnet_b0_s2089"   # equal NLL: lowest seed
    reordered = VALIDATION.iloc[::-1].reset_index(drop=True)
    assert training.select_primary(reordered) == "efficientnet_b0_s2089"
    sharper = VALIDATION.assign(val_nll=[0.30, 0.20, 0.05, np.nan, np.nan])
    assert training.select_primary(sharper) == "efficientnet_b0_s3253"      # tied AUPRC, lower NLL


def test_validation_nll_is_the_two_class_cross_entropy():
    z = np.array([2.0, -1.0, 0.0, 30.0])
    targets = np.array([1, 0, 1, 0])
    logits = torch.tensor(np.stack([np.zeros(4), z], axis=1))
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor(targets)).item()
    assert training.validation_nll(z, targets) == pytest.approx(expected, rel=1e-12)
    assert training.validation_nll([0.0], [1]) == pytest.approx(np.log(2))


def test_select_primary_treats_auprc_within_001_of_the_best_as_a_tie():
    close = VALIDATION.assign(val_auprc=[0.993, 1.000, 0.998, 0.99, 0.999], val_nll=0.2)
    assert training.select_primary(close) == "efficientnet_b0_s1129"     # all within 0.01, same NLL: lowest seed
    apart = VALIDATION.assign(val_auprc=[0.985, 1.000, 0.998, 0.99, 0.999])
    assert training.select_primary(apart) == "efficientnet_b0_s2089"     # s1129 is 0.015 behind


def test_select_primary_prefers_checkpoints_whose_validation_maps_are_not_flat():
    """The other machine's default run: the best-AUPRC seed had Grad-CAM constant on a third of
    the images and still became the primary. Now a learned seed wins; with none learned, the
    best by AUPRC (the notebook warns, 05 marks it)."""
    flat_best = VALIDATION.assign(val_auprc=[0.995, 0.990, 0.960, 0.99, 0.999],
                                  val_map_share=[0.67, 1.0, 1.0, np.nan, np.nan])
    assert training.select_primary(flat_best) == "efficientnet_b0_s2089"
    none_learned = flat_best.assign(val_map_share=[0.67, 0.5, 0.9, np.nan, np.nan])
    assert training.select_primary(none_learned) == "efficientnet_b0_s2089"   # tied on AUPRC, lower NLL
    assert training.select_primary(none_learned.assign(val_nll=0.2)) == "efficientnet_b0_s1129"
    low_auprc = flat_best.assign(val_auprc=[0.995, 0.94, 0.96, 0.99, 0.999])   # s2089 below 0.95
    assert training.select_primary(low_auprc) == "efficientnet_b0_s3253"


def test_select_primary_refuses_anything_but_validation_columns():
    with_test = VALIDATION.assign(test_auprc=[0.99, 0.1, 0.1, 0.5, 0.5])
    with pytest.raises(ValueError, match="validation only.*test_auprc"):
        training.select_primary(with_test)
    with pytest.raises(ValueError, match="missing \\['val_auprc'\\]"):
        training.select_primary(VALIDATION.drop(columns="val_auprc"))


def test_matrix_selection_and_logit_export_with_efficientnet(cohort, tmp_path):
    root, manifest = cohort
    summaries = training.train_matrix(
        manifest, root, tmp_path, DIGEST, IMAGE_SIZE, ["efficientnet_b0"], [1129],
        training_settings={"epochs": 1, "batch_size": 8, "max_steps_per_epoch": 1, "learning_rate": 1e-3},
        control_seed=1129, show_progress=False)
    assert [s["checkpoint_id"] for s in summaries] == ["efficientnet_b0_s1129",
                                                       "efficientnet_b0_shuffled_s1129"]
    summaries = training.add_selection_measures(summaries, manifest, root, DIGEST, IMAGE_SIZE, batch_size=16)
    validation = pd.DataFrame(summaries)[list(training.SELECTION_COLUMNS)]
    assert 0.0 <= validation["val_map_share"].iloc[0] <= 1.0          # measured on validation
    assert np.isnan(validation["val_map_share"].iloc[1])               # the control does not compete
    assert validation["val_nll"].iloc[0] > 0 and np.isnan(validation["val_nll"].iloc[1])
    primary = training.select_primary(validation)
    registry = training.build_registry(summaries, primary, tmp_path)
    assert list(registry.columns) == training.REGISTRY_COLUMNS
    assert registry["is_primary"].tolist() == [True, False]
    assert registry["path"].tolist()[0] == "checkpoints/efficientnet_b0_s1129.safetensors"
    logits = training.export_logits(registry, manifest, root, tmp_path, DIGEST, IMAGE_SIZE, batch_size=64,
                                    show_progress=False)
    exported = manifest[manifest["role"].isin(training.LOGIT_ROLES)]
    assert list(logits.columns) == training.LOGIT_COLUMNS and len(logits) == 2 * len(exported)
    assert set(logits["role"]) == set(exported["role"]) and "train" not in set(logits["role"])
    assert pd.read_parquet(tmp_path / "logits" / "logits.parquet").equals(logits)
    # The exported logits agree with a fresh forward pass of the loaded checkpoint.
    model, metadata = training.load_model(tmp_path / registry["path"][0], DIGEST, IMAGE_SIZE)
    assert metadata["target_layer"] == "features.8.0"
    first_image = datasets.ManifestDataset(exported.iloc[:1], root, IMAGE_SIZE)[0][0]
    with torch.no_grad():
        expected = model(first_image[None])[0].numpy()
    np.testing.assert_allclose(logits.iloc[0][["logit_neg", "logit_pos"]].to_numpy(dtype=float),
                               expected, rtol=1e-4, atol=1e-5)
    metrics = training.evaluate_test_split(logits, [primary])
    assert metrics.loc[0, "n_test"] == 4 and metrics.loc[0, "positive_prevalence"] == 0.5


def test_unknown_architecture_is_refused_before_training(cohort, tmp_path):
    root, manifest = cohort
    with pytest.raises(ValueError, match="unknown architectures \\['vgg11'\\]"):
        training.train_matrix(manifest, root, tmp_path, DIGEST, IMAGE_SIZE,
                              ["efficientnet_b0", "vgg11"], [1], training_settings={})
    assert not (tmp_path / "checkpoints").exists()


def _summary(checkpoint, arch, seed, control, auprc):
    return {"checkpoint_id": checkpoint, "arch": arch, "seed": seed, "control": control,
            "pretrained": False, "epochs": 2, "epochs_run": 3, "val_auprc": auprc,
            "path": "unused", "history": [{"epoch": e, "train_loss": 1.0 / e, "val_auprc": auprc,
                                            "learning_rate": 0.0} for e in (1, 2, 3)]}


def test_training_table_reports_test_metrics_only_where_computed():
    summaries = [_summary("efficientnet_b0_s1", "efficientnet_b0", 1, "none", 0.9),
                 _summary("resnet34_s1", "resnet34", 1, "none", 0.95),
                 _summary("efficientnet_b0_shuffled_s1", "efficientnet_b0", 1, "shuffled_labels", 0.3)]
    test_results = pd.DataFrame({"checkpoint_id": ["efficientnet_b0_s1", "efficientnet_b0_shuffled_s1"],
                                 "n_test": [10, 10], "test_auprc": [0.8, 0.35]})
    table = training.training_table(summaries, "efficientnet_b0_s1", test_results)
    assert table["primary"].tolist() == [True, False, False]
    assert table["test_auprc"].isna().tolist() == [False, True, False]
    assert table.loc[2, "test_auprc"] == 0.35 and table.loc[1, "best_epoch"] == 2


def test_training_curves_table_and_figure():
    summaries = [_summary("efficientnet_b0_s1", "efficientnet_b0", 1, "none", 0.9),
                 _summary("efficientnet_b0_shuffled_s1", "efficientnet_b0", 1, "shuffled_labels", 0.3)]
    curves = training.training_curves(summaries)
    assert len(curves) == 6 and curves["epoch"].tolist() == [1, 2, 3, 1, 2, 3]
    fig = training_figures.plot_training_curves(curves)
    loss_ax, auprc_ax = fig.axes
    assert len(loss_ax.lines) == 2 and list(auprc_ax.lines[1].get_ydata()) == [0.3] * 3
    assert "shuffled" in auprc_ax.get_legend().get_texts()[1].get_text()
    # runs are dodged apart, never more than DODGE epochs off
    xs = [np.asarray(line.get_xdata(), float) for line in loss_ax.lines]
    assert not np.allclose(xs[0], xs[1]) and all(np.abs(x - [1, 2, 3]).max() <= training_figures.DODGE + 1e-9 for x in xs)
    # a one-epoch run is a marker without a line, in the plot and in the legend
    one_epoch = curves[curves["epoch"] == 1]
    fig = training_figures.plot_training_curves(one_epoch)
    legend = fig.axes[1].get_legend()
    assert all(handle.get_linestyle() == "None" for handle in legend.legend_handles)


@pytest.mark.parametrize("arch", ["efficientnet_b0", "resnet34", "convnext_tiny"])
def test_zero_init_head_starts_every_score_at_one_half(arch):
    from endoexplain_core.models import networks

    model = networks.build_model(arch, num_classes=2)
    head = training.zero_init_head(model)
    assert head.out_features == 2
    with torch.no_grad():
        logits = model.eval()(torch.randn(2, 3, 64, 64))
    assert torch.equal(logits, torch.zeros(2, 2))


def test_recalibrate_batchnorm_replaces_moving_averages_by_the_plain_average():
    """Hand-checkable: one BatchNorm1d over a fixed batch; its running mean/var become the batch
    mean and unbiased variance, momentum and train/eval mode are restored, no gradient is taken."""
    from torch import nn
    from endoexplain_core.models import training

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).eval()
    model[1].running_mean.fill_(5.0)   # stale statistics, as after few steps from random weights
    model[1].running_var.fill_(9.0)
    images = torch.randn(12, 3)
    loader = [(images[:6], None, None), (images[6:], None, None), (torch.randn(6, 3), None, None)]
    used = training.recalibrate_batchnorm(model, loader, 12, torch.device("cpu"))
    features = model[0](images).detach()
    halves = [features[:6], features[6:]]
    assert used == 12 and not model.training and model[1].momentum == 0.1
    # cumulative average over the two batches of their means and unbiased variances
    torch.testing.assert_close(model[1].running_mean, sum(h.mean(0) for h in halves) / 2)
    torch.testing.assert_close(model[1].running_var, sum(h.var(0, unbiased=True) for h in halves) / 2)
    assert all(p.grad is None for p in model.parameters())
    assert training.recalibrate_batchnorm(nn.Linear(3, 2), loader, 12, torch.device("cpu")) == 0


def test_epoch_snapshots_are_kept_per_epoch_and_listed_in_order(cohort, tmp_path):
    spec = _spec()
    training.seed_everything(spec.seed)
    train_set, val_set = _datasets(cohort)
    summary = training.train_checkpoint(TinyNet(), spec, train_set, val_set, SETTINGS, tmp_path,
                                        show_progress=False, keep_epoch_snapshots=True)
    snapshots = training.epoch_snapshots(tmp_path, spec.checkpoint_id)
    assert [epoch for epoch, _ in snapshots] == [1, 2, 3] == [h["epoch"] for h in summary["history"]]
    for (epoch, path), entry in zip(snapshots, summary["history"]):
        record = checkpoint.load_tree(path)
        assert record["epoch"] == epoch and record["val_auprc"] == entry["val_auprc"]
    best = checkpoint.load_tree(summary["path"])  # the best checkpoint equals its epoch's snapshot
    best_snapshot = checkpoint.load_tree(dict(snapshots)[best["epoch"]])
    assert all(torch.equal(best["state_dict"][k], best_snapshot["state_dict"][k]) for k in best["state_dict"])
    assert not list(tmp_path.glob("*.epoch*"))  # snapshots stay out of the checkpoint folder itself
    assert training.epoch_snapshots(tmp_path, "other_id") == []


def test_average_state_dicts_is_the_mean_of_floats_and_keeps_the_last_integers():
    """Hand-checkable: two snapshots of a Linear + BatchNorm1d; weights and running statistics
    are the element-wise mean, num_batches_tracked is the last snapshot's; mismatched keys and
    an empty list are refused."""
    model = nn.Sequential(nn.Linear(2, 1), nn.BatchNorm1d(1))
    first = {k: v.clone() for k, v in model.state_dict().items()}
    second = {k: v.clone() for k, v in model.state_dict().items()}
    first["0.weight"] = torch.tensor([[1.0, 2.0]])
    second["0.weight"] = torch.tensor([[3.0, 6.0]])
    first["1.running_mean"], second["1.running_mean"] = torch.tensor([0.0]), torch.tensor([1.0])
    first["1.num_batches_tracked"] = torch.tensor(3)
    second["1.num_batches_tracked"] = torch.tensor(7)
    averaged = training.average_state_dicts([first, second])
    torch.testing.assert_close(averaged["0.weight"], torch.tensor([[2.0, 4.0]]))
    torch.testing.assert_close(averaged["1.running_mean"], torch.tensor([0.5]))
    assert averaged["1.num_batches_tracked"].item() == 7
    assert averaged["1.num_batches_tracked"].dtype == torch.int64
    model.load_state_dict(averaged)    # same keys and shapes: loads strictly
    assert training.average_state_dicts([first])["0.weight"].equal(first["0.weight"])
    with pytest.raises(ValueError, match="different keys"):
        training.average_state_dicts([first, {k: v for k, v in second.items() if k != "0.bias"}])
    with pytest.raises(ValueError, match="at least one"):
        training.average_state_dicts([])
