"""Progress bars that keep the executed notebooks clean.

``progress_bar`` is a plain ``tqdm`` bar (not ``tqdm.auto``: its widget needs ipywidgets). With
``ENDOEXPLAIN_PROGRESS_LOG`` set (the orchestrator sets it for each stage's kernel) it appends
one plain line per update, at most every ``LOG_INTERVAL`` seconds, to that file
(``runs/<profile>/logs/<stage>.log``, which the orchestrator echoes to the console), so the
executed notebook holds no bar; unset (a notebook run by hand, the CLI, tests), it is an
ordinary text bar on stderr.
"""

from __future__ import annotations

import os

from tqdm import tqdm

PROGRESS_LOG_ENV = "ENDOEXPLAIN_PROGRESS_LOG"
LOG_INTERVAL = 10.0   # seconds between two lines of one bar in the log


class _LogLines:
    """A write-only text stream that turns tqdm's carriage-return redraws into log lines."""

    def __init__(self, path: str):
        self._file = open(path, "a", encoding="utf-8")

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip("\n")
        if line.strip() and not self._file.closed:
            self._file.write(line + "\n")
            self._file.flush()

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class _LoggedBar(tqdm):
    """A tqdm bar writing to a ``_LogLines`` stream it owns (closed with the bar)."""

    def __init__(self, *args, log_stream: _LogLines, **kwargs):
        self._log_stream = log_stream
        super().__init__(*args, file=log_stream, mininterval=LOG_INTERVAL, ascii=True, ncols=100,
                         **kwargs)

    def close(self) -> None:
        try:
            super().close()
        finally:
            stream, self._log_stream = getattr(self, "_log_stream", None), None
            if stream is not None:
                stream.close()


def progress_bar(iterable=None, **kwargs) -> tqdm:
    """A ``tqdm`` bar (same arguments: total, desc, unit, initial, disable, ...) that writes to
    the stage's progress log when ``ENDOEXPLAIN_PROGRESS_LOG`` names one, else to stderr."""
    log = os.environ.get(PROGRESS_LOG_ENV)
    if not log or kwargs.get("disable"):
        return tqdm(iterable, **kwargs)
    kwargs.pop("file", None)          # the stage's log is where a bar goes under the orchestrator
    return _LoggedBar(iterable, log_stream=_LogLines(log), **kwargs)
