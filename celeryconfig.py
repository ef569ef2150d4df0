"""Every Celery setting of the worker app, read from the environment (SPEC section 7).

The settings live in the package (``cleveragents.worker.celeryconfig``, which the
app loads); this module, for a checkout, reads the same ones:
``app.config_from_object("celeryconfig")`` gives the same configuration.
"""

from __future__ import annotations

from cleveragents.worker.celeryconfig import (
    __dir__,  # noqa: F401  (Celery lists a configuration module's names with dir())
    __getattr__,  # noqa: F401  (each setting is read on first use, as in the package)
    from_env,
)

__all__ = ["from_env"]
