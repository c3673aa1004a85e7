"""The shared pretraining trunk (models.pretraining): what it reads, what it writes, reuse and
refusals, and fine-tuning from it (training.train_matrix_unit's initial_state)."""

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from endoexplain_core.models import checkpoint, networks, pretraining, training

IMAGE_SIZE = 32
DIGEST = "cd" * 32
SETTINGS = training.TrainingSettings(epochs=1, batch_size=8, learning_rate=1e-3, warmup_steps=1,
                                     max_steps_per_epoch=2, eval_batch_size=16,
                                     batchnorm_recalibration_images=8)
COLOURS = {"cecum": (150, 60, 50), "dyed-resection-margins": (40, 60, 170)}


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """36 images: train negatives of two colour-coded categories, train positives (polyps),
    and validation / audit images the pretext must never read."""
    root = tmp_path_factory.mktemp("pretext")
    rng = np.random.default_rng(1)
    rows = []
    for i in range(36):
        role = "train" if i < 24 else ("val" if i < 32 else "spatial_audit")
        target = int(i % 3 == 0)
        source = "polyps" if target else ("cecum" if i % 2 else "dyed-resection-margins")
        colour = (200, 190, 80) if target else COLOURS[source]
        image = np.clip(rng.normal(colour, 12, (40, 40, 3)), 0, 255).astype(np.uint8)
        path = f"frames/{role}/img{i:03d}.png"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / path)
        rows.append({"sample_id": f"img{i:03d}", "path": path, "target": target, "role": role,
                     "source": source})
    return root, pd.DataFrame(rows)


def test_pretext_reads_only_the_training_negatives(cohort):
    _, manifest = cohort
    rows, classes = pretraining.pretext_rows(manifest)
    assert classes == ["cecum", "dyed-resection-margins"]          # sorted: index = position
    assert set(rows["role"]) == {"train"} and set(rows["target"]) == {0}
    assert len(rows) == int(((manifest["role"] == "train") & (manifest["target"] == 0)).sum())


def test_pretext_with_one_category_is_refused(cohort):
    _, manifest = cohort
    one = manifest[manifest["source"] != "cecum"]
    with pytest.raises(ValueError, match="at least two source categories.*dyed-resection-margins"):
        pretraining.pretext_rows(one)


def _trunk(cohort, path, seed=3):
    root, manifest = cohort
    return pretraining.pretrain_trunk(manifest, root, path, manifest_digest=DIGEST,
                                      image_size=IMAGE_SIZE, arch="resnet18", seed=seed,
                                      settings=SETTINGS, show_progress=False)


def test_trunk_is_a_two_class_state_dict_with_a_zero_head_and_is_reused(cohort, tmp_path):
    first = _trunk(cohort, tmp_path / "trunk.safetensors")
    assert not first["reused"] and first["classes"] == ["cecum", "dyed-resection-margins"]
    assert 0.0 <= first["history"][-1]["train_accuracy"] <= 1.0
    state = pretraining.load_trunk(first["path"], arch="resnet18", image_size=IMAGE_SIZE,
                                   manifest_digest=DIGEST)
    model = networks.build_model("resnet18")
    model.load_state_dict(state, strict=True)                      # fits a 2-class ResNet-18
    assert torch.count_nonzero(model.fc.weight) == 0 and torch.count_nonzero(model.fc.bias) == 0
    written = (tmp_path / "trunk.safetensors").read_bytes()
    again = _trunk(cohort, tmp_path / "trunk.safetensors")
    assert again["reused"] and (tmp_path / "trunk.safetensors").read_bytes() == written


def test_trunk_is_deterministic_and_depends_on_its_seed(cohort, tmp_path):
    one = _trunk(cohort, tmp_path / "a.safetensors")
    two = _trunk(cohort, tmp_path / "b.safetensors")
    other = _trunk(cohort, tmp_path / "c.safetensors", seed=4)
    states = [checkpoint.load_tree(r["path"])["state_dict"] for r in (one, two, other)]
    weight = "layer1.0.conv1.weight"
    assert torch.equal(states[0][weight], states[1][weight])
    assert not torch.equal(states[0][weight], states[2][weight])


def test_a_trunk_of_another_architecture_size_or_manifest_is_refused(cohort, tmp_path):
    path = _trunk(cohort, tmp_path / "trunk.safetensors")["path"]
    with pytest.raises(training.CheckpointMismatchError, match="trunk.safetensors.*arch 'resnet18'"):
        pretraining.load_trunk(path, arch="efficientnet_b0", image_size=IMAGE_SIZE)
    with pytest.raises(training.CheckpointMismatchError, match="image_size 32 \\(expected 64\\)"):
        pretraining.load_trunk(path, arch="resnet18", image_size=64)
    with pytest.raises(training.CheckpointMismatchError, match="manifest_digest"):
        pretraining.load_trunk(path, arch="resnet18", image_size=IMAGE_SIZE, manifest_digest="ef" * 32)


def test_fine_tuning_starts_from_the_trunk(cohort, tmp_path):
    """A checkpoint fine-tuned from the trunk is marked pretrained, and with a learning rate of
    zero its trunk weights are the trunk's (only the head's zero start and BatchNorm statistics
    are its own); ImageNet weights and a trunk together are refused."""
    root, manifest = cohort
    state = pretraining.load_trunk(_trunk(cohort, tmp_path / "trunk.safetensors")["path"],
                                   arch="resnet18", image_size=IMAGE_SIZE)
    frozen = SETTINGS.model_copy(update={"learning_rate": 0.0, "weight_decay": 0.0})
    summary = training.train_matrix_unit(manifest, root, tmp_path / "run", DIGEST, IMAGE_SIZE,
                                         "resnet18", 1129, training.CONTROL_NONE, frozen,
                                         show_progress=False, initial_state=state)
    model, metadata = training.load_model(summary["path"], DIGEST, IMAGE_SIZE)
    assert metadata["pretrained"] is True
    assert torch.equal(model.state_dict()["layer1.0.conv1.weight"], state["layer1.0.conv1.weight"])
    scratch = training.train_matrix_unit(manifest, root, tmp_path / "scratch", DIGEST, IMAGE_SIZE,
                                         "resnet18", 1129, training.CONTROL_NONE, frozen,
                                         show_progress=False)
    assert training.load_model(scratch["path"], DIGEST, IMAGE_SIZE)[1]["pretrained"] is False
    with pytest.raises(ValueError, match="ImageNet weights or from a trunk, not both"):
        training.train_matrix_unit(manifest, root, tmp_path / "both", DIGEST, IMAGE_SIZE,
                                   "resnet18", 1129, training.CONTROL_NONE, frozen,
                                   imagenet_weights={"resnet18": str(tmp_path / "trunk.safetensors")},
                                   show_progress=False, initial_state=state)
