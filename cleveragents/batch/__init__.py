"""Batch runs: many invocations from a JSONL file or an iterable, in chunks, in order."""
