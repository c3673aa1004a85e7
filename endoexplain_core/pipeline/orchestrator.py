"""The orchestrator behind ``run_all.sh``: execute the numbered notebooks of one profile.

For each ``notebooks/NN_name.ipynb`` in order, the stage's parameters (the profile's ``shared``
section, its own ``stages`` section and the run paths) are passed to Papermill; the executed
notebook and its HTML export go to ``runs/<profile>/notebooks/``. A stage is skipped when its
digest -- notebook sources, parameters, core code, the upstream stage's digest and (for the
first stage) the input data -- equals the one stamped by its last successful run. A failing
notebook stops the run naming the notebook and the failing cell; the partial notebook is kept.
Every run ends with ``provenance.json``, the figure index and ``index.html``.

Usage: ``python -m endoexplain_core.pipeline --profile smoke [--data-root DIR] [--force]
[--only 00_roles 01_training] [--adopt-manifest] [--output-root DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import endoexplain_core
from endoexplain_core.run_layout import DIGEST_FILE, MANIFEST_FILE, RunLayout, output_inside_data_root
from endoexplain_core import config as profiles
from endoexplain_core import artefacts, files, numerics

NOTEBOOK_DIR = profiles.REPO_ROOT / "notebooks"
CORE_DIR = Path(__file__).resolve().parent.parent  # endoexplain_core/ (this file is in pipeline/)
KERNEL_NAME = "endoexplain"
# Packages whose versions go into the provenance record.
RECORDED_PACKAGES = ("torch", "torchvision", "grad-cam", "numpy", "scipy", "statsmodels", "pandas",
                     "pyarrow", "matplotlib", "pillow", "albumentations", "ImageHash",
                     "papermill", "nbconvert", "ipykernel", "PyYAML", "tqdm")

log = logging.getLogger("endoexplain")


class StageFailed(RuntimeError):
    """A notebook raised; the message names the notebook, the cell and the partial output."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (what ``timeout``, SLURM and systemd send): raised by the handler
    ``main`` installs, and handled wherever Ctrl-C is, being a ``KeyboardInterrupt`` (asyncio
    and Papermill pass it through as they pass Ctrl-C); the exit code is 143, not 130."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (``by``: "Ctrl-C" or "SIGTERM") stopped the run after it had begun
    changing the run folder; ``provenance.json`` and ``index.html`` say "interrupted" (a plain
    ``KeyboardInterrupt`` out of ``run_pipeline`` means nothing was written)."""

    @property
    def by(self) -> str:
        return self.args[0] if self.args else "Ctrl-C"


class RunFolderUnwritable(OSError):
    """The run folder could not be written before any stage ran (full disk, read-only file
    system): the previous record could not be marked stale, so nothing ran and it is as it was."""


# Exit codes of a stopped run, as a shell reports a process ended by the signal (128 + number).
INTERRUPT_EXIT_CODES = {"Ctrl-C": 130, "SIGTERM": 143}


def interrupted_by(stop: BaseException) -> str:
    """"SIGTERM" for a ``Terminated`` (or a ``RunInterrupted`` by one), else "Ctrl-C"."""
    if isinstance(stop, RunInterrupted):
        return stop.by
    return "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"


@dataclass
class RunPaths:
    """Where one profile's run writes: ``<output_root>/runs/<profile>`` and ``figures/<profile>``."""

    profile: str
    output_root: Path
    run_dir: Path = field(init=False)
    figures_dir: Path = field(init=False)
    notebooks_out: Path = field(init=False)
    stamps: Path = field(init=False)

    def __post_init__(self) -> None:
        self.run_dir = self.output_root / "runs" / self.profile
        self.figures_dir = self.output_root / "figures" / self.profile
        self.notebooks_out = RunLayout(self.run_dir).notebooks_dir
        self.stamps = RunLayout(self.run_dir).stamps_dir


def discover_stages(notebook_dir: Path = NOTEBOOK_DIR) -> list[Path]:
    """Numbered notebooks (``NN_name.ipynb``) in execution order."""
    return sorted(p for p in notebook_dir.glob("[0-9][0-9]_*.ipynb") if p.is_file())


def notebook_source_digest(path: Path) -> str:
    """Digest of a notebook's cell types and sources (outputs and metadata ignored)."""
    cells = json.loads(path.read_text())["cells"]
    sources = [(cell["cell_type"], "".join(cell["source"])) for cell in cells]
    return files.sha256_bytes(json.dumps(sources).encode())


def _module_file(module: str, core_dir: Path) -> Path | None:
    """Source file of a dotted ``endoexplain_core...`` module name (package -> __init__.py)."""
    relative = Path(*module.split(".")[1:])
    if not relative.parts:  # the package itself
        return core_dir / "__init__.py"
    for candidate in (core_dir / relative.with_suffix(".py"), core_dir / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_core_modules(source: str) -> set[str]:
    """``endoexplain_core`` modules named by the imports of a piece of Python source."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("endoexplain_core"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("endoexplain_core"))
    return found


def core_modules_used(notebook: Path, core_dir: Path = CORE_DIR) -> list[Path]:
    """Core source files a notebook imports, directly or through other core modules.

    Read statically from the import statements (``ast``), so a stage's code digest covers only
    the code that can change its outputs. Package ``__init__`` files on the way are included.
    """
    cells = json.loads(notebook.read_text())["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    # IPython magics are not Python; imports never sit on such lines.
    pending = _imported_core_modules("\n".join(line for line in source.splitlines()
                                               if not line.lstrip().startswith(("%", "!"))))
    files: set[Path] = set()
    while pending:
        module = pending.pop()
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):  # the packages above a module run on import too
            path = _module_file(".".join(parts[:depth]), core_dir)
            if path is not None and path not in files:
                files.add(path)
                pending |= _imported_core_modules(path.read_text())
    return sorted(files)


def code_fingerprint(source: str | bytes) -> str:
    """What a module computes, without its wording: the syntax tree of ``source`` with every
    docstring (module, class, function) removed, dumped without line numbers. Comments,
    docstrings, blank lines and line breaks leave it unchanged; any change to code changes it."""
    import ast

    tree = ast.parse(source)   # str or bytes (bytes: the file's own encoding declaration)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def core_code_digest(files: list[Path] | None = None, core_dir: Path = CORE_DIR) -> str:
    """Digest of core source files (default: every one): a change to the code of any of them
    reruns; a docstring or comment edit does not (``code_fingerprint``)."""
    digest = hashlib.sha256()
    for path in sorted(files if files is not None else core_dir.rglob("*.py")):
        digest.update(path.relative_to(core_dir).as_posix().encode())
        digest.update(code_fingerprint(path.read_bytes()).encode())
    return digest.hexdigest()


REFERENCE_KEYS = ("adopt_manifest", "manifest_reference_dir")
PAPER_VALUES = profiles.REPO_ROOT / "data_manifest" / "paper" / "paper_reported_values.csv"  # read by 09


def data_fingerprint(data_root: str, reference_dir: Path | None) -> str:
    """Cheap fingerprint of the inputs of the first stage.

    For a real data root: relative path, size and modification time of every file (hashing the
    bytes is the roles stage's job). With ``reference_dir``: the reference manifest's files.
    """
    digest = hashlib.sha256()
    if data_root:
        root = Path(data_root)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                try:
                    stat = path.stat()
                except OSError:   # a broken or looping link: the readers skip it; so does this
                    stat = path.lstat()
                digest.update(f"{path.relative_to(root).as_posix()}\t{stat.st_size}\t"
                              f"{stat.st_mtime_ns}\n".encode())
    if reference_dir is not None and reference_dir.is_dir():
        # Only the reference's own files, streamed: a stray 2 GiB file beside them is neither
        # read into memory nor part of the reference.
        for name in (MANIFEST_FILE, DIGEST_FILE):
            if (reference_dir / name).is_file():
                digest.update(name.encode())
                digest.update(files.sha256_file(reference_dir / name).encode())
    return digest.hexdigest()


def stage_digest(notebook: Path, parameters: dict[str, Any], core_digest: str,
                 upstream_digest: str, input_fingerprint: str = "") -> str:
    """The digest that decides whether a stage must run again."""
    payload = json.dumps({
        "notebook": notebook_source_digest(notebook),
        "parameters": parameters,
        "core": core_digest,
        "upstream": upstream_digest,
        "inputs": input_fingerprint,
    }, sort_keys=True, default=str)
    return files.sha256_bytes(payload.encode())


def _figure_snapshot(figures_dir: Path) -> dict[str, int]:
    if not figures_dir.is_dir():
        return {}
    from endoexplain_core.pipeline import record  # pandas-heavy: imported when needed

    return {name: (figures_dir / name).stat().st_mtime_ns for name in record.figure_files(figures_dir)}


class _ProgressEcho:
    """Echo a stage's progress log to this process's log while the stage runs: the kernel
    writes its bars there (``progress``), not into the executed notebook."""

    def __init__(self, path: Path, stage: str, interval: float = 2.0):
        import threading

        self.path, self.stage, self.interval = path, stage, interval
        self._offset, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{stage}", daemon=True)

    def _echo_new_lines(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open("r", encoding="utf-8", errors="replace") as stream:
            stream.seek(self._offset)
            text = stream.read()
        complete = text[: text.rfind("\n") + 1]        # a half-written line waits for its end
        self._offset += len(complete.encode("utf-8"))
        for line in complete.splitlines():
            log.info("[%s] %s", self.stage, line.strip())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._echo_new_lines()

    def __enter__(self) -> "_ProgressEcho":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._echo_new_lines()


@contextlib.contextmanager
def _stage_environment(stage: str, progress_log: Path):
    """The environment of the kernel Papermill starts for ``stage``: ``ENDOEXPLAIN_STAGE``
    (the artefact sidecars record it) and ``ENDOEXPLAIN_PROGRESS_LOG`` = ``progress_log``
    (emptied first; echoed to the console while the stage runs). Previous values are restored
    afterwards."""
    from endoexplain_core.progress import PROGRESS_LOG_ENV

    files.write_text_atomic(progress_log, "")
    updates = {artefacts.STAGE_ENV: stage, PROGRESS_LOG_ENV: str(progress_log)}
    previous = {key: os.environ.get(key) for key in updates}
    os.environ.update(updates)
    try:
        with _ProgressEcho(progress_log, stage):
            yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def export_html(executed: Path) -> Path:
    """HTML export of an executed (or partially executed) notebook, next to it."""
    import nbformat
    from nbconvert import HTMLExporter

    notebook = nbformat.read(executed, as_version=4)
    body, _ = HTMLExporter().from_notebook_node(notebook)
    body = body.replace("</head>", WIDE_TABLE_STYLE + "</head>", 1)
    return files.write_text_atomic(executed.with_suffix(".html"), body)


# Wide tables (Table 4 has 20 columns) wrap their cells and scroll inside their output instead
# of running off the page, where the last columns would be cut off.
WIDE_TABLE_STYLE = ("<style>.jp-OutputArea-output { overflow-x: auto; max-width: 100%; }\n"
                    ".jp-RenderedHTMLCommon td, .jp-RenderedHTMLCommon th { white-space: normal; "
                    "max-width: 12em; overflow-wrap: anywhere; }</style>\n")


def kernel_manager_logging_to(kernel_log: Path) -> type:
    """A Jupyter kernel manager class whose kernel process writes its own stderr to
    ``kernel_log`` (appended) instead of the console: IPKernelApp's start-up warnings, C-library
    messages, and the ZMQ traceback a kernel prints when Ctrl-C shuts it down mid-cell. What a
    cell prints is unaffected (the kernel sends it to the notebook)."""
    from jupyter_client.manager import AsyncKernelManager

    class StageKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            with Path(kernel_log).open("ab") as stream:   # the child keeps its own copy
                return await super()._async_launch_kernel(kernel_cmd, stderr=stream, **kw)

    return StageKernelManager


def execute_stage(notebook: Path, executed: Path, parameters: dict[str, Any],
                  kernel_name: str = KERNEL_NAME, kernel_log: Path | None = None) -> None:
    """Run one notebook with Papermill; raise ``StageFailed`` naming the failing cell, or saying
    that the kernel died (a kernel the system killed, e.g. for memory, raises no Python error).
    ``kernel_log``: where the kernel process's own stderr goes (``kernel_manager_logging_to``);
    None: the console."""
    import papermill
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    executed.parent.mkdir(parents=True, exist_ok=True)
    engine_options = {} if kernel_log is None else {
        "kernel_manager_class": kernel_manager_logging_to(kernel_log)}
    try:
        papermill.execute_notebook(
            str(notebook), str(executed), parameters=parameters, kernel_name=kernel_name,
            cwd=str(notebook.parent), log_output=True, progress_bar=False, **engine_options,
        )
    except PapermillExecutionError as error:
        raise StageFailed(
            f"{notebook.name} failed in cell {error.cell_index} (execution count "
            f"{error.exec_count}): {error.ename}: {error.evalue}\n"
            f"  partial notebook kept at {executed}"
        ) from error
    except DeadKernelError as error:
        last_words = ""
        if kernel_log is not None and kernel_log.is_file():
            lines = [line for line in kernel_log.read_text(errors="replace").splitlines() if line.strip()]
            last_words = f"; the kernel's last stderr line: {files.short_text(lines[-1])}" if lines else ""
            last_words += f" (all of it in {kernel_log})"
        raise StageFailed(
            f"{notebook.name}: its kernel died ({error}); a kernel the system kills, e.g. when "
            f"memory runs out, ends this way{last_words}\n"
            f"  partial notebook kept at {executed}"
        ) from error


def git_state(repo_root: Path = profiles.REPO_ROOT) -> dict[str, Any]:
    """Commit hash and whether tracked or untracked (non-ignored) files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo_root), *args], capture_output=True,
                              text=True, check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (subprocess.CalledProcessError, FileNotFoundError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in RECORDED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_description() -> dict[str, Any]:
    import torch

    description = {"platform": platform.platform(), "python": platform.python_version(),
                   "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                   "cuda_available": torch.cuda.is_available(),
                   # the flags every stage's CUDA device runs under (numerics.resolve_device)
                   "numerics_policy": dict(numerics.POLICY), "torch_settings": numerics.torch_settings(),
                   # the CPU pin every stage ran under and what this CPU offers (numerics)
                   "cpu_numerics": numerics.cpu_numerics()}
    if torch.cuda.is_available():
        description["cuda_device"] = torch.cuda.get_device_name(0)
    return description


def _checkpoint_digests(run_dir: Path) -> dict[str, str]:
    folder = RunLayout(run_dir).checkpoints_dir
    if not folder.is_dir():
        return {}
    # Resume states (<id>.resume.safetensors) are training state, not checkpoints of the study.
    return {p.stem: files.sha256_file(p) for p in sorted(folder.glob("*.safetensors"))
            if not p.name.endswith(".resume.safetensors")}


def _manifest_digest(run_dir: Path) -> str | None:
    path = RunLayout(run_dir).manifest_digest_file
    return path.read_text().strip() if path.is_file() else None


# ----------------------------------------------------------------------------- run lock
# Two runs writing one run folder would interleave stamps, checkpoints and tables. Every
# ``run_pipeline`` call therefore holds an OS file lock (``filelock``: flock on POSIX, released
# by the kernel when the holder dies, even by SIGKILL) on ``<output_root>/runs/<profile>.lock``.


class RunFolderLocked(RuntimeError):
    """Another run holds the lock of this run folder; nothing was read or written."""


def run_lock_path(profile: str, output_root: Path) -> Path:
    """``<output_root>/runs/<profile>.lock``: the lock of the run folder of ``profile``."""
    return Path(output_root).resolve() / "runs" / f"{profiles.profile_path(profile).stem}.lock"


@contextlib.contextmanager
def run_folder_lock(profile: str, output_root: Path, wait_seconds: float = 0.0):
    """Hold the run-folder lock for the block; raise ``RunFolderLocked`` if another run holds
    it for longer than ``wait_seconds`` (0: do not wait; negative: wait indefinitely)."""
    check_lock_wait(wait_seconds)
    path = run_lock_path(profile, output_root)
    acquired = False
    try:
        with files.exclusive_lock(path, wait_seconds):
            acquired = True
            yield path
    except files.LockHeld as held:
        raise RunFolderLocked(
            f"the run folder {path.parent / path.stem} is in use by another run ({held.holder}); "
            f"this run stopped before doing anything. Wait for it to finish, or pass "
            f"--wait-for-lock SECONDS to queue behind it") from None
    except OSError as error:
        if acquired:   # the run's own error, not the lock's
            raise
        raise RunFolderUnwritable(f"the lock {path} cannot be written ({_os_error_text(error)}); "
                                  "this run stopped before doing anything") from None


def check_lock_wait(seconds: float) -> float:
    """``--wait-for-lock``: seconds, finite and >= 0, or -1 (wait indefinitely); anything else
    (nan, inf, another negative) is a ``ValueError``, raised before the lock file is made."""
    if not (seconds == -1 or (math.isfinite(seconds) and seconds >= 0)):
        raise ValueError(f"--wait-for-lock {seconds}: give the seconds to wait (a finite number "
                         ">= 0), or -1 to wait indefinitely")
    return seconds


def _os_error_text(error: OSError) -> str:
    """An OS error in a few words with its file: "No space left on device: /x/y"."""
    what = error.strerror or str(error) or type(error).__name__
    return f"{what}: {error.filename}" if error.filename else what


def check_scheduler(config: profiles.Profile, scheduler: str | None,
                     allow_insecure: bool) -> None:
    """Refuse, before any work, the scheduler the stages would use: ``scheduler`` (the flag)
    or else the profile's ``shared.scheduler``, with ``allow_insecure`` or the profile's
    ``shared.allow_insecure_scheduler``; a ``tls://`` address also needs the client
    certificates in Dask's configuration (``tasks.address_security``), which the stages'
    kernels inherit. ``SchedulerError`` (a ValueError: exit 2) names the setting and
    ``--allow-insecure-scheduler`` or the missing certificate keys."""
    from endoexplain_core.pipeline.tasks import SchedulerError, address_security, parse_scheduler

    # Toy schemas (orchestrator tests) may have no scheduler keys: then only the flag counts.
    shared = config.shared
    setting = scheduler if scheduler is not None else getattr(shared, "scheduler", "")
    allowed = allow_insecure or bool(getattr(shared, "allow_insecure_scheduler", False))
    where = "--scheduler" if scheduler is not None else "shared.scheduler"
    try:
        spec = parse_scheduler(setting, allow_insecure=allowed)
        if spec.kind == "address":
            address_security(spec.address)
    except SchedulerError as error:
        raise SchedulerError(f"{where}: {error}") from None


def checked_run(profile: str, *, data_root: str = "", output_root: Path = profiles.REPO_ROOT,
                notebook_dir: Path = NOTEBOOK_DIR,
                stage_settings: dict[str, type[profiles.StageSettings]] | None = None,
                shared_settings: type | None = None, scheduler: str | None = None,
                allow_insecure_scheduler: bool = False,
                overrides: list[str] | tuple[str, ...] = ()) -> tuple[list[Path], profiles.Profile]:
    """Every refusal a run can give from its arguments alone, before any work: the notebooks,
    the profile with its overrides (``config.load_profile``), the scheduler, the data root and
    the output root (a folder or nothing yet, never a file).
    Returns (stage notebooks, validated profile). Called before the run-folder lock is taken, so
    a refused run leaves no lock file, and again inside it."""
    stages = discover_stages(notebook_dir)
    if not stages:
        raise FileNotFoundError(f"no numbered notebooks (NN_name.ipynb) in {notebook_dir}")
    names = [p.stem for p in stages]
    stage_settings = profiles.STAGE_SETTINGS if stage_settings is None else stage_settings
    config = profiles.load_profile(  # every key is checked before any work
        profile, names, stage_settings=stage_settings,
        shared_settings=shared_settings or profiles.SharedSettings, overrides=overrides)
    missing = [name for name in names if name not in stage_settings]
    if missing:
        raise profiles.ProfileError(f"notebooks {missing} have no settings model in "
                                    "config.STAGE_SETTINGS")
    check_scheduler(config, scheduler, allow_insecure_scheduler)
    if data_root and not Path(data_root).is_dir():
        raise FileNotFoundError(f"--data-root {data_root} is not a folder")
    if Path(output_root).exists() and not Path(output_root).is_dir():
        raise NotADirectoryError(f"--output-root {output_root} is a file, not a folder")
    if data_root and output_inside_data_root(output_root, data_root):   # else stage 00 reruns every run
        raise ValueError(output_inside_data_root(output_root, data_root))
    return stages, config


CHECKED_ARGUMENTS = ("data_root", "output_root", "notebook_dir", "stage_settings", "shared_settings", "scheduler",
                     "allow_insecure_scheduler", "overrides")


def _one_run_per_folder(function):
    """Run ``function`` (``run_pipeline``) under ``run_folder_lock``; ``wait_for_lock`` seconds.
    The arguments are checked first (``checked_run``): a refused run takes no lock."""
    @functools.wraps(function)
    def locked(profile: str, *args, wait_for_lock: float = 0.0, **kwargs):
        checked_run(profile, **{k: v for k, v in kwargs.items() if k in CHECKED_ARGUMENTS})
        provenance = None
        try:
            with run_folder_lock(profile, kwargs.get("output_root", profiles.REPO_ROOT), wait_for_lock):
                provenance = function(profile, *args, **kwargs)
        except KeyboardInterrupt:
            if provenance is None:
                raise
        return provenance  # Ctrl-C while the lock was released: the run had finished its record
    return locked


@_one_run_per_folder
def run_pipeline(profile: str, *, data_root: str = "", force: bool = False,
                 only: list[str] | None = None, adopt_manifest: bool = False,
                 output_root: Path = profiles.REPO_ROOT, notebook_dir: Path = NOTEBOOK_DIR,
                 kernel_name: str = KERNEL_NAME,
                 stage_settings: dict[str, type[profiles.StageSettings]] | None = None,
                 shared_settings: type | None = None, scheduler: str | None = None,
                 allow_insecure_scheduler: bool = False,
                 overrides: list[str] | tuple[str, ...] = (),
                 manifest_reference: str | Path | None = None) -> dict[str, Any]:
    """Execute the profile's stages; return the provenance record (also written to disk).
    Raises ``StageFailed`` after writing the provenance of the failed run.

    ``manifest_reference``: the reference manifest folder of stage 00 (default the committed
    ``data_manifest/<profile>``; a generated data root with the paper profile must name
    another). ``overrides``: ``--set SECTION.KEY=VALUE`` texts, validated with the profile
    before any work; they enter the parameters, hence the digests, of the stages that read
    the key. ``scheduler`` / ``allow_insecure_scheduler`` replace the profile's
    ``shared.scheduler`` / ``shared.allow_insecure_scheduler`` and are checked before any work
    (a ``tcp://`` address without the opt-in is refused). Overrides and the scheduler are
    listed in ``provenance.json`` and the record.
    """
    started = time.perf_counter()
    stages, config = checked_run(profile, data_root=data_root, output_root=output_root,
                                 notebook_dir=notebook_dir,
                                 stage_settings=stage_settings, shared_settings=shared_settings,
                                 scheduler=scheduler, allow_insecure_scheduler=allow_insecure_scheduler,
                                 overrides=overrides)
    names = [p.stem for p in stages]
    stage_settings = profiles.STAGE_SETTINGS if stage_settings is None else stage_settings
    profile_name = config.profile
    paths = RunPaths(profile_name, Path(output_root).resolve())
    data_root = str(Path(data_root).resolve()) if data_root else ""
    mirror_layout = getattr(config.stage_settings(names[0]), "synthetic_layout", "") in ("mirror", "downloaded")
    reference_dir = manifest_reference_dir(profile_name, data_root, manifest_reference,
                                           adopt=adopt_manifest, mirror_layout=mirror_layout)

    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise ValueError(f"--only names unknown stages {unknown}; stages are {names}")

    # The record writer is loaded before the run touches its folder, so that the interrupt
    # handler below never imports (an import cut by Ctrl-C leaves half a module behind).
    import endoexplain_core.pipeline.record  # noqa: F401

    records: list[dict[str, Any]] = []
    failure: StageFailed | None = None
    try:
        _mark_running(paths)
        upstream = data_fingerprint(data_root, reference_dir)
        data_only = _data_only_fingerprint(data_root)
        for notebook in stages:
            stage = notebook.stem
            parameters = _notebook_parameters(
                config, stage, paths, data_root=data_root, reference_dir=reference_dir,
                adopt_manifest=adopt_manifest and stage == names[0], scheduler=scheduler,
                allow_insecure_scheduler=allow_insecure_scheduler)
            digest, upstream = _stage_digests(notebook, parameters, upstream,
                                              data_only if stage == names[0] else None)
            failure = _plan_and_run_stage(records, notebook, notebook_dir, paths, parameters, config,
                                          digest, kernel_name, force=force,
                                          selected=failure is None and (not only or stage in only)) or failure
    except RunFolderUnwritable:
        raise   # nothing ran; the previous record is as it was
    except OSError as error:
        # Between stages (hashing the notebooks, the data): the next stage is the failed one.
        failure = _record_os_error(records, stages, notebook_dir, error)
    except KeyboardInterrupt as stop:
        # Ctrl-C or SIGTERM at any moment of the loop (in a notebook, between cells, while
        # hashing or exporting): the record says so, never "running" or the previous "complete".
        _record_interrupt(records, stages, notebook_dir)
        try:
            _finish_record(paths, profile, profile_name, data_root, records, started, "interrupted",
                           config.overrides, interrupted_by=interrupted_by(stop))
        except OSError as error:   # the record marked "running" at the start stays
            log.warning("the record could not be written (%s)", _os_error_text(error))
        raise RunInterrupted(interrupted_by(stop)) from None
    return _finish_run(paths, profile, profile_name, data_root, records, started, failure,
                       config.overrides)


def _plan_and_run_stage(records: list[dict[str, Any]], notebook: Path, notebook_dir: Path,
                        paths: RunPaths, parameters: dict, config, digest: str, kernel_name: str, *,
                        force: bool, selected: bool) -> "StageFailed | None":
    """Append the stage's record (skipped, left out, or run now); return its failure, if any."""
    stamp = _read_stamp(paths.stamps / f"{notebook.stem}.json")
    record = _planned_record(records, notebook, notebook_dir, paths, parameters, config,
                             digest, stamp, force=force, selected=selected)
    if "status" in record:   # skipped or left out
        return None
    try:
        return _execute_stage_recorded(record, notebook, parameters, paths, kernel_name, stamp)
    except OSError as error:   # a full disk or read-only file system, in this process
        return _record_stage_os_error(record, error)


def _finish_run(paths: RunPaths, profile: str, profile_name: str, data_root: str,
                records: list[dict[str, Any]], started: float, failure: "StageFailed | None",
                overrides: tuple[str, ...]) -> dict[str, Any]:
    """Write the record of a run that was not interrupted ("failed" or "complete"); raise the
    stage's failure after it, or ``StageFailed`` when the record cannot be written."""
    try:
        provenance = _finish_record(paths, profile, profile_name, data_root, records, started,
                                    "failed" if failure else "complete", overrides)
    except OSError as error:
        # The record marked "running" before the first stage stays: never "complete".
        raise StageFailed(f"{failure or 'every stage finished'}; the record could not be written "
                          f"({_os_error_text(error)}): provenance.json and index.html say "
                          "\"running\"; run again when it can be (finished stages are skipped)") from None
    if failure is not None:
        raise failure
    return provenance


def _data_only_fingerprint(data_root: str) -> str:
    """What the stages after the first chain on: the data and the paper's reported values."""
    # Later stages read the data through the manifest, not the reference it was checked
    # against: adopting a reference (the first paper run) must not rerun them next time. The
    # paper's reported values (the paper-vs-run table of 09) are an input of the whole chain.
    return data_fingerprint(data_root, None) + (
        files.sha256_file(PAPER_VALUES) if PAPER_VALUES.is_file() else "")


def _stage_digests(notebook: Path, parameters: dict[str, Any], upstream: str,
                   data_only: str | None) -> tuple[str, str]:
    """The stage's digest and the upstream digest the next stage chains on: the stage's own,
    or for the first stage its digest over ``data_only`` (the data without the reference)."""
    # Where tasks run does not change what they compute, nor does where the reference
    # manifest lives or whether a new one is adopted (its content is in the first
    # stage's fingerprint): not part of the digest.
    digested = {k: v for k, v in parameters.items()
                if k not in (*profiles.EXECUTION_KEYS, *REFERENCE_KEYS)}
    core = core_code_digest(core_modules_used(notebook))
    digest = stage_digest(notebook, digested, core, upstream)
    return digest, (stage_digest(notebook, digested, core, data_only) if data_only is not None
                    else digest)


def _notebook_parameters(config, stage: str, paths: RunPaths, *, data_root: str,
                         reference_dir: Path, adopt_manifest: bool, scheduler: str | None,
                         allow_insecure_scheduler: bool) -> dict[str, Any]:
    """The Papermill parameters of one stage: its profile keys, the run's paths, and the
    command line's choices (``--adopt-manifest``, ``--scheduler`` beats the profile)."""
    parameters = {**profiles.stage_parameters(config, stage), "profile": config.profile,
                  "run_dir": str(paths.run_dir), "figures_dir": str(paths.figures_dir),
                  "data_root": data_root, "manifest_reference_dir": str(reference_dir)}
    if adopt_manifest:
        parameters["adopt_manifest"] = True
    if scheduler is not None and "scheduler" in parameters:
        parameters["scheduler"] = scheduler
    if allow_insecure_scheduler and "allow_insecure_scheduler" in parameters:
        parameters["allow_insecure_scheduler"] = True
    return parameters


def _planned_record(records: list[dict[str, Any]], notebook: Path, notebook_dir: Path,
                    paths: RunPaths, parameters: dict[str, Any], config, digest: str, stamp: dict,
                    *, selected: bool, force: bool) -> dict[str, Any]:
    """Append a stage's provenance record to ``records`` (before any status, so that a Ctrl-C
    from here on finds it) and return it; its status is set when it will not run: "not_run"
    (not selected by ``--only``, or after a failure) or "skipped" (its stamp matches the digest
    and its executed notebook exists, unless ``force``)."""
    stage = notebook.stem
    executed = paths.notebooks_out / notebook.name
    record = {"stage": stage, "notebook": str(notebook.relative_to(notebook_dir.parent)),
              "parameters": parameters, "overrides": stage_overrides(config, stage),
              "executed_notebook": str(executed),
              "html": str(executed.with_suffix(".html")), "digest": digest,
              "figure_files": stamp.get("figure_files", []), "seconds": 0.0}
    records.append(record)
    if not selected:
        record.update(status="not_run", last_run_seconds=stamp.get("seconds"),
                      up_to_date=stamp.get("digest") == digest)
    elif not force and stamp.get("digest") == digest and executed.is_file():
        record.update(status="skipped", seconds=0.0, last_run_seconds=stamp.get("seconds"))
        log.info("[%s] unchanged since its last run: skipped", stage)
    return record


def _execute_stage_recorded(record: dict[str, Any], notebook: Path, parameters: dict[str, Any],
                            paths: RunPaths, kernel_name: str, stamp: dict) -> StageFailed | None:
    """Execute one stage's notebook, filling ``record`` (status, seconds, figure files); on
    success write its stamp. Returns the stage's failure, or None."""
    stage, digest = record["stage"], record["digest"]
    executed, stamp_path = Path(record["executed_notebook"]), paths.stamps / f"{stage}.json"
    failure = None
    stamp_path.unlink(missing_ok=True)  # a killed run must not look finished
    log.info("[%s] running %s", stage, notebook.name)
    stage_started = time.perf_counter()
    record["started_at"] = stage_started
    before = _figure_snapshot(paths.figures_dir)
    kernel_log = files.write_text_atomic(paths.run_dir / "logs" / f"{stage}.kernel.log", "")
    try:
        with _stage_environment(stage, paths.run_dir / "logs" / f"{stage}.log"):
            execute_stage(notebook, executed, parameters, kernel_name, kernel_log)
        record["status"] = "ran"
    except StageFailed as error:
        record["status"] = "failed"
        record["error"] = str(error)
        failure = error
    record["seconds"] = round(time.perf_counter() - record.pop("started_at"), 2)
    after = _figure_snapshot(paths.figures_dir)
    record["figure_files"] = sorted(name for name, mtime in after.items()
                                    if before.get(name) != mtime)
    if failure is not None:   # what its last finished run wrote is its too (out of date now)
        record["figure_files"] = sorted(set(record["figure_files"]) | set(stamp.get("figure_files", [])))
    if executed.is_file():
        export_html(executed)
        from endoexplain_core.pipeline.record import link_provenance  # pandas-heavy: imported when needed
        link_provenance(paths.figures_dir, stage, executed, parameters, digest)
    if failure is None:
        files.write_json_atomic(stamp_path, {"digest": digest, "seconds": record["seconds"],
                                             "figure_files": record["figure_files"],
                                             "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
        log.info("[%s] done in %.1f s", stage, record["seconds"])
    return failure


def _record_stage_os_error(record: dict[str, Any], error: OSError) -> StageFailed:
    """In place: ``record``'s stage is "failed" because the OS refused a read or write in this
    process (a full disk, a read-only file system) while it ran or saved its notebook; its stamp
    was removed when it started, so it reruns. Returns the failure (one line)."""
    earlier = f"{record['error']}; then " if record.get("status") == "failed" and record.get("error") else ""
    failure = StageFailed(f"{earlier}{record['stage']} stopped: {_os_error_text(error)}; it reruns "
                          "when the run is started again")
    started_at = record.pop("started_at", None)
    record.update(status="failed", error=str(failure),
                  seconds=round(time.perf_counter() - started_at, 2) if started_at
                  else record.get("seconds", 0.0))
    return failure


def _record_os_error(records: list[dict[str, Any]], stages: list[Path], notebook_dir: Path,
                     error: OSError) -> StageFailed:
    """In place: an OS error outside a stage's execution (hashing, reading the data) fails the
    stage being planned (the last record without a status, else the next stage); every stage
    after it "not_run". Returns the failure."""
    if (not records or "status" in records[-1]) and len(records) < len(stages):
        upcoming = stages[len(records)]
        records.append({"stage": upcoming.stem, "seconds": 0.0,
                        "notebook": str(upcoming.relative_to(notebook_dir.parent))})
    failure = (_record_stage_os_error(records[-1], error) if records and "status" not in records[-1]
               else StageFailed(f"the run stopped: {_os_error_text(error)}"))
    for later in stages[len(records):]:
        records.append({"stage": later.stem, "status": "not_run", "seconds": 0.0,
                        "notebook": str(later.relative_to(notebook_dir.parent))})
    return failure


def _record_interrupt(records: list[dict[str, Any]], stages: list[Path], notebook_dir: Path) -> None:
    """In place: the stage that was running when Ctrl-C came is "interrupted" (a stage whose
    record has no status yet, or is still timed); every stage after it "not_run"."""
    if records and ("status" not in records[-1] or "started_at" in records[-1]):
        current = records[-1]
        started_at = current.pop("started_at", None)
        current.update(status="interrupted",
                       seconds=round(time.perf_counter() - started_at, 2) if started_at else 0.0)
    for later in stages[len(records):]:
        records.append({"stage": later.stem, "status": "not_run", "seconds": 0.0,
                        "notebook": str(later.relative_to(notebook_dir.parent))})


def _read_stamp(path: Path) -> dict[str, Any]:
    """A stage's stamp, or {} when there is none or it is unreadable (named in the log; the
    stage then reruns, as when its stamp is missing)."""
    if not path.is_file():
        return {}
    try:
        stamp = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        log.warning("stamp %s is unreadable (%s): its stage reruns", path, type(error).__name__)
        return {}
    if not isinstance(stamp, dict):
        log.warning("stamp %s holds no record: its stage reruns", path)
        return {}
    return stamp


def _mark_running(paths: RunPaths) -> None:
    """Mark the previous run's record stale before any stage runs: ``provenance.json``'s status
    becomes "running" and ``index.html`` is rewritten from it (its banner says so), or removed
    where it cannot be. A run that dies without writing its record (SIGKILL, power, a full disk)
    then never leaves "complete" behind. Raises ``RunFolderUnwritable`` when the marks cannot
    be written: the run must not start (the previous record is then as it was)."""
    layout = RunLayout(paths.run_dir)
    previous = None
    if layout.provenance.is_file():
        try:
            previous = json.loads(layout.provenance.read_text())
        except (OSError, ValueError):
            previous = None   # unreadable: it says nothing, and the run writes a new one
    try:
        if isinstance(previous, dict):
            previous["status"] = "running"
            files.write_json_atomic(layout.provenance, previous)
        if layout.index_html.is_file():
            _mark_index_running(paths, previous if isinstance(previous, dict) else None)
    except OSError as error:
        raise RunFolderUnwritable(f"the run folder {paths.run_dir} cannot be written "
                                  f"({_os_error_text(error)}); nothing ran and the previous "
                                  "record is as it was") from None


def _mark_index_running(paths: RunPaths, previous: dict[str, Any] | None) -> None:
    """``index.html`` rewritten from ``previous`` (status "running"), or removed; an OSError
    only when neither can be done."""
    from endoexplain_core.pipeline import record

    try:
        if previous is None:
            raise ValueError("no readable provenance.json to write the record from")
        record.write_run_index(paths.run_dir, paths.figures_dir, previous)
    except Exception:   # noqa: BLE001 -- a full disk, or a record an older version wrote that
        # this code cannot render: a page that says "complete" must not stay either way.
        RunLayout(paths.run_dir).index_html.unlink(missing_ok=True)


def stage_overrides(config: profiles.Profile, stage: str) -> list[str]:
    """The ``--set`` texts that reach ``stage``'s parameters: its own section's, and the shared
    keys it uses (``uses_shared``)."""
    settings = config.stage_settings(stage)
    reached = []
    for text in config.overrides:
        override = profiles.parse_override(text)
        if override.section == stage or (override.section == "shared"
                                         and override.keys[0] in settings.uses_shared):
            reached.append(text)
    return reached


def _finish_record(paths: RunPaths, profile: str, profile_name: str, data_root: str,
                   records: list[dict[str, Any]], started: float, status: str,
                   overrides: tuple[str, ...] = (), *,
                   interrupted_by: str | None = None) -> dict[str, Any]:
    """Write ``provenance.json`` and the run record with ``status`` (complete, failed or
    interrupted; ``interrupted_by`` "Ctrl-C" or "SIGTERM" is recorded with it); return the
    provenance. Ctrl-C and SIGTERM are ignored meanwhile (``interrupts_ignored``): a second
    one must not leave the two disagreeing."""
    with interrupts_ignored():
        return _write_provenance_and_record(paths, profile, profile_name, data_root, records,
                                            started, status, overrides, interrupted_by)


@contextlib.contextmanager
def interrupts_ignored():
    """Ignore Ctrl-C (SIGINT) and SIGTERM for the block, then restore their handlers; outside
    the main thread (where signal handlers cannot be set) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_raises_terminated():
    """For the block, SIGTERM raises ``Terminated`` in the main thread (so the run stops as at
    Ctrl-C, writing its record); the previous handler is restored after. Outside the main
    thread the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write_provenance_and_record(paths: RunPaths, profile: str, profile_name: str, data_root: str,
                                 records: list[dict[str, Any]], started: float, status: str,
                                 overrides: tuple[str, ...],
                                 interrupted_by: str | None = None) -> dict[str, Any]:
    provenance = {
        "profile": profile_name,
        "config_file": str(profiles.profile_path(profile)),
        "overrides": list(overrides),
        "data_root": data_root or "(embedded synthetic cohort)",
        "synthetic_data": profiles.is_synthetic_data(data_root),
        "endoexplain_version": endoexplain_core.__version__,
        "git": git_state(),
        "packages": package_versions(),
        "device": device_description(),
        "parameters": {r["stage"]: r["parameters"] for r in records if "parameters" in r},
        "manifest_digest": _manifest_digest(paths.run_dir),
        "checkpoints": _checkpoint_digests(paths.run_dir),
        "stages": records,
        "wall_seconds": round(time.perf_counter() - started, 2),
        "status": status,
        **({"interrupted_by": interrupted_by} if interrupted_by else {}),
    }
    files.write_json_atomic(RunLayout(paths.run_dir).provenance, provenance)
    _write_record(paths, provenance)
    return provenance


def _write_record(paths: RunPaths, provenance: dict[str, Any]) -> None:
    """Figure index and ``index.html`` (see ``endoexplain_core.pipeline.record``)."""
    from endoexplain_core.pipeline import record

    record.write_figure_index(paths.figures_dir, provenance["stages"])
    record.write_run_index(paths.run_dir, paths.figures_dir, provenance)


def manifest_reference_dir(profile_name: str, data_root: str, manifest_reference: str | Path | None,
                           *, adopt: bool = False, mirror_layout: bool = False) -> Path:
    """The reference manifest folder of a run (``run_pipeline``'s ``manifest_reference``).

    ``ValueError`` when the committed ``data_manifest/<profile>`` would be checked against, or
    replaced by, frames it does not describe: the paper profile on a generated data root (that
    reference is the real datasets'), and adopting the manifest of a generated data root or of
    the mirror layout into any profile's committed reference (the embedded cohort's)."""
    if manifest_reference:
        return Path(manifest_reference).expanduser().resolve()
    generated_root = bool(data_root) and profiles.is_synthetic_data(data_root)
    if profile_name == "paper" and generated_root:
        raise ValueError(f"--data-root {data_root} holds generated frames ({profiles.SYNTHETIC_MARKER}); "
                         "data_manifest/paper is the real datasets' reference manifest: give the "
                         "rehearsal its own with --manifest-reference DIR (and --adopt-manifest)")
    if adopt and (generated_root or mirror_layout):
        raise ValueError(f"--adopt-manifest would replace data_manifest/{profile_name} (the embedded "
                         "cohort's reference) with the manifest of a "
                         + ("generated data root" if generated_root else "mirror-layout cohort")
                         + ": give it its own folder with --manifest-reference DIR")
    return profiles.REPO_ROOT / "data_manifest" / profile_name


def preflight_main(profile: str, data_root: str, output_root: Path, overrides: list[str],
                   manifest_reference: str | None = None, *, scheduler: str | None = None,
                   allow_insecure_scheduler: bool = False) -> int:
    """``run_all.sh --check``: the run's own argument checks (``checked_run``: profile with its
    ``--set``, scheduler, output root), then every preflight check, printed
    (``pipeline.preflight``); 0 when ready, 2 when not."""
    from endoexplain_core.pipeline import preflight

    try:
        _, config = checked_run(profile, output_root=output_root, scheduler=scheduler,
                                allow_insecure_scheduler=allow_insecure_scheduler, overrides=overrides)
    except (profiles.ProfileError, NotADirectoryError, FileNotFoundError, ValueError) as error:
        print(f"run_all: {error}", file=sys.stderr)
        return 2
    run_dir = RunPaths(config.profile, output_root.resolve()).run_dir
    # The paper's counts are printed beside the data's only for the paper profile.
    reference = profiles.REPO_ROOT / "data_manifest" / "paper" if config.profile == "paper" else None
    findings = preflight.run_preflight(config, data_root, run_dir, paper_reference=reference,
                                       estimate=True, scheduler=scheduler)
    try:
        manifest_reference_dir(config.profile, data_root, manifest_reference)
    except ValueError as error:
        findings.append(preflight.Finding("data", "reference manifest", preflight.PROBLEM, str(error)))
    text, code = preflight.report(findings)
    print(text)
    return code


def main(argv: list[str] | None = None, *, notebook_dir: Path = NOTEBOOK_DIR,
         stage_settings: dict[str, type[profiles.StageSettings]] | None = None,
         shared_settings: type | None = None) -> int:
    """``run_all.sh``: parse the command line, refuse a bad one in one line, run the pipeline;
    returns the exit code. ``notebook_dir``, ``stage_settings`` and ``shared_settings`` as in
    ``run_pipeline`` (the interrupt tests run throwaway stages through this entry point).
    SIGTERM (``timeout``, SLURM, systemd) is handled as Ctrl-C is, with exit 143 for 130
    (``sigterm_raises_terminated``); a run folder that cannot be written is one line, exit 2.
    """
    with sigterm_raises_terminated():
        return _command_line(argv, notebook_dir=notebook_dir, stage_settings=stage_settings,
                             shared_settings=shared_settings)


def interrupted_line(text: str, by: str) -> str:
    """One of the "run_all: ... interrupted ..." lines, naming SIGTERM when it was that."""
    return text if by == "Ctrl-C" else text.replace("interrupted", f"interrupted ({by})", 1)


def _command_line(argv: list[str] | None, *, notebook_dir: Path,
                  stage_settings: dict[str, type[profiles.StageSettings]] | None,
                  shared_settings: type | None) -> int:
    """``main``'s body, under its SIGTERM handler."""
    args = build_parser().parse_args(argv)
    try:
        check_lock_wait(args.wait_for_lock)
    except ValueError as error:   # before anything is written: no lock file is left behind
        print(f"run_all: {error}", file=sys.stderr)
        return 2
    try:
        args.overrides = [text for path in args.set_file for text in profiles.read_set_file(path)
                          ] + args.overrides
    except profiles.ProfileError as error:
        print(f"run_all: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stdout)
    if args.check:
        try:
            return preflight_main(args.profile, args.data_root, Path(args.output_root), args.overrides,
                                  args.manifest_reference, scheduler=args.scheduler,
                                  allow_insecure_scheduler=args.allow_insecure_scheduler)
        except KeyboardInterrupt as stop:
            print(interrupted_line("\nrun_all: preflight interrupted; nothing was written",
                                   interrupted_by(stop)), file=sys.stderr)
            return INTERRUPT_EXIT_CODES[interrupted_by(stop)]
    try:
        provenance = run_pipeline(args.profile, data_root=args.data_root, force=args.force,
                                  only=args.only, adopt_manifest=args.adopt_manifest,
                                  output_root=Path(args.output_root),
                                  wait_for_lock=args.wait_for_lock, scheduler=args.scheduler,
                                  allow_insecure_scheduler=args.allow_insecure_scheduler,
                                  overrides=args.overrides,
                                  manifest_reference=args.manifest_reference,
                                  notebook_dir=notebook_dir, stage_settings=stage_settings,
                                  shared_settings=shared_settings)
    except (RunFolderLocked, RunFolderUnwritable) as error:
        print(f"run_all: {error}", file=sys.stderr)
        return 2
    except RunInterrupted as stop:
        print(interrupted_line("\nrun_all: interrupted; provenance.json and index.html say so, "
                               "and the stopped stage reruns next time", stop.by), file=sys.stderr)
        return INTERRUPT_EXIT_CODES[stop.by]
    except KeyboardInterrupt as stop:
        print(interrupted_line(INTERRUPTED_BEFORE_THE_RUN, interrupted_by(stop)), file=sys.stderr)
        return INTERRUPT_EXIT_CODES[interrupted_by(stop)]
    except StageFailed as error:
        print(f"\nrun_all: STOPPED. {error}", file=sys.stderr)
        return 1
    except (profiles.ProfileError, FileNotFoundError, NotADirectoryError, ValueError) as error:
        print(f"run_all: {error}", file=sys.stderr)
        return 2
    run_dir = Path(args.output_root) / "runs" / provenance["profile"]
    print(f"\nrun_all: {provenance['status']} in {provenance['wall_seconds']:.0f} s; "
          f"record: {run_dir / 'index.html'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``run_all.sh`` command line (README, "`run_all.sh`")."""
    parser = argparse.ArgumentParser(prog="run_all.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="default",
                        help="smoke | default | paper, or a path to a profile YAML")
    parser.add_argument("--data-root", default="",
                        help="folder with the real datasets (default: embedded synthetic cohort)")
    parser.add_argument("--force", action="store_true", help="rerun stages even if unchanged")
    parser.add_argument("--only", nargs="+", metavar="STAGE", default=None,
                        help="run only these stages, e.g. 00_roles 01_training")
    parser.add_argument("--adopt-manifest", action="store_true",
                        help="accept a manifest that differs from data_manifest/<profile>/ and "
                             "make it the new reference")
    parser.add_argument("--manifest-reference", default=None, metavar="DIR",
                        help="folder of the reference manifest that stage 00 compares with and "
                             "--adopt-manifest writes (default: data_manifest/<profile>/; a "
                             "rehearsal of the paper profile on generated data needs its own)")
    parser.add_argument("--output-root", default=str(profiles.REPO_ROOT),
                        help="where runs/ and figures/ are written (default: the repository)")
    parser.add_argument("--scheduler", default=None, metavar="WHERE",
                        help='where training/audit tasks run: "sequential" (in this process), '
                             '"local:N" (a private local Dask cluster of N worker processes: '
                             'TLS on 127.0.0.1, one per GPU when GPUs are present) or '
                             '"tls://HOST:PORT" (a running Dask scheduler; certificates from '
                             'the Dask config distributed.comm.tls.*); default: the profile\'s '
                             'shared.scheduler')
    parser.add_argument("--allow-insecure-scheduler", action="store_true",
                        help="accept a plain tcp://HOST:PORT scheduler (unencrypted and "
                             "unauthenticated: anyone reaching the port can run code on its "
                             "workers); profile key shared.allow_insecure_scheduler")
    parser.add_argument("--set", action="append", default=[], dest="overrides",
                        metavar="SECTION.KEY=VALUE",
                        help="override one profile setting for this run, validated like the file, "
                             "e.g. --set 01_training.training_settings.epochs=1 or --set "
                             "shared.image_size=128 (repeatable; recorded in provenance.json)")
    parser.add_argument("--set-file", action="append", default=[], metavar="FILE",
                        help="--set texts from a file, one SECTION.KEY=VALUE per line (# comments), "
                             "applied before the command line's --set; e.g. "
                             "configs/paper_rehearsal.sets")
    parser.add_argument("--check", action="store_true",
                        help="preflight only: check the data root, every dataset and weight file the "
                             "profile needs, the device and the free disk, print every finding and "
                             "exit 0 (ready) or 2 (not ready); trains and writes nothing")
    parser.add_argument("--wait-for-lock", type=float, default=0.0, metavar="SECONDS",
                        help="if another run holds this run folder, wait up to SECONDS for it "
                             "(-1: wait indefinitely; default 0: stop at once with a message)")
    return parser


INTERRUPTED_BEFORE_THE_RUN = "\nrun_all: interrupted before the run started; nothing was written"


def exit_quietly(entry) -> None:
    """Exit with ``entry()``'s code (``main``). Ctrl-C (or SIGTERM, ``Terminated``) outside the
    run (reading the command line) is one line, exit 130 (143); once ``entry`` has returned, a
    late Ctrl-C cannot turn the interpreter's exit into a traceback."""
    try:
        code = entry()
    except KeyboardInterrupt as stop:
        print(interrupted_line(INTERRUPTED_BEFORE_THE_RUN, interrupted_by(stop)), file=sys.stderr)
        code = INTERRUPT_EXIT_CODES[interrupted_by(stop)]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    exit_quietly(main)
