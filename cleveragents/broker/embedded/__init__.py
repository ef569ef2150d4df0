"""The embedded default's broker and result backend: kombu's filesystem transport and
Celery's file backend, made whole-write and loss-free (``cleveragents.embedded`` runs them)."""

__all__: list[str] = []
