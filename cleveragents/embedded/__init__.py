"""The embedded default: an on-disk broker and result store, and a local worker to serve them."""
