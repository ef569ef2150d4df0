"""W3C trace context as it travels: in message headers, an MCP ``_meta``, the CLI's environment.

A context travels without the ``otel`` extra too: ``TRACEPARENT`` given to the CLI
is copied into its messages as it is, for workers that trace. An application
that traces with OpenTelemetry's API has its current span's context carried by
``SkillClient.submit`` and ``batch run`` (``current_carrier``); one that does not
pays for a dictionary lookup (and, where something imported the API, a context read).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

__all__ = [
    "TRACE_HEADERS",
    "carrier_of",
    "current_carrier",
    "current_trace_id",
    "traceparent_of",
]

#: The W3C Trace Context fields a message carries (headers of the same names).
TRACE_HEADERS = ("traceparent", "tracestate")
#: A version-00 ``traceparent``: version, trace id, parent span id, flags.
_TRACEPARENT = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
_TRACESTATE_MAX = 512


def traceparent_of(value: str | None) -> str | None:
    """``value`` if it is a valid W3C ``traceparent``, else None."""
    text = (value or "").strip().lower()
    return text if _TRACEPARENT.match(text) else None


def carrier_of(source: Mapping[str, object] | None) -> dict[str, str]:
    """The trace context fields of ``source`` (message headers, an MCP ``_meta``, the
    environment's ``TRACEPARENT``/``TRACESTATE``), checked; {} when it holds none."""
    if not source:
        return {}
    lowered = {str(k).lower(): v for k, v in source.items() if isinstance(v, str)}
    parent = traceparent_of(lowered.get("traceparent"))
    if parent is None:
        return {}
    carrier = {"traceparent": parent}
    state = (lowered.get("tracestate") or "").strip()
    if state and len(state) <= _TRACESTATE_MAX and state.isprintable():
        carrier["tracestate"] = state
    return carrier


def current_carrier() -> dict[str, str]:
    """The application's current trace context, if it traces with OpenTelemetry ({} if not)."""
    api = sys.modules.get("opentelemetry.trace")  # imported by the application (or redis-py)
    if api is None or not api.get_current_span().get_span_context().is_valid:
        return {}
    from opentelemetry import propagate

    fields: dict[str, str] = {}
    propagate.inject(fields)
    return carrier_of(fields)


def current_trace_id() -> str | None:
    """The trace id (32 hex digits) of the current recorded span, if this process traces."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
