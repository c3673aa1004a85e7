"""The orchestrator on throwaway notebooks: skip, rerun, force, failure and resume."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from endoexplain_core import config
from endoexplain_core.pipeline import orchestrator
from tests.toy_run import ToyShared, ToyStage

pytestmark = pytest.mark.slow  # each case executes real notebooks through Papermill


def write_notebook(path: Path, body: str) -> None:
    notebook = nbformat.v4.new_notebook()
    parameters = nbformat.v4.new_code_cell(
        "profile = 'x'\nrun_dir = ''\nfigures_dir = ''\ndata_root = ''\n"
        "manifest_reference_dir = ''\nvalue = 0")
    parameters.metadata["tags"] = ["parameters"]
    notebook.cells = [nbformat.v4.new_markdown_cell("# test stage"), parameters,
                      nbformat.v4.new_code_cell(body)]
    notebook.metadata["kernelspec"] = {"name": "endoexplain", "display_name": "endoExplain",
                                       "language": "python"}
    nbformat.write(notebook, path)


WRITE_TABLE = ("from pathlib import Path\n"
               "Path(figures_dir).mkdir(parents=True, exist_ok=True)\n"
               "(Path(figures_dir) / 'table_{stage}.csv').write_text(f'value\\n{{value}}\\n')\n")


def toy_project(tmp_path):
    """Two stages that each write one table, and a tiny profile: (root, notebooks, profile)."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    write_notebook(notebooks / "00_first.ipynb", WRITE_TABLE.format(stage="first"))
    write_notebook(notebooks / "01_second.ipynb", WRITE_TABLE.format(stage="second"))
    profile = tmp_path / "tiny.yaml"
    profile.write_text(yaml.safe_dump({"shared": {"value": 1},
                                       "stages": {"00_first": {}, "01_second": {}}}))
    return tmp_path, notebooks, profile


@pytest.fixture()
def project(tmp_path):
    return toy_project(tmp_path)


class ToySecondStage(config.StageSettings):
    """A stage with its own ``value`` (it reads no shared key)."""
    value: int = 1


TOY_STAGES = {"00_first": ToyStage, "01_second": ToySecondStage}


def run(project, **kwargs):
    root, notebooks, profile = project
    return orchestrator.run_pipeline(str(profile), output_root=root / "out", notebook_dir=notebooks,
                                     stage_settings=TOY_STAGES, shared_settings=ToyShared,
                                     **kwargs)


def statuses(provenance):
    return [stage["status"] for stage in provenance["stages"]]


def test_first_run_executes_everything_and_records_provenance(project):
    provenance = run(project)
    assert statuses(provenance) == ["ran", "ran"]
    run_dir = project[0] / "out" / "runs" / "tiny"
    for stage in ("00_first", "01_second"):
        assert (run_dir / "notebooks" / f"{stage}.ipynb").is_file()
        assert (run_dir / "notebooks" / f"{stage}.html").is_file()
        assert (run_dir / "stamps" / f"{stage}.json").is_file()
    on_disk = json.loads((run_dir / "provenance.json").read_text())
    assert on_disk["status"] == "complete"
    assert set(on_disk["git"]) == {"commit", "dirty"}
    assert on_disk["packages"]["torch"] == "2.14.1"
    from endoexplain_core import numerics
    assert on_disk["device"]["numerics_policy"] == numerics.POLICY
    assert set(numerics.POLICY) <= set(on_disk["device"]["torch_settings"])
    assert on_disk["parameters"]["01_second"]["value"] == 1
    assert on_disk["stages"][0]["figure_files"] == ["table_first.csv"]
    assert on_disk["stages"][1]["figure_files"] == ["table_second.csv"]
    executed = nbformat.read(run_dir / "notebooks" / "01_second.ipynb", as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)


def test_rerun_skips_unchanged_stages_and_force_reruns(project):
    run(project)
    assert statuses(run(project)) == ["skipped", "skipped"]
    assert statuses(run(project, force=True)) == ["ran", "ran"]


def test_changed_parameter_reruns_that_stage_and_downstream_only(project):
    root, notebooks, profile = project
    run(project)
    profile.write_text(yaml.safe_dump({"shared": {"value": 1},
                                       "stages": {"00_first": {}, "01_second": {"value": 2}}}))
    assert statuses(run(project)) == ["skipped", "ran"]
    table = root / "out" / "figures" / "tiny" / "table_second.csv"
    assert table.read_text() == "value\n2\n"


def test_a_set_override_reruns_exactly_the_stages_that_read_the_key_and_is_recorded(project):
    root, _, profile = project
    run(project)
    # 01_second's own key: 00 is reused, 01 reruns with the new value
    provenance = run(project, overrides=["01_second.value=5"])
    assert statuses(provenance) == ["skipped", "ran"]
    assert (root / "out" / "figures" / "tiny" / "table_second.csv").read_text() == "value\n5\n"
    assert provenance["overrides"] == ["01_second.value=5"]
    assert [s["overrides"] for s in provenance["stages"]] == [[], ["01_second.value=5"]]
    page = (root / "out" / "runs" / "tiny" / "index.html").read_text()
    assert "<code>--set 01_second.value=5</code>" in page
    # the same override again: nothing changed, nothing reruns; without it, 01 reruns back
    assert statuses(run(project, overrides=["01_second.value=5"])) == ["skipped", "skipped"]
    assert statuses(run(project)) == ["skipped", "ran"]
    # a shared key that 00 reads: 00 reruns, and 01 after it (its inputs may have changed)
    assert statuses(run(project, overrides=["shared.value=3"])) == ["ran", "ran"]
    assert (root / "out" / "figures" / "tiny" / "table_first.csv").read_text() == "value\n3\n"
    assert yaml.safe_load(profile.read_text())["shared"]["value"] == 1   # the file is untouched


def test_a_bad_set_override_stops_before_any_work(project, capsys):
    root = project[0]
    for bad, word in (("01_second.valu=2", "did you mean 'value'"), ("shared.value=abc", "--set shared.value=abc"),
                      ("third.value=1", "unknown section")):
        with pytest.raises(config.ProfileError, match=re.escape(word)):
            run(project, overrides=[bad])
    assert not (root / "out" / "runs" / "tiny" / "notebooks").exists()
    # through the command line: exit 2, one line, nothing run
    code = orchestrator.main(["--profile", "smoke", "--output-root", str(root / "cli"),
                              "--set", "01_training.epoch=2"])
    assert code == 2 and "01_training has no key 'epoch'" in capsys.readouterr().err
    assert not (root / "cli" / "runs" / "smoke" / "notebooks").exists()


def test_adopting_a_reference_manifest_reruns_the_first_stage_only(project, tmp_path):
    """The first paper run adopts the manifest (--adopt-manifest); the next plain run checks
    the new reference again (stage 00) but does not redo the stages after it."""
    reference = tmp_path / "reference"
    run(project, adopt_manifest=True, manifest_reference=reference)
    reference.mkdir()
    (reference / "manifest.csv").write_text("sample_id\na\n")          # what 00 adopted
    assert statuses(run(project, manifest_reference=reference)) == ["ran", "skipped"]
    assert statuses(run(project, manifest_reference=reference)) == ["skipped", "skipped"]


def test_changed_upstream_notebook_reruns_downstream(project):
    root, notebooks, _ = project
    run(project)
    write_notebook(notebooks / "00_first.ipynb", WRITE_TABLE.format(stage="first") + "# edited")
    assert statuses(run(project)) == ["ran", "ran"]


def test_failure_names_the_cell_keeps_partial_notebook_and_resumes(project):
    root, notebooks, _ = project
    write_notebook(notebooks / "01_second.ipynb", "raise ValueError('planted failure')")
    with pytest.raises(orchestrator.StageFailed) as caught:
        run(project)
    message = str(caught.value)
    assert "01_second.ipynb" in message and "cell" in message and "planted failure" in message
    run_dir = root / "out" / "runs" / "tiny"
    assert (run_dir / "notebooks" / "01_second.ipynb").is_file()  # partial notebook kept
    assert not (run_dir / "stamps" / "01_second.json").exists()
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert provenance["status"] == "failed"
    assert [s["status"] for s in provenance["stages"]] == ["ran", "failed"]
    # fixed notebook: the finished stage is not redone, the failed one is
    write_notebook(notebooks / "01_second.ipynb", WRITE_TABLE.format(stage="second"))
    assert statuses(run(project)) == ["skipped", "ran"]


def test_only_runs_the_named_stages(project):
    provenance = run(project, only=["00_first"])
    assert statuses(provenance) == ["ran", "not_run"]
    with pytest.raises(ValueError, match="unknown stages"):
        run(project, only=["99_missing"])


def test_missing_data_root_is_a_clear_error(project, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        run(project, data_root=str(tmp_path / "nowhere"))


def test_every_saved_table_links_to_the_cell_that_wrote_it(project):
    """artefacts.save_table's sidecar names the stage and cell; index.html links to that cell."""
    root, notebooks, _ = project
    write_notebook(notebooks / "01_second.ipynb",
                   "import pandas as pd\nfrom endoexplain_core import artefacts\n"
                   "artefacts.save_table(pd.DataFrame({'value': [value]}), 'table_saved', figures_dir)")
    run(project)
    run_dir, figures = root / "out" / "runs" / "tiny", root / "out" / "figures" / "tiny"
    sidecar = json.loads((figures / "provenance" / "table_saved.json").read_text())
    executed = nbformat.read(run_dir / "notebooks" / "01_second.ipynb", as_version=4)
    writing_cell = executed.cells[-1]
    assert sidecar["stage"] == "01_second" and sidecar["cell_id"] == writing_cell.id
    assert sidecar["execution_count"] == writing_cell.execution_count
    assert sidecar["parameters"]["value"] == 1 and len(sidecar["stage_digest"]) == 64
    assert set(sidecar["files"]) == {"table_saved.csv", "table_saved.md", "table_saved.tex"}
    page = (run_dir / "index.html").read_text()
    assert f"notebooks/01_second.html#cell-id={writing_cell.id}" in page
    assert f'id="cell-id={writing_cell.id}"' in (run_dir / "notebooks" / "01_second.html").read_text()
    index = (figures / "README.md").read_text()
    assert "provenance/" not in index  # sidecars are not artefacts of the paper


def test_ctrl_c_is_recorded_as_interrupted_never_as_the_previous_complete(project, monkeypatch):
    run(project)
    run_dir = project[0] / "out" / "runs" / "tiny"
    real_execute = orchestrator.execute_stage

    def interrupted_in_the_second_stage(notebook, *args, **kwargs):
        if notebook.stem == "01_second":
            raise KeyboardInterrupt
        return real_execute(notebook, *args, **kwargs)

    monkeypatch.setattr(orchestrator, "execute_stage", interrupted_in_the_second_stage)
    with pytest.raises(KeyboardInterrupt):
        run(project, force=True)
    on_disk = json.loads((run_dir / "provenance.json").read_text())
    assert on_disk["status"] == "interrupted"
    assert statuses(on_disk) == ["ran", "interrupted"]
    assert "status: interrupted" in (run_dir / "index.html").read_text()
    assert not (run_dir / "stamps" / "01_second.json").exists()  # it reruns next time
    monkeypatch.setattr(orchestrator, "execute_stage", real_execute)
    assert statuses(run(project)) == ["skipped", "ran"]


@pytest.mark.parametrize("where", ["_figure_snapshot", "export_html", "stage_digest"])
def test_ctrl_c_anywhere_in_the_loop_is_recorded_as_interrupted(project, monkeypatch, where):
    """The interrupt may land outside the notebook (the review saw it in the figure snapshot):
    provenance.json and index.html say "interrupted" wherever it lands."""
    run(project)
    run_dir = project[0] / "out" / "runs" / "tiny"
    real = getattr(orchestrator, where)
    calls = {"n": 0}

    def interrupting(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2 or (where == "export_html" and calls["n"] == 1):
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(orchestrator, where, interrupting)
    with pytest.raises(KeyboardInterrupt):
        run(project, force=True)
    on_disk = json.loads((run_dir / "provenance.json").read_text())
    assert on_disk["status"] == "interrupted"
    got = statuses(on_disk)
    assert len(got) == 2 and set(got) <= {"ran", "interrupted", "not_run"} and got != ["ran", "ran"], got
    assert "status: interrupted" in (run_dir / "index.html").read_text()
    monkeypatch.setattr(orchestrator, where, real)
    assert run(project)["status"] == "complete"       # and the next run completes it


def test_a_corrupt_stamp_is_treated_as_missing_and_its_stage_reruns(project):
    run(project)
    stamps = project[0] / "out" / "runs" / "tiny" / "stamps"
    (stamps / "00_first.json").write_bytes(b"\x00\xff not json")
    (stamps / "01_second.json").write_text("[1, 2]")
    assert statuses(run(project)) == ["ran", "ran"]
    assert json.loads((stamps / "00_first.json").read_text())["digest"]


def test_a_run_stopped_in_05_leads_its_record_with_the_stage_error_and_missing_list(tmp_path):
    """Stages named like the real 04-06: 05 raises; the record's red banner names 05, its error
    in one line, and what is missing (05's and 06's products), and the brief says which
    research questions could not be computed."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    write_notebook(notebooks / "04_spatial_audit.ipynb", WRITE_TABLE.format(stage="first"))
    write_notebook(notebooks / "05_robustness.ipynb", "raise ArithmeticError('rank-deficient fit')")
    write_notebook(notebooks / "06_transfer.ipynb", WRITE_TABLE.format(stage="second"))
    profile = tmp_path / "tiny.yaml"
    profile.write_text(yaml.safe_dump({"shared": {"value": 1}, "stages": {
        "04_spatial_audit": {}, "05_robustness": {}, "06_transfer": {}}}))
    with pytest.raises(orchestrator.StageFailed):
        orchestrator.run_pipeline(str(profile), output_root=tmp_path / "out", notebook_dir=notebooks,
                                  stage_settings={s: ToyStage for s in ("04_spatial_audit", "05_robustness",
                                                                        "06_transfer")},
                                  shared_settings=ToyShared)
    page = (tmp_path / "out" / "runs" / "tiny" / "index.html").read_text()
    banner = page[page.index("banner-failed"):]
    banner = banner[:banner.index("</div>")]
    assert "Run FAILED in 05_robustness: 05_robustness.ipynb failed in cell" in banner
    assert "ArithmeticError: rank-deficient fit" in banner
    assert "Table 5 (adjusted model) (05_robustness)" in banner and "transfer (RQ4) (06_transfer)" in banner
    assert "Table 4 (RQ1)" not in banner
    assert "RQ2, does it persist?</strong> could not be computed (stage 05_robustness did not finish" in page


# ---------------------------------------------------------------- real signals, real kernels
REPO = Path(__file__).resolve().parent.parent
SLEEPING_STAGE = ("import time\nfor _ in range(30):\n    time.sleep(0.05)\n" + WRITE_TABLE)
INTERRUPTED_MESSAGES = {
    "run_all: interrupted; provenance.json and index.html say so, and the stopped stage reruns next time":
        "recorded",
    "run_all: interrupted before the run started; nothing was written": "untouched",
    "run_all: interrupted while starting; nothing was written": "untouched",
    "run_all: preflight interrupted; nothing was written": "untouched",
}


def start(command: list[str]) -> subprocess.Popen:
    """``command`` in its own process group with Ctrl-C's default action, as a terminal starts
    it (a shell's background job would ignore SIGINT)."""
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


# An interrupted process exits 130 or is ended by SIGINT itself: seen with ``python -m`` after
# an interrupt that our handler caught and reported (CPython ends with SIGINT when its
# unhandled-interrupt flag was set in nested C-level code); a shell reports both as 130.
INTERRUPTED_CODES = (130, -signal.SIGINT)


def ctrl_c_after(command: list[str], seconds: float) -> tuple[int, str]:
    """Run ``command``, send SIGINT to its process group (what Ctrl-C does) after ``seconds``;
    return (exit code, stderr)."""
    process = start(command)
    time.sleep(seconds)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    return process.returncode, stderr


def test_ctrl_c_at_seeded_random_moments_gives_one_line_and_a_record_that_says_so(project):
    """Real SIGINTs to the process group at 8 seeded random moments of a two-stage run (loading,
    hashing, kernel start-up, inside a cell, HTML export, between stages, the record): each
    time exit 130 with exactly one line on stderr and a record that agrees with it (the run's
    record says "interrupted", or nothing was written and the previous record is untouched),
    or, if the signal came after the record was written, exit 0 and "complete"."""
    root, notebooks, _ = project
    for stage in ("00_first", "01_second"):
        write_notebook(notebooks / f"{stage}.ipynb", SLEEPING_STAGE.format(stage=stage))
    command = [sys.executable, "-m", "tests.toy_run", str(root), "--force"]
    began = time.perf_counter()
    assert subprocess.run(command, cwd=REPO, capture_output=True).returncode == 0
    duration = time.perf_counter() - began
    run_dir = root / "out" / "runs" / "tiny"
    seen = []
    moments = random.Random(36)
    for moment in sorted(moments.uniform(0.1, 1.1 * duration) for _ in range(8)):
        before = {name: (run_dir / name).read_bytes() for name in ("provenance.json", "index.html")}
        code, stderr = ctrl_c_after(command, moment)
        lines = [line for line in stderr.splitlines() if line.strip()]
        status = json.loads((run_dir / "provenance.json").read_text())["status"]
        if code == 0:
            assert lines == [] and status == "complete", (moment, stderr)
            seen.append("complete")
            continue
        assert code in INTERRUPTED_CODES and len(lines) == 1 and lines[0] in INTERRUPTED_MESSAGES, (moment, code, stderr)
        outcome = INTERRUPTED_MESSAGES[lines[0]]
        if outcome == "recorded":
            assert status == "interrupted", moment
            assert "status: interrupted" in (run_dir / "index.html").read_text(), moment
        else:
            assert {name: (run_dir / name).read_bytes() for name in before} == before, moment
        seen.append(outcome)
        assert not list((root / "out" / "runs").glob("*.owner")), moment  # the lock is free
    assert {"recorded", "untouched"} <= set(seen), seen  # moments before and inside the run
    assert subprocess.run(command[:-1], cwd=REPO, capture_output=True).returncode == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_ctrl_c_while_the_real_entry_point_loads_is_one_line(tmp_path, seed):
    """``python -m endoexplain_core.pipeline`` (what run_all.sh execs), Ctrl-C in its first
    second: exit 130 and one line, or it finished first. The interpreter's own start (about 50
    ms, before any project code runs) is outside what a package can catch."""
    command = [sys.executable, "-m", "endoexplain_core.pipeline", "--profile", "smoke", "--check",
               "--output-root", str(tmp_path / "out")]
    moments = random.Random(seed)
    for moment in sorted(moments.uniform(0.1, 1.2) for _ in range(3)):
        code, stderr = ctrl_c_after(command, moment)
        lines = [line for line in stderr.splitlines() if line.strip()]
        if code in (0, 2):   # the preflight finished before the signal
            continue
        assert code in INTERRUPTED_CODES and len(lines) == 1 and lines[0] in INTERRUPTED_MESSAGES, (moment, code, stderr)
        assert not (tmp_path / "out").exists()


def test_a_kernel_killed_mid_stage_is_a_failed_stage_with_its_record(project):
    """A kernel the system kills (SIGKILL, as the out-of-memory killer does) raises no Python
    error in the notebook: the stage is "failed" with a message saying that its kernel died,
    the record leads with it, and the next run reruns the stage."""
    root, notebooks, _ = project
    write_notebook(notebooks / "01_second.ipynb",
                   "import os, signal, sys\nprint('about to die', file=sys.__stderr__, flush=True)\n"
                   "os.kill(os.getpid(), signal.SIGKILL)")
    with pytest.raises(orchestrator.StageFailed, match="01_second.ipynb: its kernel died") as failure:
        run(project)
    assert "about to die" in str(failure.value)   # the kernel's last stderr line, from its log
    run_dir = root / "out" / "runs" / "tiny"
    on_disk = json.loads((run_dir / "provenance.json").read_text())
    assert on_disk["status"] == "failed" and statuses(on_disk) == ["ran", "failed"]
    page = (run_dir / "index.html").read_text()
    assert "Run FAILED in 01_second" in page and "its kernel died" in page
    write_notebook(notebooks / "01_second.ipynb", WRITE_TABLE.format(stage="second"))
    assert statuses(run(project)) == ["skipped", "ran"]
