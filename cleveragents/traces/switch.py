"""Whether this process traces: decided from the standard ``OTEL_*`` variables, importing nothing.

Tracing is on when the ``otel`` extra is installed and the environment names
where spans go: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``), or an OTLP
endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``).
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turns it off. Off,
nothing of OpenTelemetry is imported and nothing is paid but this one check.

A trace context travels without the extra too (``carriers.py``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from functools import cache

__all__ = ["exporter_name", "tracing_on"]

def exporter_name(env: Mapping[str, str]) -> str | None:
    """The span exporter the environment asks for (None: tracing off)."""
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return None
    named = (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower()
    if named:
        first = named.split(",")[0].strip()
        return None if first == "none" else first
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return "otlp" if endpoint else None


@cache
def tracing_on() -> bool:
    """This process traces (the extra is installed and the environment asks for it)."""
    if exporter_name(os.environ) is None:
        return False
    return importlib.util.find_spec("opentelemetry.sdk") is not None
