"""Manifest datasets: preprocessing, augmentation streams, caching and decode errors."""

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from endoexplain_core import files
from endoexplain_core.data import datasets, roles

MEAN_COLOUR = np.round(np.array(datasets.IMAGENET_MEAN) * 255).astype(np.uint8)


def _write_rows(tmp_path, images):
    """Write ``{sample_id: uint8 array}`` as PNGs; return manifest-like rows."""
    rows = []
    for sample_id, array in images.items():
        relative = f"imgs/{sample_id}.png"
        (tmp_path / "imgs").mkdir(exist_ok=True)
        Image.fromarray(array).save(tmp_path / relative)
        rows.append({"sample_id": sample_id, "path": relative, "source": "polyps",
                     "target": 1, "role": "train"})
    return pd.DataFrame(rows)


def _asymmetric_image(size=40):
    image = np.zeros((size, size, 3), dtype=np.uint8)
    image[: size // 4, : size // 2] = (200, 30, 30)  # top-left block: flips move it
    return image


def test_normalisation_of_the_mean_colour_is_near_zero(tmp_path):
    rows = _write_rows(tmp_path, {"a": np.broadcast_to(MEAN_COLOUR, (48, 48, 3)).copy()})
    image, target, index = datasets.ManifestDataset(rows, tmp_path, 32)[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert (target, index) == (1, 0)
    assert image.abs().max() < 0.5 / 255 / min(datasets.IMAGENET_STD)


def test_evaluation_items_equal_resize_then_normalise(tmp_path):
    array = np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    rows = _write_rows(tmp_path, {"a": array})
    image, _, _ = datasets.ManifestDataset(rows, tmp_path, 32)[0]
    expected = datasets.to_normalised_tensor(datasets.resize_rgb(array, 32))
    assert torch.equal(image, expected)
    # Hand check of one channel value: (x / 255 - mean) / std.
    resized = datasets.resize_rgb(array, 32)
    assert image[1, 3, 4].item() == pytest.approx(
        (resized[3, 4, 1] / 255 - datasets.IMAGENET_MEAN[1]) / datasets.IMAGENET_STD[1], abs=1e-6)


def test_augmentation_is_a_function_of_seed_epoch_and_index(tmp_path):
    rows = _write_rows(tmp_path, {f"s{i}": _asymmetric_image() for i in range(3)})
    dataset = datasets.ManifestDataset(rows, tmp_path, 32, augment_seed=7)
    first = [dataset[i][0] for i in range(3)]
    again = [dataset[i][0] for i in reversed(range(3))][::-1]  # order of access must not matter
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other_epochs = []
    for epoch in range(1, 6):
        dataset.set_epoch(epoch)
        other_epochs.append(dataset[0][0])
    assert any(not torch.equal(first[0], other) for other in other_epochs)
    plain = datasets.ManifestDataset(rows, tmp_path, 32)[0][0]
    augmented_views = [first[0], *other_epochs]
    assert any(not torch.equal(plain, view) for view in augmented_views)


def test_targets_override_for_the_shuffled_control(tmp_path):
    rows = _write_rows(tmp_path, {"a": _asymmetric_image(), "b": _asymmetric_image()})
    dataset = datasets.ManifestDataset(rows, tmp_path, 32, targets=np.array([0, 1]))
    assert [dataset[i][1] for i in range(2)] == [0, 1]
    with pytest.raises(ValueError, match="3 targets for 2 rows"):
        datasets.ManifestDataset(rows, tmp_path, 32, targets=np.array([0, 1, 1]))


def test_cache_decodes_each_file_once(tmp_path, monkeypatch):
    rows = _write_rows(tmp_path, {"a": _asymmetric_image(), "b": _asymmetric_image()})
    decoded = []
    original = datasets.decode_resized
    monkeypatch.setattr(datasets, "decode_resized",
                        lambda path, size: decoded.append(path) or original(path, size))
    cache = datasets.ImageCache()
    for _ in range(3):
        dataset = datasets.ManifestDataset(rows, tmp_path, 32, augment_seed=1, cache=cache)
        for i in range(len(dataset)):
            dataset[i]
    assert len(decoded) == 2 and len(cache) == 2


def test_decode_error_names_the_file_also_inside_a_dataloader(tmp_path):
    rows = _write_rows(tmp_path, {"good": _asymmetric_image(), "bad": _asymmetric_image()})
    (tmp_path / "imgs" / "bad.png").write_bytes(b"not an image at all")
    dataset = datasets.ManifestDataset(rows, tmp_path, 32)
    dataset[0]
    with pytest.raises(datasets.ImageDecodeError, match="bad.png"):
        dataset[1]
    with pytest.raises(datasets.ImageDecodeError, match="bad.png"):
        for _ in DataLoader(dataset, batch_size=1):
            pass


def test_rows_of_roles_keeps_manifest_order():
    manifest = pd.DataFrame({"sample_id": ["007", "008", "009"], "path": ["a", "b", "c"],
                             "source": ["polyps", "cecum", "cecum"], "target": [1, 0, 0],
                             "role": ["train", "val", "train"]})
    train = datasets.rows_of_roles(manifest, ["train"])
    assert list(train["sample_id"]) == ["007", "009"] and list(train.index) == [0, 1]
    with pytest.raises(ValueError, match="unknown roles"):
        datasets.rows_of_roles(manifest, ["training"])


def test_load_manifest_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="00_roles"):
        datasets.load_manifest(tmp_path / "manifest.csv")
    columns = "sample_id,path,group,source,target,role,sha256,ahash,group_id,width,height,mask_path"
    (tmp_path / "manifest.csv").write_text(
        f"{columns}\n007,a.jpg,g,polyps,1,train,s,a,g1,8,8,\n008,b.jpg,g,cecum,0,holdout,t,b,g2,8,8,\n")
    with pytest.raises(roles.ManifestVerificationError, match="no digest file manifest.sha256"):
        datasets.load_manifest(tmp_path / "manifest.csv")
    (tmp_path / "manifest.sha256").write_text(files.sha256_file(tmp_path / "manifest.csv") + "\n")
    with pytest.raises(ValueError, match="manifest.csv has unknown roles \\['holdout'\\]"):
        datasets.load_manifest(tmp_path / "manifest.csv")
    # A hand edit after 00_roles wrote the digest (here: a role changed) is refused, naming the file.
    edited = (tmp_path / "manifest.csv").read_text().replace("holdout", "train")
    (tmp_path / "manifest.csv").write_text(edited)
    with pytest.raises(roles.ManifestVerificationError, match="manifest.csv does not match its digest"):
        datasets.load_manifest(tmp_path / "manifest.csv")
