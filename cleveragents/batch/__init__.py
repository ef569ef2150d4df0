"""Batch runs: many invocations from a JSONL file or an iterable, in chunks, in order."""

#: The package re-exports nothing: import from its modules.
__all__: list[str] = []
