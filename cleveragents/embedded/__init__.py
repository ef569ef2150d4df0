"""The embedded default: an on-disk broker and result store, and a local worker to serve them."""

#: The package re-exports nothing: import from its modules.
__all__: list[str] = []
