"""Redis as broker and result backend: kombu's transport and Celery's backend, made safer."""

__all__: list[str] = []
