"""OpenTelemetry traces of invocations (docs/operations.md, "Traces")."""

__all__: list[str] = []
