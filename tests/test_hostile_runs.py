"""The run and its checks against a hostile world (issue 50): a record that never says
"complete" for a dead run, checks that can fail, and one-line refusals at the run's doors.

Most cases run the orchestrator's command line in this process on two throwaway stages whose
notebooks never start a kernel (``execute_stage`` is replaced by a function that writes the
stage's table), and inject the fault where a real one comes from: SIGTERM sent to this process,
``OSError(ENOSPC)`` from a write. One slow case sends SIGTERM to a real run's process group, as
``timeout``, SLURM and systemd do.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from endoexplain_core import files
from endoexplain_core.pipeline import orchestrator, tasks, verdicts
from tests.test_pipeline import (REPO, SLEEPING_STAGE, TOY_STAGES, WRITE_TABLE, start, statuses,
                                 toy_project, write_notebook)
from tests.toy_run import ToyShared

SIGTERM_RECORDED = ("run_all: interrupted (SIGTERM); provenance.json and index.html say so, and "
                    "the stopped stage reruns next time")


@pytest.fixture()
def project(tmp_path):
    return toy_project(tmp_path)[0]


def run_all(root: Path, *extra: str) -> int:
    """``run_all.sh`` (``orchestrator.main``) on the throwaway stages of ``root``."""
    return orchestrator.main(["--profile", str(root / "tiny.yaml"), "--output-root", str(root / "out"),
                              "--force", *extra], notebook_dir=root / "notebooks",
                             stage_settings=TOY_STAGES, shared_settings=ToyShared)


def kernel_free_stages(monkeypatch, on_second=None):
    """Replace ``execute_stage`` by a function writing the stage's table (no kernel); in
    ``01_second`` it first calls ``on_second()``, the fault. Returns the list of stages run."""
    ran = []

    def execute(notebook, executed, parameters, *args, **kwargs):
        ran.append(notebook.stem)
        if notebook.stem == "01_second" and on_second is not None:
            on_second()
        figures = Path(parameters["figures_dir"])
        figures.mkdir(parents=True, exist_ok=True)
        (figures / f"table_{notebook.stem}.csv").write_text("value\n1\n")

    monkeypatch.setattr(orchestrator, "execute_stage", execute)
    return ran


def stderr_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def record_of(root: Path) -> tuple[dict, str]:
    run_dir = root / "out" / "runs" / "tiny"
    return json.loads((run_dir / "provenance.json").read_text()), (run_dir / "index.html").read_text()


def a_full_disk(path="/out/some.file"):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


@contextlib.contextmanager
def sigterm_fails_the_test():
    """Without the orchestrator's handler SIGTERM would end pytest itself: make it an error."""
    def unhandled(signum, frame):
        raise AssertionError("SIGTERM reached no handler of the run")

    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------- item 2: a dead run's record
def test_sigterm_in_a_stage_is_one_line_exit_143_and_an_interrupted_record(project, monkeypatch, capsys):
    kernel_free_stages(monkeypatch)
    assert run_all(project) == 0 and record_of(project)[0]["status"] == "complete"
    capsys.readouterr()

    def terminated():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)   # the handler raises long before this ends

    kernel_free_stages(monkeypatch, terminated)
    with sigterm_fails_the_test():
        code = run_all(project)
        assert signal.getsignal(signal.SIGTERM).__name__ == "unhandled"   # main restored it
    assert code == 143 and stderr_lines(capsys) == [SIGTERM_RECORDED]
    provenance, page = record_of(project)
    assert provenance["status"] == "interrupted" and provenance["interrupted_by"] == "SIGTERM"
    assert statuses(provenance) == ["ran", "interrupted"]
    assert "status: interrupted" in page and "Run interrupted in 01_second (SIGTERM)" in page
    assert not (project / "out" / "runs" / "tiny" / "stamps" / "01_second.json").exists()


@pytest.mark.slow
def test_sigterm_to_a_real_runs_process_group_is_recorded(project):
    """A real run (Papermill, real kernels) sent SIGTERM in its second stage, to its whole
    process group as ``timeout``, SLURM and systemd do: exit 143, one line, the record says
    "interrupted" (it said "complete" before), and the next run completes."""
    notebooks = project / "notebooks"
    command = [sys.executable, "-m", "tests.toy_run", str(project)]
    run_dir = project / "out" / "runs" / "tiny"
    assert subprocess.run(command, cwd=REPO, capture_output=True).returncode == 0
    write_notebook(notebooks / "01_second.ipynb", SLEEPING_STAGE.format(stage="second")
                   .replace("range(30)", "range(400)"))   # 20 s: SIGTERM lands inside it
    progress = run_dir / "logs" / "01_second.kernel.log"   # made anew when the stage starts
    progress.unlink()
    process = start(command)
    deadline = time.monotonic() + 90
    while not progress.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    time.sleep(3.0)   # the kernel starts and enters the cell
    os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert process.returncode == 143 and lines == [SIGTERM_RECORDED], (process.returncode, stderr[-3000:])
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert provenance["status"] == "interrupted" and statuses(provenance) == ["skipped", "interrupted"]
    assert "status: interrupted" in (run_dir / "index.html").read_text()
    assert not list((project / "out" / "runs").glob("*.owner"))   # the lock is free
    write_notebook(notebooks / "01_second.ipynb", WRITE_TABLE.format(stage="second"))
    assert subprocess.run(command, cwd=REPO, capture_output=True).returncode == 0


def test_a_full_disk_in_a_stage_is_a_failed_stage_with_its_record(project, monkeypatch, capsys):
    def disk_full():
        raise a_full_disk(str(project / "out" / "runs" / "tiny" / "notebooks" / "01_second.ipynb"))

    kernel_free_stages(monkeypatch, disk_full)
    code = run_all(project)
    lines = stderr_lines(capsys)
    assert code == 1 and len(lines) == 1 and "01_second stopped: No space left on device" in lines[0], lines
    provenance, page = record_of(project)
    assert provenance["status"] == "failed" and statuses(provenance) == ["ran", "failed"]
    assert "Run FAILED in 01_second: 01_second stopped: No space left on device" in page
    assert not (project / "out" / "runs" / "tiny" / "stamps" / "01_second.json").exists()  # reruns


def test_an_os_error_between_stages_fails_the_next_stage_with_its_record(project, monkeypatch, capsys):
    kernel_free_stages(monkeypatch)
    real_digest = orchestrator.notebook_source_digest

    def unreadable_second(path):
        if path.stem == "01_second":
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
        return real_digest(path)

    monkeypatch.setattr(orchestrator, "notebook_source_digest", unreadable_second)
    assert run_all(project) == 1
    lines = stderr_lines(capsys)
    assert len(lines) == 1 and "01_second stopped: Input/output error" in lines[0], lines
    provenance, page = record_of(project)
    assert provenance["status"] == "failed" and statuses(provenance) == ["ran", "failed"]
    assert "Run FAILED in 01_second" in page


def test_a_rerun_marks_the_complete_record_running_before_its_first_stage(project, monkeypatch):
    """What a run killed mid-stage without any cleanup (SIGKILL, power) leaves: the record
    as it stood while its stage ran, which must not say "complete"."""
    kernel_free_stages(monkeypatch)
    assert run_all(project) == 0
    seen = []

    def look_at_the_record():
        seen.append(record_of(project))

    kernel_free_stages(monkeypatch, look_at_the_record)
    assert run_all(project) == 0
    provenance, page = seen[0]
    assert provenance["status"] == "running"
    assert "status: running" in page and "status: complete" not in page
    assert "died without a record" in page
    assert record_of(project)[0]["status"] == "complete"   # and the finished run says so


def test_a_disk_that_fills_during_a_stage_leaves_running_never_complete(project, monkeypatch, capsys):
    kernel_free_stages(monkeypatch)
    assert run_all(project) == 0
    capsys.readouterr()
    real_replace = files.replace_atomically
    full = {"now": False}

    def replace_unless_full(path, write):
        if full["now"]:
            raise a_full_disk(str(path))
        return real_replace(path, write)

    def fill_the_disk():
        full["now"] = True
        raise a_full_disk()

    monkeypatch.setattr(files, "replace_atomically", replace_unless_full)
    kernel_free_stages(monkeypatch, fill_the_disk)
    code = run_all(project)
    lines = stderr_lines(capsys)
    assert code == 1 and len(lines) == 1 and "the record could not be written" in lines[0], lines
    provenance, page = record_of(project)
    assert provenance["status"] == "running"
    assert "status: complete" not in page and "status: running" in page


def test_a_disk_too_full_to_mark_the_record_stops_before_any_stage(project, monkeypatch, capsys):
    kernel_free_stages(monkeypatch)
    assert run_all(project) == 0
    capsys.readouterr()
    run_dir = project / "out" / "runs" / "tiny"
    before = {name: (run_dir / name).read_bytes() for name in ("provenance.json", "index.html")}

    def always_full(path, write):
        raise a_full_disk(str(path))

    monkeypatch.setattr(files, "replace_atomically", always_full)
    ran = kernel_free_stages(monkeypatch)
    assert run_all(project) == 2
    lines = stderr_lines(capsys)
    assert len(lines) == 1 and "cannot be written (No space left on device" in lines[0], lines
    assert "nothing ran" in lines[0] and ran == []
    assert {name: (run_dir / name).read_bytes() for name in before} == before   # still true


def test_a_read_only_output_root_is_one_line_before_any_work(project, monkeypatch, capsys):
    @contextlib.contextmanager
    def read_only(path, wait_seconds=0.0):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        yield   # noqa: unreachable -- a generator, as exclusive_lock is

    monkeypatch.setattr(files, "exclusive_lock", read_only)
    ran = kernel_free_stages(monkeypatch)
    assert run_all(project) == 2
    lines = stderr_lines(capsys)
    assert len(lines) == 1 and "Read-only file system" in lines[0] and ran == [], lines


# ------------------------------------------------------------- item 5: the run's front doors
@pytest.mark.parametrize("seconds", ["nan", "inf", "-5", "-inf"])
def test_a_lock_wait_that_is_no_number_of_seconds_is_refused_leaving_no_lock(tmp_path, capsys, seconds):
    code = orchestrator.main(["--profile", "smoke", "--only", "no_such_stage", "--output-root",
                              str(tmp_path / "out"), f"--wait-for-lock={seconds}"])
    lines = stderr_lines(capsys)
    assert code == 2 and len(lines) == 1 and "--wait-for-lock" in lines[0], lines
    assert not (tmp_path / "out").exists()


SCHEDULER_CASES = [(["--scheduler", "tls://host:99999"], "port 99999 is not a TCP port"),
                   (["--scheduler", "tcp://host:99999", "--allow-insecure-scheduler"], "port 99999"),
                   (["--scheduler", "tcp://host:0", "--allow-insecure-scheduler"], "port 0"),
                   (["--scheduler", "local:BOUND+1"], "local worker processes"),
                   (["--scheduler", "local:100000"], "local worker processes")]


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
@pytest.mark.parametrize("arguments, words", SCHEDULER_CASES, ids=[c[0][1] for c in SCHEDULER_CASES])
def test_a_scheduler_port_or_worker_count_out_of_bounds_is_one_line(tmp_path, capsys, arguments, words, check):
    if "local:BOUND+1" in arguments:
        most = tasks.MAX_LOCAL_WORKERS_PER_CORE * (os.cpu_count() or 1)
        arguments = [f"local:{most + 1}" if a == "local:BOUND+1" else a for a in arguments]
    code = orchestrator.main(["--profile", "smoke", "--only", "no_such_stage", "--output-root",
                              str(tmp_path / "out"), *arguments] + (["--check"] if check else []))
    lines = stderr_lines(capsys)
    assert code == 2 and len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_local_workers_up_to_the_bound_are_accepted():
    most = tasks.MAX_LOCAL_WORKERS_PER_CORE * (os.cpu_count() or 1)
    assert tasks.parse_scheduler(f"local:{most}").workers == most
    assert tasks.parse_scheduler("tls://host:65535").address == "tls://host:65535"


# ------------------------------------------------------------- item 3: checks that can fail
def good_tables() -> dict[str, str]:
    """The three headline tables, CSV text, as small as the checks allow."""
    gate = pd.DataFrame({"method": ["gradcam", "random"], "verdict": ["passes", "reference"]})
    table4 = pd.DataFrame({"panel": ["A", "A"], "method": ["gradcam", "random"], "n": [60, 60],
                           "peak_failure": [0.3, 0.85], "peak_failure_ci_low": [0.2, 0.75],
                           "peak_failure_ci_high": [0.4, 0.93]})
    learning = pd.DataFrame({"checkpoint_id": ["a", "b"], "arch": "effnet", "seed": [1, 2], "control": "none",
                             "learned": [True, True], "is_primary": [True, False]})
    return {"table_validity_gate": gate.to_csv(index=False),
            "table4_spatial_audit": table4.to_csv(index=False),
            "table_checkpoint_learning": learning.to_csv(index=False)}


def write_tables(folder: Path, tables: dict[str, str | bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in tables.items():
        path = folder / f"{name}.csv"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


def with_table(name: str, text: str | bytes) -> dict[str, str | bytes]:
    return {**good_tables(), name: text}


LEARNING = "table_checkpoint_learning"
LEARNING_HEADER = "checkpoint_id,arch,seed,control,learned,is_primary"
BROKEN_TABLES = {
    "empty file": with_table("table_validity_gate", ""),
    "random bytes": with_table("table4_spatial_audit", random.Random(50).randbytes(3000)),
    "header only": with_table(LEARNING, f"{LEARNING_HEADER}\n"),
    "wrong columns": with_table("table_validity_gate", "name,outcome\ngradcam,passes\n"),
    "every row primary": with_table(LEARNING, f"{LEARNING_HEADER}\na,e,1,none,True,True\nb,e,2,none,True,True\n"),
    "no primary": with_table(LEARNING, f"{LEARNING_HEADER}\na,e,1,none,True,False\nb,e,2,none,True,False\n"),
    "duplicated rows": with_table("table4_spatial_audit", good_tables()["table4_spatial_audit"]
                                  + good_tables()["table4_spatial_audit"].split("\n", 1)[1]),
    "repeated checkpoint": with_table(LEARNING, f"{LEARNING_HEADER}\na,e,1,none,True,True\na,e,1,none,False,False\n"),
    "not a boolean": with_table(LEARNING, f"{LEARNING_HEADER}\na,e,1,none,maybe,True\nb,e,2,none,True,False\n"),
    "not a number": with_table("table4_spatial_audit", "panel,method,n,peak_failure,peak_failure_ci_low,"
                               "peak_failure_ci_high\nA,gradcam,sixty,0.3,0.2,0.4\n"),
    "no panel A": with_table("table4_spatial_audit", "panel,method,n,peak_failure,peak_failure_ci_low,"
                             "peak_failure_ci_high\nB,gradcam,60,0.3,0.2,0.4\n"),
}


@pytest.mark.parametrize("side", ["run", "reference"])
@pytest.mark.parametrize("case", list(BROKEN_TABLES))
def test_verdicts_refuse_a_table_that_breaks_its_invariants(tmp_path, capsys, case, side):
    broken = write_tables(tmp_path / "broken", BROKEN_TABLES[case])
    good = write_tables(tmp_path / "good", good_tables())
    arguments = [str(broken), str(good)] if side == "run" else [str(good), str(broken)]
    code = verdicts.main(arguments)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("verdicts: "), (code, captured.err[-2000:])
    assert "broken" in lines[0] and captured.out == ""


def test_verdicts_good_tables_still_compare(tmp_path):
    run = write_tables(tmp_path / "run", good_tables())
    assert verdicts.main([str(run), str(write_tables(tmp_path / "ref", good_tables()))]) == 0


def test_verdicts_refuse_a_folder_compared_with_itself(tmp_path, capsys):
    run = write_tables(tmp_path / "run", good_tables())
    (tmp_path / "alias").symlink_to(run)
    for reference in (run, tmp_path / "run" / ".." / "run", tmp_path / "alias"):
        assert verdicts.main([str(run), str(reference)]) == 2
        lines = stderr_lines(capsys)
        assert len(lines) == 1 and "compared with itself" in lines[0], lines


def screenshots_main(arguments: list[str], monkeypatch) -> int:
    """``tests.screenshots`` with a browser that, as Chromium does, shoots whatever page it
    got, an error page for a missing file included."""
    from tests import screenshots

    def any_page_is_shot(page, scripts, screenshots=None, wait_seconds=0.0):
        for path in (screenshots or {}).values():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_bytes(b"\x89PNG error page")
        return ["0 of 0"] * len(scripts)

    monkeypatch.setattr(screenshots, "run_in_page", any_page_is_shot)
    return screenshots.main(arguments)


def a_run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    (run / "index.html").write_text("<!DOCTYPE html><html><body>record</body></html>")
    return run


SCREENSHOT_CASES = {
    "missing run folder": lambda t: [str(t / "no_such_run"), str(t / "shots")],
    "a figures folder as the run folder": lambda t: [str(write_tables(t / "figures", good_tables())),
                                                     str(t / "shots")],
    "missing figures folder": lambda t: [str(a_run_folder(t)), str(t / "shots"), str(t / "no_figures")],
    "a figures folder without figures": lambda t: [str(a_run_folder(t)), str(t / "shots"),
                                                   str(write_tables(t / "figures", good_tables()))],
}


@pytest.mark.parametrize("case", list(SCREENSHOT_CASES))
def test_screenshots_refuse_a_missing_or_wrong_folder_and_save_nothing(tmp_path, capsys, monkeypatch, case):
    arguments = SCREENSHOT_CASES[case](tmp_path)
    code = screenshots_main(arguments, monkeypatch)
    lines = stderr_lines(capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("screenshots: "), (code, lines)
    assert not list(tmp_path.rglob("*.png"))   # no error page saved as a screenshot


def test_screenshots_of_a_run_and_its_figures_folder_are_taken(tmp_path, capsys, monkeypatch):
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "figure1_workflow.png").write_bytes(b"\x89PNG figure")
    code = screenshots_main([str(a_run_folder(tmp_path)), str(tmp_path / "shots"), str(figures)], monkeypatch)
    assert code == 0 and capsys.readouterr().err == ""
    assert sorted(p.name for p in (tmp_path / "shots").iterdir()) == ["figure_figure1_workflow.png",
                                                                     "record_first_screen.png"]
