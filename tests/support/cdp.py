"""Headless Chromium driven over the Chrome DevTools Protocol, through a pipe.

``--remote-debugging-pipe`` makes Chromium read CDP messages from fd 3 and write
them to fd 4, each a JSON text ended by a NUL byte: no websocket client, no port.
One page (a target, attached in flat mode) is enough for the browser tests:
navigate, run a script, type, click, wait for the next page, take a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["CHROMIUM", "Browser"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]


class Browser:
    """One headless Chromium with one page."""

    def __init__(self, profile: Path, *, width: int = 1280, height: int = 800) -> None:
        assert CHROMIUM is not None
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()

        def fds() -> None:  # in the child: its ends become fds 3 (read) and 4 (write)
            read, write = os.dup(to_browser), os.dup(from_browser)
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # Not close_fds: it would close 3 and 4 after ``fds`` made them; Python's own
            # descriptors are not inheritable, so nothing else leaks into the browser.
            close_fds=False, preexec_fn=fds, start_new_session=True,
        )  # fmt: skip
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.page("Page.enable")
        self.page("Runtime.enable")
        self.page("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):  # it may be gone already
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self._to_browser)
        os.close(self._from_browser)

    # --- the protocol ---------------------------------------------------------------

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, "Chromium did not answer in time"
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                assert chunk, "Chromium closed its pipe"
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def call(self, method: str, *, session: str | None = None, timeout: float = 30,
             **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events that come first are kept)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._next_id:
                assert "error" not in answer, f"{method}: {answer['error']}"
                result: dict[str, Any] = answer.get("result", {})
                return result
            if "method" in answer:
                self._events.append(answer)

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to the page's session."""
        return self.call(method, session=self.session, **params)

    def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        """The next event ``method`` of the page (one already received counts)."""
        deadline = time.monotonic() + timeout
        while True:
            for index, event in enumerate(self._events):
                if event["method"] == method and event.get("sessionId") == self.session:
                    del self._events[index]
                    return event
            answer = self._read(deadline)
            if "method" in answer:
                self._events.append(answer)

    # --- what a person does -------------------------------------------------------

    def open(self, url: str) -> None:
        """Go to ``url`` and wait until it has loaded."""
        self._events.clear()
        self.page("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def run(self, expression: str) -> Any:
        """The value of a script run in the page."""
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def type_into(self, selector: str, text: str) -> None:
        """Focus the field ``selector`` and type ``text`` as a keyboard would."""
        assert self.run(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                        " if (!e) return false; e.focus(); return true; })()"), selector
        self.page("Input.insertText", text=text)

    def click_and_wait(self, selector: str) -> None:
        """Click ``selector`` (a submit button) and wait for the page it leads to."""
        self._events.clear()
        assert self.run(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                        " if (!e) return false; e.click(); return true; })()"), selector
        self.wait_event("Page.loadEventFired")

    @property
    def url(self) -> str:
        return str(self.run("location.href"))

    def text(self) -> str:
        """What the page shows (its body's text)."""
        return str(self.run("document.body.innerText"))

    def html(self) -> str:
        return str(self.run("document.documentElement.outerHTML"))

    def screenshot(self, path: Path, *, full_page: bool = True) -> None:
        """A PNG of the page (the whole page's height with ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = int(self.run("document.documentElement.scrollHeight"))
            width = int(self.run("document.documentElement.clientWidth"))
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.page("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
