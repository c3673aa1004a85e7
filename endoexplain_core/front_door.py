"""The front door shared by the ``endoexplain`` commands (``audit``, ``gate``, ``verify``): the
one-line refusal, the output folder's checks and lock, loading a user's weights safely, and
whole-or-nothing outputs (a staging folder, then a commit record written last that ``verify``
checks). Contract of each command: docs/own_model.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Sequence

from endoexplain_core import files


class CommandError(Exception):
    """A refusal with a one-line reason; the command exits with code 2."""


def _same_bytes(first: Path, second: Path) -> bool:
    """Whether two files hold the same bytes (sizes first, then SHA-256)."""
    return (first.stat().st_size == second.stat().st_size
            and files.sha256_file(first) == files.sha256_file(second))


def check_output_folder(out: str | Path, inputs: dict[str, str | Path]) -> Path:
    """The resolved ``--out`` folder, created, after the refusals: a path that is a file, a
    folder that cannot be written, and an output folder equal to, inside or containing one of
    ``inputs`` (option name -> folder): the audit never writes into its inputs."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {out} is a file, not a folder")
    resolved = out.resolve()
    for option, folder in inputs.items():
        folder = Path(folder).resolve()
        if resolved == folder or folder in resolved.parents:
            raise CommandError(f"--out {out} is inside the {option} folder {folder}; write the "
                               f"audit to a folder of its own")
        if resolved in folder.parents:
            raise CommandError(f"--out {out} contains the {option} folder {folder}; write the "
                               f"audit to a folder of its own (never beside or above the inputs)")
    try:
        resolved.mkdir(parents=True, exist_ok=True)
        probe = resolved / f".endoexplain-write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise CommandError(f"--out {out} cannot be written ({error.strerror or error})") from error
    return resolved


LOCK_NAME = ".endoexplain-audit.lock"


@contextlib.contextmanager
def output_folder_lock(out: Path, wait_seconds: float = 0.0, holders: str = "audit"):
    """Hold the exclusive lock ``<out>/.endoexplain-audit.lock`` for the block
    (``files.exclusive_lock``); another holder past ``wait_seconds``: ``CommandError``.
    ``audit`` and ``gate`` take the same lock, so neither writes into a folder the other is
    writing; ``holders`` names who that may be in the message."""

    try:
        with files.exclusive_lock(out / LOCK_NAME, wait_seconds):
            yield out
    except files.LockHeld as held:
        raise CommandError(f"another endoexplain {holders} is writing into {out} ({held.holder}); wait "
                           f"for it to finish, or pass --wait-for-lock SECONDS to queue behind it") from None


def check_weight_tensors(state: dict, weights: Path) -> None:
    """Refuse a state dict holding a non-floating tensor (other than BatchNorm's batch
    counters) or a non-finite value, naming the tensor: such weights would audit a model that
    scores every image 1.0 or NaN."""
    import torch

    for key, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise CommandError(f"{weights}: entry {key!r} is a {type(tensor).__name__}, not a tensor")
        if key.endswith("num_batches_tracked"):
            continue
        if not tensor.is_floating_point():
            raise CommandError(f"{weights}: tensor {key!r} is {tensor.dtype}, not floating point")
        if not bool(torch.isfinite(tensor).all()):
            raise CommandError(f"{weights}: tensor {key!r} holds non-finite values (inf or NaN)")


def load_user_model(arch: str, weights: str | Path, *, torchscript: bool = False,
                    positive_class: int = 1):
    """(model in eval mode, its CAM-layer owner, weights SHA-256) for a 2-class ``arch``.

    ``weights``: safetensors, a torch state dict (read with ``weights_only=True``) or, with
    ``torchscript``, a TorchScript archive whose parameters are loaded into ``arch`` (CAMs need
    the eager modules' hooks, which a scripted graph does not run). ``positive_class`` 0 swaps
    the two outputs so that column 1 is the positive class, as the audit expects.
    Raises ``CommandError`` with the reason for any refusal.
    """
    import torch

    from endoexplain_core.models import checkpoint, networks

    if arch not in networks.AUDITABLE_ARCHITECTURES:
        raise CommandError(f"unknown architecture {arch!r}; known: "
                           f"{', '.join(networks.AUDITABLE_ARCHITECTURES)}")
    if positive_class not in (0, 1):
        raise CommandError(f"--positive-class must be 0 or 1 (a 2-class head), got {positive_class}")
    weights = Path(weights)
    shown = files.short_text(str(weights))
    try:
        weights.is_file()
    except OSError as error:      # e.g. a path too long for the file system
        raise CommandError(f"weights path {shown} cannot be used: {error.strerror}") from None
    try:
        if torchscript:
            if not weights.is_file():
                raise FileNotFoundError(f"weights file {weights} does not exist")
            with open(weights, "rb") as handle:
                checkpoint.check_declared_size(weights, handle.read(8))
            try:
                state = dict(torch.jit.load(str(weights), map_location="cpu").state_dict())
            except (RuntimeError, torch.jit.Error) as error:   # torch.jit.Error: raised by the archive's code
                raise CommandError(f"{weights}: not a loadable TorchScript archive "
                                   f"({checkpoint._first_line(error)})") from error
        else:
            state = checkpoint.load_state_dict(weights)
    except (checkpoint.CheckpointError, FileNotFoundError) as error:
        raise CommandError(str(error)) from error
    check_weight_tensors(state, weights)
    model = networks.build_model(arch, num_classes=2)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        details = " ".join(str(error).split())[:300]
        raise CommandError(f"{weights}: the weights do not fit a 2-class {arch} ({details})") from error
    if positive_class == 0:
        head = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
        with torch.no_grad():  # swap the rows: output 1 becomes the positive class
            head.weight.copy_(head.weight.flip(0))
            head.bias.copy_(head.bias.flip(0))
    return model.eval(), files.sha256_file(weights)


def probe_model(model, layer, layer_name: str, image_size: int) -> tuple[int, int]:
    """(height, width) of the target layer's feature grid at ``image_size``, from one forward
    pass on a fixed random input (CPU). Refuses an input size the architecture cannot take, a
    target layer without a (B, C, H, W) output, a grid under 2x2 (one cell has no peak to
    place) and non-finite logits."""
    import torch

    captured: dict = {}
    handle = layer.register_forward_hook(lambda module, inputs, output: captured.setdefault("out", output))
    probe = torch.randn(1, 3, image_size, image_size, generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            logits = model.cpu()(probe)
    except RuntimeError as error:
        raise CommandError(f"--image-size {image_size} does not fit the model "
                           f"({' '.join(str(error).split())[:200]})") from error
    finally:
        handle.remove()
    output = captured.get("out")
    if not isinstance(output, torch.Tensor) or output.dim() != 4:
        raise CommandError(f"target layer {layer_name} gives no (B, C, H, W) feature map; "
                           f"choose a convolutional block with --target-layer")
    height, width = output.shape[-2:]
    if height < 2 or width < 2:
        raise CommandError(f"--image-size {image_size} gives a {height}x{width} feature grid at "
                           f"{layer_name}; the audit needs at least 2x2 (use a larger --image-size)")
    if not bool(torch.isfinite(logits).all()):
        raise CommandError("the model's logits on a test input are not finite (inf or NaN); "
                           "check the weights")
    return int(height), int(width)


def _os_error_text(error: OSError, staging: Path, out: Path) -> str:
    """An OS error in words with the file it names, as the file's place in ``out`` (the
    staging folder is removed; ``files.replace_atomically`` puts the file in its message,
    other errors carry it in ``filename``)."""
    text = error.strerror or str(error)
    if error.filename and str(error.filename) not in text:
        text = f"{error.filename}: {text}"
    return text.replace(str(staging), str(out))


RECORD_NAME = "audit.json"


GATE_RECORD_NAME = "gate.json"        # the commit record of an ``endoexplain gate`` folder


RECORD_NAMES = (RECORD_NAME, GATE_RECORD_NAME)


def staging_folder(out: Path) -> Path:
    """A new ``<out>/.staging-<pid>/`` for this run's files, after removing the staging folders
    of runs that died (a SIGKILL leaves its folder; the lock says no other run is alive here)."""
    for leftover in out.glob(".staging-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    staging = out / f".staging-{os.getpid()}"
    staging.mkdir()
    return staging


def commit_outputs(staging: Path, out: Path, record: dict, record_name: str = RECORD_NAME) -> list[Path]:
    """Move every file of ``staging`` into ``out``, then write ``record_name`` (``audit.json``,
    or ``gate.json`` for a gate) last: the commit record, listing each file's SHA-256
    (``files``). The previous record is removed first, so a run stopped while moving leaves a
    folder without a record, never a record that vouches for other files. Returns the final
    paths."""
    staged = sorted(p for p in staging.rglob("*") if p.is_file())
    record["files"] = {str(p.relative_to(staging)): files.sha256_file(p) for p in staged}
    previous = _listed_files(out, record_name)
    (out / record_name).unlink(missing_ok=True)
    final = []
    for path in staged:
        target = out / path.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        final.append(target)
    # The previous audit's files that this one does not write (its report.html when this run
    # has --report none) would sit beside the new tables as if they belonged to them.
    for name in sorted(set(previous) - set(record["files"])):
        (out / name).unlink(missing_ok=True)
    shown = {k: v for k, v in record.items() if k != "written"}
    final.append(files.write_text_atomic(out / record_name, json.dumps(shown, indent=1)))
    return final


MAX_RECORD_BYTES = 16 << 20     # an audit.json lists a few dozen files; 16 MiB is far beyond


def _inside(folder: Path, name: str) -> bool:
    """``name`` is a relative path that stays inside ``folder`` (no absolute path, no '..')."""
    relative = Path(name)
    return (not relative.is_absolute() and ".." not in relative.parts
            and (folder / relative).resolve().is_relative_to(folder.resolve()))


def _listed_files(folder: Path, record_name: str | None = None) -> dict[str, str]:
    """The files a folder's record lists (name -> SHA-256), only names inside the folder; {}
    when there is no readable record. ``record_name``: ``audit.json`` or ``gate.json`` (None:
    the one the folder holds, ``record_in``)."""
    record_name = record_name or record_in(folder)
    try:
        listed = json.loads(files.read_bounded(folder / record_name, MAX_RECORD_BYTES,
                                               record_name)).get("files")
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(listed, dict):
        return {}
    return {str(name): digest for name, digest in listed.items() if _inside(folder, str(name))}


def record_in(folder: Path) -> str:
    """The commit record a folder holds: ``gate.json`` for a gate folder, else ``audit.json``
    (also when it holds neither: the name the problems then mention)."""
    return GATE_RECORD_NAME if (Path(folder) / GATE_RECORD_NAME).is_file() else RECORD_NAME


def verify_folder(folder: str | Path) -> list[str]:
    """Problems of an audit or gate folder against its commit record (empty: ``audit.json`` or
    ``gate.json`` lists at least one file, every listed file is inside the folder and there
    with its SHA-256, and every file of the folder is listed; hidden files such as the lock are
    not outputs). A folder with both records is a problem: each would vouch for other files."""
    folder = Path(folder)
    present = [name for name in RECORD_NAMES if (folder / name).is_file()]
    if not present:
        return [f"{folder} has no {RECORD_NAME} or {GATE_RECORD_NAME}: an interrupted audit or "
                f"gate, or not such a folder"]
    if len(present) > 1:
        return [f"{folder} holds both {RECORD_NAME} and {GATE_RECORD_NAME}: an audit and a gate "
                f"must each have a folder of their own"]
    record_name = present[0]
    record_path = folder / record_name
    try:
        listed = json.loads(files.read_bounded(record_path, MAX_RECORD_BYTES, record_name)).get("files")
    except (OSError, ValueError, AttributeError) as error:
        return [f"{record_path} is not a readable audit record ({files.short_text(str(error))})"]
    if not isinstance(listed, dict) or not listed:
        return [f"{record_path} lists no files: it vouches for nothing"]
    writer = "gate" if record_name == GATE_RECORD_NAME else "audit"
    problems = []
    for name, digest in sorted(listed.items()):
        if not _inside(folder, str(name)):
            problems.append(f"{files.short_text(str(name))}: outside the folder (not checked)")
            continue
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif files.sha256_file(path) != digest:
            problems.append(f"{name}: changed since the {writer} wrote it")
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
               and not any(part.startswith(".") for part in p.relative_to(folder).parts)}
    for name in sorted(present - set(listed) - {record_name}):
        problems.append(f"{name}: not listed in {record_name} (not written by this {writer})")
    return problems


def _check_methods(requested: Sequence[str] | None, known: Sequence[str]) -> tuple[str, ...]:
    if not requested:
        return tuple(known)
    unknown = [m for m in requested if m not in known]
    if unknown:
        raise CommandError(f"unknown --methods {unknown}; known: {', '.join(known)}")
    return tuple(m for m in known if m in requested)


REPORT_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:70em;color:#222;line-height:1.4}
table{border-collapse:collapse;margin:0.8em 0;font-size:0.9em}
th,td{border:1px solid #ccc;padding:0.25em 0.6em;text-align:left}
th{background:#f2f2f2} img{max-width:100%} .note{color:#555;font-size:0.9em}
code{background:#f5f5f5;padding:0 0.2em}
"""


def add_run_arguments(run, *, device_help: str, batch_help: str) -> None:
    """The options every writing command shares (``audit``, ``gate``): ``--out``, ``--device``,
    ``--batch-size`` and ``--wait-for-lock`` (the lock both commands take on ``--out``)."""
    run.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    run.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help=device_help)
    run.add_argument("--batch-size", type=int, default=16, metavar="N", help=batch_help)
    run.add_argument("--wait-for-lock", type=float, default=0.0, metavar="SECONDS",
                     help="when another audit or gate is writing into --out, wait this long for "
                          "it (default 0: refuse at once)")
