"""The case-level audit table: hand-computed rows for a crafted model, validation, bad input."""

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from endoexplain_core.methods import BASELINE_METHODS, CAM_METHODS, MAP_METHODS
from endoexplain_core.run_layout import RunLayout
from endoexplain_core.analysis import audit, audit_schema
from endoexplain_core import files

from endoexplain_core.kernels import deletion
from endoexplain_core.data.datasets import IMAGENET_MEAN, IMAGENET_STD

SIZE = 8                     # 8 x 8 images: top 20% = round(12.8) = 13 pixels
WEIGHT = 2.0                 # positive-logit weight of the crafted head
TEMPERATURE = 2.0


class CraftedModel(nn.Module):
    """probe = normalised red channel (1x1 conv); logits = (0, WEIGHT * mean(probe))."""

    def __init__(self):
        super().__init__()
        self.probe = nn.Conv2d(3, 1, kernel_size=1, bias=False)
        self.head = nn.Linear(1, 2)
        with torch.no_grad():
            self.probe.weight.copy_(torch.tensor([1.0, 0.0, 0.0]).view(1, 3, 1, 1))
            self.head.weight.copy_(torch.tensor([[0.0], [WEIGHT]]))
            self.head.bias.zero_()

    def forward(self, x):
        return self.head(self.probe(x).mean(dim=(2, 3)))


def crafted_case(sample_id="case_a"):
    """Red channel 130 + row-major index: every CAM increases with the index, peak at (7, 7)."""
    image = np.full((SIZE, SIZE, 3), 100, dtype=np.uint8)
    image[..., 0] = (130 + np.arange(SIZE * SIZE)).reshape(SIZE, SIZE)
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    mask[6:, :] = True                               # rows 6-7: flat indices 48..63
    return sample_id, image, mask


def normalised_red(image):
    return (image[..., 0].astype(np.float64) / 255 - IMAGENET_MEAN[0]) / IMAGENET_STD[0]


def run_audit(tmp_path, cases, temperature=TEMPERATURE, **kwargs):
    model = CraftedModel()
    metadata = {"checkpoint_id": "crafted_s1", "arch": "crafted", "seed": 1}
    return audit.audit_checkpoint(
        model, metadata, temperature, cases, dataset="unit", image_size=SIZE,
        table_path=tmp_path / "audit.parquet", random_deletion_path=tmp_path / "random.parquet",
        top_fraction=0.2, repetitions=4, batch_size=2, target_layer=("probe", model.probe), **kwargs)


def test_audit_rows_match_hand_computed_values(tmp_path):
    summary = run_audit(tmp_path, [crafted_case()])
    assert summary["n_audited"] == 1 and summary["n_empty_masks_excluded"] == 0
    table = audit_schema.read_audit_table(tmp_path / "audit.parquet")
    assert list(table["method"]) == list(MAP_METHODS)
    assert set(table["target"]) == {audit.TARGET} and set(table["calibration"]) == {"scaled"}

    red = normalised_red(crafted_case()[1]).ravel()
    z = WEIGHT * red.mean()                          # logit_neg is 0
    np.testing.assert_allclose(table["logit_pos"], z, rtol=1e-5)
    np.testing.assert_allclose(table["raw_score"], 1 / (1 + np.exp(-z)), rtol=1e-5)
    np.testing.assert_allclose(table["scaled_score"], 1 / (1 + np.exp(-z / TEMPERATURE)), rtol=1e-5)

    cams = table[table["method"].isin(CAM_METHODS)]
    assert (cams["peak_row"] == 7).all() and (cams["peak_col"] == 7).all()
    assert not cams["peak_outside_mask"].any()
    # Top 13 pixels = indices 51..63, mask = 48..63: IoU 13 / 16.
    np.testing.assert_allclose(cams["iou"], 13 / 16, atol=1e-6)
    np.testing.assert_allclose(table["lesion_area_fraction"], 16 / 64)
    # Gradient CAMs are (index / 63): energy share = sum(48..63) / sum(0..63) = 888 / 2016.
    gradient = table[table["method"].isin(["gradcam", "gradcampp", "xgradcam", "hirescam"])]
    np.testing.assert_allclose(gradient["energy_in_mask"], 888 / 2016, atol=1e-5)
    # Deleting indices 51..63 zeroes the red channel there: drop = WEIGHT * sum(red[51:]) / 64.
    expected_drop = WEIGHT * red[51:].sum() / 64
    np.testing.assert_allclose(cams["logit_drop"], expected_drop, rtol=1e-5)
    z_deleted = z - expected_drop
    np.testing.assert_allclose(cams["score_drop"], 1 / (1 + np.exp(-z / TEMPERATURE))
                               - 1 / (1 + np.exp(-z_deleted / TEMPERATURE)), rtol=1e-5)
    baselines = table[table["method"].isin(BASELINE_METHODS)]
    assert baselines["logit_drop"].isna().all() and baselines["score_drop"].isna().all()

    random = pd.read_parquet(tmp_path / "random.parquet")
    keep = deletion.random_deletion_masks([deletion.sample_key("case_a")], 13, SIZE, SIZE,
                                          repetitions=4, device=torch.device("cpu"))
    expected = WEIGHT * (keep[:, 0].reshape(4, -1).numpy() * red).sum(axis=1) / 64
    drops = random[[f"logit_drop_{r:02d}" for r in range(4)]].to_numpy()[0]
    np.testing.assert_allclose(drops, expected, rtol=1e-5)
    assert random["logit_drop_mean"].iloc[0] == pytest.approx(expected.mean(), rel=1e-5)


def test_empty_masks_are_excluded_and_counted(tmp_path):
    sample_id, image, _ = crafted_case("empty")
    cases = [crafted_case("a"), (sample_id, image, np.zeros((SIZE, SIZE), bool)), crafted_case("b")]
    summary = run_audit(tmp_path, cases)
    assert summary["n_audited"] == 2 and summary["excluded_sample_ids"] == ["empty"]
    assert "empty" not in set(audit_schema.read_audit_table(tmp_path / "audit.parquet")["sample_id"])


def test_bad_input_raises_and_keeps_the_previous_table(tmp_path):
    run_audit(tmp_path, [crafted_case("good")])
    before = (tmp_path / "audit.parquet").read_bytes()
    sample_id, image, mask = crafted_case("bad")
    with pytest.raises(ValueError, match="bad.*mask size"):
        run_audit(tmp_path, [crafted_case("ok"), crafted_case("ok2"), (sample_id, image, mask[:4])])
    with pytest.raises(ValueError, match="temperature"):
        run_audit(tmp_path, [crafted_case()], temperature=None)
    assert (tmp_path / "audit.parquet").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.parquet", "random.parquet"]


def valid_table():
    """Two images x every map method, every required column filled."""
    rows = []
    for sample_id, score in (("s1", 0.95), ("s2", 0.40)):
        for method in MAP_METHODS:
            rows.append({"dataset": "d", "sample_id": sample_id, "checkpoint_id": "c",
                         "method": method, "top_fraction": 0.2, "scaled_score": score})
    table = pd.DataFrame(rows)
    for column in audit_schema.REQUIRED_COLUMNS:
        if column not in table:
            table[column] = 0
    return table


@pytest.mark.parametrize("breakage, message", [
    (lambda t: t.drop(columns=["iou"]), "missing columns"),
    (lambda t: pd.concat([t, t.iloc[[0]]]), "duplicate"),
    (lambda t: t.drop(index=3), "same images"),
    (lambda t: t.assign(top_fraction=[0.2] * (len(t) - 1) + [0.1]), "mixed top fractions"),
    (lambda t: t.assign(scaled_score=[0.95] * (len(MAP_METHODS) - 1) + [0.9] + [0.4] * len(MAP_METHODS)),
     "more than one scaled score"),
    (lambda t: t.iloc[0:0], "no rows"),
])
def test_validator_rejects_each_kind_of_bad_table(breakage, message):
    audit_schema.validate_audit_table(valid_table())
    with pytest.raises(audit_schema.AuditTableError, match=message):
        audit_schema.validate_audit_table(breakage(valid_table()))


def test_a_table_without_top_fraction_is_refused_naming_the_file(tmp_path):
    """No migration shim: a table whose top fraction sits under another name is an error that
    names the file and the missing column (the audit then reruns it)."""
    path = tmp_path / "old.parquet"
    valid_table().rename(columns={"top_fraction": "threshold"}).to_parquet(path)
    with pytest.raises(audit_schema.AuditTableError, match=r"old\.parquet: missing columns \['top_fraction'\]"):
        audit_schema.read_audit_table(path)


def test_audit_is_deterministic_and_independent_of_batch_size(tmp_path):
    cases = [crafted_case(f"c{i}") for i in range(3)]
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir(), second.mkdir()
    run_audit(first, cases)
    model = CraftedModel()
    audit.audit_checkpoint(model, {"checkpoint_id": "crafted_s1", "arch": "crafted", "seed": 1},
                           TEMPERATURE, cases, dataset="unit", image_size=SIZE,
                           table_path=second / "audit.parquet",
                           random_deletion_path=second / "random.parquet", top_fraction=0.2, repetitions=4,
                           batch_size=3, target_layer=("probe", model.probe))
    pd.testing.assert_frame_equal(pd.read_parquet(first / "audit.parquet"),
                                  pd.read_parquet(second / "audit.parquet"), rtol=1e-6)
    pd.testing.assert_frame_equal(pd.read_parquet(first / "random.parquet"),
                                  pd.read_parquet(second / "random.parquet"), rtol=1e-6)


def make_run(tmp_path, size=64, n_images=3):
    """A minimal run folder: manifest with a masked pool, one registered checkpoint, T."""
    import hashlib
    from PIL import Image
    from endoexplain_core.models import checkpoint, networks, training
    from endoexplain_core.data.datasets import NORMALISATION
    run, data = tmp_path / "run", tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    rows = []
    for i in range(n_images):
        image = np.random.default_rng(i).integers(0, 256, (size, size, 3), dtype=np.uint8)
        mask = np.zeros((size, size), np.uint8)
        mask[10:30, 20:40] = 255
        Image.fromarray(image).save(data / "images" / f"m{i}.png")
        Image.fromarray(mask).save(data / "masks" / f"m{i}.png")
        rows.append({"sample_id": f"m{i}", "path": f"images/m{i}.png", "source": "polyps",
                     "target": 1, "role": "spatial_audit", "mask_path": f"masks/m{i}.png"})
    rows.append({"sample_id": "n0", "path": "images/n0.png", "source": "cecum", "target": 0,
                 "role": "train", "mask_path": ""})
    for row in rows:                     # manifest columns this test does not exercise
        row.update({"group": "g", "sha256": "0" * 64, "ahash": "0" * 64,
                    "group_id": row["sample_id"], "width": size, "height": size})
    (run / "manifest").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(run / "manifest" / "manifest.csv", index=False)
    digest = hashlib.sha256((run / "manifest" / "manifest.csv").read_bytes()).hexdigest()
    (run / "manifest" / "manifest.sha256").write_text(digest + "\n")
    (run / "checkpoints").mkdir()
    torch.manual_seed(0)
    model = networks.build_model("resnet34")
    path = run / "checkpoints" / "resnet34_s1.safetensors"
    checkpoint.save_tree({"format": training.CHECKPOINT_FORMAT, "checkpoint_id": "resnet34_s1",
                "arch": "resnet34", "seed": 1, "control": "none", "image_size": size,
                "manifest_digest": digest, "target_layer": "layer4.2",
                "normalisation": NORMALISATION, "state_dict": model.state_dict()}, path)
    pd.DataFrame([{"checkpoint_id": "resnet34_s1", "arch": "resnet34", "seed": 1,
                   "control": "none", "epochs": 1, "val_auprc": 0.5,
                   "path": "checkpoints/resnet34_s1.safetensors", "sha256": files.sha256_file(path),
                   "is_primary": True}]).to_csv(run / "checkpoints" / "registry.csv", index=False)
    (run / "calibration").mkdir()
    pd.DataFrame({"checkpoint_id": ["resnet34_s1"], "temperature": [0.5]}).to_csv(
        run / "calibration" / "temperatures.csv", index=False)
    return run, data


def test_registered_checkpoint_is_audited_then_reused(tmp_path):
    run, data = make_run(tmp_path)
    settings = dict(image_size=64, top_fraction=0.2, repetitions=2, batch_size=2, prior_negatives=48)
    first = audit.audit_registered_checkpoint(run, data, "resnet34_s1", **settings)
    assert not first["reused"] and first["n_audited"] == 3
    table = audit_schema.read_audit_table(RunLayout(run).audit_paths("hyperkvasir", "resnet34_s1")["table"])
    assert set(table["target_layer"]) == {"layer4.2"} and set(table["temperature"]) == {0.5}
    again = audit.audit_registered_checkpoint(run, data, "resnet34_s1", **settings)
    assert again["reused"]
    # One mask changes on disk (the manifest records image digests only): the audit reruns and
    # the table follows the new mask.
    from PIL import Image
    mask = np.zeros((64, 64), np.uint8)
    mask[10:50, 10:50] = 255
    Image.fromarray(mask).save(data / "masks" / "m0.png")
    redone = audit.audit_registered_checkpoint(run, data, "resnet34_s1", **settings)
    assert not redone["reused"]
    new_table = audit_schema.read_audit_table(RunLayout(run).audit_paths("hyperkvasir", "resnet34_s1")["table"])
    area = lambda t: t.loc[t["sample_id"] == "m0", "lesion_area_fraction"].iloc[0]
    assert area(new_table) > area(table)
    assert audit.audit_registered_checkpoint(run, data, "resnet34_s1", **settings)["reused"]
    changed = audit.audit_registered_checkpoint(run, data, "resnet34_s1", **{**settings, "repetitions": 3})
    assert not changed["reused"]
    with pytest.raises(KeyError, match="not in"):
        audit.audit_registered_checkpoint(run, data, "resnet34_s9", **settings)
    settings = {**settings, "repetitions": 3}
    summary = audit.audit_registry(run, data, **settings)
    assert summary["reused"].all() and summary["is_primary"].all()
    chosen = audit.audit_registry(run, data, **settings, checkpoint_ids=["resnet34_s1"])
    assert list(chosen["checkpoint_id"]) == ["resnet34_s1"]
    assert audit.audit_registry(run, data, **settings, checkpoint_ids=[]).empty
    with pytest.raises(ValueError, match="resnet34_s9"):
        audit.audit_registry(run, data, **settings, checkpoint_ids=["resnet34_s9"])
