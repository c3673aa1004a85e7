"""``endoexplain gate`` and ``endoexplain audit --gate``: one-line refusals, the lock, the
``gate.json`` record that ``verify`` checks, the daggers an audit takes from a gate folder, the
refusal of a gate made at another architecture, layer or input size, and (slow) the real gate
at tiny settings, whose models cannot learn in a few steps, so every verdict is inconclusive."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from endoexplain_core import artefacts, cli, files, gate_command
from endoexplain_core.analysis import validity_gate
from endoexplain_core.marks import DEGENERATE_MARK
from endoexplain_core.methods import CAM_METHODS, method_label
from tests.cli_fixtures import audit_arguments, write_masked_frames, write_resnet18_state_dict

DAGGER = validity_gate.DAGGER
# A gate that passes Grad-CAM only; HiResCAM is not in the table at all (not judged).
VERDICTS = {"gradcam": "passes", "gradcampp": "fails", "xgradcam": "inconclusive",
            "eigencam": "inconclusive"}


def tiny_gate_arguments(out: Path, *extra: str) -> list[str]:
    """A gate that runs in about a minute on two cores: ResNet-18 at 64 px, 2 replicates of 2
    steps, 8-frame pools, one untrained network per replicate."""
    return ["gate", "--arch", "resnet18", "--image-size", "64", "--replicates", "2",
            "--steps", "2", "--train-images", "8", "--val-images", "8", "--pool-images", "8",
            "--untrained-initialisations", "1", "--batch-size", "8", "--device", "cpu",
            "--out", str(out), *extra]


def write_gate_folder(folder: Path, verdicts: dict[str, str], *, arch: str = "resnet18",
                      layer: str = "layer4.1", image_size: int = 64) -> Path:
    """A gate folder with the given verdicts, committed by the command's own record writer
    (``cli.commit_outputs`` with ``gate.json``), so that the marking is tested on known
    verdicts instead of what a few training steps happen to give."""
    folder.mkdir(parents=True, exist_ok=True)
    staging = cli.staging_folder(folder)
    gate = pd.DataFrame({"method": list(verdicts) + ["random", "centre"],
                         "label": [method_label(m) for m in verdicts] + ["Random", "Centre"],
                         "verdict": list(verdicts.values()) + ["fails", "fails"],
                         "passes": [v == "passes" for v in verdicts.values()] + [False, False],
                         "reason": "constructed for the test"})
    artefacts.save_table(gate, gate_command.GATE_TABLE, staging)
    record = {"command": "endoexplain gate", "arch": arch, "target_layer": layer,
              "image_size": image_size, "verdicts": verdicts, "replicate_seeds": [1, 2, 3],
              "steps": 160, "init_weights_sha256": None}
    cli.commit_outputs(staging, folder, record, cli.GATE_RECORD_NAME)
    shutil.rmtree(staging)   # the command removes its emptied staging folder the same way
    return folder


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    """6 masked frames and a ResNet-18 state dict centred on them."""
    root = tmp_path_factory.mktemp("gate_cli")
    images, masks = write_masked_frames(root, n=6)
    weights = write_resnet18_state_dict(root / "resnet18.pt", centre_on=images)
    return {"root": root, "images": images, "masks": masks, "weights": weights}


@pytest.fixture(scope="module")
def audits(frames):
    """The same audit without a gate and with a gate folder of ``VERDICTS``."""
    root = frames["root"]
    gate = write_gate_folder(root / "gate", VERDICTS)
    plain, gated = root / "audit_plain", root / "audit_gated"
    fast = ("--repetitions", "1", "--bootstrap-replicates", "100")
    assert cli.main(audit_arguments(frames["images"], frames["masks"], frames["weights"], plain, *fast)) == 0
    assert cli.main(audit_arguments(frames["images"], frames["masks"], frames["weights"], gated, *fast,
                                    "--gate", str(gate))) == 0
    return {"gate": gate, "plain": plain, "gated": gated}


def only_line(text: str, command: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"endoexplain {command}: "), text
    return lines[0]


# ----------------------------------------------------------------------------- gate refusals


@pytest.mark.parametrize("change, message", [
    (("--arch", "vgg16"), "unknown architecture 'vgg16'"),
    (("--target-layer", "layer9"), "target layer 'layer9' is not a module"),
    (("--replicates", "1"), "--replicates must be at least 2"),
    (("--methods", "gradcam", "scorecam"), "unknown --methods ['scorecam']"),
    (("--steps", "0"), "--steps:"),
    (("--image-size", "16"), "gives a 1x1 feature grid"),
])
def test_gate_refuses_bad_options_in_one_line_and_writes_nothing(tmp_path, capsys, change, message):
    out = tmp_path / "gate"
    arguments = tiny_gate_arguments(out)
    option = change[0]
    if option in arguments:
        at = arguments.index(option)
        arguments[at:at + 2] = change
    else:
        arguments += change
    assert cli.main(arguments) == 2
    assert message in only_line(capsys.readouterr().err, "gate")
    assert not out.exists()


def test_gate_refuses_out_that_is_a_file_holds_an_audit_or_contains_its_weights(tmp_path, capsys, frames):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert cli.main(tiny_gate_arguments(a_file)) == 2
    assert "is a file, not a folder" in only_line(capsys.readouterr().err, "gate")
    audit_folder = tmp_path / "audit"
    audit_folder.mkdir()
    (audit_folder / cli.RECORD_NAME).write_text("{}")
    assert cli.main(tiny_gate_arguments(audit_folder)) == 2
    assert "holds an audit (audit.json)" in only_line(capsys.readouterr().err, "gate")
    assert cli.main(tiny_gate_arguments(frames["root"], "--init-weights", str(frames["weights"]))) == 2
    assert "contains the --init-weights file" in only_line(capsys.readouterr().err, "gate")


def test_gate_refuses_init_weights_of_another_architecture(tmp_path, capsys, frames):
    arguments = tiny_gate_arguments(tmp_path / "gate", "--init-weights", str(frames["weights"]))
    arguments[arguments.index("resnet18")] = "resnet34"
    assert cli.main(arguments) == 2
    assert "do not fit a 2-class resnet34" in only_line(capsys.readouterr().err, "gate")
    assert not (tmp_path / "gate").exists()


def test_gate_refuses_a_locked_folder_and_leaves_it_as_it_was(tmp_path, capsys):
    out = tmp_path / "gate"
    out.mkdir()
    with files.exclusive_lock(out / cli.LOCK_NAME, 0.0):    # an audit or gate writing here
        assert cli.main(tiny_gate_arguments(out)) == 2
    assert "another endoexplain gate or audit is writing into" in only_line(capsys.readouterr().err, "gate")
    assert not list(out.glob(".staging-*")) and not (out / cli.GATE_RECORD_NAME).exists()


# ----------------------------------------------------------------------------- the record


def test_verify_checks_a_gate_folder_against_gate_json(tmp_path, capsys):
    gate = write_gate_folder(tmp_path / "gate", VERDICTS)
    assert cli.verify_folder(gate) == []
    assert cli.main(["verify", str(gate)]) == 0
    assert re.search(r"\d+ files match .*gate\.json", capsys.readouterr().out)
    (gate / "table_validity_gate.csv").write_text("method,passes\ngradcam,True\n")
    assert cli.verify_folder(gate) == ["table_validity_gate.csv: changed since the gate wrote it"]
    (gate / cli.RECORD_NAME).write_text("{}")
    assert "holds both audit.json and gate.json" in cli.verify_folder(gate)[0]


def test_estimate_counts_three_trained_models_per_replicate_and_every_pool_audit():
    section = gate_command.gate_settings(gate_command_args(steps=100, replicates=3)).section
    one_step = gate_command.estimate_seconds(section, 1.0, 0.0)
    assert one_step == pytest.approx(3 * (3 * 100 + (3 * math.ceil((192 + 48 + 128) / 16)
                                                      + 4 * math.ceil((192 + 48) / 16)) / 3))
    assert gate_command.estimate_seconds(section, 0.0, 1.0) == pytest.approx(3 * 7 * 64)


def gate_command_args(**values):
    parsed = cli.build_parser().parse_args(["gate", "--arch", "resnet18", "--out", "unused"])
    for key, value in values.items():
        setattr(parsed, key, value)
    return parsed


def test_init_weights_start_every_layer_but_the_zeroed_head():
    state = {k: v + 1.0 if v.is_floating_point() else v
             for k, v in validity_gate.networks.build_model("resnet18").state_dict().items()}
    model = validity_gate.initial_gate_model("resnet18", 3, state)
    for key, value in model.state_dict().items():
        expected = torch.zeros_like(value) if key.startswith("fc.") else state[key]
        assert torch.equal(value, expected), key


# ----------------------------------------------------------------------------- audit --gate


def test_audit_with_gate_daggers_every_method_the_gate_did_not_pass(audits):
    summary = pd.read_csv(audits["gated"] / "table4_summary.csv")
    cams = summary[summary["method"].isin(CAM_METHODS)]
    for method, label, verdict in zip(cams["method"], cams["label"], cams["validity_gate"]):
        assert verdict == VERDICTS.get(method, "not run")
        # a method whose maps are degenerate on this toy model also carries the section mark
        assert label.removesuffix(DEGENERATE_MARK).endswith(DAGGER) == (method != "gradcam"), (method, label)
    formatted = (audits["gated"] / "table4_summary_formatted.md").read_text()
    assert f"Grad-CAM++{DAGGER}" in formatted and f"HiResCAM{DAGGER}" in formatted
    # Grad-CAM (passes) has no dagger, with or without the degenerate-maps mark of this toy model
    assert any(f"| Grad-CAM{mark} |" in formatted for mark in ("", DEGENERATE_MARK))
    assert f"| Grad-CAM{DAGGER}" not in formatted
    assert "not validated by the planted-truth gate" in formatted   # the dagger's footnote
    record = json.loads((audits["gated"] / "audit.json").read_text())["validity_gate"]
    assert record["not_validated"] == [m for m in CAM_METHODS if m != "gradcam"]
    assert record["gate_json_sha256"] == files.sha256_file(audits["gate"] / "gate.json")
    first = re.search(r"<body>\s*<p[^>]*>(.*?)</p>", (audits["gated"] / "report.html").read_text(), re.S)
    assert "validated Grad-CAM; not validated (&dagger;): Grad-CAM++, XGrad-CAM, HiResCAM" in first.group(1)
    assert cli.verify_folder(audits["gated"]) == []


def test_audit_without_gate_says_first_that_no_method_is_validated(audits):
    page = (audits["plain"] / "report.html").read_text()
    first = re.search(r"<body>\s*<p[^>]*>(.*?)</p>", page, re.S).group(1)
    assert "No method is validated" in first and "endoexplain gate --arch resnet18" in first
    summary = pd.read_csv(audits["plain"] / "table4_summary.csv")
    assert not summary["label"].str.contains(DAGGER).any()
    record = json.loads((audits["plain"] / "audit.json").read_text())["validity_gate"]
    assert record["folder"] is None and record["not_validated"] == list(CAM_METHODS)


@pytest.mark.parametrize("made_at, named", [
    ({"image_size": 128}, "input size 128 (this audit: 64)"),
    ({"arch": "resnet34"}, "architecture 'resnet34' (this audit: 'resnet18')"),
    ({"layer": "layer3.1"}, "target layer 'layer3.1' (this audit: 'layer4.1')"),
])
def test_audit_refuses_a_gate_made_at_another_size_layer_or_architecture(tmp_path, capsys, frames,
                                                                          made_at, named):
    gate = write_gate_folder(tmp_path / "gate", VERDICTS, **made_at)
    out = tmp_path / "audit"
    assert cli.main(audit_arguments(frames["images"], frames["masks"], frames["weights"], out,
                                    "--gate", str(gate))) == 2
    line = only_line(capsys.readouterr().err, "audit")
    assert "was made at another" in line and named in line
    assert not out.exists()


def test_audit_refuses_a_gate_folder_that_does_not_verify(tmp_path, capsys, frames):
    gate = write_gate_folder(tmp_path / "gate", VERDICTS)
    (gate / "table_validity_gate.csv").write_text("method,passes\ngradcam,True\n")
    arguments = audit_arguments(frames["images"], frames["masks"], frames["weights"],
                                tmp_path / "audit", "--gate", str(gate))
    assert cli.main(arguments) == 2
    assert "does not match its gate.json: table_validity_gate.csv: changed" in only_line(
        capsys.readouterr().err, "audit")
    (gate / "gate.json").unlink()
    assert cli.main(arguments) == 2
    assert "has no gate.json" in only_line(capsys.readouterr().err, "audit")


# ----------------------------------------------------------------------------- the real gate


@pytest.mark.slow
def test_gate_states_its_cost_then_writes_verdicts_that_audit_gate_marks(tmp_path, capsys, frames):
    """The real gate at tiny settings (about a minute on two cores): two steps cannot train a
    ResNet-18, so no replicate meets the accuracy rule and every verdict is inconclusive; the
    audit that reads the folder daggers all five methods."""
    out = tmp_path / "gate"
    assert cli.main(tiny_gate_arguments(out)) == 0
    err = capsys.readouterr().err
    assert re.search(r"one training step [0-9.]+ s, pool audit [0-9.]+ s per frame: estimated", err)
    assert err.index("estimated") < err.index("gate replicate 1/2")   # the cost comes first
    assert cli.verify_folder(out) == [] and cli.main(["verify", str(out)]) == 0
    record = json.loads((out / "gate.json").read_text())
    assert (record["arch"], record["target_layer"], record["image_size"]) == ("resnet18", "layer4.1", 64)
    assert record["replicate_seeds"] == [1, 2] and record["estimated_seconds"] > 0
    gate = validity_gate.read_gate_table(out)
    assert set(gate.loc[gate["method"].isin(CAM_METHODS), "verdict"]) <= set(validity_gate.VERDICTS)
    assert record["verdicts"] == {m: v for m, v in zip(gate["method"], gate["verdict"])
                                  if m in CAM_METHODS}
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 1 and "<h2>Clauses</h2>" in page
    assert sorted(p.name for p in (out / "replicates").iterdir()) == ["seed_1", "seed_2"]

    audited = tmp_path / "audit"
    assert cli.main(audit_arguments(frames["images"], frames["masks"], frames["weights"], audited,
                                    "--repetitions", "1", "--bootstrap-replicates", "100",
                                    "--gate", str(out))) == 0
    summary = pd.read_csv(audited / "table4_summary.csv")
    for method, label in zip(summary["method"], summary["label"]):
        if method in CAM_METHODS:
            assert label.removesuffix(DEGENERATE_MARK).endswith(DAGGER) == (record["verdicts"][method] != "passes")


def test_example_maps_show_the_first_replicate_whose_models_learned():
    """The default-size ResNet-18 gate at 128 px: replicate 1's shortcut model stayed at chance
    and replicate 2's shuffled control reached 0.81, so its figure showed a model that did not
    learn; now it shows replicate 3, and says so when no replicate learned."""
    assert gate_command.example_replicate([3], [1, 2, 3]) == (3, "replicate 3")
    assert gate_command.example_replicate([2, 3], [1, 2, 3]) == (2, "replicate 2")
    seed, title = gate_command.example_replicate([], [1, 2])
    assert seed == 1 and "no replicate's models all passed the accuracy rule" in title
