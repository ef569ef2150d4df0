"""Every Celery setting of the worker app, read from the environment (SPEC section 7).

The settings live in the package (``cleveragents.worker.celeryconfig``, which the
app loads); this module, for a checkout, reads the same ones:
``app.config_from_object("celeryconfig")`` gives the same configuration.
"""

from __future__ import annotations

from cleveragents.worker.celeryconfig import from_env

__all__ = ["from_env"]
