"""The Celery application: ``celery -A cleveragents.worker worker`` starts a skill worker.

Settings come from ``celeryconfig`` (the environment), read when the app first
needs them. Folders, patches of third-party internals and the catalogue are set up
when a worker starts (``cleveragents.worker.startup``), never at import and never in Flower's
or another command's process. Two things are not: Flower's default columns
(``cleveragents.worker.flower_columns``), set at import since Flower can only take them from
the environment, and message signing (``cleveragents.worker.signing_hook``), turned on when the
configuration is read in every process of the app, since remote control is signed
too.
"""

from __future__ import annotations

from celery import Celery

from cleveragents.worker import flower_columns, signing_hook

__all__ = ["app"]

flower_columns.set_default()

app = Celery("cleveragents", include=["cleveragents.tasks.invoke", "cleveragents.tasks.batch"])
app.config_from_object("cleveragents.worker.celeryconfig")
# Message signing, when configured, in every process that reads the configuration.
app.on_after_configure.connect(signing_hook.sign_when_configured, weak=False)

from cleveragents.worker import startup as _startup  # noqa: E402,F401  (connects start-up hooks)
