"""The tool runtime: the one place where tools run."""
