"""Headless Chromium for the browser tests: a minimal DevTools client, standard library only."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("headless Chromium not found: run scripts/install_chromium.sh (as root) first; "
                "./run_tests.sh does this")


class DevTools:
    """Minimal Chrome DevTools protocol client over --remote-debugging-pipe (fds 3 and 4),
    standard library only: messages are JSON terminated by a NUL byte."""

    def __init__(self, binary: str, profile_dir: str):
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def wire_pipes():  # in the child: the browser reads fd 3 and writes fd 4
            os.dup2(to_browser_read, 3)
            os.dup2(from_browser_write, 4)

        self.process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}",
             "--remote-debugging-pipe", "about:blank"],
            pass_fds=(3, 4), preexec_fn=wire_pipes,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"DevTools {method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(index)
            self.events.append(self._receive(max(0.1, deadline - time.monotonic())))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} event within {timeout} s")

    def _receive(self, timeout: float) -> dict:
        import select

        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], timeout)
            if not ready:
                raise TimeoutError("Chromium did not answer over the DevTools pipe")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


# Runs in the page after the load event: every <img> and every <a href> as the browser resolved it.
PAGE_REPORT = """JSON.stringify({
  images: Array.from(document.images).map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0})),
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href)
})"""


def render_in_chromium(page: Path) -> dict:
    """Load ``page`` from disk in headless Chromium; return its images and resolved links."""
    return json.loads(run_in_page(page, [PAGE_REPORT], wait_seconds=0.0)[0])


def run_in_page(page: Path, expressions: list[str], wait_seconds: float = 0.3,
                screenshots: dict[int, Path] | None = None, size: tuple[int, int] = (1300, 1100),
                fragment: str = "") -> list:
    """Load ``page`` from disk in a ``size`` (width, height) window, its address ending in
    ``fragment`` ("#..." or ""), then evaluate each JavaScript expression in turn (a promise is
    awaited), waiting ``wait_seconds`` after each; return their values. ``screenshots``:
    expression index -> PNG path, captured after that expression ran (index -1: right after the
    page loaded)."""
    binary = chromium_binary()
    screenshots = screenshots or {}
    values = []
    with tempfile.TemporaryDirectory() as profile_dir:
        browser = DevTools(binary, profile_dir)
        try:
            target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = browser.send("Target.attachToTarget",
                                   {"targetId": target, "flatten": True})["sessionId"]
            browser.send("Page.enable", session=session)
            browser.send("Emulation.setDeviceMetricsOverride", {"width": size[0], "height": size[1],
                                                                "deviceScaleFactor": 1, "mobile": False},
                         session=session)
            browser.send("Page.navigate", {"url": page.resolve().as_uri() + fragment}, session=session)
            browser.wait_event("Page.loadEventFired")

            def capture(index: int) -> None:
                if index in screenshots:
                    shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)
                    Path(screenshots[index]).write_bytes(base64.b64decode(shot["data"]))

            capture(-1)
            for index, expression in enumerate(expressions):
                result = browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                           "awaitPromise": True}, session=session)
                if "exceptionDetails" in result:
                    raise AssertionError(f"{expression}: {result['exceptionDetails']}")
                values.append(result["result"].get("value"))
                time.sleep(wait_seconds)
                capture(index)
        finally:
            browser.close()
    return values


def broken_resources(report: dict) -> list[str]:
    """Images that did not load and links whose file:// target does not exist."""
    broken = [f"image {i['src']}" for i in report["images"] if not i["ok"]]
    for link in report["links"]:
        parsed = urlparse(link)
        if parsed.scheme != "file":
            broken.append(f"non-local link {link}")
        elif not Path(unquote(parsed.path)).is_file():
            broken.append(f"link {link}")
    return broken
