"""The approvals inbox for tests: a real ``cleveragents approvals serve`` process, and a
browser-like HTTP client with a real cookie jar (``http.cookiejar``)."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

from tests.support.procs import REPO, free_port, kill_group, wait_until


@dataclass
class Inbox:
    """A running inbox: its base URL and its log (stderr) file."""

    url: str
    log: Path
    proc: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}


@contextmanager
def running_inbox(env: Mapping[str, str], tmp_path: Path, *args: str) -> Iterator[Inbox]:
    """``cleveragents approvals serve`` on a free loopback port, killed at the end."""
    port = free_port()
    log = tmp_path / f"inbox-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cleveragents", "approvals", "serve", "--port", str(port),
             *args],
            env={**clean_env(), **env, "PYTHONPATH": str(REPO)}, cwd=REPO,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    inbox = Inbox(f"http://127.0.0.1:{port}", log, proc)
    try:
        wait_until(lambda: _up(inbox), 60, "the inbox to listen")
        yield inbox
    finally:
        kill_group(proc)
        proc.wait(10)


def _up(inbox: Inbox) -> bool:
    if inbox.proc.poll() is not None:
        raise AssertionError(f"the inbox exited: {inbox.log_text()}")
    try:
        with urllib.request.urlopen(f"{inbox.url}/static/inbox.css", timeout=2):
            return True
    except OSError:
        return False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@dataclass
class Answer:
    status: int
    text: str
    #: Case-insensitive, as HTTP's are (``email.message.Message``).
    headers: Message

    @property
    def location(self) -> str:
        return str(self.headers.get("Location", ""))


class Visitor:
    """One browser's worth of HTTP: a cookie jar; redirects are shown, not followed."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect
        )

    def request(self, method: str, path: str, form: Mapping[str, str] | None = None,
                headers: Mapping[str, str] | None = None) -> Answer:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(f"{self.base}{path}", data=data, method=method,
                                         headers=dict(headers or {}))
        try:
            with self.opener.open(request, timeout=30) as answer:
                return Answer(answer.status, answer.read().decode(), answer.headers)
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, exc.read().decode(), exc.headers)

    def get(self, path: str, **headers: str) -> Answer:
        return self.request("GET", path, headers=headers)

    def post(self, path: str, form: Mapping[str, str], **headers: str) -> Answer:
        return self.request("POST", path, form, headers)

    def cookie(self, name: str) -> http.cookiejar.Cookie | None:
        return next((c for c in self.jar if c.name == name), None)


def hidden(page: str, name: str, action: str | None = None) -> str:
    """The value of hidden field ``name`` (in the form posting to ``action``, if given)."""
    text = page
    if action is not None:
        start = page.index(f'action="{action}"')
        text = page[start: page.index("</form>", start)]
    found = re.search(rf'name="{name}" value="([^"]*)"', text)
    assert found is not None, f"no hidden {name} in {text[:500]}"
    return found.group(1)


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
