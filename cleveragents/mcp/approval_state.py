"""The sealed ``requestState`` of an approval question asked in an ``input_required`` result.

MCP 2026-07-28 forbids a server to send a request during a call. A call that needs a
person's answer returns ``input_required`` instead: the question, and an opaque
``requestState`` that the client sends back, verbatim, when it calls again with the
answer. The state travels through the client, which may change it, and the answer it
comes back with decides a parked invocation. So it is trusted only for what this
server alone could write: it is sealed with HMAC-SHA256 under a secret the server
holds (made when ``FleetTools`` is built, never sent), over the invocation's request
id, the content digest of the call the question showed, the tool's MCP name and an
expiry. A state that does not verify, has expired, or names another call than the one
it comes back with, is refused (``StateRefused``), and nothing is decided.

The state is signed, not encrypted: what it names (the request id, a digest of the
call) is no secret from the client that made the call.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from cleveragents.errors import CleverAgentsError

__all__ = ["STATE_TTL_S", "ApprovalState", "StateRefused", "StateSeal"]

#: How long a sealed state may come back: an answer after that is refused and decides
#: nothing (the invocation stays parked for a person until its own approval expiry).
STATE_TTL_S = 3600.0
#: The format, under the seal: a state of another format never verifies.
_VERSION = "v1"
_SECRET_BYTES = 32


class StateRefused(CleverAgentsError):
    """Raised when an echoed ``requestState`` is not one this server sealed for this call."""


@dataclass(frozen=True)
class ApprovalState:
    """What a verified state names: the parked invocation and the call its question showed."""

    request_id: str
    digest: str
    tool: str
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:  # one spelling only: a state is byte-exact or refused
        raise ValueError("not canonical base64url")
    return raw


class StateSeal:
    """Seals and opens approval states under one secret, held by this server process."""

    def __init__(
        self,
        secret: bytes | None = None,
        *,
        ttl_s: float = STATE_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(_SECRET_BYTES)
        if len(self._secret) < _SECRET_BYTES:
            raise ValueError(f"a state secret has at least {_SECRET_BYTES} bytes")
        self.ttl_s = ttl_s
        self._clock = clock

    def _mac(self, body: str) -> bytes:
        return hmac.new(self._secret, f"{_VERSION}.{body}".encode(), hashlib.sha256).digest()

    def seal(self, *, request_id: str, digest: str, tool: str) -> str:
        """The state of a question about ``request_id``, showing the call of ``digest``."""
        claims = {"r": request_id, "d": digest, "t": tool, "e": self._clock() + self.ttl_s}
        body = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
        return f"{_VERSION}.{body}.{_b64(self._mac(body))}"

    def open(self, token: str, *, digest: str, tool: str) -> ApprovalState:
        """The state ``token`` names, when this server sealed it for this call, unexpired.

        ``digest`` and ``tool`` are those of the call the state came back with.

        Raises:
            StateRefused: the seal does not verify, it expired, or it names another call.
        """
        version, _, rest = token.partition(".")
        body, _, tag = rest.partition(".")
        try:
            given = _unb64(tag)
            claims = json.loads(_unb64(body)) if version == _VERSION else None
        except (ValueError, binascii.Error) as exc:
            raise StateRefused("malformed") from exc
        if not hmac.compare_digest(given, self._mac(body)) or not isinstance(claims, dict):
            raise StateRefused("its seal does not verify")
        state = _claims(claims)
        if state.expires_at <= self._clock():
            raise StateRefused("it expired")
        if not (hmac.compare_digest(state.digest, digest) and state.tool == tool):
            raise StateRefused("it was given for another call (other tool or arguments)")
        return state


def _claims(claims: dict[str, object]) -> ApprovalState:
    request_id, digest, tool, expires = (claims.get(k) for k in ("r", "d", "t", "e"))
    if not (
        isinstance(request_id, str)
        and isinstance(digest, str)
        and isinstance(tool, str)
        and isinstance(expires, int | float)
    ):
        raise StateRefused("malformed")
    return ApprovalState(request_id, digest, tool, float(expires))
