"""CleverAgents skill worker: run AI agents' tool calls in the background on Celery."""

__version__ = "0.1.0"

__all__ = ["__version__"]
