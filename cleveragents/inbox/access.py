"""Who may use the inbox: the token, the session cookie, the CSRF token, the Origin check.

Without ``CLEVERAGENTS_APPROVALS_TOKEN`` the inbox listens on loopback only and
serves the people of this machine; ``HostGuard`` (the one ``mcp serve`` uses)
keeps other sites' pages out (DNS rebinding). With the token every page and form
needs it, loopback too: a login form (the token, and the person's name) sets a
session cookie, or a request sends ``Authorization: Bearer TOKEN``. Tokens are
compared in constant time.

A session is a cookie the server seals (HMAC-SHA256): the person's name, whether
they signed in, a CSRF token and an expiry. It is ``HttpOnly`` and
``SameSite=Strict``. Every form carries the session's CSRF token in a hidden field
and a POST without it is refused; a POST whose ``Origin`` is not this server's own
address is refused too. A bearer request needs no CSRF token: no browser sends the
header on its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from cleveragents.errors import ConfigurationError
from cleveragents.mcp.http import is_loopback

__all__ = [
    "SESSION_COOKIE",
    "SESSION_TTL_S",
    "TOKEN_ENV",
    "Session",
    "SessionSeal",
    "check_inbox_options",
    "same_origin",
    "token_matches",
]

#: The token people type at the login form (and programs send as a bearer token).
TOKEN_ENV = "CLEVERAGENTS_APPROVALS_TOKEN"
#: The session cookie's name.
SESSION_COOKIE = "cleveragents_inbox"
#: A session lasts this long; then the person signs in again.
SESSION_TTL_S = 12 * 3600.0
#: The longest name kept from the login form (the desk keeps as much of ``by``).
MAX_NAME_CHARS = 200


def check_inbox_options(host: str, token: str | None) -> None:
    """Refuse (``ConfigurationError``) to serve the inbox beyond loopback without a token."""
    if not is_loopback(host) and not token:
        raise ConfigurationError(
            f"refusing to serve the approvals inbox on {host} without a token: set {TOKEN_ENV} "
            "(people sign in with it), or bind to 127.0.0.1"
        )


def token_matches(given: str | bytes | None, token: str) -> bool:
    """Whether ``given`` is the token (compared in constant time)."""
    if given is None:
        return False
    raw = given.encode() if isinstance(given, str) else given
    return hmac.compare_digest(raw, token.encode())


@dataclass(frozen=True)
class Session:
    """One browser's session: who (``name``), whether they gave the token, its CSRF token."""

    name: str
    signed_in: bool
    csrf: str
    expires: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionSeal:
    """Makes and checks session cookies, sealed with a key only this server holds.

    With a token the key is derived from it (a restart keeps sessions; a new token
    ends them all); without one it is random per server process.
    """

    def __init__(self, token: str | None, *, ttl_s: float = SESSION_TTL_S) -> None:
        if token:
            self._key = hmac.new(token.encode(), b"cleveragents-inbox-session", "sha256").digest()
        else:
            self._key = secrets.token_bytes(32)
        self.ttl_s = ttl_s

    def issue(self, name: str = "", *, signed_in: bool = False) -> Session:
        """A new session (a new CSRF token: signing in never keeps an old one)."""
        return Session(
            name=name.strip()[:MAX_NAME_CHARS],
            signed_in=signed_in,
            csrf=secrets.token_urlsafe(24),
            expires=time.time() + self.ttl_s,
        )

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def encode(self, session: Session) -> str:
        """The cookie's value: the session as JSON, then its seal."""
        fields = {"n": session.name, "s": session.signed_in, "c": session.csrf,
                  "e": round(session.expires)}
        payload = _b64(json.dumps(fields, separators=(",", ":")).encode())
        return f"{payload}.{self._mac(payload)}"

    def decode(self, value: str | None) -> Session | None:
        """The session a cookie holds; None when it is missing, forged or expired."""
        if not value or value.count(".") != 1:
            return None
        payload, mac = value.split(".")
        if not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        try:
            fields = json.loads(_unb64(payload))
            session = Session(str(fields["n"]), fields["s"] is True, str(fields["c"]),
                              float(fields["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        return session if session.expires > time.time() else None


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether a request's ``Origin`` (when it sends one) names the server its ``Host`` names."""
    if origin is None:
        return True
    scheme, sep, authority = origin.strip().partition("://")
    if not sep or scheme.lower() not in ("http", "https") or "/" in authority:
        return False
    return host is not None and authority.lower() == host.strip().lower()
