"""Content hashes, bounded reads, the run lock and atomic file writes, one implementation.

Atomic writes go to a temporary sibling, flushed and renamed over the target; on an OS error
the temporary file is removed, the target keeps its content and the error names it.

Design: docs/data_models_runs.md, "Run layout and atomic files".
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd


def sha256_bytes(data: bytes) -> str:
    """Lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


class FileTooLarge(ValueError):
    """A file a user named is larger than the reader's limit (the message names both)."""


def read_bounded(path: str | Path, limit_bytes: int, what: str) -> bytes:
    """The bytes of ``path``, read only up to ``limit_bytes`` + 1: a file (or a device such as
    ``/dev/zero``) beyond the limit raises ``FileTooLarge`` naming it and the limit instead of
    filling memory. ``what`` names the file's role in the message ("--set-file")."""
    with open(path, "rb") as handle:
        data = handle.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise FileTooLarge(f"{what} {path}: larger than the {limit_bytes / 2**20:.0f} MiB a "
                           f"{what} may have; not read further")
    return data


def short_text(text: str, limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters with the number left out, for messages that echo
    user input (a 20 MB ``--set`` must not come back as 20 MB of stderr)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def sha256_file(path: str | Path) -> str:
    """Lowercase hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def temporary_sibling(path: str | Path, suffix: str) -> Path:
    """``<dir>/.<name>.<pid>.<suffix>``: a temporary name no other process uses, after removing
    the ones left by processes that died (a SIGKILL runs no cleanup)."""
    path = Path(path)
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*.{suffix}"):
        pid = leftover.name[len(path.name) + 2:-len(suffix) - 1]
        if pid.isdigit() and not _process_alive(int(pid)):
            leftover.unlink(missing_ok=True)
    return path.with_name(f".{path.name}.{os.getpid()}.{suffix}")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def replace_atomically(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """``write(temporary)``, then rename the temporary file over ``path`` (parents created).
    On an OS error (full disk, quota) the temporary file is removed, ``path`` keeps its
    previous content and the error names it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_sibling(path, "tmp")
    try:
        write(temporary)
        with open(temporary, "rb+") as handle:  # on disk before the rename makes it visible
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise OSError(error.errno, f"could not write {path} ({error.strerror or error}); the "
                                   f"previous file, if any, is unchanged") from error
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` atomically."""
    return replace_atomically(path, lambda temporary: temporary.write_bytes(data))


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write UTF-8 ``text`` atomically."""
    return replace_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def write_json_atomic(path: str | Path, payload: Any) -> Path:
    """Write ``payload`` as indented, key-sorted JSON atomically (unknown types as strings)."""
    return write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def write_csv_atomic(table: pd.DataFrame, path: str | Path) -> Path:
    """Write a CSV (no index, LF line ends) atomically."""
    return replace_atomically(path, lambda temporary: table.to_csv(temporary, index=False,
                                                                    lineterminator="\n"))


def write_parquet_atomic(table: pd.DataFrame, path: str | Path) -> Path:
    """Write a Parquet file (no index) atomically."""
    return replace_atomically(path, lambda temporary: table.to_parquet(temporary, index=False))


class LockHeld(RuntimeError):
    """Another process holds an ``exclusive_lock``; ``holder`` says which (pid, host, start)."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is held by {holder}")
        self.path, self.holder = path, holder


@contextlib.contextmanager
def exclusive_lock(path: str | Path, wait_seconds: float = 0.0):
    """Hold an OS file lock on ``path`` for the block (flock on POSIX: released by the kernel
    when the holder dies, even by SIGKILL), with ``<path>.owner`` naming the holder. Another
    holder: wait up to ``wait_seconds`` (negative: indefinitely), then raise ``LockHeld``."""
    from filelock import FileLock, Timeout

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    owner = path.with_name(path.name + ".owner")
    lock = FileLock(path, timeout=wait_seconds)
    try:
        lock.acquire()
    except Timeout:
        holder = owner.read_text().strip() if owner.is_file() else "unknown process"
        raise LockHeld(path, holder) from None
    try:
        owner.write_text(f"pid {os.getpid()} on {platform.node()}, started "
                         f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        yield path
    finally:
        owner.unlink(missing_ok=True)
        lock.release()
