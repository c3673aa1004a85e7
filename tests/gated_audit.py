"""``endoexplain audit`` in a process of its own, with a marker file at the moment a test
needs to act on, so that two concurrent audits meet in a chosen order instead of by timing
luck (tests/test_hostile_inputs.py).

    python -m tests.gated_audit hold READY GO audit ARGS...
        once this audit holds the ``--out`` lock: write READY (its pid), wait for the file GO
        (up to ``GATE_SECONDS``), then audit as usual.
    python -m tests.gated_audit queue QUEUED audit ARGS...
        find the ``--out`` lock held by another process (exit 3 if it is free), write QUEUED,
        then take the lock the usual way (``--wait-for-lock`` as given) and audit.

Everything else is ``cli.main``: the exit code and the messages are the command's own.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from endoexplain_core import cli, files

GATE_SECONDS = 600.0


def hold(ready: Path, go: Path) -> None:
    """Make ``cli._audit_into`` (called while the lock is held) wait for ``go``."""
    audit_into = cli._audit_into

    def gated(*args, **kwargs):
        ready.write_text(str(os.getpid()))
        deadline = time.monotonic() + GATE_SECONDS
        while not go.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gated_audit: {go} did not appear in {GATE_SECONDS:.0f} s")
            time.sleep(0.05)
        return audit_into(*args, **kwargs)

    cli._audit_into = gated


def queue(queued: Path) -> None:
    """Make ``cli.output_folder_lock`` first confirm that another process holds the lock
    (writing ``queued``), then take it as the command does."""
    output_folder_lock = cli.output_folder_lock

    @contextlib.contextmanager
    def noting_the_queue(out: Path, wait_seconds: float = 0.0):
        try:
            with files.exclusive_lock(out / cli.LOCK_NAME, 0.0):
                pass
        except files.LockHeld:
            queued.write_text(str(os.getpid()))
        else:
            print("gated_audit: the lock was free; the test expected another audit to hold it",
                  file=sys.stderr)
            raise SystemExit(3)
        with output_folder_lock(out, wait_seconds) as held:
            yield held

    cli.output_folder_lock = noting_the_queue


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "hold":
        hold(Path(argv[1]), Path(argv[2]))
        arguments = argv[3:]
    elif mode == "queue":
        queue(Path(argv[1]))
        arguments = argv[2:]
    else:
        raise SystemExit(f"gated_audit: unknown mode {mode!r} (hold | queue)")
    return cli.main(arguments)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
