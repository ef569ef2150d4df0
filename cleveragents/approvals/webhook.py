"""Tell people a call waits: a JSON POST to ``CLEVERAGENTS_APPROVAL_WEBHOOK`` when one parks.

The worker that parks a call (``gate.py``, ``on_change`` with a new ``waiting``
resolution) hands it to an ``ApprovalWebhook``, which queues it and returns at
once: a background thread of that worker process POSTs it, retried with backoff
a few times. A webhook that is slow or down never holds a delivery. The body
names the call (request id, skill, tool, who asked, when it expires, its inbox
page) and never an argument value; its ``text`` is what a Slack incoming
webhook shows as is.

The URL must be ``https://``, or ``http://`` to a loopback address (a receiver on
this machine); anything else is refused when the worker starts. Redirects are
not followed: the body goes only where the operator said.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import ipaddress
import json
import logging
import multiprocessing
import os
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, Protocol

from cleveragents.approvals.model import WAITING, Parked, Resolution
from cleveragents.errors import ConfigurationError

__all__ = [
    "INBOX_URL_ENV",
    "WEBHOOK_ENV",
    "ApprovalWebhook",
    "call_page",
    "check_webhook_url",
    "shared_flag",
    "webhook_body",
]

log = logging.getLogger("cleveragents.approvals")

#: Where the webhook POSTs (a Slack incoming webhook, a chat bridge, a pager).
WEBHOOK_ENV = "CLEVERAGENTS_APPROVAL_WEBHOOK"
#: The inbox's base URL as people reach it (``approvals serve`` behind its address).
INBOX_URL_ENV = "CLEVERAGENTS_APPROVALS_URL"
#: Tries per notification, and the wait before the second (doubled each time after).
ATTEMPTS = 4
FIRST_BACKOFF_S = 1.0
#: Seconds one POST may take.
POST_TIMEOUT_S = 5.0
#: Notifications queued at most; past it the newest is dropped (with the warning).
QUEUE_SIZE = 1000


def _loopback_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_webhook_url(url: str | None) -> None:
    """Refuse (``ConfigurationError``, one line) a webhook URL that is not ``https://`` or
    ``http://`` to a loopback address; None passes (no webhook)."""
    if url is None:
        return
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or ""
    if parsed.scheme == "https" and host:
        return
    if parsed.scheme == "http" and host and _loopback_host(host):
        return
    raise ConfigurationError(
        f"{WEBHOOK_ENV} must be an https:// URL (or http:// to 127.0.0.1, ::1 or localhost): "
        f"got a {parsed.scheme or 'schemeless'} URL to {host or 'no host'}"
    )


def call_page(inbox_url: str | None, request_id: str) -> str | None:
    """The inbox page of ``request_id`` under the inbox's base URL (None without one)."""
    if not inbox_url:
        return None
    return f"{inbox_url.rstrip('/')}/calls/{urllib.parse.quote(request_id, safe='')}"


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def webhook_body(record: Parked, inbox_url: str | None) -> dict[str, Any]:
    """What the webhook receives of a parked call: names and times, never an argument."""
    url = call_page(inbox_url, record.request_id)
    expires = _iso(record.expires_at)
    where = f" <{url}|open it in the inbox>" if url else (
        f" `cleveragents approvals show {record.request_id}`"
    )
    text = (
        f"Approval needed: {record.skill} / {record.tool} (request {record.request_id}, "
        f"asked by {record.asked_by or 'unknown'}), expires {expires}:{where}"
    )
    return {
        "text": text,
        "request_id": record.request_id,
        "skill": record.skill,
        "tool": record.tool,
        "asked_by": record.asked_by,
        "expires_at": expires,
        "url": url,
    }


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is an answer, not a new address to send the body to


_opener = urllib.request.build_opener(_NoRedirects)


def _post(url: str, body: dict[str, Any]) -> None:
    """POST ``body`` as JSON; raises on anything but a 2xx answer."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "cleveragents-approvals"},
        method="POST",
    )
    with _opener.open(request, timeout=POST_TIMEOUT_S) as answer:
        if not 200 <= answer.status < 300:
            raise urllib.error.HTTPError(url, answer.status, "not a 2xx", answer.headers, None)


class Flag(Protocol):
    """A boolean several processes may share (``shared_flag``)."""

    value: bool


class _LocalFlag:
    def __init__(self) -> None:
        self.value = False


def shared_flag() -> Flag:
    """A flag the pool processes forked after this call share: one warning for a whole
    worker, not one per process."""
    flag: Flag = multiprocessing.RawValue(ctypes.c_bool, False)
    return flag


class ApprovalWebhook:
    """Queues parked calls and POSTs each from a background thread, with retries."""

    def __init__(
        self,
        url: str,
        inbox_url: str | None = None,
        *,
        attempts: int = ATTEMPTS,
        first_backoff_s: float = FIRST_BACKOFF_S,
        post: Callable[[str, dict[str, Any]], None] = _post,
        sleep: Callable[[float], None] = time.sleep,
        warned: Flag | None = None,
    ) -> None:
        check_webhook_url(url)
        self.url = url
        self.inbox_url = inbox_url
        self.attempts = attempts
        self.first_backoff_s = first_backoff_s
        self._post = post
        self._sleep = sleep
        self._queue: queue.Queue[Parked] = queue.Queue(QUEUE_SIZE)
        self._lock = threading.Lock()
        #: The process whose thread sends (a pool process forked after it started has none).
        self._pid: int | None = None
        #: Whether the warning about failing sends was given since the last success (shared
        #: by a worker's pool processes when it was made before they forked).
        self._warned = warned if warned is not None else _LocalFlag()
        self.sent = 0
        self.failed = 0

    def __repr__(self) -> str:  # the URL is a secret (a Slack webhook's path)
        return "ApprovalWebhook(...)"

    def on_change(self, resolution: Resolution) -> None:
        """The approval gate's hook: a call that was parked just now is announced."""
        if resolution.changed and resolution.state == WAITING:
            self.notify(resolution.record)

    def notify(self, record: Parked) -> None:
        """Queue ``record``'s announcement; never blocks, never raises."""
        self._ensure_thread()
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._failing(f"{QUEUE_SIZE} announcements queued; {record.request_id}'s dropped")

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            threading.Thread(target=self._run, name="approval-webhook", daemon=True).start()

    def _run(self) -> None:
        while True:
            record = self._queue.get()
            try:
                self.send(record)
            except Exception:  # a bug here must not end the thread that sends the rest
                log.exception("approval webhook: could not announce %s", record.request_id)
            finally:
                self._queue.task_done()

    def send(self, record: Parked) -> bool:
        """POST one announcement, retried with backoff; True once it was taken."""
        body = webhook_body(record, self.inbox_url)
        wait = self.first_backoff_s
        why = ""
        for attempt in range(1, self.attempts + 1):
            try:
                self._post(self.url, body)
            except (OSError, ValueError) as exc:  # refused, timed out, a non-2xx answer
                why = str(exc) or type(exc).__name__
                log.info(
                    "approval webhook: %s not taken (try %d of %d): %s",
                    record.request_id, attempt, self.attempts, why,
                )
                if attempt < self.attempts:
                    self._sleep(wait)
                    wait *= 2
                continue
            self.sent += 1
            self._warned.value = False
            return True
        self.failed += 1
        self._failing(f"{record.request_id} not announced after {self.attempts} tries ({why})")
        return False

    def _failing(self, what: str) -> None:
        """One warning while the webhook keeps failing (again after it worked once)."""
        if self._warned.value:
            log.info("approval webhook: %s", what)
            return
        self._warned.value = True
        log.warning(
            "approval webhook keeps failing: %s; people are not told that calls wait "
            "(check %s; `cleveragents approvals list` shows them)", what, WEBHOOK_ENV,
        )

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the queued announcements (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True
