"""Celery tasks: thin adapters from a wire request to the runtime and back."""
