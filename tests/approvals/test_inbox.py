"""The approvals inbox over HTTP with a real cookie jar, against a real worker on Redis.

A person signs in with the token and their name, approves one call with the digest
the page showed and rejects another with a reason; the worker runs exactly the
approved one, and the audit trail names the person. Forms without the session's
CSRF token, from another origin, or about a call that changed are refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cleveragents.client import SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from cleveragents.pipeline.binding import content_digest
from tests.support.inbox import Visitor, clean_env, hidden, running_inbox
from tests.support.procs import REPO, Worker, wait_until

pytestmark = pytest.mark.timeout(180)

SKILL, PAY = "test/approvals", "test/send-payment"
TOKEN = "inbox-token-5e1f0c9a"
#: An argument value that must never reach a log.
SECRET = "acct-9931-s3cret"


def _park(client: SkillClient, log: Path, *ids: str) -> None:
    for request_id in ids:  # one after the other: the inbox lists them in this order
        client.submit(SKILL, PAY, {"log": str(log), "key": f"{request_id}-{SECRET}"},
                      allow_writes=True, request_id=request_id)
        wait_until(lambda rid=request_id: client.state(rid) == STATE_AWAITING_APPROVAL, 60,
                   f"{request_id} to park")


def _ran(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [json.loads(line)["key"] for line in log.read_text(encoding="utf-8").splitlines()]


def test_a_person_signs_in_approves_one_call_and_rejects_another(
    client: SkillClient, redis_url: str, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    # Given a worker and two parked payments
    start_worker(redis_url)
    log = tmp_path / "payments.jsonl"
    _park(client, log, "pay-a", "pay-b")
    env = {"CLEVERAGENTS_BROKER_URL": redis_url, "CLEVERAGENTS_APPROVALS_TOKEN": TOKEN}
    with running_inbox(env, tmp_path) as inbox:
        person = Visitor(inbox.url)
        # When a person opens the inbox: they are sent to sign in first
        first = person.get("/")
        assert first.status == 303
        assert first.location.startswith("/login")
        login = person.get("/login?next=/")
        assert 'type="password" name="token"' in login.text
        assert 'type="text" name="name"' in login.text
        cookie = login.headers.get("Set-Cookie", "")
        assert "HttpOnly" in cookie
        assert "samesite=strict" in cookie.lower()
        csrf = hidden(login.text, "csrf")
        # A wrong token is refused, and so is a login form without its CSRF token
        wrong = person.post("/login", {"csrf": csrf, "token": "nope", "name": "Mallory"})
        assert wrong.status == 401
        assert "not the inbox" in wrong.text
        assert person.post("/login", {"token": TOKEN, "name": "x"}).status == 403
        csrf = hidden(person.get("/login").text, "csrf")
        signed = person.post("/login", {"csrf": csrf, "token": TOKEN, "name": "Alice Example",
                                        "next": "/"})
        assert signed.status == 303, signed.text
        assert signed.location == "/"

        # Then the inbox lists both calls, oldest first, each linking to its page
        page = person.get("/")
        assert page.status == 200
        assert page.text.index('href="/calls/pay-a">pay-a</a>') < page.text.index(
            'href="/calls/pay-b">pay-b</a>')
        for column in ("skill", "tool", "waiting for", "asked by", "time left"):
            assert f"<th>{column}</th>" in page.text
        assert SKILL in page.text
        assert "signed in as Alice Example" in page.text
        assert SECRET not in page.text  # the list shows no argument

        # And a call's page shows its arguments and the two forms
        call = person.get("/calls/pay-a")
        assert f"pay-a-{SECRET}" in call.text
        assert '>Approve</button>' in call.text
        assert '>Reject</button>' in call.text
        assert 'name="reason" required' in call.text
        csrf = hidden(call.text, "csrf", "/calls/pay-a/approve")
        digest = hidden(call.text, "digest", "/calls/pay-a/approve")

        # A form without the session's CSRF token, or from another site, is refused
        no_csrf = person.post("/calls/pay-a/approve", {"digest": digest})
        assert no_csrf.status == 403
        foreign = person.post("/calls/pay-a/approve", {"csrf": csrf, "digest": digest},
                              Origin="https://evil.example")
        assert foreign.status == 403
        # A stranger's cookie jar (no session) cannot post the form either
        assert Visitor(inbox.url).post("/calls/pay-a/approve",
                                       {"csrf": csrf, "digest": digest}).status in (303, 403)
        # An approval of another digest than the call's is refused, saying so
        stale = person.post("/calls/pay-a/approve", {"csrf": csrf, "digest": "0" * 64})
        assert stale.status == 409
        assert "no longer the call that was shown" in stale.text
        assert _ran(log) == []

        # When they approve pay-a with the digest the page showed, and reject pay-b
        approved = person.post("/calls/pay-a/approve", {"csrf": csrf, "digest": digest},
                               Origin=inbox.url)
        assert approved.status == 303, approved.text
        reject_page = person.get("/calls/pay-b")
        rejected = person.post("/calls/pay-b/reject", {
            "csrf": hidden(reject_page.text, "csrf", "/calls/pay-b/reject"),
            "reason": "not this month"})
        assert rejected.status == 303, rejected.text

        # Then the worker runs exactly the approved one
        assert client.wait("pay-a", 60, writes=True).success
        denied = client.wait("pay-b", 60, writes=True)
        assert not denied.success
        assert denied.error is not None
        assert denied.error.details["approval_reason"] == "not this month"
        assert _ran(log) == [f"pay-a-{SECRET}"]

        # And a decided call's page says so and offers no form
        done = person.get("/calls/pay-a")
        assert "Approved by Alice Example" in done.text
        assert ">Approve</button>" not in done.text
        assert ">Reject</button>" not in done.text
        assert "Rejected by Alice Example" in person.get("/calls/pay-b").text
        record, _ = client.approvals.show("pay-b")
        again = person.post("/calls/pay-b/approve",
                            {"csrf": csrf, "digest": content_digest(record.body)})
        assert again.status == 409
        assert "already rejected" in again.text

        # And the audit trail names the person, and the audit page shows it, verified
        wait_until(lambda: any(e["event"] == "succeeded"
                               for e in client.approvals.audit(request_id="pay-a")),
                   30, "pay-a's end in the audit trail")
        by = {e["event"]: e.get("by") for e in client.approvals.audit(request_id="pay-a")}
        assert by["approved"] == "Alice Example"
        audit = person.get("/audit?request_id=pay-a")
        assert "Audit trail whole" in audit.text
        assert "succeeded" in audit.text
        assert "pay-b" not in audit.text.split("<table", 1)[1]
        only = person.get("/audit?event=rejected")
        assert "by=Alice Example reason=not this month" in only.text
        assert "awaiting_approval</td>" not in only.text

        # And a program may send the token as a bearer header instead
        program = Visitor(inbox.url)
        assert program.get("/", Authorization=f"Bearer {TOKEN}").status == 200
        assert program.get("/", Authorization="Bearer wrong").status == 303

        # And signing out ends the session
        out = person.post("/logout", {"csrf": hidden(person.get("/").text, "csrf", "/logout")})
        assert out.status == 303
        assert person.get("/").status == 303

    # And the inbox's log holds methods, paths and statuses: no argument, token or form
    text = inbox.log_text()
    assert "POST /calls/pay-a/approve 303" in text
    assert SECRET not in text
    assert TOKEN not in text
    assert "csrf" not in text


def test_without_a_token_the_inbox_serves_loopback_and_refuses_other_hosts(
    client: SkillClient, redis_url: str, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(redis_url)
    log = tmp_path / "payments.jsonl"
    _park(client, log, "pay-c")
    with running_inbox({"CLEVERAGENTS_BROKER_URL": redis_url}, tmp_path) as inbox:
        person = Visitor(inbox.url)
        # A page of another site (DNS rebinding) is refused by its Host header
        assert person.get("/", Host="attacker.example").status == 421
        call = person.get("/calls/pay-c")
        assert call.status == 200
        assert 'name="by"' in call.text  # no sign-in: the form asks who decides
        approved = person.post("/calls/pay-c/approve", {
            "csrf": hidden(call.text, "csrf", "/calls/pay-c/approve"),
            "digest": hidden(call.text, "digest", "/calls/pay-c/approve"),
            "by": "bob"})
        assert approved.status == 303, approved.text
        assert client.wait("pay-c", 60, writes=True).success
        assert "Approved by bob" in person.get("/calls/pay-c").text
        assert person.get("/calls/no-such-call").status == 404


def test_serving_beyond_loopback_without_a_token_exits_1_naming_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "approvals", "serve", "--host", "0.0.0.0"],
        env={**clean_env(), "PYTHONPATH": str(REPO)}, cwd=REPO,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "CLEVERAGENTS_APPROVALS_TOKEN" in done.stderr
