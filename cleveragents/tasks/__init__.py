"""Celery tasks: thin adapters from a wire request to the runtime and back."""

__all__: list[str] = []
