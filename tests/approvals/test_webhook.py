"""The approval webhook: a real worker parks a call and a local receiver is told, once,
without an argument value; a receiver that is down never holds the worker, and says so
in one warning."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cleveragents.approvals.model import WAITING, Parked, Resolution
from cleveragents.approvals.webhook import ApprovalWebhook, check_webhook_url, webhook_body
from cleveragents.client import SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from cleveragents.errors import ConfigurationError
from tests.support.procs import Worker, free_port, wait_until

pytestmark = pytest.mark.timeout(180)

SKILL, PAY = "test/approvals", "test/send-payment"
SECRET = "acct-4410-s3cret"


class Receiver:
    """A local HTTP receiver: keeps every JSON body POSTed to it."""

    def __init__(self, *, fail_first: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self.fail_first = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.raw.append(data)
                if receiver.fail_first > 0:
                    receiver.fail_first -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                receiver.bodies.append(json.loads(data))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.close()


def _submit(client: SkillClient, tmp_path: Path, request_id: str) -> None:
    client.submit(SKILL, PAY, {"log": str(tmp_path / "pay.jsonl"), "key": SECRET},
                  allow_writes=True, request_id=request_id)


def test_a_worker_that_parks_a_call_posts_it_to_the_webhook_once(
    client: SkillClient, redis_url: str, start_worker: Callable[..., Worker],
    receiver: Receiver, tmp_path: Path,
) -> None:
    # Given a worker with a webhook and the inbox's address
    start_worker(redis_url, CLEVERAGENTS_APPROVAL_WEBHOOK=receiver.url,
                 CLEVERAGENTS_APPROVALS_URL="https://inbox.example.com/approvals/")
    # When a call parks (and its message is delivered again while it waits)
    _submit(client, tmp_path, "hook/pay-1")
    wait_until(lambda: client.state("hook/pay-1") == STATE_AWAITING_APPROVAL, 60, "it parks")
    wait_until(lambda: receiver.bodies, 30, "the webhook")
    # Then the receiver got one JSON POST naming it, its inbox page, and no argument
    [body] = receiver.bodies
    assert body["request_id"] == "hook/pay-1"
    assert (body["skill"], body["tool"]) == (SKILL, PAY)
    assert body["asked_by"]
    assert body["expires_at"].endswith("+00:00")
    assert body["url"] == "https://inbox.example.com/approvals/calls/hook%2Fpay-1"
    assert "hook/pay-1" in body["text"]
    assert body["url"] in body["text"]
    assert SECRET not in b"".join(receiver.raw).decode()
    # And a decision (which delivers the call again) announces nothing more
    client.approvals.reject("hook/pay-1", reason="no", by="alice")
    client.wait("hook/pay-1", 60, writes=True)
    assert len(receiver.raw) == 1


def test_a_webhook_that_is_down_never_holds_the_worker_and_warns_once(
    client: SkillClient, redis_url: str, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    # Given a worker whose webhook nobody answers
    down = f"http://127.0.0.1:{free_port()}/hook"
    worker = start_worker(redis_url, CLEVERAGENTS_APPROVAL_WEBHOOK=down)
    # When two calls park
    for request_id in ("down-1", "down-2"):
        _submit(client, tmp_path, request_id)
    # Then both park at once (the POSTs are retried in the background)
    for request_id in ("down-1", "down-2"):
        wait_until(lambda rid=request_id: client.state(rid) == STATE_AWAITING_APPROVAL, 30,
                   f"{request_id} to park")
    # And once the retries are spent, the worker's log says so in one warning (for the
    # whole worker: its two pool processes each failed to announce one)
    wait_until(lambda: "approval webhook keeps failing" in worker.log_text(), 60, "the warning")
    wait_until(lambda: worker.log_text().count(" not announced after ") >= 2, 60,
               "both calls' tries to be spent")
    assert worker.log_text().count("approval webhook keeps failing") == 1
    assert down not in worker.log_text()  # the URL may be a secret


def _parked(request_id: str = "r-1") -> Parked:
    return Parked(request_id, "s/k", "s/t", "d" * 64, {"arguments": {"key": SECRET}}, "gen1@h",
                  asked_at=1_000.0, expires_at=87_400.0)


def test_the_webhook_retries_with_backoff_then_succeeds_and_posts_only_new_parks() -> None:
    answers = [OSError("refused"), OSError("503"), None]
    posted: list[dict[str, Any]] = []
    waits: list[float] = []

    def post(url: str, body: dict[str, Any]) -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        posted.append(body)

    hook = ApprovalWebhook("https://hooks.example/x", None, post=post, sleep=waits.append)
    assert hook.send(_parked())
    assert waits == [1.0, 2.0]
    assert posted[0]["url"] is None
    assert "cleveragents approvals show r-1" in posted[0]["text"]
    assert SECRET not in json.dumps(posted)
    # Only a call parked just now is announced: not one found waiting, nor a settlement
    hook.notify = posted.append  # type: ignore[assignment,method-assign]
    hook.on_change(Resolution(WAITING, _parked(), None, changed=False))
    hook.on_change(Resolution("expired", _parked(), None, changed=True))
    assert len(posted) == 1
    hook.on_change(Resolution(WAITING, _parked("r-2"), None, changed=True))
    assert len(posted) == 2


def test_a_webhook_that_keeps_failing_warns_once_until_it_works_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    working = [False]

    def post(url: str, body: dict[str, Any]) -> None:
        if not working[0]:
            raise OSError("refused")

    hook = ApprovalWebhook("https://hooks.example/x", None, attempts=2, post=post,
                           sleep=lambda s: None)
    with caplog.at_level(logging.INFO, "cleveragents.approvals"):
        assert not hook.send(_parked("a"))
        assert not hook.send(_parked("b"))
        working[0] = True
        assert hook.send(_parked("c"))
        working[0] = False
        assert not hook.send(_parked("d"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "a not announced" in warnings[0]
    assert "d not announced" in warnings[1]
    assert "hooks.example" not in caplog.text


@pytest.mark.parametrize("url", [
    "http://hooks.example.com/x", "ftp://127.0.0.1/x", "hooks.example.com", "https://",
    "http://10.0.0.5/hook", "file:///etc/passwd",
])
def test_a_webhook_url_that_is_not_https_or_loopback_http_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match="CLEVERAGENTS_APPROVAL_WEBHOOK"):
        check_webhook_url(url)


@pytest.mark.parametrize("url", [
    "https://hooks.slack.com/services/T/B/X", "http://127.0.0.1:9000/h", "http://[::1]/h",
    "http://localhost:8080/",
])
def test_https_and_loopback_http_webhooks_are_taken(url: str) -> None:
    check_webhook_url(url)


def test_the_body_is_what_a_slack_incoming_webhook_takes() -> None:
    body = webhook_body(_parked("a/b c"), "https://inbox.example/")
    assert set(body) == {"text", "request_id", "skill", "tool", "asked_by", "expires_at", "url"}
    assert body["url"] == "https://inbox.example/calls/a%2Fb%20c"
    assert body["expires_at"] == "1970-01-02T00:16:40+00:00"
    assert isinstance(body["text"], str)


def test_a_worker_with_a_webhook_url_to_another_host_over_http_does_not_start(
    redis_url: str, tmp_path: Path
) -> None:
    from tests.conftest import worker_env

    worker = Worker(worker_env(redis_url, CLEVERAGENTS_APPROVAL_WEBHOOK="http://hooks.example/x"))
    with pytest.raises(AssertionError, match="worker exited early"):
        worker.start(timeout=60)
    worker.stop()
    lines = [line for line in worker.log_text().splitlines() if "cannot start" in line]
    assert len(lines) == 1
    assert "CLEVERAGENTS_APPROVAL_WEBHOOK must be an https:// URL" in lines[0]
