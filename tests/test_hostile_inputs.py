"""``endoexplain audit`` against careless and hostile inputs: one table of cases, each with the
input, the expected exit code and a word the one-line message must contain.

Every refusal is exit 2 with one line on stderr, before any output is written; nothing the user
already had is touched. The table runs the command in this process (``cli.main``), on six
64-px frames and a seeded ResNet-18 state dict built locally. Below it: the output folder's
lock (in-process, and two real audit processes ordered by ``tests/gated_audit.py``), odd file
names, and a full disk while the case figure is written.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from filelock import FileLock
from PIL import Image

from endoexplain_core import artefacts, cli, files, presentation
from tests.cli_fixtures import audit_arguments, write_masked_frames, write_resnet18_state_dict


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    images, masks = write_masked_frames(root, n=6)
    weights = write_resnet18_state_dict(root / "resnet18.pt", centre_on=images)
    return {"root": root, "images": images, "masks": masks, "weights": weights}


def _copy_inputs(inputs, tmp_path):
    images, masks = tmp_path / "frames", tmp_path / "masks"
    shutil.copytree(inputs["images"], images)
    shutil.copytree(inputs["masks"], masks)
    return images, masks


def _state(inputs):
    return torch.load(inputs["weights"], weights_only=True)


def _first_mask(masks: Path) -> Path:
    return sorted(masks.iterdir())[0]


# Each builder gets (inputs, tmp_path) and returns the argument list; it may write files.
def masks_are_the_images_folder(inputs, tmp_path):
    return audit_arguments(inputs["images"], inputs["images"], inputs["weights"], tmp_path / "out")


def masks_are_byte_copies_of_the_images(inputs, tmp_path):
    masks = tmp_path / "masks"
    masks.mkdir()
    for image in inputs["images"].iterdir():
        shutil.copy(image, masks / f"{image.stem}_mask{image.suffix}")
    return audit_arguments(inputs["images"], masks, inputs["weights"], tmp_path / "out")


def out_is_the_masks_folder(inputs, tmp_path):
    images, masks = _copy_inputs(inputs, tmp_path)
    return audit_arguments(images, masks, inputs["weights"], masks)


def out_is_inside_the_images_folder(inputs, tmp_path):
    images, masks = _copy_inputs(inputs, tmp_path)
    return audit_arguments(images, masks, inputs["weights"], images / "audit")


def out_contains_the_inputs(inputs, tmp_path):
    images, masks = _copy_inputs(inputs, tmp_path)
    return audit_arguments(images, masks, inputs["weights"], tmp_path)


def out_is_a_file(inputs, tmp_path):
    (tmp_path / "out").write_text("a user's notes")
    return audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], tmp_path / "out")


def _with_value(inputs, tmp_path, option: str, value: str) -> list[str]:
    """The fixture's command line with ``option``'s value replaced."""
    arguments = audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], tmp_path / "out")
    arguments[arguments.index(option) + 1] = value
    return arguments


def image_size_too_small_for_the_network(inputs, tmp_path):
    return _with_value(inputs, tmp_path, "--image-size", "2")


def image_size_gives_a_one_cell_grid(inputs, tmp_path):
    return _with_value(inputs, tmp_path, "--image-size", "32")


def target_layer_is_not_a_feature_map(inputs, tmp_path):
    return audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], tmp_path / "out",
                           "--target-layer", "fc")


def temperature_is_infinite(inputs, tmp_path):
    return _with_value(inputs, tmp_path, "--temperature", "inf")


def calibration_csv_is_binary(inputs, tmp_path):
    arguments = audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], tmp_path / "out")
    at = arguments.index("--temperature")
    del arguments[at:at + 2]
    (tmp_path / "logits.csv").write_bytes(bytes(range(256)) * 4)
    return arguments + ["--calibration-logits", str(tmp_path / "logits.csv")]


def _weights_with(inputs, tmp_path, change):
    state = _state(inputs)
    change(state)
    path = tmp_path / "changed.pt"
    torch.save(state, path)
    return audit_arguments(inputs["images"], inputs["masks"], path, tmp_path / "out")


def weights_hold_nan(inputs, tmp_path):
    return _weights_with(inputs, tmp_path, lambda s: s["layer1.0.conv1.weight"].view(-1)[0].fill_(float("nan")))


def bias_is_infinite(inputs, tmp_path):
    return _weights_with(inputs, tmp_path, lambda s: s["fc.bias"].fill_(float("inf")))


def weights_are_integers(inputs, tmp_path):
    return _weights_with(inputs, tmp_path, lambda s: s.update({"fc.weight": s["fc.weight"].round().to(torch.int64)}))


def _crafted_safetensors(inputs, tmp_path, tree: str):
    """A safetensors file whose endoExplain header (a JSON tree) is ``tree``."""
    import json
    import struct

    header = json.dumps({"__metadata__": {"endoexplain": tree},
                         "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    return audit_arguments(inputs["images"], inputs["masks"], path, tmp_path / "out")


def header_names_a_missing_tensor(inputs, tmp_path):
    return _crafted_safetensors(inputs, tmp_path, '{"state_dict": {"w": {"__tensor__": "nowhere"}}}')


def header_nested_beyond_any_parser(inputs, tmp_path):
    return _crafted_safetensors(inputs, tmp_path, "[" * 5000 + "]" * 5000)


def torchscript_without_trust(inputs, tmp_path):
    return audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], tmp_path / "out",
                           "--torchscript")


RAISING_TORCHSCRIPT = """
import sys
from typing import Tuple
import torch

class RefusesToLoad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = torch.nn.Parameter(torch.zeros(1))

    def forward(self, v):
        return v

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, bool]:
        return (self.x, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]) -> None:
        raise RuntimeError("this archive refuses to load")

torch.jit.save(torch.jit.script(RefusesToLoad()), sys.argv[1])
"""


def trusted_torchscript_that_raises_on_load(inputs, tmp_path):
    """Its __setstate__ raises inside the TorchScript interpreter: torch.jit.Error, which is
    not a RuntimeError."""
    script, archive = tmp_path / "make_archive.py", tmp_path / "refuses.pt"
    script.write_text(RAISING_TORCHSCRIPT)
    subprocess.run([sys.executable, str(script), str(archive)], check=True, capture_output=True)
    script.unlink()
    return audit_arguments(inputs["images"], inputs["masks"], archive, tmp_path / "out",
                           "--torchscript", "--trust-code")


def weights_path_of_ten_megabytes(inputs, tmp_path):
    return audit_arguments(inputs["images"], inputs["masks"], Path("w" * 10_000_000), tmp_path / "out")


def _masks_with(inputs, tmp_path, write):
    images, masks = _copy_inputs(inputs, tmp_path)
    write(_first_mask(masks))
    return audit_arguments(images, masks, inputs["weights"], tmp_path / "out")


def masks_saved_as_zero_one(inputs, tmp_path):
    def write(path):
        Image.fromarray((np.asarray(Image.open(path)) > 0).astype(np.uint8)).save(path)
    return _masks_with(inputs, tmp_path, write)


def mask_in_red_on_black(inputs, tmp_path):
    def write(path):
        lesion = np.asarray(Image.open(path)) > 0
        red = np.zeros(lesion.shape + (3,), np.uint8)
        red[lesion] = (255, 0, 0)
        Image.fromarray(red).save(path)
    return _masks_with(inputs, tmp_path, write)


def mask_drawn_in_alpha(inputs, tmp_path):
    def write(path):
        lesion = np.asarray(Image.open(path)) > 0
        rgba = np.zeros(lesion.shape + (4,), np.uint8)
        rgba[..., 3] = np.where(lesion, 0, 255)
        Image.fromarray(rgba).save(path)
    return _masks_with(inputs, tmp_path, write)


def image_rotated_by_exif(inputs, tmp_path):
    images, masks = _copy_inputs(inputs, tmp_path)
    first = sorted(images.glob("*.jpg"))[0]
    image = Image.open(first)
    exif = image.getexif()
    exif[0x0112] = 6
    image.save(first, exif=exif)
    return audit_arguments(images, masks, inputs["weights"], tmp_path / "out")


def image_is_a_decompression_bomb(inputs, tmp_path):
    images, masks = _copy_inputs(inputs, tmp_path)
    first = sorted(images.glob("*.png"))[0]
    Image.new("L", (8200, 8200)).save(first)   # 67 MP of zeros: a few kB on disk
    return audit_arguments(images, masks, inputs["weights"], tmp_path / "out")


def mask_of_another_size(inputs, tmp_path):
    def write(path):
        Image.fromarray(np.zeros((10, 10), np.uint8)).save(path)
    return _masks_with(inputs, tmp_path, write)


def negative_lock_wait(inputs, tmp_path):
    return audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], tmp_path / "out",
                           "--wait-for-lock", "-1")


CASES = [  # (builder, exit code, words the one-line message must contain)
    (masks_are_the_images_folder, 2, ["is the --images folder"]),
    (masks_are_byte_copies_of_the_images, 2, ["byte copy"]),
    (out_is_the_masks_folder, 2, ["inside the --masks folder"]),
    (out_is_inside_the_images_folder, 2, ["inside the --images folder"]),
    (out_contains_the_inputs, 2, ["contains the --images folder"]),
    (out_is_a_file, 2, ["is a file"]),
    (image_size_too_small_for_the_network, 2, ["--image-size 2"]),
    (image_size_gives_a_one_cell_grid, 2, ["1x1 feature grid", "2x2"]),
    (target_layer_is_not_a_feature_map, 2, ["fc", "feature map"]),
    (temperature_is_infinite, 2, ["--temperature", "finite"]),
    (calibration_csv_is_binary, 2, ["logits.csv", "not a readable CSV"]),
    (weights_hold_nan, 2, ["layer1.0.conv1.weight", "non-finite"]),
    (bias_is_infinite, 2, ["fc.bias", "non-finite"]),
    (weights_are_integers, 2, ["fc.weight", "not floating point"]),
    (torchscript_without_trust, 2, ["--trust-code"]),
    (trusted_torchscript_that_raises_on_load, 2, ["refuses.pt", "not a loadable TorchScript archive"]),
    (weights_path_of_ten_megabytes, 2, ["weights path", "cannot be used", "File name too long"]),
    (header_names_a_missing_tensor, 2, ["crafted.safetensors", "does not describe its tensors"]),
    (header_nested_beyond_any_parser, 2, ["crafted.safetensors", "damaged checkpoint header"]),
    (masks_saved_as_zero_one, 2, ["frame00_mask.png", "values 0 and 1"]),
    (mask_in_red_on_black, 2, ["frame00_mask.png", "colour mask"]),
    (mask_drawn_in_alpha, 2, ["frame00_mask.png", "transparency"]),
    (image_rotated_by_exif, 2, ["frame00.jpg", "EXIF orientation 6"]),
    (image_is_a_decompression_bomb, 2, ["frame01.png", "8200x8200", "not decoded"]),
    (mask_of_another_size, 2, ["frame00_mask.png", "10x10"]),
    (negative_lock_wait, 2, ["--wait-for-lock"]),
]


@pytest.mark.parametrize("builder, code, words", CASES, ids=[case[0].__name__ for case in CASES])
def test_careless_input_is_refused_with_one_line(inputs, tmp_path, capsys, builder, code, words):
    arguments = builder(inputs, tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert cli.main(arguments) == code
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1, message
    for word in words:
        assert word in message, (word, message)
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing the user had changed


def test_a_second_audit_into_a_locked_folder_is_refused(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    with FileLock(out / cli.LOCK_NAME, timeout=0):   # another audit holds the folder
        code = cli.main(audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], out))
    assert code == 2
    assert "another endoexplain audit is writing into" in capsys.readouterr().err
    assert not (out / "case_table.parquet").exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes to read-only folders")
def test_read_only_output_folder_is_refused(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert cli.main(audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], out)) == 2
    finally:
        out.chmod(0o755)
    assert "cannot be written" in capsys.readouterr().err


def test_odd_file_names_reach_neither_mathtext_nor_markdown_raw(inputs, tmp_path):
    """Stems with mathtext dollars, a pipe and a terminal escape: the audit completes and the
    Markdown tables hold the names escaped."""
    images, masks = tmp_path / "frames", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    names = {"frame00": "cyst$^{2}$", "frame01": "a|b", "frame02": "esc\x1b[31m", "frame03": "math_$\\alpha^{$"}
    for image in sorted(inputs["images"].iterdir()):
        stem = names.get(image.stem, image.stem)
        shutil.copy(image, images / f"{stem}{image.suffix}")
        shutil.copy(inputs["masks"] / f"{image.stem}_mask.png", masks / f"{stem}_mask.png")
    out = tmp_path / "out"
    assert cli.main(audit_arguments(images, masks, inputs["weights"], out)) == 0
    table = pd.read_parquet(out / "case_table.parquet")
    assert set(names.values()) <= set(table["sample_id"])
    for markdown in out.glob("*.md"):
        text = markdown.read_text()
        assert "\x1b" not in text and "a|b" not in text
    # The record lists every file with its SHA-256; verify finds a changed one by name.
    assert cli.verify_folder(out) == [] and not list(out.glob(".staging-*"))
    (out / "map_ties.csv").write_text("edited by hand\n")
    assert cli.verify_folder(out) == ["map_ties.csv: changed since the audit wrote it"]
    assert cli.main(["verify", str(out)]) == 2


def test_a_second_audit_without_report_removes_the_first_ones_and_verify_proves_the_folder(inputs, tmp_path):
    """Model A's audit, then model B's into the same --out with --report none: A's report.html
    must not stay beside B's tables. verify fails on a record that lists nothing, on a listed
    path outside the folder and on a file the record does not list."""
    out = tmp_path / "out"
    assert cli.main(audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], out)) == 0
    assert (out / "report.html").is_file()
    other = tmp_path / "other.pt"
    torch.save({k: v + 0.01 if v.is_floating_point() else v for k, v in _state(inputs).items()}, other)
    assert cli.main(audit_arguments(inputs["images"], inputs["masks"], other, out, "--report", "none")) == 0
    assert not (out / "report.html").exists() and cli.verify_folder(out) == []
    record = json.loads((out / "audit.json").read_text())
    (out / "stray.csv").write_text("not from the audit\n")
    assert cli.verify_folder(out) == ["stray.csv: not listed in audit.json (not written by this audit)"]
    (out / "stray.csv").unlink()
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    tampered = {**record, "files": {**record["files"], str(outside): files.sha256_file(outside),
                                    "../outside.txt": files.sha256_file(outside)}}
    (out / "audit.json").write_text(json.dumps(tampered))
    problems = cli.verify_folder(out)
    assert len(problems) == 2 and all("outside the folder" in p for p in problems)
    (out / "audit.json").write_text(json.dumps({**record, "files": {}}))
    assert cli.verify_folder(out) == [f"{out / 'audit.json'} lists no files: it vouches for nothing"]
    assert cli.main(["verify", str(out)]) == 2


def test_markdown_cells_escape_pipes_line_breaks_and_control_characters():
    assert presentation.markdown_cell("a|b") == "a\\|b"
    assert presentation.markdown_cell("two\nlines") == "two lines"
    assert presentation.markdown_cell("esc\x1b[0m") == "esc\\x1b[0m"
    assert presentation.markdown_cell("Grad-CAM\u2020 \u2265 0.90") == "Grad-CAM\u2020 \u2265 0.90"


def test_weights_archive_declaring_too_much_is_refused_before_loading(inputs, tmp_path, capsys, monkeypatch):
    """A zip bomb's members declare gigabytes; the declared total is checked before torch reads
    anything (here the limit is lowered under the ResNet-18 archive's 45 MB)."""
    from endoexplain_core.models import checkpoint

    monkeypatch.setattr(checkpoint, "MAX_ARCHIVE_BYTES", 1024 ** 2)
    loaded = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loaded.append(a) or {})
    code = cli.main(audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], tmp_path / "out"))
    assert code == 2 and not loaded
    assert "uncompressed" in capsys.readouterr().err


def _folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_full_disk_during_the_case_figure_keeps_the_previous_audit(inputs, tmp_path, capsys, monkeypatch):
    """ENOSPC while the case figure is written (after part of it is on disk): exit 2 with one
    line naming the file and saying the folder is unchanged; the previous audit's files are the
    same bytes, no staging folder or temporary file is left, and its record still verifies."""
    out = tmp_path / "out"
    arguments = audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], out)
    assert cli.main(arguments) == 0
    before = _folder_bytes(out)
    capsys.readouterr()

    real = files.replace_atomically

    def disk_fills_in_the_figure(path, write):
        if Path(path).name != "case_figure.png":
            return real(path, write)

        def write_then_fill(temporary):
            write(temporary)  # part of the figure reached the disk, then it was full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, write_then_fill)

    monkeypatch.setattr(files, "replace_atomically", disk_fills_in_the_figure)
    code = cli.main([*arguments, "--name", "second"])  # other tables: a real change if written
    error = capsys.readouterr().err
    # stderr also holds the audit's progress bar (carriage returns); the message is one line.
    (message,) = [line for line in error.splitlines() if line.startswith("endoexplain audit:")]
    assert code == 2, error
    assert f"{out / 'case_figure.png'} (No space left on device)" in message, message
    assert f"nothing was moved into {out}" in message and ".staging-" not in message, message
    assert _folder_bytes(out) == before
    assert not [p.name for p in out.iterdir() if p.name.startswith(".staging-") or p.suffix == ".tmp"]
    assert cli.verify_folder(out) == [] and cli.main(["verify", str(out)]) == 0


REPO = Path(__file__).resolve().parent.parent


def _start(*arguments: str) -> subprocess.Popen:
    """A Python process in the repository root (so this checkout's package and tests import)."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.Popen([sys.executable, *arguments], cwd=REPO, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(marker: Path, process: subprocess.Popen, seconds: float = 600.0) -> None:
    """Until ``marker`` exists; fail with the process's output if it ends first."""
    deadline = time.monotonic() + seconds
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"process ended ({process.returncode}) before {marker.name}: "
                                 f"{process.communicate()[1][-2000:]}")
        assert time.monotonic() < deadline, f"{marker.name} did not appear in {seconds:.0f} s"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("queued", [False, True], ids=["second_refused", "second_queued"])
def test_two_audit_processes_into_one_folder(inputs, tmp_path, queued):
    """Two real ``endoexplain audit`` processes into one ``--out``. The first holds the lock
    (and waits at a gate inside it) before the second starts, so the order is fixed: without
    ``--wait-for-lock`` the second exits 2 with one line about the lock and writes nothing;
    with it, the second queues (it has seen the lock held) and runs after the first. Either
    way the folder ends whole: ``endoexplain verify`` passes on the last audit's record and its
    Parquet case table reads with that audit's rows only."""
    out, ready, go, waiting = tmp_path / "out", tmp_path / "ready", tmp_path / "go", tmp_path / "queued"
    arguments = audit_arguments(inputs["images"], inputs["masks"], inputs["weights"], out)
    first = _start("-m", "tests.gated_audit", "hold", str(ready), str(go), *arguments,
                   "--name", "first")
    second = None
    try:
        _wait_for(ready, first)  # the first audit holds the lock now
        assert f"pid {first.pid}" in (out / f"{cli.LOCK_NAME}.owner").read_text()
        if queued:
            second = _start("-m", "tests.gated_audit", "queue", str(waiting), *arguments,
                            "--name", "second", "--wait-for-lock", "600")
            _wait_for(waiting, second)  # the second found the lock held and waits for it
        else:
            second = _start("-m", "endoexplain_core", *arguments, "--name", "second")
            _, error = second.communicate(timeout=600)
            assert second.returncode == 2, error
            assert len(error.strip().splitlines()) == 1, error
            assert "another endoexplain audit is writing into" in error and f"pid {first.pid}" in error
            assert {p.name for p in out.iterdir()} == {cli.LOCK_NAME, f"{cli.LOCK_NAME}.owner",
                                                      f".staging-{first.pid}"}
        go.write_text("")
        _, error = first.communicate(timeout=600)
        assert first.returncode == 0, error
        if queued:
            _, error = second.communicate(timeout=600)
            assert second.returncode == 0, error
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()
    last = "second" if queued else "first"
    assert cli.main(["verify", str(out)]) == 0 and cli.verify_folder(out) == []
    assert json.loads((out / cli.RECORD_NAME).read_text())["checkpoint_id"] == last
    table = pd.read_parquet(out / "case_table.parquet")
    assert len(table) > 0 and set(table["checkpoint_id"]) == {last}
    assert not list(out.glob(".staging-*"))


# --- run_all.sh: refusals before any work ------------------------------------------------------
# Each builder gets tmp_path and returns run_all's arguments (besides --output-root); the run
# must exit 2 with one short line naming the problem, and leave the output root untouched (no
# run folder, no lock file).

def image_size_beyond_memory(tmp_path):
    return ["--profile", "smoke", "--set", "shared.image_size=100000000"]


def a_trillion_bootstrap_replicates(tmp_path):
    return ["--profile", "smoke", "--set", "02_calibration.bootstrap_replicates=1000000000000"]


def a_negative_seed(tmp_path):
    return ["--profile", "smoke", "--set", "shared.seed=-1"]


def a_repeated_training_seed(tmp_path):
    return ["--profile", "smoke", "--set", "shared.training_seeds=[1129, 1129]"]


def a_repeated_gate_seed(tmp_path):
    return ["--profile", "smoke", "--set", "03_validity_gate.replicate_seeds=[1, 1]"]


def a_misspelt_category(tmp_path):
    return ["--profile", "smoke", "--set", "00_roles.category_counts={caecum: 3}"]


def a_set_file_that_never_ends(tmp_path):
    return ["--profile", "smoke", "--set-file", "/dev/zero"]


def a_huge_set_value(tmp_path):
    return ["--profile", "smoke", "--set", "shared.seed=" + "1" * 200_000]


def a_huge_unknown_set_key(tmp_path):
    return ["--profile", "smoke", "--set", "shared." + "k" * 200_000 + "=1"]


def a_profile_named_dot_dot(tmp_path):
    profile = tmp_path / "...yaml"
    shutil.copy(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml", profile)
    return ["--profile", str(profile)]


def an_output_root_that_is_a_file(tmp_path):
    (tmp_path / "out").write_text("a file")
    return ["--profile", "smoke"]


def an_insecure_scheduler(tmp_path):
    return ["--profile", "smoke", "--scheduler", "tcp://127.0.0.1:8786"]


RUN_CASES = [
    (image_size_beyond_memory, "less than or equal to 2048"),
    (a_trillion_bootstrap_replicates, "less than or equal to 100000"),
    (a_negative_seed, "greater than or equal to 0"),
    (a_repeated_training_seed, "repeated: 1129"),
    (a_repeated_gate_seed, "repeated: 1"),
    (a_misspelt_category, "did you mean 'cecum'"),
    (a_set_file_that_never_ends, "larger than the 1 MiB"),
    (a_huge_set_value, "not valid profile YAML"),
    (a_huge_unknown_set_key, "has no key"),
    (a_profile_named_dot_dot, "must be a plain name"),
    (an_output_root_that_is_a_file, "is a file, not a folder"),
    (an_insecure_scheduler, "tcp:// scheduler is unencrypted"),
]


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
@pytest.mark.parametrize("builder, words", RUN_CASES, ids=[case[0].__name__ for case in RUN_CASES])
def test_run_all_refuses_before_any_work_in_one_line(tmp_path, capsys, builder, words, check):
    from endoexplain_core.pipeline import orchestrator

    arguments = builder(tmp_path) + ["--output-root", str(tmp_path / "out")] + (["--check"] if check else [])
    before = sorted(p.name for p in tmp_path.iterdir())
    code = orchestrator.main(arguments)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and words in lines[0], captured.err[-2000:]
    assert len(lines[0]) < 1000                                   # long values are cut
    assert sorted(p.name for p in tmp_path.iterdir()) == before   # nothing written, no lock


def test_ctrl_c_during_check_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    from endoexplain_core.pipeline import orchestrator, preflight

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(preflight, "run_preflight", interrupted)
    code = orchestrator.main(["--profile", "smoke", "--output-root", str(tmp_path / "out"), "--check"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 130 and lines == ["run_all: preflight interrupted; nothing was written"]
    assert not (tmp_path / "out").exists()


def test_an_unreadable_data_root_is_a_finding_not_a_traceback(tmp_path, monkeypatch):
    """Running as root, permissions cannot be taken away; the reader's PermissionError is
    injected where a real one comes from (listing a folder)."""
    from endoexplain_core import config
    from endoexplain_core.data import cohorts, hyperkvasir
    from endoexplain_core.pipeline import preflight

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "data" / "hyper-kvasir"))

    monkeypatch.setattr(hyperkvasir, "index_hyperkvasir", denied)
    monkeypatch.setitem(cohorts.ADAPTERS, "etis", denied)
    (tmp_path / "data" / "ETIS-LaribPolypDB").mkdir(parents=True)
    findings = preflight.run_preflight(config.load_profile("smoke"), str(tmp_path / "data"), tmp_path / "runs")
    denied_lines = [f for f in findings if "Permission denied" in f.detail]
    assert {f.item for f in denied_lines} == {"HyperKvasir", "ETIS-LaribPolypDB"}
    assert all(f.blocks for f in denied_lines)


def test_a_looping_link_in_the_data_root_does_not_stop_the_fingerprint(tmp_path):
    from endoexplain_core.pipeline import orchestrator

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "loop.jpg").symlink_to("loop.jpg")
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "stray.bin").write_bytes(b"\0" * 1000)     # not part of the reference
    first = orchestrator.data_fingerprint(str(tmp_path / "data"), tmp_path / "reference")
    (tmp_path / "reference" / "stray.bin").write_bytes(b"\1" * 1000)
    assert orchestrator.data_fingerprint(str(tmp_path / "data"), tmp_path / "reference") == first
