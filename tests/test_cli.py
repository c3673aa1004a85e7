"""``endoexplain audit``: outputs, the same kernels as the notebooks, refusals with exit code 2,
safe weight loading, the HTML report in headless Chromium, and no network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from endoexplain_core import cli
from endoexplain_core.analysis import audit, audit_schema
from endoexplain_core.data.imageio import read_image_and_mask
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS
from endoexplain_core.models import networks
from tests import no_network
from tests.cli_fixtures import audit_arguments, write_masked_frames, write_resnet18_state_dict

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """20 masked frames, a ResNet-18 state dict, and one audit of them run with sockets blocked."""
    root = tmp_path_factory.mktemp("cli")
    images, masks = write_masked_frames(root)
    weights = write_resnet18_state_dict(root / "resnet18.pt", centre_on=images)
    out = root / "out"
    no_network.block_network()
    try:
        code = cli.main(audit_arguments(images, masks, weights, out))
    finally:
        no_network.unblock_network()
    assert code == 0
    return {"root": root, "images": images, "masks": masks, "weights": weights, "out": out}


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "endoexplain_core", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_audit_writes_case_table_summary_figure_and_report(demo):
    out = demo["out"]
    for name in ("case_table.parquet", "random_deletion.parquet", "table4_summary.csv",
                 "table4_summary_formatted.md", "map_ties.csv", "case_figure.png",
                 "case_figure.pdf", "case_figure_iou_check.csv", "map_degeneracy.csv", "audit.json",
                 "report.html"):
        assert (out / name).is_file(), name
    table = audit_schema.read_audit_table(out / "case_table.parquet")
    assert len(table) == 20 * len(MAP_METHODS)
    assert set(table["method"]) == set(MAP_METHODS)
    assert (table["target_layer"] == "layer4.1").all() and (table["arch"] == "resnet18").all()
    record = json.loads((out / "audit.json").read_text())
    assert record["n_audited"] == 20 and record["n_empty_masks_excluded"] == 0
    assert record["n_high_score"] > 0
    # the audited maps are checked: the record names exactly the methods its table flags
    degeneracy = pd.read_csv(out / "map_degeneracy.csv")
    assert set(degeneracy["method"]) == set(CAM_METHODS)
    assert record["degenerate_methods"] == list(degeneracy.loc[degeneracy["degenerate"], "method"])
    selected = [s for s in record["selected_cases"].values() if s]
    summary = pd.read_csv(out / "table4_summary.csv")
    assert set(summary["panel"]) == {"A", "B"}
    panel_b = summary[summary["panel"] == "B"].set_index("method")
    assert (panel_b["n"] == 20).all()
    # The summary's peak failure of panel B is the case table's mean, inside its CI.
    failure = table[table["method"] == "gradcam"]["peak_outside_mask"].mean()
    assert panel_b.loc["gradcam", "peak_failure"] == pytest.approx(failure)
    assert panel_b.loc["gradcam", "peak_failure_ci_low"] <= failure <= panel_b.loc["gradcam", "peak_failure_ci_high"]
    check = pd.read_csv(out / "case_figure_iou_check.csv")
    assert sorted(check["sample_id"].unique()) == sorted(selected)
    if selected:
        assert (check["rendered_iou"] - check["table_iou"]).abs().max() < 2e-3


def test_case_table_is_the_notebook_audit_of_the_same_cases(demo, tmp_path):
    """No second implementation: audit_checkpoint on the same pairs gives the same rows."""
    model = torchvision_resnet18(demo["weights"])
    cases = cli.pair_by_stem(demo["images"], demo["masks"], "_mask")
    reference = tmp_path / "reference.parquet"
    audit.audit_checkpoint(model, {"checkpoint_id": "resnet18", "arch": "resnet18", "seed": -1},
                           0.005, ((c.sample_id, *read_image_and_mask(c.image_path, c.mask_path))
                                  for c in cases),
                           dataset="own", image_size=64, table_path=reference,
                           random_deletion_path=tmp_path / "deletion.parquet", top_fraction=0.2,
                           repetitions=3, batch_size=16)   # the CLI's --batch-size default
    ours = pd.read_parquet(demo["out"] / "case_table.parquet")
    theirs = pd.read_parquet(reference)
    pd.testing.assert_frame_equal(ours, theirs)


def torchvision_resnet18(weights: Path):
    model = networks.build_model("resnet18", num_classes=2)
    model.load_state_dict(torch.load(weights, weights_only=True))
    return model.eval()


def test_pairing_by_stem_and_unpaired_files_are_listed(tmp_path):
    images, masks = write_masked_frames(tmp_path, n=4)
    cases = cli.pair_by_stem(images, masks, "_mask")
    assert [c.sample_id for c in cases] == ["frame00", "frame01", "frame02", "frame03"]
    assert [c.image_path.suffix for c in cases] == [".jpg", ".png", ".tif", ".jpg"]
    (masks / "frame01_mask.png").unlink()
    (masks / "stray_mask.png").write_bytes((masks / "frame00_mask.png").read_bytes())
    with pytest.raises(cli.CommandError, match=r"1 image\(s\) without a mask.*frame01.png.*"
                                               r"1 mask\(s\) without an image.*stray_mask.png"):
        cli.pair_by_stem(images, masks, "_mask")
    with pytest.raises(cli.CommandError, match="Pass --mask-suffix"):
        cli.pair_by_stem(images, masks, "")


def one_line_refusal(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_unpaired_folder_exits_2_with_one_line(demo, tmp_path):
    masks = tmp_path / "masks"
    masks.mkdir()
    for path in sorted(demo["masks"].iterdir())[:-2]:
        (masks / path.name).write_bytes(path.read_bytes())
    result = run_cli(*audit_arguments(demo["images"], masks, demo["weights"], tmp_path / "out"))
    one_line_refusal(result, "unpaired files", "2 image(s) without a mask", "frame18.jpg")
    assert not (tmp_path / "out").exists()


def test_malicious_checkpoint_is_refused_without_running_its_code(demo, tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    state = torch.load(demo["weights"], weights_only=True)
    torch.save({"state_dict": state, "extra": Payload()}, evil)
    result = run_cli(*audit_arguments(demo["images"], demo["masks"], evil, tmp_path / "out"))
    one_line_refusal(result, str(evil), "refused", "run code")
    assert not marker.exists()


def test_unknown_architecture_exits_2_with_one_line(demo, tmp_path):
    arguments = audit_arguments(demo["images"], demo["masks"], demo["weights"], tmp_path / "out")
    arguments[arguments.index("resnet18")] = "vgg_mystery"
    one_line_refusal(run_cli(*arguments), "unknown architecture 'vgg_mystery'", "resnet18")


def test_weights_that_do_not_fit_the_architecture_are_refused(demo, tmp_path):
    arguments = audit_arguments(demo["images"], demo["masks"], demo["weights"], tmp_path / "out")
    arguments[arguments.index("resnet18")] = "resnet34"
    with pytest.raises(cli.CommandError, match="do not fit a 2-class resnet34"):
        cli.run_audit(cli.build_parser().parse_args(arguments))


def test_safetensors_torchscript_and_wrapped_weights_load_the_same_model(demo, tmp_path):
    state = torch.load(demo["weights"], weights_only=True)
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "w.safetensors")
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "wrapped.pth")
    reference = torchvision_resnet18(demo["weights"])
    torch.jit.script(reference).save(str(tmp_path / "scripted.pt"))
    probe = torch.randn(2, 3, 64, 64)
    expected = reference(probe)
    for path, scripted in ((tmp_path / "w.safetensors", False), (tmp_path / "wrapped.pth", False),
                           (tmp_path / "scripted.pt", True)):
        model, _ = cli.load_user_model("resnet18", path, torchscript=scripted)
        assert torch.equal(model(probe), expected), path.name
    swapped, _ = cli.load_user_model("resnet18", demo["weights"], positive_class=0)
    assert torch.equal(swapped(probe), expected.flip(1))


def test_temperature_from_calibration_logits(tmp_path):
    rng = np.random.default_rng(3)
    target = rng.integers(0, 2, 400)
    z = (2 * target - 1) * 3.0 + rng.normal(0, 2, 400)
    pd.DataFrame({"logit_neg": 0.0, "logit_pos": z, "target": target}).to_csv(tmp_path / "v.csv", index=False)
    temperature, note = cli.resolve_temperature(None, str(tmp_path / "v.csv"))
    from endoexplain_core.analysis import calibration
    assert temperature == pytest.approx(calibration.fit_temperature(z, target))
    assert "400 validation logits" in note
    assert cli.resolve_temperature(None, None)[0] == 1.0
    with pytest.raises(cli.CommandError, match="> 0"):
        cli.resolve_temperature(-1.0, None)


def test_help_reads_like_a_cli():
    top = run_cli("--help")
    assert top.returncode == 0 and "audit" in top.stdout
    sub = run_cli("audit", "--help")
    assert sub.returncode == 0
    for fragment in ("--arch ARCH", "--weights FILE", "--mask-suffix", "--temperature T",
                     "--calibration-logits CSV", "exit codes", "resnet18", "weights_only=True"):
        assert fragment in sub.stdout, fragment


def test_methods_filter_the_summary_but_not_the_case_table(demo, tmp_path):
    out = tmp_path / "out"
    assert cli.main(audit_arguments(demo["images"], demo["masks"], demo["weights"], out,
                                    "--methods", "gradcam", "eigencam", "--report", "none")) == 0
    summary = pd.read_csv(out / "table4_summary.csv")
    shown = set(summary["method"]) & set(CAM_METHODS)
    assert shown == {"gradcam", "eigencam"}
    assert set(pd.read_parquet(out / "case_table.parquet")["method"]) == set(MAP_METHODS)
    assert not (out / "report.html").exists()
    with pytest.raises(SystemExit):
        cli.main(["audit", "--help-me"])
    assert cli.main(audit_arguments(demo["images"], demo["masks"], demo["weights"], out,
                                    "--methods", "gradcam", "magic")) == 2


def test_report_is_self_contained(demo):
    page = (demo["out"] / "report.html").read_text()
    assert "data:image/png;base64," in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "Grad-CAM" in page and "Eigen-CAM*" in page and "layer4.1" in page


@pytest.mark.browser
def test_report_renders_in_chromium_with_its_figure(demo):
    from tests.browser import broken_resources, render_in_chromium

    report = render_in_chromium(demo["out"] / "report.html")
    assert not broken_resources(report), broken_resources(report)
    assert len(report["images"]) == 1 and report["images"][0]["ok"]
    assert report["images"][0]["src"].startswith("data:image/png;base64,")
    assert len(report["links"]) >= 10
