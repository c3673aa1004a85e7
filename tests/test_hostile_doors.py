"""Issue 50, items 4 and 5: text from data is drawn as written, and ``--check`` probes what it
used to take on trust (weights files, the scheduler, list lengths, long names, unreadable roots,
an output root inside the data root). Each case failed on c4591d0."""

from __future__ import annotations

import re

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from endoexplain_core import presentation  # noqa: E402
from endoexplain_core.figures import case_figures  # noqa: E402
from endoexplain_core.methods import CAM_METHODS  # noqa: E402

MATH_NAMES = ("price $5 and $6.png", r"math_$\alpha^{$.png", r"back\slash $x$ \$.png")


def _drawn_case(role: str, sample_id: str) -> dict:
    """One Figure 3 row in ``draw_figure3``'s format, from fixed arrays."""
    rng = np.random.default_rng(0)
    mask = np.zeros((16, 16), dtype=bool)
    mask[4:10, 4:10] = True
    return {"role": role, "sample_id": sample_id, "score": 0.95, "rgb": rng.random((16, 16, 3)),
            "mask": mask, "maps": {m: rng.random((16, 16)) for m in CAM_METHODS},
            "rows": {m: {"iou": 0.5, "constant_map": False, "peak_outside_mask": True, "distance": 3.0}
                     for m in CAM_METHODS}}


def _drawn_strings(fig) -> list[tuple[str, bool]]:
    """(the string Matplotlib draws, whether as mathtext) for every Text of ``fig``, after
    drawing it (a mathtext error would raise here)."""
    fig.canvas.draw()
    return [text._preprocess_math(text.get_text()) for text in fig.findobj(matplotlib.text.Text)]


@pytest.mark.parametrize("name", MATH_NAMES)
def test_a_case_named_with_dollars_and_backslashes_is_drawn_as_written(name):
    """Before: "price $5 and $6.png" drawn as mathtext ("price 5*and*6"), and
    "math_$\\alpha^{$.png" stopped the figure with a mathtext error."""
    fig = case_figures.draw_figure3([_drawn_case("miss", name), _drawn_case("consensus", "plain.png")],
                                    top_fraction=0.2)
    drawn = _drawn_strings(fig)                                     # draws without a mathtext error
    assert not [shown for shown, is_math in drawn if is_math and "$" in name and name in shown]
    # the case ids are in the caption beside the figure (Markdown): every markup character of
    # the name escaped, so neither Markdown nor the notebook's MathJax reads "$5 and $6" as math
    caption = case_figures.figure3_caption({"miss": name, "consensus": "plain.png"}, top_fraction=0.2)
    shown = caption[caption.index("Cases: "):]
    assert f"A = {presentation.markdown_literal(name)}; B = plain.png." in shown
    assert not re.search(r"(?<!\\)\$", shown)                          # no unescaped dollar
    assert re.sub(r"\\(.)", r"\1", shown[len("Cases: "):]).startswith(f"A = {name};")   # unescaped: as written


def test_data_in_panel_titles_and_tick_labels_is_drawn_as_written():
    """A panel title (bold mathtext letter + text) and a forest plot's tick labels that carry a
    name from data: before, the title stopped the figure with a mathtext error and the tick
    label was drawn as math."""
    import matplotlib.pyplot as plt

    from endoexplain_core.figures import faithfulness_figures, style

    fig, (titled, forest) = plt.subplots(1, 2)
    style.panel_title(titled, "A", MATH_NAMES[1])
    faithfulness_figures._forest(forest, [MATH_NAMES[0]], [0.1], [0.0], [0.2], ["black"])
    drawn = _drawn_strings(fig)
    # after the bold letter (mathtext) the name's dollars are escaped: drawn as written
    assert (r"$\mathbf{A}$  " + style.as_written(MATH_NAMES[1]), True) in drawn
    assert (MATH_NAMES[0], False) in drawn
    plt.close(fig)


# ----------------------------------------------------------------------------- item 5: --check


import os  # noqa: E402
import pickle  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from endoexplain_core import config  # noqa: E402
from endoexplain_core.pipeline import orchestrator, preflight  # noqa: E402


@pytest.fixture(scope="module")
def resnet18_file(tmp_path_factory):
    """torchvision's ResNet-18 state dict (random weights, ImageNet's 1000 classes), as torch.save writes it."""
    import torch
    import torchvision

    path = tmp_path_factory.mktemp("weights") / "resnet18_mine.pth"
    torch.save(torchvision.models.get_model("resnet18", weights=None).state_dict(), path)
    return path


class _OpensAFile:
    """Unpickling this calls ``open(marker, "w")``: a pickle that runs code when loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_weights_that_are_not_their_architectures_state_dict_are_problems(resnet18_file, tmp_path):
    """Before: random bytes, a ResNet-18 state dict given for ResNet-34 and a pickle that runs
    code when loaded were all READY in --check (stage 01 then stopped); the pickle is refused
    without running it. A state dict that fits is still ready."""
    random_bytes = tmp_path / "random.pth"
    random_bytes.write_bytes(np.random.default_rng(0).bytes(4096))
    marker = tmp_path / "the pickle ran"
    runs_code = tmp_path / "runs_code.pth"
    runs_code.write_bytes(pickle.dumps({"fc.weight": _OpensAFile(marker)}))
    given = {"resnet18": str(resnet18_file), "resnet34": str(resnet18_file),
             "efficientnet_b0": str(random_bytes), "mobilenet_v3_large": str(runs_code)}
    found = {f.item: f for f in preflight.weight_findings(list(given), given)}
    assert found["resnet18"].status == preflight.READY and "fits resnet18" in found["resnet18"].detail
    assert found["resnet34"].status == preflight.PROBLEM
    assert "not an ImageNet state dict for resnet34" in found["resnet34"].detail
    assert "layer1.2" in found["resnet34"].detail                      # a ResNet-34 block ResNet-18 lacks
    assert found["efficientnet_b0"].status == preflight.PROBLEM
    assert found["mobilenet_v3_large"].status == preflight.PROBLEM
    assert "would run code" in found["mobilenet_v3_large"].detail and not marker.exists()
    assert all("\n" not in f.line() for f in found.values())


def test_a_weights_file_name_too_long_for_the_file_system_is_a_problem_line(tmp_path):
    """Before: a 300-character file name gave an OSError traceback in --check."""
    long_name = str(tmp_path / ("w" * 300 + ".pth"))
    found = preflight.weight_findings(["resnet34"], {"resnet34": long_name})
    assert [f.status for f in found] == [preflight.PROBLEM]
    assert "cannot be used" in found[0].detail and "File name too long" in found[0].detail


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_check_probes_the_scheduler_address(tmp_path, capsys):
    """Before: --check said READY for a scheduler address nobody listens on (stage 06 stopped
    after 30 s). Now a TCP connect with a short timeout: nobody there is a problem line, a
    listening address is ready."""
    port = _free_port()
    code = orchestrator.main(["--profile", "smoke", "--output-root", str(tmp_path), "--check",
                              "--scheduler", f"tcp://127.0.0.1:{port}", "--allow-insecure-scheduler"])
    out = capsys.readouterr().out
    assert code == 2 and f"[problem] scheduler tcp://127.0.0.1:{port}: no scheduler answers" in out
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = "tcp://127.0.0.1:%d" % listening.getsockname()[1]
        assert [f.status for f in preflight.scheduler_findings(address)] == [preflight.READY]
    assert preflight.scheduler_findings("local:2") == preflight.scheduler_findings("") == []


@pytest.mark.parametrize("key", ["03_validity_gate.replicate_seeds", "shared.training_seeds",
                                 "05_robustness.score_thresholds", "08_faithfulness.road_fractions"])
def test_profile_lists_have_a_stated_maximum_length(key):
    """Before: any length was accepted (100,000 replicate_seeds after 101 s of validation)."""
    items = config.MAX_LIST_ITEMS + 1
    values = [round((i + 1) / (items + 2), 6) for i in range(items)] if "fractions" in key or "thresholds" in key \
        else list(range(items))
    with pytest.raises(config.ProfileError, match=f"at most {config.MAX_LIST_ITEMS} items"):
        config.load_profile("smoke", overrides=[f"{key}={values}"])


class _CountedItem:
    """A hashable item that counts its equality comparisons."""

    comparisons = 0

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return hash(self.value)

    def __eq__(self, other):
        _CountedItem.comparisons += 1
        return isinstance(other, _CountedItem) and self.value == other.value


def test_distinct_items_are_checked_in_linear_time():
    """Before: ``values.count`` per item, n^2 comparisons (100,000 seeds took 101 s)."""
    items = [_CountedItem(i) for i in range(3000)] + [_CountedItem(7)]
    _CountedItem.comparisons = 0
    with pytest.raises(ValueError, match="repeated: "):
        config._distinct_items(items)
    assert _CountedItem.comparisons < 10 * len(items)


def _without_file_permission_override() -> list[str]:
    """A command prefix under which a mode-000 folder cannot be read: none for a plain user;
    for root, ``setpriv`` without the capabilities that bypass file modes."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: a mode-000 folder stays readable")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
            "--inh-caps", "-dac_override,-dac_read_search"]


def test_an_unreadable_data_root_is_a_problem_line_not_a_traceback(tmp_path):
    """Before: a data root with mode 000 gave a PermissionError traceback in --check (exit 1)."""
    data = tmp_path / "data"
    (data / "hyper-kvasir").mkdir(parents=True)
    data.chmod(0)
    try:
        done = subprocess.run(_without_file_permission_override() + [
            sys.executable, "-m", "endoexplain_core.pipeline", "--profile", "smoke", "--data-root",
            str(data), "--output-root", str(tmp_path / "out"), "--check"],
            capture_output=True, text=True, timeout=300, cwd=str(config.REPO_ROOT))
    finally:
        data.chmod(0o755)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"[problem] data    data root: {data} cannot be read (Permission denied)" in done.stdout


def test_an_output_root_inside_the_data_root_is_refused(tmp_path, capsys):
    """Before: accepted; the run wrote runs/ into the data, whose fingerprint then changed, so
    stage 00 (and everything after it) reran on every run. Now the run refuses it before any
    work (exit 2, one line) and --check lists it as a problem."""
    data = tmp_path / "data"
    (data / "hyper-kvasir").mkdir(parents=True)
    with pytest.raises(ValueError, match="is inside the data root"):
        orchestrator.checked_run("smoke", data_root=str(data), output_root=data / "out")
    orchestrator.checked_run("smoke", data_root=str(data), output_root=tmp_path / "out")   # beside it: fine
    code = orchestrator.main(["--profile", "smoke", "--data-root", str(data), "--output-root",
                              str(data), "--check"])
    out = capsys.readouterr().out
    assert code == 2 and "[problem] data    data root: the output root" in out
    assert not (data / "runs").exists()
