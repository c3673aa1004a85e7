"""No network for the code under test: a fixture for this process and one for subprocesses.

``block_network`` patches the ``socket`` module so that connecting to, or resolving, anything
but the loopback interface raises ``NetworkBlocked`` (an ``OSError``) and is recorded in
``ATTEMPTS``. Loopback and Unix sockets stay usable: Papermill talks to its Jupyter kernel over
them. ``network_guard_env`` returns an environment whose Python processes (notebook kernels
included) load the same guard through ``tests/network_guard/sitecustomize.py``; their blocked
attempts are appended to the file named by ``ENDOEXPLAIN_NETWORK_LOG``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

GUARD_DIR = Path(__file__).resolve().parent / "network_guard"
REPO_ROOT = Path(__file__).resolve().parent.parent
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "", None}
ATTEMPTS: list[str] = []


class NetworkBlocked(OSError):
    """A network connection was attempted while the network is blocked for a test."""


def _is_loopback(address) -> bool:
    if isinstance(address, (str, bytes)):       # AF_UNIX path
        return True
    host = address[0] if isinstance(address, tuple) and address else address
    return host in LOOPBACK_NAMES or str(host).startswith("127.")


def _refuse(what: str):
    ATTEMPTS.append(what)
    log = os.environ.get("ENDOEXPLAIN_NETWORK_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()} {what}\n")
    raise NetworkBlocked(f"network access blocked during tests: {what}")


def block_network() -> None:
    """Patch ``socket`` so that every non-loopback connection or name lookup fails."""
    if getattr(socket, "_endoexplain_blocked", False):
        return
    original_connect, original_connect_ex = socket.socket.connect, socket.socket.connect_ex
    original_getaddrinfo = socket.getaddrinfo

    def connect(self, address):
        if not _is_loopback(address):
            _refuse(f"connect {address!r}")
        return original_connect(self, address)

    def connect_ex(self, address):
        if not _is_loopback(address):
            _refuse(f"connect_ex {address!r}")
        return original_connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in LOOPBACK_NAMES and not str(host).startswith("127."):
            _refuse(f"getaddrinfo {host!r}")
        return original_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    socket.getaddrinfo = getaddrinfo
    socket._endoexplain_blocked = True
    socket._endoexplain_restore = (original_connect, original_connect_ex, original_getaddrinfo)


def unblock_network() -> None:
    """Undo ``block_network`` in this process."""
    if getattr(socket, "_endoexplain_blocked", False):
        socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = socket._endoexplain_restore
        socket._endoexplain_blocked = False


def network_guard_env(log_path: str | Path, base: dict | None = None) -> dict:
    """Environment for subprocesses that must not reach the network (see module docstring)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(GUARD_DIR), str(REPO_ROOT),
                                                      env.get("PYTHONPATH", "")]))
    env["ENDOEXPLAIN_NETWORK_LOG"] = str(log_path)
    return env
