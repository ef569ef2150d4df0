"""The inbox's pure parts: sealed sessions, origins, where a login goes, escaped pages."""

from __future__ import annotations

import time

import pytest

from cleveragents.approvals.model import Decision, Parked
from cleveragents.errors import ConfigurationError
from cleveragents.inbox.access import SessionSeal, check_inbox_options, same_origin
from cleveragents.inbox.app import _safe_next
from cleveragents.inbox.pages import Page, call_page, inbox_page

EVIL = "<script>alert(1)</script>"


def test_a_session_cookie_is_read_back_only_as_sealed_and_until_it_expires() -> None:
    seal = SessionSeal("token-1")
    session = seal.issue("Alice", signed_in=True)
    cookie = seal.encode(session)
    assert seal.decode(cookie) == session.__class__(**{**session.__dict__,
                                                       "expires": round(session.expires)})
    payload, mac = cookie.split(".")
    forged = payload.replace(payload[:4], "eyJu") + "." + mac[::-1]
    assert seal.decode(forged) is None
    assert seal.decode(cookie + "x") is None
    assert SessionSeal("token-2").decode(cookie) is None  # a new token ends every session
    assert SessionSeal(None).decode(cookie) is None
    expired = SessionSeal("token-1", ttl_s=-1)
    assert expired.decode(expired.encode(expired.issue("Bob", signed_in=True))) is None
    assert seal.issue().csrf != seal.issue().csrf


def test_only_a_same_origin_post_passes() -> None:
    assert same_origin(None, "127.0.0.1:8766")
    assert same_origin("http://127.0.0.1:8766", "127.0.0.1:8766")
    assert not same_origin("null", "127.0.0.1:8766")
    assert not same_origin("http://evil.example", "127.0.0.1:8766")
    assert not same_origin("http://127.0.0.1:8767", "127.0.0.1:8766")
    assert not same_origin("http://127.0.0.1:8766/x", "127.0.0.1:8766")


@pytest.mark.parametrize(
    "wanted", ["//evil.example/", "https://evil.example/", "/\\evil", "", None]
)
def test_a_login_never_sends_the_person_to_another_site(wanted: str | None) -> None:
    assert _safe_next(wanted) == "/"


def test_the_inbox_refuses_other_hosts_without_a_token() -> None:
    with pytest.raises(ConfigurationError, match="CLEVERAGENTS_APPROVALS_TOKEN"):
        check_inbox_options("0.0.0.0", None)
    check_inbox_options("0.0.0.0", "t")
    check_inbox_options("::1", None)


def _parked(**fields: object) -> Parked:
    now = time.time()
    base: dict[str, object] = dict(
        request_id=f"r-{EVIL}", skill=f"s/{EVIL}", tool="s/t", digest="d" * 64,
        body={"arguments": {EVIL: EVIL, "long": "x" * 1000}}, asked_by=EVIL,
        asked_at=now - 5, expires_at=now + 60,
    )
    base.update(fields)
    return Parked(**base)  # type: ignore[arg-type]


def test_pages_escape_every_value_and_fold_long_ones() -> None:
    page = Page(csrf="c", name=EVIL, token=True)
    listed = inbox_page([_parked()], page)
    shown = call_page(_parked(), None, [{"event": EVIL, "at": "t"}], page, "d" * 64)
    for html in (listed, shown):
        assert EVIL not in html
        assert "&lt;script&gt;" in html
    assert "<details>" in shown
    assert ">Approve</button>" in shown


def test_a_decided_or_expired_call_offers_no_form() -> None:
    page = Page(csrf="c")
    decided = call_page(_parked(), Decision("rejected", "alice", "no", at=1.0), [], page, "d")
    expired = call_page(_parked(expires_at=time.time() - 1), None, [], page, "d")
    for html in (decided, expired):
        assert ">Approve</button>" not in html
        assert ">Reject</button>" not in html
    assert "Rejected by alice" in decided
    assert "Expired undecided" in expired
