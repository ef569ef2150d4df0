"""The inbox's routes: the same desk as the CLI (``ApprovalDesk``), behind the inbox's access.

| route | what |
|---|---|
| ``GET /`` | the waiting calls, oldest first |
| ``GET /calls/{id}`` | one call: arguments, the forms while it waits, its audit events |
| ``POST /calls/{id}/approve`` | approve the digest the page showed (``digest``) |
| ``POST /calls/{id}/reject`` | reject, with a ``reason`` |
| ``GET /audit`` | the trail, filtered (``request_id``, ``since``, ``event``), and its verdict |
| ``GET, POST /login``, ``POST /logout`` | sign in with the token and a name; sign out |

A decision goes through ``ApprovalDesk.approve`` and ``reject``: the digest of
what was shown, expiry and "decided once" are the desk's and the store's rules,
the Redis user is the server's own (the ``approver``), and the audit events are
the workers', as for the CLI. Desk calls run in a worker thread, one at a time.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from cleveragents.approvals.desk import ApprovalDesk, local_user
from cleveragents.approvals.model import ApprovalError
from cleveragents.inbox import pages
from cleveragents.inbox.access import (
    SESSION_COOKIE,
    Session,
    SessionSeal,
    same_origin,
    token_matches,
)
from cleveragents.mcp.http import HostGuard
from cleveragents.pipeline.binding import content_digest
from cleveragents.stores.audit_chain import verify

__all__ = ["InboxConfig", "build_app"]

log = logging.getLogger("cleveragents.inbox")
T = TypeVar("T")

#: The audit page lists at most this many events (the newest).
AUDIT_PAGE_EVENTS = 500
#: A wrong token waits this long before its answer (a guesser's pace, not a person's).
WRONG_TOKEN_DELAY_S = 0.5
#: Headers of every answer: no framing, no caching, no referrer to other sites, scripts
#: only from here.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    # Not no-referrer: under it Chromium sends "Origin: null" with the inbox's own forms.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass
class InboxConfig:
    """What the app serves from: the desk, the audit key, and who may come in."""

    desk: ApprovalDesk
    #: The key ``audit --verify`` checks seals with (``stores.factory.audit_secret``).
    audit_key: str | None
    #: ``CLEVERAGENTS_APPROVALS_TOKEN``; None: no sign-in (loopback only).
    token: str | None = field(default=None, repr=False)
    #: The address the server listens on (Host and Origin checks without a token).
    host: str = "127.0.0.1"
    #: ``CLEVERAGENTS_APPROVALS_URL``: its origin is the inbox's own too (behind a proxy).
    public_url: str | None = None


class _Desk:
    """The desk, called from a worker thread, one call at a time (its producer is not
    shared between threads)."""

    def __init__(self, desk: ApprovalDesk) -> None:
        self.desk = desk
        self._lock = threading.Lock()

    async def run(self, action: Callable[[ApprovalDesk], T]) -> T:
        def locked() -> T:
            with self._lock:
                return action(self.desk)

        return await anyio.to_thread.run_sync(locked)


def parse_since(text: str) -> dt.datetime:
    """``since``: a span back from now (``90s``, ``15m``, ``2h``, ``7d``) or an ISO time.

    Raises:
        ValueError: neither.
    """
    span = _SPAN.match(text.strip())
    if span:
        back = float(span.group(1)) * _UNIT_S[span.group(2)]
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=back)
    when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def _safe_next(path: str | None) -> str:
    """Where a login goes next: a path of this server only (no ``//host``, no scheme)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


Handler = Callable[[Request, "pages.Page"], Awaitable[Response]]
FormHandler = Callable[[Request, Any, "Session | None"], Awaitable[Response]]


class _Inbox:
    """The inbox's handlers: access (sessions, bearer, CSRF, origin) and its pages and forms."""

    def __init__(self, config: InboxConfig) -> None:
        self.config = config
        self.desk = _Desk(config.desk)
        self.seal = SessionSeal(config.token)
        self.public_origin: str | None = None
        if config.public_url:
            parsed = urllib.parse.urlsplit(config.public_url)
            self.public_origin = f"{parsed.scheme}://{parsed.netloc}".lower()

    def session_of(self, request: Request) -> Session | None:
        return self.seal.decode(request.cookies.get(SESSION_COOKIE))

    def bearer_ok(self, request: Request) -> bool:
        if not self.config.token:
            return False
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and token_matches(given.strip(), self.config.token)

    def with_cookie(self, response: Response, request: Request, session: Session) -> Response:
        response.set_cookie(
            SESSION_COOKIE,
            self.seal.encode(session),
            max_age=int(self.seal.ttl_s),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    def html(self, text: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(text, status_code=status)

    def page_route(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A GET page: signed in (or a bearer) with a token; a session cookie either way."""

        async def endpoint(request: Request) -> Response:
            session = self.session_of(request)
            if self.bearer_ok(request):
                return await handler(request, self.page_of(None))
            if self.config.token and (session is None or not session.signed_in):
                target = urllib.parse.quote(request.url.path, safe="/")
                return RedirectResponse(f"/login?next={target}", status_code=303)
            fresh = session is None
            session = session or self.seal.issue()
            response = await handler(request, self.page_of(session))
            return self.with_cookie(response, request, session) if fresh else response

        return endpoint

    def form_route(self, handler: FormHandler) -> Callable[[Request], Awaitable[Response]]:
        """A POST: the same origin, and the session's CSRF token (or a bearer token)."""

        async def endpoint(request: Request) -> Response:
            origin = request.headers.get("origin")
            host = request.headers.get("host")
            if not (same_origin(origin, host) or (origin or "").lower() == self.public_origin):
                return self.html(
                    pages.message_page("Refused", "forms from other sites' pages are refused"), 403
                )
            form = await request.form()
            if self.bearer_ok(request):
                return await handler(request, form, None)  # no browser sends it on its own
            session = self.session_of(request)
            given = form.get("csrf")
            if (
                session is None
                or not isinstance(given, str)
                or not token_matches(given, session.csrf)
            ):
                return self.html(
                    pages.message_page(
                        "Refused",
                        "this form is stale or came from elsewhere (no valid CSRF "
                        "token): open the page again and resend it",
                    ),
                    403,
                )
            if self.config.token and not session.signed_in:
                return RedirectResponse("/login", status_code=303)
            return await handler(request, form, session)

        return endpoint

    def decider(self, form: Any, session: Session | None) -> str:
        """``by`` of a decision: the name given at login; else the form's name, or this
        user (loopback without a token), or ``token-holder`` (a bearer request)."""
        if self.config.token and session is not None:
            return session.name
        given = form.get("by")
        named = given.strip() if isinstance(given, str) else ""
        if named:
            return named
        return "token-holder" if session is None else local_user()

    def page_of(self, session: Session | None) -> pages.Page:
        if session is None:
            return pages.Page(csrf="", name="", token=True)
        return pages.Page(session.csrf, session.name, bool(self.config.token))

    # --- pages ------------------------------------------------------------------

    async def inbox(self, request: Request, page: pages.Page) -> Response:
        waiting = await self.desk.run(lambda d: d.pending())
        return self.html(pages.inbox_page(waiting, page))

    async def render_call(
        self, request_id: str, page: pages.Page, *, error: str | None = None, status: int = 200
    ) -> Response:
        try:
            record, decision = await self.desk.run(lambda d: d.show(request_id))
        except ApprovalError as exc:
            return self.html(pages.message_page("No such call", str(exc), page), 404)
        events = await self.desk.run(lambda d: _listed(d.audit(request_id=request_id)))
        text = pages.call_page(
            record, decision, events, page, content_digest(record.body), error=error
        )
        return self.html(text, status)

    async def call(self, request: Request, page: pages.Page) -> Response:
        return await self.render_call(request.path_params["request_id"], page)

    async def audit(self, request: Request, page: pages.Page) -> Response:
        query = request.query_params
        filters = {key: query.get(key, "").strip() for key in ("request_id", "since", "event")}
        error = None
        since = None
        if filters["since"]:
            try:
                since = parse_since(filters["since"])
            except ValueError:
                error = (
                    f"since {filters['since']!r}: give a span back from now (90s, 15m, "
                    "2h, 7d) or an ISO 8601 time"
                )
        wanted = filters["event"]

        def read(d: ApprovalDesk) -> tuple[list[dict[str, str]], dict[str, Any]]:
            events = [
                e
                for e in d.audit(request_id=filters["request_id"] or None, since=since)
                if not wanted or e.get("event") == wanted
            ][-AUDIT_PAGE_EVENTS:]
            log_ = d.audit_log
            assert log_ is not None  # the server's self.desk always has its trail
            report = verify(log_.streams(), self.config.audit_key)
            verdict = {
                "whole": report.whole,
                "events": report.events,
                "writers": report.writers,
                "keyed": report.keyed,
                "problems": list(report.problems),
            }
            return events, verdict

        events, verdict = await self.desk.run(read)
        return self.html(
            pages.audit_page(
                events,
                page,
                verdict=verdict,
                filters=filters,
                error=error,
                shown_at_most=AUDIT_PAGE_EVENTS,
            )
        )

    # --- forms ------------------------------------------------------------------

    async def approve(self, request: Request, form: Any, session: Session | None) -> Response:
        request_id = request.path_params["request_id"]
        digest, reason = form.get("digest"), form.get("reason")
        by = self.decider(form, session)
        if not isinstance(digest, str) or not digest:
            why = "the form did not say which call it showed (no digest): open its page again"
            return await self.render_call(request_id, self.page_of(session), error=why, status=409)
        try:
            await self.desk.run(
                lambda d: d.approve(
                    request_id,
                    digest=digest,
                    by=by,
                    reason=reason if isinstance(reason, str) else None,
                    channel="web",
                )
            )
        except ApprovalError as exc:
            return await self.render_call(
                request_id, self.page_of(session), error=str(exc), status=409
            )
        log.info("approved %s (by %s) in the inbox", request_id, by)
        return RedirectResponse(pages.call_path(request_id), status_code=303)

    async def reject(self, request: Request, form: Any, session: Session | None) -> Response:
        request_id = request.path_params["request_id"]
        reason = form.get("reason")
        by = self.decider(form, session)
        try:
            await self.desk.run(
                lambda d: d.reject(
                    request_id,
                    reason=reason if isinstance(reason, str) else "",
                    by=by,
                    channel="web",
                )
            )
        except ApprovalError as exc:
            return await self.render_call(
                request_id, self.page_of(session), error=str(exc), status=409
            )
        log.info("rejected %s (by %s) in the inbox", request_id, by)
        return RedirectResponse(pages.call_path(request_id), status_code=303)

    # --- login --------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        if not self.config.token:
            return RedirectResponse("/", status_code=303)
        session = self.session_of(request)
        if request.method == "GET":
            fresh = session is None
            session = session or self.seal.issue()
            text = pages.login_page(
                session.csrf, next_path=_safe_next(request.query_params.get("next"))
            )
            response = self.html(text)
            return self.with_cookie(response, request, session) if fresh else response
        origin = request.headers.get("origin")
        if not (
            same_origin(origin, request.headers.get("host"))
            or (origin or "").lower() == self.public_origin
        ):
            return self.html(
                pages.message_page("Refused", "forms from other sites' pages are refused"), 403
            )
        form = await request.form()
        given_csrf, token, name = form.get("csrf"), form.get("token"), form.get("name")
        wanted_next = form.get("next")
        next_path = _safe_next(wanted_next if isinstance(wanted_next, str) else None)
        if (
            session is None
            or not isinstance(given_csrf, str)
            or not token_matches(given_csrf, session.csrf)
        ):
            session = self.seal.issue()
            text = pages.login_page(
                session.csrf, next_path=next_path, error="the form was stale: sign in again"
            )
            return self.with_cookie(self.html(text, 403), request, session)
        named = name.strip() if isinstance(name, str) else ""
        if not isinstance(token, str) or not token_matches(token, self.config.token) or not named:
            await asyncio.sleep(WRONG_TOKEN_DELAY_S)
            why = "give your name" if not named else "that is not the inbox's token"
            text = pages.login_page(session.csrf, next_path=next_path, error=why)
            return self.html(text, 401)
        signed = self.seal.issue(named, signed_in=True)  # a new CSRF token: no fixation
        log.info("%s signed in to the inbox", signed.name)
        return self.with_cookie(RedirectResponse(next_path, status_code=303), request, signed)

    async def logout(self, request: Request, form: Any, session: Session | None) -> Response:
        response = RedirectResponse("/login" if self.config.token else "/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    async def style(self, request: Request) -> Response:
        return Response(pages.STYLE, media_type="text/css")

    async def script(self, request: Request) -> Response:
        return Response(pages.SCRIPT, media_type="text/javascript")


def build_app(config: InboxConfig) -> ASGIApp:
    """The inbox as an ASGI app: routes, sessions, CSRF, and the Host/Origin checks."""
    inbox = _Inbox(config)
    routes = [
        Route("/", inbox.page_route(inbox.inbox)),
        Route("/calls/{request_id:path}", inbox.page_route(inbox.call)),
        Route(
            "/calls/{request_id:path}/approve", inbox.form_route(inbox.approve), methods=["POST"]
        ),
        Route("/calls/{request_id:path}/reject", inbox.form_route(inbox.reject), methods=["POST"]),
        Route("/audit", inbox.page_route(inbox.audit)),
        Route("/login", inbox.login, methods=["GET", "POST"]),
        Route("/logout", inbox.form_route(inbox.logout), methods=["POST"]),
        Route("/static/inbox.css", inbox.style),
        Route("/static/inbox.js", inbox.script),
    ]
    app: ASGIApp = AccessLog(SecurityHeaders(Starlette(routes=routes)))
    # Without a token only this machine's own names may reach it (DNS rebinding), as
    # `mcp serve` does; with one, the token decides and any Host a proxy sends passes.
    return app if config.token else HostGuard(app, config.host)


def _listed(events: Iterator[dict[str, str]]) -> list[dict[str, str]]:
    return list(events)


class SecurityHeaders:
    """ASGI middleware: the headers of ``SECURITY_HEADERS`` on every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


class AccessLog:
    """ASGI middleware: one line a request with its method, path and status, nothing more
    (never a query string, a form or a cookie: uvicorn's own access log is off)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def watch(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            log.info("%s %s %d", scope.get("method"), scope.get("path"), status)
