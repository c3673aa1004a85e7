"""The preflight (run_all.sh --check) on a small synthetic data root: ready when everything is
there, and every problem listed at once (exit 2) when a dataset, a mask or a weight file is
missing. Nothing is trained or written."""

from __future__ import annotations

import shutil

import pytest

from endoexplain_core import config
from endoexplain_core.data import synthetic
from endoexplain_core.pipeline import orchestrator, preflight
from tests.test_synthetic import TINY


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight") / "data"
    synthetic.generate_cohort(root, seed=3, design=TINY)
    return root


def test_a_complete_synthetic_data_root_is_ready(data_root, tmp_path, capsys):
    code = orchestrator.main(["--profile", "smoke", "--data-root", str(data_root),
                              "--output-root", str(tmp_path), "--check"])
    out = capsys.readouterr().out
    assert code == 0 and out.rstrip().endswith("preflight: READY, nothing blocks this run")
    for seen in ("HyperKvasir: ", "labelled lower-GI images", "segmented with masks", "ETIS-LaribPolypDB: ",
                 "PolypGen: ", "PolypDB: ", "weights efficientnet_b0: from scratch", "device  cpu", "GiB free"):
        assert seen in out, seen
    assert "the paper's manifest" not in out                      # paper counts only for the paper profile
    assert not (tmp_path / "runs").exists()                       # nothing written
    # the time estimate: measured per-image costs, one line per model stage, a total
    for stage in ("01_training", "03_validity_gate", "04_spatial_audit", "06_transfer", "08_faithfulness"):
        assert f"estimate {stage}: " in out and " min (" in out, stage
    assert "forward+backward" in out and "min of model passes" in out


def test_stage_seconds_follow_the_work_counts():
    """The estimate is work x cost: doubling the audit pool doubles the audit stage's time, and
    no external case means no transfer time."""
    profile = config.load_profile("smoke")
    costs = {arch: preflight.Costs(forward=0.01, train=0.03, cams=0.02) for arch in profile.shared.architectures}
    one = preflight.stage_seconds(profile, preflight.WorkCounts(100, 20, 0), costs, decode=0.001)
    two = preflight.stage_seconds(profile, preflight.WorkCounts(100, 40, 0), costs, decode=0.001)
    assert two["04_spatial_audit"][0] == pytest.approx(2 * one["04_spatial_audit"][0])
    assert one["06_transfer"][0] == 0.0 and one["01_training"][0] > 0


def test_every_problem_is_listed_at_once_and_blocks(data_root, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(data_root, broken)
    shutil.rmtree(broken / "PolypGen")                                         # a required cohort
    masks = broken / "hyper-kvasir" / "segmented-images" / "masks"
    for mask in sorted(masks.iterdir())[:2]:
        mask.unlink()                                                          # two unpaired images
    profile = config.load_profile("smoke", overrides=["01_training.imagenet_weights={resnet34: /nowhere/r34.pth}"])
    findings = preflight.run_preflight(profile, str(broken), tmp_path / "runs" / "smoke")
    text, code = preflight.report(findings)
    blocking = {(f.area, f.item) for f in findings if f.blocks}
    assert code == 2 and "preflight: NOT READY, " in text
    assert ("data", "PolypGen") in blocking and ("data", "HyperKvasir") in blocking
    assert ("weights", "efficientnet_b0") in blocking and ("weights", "resnet34") in blocking
    assert "PolypGen not found (06_transfer external_cohorts needs it)" in text
    assert "image without a mask: 2 file(s) the run would refuse, e.g. hyper-kvasir/segmented-images/" in text
    assert "no file for efficientnet_b0" in text and "/nowhere/r34.pth" in text
    # the other datasets are still checked and reported ready
    assert ("data", "ETIS-LaribPolypDB") not in blocking and "ETIS-LaribPolypDB: " in text


def test_a_missing_data_root_and_an_absent_cuda_device_are_named(tmp_path):
    profile = config.load_profile("smoke", overrides=["shared.device=cuda"])
    findings = preflight.run_preflight(profile, str(tmp_path / "nowhere"), tmp_path / "runs")
    text, code = preflight.report(findings)
    assert code == 2 and "is not a folder" in text
    import torch
    if not torch.cuda.is_available():
        assert "asks for CUDA but torch sees no CUDA device" in text


def test_disk_estimate_counts_every_trained_model_exactly():
    """Trained models: parameters x 4 bytes x (best weights + resume state) per checkpoint; the
    paper's 10 checkpoints of three architectures dominate the run folder."""
    profile = config.load_profile("paper")
    costs = {"efficientnet_b0": preflight.Costs(0, 0, 0, parameters=1_000_000),
             "resnet34": preflight.Costs(0, 0, 0, parameters=2_000_000),
             "convnext_tiny": preflight.Costs(0, 0, 0, parameters=3_000_000)}
    disk = preflight.stage_disk_bytes(profile, preflight.WorkCounts(100, 20, 10), costs)
    models = (4 * 1e6 + 3 * 2e6 + 3 * 3e6) * 4 * preflight.CHECKPOINT_COPIES   # 3 seeds + the control
    assert disk["01_training"][0] == pytest.approx(models + preflight.RECORD_BYTES_PER_STAGE)
    browser = 30 * preflight.BROWSER_BYTES_PER_IMAGE * (256 / 128) ** 2
    assert disk["09_figures"][0] == pytest.approx(browser + preflight.RECORD_BYTES_PER_STAGE)


def test_weight_files_are_verified_against_their_torchvision_hash(tmp_path, monkeypatch):
    """A foreign file under torchvision's name is a problem; a file that matches the hash in its
    name, or a file of one's own (no hash in the name), is ready with its SHA-256 printed."""
    import hashlib

    import torch

    import torchvision

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "resnet34-b627a593.pth").write_bytes(b"truncated download")
    # weights must also load into their architecture (issue 50): real state dicts, random values
    own = tmp_path / "efficientnet_b0_mine.pth"
    torch.save(torchvision.models.get_model("efficientnet_b0", weights=None).state_dict(), own)
    torch.save(torchvision.models.get_model("resnet18", weights=None).state_dict(), tmp_path / "r18.pth")
    payload = (tmp_path / "r18.pth").read_bytes()
    named = tmp_path / f"resnet18-{hashlib.sha256(payload).hexdigest()[:8]}.pth"
    named.write_bytes(payload)
    auto = {f.item: f for f in preflight.weight_findings(["resnet34", "mobilenet_v3_large"], "auto")}
    assert auto["resnet34"].status == preflight.PROBLEM and "does not start with b627a593" in auto["resnet34"].detail
    assert auto["mobilenet_v3_large"].status == preflight.MISSING
    assert "https://download.pytorch.org/models/mobilenet_v3_large-5c1a4163.pth" in auto["mobilenet_v3_large"].detail
    given = {f.item: f for f in preflight.weight_findings(
        ["efficientnet_b0", "resnet18"], {"efficientnet_b0": str(own), "resnet18": str(named)})}
    assert given["efficientnet_b0"].status == preflight.READY and "not checked" in given["efficientnet_b0"].detail
    assert given["resnet18"].status == preflight.READY and "matches the" in given["resnet18"].detail
    assert hashlib.sha256(payload).hexdigest()[:16] in given["resnet18"].detail
