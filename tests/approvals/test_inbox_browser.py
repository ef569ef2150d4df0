"""The approvals inbox in a real browser: headless Chromium, driven over CDP.

A person opens the inbox, signs in with the token and their name, approves one
call and rejects another with a reason, by typing and clicking as in any browser
(its cookies, its Origin headers, the pages' hidden CSRF fields); the worker runs
exactly the approved one. The inbox and a call's page are the pictures in
docs/approvals.md: ``SCREENSHOTS_APPROVALS=docs/img`` copies them there.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from cleveragents.client import SkillClient
from cleveragents.constants import STATE_AWAITING_APPROVAL
from tests.support.cdp import CHROMIUM, Browser
from tests.support.inbox import running_inbox
from tests.support.procs import Worker, wait_until

pytestmark = pytest.mark.timeout(240)

SKILL, PAY = "test/approvals", "test/send-payment"
TOKEN = "inbox-browser-token-77c1"
#: A long argument: folded on the call's page.
MEMO = ("Quarterly settlement for ACME Corp, invoice 4411, as agreed with their finance team "
        "on the call of 12 March; amounts reconciled against the ledger export; "
        "the remainder is carried to next quarter. ") * 3


def _need_chromium() -> None:
    if CHROMIUM is None:
        why = ("chromium is not installed: INSTALL_BROWSER=1 ./scripts/test installs Debian's "
               "chromium package (apt-get, as root), or install it yourself")
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def _ran(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [json.loads(line)["key"] for line in log.read_text(encoding="utf-8").splitlines()]


def test_a_person_approves_and_rejects_in_a_real_browser_and_only_the_approved_call_runs(
    client: SkillClient, redis_url: str, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    _need_chromium()
    # Given a worker and three parked payments (the third stays for the picture)
    start_worker(redis_url)
    log = tmp_path / "payments.jsonl"
    calls = {"pay-4411": "ACME invoice 4411", "pay-4412": "Globex refund 4412",
             "pay-4413": MEMO}
    for request_id, key in calls.items():
        client.submit(SKILL, PAY, {"log": str(log), "key": key}, allow_writes=True,
                      request_id=request_id)
        wait_until(lambda rid=request_id: client.state(rid) == STATE_AWAITING_APPROVAL, 60,
                   f"{request_id} to park")
    env = {"CLEVERAGENTS_BROKER_URL": redis_url, "CLEVERAGENTS_APPROVALS_TOKEN": TOKEN}
    shots = tmp_path / "shots"
    shots.mkdir()
    with running_inbox(env, tmp_path) as inbox:
        browser = Browser(tmp_path / "profile", width=1200, height=720)
        try:
            # When a person opens the inbox: it asks them to sign in
            browser.open(f"{inbox.url}/")
            assert "/login" in browser.url
            browser.type_into("input[name=name]", "Alice Example")
            browser.type_into("input[name=token]", TOKEN)
            browser.click_and_wait("form.login button[type=submit]")

            # Then they see the three calls, oldest first, each linking to its page
            assert browser.url == f"{inbox.url}/", browser.text() + inbox.log_text()
            shown = browser.text()
            assert "3 calls waiting for approval" in shown
            assert shown.index("pay-4411") < shown.index("pay-4412") < shown.index("pay-4413")
            assert "signed in as Alice Example" in shown
            links = browser.run("[...document.querySelectorAll('table.calls a')]"
                                ".map(a => [a.textContent, a.getAttribute('href')])")
            assert links == [[rid, f"/calls/{rid}"] for rid in calls]
            browser.screenshot(shots / "approvals-inbox.png")

            # When they open the long call's page: its long argument is folded
            browser.click_and_wait("a[href='/calls/pay-4413']")
            assert browser.run("document.querySelectorAll('details').length") == 1
            assert browser.run("document.querySelector('details').open") is False
            browser.screenshot(shots / "approvals-call.png")

            # When they approve pay-4411 on its page
            browser.open(f"{inbox.url}/calls/pay-4411")
            assert "ACME invoice 4411" in browser.text()
            browser.click_and_wait("form.approve button[type=submit]")
            assert browser.url == f"{inbox.url}/calls/pay-4411"
            assert "Approved by Alice Example" in browser.text()
            assert browser.run("document.querySelectorAll('form.approve, form.reject')"
                               ".length") == 0

            # And reject pay-4412: the browser itself insists on a reason first
            browser.open(f"{inbox.url}/calls/pay-4412")
            assert browser.run("document.querySelector('form.reject').checkValidity()") is False
            browser.type_into("form.reject input[name=reason]", "duplicate of 4411")
            browser.click_and_wait("form.reject button[type=submit]")
            assert "Rejected by Alice Example" in browser.text()
            assert "duplicate of 4411" in browser.text()

            # Then the worker runs exactly the approved call
            assert client.wait("pay-4411", 60, writes=True).success
            denied = client.wait("pay-4412", 60, writes=True)
            assert not denied.success
            assert denied.error is not None
            assert denied.error.details["by"] == "Alice Example"
            assert _ran(log) == ["ACME invoice 4411"]

            # And the inbox lists only the call still waiting; the audit page shows the
            # decisions, verified
            browser.open(f"{inbox.url}/")
            assert "1 call waiting for approval" in browser.text()
            browser.open(f"{inbox.url}/audit?event=approved")
            audit = browser.text()
            assert "Audit trail whole" in audit
            assert "pay-4411" in audit
            assert "by=Alice Example" in audit
        finally:
            browser.close()
    for name in ("approvals-inbox.png", "approvals-call.png"):
        assert (shots / name).stat().st_size > 10_000
    target = os.environ.get("SCREENSHOTS_APPROVALS")
    if target:
        for name in ("approvals-inbox.png", "approvals-call.png"):
            shutil.copy(shots / name, Path(target) / name)
